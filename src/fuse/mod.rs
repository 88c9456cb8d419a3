//! FUSE adapter: decodes fuser callbacks, runs the core on the tokio runtime, and replies from there, so
//! no FUSE worker thread ever waits on the network. The only place an errno is chosen is [`errno`].

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use fuser::{
    CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use tracing::{Instrument, Span, debug, debug_span, info, warn};

mod session;

use session::Outstanding;
pub use session::{MountedFs, mount};

use crate::fs::attrs::StoredAttrs;
use crate::fs::{Attr, FileKind, FsError, FsResult, KernelNotice, OpenMode, S3Filesystem};
use crate::mountpoint::MountTarget;

/// Mount-level options decided by the CLI.
#[derive(Debug, Clone)]
pub struct FuseOptions {
    pub target: MountTarget,
    /// Source shown by `mount` and `df` (the bucket, with the prefix if any).
    pub fs_name: String,
    pub read_only: bool,
    pub allow_other: bool,
    pub allow_root: bool,
    pub auto_unmount: bool,
    /// FUSE worker threads.
    pub threads: usize,
}

/// `ioctl(fd, KEEP_IN_CACHE, &mut offset)` on a file of the mount (what `expressfs warm` sends): the
/// daemon fetches the file from `offset` on into its caches, none of it through FUSE, up to a bound, and
/// answers once that is kept: `offset` becomes where the kept bytes end, and the ioctl returns 1 if the
/// file goes on past them (ask again from there), 0 if not. `_IOWR(0xE5, 1, u64)`: the kernel copies the
/// 8 bytes in and back. Refused with EOPNOTSUPP when the mount has no cache, EFBIG for a file no cache of
/// the mount can hold, and EBUSY for a file being written through the mount.
pub const KEEP_IN_CACHE: u32 = nix::request_code_readwrite!(0xE5, 1, size_of::<u64>()) as u32;

/// The errno for each core error (the one place this choice is made).
pub fn errno(e: &FsError) -> Errno {
    match e {
        FsError::NotFound => Errno::ENOENT,
        FsError::Stale => Errno::ESTALE,
        FsError::NotADirectory => Errno::ENOTDIR,
        FsError::IsADirectory => Errno::EISDIR,
        FsError::NameTooLong => Errno::ENAMETOOLONG,
        FsError::NameNotUtf8 => Errno::EINVAL,
        FsError::Exists => Errno::EEXIST,
        FsError::NotEmpty => Errno::ENOTEMPTY,
        FsError::ReadOnly => Errno::EROFS,
        FsError::NotPermitted(_) => Errno::EPERM,
        FsError::InvalidArgument(_) => Errno::EINVAL,
        FsError::Busy(_) => Errno::EBUSY,
        FsError::TooManyWriters(_) => Errno::EMFILE,
        FsError::CrossDevice(_) => Errno::EXDEV,
        FsError::SymlinkLoop => Errno::ELOOP,
        FsError::BadHandle => Errno::EBADF,
        FsError::NoSpace(_) => Errno::ENOSPC,
        FsError::TooBig(_) => Errno::EFBIG,
        FsError::OperationNotSupported(_) => Errno::EOPNOTSUPP,
        FsError::NotCacheable => Errno::EFBIG,
        FsError::AccessDenied { .. } => Errno::EACCES,
        FsError::Unsupported { .. } => Errno::ENOTSUP,
        FsError::ObjectChanged { .. }
        | FsError::Client { .. }
        | FsError::Local { .. }
        | FsError::Task { .. }
        | FsError::Io(_) => Errno::EIO,
    }
}

struct Adapter {
    fs: Arc<S3Filesystem>,
    runtime: tokio::runtime::Handle,
    outstanding: Arc<Outstanding>,
    block_size: u32,
    /// Test builds only ([`late_releases`]): how long every release waits before it is acted on.
    release_delay: Option<Duration>,
    /// Test builds only ([`lost_releases`]): every release is answered and ignored.
    drop_releases: bool,
    /// Pushes bytes into the kernel's page cache; set once the session runs.
    notifier: Arc<OnceLock<fuser::Notifier>>,
    /// Set when a daemon serving a caller's descriptor stops with its session still live
    /// ([`MountedFs::unmount`]): every request from then on is refused, as the kernel will once we are gone.
    stopping: Arc<std::sync::atomic::AtomicBool>,
}

/// The kernel sends RELEASE after close(2) has returned, and on a loaded machine it may arrive long after:
/// meanwhile the file can be opened, renamed or unlinked again. Debug builds read
/// `EXPRESSFS_TEST_RELEASE_DELAY_MS` and hold every release that long, so tests (`tests/model_mount.rs`) can
/// open that window wide; release builds never do.
fn late_releases() -> Option<Duration> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let ms = std::env::var("EXPRESSFS_TEST_RELEASE_DELAY_MS").ok()?;
    ms.parse().ok().map(Duration::from_millis)
}

/// At unmount the kernel tears the connection down with the requests it has not handed over yet, so the
/// RELEASE of a file closed just before `umount` may never come. Debug builds that find
/// `EXPRESSFS_TEST_DROP_RELEASES` set answer every release without acting on it, standing for that kernel in
/// tests; release builds never do.
fn lost_releases() -> bool {
    cfg!(debug_assertions) && std::env::var_os("EXPRESSFS_TEST_DROP_RELEASES").is_some()
}

fn file_attr(a: &Attr, block_size: u32) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.mtime,
        crtime: a.mtime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: if a.kind == FileKind::Directory { 2 } else { 1 },
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: block_size,
        flags: 0,
    }
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
    }
}

fn name_str(name: &OsStr) -> FsResult<String> {
    name.to_str()
        .map(str::to_string)
        .ok_or(FsError::NameNotUtf8)
}

/// Counts a failed request by errno and logs the ones that are not routine (missing names are).
fn report(op: &'static str, e: &FsError) -> Errno {
    let errno = errno(e);
    crate::metrics::fuse_error(op, errno.code());
    // A warm-up asking a mount to keep what it cannot reads the file instead: routine too.
    let refused_warm_up =
        op == "ioctl" && matches!(e, FsError::OperationNotSupported(_) | FsError::NotCacheable);
    if !refused_warm_up
        && !matches!(
            e,
            FsError::NotFound | FsError::Exists | FsError::NotEmpty | FsError::NameNotUtf8
        )
    {
        warn!(op, error = %e.chain(), errno = errno.code(), "operation failed");
    }
    errno
}

/// The error side that every fuser reply type has.
trait ErrorReply: Send + 'static {
    fn fail(self, errno: Errno);
}

macro_rules! error_reply {
    ($($reply:ty),* $(,)?) => {
        $(impl ErrorReply for $reply {
            fn fail(self, errno: Errno) {
                self.error(errno)
            }
        })*
    };
}

error_reply!(
    ReplyIoctl,
    ReplyEntry,
    ReplyAttr,
    ReplyEmpty,
    ReplyOpen,
    ReplyCreate,
    ReplyData,
    ReplyWrite,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyStatfs,
);

impl Adapter {
    /// The path of every request that may have to wait (all but the fast writes, statfs and access, which
    /// answer in their callbacks): count it by operation
    /// (`expressfs_fuse_requests_total`), run `work` in `span` (see [`Adapter::spawn`]), and answer with
    /// `answer` or with the errno of the error.
    fn serve<R, T>(
        &self,
        op: &'static str,
        span: Span,
        reply: R,
        work: impl Future<Output = FsResult<T>> + Send + 'static,
        answer: impl FnOnce(R, T) + Send + 'static,
    ) where
        R: ErrorReply,
    {
        crate::metrics::fuse_request(op);
        if self.stopping() {
            return reply.fail(Errno::ENOTCONN);
        }
        // A release may upload (the last handle of a staged file): unmount waits for it ([`Outstanding`]).
        let waited_for = op == "release";
        self.spawn(
            async move {
                match work.await {
                    Ok(value) => answer(reply, value),
                    Err(e) => reply.fail(report(op, &e)),
                }
            }
            .instrument(span),
            waited_for,
        );
    }

    fn stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Runs the work of one request. It is polled once here, on the FUSE thread, with a waker that does
    /// nothing: when the answer is already at hand (fresh attributes, bytes a lookup fetched, a read handle's
    /// flush or release) the reply goes out at once, without waking a runtime thread. That hand-off was the
    /// largest cost of small files (one context switch per request). Anything that has to wait (the network, a
    /// lock) goes to the runtime, which polls it again with a real waker, so this thread never blocks on it.
    fn spawn<F>(&self, future: F, waited_for: bool)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut future = Box::pin(future);
        let _in_runtime = self.runtime.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if future.as_mut().poll(&mut cx).is_pending() {
            let counted = waited_for.then(|| self.outstanding.begin());
            self.runtime.spawn(async move {
                future.await;
                drop(counted);
            });
        }
    }

    /// Replies with an entry: lookup and mkdir.
    fn entry(&self) -> impl FnOnce(ReplyEntry, Attr) + Send + 'static {
        let bs = self.block_size;
        move |reply, a| reply.entry(&a.trusted_for, &file_attr(&a, bs), Generation(0))
    }

    /// Replies with attributes: getattr and setattr.
    fn attr(&self) -> impl FnOnce(ReplyAttr, Attr) + Send + 'static {
        let bs = self.block_size;
        move |reply, a| reply.attr(&a.trusted_for, &file_attr(&a, bs))
    }
}

/// The attributes a regular file made by `req` starts with: its mode less the umask, its caller's uid and gid.
fn new_file_owner(req: &Request, mode: u32, umask: u32) -> StoredAttrs {
    StoredAttrs {
        mode: Some(libc::S_IFREG | (mode & !umask & 0o7777)),
        uid: Some(req.uid()),
        gid: Some(req.gid()),
        ..StoredAttrs::default()
    }
}

fn ok(reply: ReplyEmpty, (): ()) {
    reply.ok()
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
        // The kernel splits a file's read-ahead into several requests once the requests in flight reach 3/4 of
        // max_background: at 64, 64 readers of 100 KB files cost 2.5 FUSE reads a file instead of one
        // (tests/per_file_cost.rs). Reads never block a FUSE thread, so more in flight costs no thread.
        let _ = config.set_max_background(256);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let span = debug_span!("lookup", parent = parent.0, name = %name.to_string_lossy());
        let (fs, name) = (Arc::clone(&self.fs), name_str(name));
        let work = async move { fs.metadata().lookup(parent.0, &name?).await };
        self.serve("lookup", span, reply, work, self.entry());
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        // No reply and nothing to wait for: only counted.
        crate::metrics::fuse_request("forget");
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let fs = Arc::clone(&self.fs);
        let work = async move { fs.metadata().getattr(ino.0).await };
        let span = debug_span!("getattr", ino = ino.0);
        self.serve("getattr", span, reply, work, self.attr());
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let fs = Arc::clone(&self.fs);
        let time = |t: TimeOrNow| match t {
            TimeOrNow::SpecificTime(t) => t,
            TimeOrNow::Now => SystemTime::now(),
        };
        let change = StoredAttrs {
            mode,
            uid,
            gid,
            mtime: mtime.map(time),
            atime: atime.map(time),
        };
        let work = async move { fs.setattr(ino.0, size, fh.map(|f| f.0), change).await };
        let span = debug_span!("setattr", ino = ino.0);
        self.serve("setattr", span, reply, work, self.attr());
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
        let span = debug_span!("mkdir", parent = parent.0, name = %name.to_string_lossy());
        let (fs, name) = (Arc::clone(&self.fs), name_str(name));
        let work = async move { fs.metadata().mkdir(parent.0, &name?).await };
        self.serve("mkdir", span, reply, work, self.entry());
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let span = debug_span!("symlink", parent = parent.0, name = %link_name.to_string_lossy());
        let (fs, name) = (Arc::clone(&self.fs), name_str(link_name));
        let target = target.as_os_str().as_bytes().to_vec();
        let work = async move { fs.metadata().symlink(parent.0, &name?, &target).await };
        self.serve("symlink", span, reply, work, self.entry());
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let fs = Arc::clone(&self.fs);
        let work = async move { fs.metadata().readlink(ino.0).await };
        let span = debug_span!("readlink", ino = ino.0);
        self.serve("readlink", span, reply, work, |reply, target| {
            reply.data(&target)
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let span = debug_span!("unlink", parent = parent.0, name = %name.to_string_lossy());
        let (fs, name) = (Arc::clone(&self.fs), name_str(name));
        let work = async move { fs.unlink(parent.0, &name?).await };
        self.serve("unlink", span, reply, work, ok);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let span = debug_span!("rmdir", parent = parent.0, name = %name.to_string_lossy());
        let (fs, name) = (Arc::clone(&self.fs), name_str(name));
        let work = async move { fs.metadata().rmdir(parent.0, &name?).await };
        self.serve("rmdir", span, reply, work, ok);
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
        let span = debug_span!(
            "rename",
            parent = parent.0,
            name = %name.to_string_lossy(),
            newparent = newparent.0,
            newname = %newname.to_string_lossy()
        );
        let names = name_str(name).and_then(|n| Ok((n, name_str(newname)?)));
        let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let fs = Arc::clone(&self.fs);
        let work = async move {
            let (name, newname) = names?;
            if exchange {
                // Two objects cannot trade keys atomically.
                return Err(FsError::InvalidArgument("RENAME_EXCHANGE".into()));
            }
            fs.rename(parent.0, &name, newparent.0, &newname, no_replace)
                .await
        };
        self.serve("rename", span, reply, work, ok);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let pid = req.pid();
        let raw = flags.0;
        let access = raw & libc::O_ACCMODE;
        let mode = OpenMode {
            direct: raw & libc::O_DIRECT != 0,
            read: access == libc::O_RDONLY || access == libc::O_RDWR,
            write: access == libc::O_WRONLY || access == libc::O_RDWR,
            truncate: raw & libc::O_TRUNC != 0,
            append: raw & libc::O_APPEND != 0,
            not_for_reading: raw & libc::O_NONBLOCK != 0,
        };
        let fs = Arc::clone(&self.fs);
        let work = async move { fs.open(ino.0, mode, pid).await };
        let span = debug_span!("open", ino = ino.0);
        let notifier = Arc::clone(&self.notifier);
        self.serve("open", span, reply, work, move |reply, opened| {
            let mut flags = FopenFlags::empty();
            let pushed = opened.preload.as_ref().is_some_and(|p| {
                p.store_if_untouched(|bytes| push_to_page_cache(&notifier, ino, bytes))
            });
            if opened.keep_cache || pushed {
                flags |= FopenFlags::FOPEN_KEEP_CACHE;
            }
            if opened.bypass_page_cache {
                flags |= FopenFlags::FOPEN_DIRECT_IO;
            }
            if opened.no_flush {
                flags |= FopenFlags::FOPEN_NOFLUSH;
            }
            reply.opened(FileHandle(opened.fh), flags)
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let pid = req.pid();
        let owner = new_file_owner(req, mode, umask);
        let span = debug_span!("create", parent = parent.0, name = %name.to_string_lossy());
        let (fs, name) = (Arc::clone(&self.fs), name_str(name));
        let work = async move {
            let (a, fh) = fs.create_as(parent.0, &name?, pid, owner).await?;
            Ok((a, fh, fs.writes_bypass_page_cache()))
        };
        let bs = self.block_size;
        self.serve(
            "create",
            span,
            reply,
            work,
            move |reply, (a, fh, bypass)| {
                let flags = if bypass {
                    FopenFlags::FOPEN_DIRECT_IO
                } else {
                    FopenFlags::empty()
                };
                reply.created(
                    &a.trusted_for,
                    &file_attr(&a, bs),
                    Generation(0),
                    FileHandle(fh),
                    flags,
                )
            },
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
        let fs = Arc::clone(&self.fs);
        let work = async move { fs.read(fh.0, offset, size).await };
        let span = debug_span!("read", ino = ino.0, offset, size);
        self.serve("read", span, reply, work, |reply, data| {
            crate::metrics::read_bytes(data.len() as u64);
            reply.data(&data)
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let span = debug_span!("write", ino = ino.0, offset);
        // O_SYNC includes O_DSYNC's bit.
        if flags.0 & libc::O_DSYNC != 0 {
            let (fs, data) = (Arc::clone(&self.fs), data.to_vec());
            let work = async move { fs.write_durably(fh.0, offset, &data).await };
            return self.serve("write", span, reply, work, |reply, n| {
                crate::metrics::written_bytes(u64::from(n));
                reply.written(n)
            });
        }
        // The fast path answers here, without a future or a task: it is every write of a streaming checkpoint.
        if !self.stopping()
            && let Some(n) = span.in_scope(|| self.fs.write_now(fh.0, offset, data))
        {
            crate::metrics::fuse_request("write");
            crate::metrics::written_bytes(u64::from(n));
            return reply.written(n);
        }
        // The work may outlive `data`: copied only when the fast path could not take the bytes.
        let data = data.to_vec();
        let fs = Arc::clone(&self.fs);
        let work = async move { fs.write(fh.0, offset, &data).await };
        self.serve("write", span, reply, work, |reply, n| {
            crate::metrics::written_bytes(u64::from(n));
            reply.written(n)
        });
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let pid = req.pid();
        let fs = Arc::clone(&self.fs);
        let work = async move { fs.flush(fh.0, pid).await };
        let span = debug_span!("flush", ino = ino.0);
        self.serve("flush", span, reply, work, ok);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let fs = Arc::clone(&self.fs);
        let work = async move { fs.fsync(fh.0).await };
        let span = debug_span!("fsync", ino = ino.0);
        self.serve("fsync", span, reply, work, ok);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let fs = Arc::clone(&self.fs);
        let work = async move { fs.fallocate(fh.0, offset, length, mode).await };
        let span = debug_span!("fallocate", ino = ino.0, offset, length, mode);
        self.serve("fallocate", span, reply, work, ok);
    }

    /// Names are durable once their objects are uploaded (each fsync or close of a file): nothing to do.
    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        crate::metrics::fuse_request("fsyncdir");
        reply.ok();
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
        if self.drop_releases {
            crate::metrics::fuse_request("release");
            return reply.ok();
        }
        let fs = Arc::clone(&self.fs);
        let delay = self.release_delay;
        let work = async move {
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            fs.release(fh.0).await
        };
        let span = debug_span!("release", ino = ino.0);
        self.serve("release", span, reply, work, ok);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let work = std::future::ready(self.fs.opendir(ino.0));
        let span = debug_span!("opendir", ino = ino.0);
        self.serve("opendir", span, reply, work, |reply, fh| {
            reply.opened(FileHandle(fh), FopenFlags::empty())
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let fs = Arc::clone(&self.fs);
        let work = async move { fs.readdir(fh.0, offset).await };
        let span = debug_span!("readdir", ino = ino.0, offset);
        self.serve("readdir", span, reply, work, move |mut reply, entries| {
            for (i, entry) in entries.iter().enumerate().skip(offset as usize) {
                if reply.add(
                    INodeNo(entry.ino),
                    i as u64 + 1,
                    file_type(entry.kind),
                    &entry.name,
                ) {
                    break;
                }
            }
            reply.ok();
        });
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let (fs, bs) = (Arc::clone(&self.fs), self.block_size);
        let listed = Arc::clone(&fs);
        let work = async move { listed.readdir(fh.0, offset).await };
        let span = debug_span!("readdirplus", ino = ino.0, offset);
        self.serve(
            "readdirplus",
            span,
            reply,
            work,
            move |mut reply, entries| {
                for (i, entry) in entries.iter().enumerate().skip(offset as usize) {
                    let Some(attr) = fs.cached_attr(entry.ino) else {
                        continue;
                    };
                    let dots = entry.name == "." || entry.name == "..";
                    if reply.add(
                        INodeNo(entry.ino),
                        i as u64 + 1,
                        &entry.name,
                        &attr.trusted_for,
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
            },
        );
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let fs = Arc::clone(&self.fs);
        // A directory handle holds no data: its release cannot fail in a way the caller could act on.
        let work = async move {
            let _ = fs.release(fh.0).await;
            Ok(())
        };
        let span = debug_span!("releasedir", ino = ino.0);
        self.serve("releasedir", span, reply, work, ok);
    }

    // statfs and access answer at once and cannot fail: counted, then answered here, with no future.
    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        crate::metrics::fuse_request("statfs");
        let (blocks, files) = self.fs.statfs();
        let bs = self.block_size;
        // Buckets have no fixed capacity: report a large, mostly free volume so tools do not refuse to write.
        reply.statfs(blocks, blocks, blocks, files, u64::MAX / 2, bs, 255, bs)
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        crate::metrics::fuse_request("access");
        reply.ok()
    }

    // One ioctl is ours: [`KEEP_IN_CACHE`]. No other means anything on a file of a bucket. Python's open()
    // asks every file whether it is a terminal (TCGETS): ENOTTY is the ordinary answer to that, and routine,
    // so it is counted, not logged.
    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        if cmd == KEEP_IN_CACHE
            && out_size as usize == size_of::<u64>()
            && let Ok(start) = <[u8; 8]>::try_from(in_data)
        {
            let start = u64::from_ne_bytes(start);
            let fs = Arc::clone(&self.fs);
            let work = async move { fs.keep_in_cache(fh.0, start).await };
            let span = debug_span!("keep_in_cache", ino = ino.0, start);
            self.serve("ioctl", span, reply, work, |reply, (end, more)| {
                reply.ioctl(i32::from(more), &end.to_ne_bytes())
            });
            return;
        }
        crate::metrics::fuse_request("ioctl");
        crate::metrics::ioctl_refused();
        tracing::trace!(ino = ino.0, cmd, out_size, "ioctl refused (ENOTTY)");
        reply.error(Errno::ENOTTY)
    }

    // What the mount does not offer, answered as fuser's defaults answer but without their WARN line, which
    // reads as a fault in the daemon's log: `cp` asks for SEEK_DATA and copy_file_range, `ls` and a write
    // ask for extended attributes. ENOSYS is remembered by the kernel for the mount's lifetime (the callers
    // then get EOPNOTSUPP, or the kernel's own lseek and copy), so each costs one request per mount.

    fn getxattr(&self, _req: &Request, ino: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        not_offered("getxattr", ino, reply, Errno::ENOSYS, ReplyXattr::error);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, _size: u32, reply: ReplyXattr) {
        not_offered("listxattr", ino, reply, Errno::ENOSYS, ReplyXattr::error);
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        not_offered("setxattr", ino, reply, Errno::ENOSYS, ReplyEmpty::error);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        not_offered("removexattr", ino, reply, Errno::ENOSYS, ReplyEmpty::error);
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        not_offered("lseek", ino, reply, Errno::ENOSYS, ReplyLseek::error);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        not_offered(
            "copy_file_range",
            ino_in,
            reply,
            Errno::ENOSYS,
            ReplyWrite::error,
        );
    }

    /// Hard links: an object has one key (SEMANTICS).
    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        not_offered("link", ino, reply, Errno::EPERM, ReplyEntry::error);
    }

    /// A regular file (mknod(2), `os.mknod`) becomes an empty object; device files, FIFOs and sockets have
    /// no object to be.
    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            not_offered("mknod", parent, reply, Errno::EPERM, ReplyEntry::error);
            return;
        }
        let pid = req.pid();
        let owner = new_file_owner(req, mode, umask);
        let span = debug_span!("mknod", parent = parent.0, name = %name.to_string_lossy());
        let (fs, name) = (Arc::clone(&self.fs), name_str(name));
        let work = async move { fs.mknod_file(parent.0, &name?, pid, owner).await };
        self.serve("mknod", span, reply, work, self.entry());
    }
}

/// Answers a request for something the mount does not offer: counted (with its errno), logged at debug.
fn not_offered<R>(op: &'static str, ino: INodeNo, reply: R, errno: Errno, error: fn(R, Errno)) {
    crate::metrics::fuse_request(op);
    crate::metrics::fuse_error(op, errno.code());
    debug!(op, ino = ino.0, ?errno, "not offered by the mount");
    error(reply, errno)
}

/// Stores `bytes` as the whole of `ino`'s page cache (FUSE_NOTIFY_STORE). The cache is known to be empty, and
/// nothing else has opened or truncated the inode since this open began (`Preload::store_if_untouched`).
/// Returns whether the kernel took them: if not, the open is answered without keeping the cache and the
/// reads go to the handle as usual. (fuser reports an inode the kernel no longer has as success; the kernel
/// holds the inode being opened.)
fn push_to_page_cache(notifier: &OnceLock<fuser::Notifier>, ino: INodeNo, bytes: &[u8]) -> bool {
    let Some(notifier) = notifier.get() else {
        return false;
    };
    match notifier.store(ino, 0, bytes) {
        Ok(()) => {
            crate::metrics::page_cache_preload(bytes.len());
            true
        }
        Err(e) => {
            debug!(ino = ino.0, error = %e, "the kernel did not take a small file's bytes");
            false
        }
    }
}

/// Passes a [`KernelNotice`] on. Attributes: FUSE_NOTIFY_INVAL_INODE with a negative offset drops them and
/// touches no page, so it may run while a request on the same inode is being answered. A name: the kernel
/// takes the directory's lock to drop it, which a request it is serving in that directory may hold while
/// waiting for us, so that notice goes from a thread of its own.
fn tell_kernel(notifier: &Arc<OnceLock<fuser::Notifier>>, notice: KernelNotice) {
    let Some(kernel) = notifier.get() else {
        return;
    };
    match notice {
        KernelNotice::Attributes(ino) => {
            if let Err(e) = kernel.inval_inode(INodeNo(ino), -1, 0) {
                debug!(ino, error = %e, "the kernel did not drop an inode's attributes");
            }
        }
        KernelNotice::NameGone { parent, name } => {
            let notifier = Arc::clone(notifier);
            std::thread::spawn(move || {
                if let Some(kernel) = notifier.get()
                    && let Err(e) = kernel.inval_entry(INodeNo(parent), name.as_ref())
                {
                    debug!(parent, name, error = %e, "the kernel did not drop a name");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    #[test]
    fn a_name_that_is_not_utf8_is_einval_through_the_error_type() {
        let bad = OsStr::from_bytes(b"caf\xe9");
        let e = name_str(bad).unwrap_err();
        assert!(matches!(e, FsError::NameNotUtf8));
        assert_eq!(errno(&e), Errno::EINVAL);
        assert_eq!(name_str(OsStr::new("café")).unwrap(), "café");
        assert_eq!(
            errno(&FsError::InvalidArgument("RENAME_EXCHANGE".into())),
            Errno::EINVAL
        );
    }

    #[test]
    fn local_failures_are_enospc_or_eio() {
        let full = FsError::local("f", std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(errno(&full), Errno::ENOSPC);
        let broken = FsError::local("f", std::io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(errno(&broken), Errno::EIO);
        assert_eq!(
            errno(&FsError::io("f", std::io::Error::other("x"))),
            Errno::EIO
        );
    }
}
