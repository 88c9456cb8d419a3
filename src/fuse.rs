//! FUSE adapter: decodes fuser callbacks, runs the core on the tokio runtime, and replies from there, so
//! no FUSE worker thread ever waits on the network. The only place an errno is chosen is [`errno`].

use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, SessionACL, TimeOrNow, WriteFlags,
};
use tracing::{Instrument, debug_span, info, warn};

use crate::fs::{Attr, FileKind, FsError, OpenMode, S3Filesystem};
use crate::s3::ClientError;

/// Mount-level options decided by the CLI.
#[derive(Debug, Clone)]
pub struct FuseOptions {
    pub mountpoint: PathBuf,
    /// Source shown by `mount` and `df` (the bucket, with the prefix if any).
    pub fs_name: String,
    pub read_only: bool,
    pub allow_other: bool,
    pub allow_root: bool,
    pub auto_unmount: bool,
    /// FUSE worker threads.
    pub threads: usize,
}

/// The errno for each core error (the one place this choice is made).
pub fn errno(e: &FsError) -> Errno {
    match e {
        FsError::NotFound => Errno::ENOENT,
        FsError::NotADirectory => Errno::ENOTDIR,
        FsError::IsADirectory => Errno::EISDIR,
        FsError::NameTooLong => Errno::ENAMETOOLONG,
        FsError::Exists => Errno::EEXIST,
        FsError::NotEmpty => Errno::ENOTEMPTY,
        FsError::ReadOnly => Errno::EROFS,
        FsError::NotPermitted(_) => Errno::EPERM,
        FsError::InvalidArgument(_) => Errno::EINVAL,
        FsError::Busy(_) => Errno::EBUSY,
        FsError::TooManyWriters(_) => Errno::EMFILE,
        FsError::CrossDevice(_) => Errno::EXDEV,
        FsError::BadHandle => Errno::EBADF,
        FsError::ObjectChanged { .. } => Errno::EIO,
        FsError::Io(_) => Errno::EIO,
        FsError::NoSpace(_) => Errno::ENOSPC,
        FsError::Client { source, .. } => match source {
            ClientError::AccessDenied { .. } | ClientError::NoCredentials(_) => Errno::EACCES,
            ClientError::NotSupported(_) => Errno::ENOTSUP,
            _ => Errno::EIO,
        },
    }
}

struct Adapter {
    fs: Arc<S3Filesystem>,
    runtime: tokio::runtime::Handle,
    ttl: Duration,
    block_size: u32,
}

fn file_attr(a: &Attr, block_size: u32) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.mtime,
        crtime: a.mtime,
        kind: match a.kind {
            FileKind::File => FileType::RegularFile,
            FileKind::Directory => FileType::Directory,
        },
        perm: a.perm,
        nlink: if a.kind == FileKind::Directory { 2 } else { 1 },
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: block_size,
        flags: 0,
    }
}

fn name_str(name: &OsStr) -> Result<String, Errno> {
    // Keys are UTF-8; a name that is not cannot exist in the bucket.
    name.to_str().map(str::to_string).ok_or(Errno::EINVAL)
}

/// Counts one request from the kernel by operation (`expressfs_fuse_requests_total`): what a workload costs in
/// round trips, and proof that the kernel skips the ones we ask it to (FOPEN_NOFLUSH).
fn count(op: &'static str) {
    metrics::counter!("expressfs_fuse_requests_total", "op" => op).increment(1);
}

/// Logs errors that are not routine (missing names are).
fn report(op: &'static str, e: &FsError) -> Errno {
    let errno = errno(e);
    metrics::counter!("expressfs_fuse_errors_total", "op" => op, "errno" => errno.code().to_string()).increment(1);
    if !matches!(e, FsError::NotFound | FsError::Exists | FsError::NotEmpty) {
        warn!(op, error = %e, errno = errno.code(), "operation failed");
    }
    errno
}

impl Adapter {
    /// Runs the work of one request. It is polled once here, on the FUSE thread, with a waker that does
    /// nothing: when the answer is already at hand (fresh attributes, bytes a lookup fetched, a read handle's
    /// flush or release) the reply goes out at once, without waking a runtime thread. That hand-off was the
    /// largest cost of small files (one context switch per request). Anything that has to wait (the network, a
    /// lock) goes to the runtime, which polls it again with a real waker, so this thread never blocks on it.
    fn spawn<F>(&self, future: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let mut future = Box::pin(future);
        let _in_runtime = self.runtime.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if future.as_mut().poll(&mut cx).is_pending() {
            self.runtime.spawn(future);
        }
    }
}

impl Filesystem for Adapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // O_TRUNC arrives with open (not as a separate truncate); directory operations may run in parallel;
        // readdirplus hands the kernel every entry's attributes with the listing, so `ls -l`, `os.walk` and
        // `find` need no lookup per entry.
        // Files read around the page cache can still be mmap'ed (np.load(mmap_mode="r")) where the kernel
        // allows it. Not FUSE_ASYNC_DIO: it would split an O_DIRECT write into concurrent requests, which a
        // streaming upload cannot take out of order.
        for flag in [
            InitFlags::FUSE_ATOMIC_O_TRUNC,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_DO_READDIRPLUS,
        ] {
            let _ = config.add_capabilities(flag);
        }
        if config
            .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            .is_err()
        {
            self.fs.keep_big_files_in_page_cache();
            info!(
                "the kernel cannot mmap direct-I/O files (before Linux 6.6): big files use the page cache"
            );
        }
        let _ = config.set_max_write(1024 * 1024);
        let _ = config.set_max_readahead(1024 * 1024);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        count("lookup");
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let (fs, ttl, bs) = (Arc::clone(&self.fs), self.ttl, self.block_size);
        let span = debug_span!("lookup", parent = parent.0, name = %name);
        self.spawn(
            async move {
                match fs.lookup(parent.0, &name).await {
                    Ok(a) => reply.entry(&ttl, &file_attr(&a, bs), Generation(0)),
                    Err(e) => reply.error(report("lookup", &e)),
                }
            }
            .instrument(span),
        );
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        count("forget");
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        count("getattr");
        let (fs, ttl, bs) = (Arc::clone(&self.fs), self.ttl, self.block_size);
        self.spawn(
            async move {
                match fs.getattr(ino.0).await {
                    Ok(a) => reply.attr(&ttl, &file_attr(&a, bs)),
                    Err(e) => reply.error(report("getattr", &e)),
                }
            }
            .instrument(debug_span!("getattr", ino = ino.0)),
        );
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        count("setattr");
        let (fs, ttl, bs) = (Arc::clone(&self.fs), self.ttl, self.block_size);
        self.spawn(
            async move {
                match fs.setattr(ino.0, size, fh.map(|f| f.0)).await {
                    Ok(a) => reply.attr(&ttl, &file_attr(&a, bs)),
                    Err(e) => reply.error(report("setattr", &e)),
                }
            }
            .instrument(debug_span!("setattr", ino = ino.0)),
        );
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        count("mkdir");
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let (fs, ttl, bs) = (Arc::clone(&self.fs), self.ttl, self.block_size);
        let span = debug_span!("mkdir", parent = parent.0, name = %name);
        self.spawn(
            async move {
                match fs.mkdir(parent.0, &name).await {
                    Ok(a) => reply.entry(&ttl, &file_attr(&a, bs), Generation(0)),
                    Err(e) => reply.error(report("mkdir", &e)),
                }
            }
            .instrument(span),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        count("unlink");
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let fs = Arc::clone(&self.fs);
        let span = debug_span!("unlink", parent = parent.0, name = %name);
        self.spawn(
            async move {
                match fs.unlink(parent.0, &name).await {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(report("unlink", &e)),
                }
            }
            .instrument(span),
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        count("rmdir");
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let fs = Arc::clone(&self.fs);
        let span = debug_span!("rmdir", parent = parent.0, name = %name);
        self.spawn(
            async move {
                match fs.rmdir(parent.0, &name).await {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(report("rmdir", &e)),
                }
            }
            .instrument(span),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        count("rename");
        let (name, newname) = match (name_str(name), name_str(newname)) {
            (Ok(a), Ok(b)) => (a, b),
            _ => return reply.error(Errno::EINVAL),
        };
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return reply.error(Errno::EINVAL);
        }
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let fs = Arc::clone(&self.fs);
        let span = debug_span!("rename", parent = parent.0, name = %name, newparent = newparent.0, newname = %newname);
        self.spawn(
            async move {
                match fs
                    .rename(parent.0, &name, newparent.0, &newname, no_replace)
                    .await
                {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(report("rename", &e)),
                }
            }
            .instrument(span),
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        count("open");
        let pid = req.pid();
        let raw = flags.0;
        let access = raw & libc::O_ACCMODE;
        let mode = OpenMode {
            direct: raw & libc::O_DIRECT != 0,
            read: access == libc::O_RDONLY || access == libc::O_RDWR,
            write: access == libc::O_WRONLY || access == libc::O_RDWR,
            truncate: raw & libc::O_TRUNC != 0,
            append: raw & libc::O_APPEND != 0,
        };
        let fs = Arc::clone(&self.fs);
        self.spawn(
            async move {
                match fs.open(ino.0, mode, pid).await {
                    Ok(opened) => {
                        let mut flags = FopenFlags::empty();
                        if opened.keep_cache {
                            flags |= FopenFlags::FOPEN_KEEP_CACHE;
                        }
                        if opened.bypass_page_cache {
                            flags |= FopenFlags::FOPEN_DIRECT_IO;
                        }
                        if opened.no_flush {
                            flags |= FopenFlags::FOPEN_NOFLUSH;
                        }
                        reply.opened(FileHandle(opened.fh), flags)
                    }
                    Err(e) => reply.error(report("open", &e)),
                }
            }
            .instrument(debug_span!("open", ino = ino.0)),
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        count("create");
        let pid = req.pid();
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let (fs, ttl, bs) = (Arc::clone(&self.fs), self.ttl, self.block_size);
        let span = debug_span!("create", parent = parent.0, name = %name);
        self.spawn(
            async move {
                match fs.create(parent.0, &name, pid).await {
                    Ok((a, fh)) => reply.created(
                        &ttl,
                        &file_attr(&a, bs),
                        Generation(0),
                        FileHandle(fh),
                        if fs.writes_bypass_page_cache() {
                            FopenFlags::FOPEN_DIRECT_IO
                        } else {
                            FopenFlags::empty()
                        },
                    ),
                    Err(e) => reply.error(report("create", &e)),
                }
            }
            .instrument(span),
        );
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        count("read");
        let fs = Arc::clone(&self.fs);
        self.spawn(
            async move {
                match fs.read(fh.0, offset, size).await {
                    Ok(data) => {
                        metrics::counter!("expressfs_read_bytes_total")
                            .increment(data.len() as u64);
                        reply.data(&data)
                    }
                    Err(e) => reply.error(report("read", &e)),
                }
            }
            .instrument(debug_span!("read", ino = ino.0, offset, size)),
        );
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        count("write");
        let span = debug_span!("write", ino = ino.0, offset);
        if let Some(n) = span.in_scope(|| self.fs.write_now(fh.0, offset, data)) {
            metrics::counter!("expressfs_written_bytes_total").increment(u64::from(n));
            return reply.written(n);
        }
        let fs = Arc::clone(&self.fs);
        let data = data.to_vec();
        self.spawn(
            async move {
                match fs.write(fh.0, offset, &data).await {
                    Ok(n) => {
                        metrics::counter!("expressfs_written_bytes_total").increment(u64::from(n));
                        reply.written(n)
                    }
                    Err(e) => reply.error(report("write", &e)),
                }
            }
            .instrument(span),
        );
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        count("flush");
        let pid = req.pid();
        let fs = Arc::clone(&self.fs);
        self.spawn(
            async move {
                match fs.flush(fh.0, pid).await {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(report("flush", &e)),
                }
            }
            .instrument(debug_span!("flush", ino = ino.0)),
        );
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        count("fsync");
        let fs = Arc::clone(&self.fs);
        self.spawn(
            async move {
                match fs.fsync(fh.0).await {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(report("fsync", &e)),
                }
            }
            .instrument(debug_span!("fsync", ino = ino.0)),
        );
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        count("release");
        let fs = Arc::clone(&self.fs);
        self.spawn(
            async move {
                match fs.release(fh.0).await {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(report("release", &e)),
                }
            }
            .instrument(debug_span!("release", ino = ino.0)),
        );
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        count("opendir");
        match self.fs.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(report("opendir", &e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        count("readdir");
        let fs = Arc::clone(&self.fs);
        self.spawn(
            async move {
                match fs.readdir(fh.0, offset).await {
                    Ok(entries) => {
                        for (i, entry) in entries.iter().enumerate().skip(offset as usize) {
                            let kind = match entry.kind {
                                FileKind::File => FileType::RegularFile,
                                FileKind::Directory => FileType::Directory,
                            };
                            if reply.add(INodeNo(entry.ino), i as u64 + 1, kind, &entry.name) {
                                break;
                            }
                        }
                        reply.ok();
                    }
                    Err(e) => reply.error(report("readdir", &e)),
                }
            }
            .instrument(debug_span!("readdir", ino = ino.0, offset)),
        );
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        count("readdirplus");
        let (fs, ttl, bs) = (Arc::clone(&self.fs), self.ttl, self.block_size);
        self.spawn(
            async move {
                match fs.readdir(fh.0, offset).await {
                    Ok(entries) => {
                        for (i, entry) in entries.iter().enumerate().skip(offset as usize) {
                            let Some(attr) = fs.cached_attr(entry.ino) else {
                                continue;
                            };
                            let dots = entry.name == "." || entry.name == "..";
                            if reply.add(
                                INodeNo(entry.ino),
                                i as u64 + 1,
                                &entry.name,
                                &ttl,
                                &file_attr(&attr, bs),
                                Generation(0),
                            ) {
                                break;
                            }
                            // The kernel holds a reference to every entry but . and .. (as after lookup).
                            if !dots {
                                fs.add_lookup(entry.ino);
                            }
                        }
                        reply.ok();
                    }
                    Err(e) => reply.error(report("readdirplus", &e)),
                }
            }
            .instrument(debug_span!("readdirplus", ino = ino.0, offset)),
        );
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        count("releasedir");
        let fs = Arc::clone(&self.fs);
        self.spawn(async move {
            let _ = fs.release(fh.0).await;
            reply.ok();
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        count("statfs");
        let (blocks, files) = self.fs.statfs();
        // Buckets have no fixed capacity: report a large, mostly free volume so tools do not refuse to write.
        reply.statfs(
            blocks,
            blocks,
            blocks,
            files,
            u64::MAX / 2,
            self.block_size,
            255,
            self.block_size,
        );
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        count("access");
        reply.ok();
    }
}

/// A live mount. Dropping it unmounts.
pub struct MountedFs {
    session: fuser::BackgroundSession,
}

impl MountedFs {
    /// True once the kernel session has ended (e.g. after `umount`).
    pub fn is_finished(&self) -> bool {
        self.session.guard.is_finished()
    }

    /// Blocks until the file system is unmounted by someone else.
    pub fn join(self) -> std::io::Result<()> {
        self.session.join()
    }

    /// Unmounts and waits for the session to end.
    pub fn unmount(self) -> std::io::Result<()> {
        self.session.umount_and_join()
    }
}

/// Mounts `fs` and starts serving it. Returns once the kernel has the mount.
pub fn mount(
    fs: Arc<S3Filesystem>,
    runtime: tokio::runtime::Handle,
    options: &FuseOptions,
) -> std::io::Result<MountedFs> {
    let ttl = fs.config().metadata_ttl;
    let adapter = Adapter {
        fs,
        runtime,
        ttl,
        block_size: 128 * 1024,
    };
    let mut mount_options = vec![
        MountOption::FSName(options.fs_name.clone()),
        MountOption::Subtype("expressfs".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
    ];
    mount_options.push(if options.read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    if options.auto_unmount {
        mount_options.push(MountOption::AutoUnmount);
    }
    let acl = if options.allow_other {
        SessionACL::All
    } else if options.allow_root {
        SessionACL::RootAndOwner
    } else {
        SessionACL::Owner
    };
    let mut config = Config::default();
    config.mount_options = mount_options;
    config.acl = acl;
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = options.threads > 1;
    let session = fuser::spawn_mount(adapter, &options.mountpoint, &config)?;
    Ok(MountedFs { session })
}
