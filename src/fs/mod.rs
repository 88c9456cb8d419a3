//! File system core: inodes, lookup, readdir, read and write handles. No fuser types here: the FUSE
//! adapter calls these async methods and turns [`FsError`] into errno.
//!
//! [`S3Filesystem`] owns two halves and little else:
//! - `superblock.rs`: what is known about names (inode table, negative cache, listings, storms, lookups in
//!   flight, first bytes) and the metadata operations, which the FUSE edge calls through
//!   [`S3Filesystem::metadata`].
//! - `handles.rs`: open files and directories, and the read/write dispatch. Its operations are written as
//!   `impl S3Filesystem` in that file, since each needs both the handle table and the superblock.

pub mod attrs;
pub mod error;
mod first_bytes;
mod handles;
mod in_flight;
pub mod inode;
mod listing;
pub mod names;
mod negative;
pub mod preload;
pub mod read;
pub mod read_ahead;
pub mod staged;
mod superblock;
pub mod write;

#[cfg(any(test, feature = "testing"))]
pub mod model_ops;
#[cfg(test)]
mod model_test;
#[cfg(test)]
mod test_support;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

pub use error::{FsError, FsResult};
use handles::{HandleTable, WriterSlots};
pub use inode::ROOT_INO;
pub use superblock::Superblock;

use crate::memory::MemoryBudget;
use crate::s3::ObjectClient;
use crate::source::ReadSources;

/// Configuration of the core, built by the CLI layer from flags.
#[derive(Debug, Clone)]
pub struct FsConfig {
    /// Key prefix mounted at the root: empty or ending in `/`.
    pub prefix: String,
    pub uid: u32,
    pub gid: u32,
    pub dir_mode: u16,
    pub file_mode: u16,
    pub read_only: bool,
    pub allow_overwrite: bool,
    pub allow_delete: bool,
    /// mkdir writes a marker object (`dir/`), so an empty directory lasts (`--directory-markers`).
    pub directory_markers: bool,
    pub incremental_upload: bool,
    /// Keep POSIX attributes in object metadata (`--preserve-metadata`, see `attrs`).
    pub preserve_metadata: bool,
    /// Most objects a directory rename may move (`--max-rename-objects`).
    pub max_rename_objects: u64,
    pub read_part_size: u64,
    /// Most bytes one read handle fetches ahead.
    pub max_prefetch: u64,
    /// Bytes a lookup fetches from the start of a file along with its metadata (0: a plain HEAD).
    pub lookup_prefetch: u64,
    /// Files at least this big are read around the kernel's page cache (u64::MAX: never).
    pub direct_io_threshold: u64,
    pub write_part_size: u64,
    /// Parts one file uploads at once (4: enough for 10 Gbit/s; `--maximum-throughput-gbps` scales it).
    pub upload_parts_in_flight: usize,
    /// Files open for writing at once (each holds up to a few parts in memory).
    pub max_writers: usize,
    /// Where out-of-order writes are staged; None disables staging.
    pub staging_dir: Option<PathBuf>,
    pub staging_limit: u64,
    /// How long lookups, attributes and listings are trusted.
    pub metadata_ttl: Duration,
    pub negative_metadata_ttl: Duration,
    /// Shared by read-ahead and upload buffers (`--memory-target`).
    pub memory: Arc<MemoryBudget>,
}

impl FsConfig {
    pub fn new(uid: u32, gid: u32) -> FsConfig {
        FsConfig {
            prefix: String::new(),
            uid,
            gid,
            dir_mode: 0o755,
            file_mode: 0o644,
            read_only: false,
            allow_overwrite: false,
            allow_delete: false,
            directory_markers: false,
            incremental_upload: false,
            preserve_metadata: false,
            max_rename_objects: 1000,
            read_part_size: 8 * 1024 * 1024,
            max_prefetch: 64 * 1024 * 1024,
            lookup_prefetch: 256 * 1024,
            direct_io_threshold: 32 * 1024 * 1024,
            write_part_size: 8 * 1024 * 1024,
            upload_parts_in_flight: 4,
            max_writers: 64,
            staging_dir: Some(std::env::temp_dir()),
            staging_limit: 256 * 1024 * 1024,
            metadata_ttl: Duration::from_secs(1),
            negative_metadata_ttl: Duration::from_secs(1),
            memory: MemoryBudget::unlimited(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Directory,
    Symlink,
}

/// Attributes of a node, in file-system terms.
#[derive(Debug, Clone)]
pub struct Attr {
    pub ino: u64,
    pub kind: FileKind,
    pub size: u64,
    pub mtime: SystemTime,
    pub atime: SystemTime,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    /// With `--preserve-metadata`, a file known only from a listing: mode, owner and times are the mount's
    /// defaults until a HEAD reads its metadata, so the kernel must not keep them.
    pub provisional: bool,
    /// How long the kernel may keep these attributes and the name that led to them: no longer than the mount
    /// itself trusts them, so that another client's change shows within one TTL, not two.
    pub trusted_for: Duration,
}

#[derive(Debug, Clone)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: FileKind,
    pub name: String,
}

/// What the kernel may cache that a write which never reached the bucket made wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelNotice {
    /// The inode's attributes: the writer had changed its size.
    Attributes(u64),
    /// A name made here whose file never got to the bucket: it is gone.
    NameGone { parent: u64, name: String },
}

/// An open file handle and how the kernel should cache its bytes.
#[derive(Debug)]
pub struct Opened {
    pub fh: u64,
    /// The page cache holds bytes of the very version opened: keep them (FOPEN_KEEP_CACHE), so a second
    /// epoch over files that fit in memory is served by the kernel.
    pub keep_cache: bool,
    /// Read around the page cache (FOPEN_DIRECT_IO): big files are streamed once per epoch, and copying
    /// them into the page cache costs a copy and evicts what is worth keeping.
    pub bypass_page_cache: bool,
    /// close(2) has nothing to do for this handle (FOPEN_NOFLUSH): the kernel skips the FLUSH round trip,
    /// one of the five requests a small file costs.
    pub no_flush: bool,
    /// The whole file, of the version this handle reads, for a page cache known to be empty: pushed into
    /// it before the open is answered (and the cache then kept), the first read needs no READ round trip.
    /// Whoever cannot push it answers without keeping the cache; the handle still serves every read. Another
    /// open or a truncation of the inode before the store voids it ([`preload`]).
    pub preload: Option<preload::Preload>,
}

/// How a file is opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenMode {
    /// O_DIRECT: revalidate against the bucket and read around the data caches.
    pub direct: bool,
    pub write: bool,
    pub read: bool,
    pub truncate: bool,
    pub append: bool,
    /// O_NONBLOCK, which means nothing for a regular file: `expressfs warm` opens files so to say it will
    /// not read them, so their bytes are not put into the page cache at open (`Opened::preload`).
    pub not_for_reading: bool,
}

pub struct S3Filesystem {
    client: Arc<dyn ObjectClient>,
    /// Where file data is read from: through the caches, or (O_DIRECT) the bucket itself.
    sources: ReadSources,
    config: Arc<FsConfig>,
    /// Names, attributes and listings.
    sb: Superblock,
    /// Open files and directories.
    handles: HandleTable,
    /// Write handles open, against `max_writers`.
    writer_slots: WriterSlots,
    /// Whether big files may be read, and files being written written, with direct I/O: not where the
    /// kernel could then not mmap them.
    direct_io_for_big_files: AtomicBool,
    /// What `expressfs warm` fetches at once, all files together: one read-ahead window.
    keep_budget: read::KeepBudget,
    /// What all readers fetch ahead together: two read-ahead windows (one part each at least).
    read_ahead: Arc<read_ahead::ReadAheadShare>,
    /// First opens' preloads not stored yet: another open or a truncation of the inode voids them.
    preloads: preload::Preloads,
    /// Tells the kernel to forget what it caches of an inode or a name (set by the FUSE adapter).
    kernel_notices: OnceLock<Box<dyn Fn(KernelNotice) + Send + Sync>>,
}

impl S3Filesystem {
    pub fn new(client: Arc<dyn ObjectClient>, config: FsConfig) -> S3Filesystem {
        let config = Arc::new(config);
        let keep_budget = read::KeepBudget::new(config.max_prefetch.max(config.read_part_size));
        let read_ahead = read_ahead::ReadAheadShare::for_mount(config.max_prefetch);
        let sources = ReadSources::bucket(Arc::clone(&client));
        S3Filesystem {
            sb: Superblock::new(
                Arc::clone(&client),
                Arc::clone(&sources.cached),
                Arc::clone(&config),
            ),
            handles: HandleTable::new(),
            writer_slots: WriterSlots::new(config.max_writers),
            sources,
            client,
            config,
            direct_io_for_big_files: AtomicBool::new(true),
            keep_budget,
            read_ahead,
            preloads: preload::Preloads::default(),
            kernel_notices: OnceLock::new(),
        }
    }

    /// File data (and the first bytes lookups fetch) comes from `sources`, caches stacked on the bucket,
    /// instead of straight from the client's bucket.
    pub fn with_read_sources(mut self, sources: ReadSources) -> S3Filesystem {
        self.sb.set_first_bytes_source(Arc::clone(&sources.cached));
        self.sources = sources;
        self
    }

    /// Starts from the mount's first LIST of its root (see [`Superblock::take_root_page`]).
    pub fn with_root_page(
        self,
        page: crate::s3::ListPage,
        asked: std::time::Instant,
    ) -> S3Filesystem {
        self.sb.take_root_page(page, asked);
        self
    }

    /// The kernel cannot mmap files opened with direct I/O (before Linux 6.6): big files then use the page
    /// cache like small ones, and only O_DIRECT opens bypass it.
    pub fn keep_big_files_in_page_cache(&self) {
        self.direct_io_for_big_files.store(false, Ordering::Relaxed);
    }

    /// Whether a handle that writes goes around the page cache. The written bytes then cross the kernel
    /// once (from the writer's pages into our request) instead of twice (first into page-cache pages), and
    /// nothing stale is left cached. Reads through a write handle are refused anyway.
    pub fn writes_bypass_page_cache(&self) -> bool {
        self.direct_io_for_big_files.load(Ordering::Relaxed)
    }

    pub fn config(&self) -> &FsConfig {
        &self.config
    }

    /// The metadata half: lookup, getattr, mkdir, rmdir, unlink, rename, symlink and readlink are its
    /// methods, called on it directly rather than through forwarding methods here.
    pub fn metadata(&self) -> &Superblock {
        &self.sb
    }

    /// Attributes of a node already in the table (readdirplus answers from the listing just made).
    pub fn cached_attr(&self, ino: u64) -> Option<Attr> {
        let table = self.sb.table();
        table.get(ino).map(|n| self.sb.attr_of(n))
    }

    /// The kernel took a reference to `ino` outside lookup (readdirplus entries).
    pub fn add_lookup(&self, ino: u64) {
        self.sb.table().add_lookup(ino);
    }

    pub fn forget(&self, ino: u64, n: u64) {
        self.sb.table().forget(ino, n);
    }

    /// (open handles, open writers, known inodes), for metrics and the periodic summary.
    pub fn usage(&self) -> (usize, u64, usize) {
        (
            self.handles.len(),
            self.writer_slots.open(),
            self.sb.table().len(),
        )
    }

    /// How to tell the kernel that something it caches is wrong now (see [`KernelNotice`]). Set once, by
    /// whoever serves the kernel.
    pub fn on_kernel_notice(&self, tell: impl Fn(KernelNotice) + Send + Sync + 'static) {
        let _ = self.kernel_notices.set(Box::new(tell));
    }

    fn tell_kernel(&self, notice: KernelNotice) {
        if let Some(tell) = self.kernel_notices.get() {
            tell(notice);
        }
    }

    /// Bytes of the mount's read-ahead share that readers' windows hold now.
    pub fn read_ahead_shared(&self) -> u64 {
        self.read_ahead.granted()
    }

    /// Node-count and capacity figures for statfs: an object store has no fixed size.
    pub fn statfs(&self) -> (u64, u64) {
        let nodes = self.sb.table().len() as u64;
        (1 << 40, nodes)
    }
}
