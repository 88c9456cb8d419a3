//! File system core: inodes, lookup, readdir, read and write handles. No fuser types here: the FUSE
//! adapter calls these async methods and turns [`FsError`] into errno.

pub mod error;
mod first_bytes;
mod in_flight;
pub mod inode;
mod listing;
pub mod names;
pub mod read;
pub mod write;

#[cfg(any(test, feature = "testing"))]
pub mod model_ops;
#[cfg(test)]
mod model_test;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use tokio::sync::Mutex as AsyncMutex;
use tracing::debug;

pub use error::{FsError, FsResult};
use first_bytes::FirstBytes;
pub use inode::ROOT_INO;
use inode::{InodeTable, Kind, Stat};
use listing::Storms;
use read::Reader;
use write::{Writer, WriterOptions};

use crate::memory::MemoryBudget;
use crate::s3::{ObjectClient, WriteCondition};

/// Listings of one readdir, when our own changes in the directory keep overtaking them.
const LIST_ATTEMPTS: u32 = 3;

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
    pub incremental_upload: bool,
    pub read_part_size: u64,
    /// Most bytes one read handle fetches ahead.
    pub max_prefetch: u64,
    /// Bytes a lookup fetches from the start of a file along with its metadata (0: a plain HEAD).
    pub lookup_prefetch: u64,
    /// Files at least this big are read around the kernel's page cache (u64::MAX: never).
    pub direct_io_threshold: u64,
    pub write_part_size: u64,
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
            incremental_upload: false,
            read_part_size: 8 * 1024 * 1024,
            max_prefetch: 64 * 1024 * 1024,
            lookup_prefetch: 256 * 1024,
            direct_io_threshold: 32 * 1024 * 1024,
            write_part_size: 8 * 1024 * 1024,
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
}

/// Attributes of a node, in file-system terms.
#[derive(Debug, Clone)]
pub struct Attr {
    pub ino: u64,
    pub kind: FileKind,
    pub size: u64,
    pub mtime: SystemTime,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Clone)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: FileKind,
    pub name: String,
}

/// An open file handle and how the kernel should cache its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

enum Handle {
    Read {
        ino: u64,
        /// The version the reader is pinned to.
        etag: String,
        reader: AsyncMutex<Reader>,
    },
    Write {
        ino: u64,
        writer: AsyncMutex<Writer>,
        /// Process (thread group) that opened the file: flushes from other processes are not closes of
        /// this descriptor (a fork+exec elsewhere closes inherited copies) and must not end the upload.
        opener: Option<u32>,
        /// Whether this handle still counts as a writer of its node (until its upload is done).
        counted: AtomicBool,
    },
    Dir {
        entries: Mutex<Option<Arc<Vec<DirEntry>>>>,
        ino: u64,
    },
}

impl Handle {
    /// A write handle's node, writer and writer count flag.
    fn as_writer(&self) -> Option<(u64, &AsyncMutex<Writer>, &AtomicBool)> {
        match self {
            Handle::Write {
                ino,
                writer,
                counted,
                ..
            } => Some((*ino, writer, counted)),
            _ => None,
        }
    }
}

/// A directory's entries and until when they may be served without listing again.
type CachedListing = (Instant, Arc<Vec<DirEntry>>);

pub struct S3Filesystem {
    client: Arc<dyn ObjectClient>,
    /// The bucket without cache layers, for O_DIRECT reads.
    direct_client: Arc<dyn ObjectClient>,
    config: FsConfig,
    /// Shared with background listings (see [`listing`]).
    inodes: Arc<Mutex<InodeTable>>,
    /// Names known not to exist, until the given instant.
    negative: Mutex<HashMap<(u64, String), Instant>>,
    /// Directory listings, trusted for the metadata TTL; dropped when we change the directory ourselves.
    listings: Mutex<HashMap<u64, CachedListing>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    /// Lookups per directory, to list a directory whole when they come in a storm.
    storms: Arc<Storms>,
    /// Names being asked about, so that lookups of one name at once send one pair of requests.
    lookups_in_flight: in_flight::InFlight,
    /// Starts of files fetched by lookups, waiting for their open.
    first_bytes: FirstBytes,
    /// Whether big files may be read, and files being written written, with direct I/O: not where the
    /// kernel could then not mmap them.
    direct_io_for_big_files: AtomicBool,
    next_handle: AtomicU64,
    writers: AtomicU64,
}

impl S3Filesystem {
    pub fn new(client: Arc<dyn ObjectClient>, config: FsConfig) -> S3Filesystem {
        let first_bytes = FirstBytes::new(config.metadata_ttl);
        S3Filesystem {
            inodes: Arc::new(Mutex::new(InodeTable::new(&config.prefix))),
            storms: Arc::new(Storms::new(config.metadata_ttl)),
            lookups_in_flight: in_flight::InFlight::default(),
            direct_client: Arc::clone(&client),
            client,
            config,
            negative: Mutex::new(HashMap::new()),
            listings: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            first_bytes,
            direct_io_for_big_files: AtomicBool::new(true),
            next_handle: AtomicU64::new(1),
            writers: AtomicU64::new(0),
        }
    }

    /// Reads opened with O_DIRECT use `client` (the bucket without the cache layers).
    pub fn with_direct_client(mut self, client: Arc<dyn ObjectClient>) -> S3Filesystem {
        self.direct_client = client;
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

    fn table(&self) -> MutexGuard<'_, InodeTable> {
        self.inodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn negative(&self) -> MutexGuard<'_, HashMap<(u64, String), Instant>> {
        self.negative.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn attr_of(&self, node: &inode::Node) -> Attr {
        let (kind, perm) = match node.kind {
            Kind::File => (FileKind::File, self.config.file_mode),
            Kind::Directory => (FileKind::Directory, self.config.dir_mode),
        };
        Attr {
            ino: node.ino,
            kind,
            size: node.stat.size,
            mtime: node.stat.mtime,
            perm,
            uid: self.config.uid,
            gid: self.config.gid,
        }
    }

    fn expiry(&self) -> Instant {
        Instant::now() + self.config.metadata_ttl
    }

    fn dir_node(&self, ino: u64) -> FsResult<inode::Node> {
        let node = self.table().get(ino).cloned().ok_or(FsError::NotFound)?;
        if node.kind != Kind::Directory {
            return Err(FsError::NotADirectory);
        }
        Ok(node)
    }

    fn handle(&self, fh: u64) -> FsResult<Arc<Handle>> {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle)
    }

    fn add_handle(&self, handle: Handle) -> u64 {
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, Arc::new(handle));
        fh
    }

    fn check_name(name: &str) -> FsResult<()> {
        if name.len() > names::NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        if !names::is_valid_name(name) {
            return Err(FsError::NotFound);
        }
        Ok(())
    }

    /// Asks the bucket what `parent/name` is: the object `key` and the prefix `key/` are checked at once;
    /// when both exist the directory wins. With `first_bytes` the object is asked for with its first bytes
    /// (see [`FirstBytes`]), unless `lookup_prefetch` is 0.
    async fn resolve(
        &self,
        parent: &inode::Node,
        name: &str,
        first_bytes: bool,
    ) -> FsResult<Option<(Kind, Stat)>> {
        let key = names::file_key(&parent.key, name);
        let dir_prefix = format!("{key}/");
        let object = async {
            match self.config.lookup_prefetch {
                n if n > 0 && first_bytes => self.client.head_with_first_bytes(&key, n).await,
                _ => self
                    .client
                    .head_object(&key)
                    .await
                    .map(|i| (i, Bytes::new())),
            }
        };
        let (object, list) = tokio::join!(
            object,
            self.client.list_objects(&dir_prefix, Some("/"), None, 1)
        );
        let list = list.map_err(|e| FsError::client(&dir_prefix, e))?;
        if !list.objects.is_empty() || !list.common_prefixes.is_empty() {
            return Ok(Some((Kind::Directory, Stat::directory())));
        }
        match object {
            Ok((info, first)) => {
                self.first_bytes
                    .keep(&key, &info.etag, first, &self.config.memory);
                Ok(Some((Kind::File, Stat::of(&info))))
            }
            Err(e) => match FsError::client(&key, e) {
                FsError::NotFound => Ok(None),
                other => Err(other),
            },
        }
    }

    pub async fn lookup(&self, parent: u64, name: &str) -> FsResult<Attr> {
        Self::check_name(name)?;
        let parent_node = self.dir_node(parent)?;
        let now = Instant::now();
        // A file whose bytes the page cache already holds is asked about with a HEAD: if it is unchanged,
        // its next open keeps those bytes.
        let cached = match self.fresh_child(&parent_node, name, now) {
            Ok(attr) => return Ok(attr),
            Err(cached) => cached,
        };
        if self
            .negative()
            .get(&(parent, name.to_string()))
            .is_some_and(|until| *until > now)
        {
            return Err(FsError::NotFound);
        }
        let asking = match self.lookups_in_flight.join(parent, name) {
            in_flight::Joined::Asking(asking) => Some(asking),
            in_flight::Joined::Waiting(answer) => {
                match in_flight::wait(answer).await {
                    // A file we made since the answer (not in the bucket yet) is still ours to find.
                    Some(in_flight::Answer::Missing) => {
                        return self
                            .local_child(&mut self.table(), parent, name)
                            .ok_or(FsError::NotFound);
                    }
                    Some(in_flight::Answer::Found) => {
                        if let Ok(attr) = self.fresh_child(&parent_node, name, Instant::now()) {
                            return Ok(attr);
                        }
                    }
                    None => {}
                }
                // The other lookup failed, or its entry is already gone: ask for ourselves.
                None
            }
        };
        if self.storms.note_miss(parent, now) {
            self.list_in_background(parent_node.clone());
        }
        let asked = Instant::now();
        let answered = |answer| {
            if let Some(asking) = asking {
                asking.answer(answer);
            }
        };
        match self.resolve(&parent_node, name, !cached).await? {
            Some((kind, stat)) => {
                let attr = {
                    let mut table = self.table();
                    let ino = table.upsert(parent, name, kind, stat, self.expiry(), asked);
                    table.add_lookup(ino);
                    self.attr_of(table.get(ino).expect("just inserted"))
                };
                answered(in_flight::Answer::Found);
                Ok(attr)
            }
            None => {
                // Checked and detached under one lock, so a file made in between is not detached.
                let mut table = self.table();
                if let Some(attr) = self.local_child(&mut table, parent, name) {
                    return Ok(attr);
                }
                table.detach(parent, name);
                drop(table);
                if !self.config.negative_metadata_ttl.is_zero() {
                    self.negative().insert(
                        (parent, name.to_string()),
                        now + self.config.negative_metadata_ttl,
                    );
                }
                answered(in_flight::Answer::Missing);
                Err(FsError::NotFound)
            }
        }
    }

    /// A file of ours the bucket does not show (made here, or being written), counted as a lookup by the kernel.
    fn local_child(&self, table: &mut InodeTable, parent: u64, name: &str) -> Option<Attr> {
        let ino = table
            .child(parent, name)
            .filter(|n| n.local || n.writers > 0)?
            .ino;
        table.add_lookup(ino);
        table.get(ino).map(|n| self.attr_of(n))
    }

    /// The attributes of `name` in `dir` if the table holds a fresh entry (counted as a lookup by the kernel);
    /// otherwise whether the page cache may hold the bytes of the entry it has.
    fn fresh_child(&self, dir: &inode::Node, name: &str, now: Instant) -> Result<Attr, bool> {
        let mut table = self.table();
        let node = table.child(dir.ino, name);
        if let Some(node) = node
            && node.is_fresh(now)
        {
            let ino = node.ino;
            let attr = self.attr_of(node);
            table.add_lookup(ino);
            drop(table);
            // A directory still being read through lists again before its listed entries expire together.
            if self.storms.note_hit(dir.ino, now) {
                self.list_in_background(dir.clone());
            }
            return Ok(attr);
        }
        Err(node.is_some_and(|n| n.cached_etag.is_some()))
    }

    /// Attributes of a node already in the table (readdirplus answers from the listing just made).
    pub fn cached_attr(&self, ino: u64) -> Option<Attr> {
        self.table().get(ino).map(|n| self.attr_of(n))
    }

    /// The kernel took a reference to `ino` outside lookup (readdirplus entries).
    pub fn add_lookup(&self, ino: u64) {
        self.table().add_lookup(ino);
    }

    pub fn forget(&self, ino: u64, n: u64) {
        self.table().forget(ino, n);
    }

    pub async fn getattr(&self, ino: u64) -> FsResult<Attr> {
        let node = self.table().get(ino).cloned().ok_or(FsError::NotFound)?;
        if node.kind == Kind::Directory || node.is_fresh(Instant::now()) {
            return Ok(self.attr_of(&node));
        }
        let asked = Instant::now();
        match self.client.head_object(&node.key).await {
            Ok(info) => {
                let mut table = self.table();
                let expires = self.expiry();
                let n = table.get_mut(ino).ok_or(FsError::NotFound)?;
                n.observe(Stat::of(&info), asked);
                n.expires = expires;
                Ok(self.attr_of(n))
            }
            Err(e) => Err(FsError::client(&node.key, e)),
        }
    }

    /// chmod/chown/utimens are accepted and ignored (modes come from the mount flags); size changes only on
    /// files being written.
    pub async fn setattr(&self, ino: u64, size: Option<u64>, fh: Option<u64>) -> FsResult<Attr> {
        if let Some(size) = size {
            if self.config.read_only {
                return Err(FsError::ReadOnly);
            }
            let handle = match fh {
                Some(fh) => Some(self.handle(fh)?),
                None => self.writer_handle_for(ino),
            };
            match handle.as_deref() {
                Some(Handle::Write { writer, .. }) => {
                    let mut w = writer.lock().await;
                    w.truncate(size)?;
                    let new_size = w.size();
                    if let Some(n) = self.table().get_mut(ino) {
                        n.stat.size = new_size;
                    }
                }
                _ => {
                    let current = self.getattr(ino).await?;
                    if current.size != size {
                        return Err(FsError::NotPermitted(
                            "truncate of a file that is not open for writing",
                        ));
                    }
                }
            }
        }
        self.getattr(ino).await
    }

    fn writer_handle_for(&self, ino: u64) -> Option<Arc<Handle>> {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .find(|h| matches!(h.as_ref(), Handle::Write { ino: i, .. } if *i == ino))
            .cloned()
    }

    pub fn opendir(&self, ino: u64) -> FsResult<u64> {
        self.dir_node(ino)?;
        Ok(self.add_handle(Handle::Dir {
            entries: Mutex::new(None),
            ino,
        }))
    }

    /// Lists the whole directory (all pages) once per handle; entries are merged without assuming any order,
    /// duplicates dropped, a directory shadowing a file of the same name, invalid names hidden.
    ///
    /// A listing sent before one of our own changes in the directory finished answers from before it: it
    /// would bring back a file we just deleted, for a whole TTL. Such a listing is sent again (twice at
    /// most); if the directory is still changing after that, only names the table already has are kept,
    /// and the result serves this handle only. A trusted result is cached for the TTL, decided under the
    /// same table lock as the check, so no change can slip in between.
    async fn list_dir(&self, dir: &inode::Node) -> FsResult<Arc<Vec<DirEntry>>> {
        let mut attempt = 0;
        let (found, asked, mut table, trusted) = loop {
            attempt += 1;
            let asked = Instant::now();
            let found = listing::list_all(self.client.as_ref(), &dir.key, None)
                .await?
                .unwrap_or_default();
            let table = self.table();
            let trusted = self.storms.unchanged_since(dir.ino, asked);
            if trusted || attempt == LIST_ATTEMPTS {
                break (found, asked, table, trusted);
            }
            debug!(
                key = dir.key,
                "the directory changed while it was listed: listing again"
            );
        };
        let expires = self.expiry();
        let mut entries = Vec::with_capacity(found.len() + 2);
        entries.push(DirEntry {
            ino: dir.ino,
            kind: FileKind::Directory,
            name: ".".into(),
        });
        entries.push(DirEntry {
            ino: dir.parent,
            kind: FileKind::Directory,
            name: "..".into(),
        });
        for (name, (kind, stat)) in found {
            if !trusted && table.child(dir.ino, &name).is_none() {
                continue;
            }
            let ino = table.upsert(dir.ino, &name, kind, stat, expires, asked);
            let kind = if kind == Kind::File {
                FileKind::File
            } else {
                FileKind::Directory
            };
            entries.push(DirEntry { ino, kind, name });
        }
        let listed: std::collections::HashSet<String> =
            entries.iter().map(|e| e.name.clone()).collect();
        for (name, ino, kind) in table.local_children(dir.ino) {
            if !listed.contains(&name) {
                let kind = if kind == Kind::File {
                    FileKind::File
                } else {
                    FileKind::Directory
                };
                entries.push(DirEntry { ino, kind, name });
            }
        }
        let entries = Arc::new(entries);
        if trusted && !self.config.metadata_ttl.is_zero() {
            let until = Instant::now() + self.config.metadata_ttl;
            let mut listings = self.listings.lock().unwrap_or_else(|e| e.into_inner());
            listings.insert(dir.ino, (until, Arc::clone(&entries)));
        }
        drop(table);
        Ok(entries)
    }

    /// Lists `dir` whole while its lookups go on, so that the next ones find their entries in the table (after a
    /// storm of lookups that asked the bucket, and again before those entries expire while lookups go on).
    fn list_in_background(&self, dir: inode::Node) {
        let client = Arc::clone(&self.client);
        let inodes = Arc::clone(&self.inodes);
        let storms = Arc::clone(&self.storms);
        let ttl = self.config.metadata_ttl;
        tokio::spawn(async move {
            let asked = Instant::now();
            let listed =
                listing::list_all(client.as_ref(), &dir.key, Some(listing::STORM_MAX_PAGES)).await;
            let outcome = match listed {
                Ok(Some(found)) => {
                    let mut table = inodes.lock().unwrap_or_else(|e| e.into_inner());
                    // Still the same directory, and none of our changes there since the request.
                    if table.get(dir.ino).is_some_and(|d| d.key == dir.key)
                        && storms.unchanged_since(dir.ino, asked)
                    {
                        let expires = Instant::now() + ttl;
                        // About what it cost: a page holds 1,000 keys and prefixes.
                        let pages = u32::try_from(found.len() / 1000 + 1).unwrap_or(u32::MAX);
                        for (name, (kind, stat)) in found {
                            table.upsert(dir.ino, &name, kind, stat, expires, asked);
                        }
                        debug!(key = dir.key, pages, "listed after a storm of lookups");
                        listing::Listed::Applied { pages }
                    } else {
                        listing::Listed::NotApplied
                    }
                }
                Ok(None) => {
                    debug!(key = dir.key, "too big to list for a storm of lookups");
                    listing::Listed::TooBig
                }
                Err(e) => {
                    debug!(key = dir.key, error = %e, "listing for a storm of lookups failed");
                    listing::Listed::NotApplied
                }
            };
            storms.listing_done(dir.ino, outcome);
        });
    }

    /// Entries from index `offset` on (offsets are positions in this handle's snapshot).
    pub async fn readdir(&self, fh: u64, offset: u64) -> FsResult<Arc<Vec<DirEntry>>> {
        let handle = self.handle(fh)?;
        let Handle::Dir { entries, ino } = handle.as_ref() else {
            return Err(FsError::BadHandle);
        };
        if offset == 0 || entries.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
            let dir = self.dir_node(*ino)?;
            let listed = match self.cached_listing(*ino) {
                Some(cached) => cached,
                None => self.list_dir(&dir).await?,
            };
            *entries.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&listed));
            return Ok(listed);
        }
        Ok(entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_default())
    }

    /// A listing of `dir` made within the TTL whose entries are all still known.
    fn cached_listing(&self, dir: u64) -> Option<Arc<Vec<DirEntry>>> {
        let cached = {
            let listings = self.listings.lock().unwrap_or_else(|e| e.into_inner());
            let (until, entries) = listings.get(&dir)?;
            (*until > Instant::now()).then(|| Arc::clone(entries))?
        };
        let table = self.table();
        cached
            .iter()
            .all(|e| table.get(e.ino).is_some())
            .then_some(cached)
    }

    /// We are changing `dir` (mkdir, unlink, rmdir, rename): its cached listing is no longer true, and a
    /// background listing sent before the change ends must not be applied.
    fn changing(&self, dir: u64) -> listing::DirChange<'_> {
        self.invalidate_listing(dir);
        self.storms.changing(dir)
    }

    /// We changed `dir` (create, mkdir, unlink, rmdir, rename): its cached listing is no longer true.
    fn invalidate_listing(&self, dir: u64) {
        self.listings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&dir);
    }

    fn release_handle(&self, fh: u64) -> Option<Arc<Handle>> {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh)
    }

    pub async fn open(&self, ino: u64, mode: OpenMode, pid: u32) -> FsResult<Opened> {
        let node = self.table().get(ino).cloned().ok_or(FsError::NotFound)?;
        if node.kind == Kind::Directory {
            return Err(FsError::IsADirectory);
        }
        if node.writers > 0 {
            return Err(FsError::Busy(
                "the file is being written; open it after close",
            ));
        }
        if mode.write {
            if self.config.read_only {
                return Err(FsError::ReadOnly);
            }
            if node.local {
                return Err(FsError::Busy("the file is being written"));
            }
            let fh = self.open_existing_for_write(&node, mode, pid).await?;
            if let Some(n) = self.table().get_mut(ino) {
                n.cached_etag = None;
            }
            return Ok(Opened {
                fh,
                keep_cache: false,
                bypass_page_cache: self.writes_bypass_page_cache(),
                no_flush: false,
            });
        }
        // Refresh the ETag if our view is stale, so reads are pinned to what exists now.
        let attr_fresh = !mode.direct && node.is_fresh(Instant::now()) && node.stat.etag.is_some();
        let (size, etag) = if attr_fresh {
            (node.stat.size, node.stat.etag.clone().unwrap_or_default())
        } else {
            let asked = Instant::now();
            let info = self
                .client
                .head_object(&node.key)
                .await
                .map_err(|e| FsError::client(&node.key, e))?;
            let expires = self.expiry();
            if let Some(n) = self.table().get_mut(ino) {
                n.observe(Stat::of(&info), asked);
                n.expires = expires;
            }
            (info.size, info.etag)
        };
        let first = (!mode.direct)
            .then(|| self.first_bytes.take(&node.key, &etag))
            .flatten();
        let reader = Reader::new(
            if mode.direct {
                Arc::clone(&self.direct_client)
            } else {
                Arc::clone(&self.client)
            },
            node.key.clone(),
            etag.clone(),
            size,
            self.config.read_part_size,
            self.config.max_prefetch,
            Arc::clone(&self.config.memory),
        )
        .with_first_bytes(first);
        let bypass_page_cache = mode.direct
            || (size >= self.config.direct_io_threshold
                && self.direct_io_for_big_files.load(Ordering::Relaxed));
        let keep_cache = {
            let mut table = self.table();
            let node = table.get_mut(ino);
            // Kept only if the cache holds this version and no open handle pinned to another one can
            // still be adding its bytes.
            let same = node.as_ref().is_some_and(|n| {
                n.cached_etag.as_deref() == Some(etag.as_str())
                    && n.open_versions.iter().all(|v| *v == etag)
            });
            if let Some(n) = node {
                // What the kernel will hold after this open: this version's bytes, or nothing.
                n.cached_etag = (!bypass_page_cache).then(|| etag.clone());
                n.open_versions.push(etag.clone());
            }
            same && !bypass_page_cache
        };
        let fh = self.add_handle(Handle::Read {
            ino,
            etag,
            reader: AsyncMutex::new(reader),
        });
        Ok(Opened {
            fh,
            keep_cache,
            bypass_page_cache,
            no_flush: true,
        })
    }

    fn writer_options(&self, condition: WriteCondition) -> WriterOptions {
        WriterOptions {
            part_size: self.config.write_part_size as usize,
            condition,
            staging_dir: self.config.staging_dir.clone(),
            staging_limit: self.config.staging_limit,
            memory: Arc::clone(&self.config.memory),
        }
    }

    fn reserve_writer(&self) -> FsResult<()> {
        let n = self.writers.fetch_add(1, Ordering::SeqCst);
        if n as usize >= self.config.max_writers {
            self.writers.fetch_sub(1, Ordering::SeqCst);
            return Err(FsError::TooManyWriters(self.config.max_writers));
        }
        Ok(())
    }

    async fn open_existing_for_write(
        &self,
        node: &inode::Node,
        mode: OpenMode,
        pid: u32,
    ) -> FsResult<u64> {
        let writer = if mode.truncate {
            if !self.config.allow_overwrite {
                return Err(FsError::NotPermitted(
                    "overwriting an object needs --allow-overwrite",
                ));
            }
            Writer::new(
                Arc::clone(&self.client),
                node.key.clone(),
                self.writer_options(WriteCondition::None),
            )
        } else if self.config.incremental_upload && self.client.is_directory_bucket() {
            let info = self
                .client
                .head_object(&node.key)
                .await
                .map_err(|e| FsError::client(&node.key, e))?;
            Writer::append(
                Arc::clone(&self.client),
                node.key.clone(),
                info.size,
                self.writer_options(WriteCondition::None),
            )
        } else {
            return Err(FsError::NotPermitted(
                "existing objects can only be replaced (O_TRUNC with --allow-overwrite) or appended to (--incremental-upload on a directory bucket)",
            ));
        };
        self.reserve_writer()?;
        let size = writer.size();
        {
            let mut table = self.table();
            if let Some(n) = table.get_mut(node.ino) {
                n.writers += 1;
                n.stat.size = size;
            }
        }
        Ok(self.add_handle(Handle::Write {
            ino: node.ino,
            writer: AsyncMutex::new(writer),
            opener: tgid_of(pid),
            counted: true.into(),
        }))
    }

    /// Creates a new file, open for writing. Fails if the name exists (unless overwriting is allowed).
    pub async fn create(&self, parent: u64, name: &str, pid: u32) -> FsResult<(Attr, u64)> {
        if self.config.read_only {
            return Err(FsError::ReadOnly);
        }
        Self::check_name(name)?;
        let parent_node = self.dir_node(parent)?;
        if let Some(existing) = self.table().child(parent, name).cloned()
            && (existing.local || existing.writers > 0)
        {
            return Err(FsError::Exists);
        }
        let condition = match self.resolve(&parent_node, name, false).await? {
            Some((Kind::Directory, _)) => return Err(FsError::Exists),
            Some((Kind::File, _)) if !self.config.allow_overwrite => return Err(FsError::Exists),
            Some((Kind::File, _)) => WriteCondition::None,
            None if self.config.allow_overwrite => WriteCondition::None,
            None => WriteCondition::IfNoneMatch,
        };
        self.reserve_writer()?;
        let key = names::file_key(&parent_node.key, name);
        let writer = Writer::new(
            Arc::clone(&self.client),
            key,
            self.writer_options(condition),
        );
        let attr = {
            let mut table = self.table();
            let stat = Stat {
                size: 0,
                mtime: SystemTime::now(),
                etag: None,
            };
            let ino = table.upsert(
                parent,
                name,
                Kind::File,
                stat,
                self.expiry(),
                Instant::now(),
            );
            table.add_lookup(ino);
            let node = table.get_mut(ino).expect("just inserted");
            node.local = true;
            node.writers += 1;
            node.stat.size = 0;
            self.attr_of(node)
        };
        self.negative().remove(&(parent, name.to_string()));
        self.invalidate_listing(parent);
        let fh = self.add_handle(Handle::Write {
            ino: attr.ino,
            writer: AsyncMutex::new(writer),
            opener: tgid_of(pid),
            counted: true.into(),
        });
        Ok((attr, fh))
    }

    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Bytes> {
        let handle = self.handle(fh)?;
        match handle.as_ref() {
            Handle::Read { reader, .. } => reader.lock().await.read(offset, size).await,
            Handle::Write { .. } => Err(FsError::Busy(
                "reading a file while writing it is not supported",
            )),
            Handle::Dir { .. } => Err(FsError::IsADirectory),
        }
    }

    pub async fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let handle = self.handle(fh)?;
        let (ino, writer, counted) = handle.as_writer().ok_or(FsError::BadHandle)?;
        let mut w = writer.lock().await;
        let n = w.write(offset, data).await?;
        self.note_written(ino, counted, w.size());
        Ok(n)
    }

    /// A write that needs no waiting (the bytes only join the part being filled), done on the caller's
    /// thread with the caller's buffer: the FUSE adapter then need not copy the bytes to hand them to the
    /// runtime. `None` when the write must go through [`S3Filesystem::write`].
    pub fn write_now(&self, fh: u64, offset: u64, data: &[u8]) -> Option<u32> {
        let handle = self.handle(fh).ok()?;
        let (ino, writer, counted) = handle.as_writer()?;
        let mut w = writer.try_lock().ok()?;
        let n = w.write_in_memory(offset, data)?;
        self.note_written(ino, counted, w.size());
        Some(n)
    }

    fn note_written(&self, ino: u64, counted: &AtomicBool, size: u64) {
        if let Some(node) = self.table().get_mut(ino) {
            node.stat.size = size;
            node.stat.mtime = SystemTime::now();
            // Dirty again after an upload: the file is busy until its next upload.
            if !counted.swap(true, Ordering::SeqCst) {
                node.writers += 1;
            }
        }
    }

    /// fsync: everything written is durable in the bucket when this returns Ok.
    pub async fn fsync(&self, fh: u64) -> FsResult<()> {
        let handle = self.handle(fh)?;
        let Some((ino, writer, counted)) = handle.as_writer() else {
            return Ok(());
        };
        let mut w = writer.lock().await;
        let result = w.commit().await?;
        let mut table = self.table();
        let expires = self.expiry();
        if let Some(node) = table.get_mut(ino) {
            if let Some(put) = result {
                node.record_upload(w.size(), put.etag);
                node.expires = expires;
            }
            // Once everything written is uploaded, the file is no longer busy for readers, rename or unlink.
            if !w.is_dirty() && counted.swap(false, Ordering::SeqCst) {
                node.writers = node.writers.saturating_sub(1);
            }
        }
        Ok(())
    }

    /// close(2) of a descriptor. Uploads here (not at release) so close() reports the outcome; flushes
    /// from another process (an inherited copy closed after fork) are ignored.
    pub async fn flush(&self, fh: u64, pid: u32) -> FsResult<()> {
        let handle = self.handle(fh)?;
        if let Handle::Write {
            opener: Some(opener),
            ..
        } = handle.as_ref()
            && tgid_of(pid).is_some_and(|t| t != *opener)
        {
            debug!(
                fh,
                pid, "flush from another process: not a close of the writer"
            );
            return Ok(());
        }
        self.fsync(fh).await
    }

    pub async fn release(&self, fh: u64) -> FsResult<()> {
        let Some(handle) = self.release_handle(fh) else {
            return Ok(());
        };
        if let Handle::Read { ino, etag, .. } = handle.as_ref() {
            if let Some(node) = self.table().get_mut(*ino) {
                if let Some(at) = node.open_versions.iter().position(|v| v == etag) {
                    node.open_versions.swap_remove(at);
                }
                // This handle may have put its (older) version into the page cache.
                if node.cached_etag.as_deref() != Some(etag.as_str()) {
                    node.cached_etag = None;
                }
            }
            return Ok(());
        }
        let Some((ino, writer, counted)) = handle.as_writer() else {
            return Ok(());
        };
        let mut w = writer.lock().await;
        // The handle is gone: it no longer counts against --max-open-writers.
        self.writers.fetch_sub(1, Ordering::SeqCst);
        let result = w.commit().await;
        if result.is_err() {
            w.abort().await;
        }
        let mut table = self.table();
        if let Some(node) = table.get_mut(ino) {
            if counted.swap(false, Ordering::SeqCst) {
                node.writers = node.writers.saturating_sub(1);
            }
            if let Ok(Some(put)) = &result {
                node.record_upload(w.size(), put.etag.clone());
            }
            let parent = node.parent;
            if node.local && node.writers == 0 {
                // Never uploaded: the name goes away again.
                let name = node.name.clone();
                table.detach(parent, &name);
            }
            drop(table);
            self.invalidate_listing(parent);
        }
        result.map(|_| ())
    }

    pub async fn mkdir(&self, parent: u64, name: &str) -> FsResult<Attr> {
        let _changing = self.changing(parent);
        if self.config.read_only {
            return Err(FsError::ReadOnly);
        }
        Self::check_name(name)?;
        let parent_node = self.dir_node(parent)?;
        if self
            .table()
            .child(parent, name)
            .is_some_and(|n| n.local || n.writers > 0)
            || self.resolve(&parent_node, name, false).await?.is_some()
        {
            return Err(FsError::Exists);
        }
        let mut table = self.table();
        let ino = table.upsert(
            parent,
            name,
            Kind::Directory,
            Stat::directory(),
            self.expiry(),
            Instant::now(),
        );
        table.add_lookup(ino);
        let node = table.get_mut(ino).expect("just inserted");
        node.local = true;
        let attr = self.attr_of(node);
        drop(table);
        self.negative().remove(&(parent, name.to_string()));
        Ok(attr)
    }

    pub async fn rmdir(&self, parent: u64, name: &str) -> FsResult<()> {
        let _changing = self.changing(parent);
        if self.config.read_only {
            return Err(FsError::ReadOnly);
        }
        let node = self.table().child(parent, name).cloned();
        let parent_node = self.dir_node(parent)?;
        let prefix = match &node {
            Some(n) if n.kind != Kind::Directory => return Err(FsError::NotADirectory),
            Some(n) => n.key.clone(),
            None => names::dir_prefix(&parent_node.key, name),
        };
        if let Some(n) = &node
            && self.table().local_children(n.ino).iter().any(|_| true)
        {
            return Err(FsError::NotEmpty);
        }
        let page = self
            .client
            .list_objects(&prefix, Some("/"), None, 1)
            .await
            .map_err(|e| FsError::client(&prefix, e))?;
        if !page.objects.is_empty() || !page.common_prefixes.is_empty() {
            return Err(FsError::NotEmpty);
        }
        if node.is_none() {
            return Err(FsError::NotFound);
        }
        self.table().detach(parent, name);
        Ok(())
    }

    pub async fn unlink(&self, parent: u64, name: &str) -> FsResult<()> {
        let _changing = self.changing(parent);
        if self.config.read_only {
            return Err(FsError::ReadOnly);
        }
        if !self.config.allow_delete {
            return Err(FsError::NotPermitted(
                "deleting objects needs --allow-delete",
            ));
        }
        let parent_node = self.dir_node(parent)?;
        let existing = self.table().child(parent, name).cloned();
        let node = match existing {
            Some(n) => n,
            None => {
                self.lookup(parent, name).await?;
                let n = self
                    .table()
                    .child(parent, name)
                    .cloned()
                    .ok_or(FsError::NotFound)?;
                self.table().forget(n.ino, 1);
                n
            }
        };
        if node.kind == Kind::Directory {
            return Err(FsError::IsADirectory);
        }
        if node.writers > 0 || node.local {
            return Err(FsError::Busy("the file is being written"));
        }
        let key = names::file_key(&parent_node.key, name);
        self.client
            .delete_object(&key)
            .await
            .map_err(|e| FsError::client(&key, e))?;
        debug!(key, "deleted");
        self.table().detach(parent, name);
        Ok(())
    }

    /// rename(2): files on directory buckets use RenameObject (atomic). Anything else is EXDEV, so `mv`
    /// falls back to copy and delete.
    pub async fn rename(
        &self,
        parent: u64,
        name: &str,
        new_parent: u64,
        new_name: &str,
        no_replace: bool,
    ) -> FsResult<()> {
        let _changing_from = self.changing(parent);
        let _changing_to = self.changing(new_parent);
        if self.config.read_only {
            return Err(FsError::ReadOnly);
        }
        Self::check_name(new_name)?;
        let from_dir = self.dir_node(parent)?;
        let to_dir = self.dir_node(new_parent)?;
        if !self.client.is_directory_bucket() {
            return Err(FsError::CrossDevice(
                "rename needs RenameObject, which only directory buckets have",
            ));
        }
        let existing = self.table().child(parent, name).cloned();
        let node = match existing {
            Some(n) => n,
            None => match self.resolve(&from_dir, name, false).await? {
                Some((Kind::File, _)) => inode::Node {
                    ino: 0,
                    parent,
                    name: name.into(),
                    kind: Kind::File,
                    key: names::file_key(&from_dir.key, name),
                    stat: Stat::directory(),
                    stat_at: Instant::now(),
                    expires: Instant::now(),
                    lookups: 0,
                    local: false,
                    writers: 0,
                    cached_etag: None,
                    open_versions: Vec::new(),
                },
                Some((Kind::Directory, _)) => {
                    return Err(FsError::CrossDevice(
                        "directories cannot be renamed atomically",
                    ));
                }
                None => return Err(FsError::NotFound),
            },
        };
        if node.kind == Kind::Directory {
            return Err(FsError::CrossDevice(
                "directories cannot be renamed atomically",
            ));
        }
        if node.writers > 0 || node.local {
            return Err(FsError::Busy("the file is being written"));
        }
        let destination = names::file_key(&to_dir.key, new_name);
        let target = self.resolve(&to_dir, new_name, false).await?;
        let condition = match target {
            Some((Kind::Directory, _)) => return Err(FsError::IsADirectory),
            Some((Kind::File, _)) if no_replace => return Err(FsError::Exists),
            Some((Kind::File, _)) if !self.config.allow_overwrite => {
                return Err(FsError::NotPermitted(
                    "replacing an object needs --allow-overwrite",
                ));
            }
            _ if no_replace || !self.config.allow_overwrite => WriteCondition::IfNoneMatch,
            _ => WriteCondition::None,
        };
        self.client
            .rename_object(&node.key, &destination, condition)
            .await
            .map_err(|e| match FsError::client(&destination, e) {
                FsError::ObjectChanged { .. } => FsError::Exists,
                other => other,
            })?;
        let mut table = self.table();
        if node.ino != 0 {
            table.rename(parent, name, new_parent, new_name);
            if let Some(n) = table.get_mut(node.ino) {
                n.expires = Instant::now();
            }
        } else {
            table.detach(new_parent, new_name);
        }
        drop(table);
        self.negative().remove(&(new_parent, new_name.to_string()));
        Ok(())
    }

    /// (open handles, open writers, known inodes), for metrics and the periodic summary.
    pub fn usage(&self) -> (usize, u64, usize) {
        let handles = self.handles.lock().unwrap_or_else(|e| e.into_inner()).len();
        (
            handles,
            self.writers.load(Ordering::Relaxed),
            self.table().len(),
        )
    }

    /// Node-count and capacity figures for statfs: an object store has no fixed size.
    pub fn statfs(&self) -> (u64, u64) {
        let nodes = self.table().len() as u64;
        (1 << 40, nodes)
    }
}

/// Thread group (process) id of a thread id, as FUSE reports the calling thread.
fn tgid_of(pid: u32) -> Option<u32> {
    if pid == 0 {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::fake::{FakeClient, Op};

    async fn fs_with(
        keys: &[(&str, &[u8])],
        config: FsConfig,
        directory: bool,
    ) -> (Arc<FakeClient>, S3Filesystem) {
        let fake = Arc::new(FakeClient::new("b", directory));
        for (k, v) in keys {
            fake.put_object(k, Bytes::copy_from_slice(v), WriteCondition::None)
                .await
                .unwrap();
        }
        let client: Arc<dyn ObjectClient> = fake.clone();
        (fake, S3Filesystem::new(client, config))
    }

    fn config() -> FsConfig {
        FsConfig::new(1000, 1000)
    }

    #[tokio::test]
    async fn open_and_read_after_a_lookup_need_no_request() {
        let (fake, fs) = fs_with(&[("img.jpg", &[7u8; 5000])], config(), true).await;
        let attr = fs.lookup(ROOT_INO, "img.jpg").await.unwrap();
        let read_mode = OpenMode {
            read: true,
            ..Default::default()
        };
        let before = fake.counts();
        let opened = fs.open(attr.ino, read_mode, 1).await.unwrap();
        assert!(!opened.keep_cache, "nothing cached yet");
        assert_eq!(
            &fs.read(opened.fh, 0, 8192).await.unwrap()[..],
            &[7u8; 5000][..]
        );
        assert_eq!(fake.counts(), before);
        // The bytes were handed over once: a second open reads from the bucket.
        let opened = fs.open(attr.ino, read_mode, 1).await.unwrap();
        assert!(opened.keep_cache, "same version: the page cache is kept");
        assert_eq!(
            &fs.read(opened.fh, 0, 8192).await.unwrap()[..],
            &[7u8; 5000][..]
        );
        assert!(fake.counts().since(&before).get(Op::Get) > 0);
    }

    #[tokio::test]
    async fn writes_bypass_the_page_cache_where_the_kernel_can_still_mmap() {
        let mut c = config();
        c.allow_overwrite = true;
        let (_, fs) = fs_with(&[("old", b"v")], c, true).await;
        let trunc = OpenMode {
            write: true,
            truncate: true,
            ..Default::default()
        };
        let old = fs.lookup(ROOT_INO, "old").await.unwrap().ino;
        let opened = fs.open(old, trunc, 1).await.unwrap();
        assert!(opened.bypass_page_cache && !opened.keep_cache);
        fs.release(opened.fh).await.unwrap();
        assert!(fs.writes_bypass_page_cache());
        fs.keep_big_files_in_page_cache();
        assert!(!fs.writes_bypass_page_cache());
        let opened = fs.open(old, trunc, 1).await.unwrap();
        assert!(!opened.bypass_page_cache);
    }

    #[tokio::test]
    async fn big_files_bypass_the_page_cache() {
        let mut config = config();
        config.direct_io_threshold = 4096;
        let (_, fs) = fs_with(
            &[("small", &[1u8; 100]), ("big", &[2u8; 4096])],
            config,
            true,
        )
        .await;
        let read_mode = OpenMode {
            read: true,
            ..Default::default()
        };
        for (name, bypass) in [("small", false), ("big", true)] {
            let attr = fs.lookup(ROOT_INO, name).await.unwrap();
            let first = fs.open(attr.ino, read_mode, 1).await.unwrap();
            let again = fs.open(attr.ino, read_mode, 1).await.unwrap();
            assert_eq!(first.bypass_page_cache, bypass, "{name}");
            // Nothing of a bypassed file is in the page cache to keep.
            assert_eq!(again.keep_cache, !bypass, "{name}");
        }
        // A kernel that cannot mmap direct-I/O files: big files use the page cache, O_DIRECT still not.
        fs.keep_big_files_in_page_cache();
        let big = fs.lookup(ROOT_INO, "big").await.unwrap().ino;
        assert!(!fs.open(big, read_mode, 1).await.unwrap().bypass_page_cache);
        let direct = OpenMode {
            direct: true,
            ..read_mode
        };
        assert!(fs.open(big, direct, 1).await.unwrap().bypass_page_cache);
    }

    #[tokio::test]
    async fn a_handle_on_an_older_version_stops_the_page_cache_from_being_kept() {
        let mut config = config();
        config.metadata_ttl = Duration::ZERO;
        let (fake, fs) = fs_with(&[("f", b"one")], config, true).await;
        let ino = fs.lookup(ROOT_INO, "f").await.unwrap().ino;
        let read_mode = OpenMode {
            read: true,
            ..Default::default()
        };
        let old = fs.open(ino, read_mode, 1).await.unwrap();
        fake.put_object("f", Bytes::from_static(b"two"), WriteCondition::None)
            .await
            .unwrap();
        let new = fs.open(ino, read_mode, 1).await.unwrap();
        assert!(!new.keep_cache, "another version");
        // Same version, but the handle on the old one may still be filling the page cache.
        assert!(!fs.open(ino, read_mode, 1).await.unwrap().keep_cache);
        fs.release(old.fh).await.unwrap();
        assert!(
            !fs.open(ino, read_mode, 1).await.unwrap().keep_cache,
            "what the old handle read may still be cached"
        );
        assert!(fs.open(ino, read_mode, 1).await.unwrap().keep_cache);
        assert_eq!(&fs.read(new.fh, 0, 10).await.unwrap()[..], b"two");
    }

    #[tokio::test]
    async fn lookup_prefers_directories_and_lists_without_duplicates() {
        let (_, fs) = fs_with(
            &[
                ("a", b"file"),
                ("a/x", b"1"),
                ("b", b"22"),
                ("c//d", b"bad"),
                ("dir/", b""),
            ],
            config(),
            true,
        )
        .await;
        let a = fs.lookup(ROOT_INO, "a").await.unwrap();
        assert_eq!(a.kind, FileKind::Directory);
        let b = fs.lookup(ROOT_INO, "b").await.unwrap();
        assert_eq!((b.kind, b.size), (FileKind::File, 2));
        assert!(matches!(
            fs.lookup(ROOT_INO, "nope").await,
            Err(FsError::NotFound)
        ));
        let fh = fs.opendir(ROOT_INO).unwrap();
        let mut names: Vec<String> = fs
            .readdir(fh, 0)
            .await
            .unwrap()
            .iter()
            .map(|e| e.name.clone())
            .collect();
        names.sort();
        assert_eq!(names, vec![".", "..", "a", "b", "c", "dir"]);
        let c = fs.lookup(ROOT_INO, "c").await.unwrap();
        let fh = fs.opendir(c.ino).unwrap();
        let inside: Vec<String> = fs
            .readdir(fh, 0)
            .await
            .unwrap()
            .iter()
            .map(|e| e.name.clone())
            .collect();
        assert_eq!(inside, vec![".", ".."], "empty path component hidden");
    }

    #[tokio::test]
    async fn create_write_close_then_read_back() {
        let (fake, fs) = fs_with(&[], config(), true).await;
        let (attr, fh) = fs.create(ROOT_INO, "new.bin", 0).await.unwrap();
        fs.write(fh, 0, b"hello ").await.unwrap();
        fs.write(fh, 6, b"world").await.unwrap();
        assert_eq!(fs.getattr(attr.ino).await.unwrap().size, 11);
        fs.flush(fh, 0).await.unwrap();
        fs.release(fh).await.unwrap();
        assert_eq!(&fake.object("new.bin").unwrap()[..], b"hello world");
        let rh = fs
            .open(
                attr.ino,
                OpenMode {
                    read: true,
                    ..Default::default()
                },
                0,
            )
            .await
            .unwrap()
            .fh;
        assert_eq!(&fs.read(rh, 0, 100).await.unwrap()[..], b"hello world");
    }

    /// A readdir whose listing was answered before our unlink finished must not bring the file back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lookups_of_one_name_at_once_send_one_pair_of_requests() {
        let (fake, fs) = fs_with(&[("d/a.jpg", b"x")], config(), true).await;
        let fs = Arc::new(fs);
        let gate = fake.faults().hold(Op::List);
        let before = fake.counts();
        let lookup = |name: &'static str| {
            let fs = Arc::clone(&fs);
            tokio::spawn(async move { fs.lookup(ROOT_INO, name).await })
        };
        let first = lookup("d");
        // The first has sent its GET and its LIST (held at the gate); the others join while it waits.
        while fake.counts().since(&before).total() < 2 {
            tokio::task::yield_now().await;
        }
        let others: Vec<_> = (0..7).map(|_| lookup("d")).collect();
        let missing: Vec<_> = (0..3).map(|_| lookup("nothing")).collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        gate.open();
        let ino = first.await.unwrap().unwrap().ino;
        for other in others {
            assert_eq!(other.await.unwrap().unwrap().ino, ino);
        }
        for m in missing {
            assert!(matches!(m.await.unwrap(), Err(FsError::NotFound)));
        }
        // One pair for "d" and one for "nothing"; each lookup on its own would have sent a pair: 20.
        let sent = fake.counts().since(&before);
        assert_eq!(
            (sent.get(Op::Head), sent.get(Op::List), sent.total()),
            (2, 2, 4)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listing_from_before_an_unlink_does_not_bring_the_file_back() {
        let mut c = config();
        c.allow_delete = true;
        let files: [(&str, &[u8]); 2] = [("d/gone", b"1"), ("d/kept", b"2")];
        let (fake, fs) = fs_with(&files, c, true).await;
        let fs = Arc::new(fs);
        let dir = fs.lookup(ROOT_INO, "d").await.unwrap().ino;
        fs.lookup(dir, "gone").await.unwrap();
        let gate = fake.faults().hold(Op::List);
        let fh = fs.opendir(dir).unwrap();
        let listing = tokio::spawn({
            let fs = Arc::clone(&fs);
            async move { fs.readdir(fh, 0).await }
        });
        // The listing has read the bucket (both files) and waits; the unlink now completes.
        while gate.held() == 0 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        fs.unlink(dir, "gone").await.unwrap();
        gate.open();
        let names: Vec<String> = listing
            .await
            .unwrap()
            .unwrap()
            .iter()
            .map(|e| e.name.clone())
            .collect();
        assert!(names.contains(&"kept".to_string()), "{names:?}");
        assert!(!names.contains(&"gone".to_string()), "{names:?}");
        assert!(matches!(
            fs.lookup(dir, "gone").await,
            Err(FsError::NotFound)
        ));
    }

    /// While our change in a directory outlasts every listing of a readdir, the listing adds no names the
    /// table does not have (they could be ones we just removed); once it ends, everything is listed.
    #[tokio::test]
    async fn a_directory_that_keeps_changing_lists_only_names_already_known() {
        let files: [(&str, &[u8]); 2] = [("d/known", b"1"), ("d/unseen", b"2")];
        let (fake, fs) = fs_with(&files, config(), true).await;
        let dir = fs.lookup(ROOT_INO, "d").await.unwrap().ino;
        fs.lookup(dir, "known").await.unwrap();
        let names = |entries: Arc<Vec<DirEntry>>| -> Vec<String> {
            let mut v: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
            v.sort();
            v
        };
        let change = fs.storms.changing(dir);
        let before = fake.counts();
        let fh = fs.opendir(dir).unwrap();
        let listed = names(fs.readdir(fh, 0).await.unwrap());
        assert_eq!(listed, [".", "..", "known"]);
        let sent = fake.counts().since(&before);
        assert_eq!(
            (sent.get(Op::List), sent.total()),
            (u64::from(LIST_ATTEMPTS), u64::from(LIST_ATTEMPTS)),
            "each attempt lists once"
        );
        drop(change);
        let fh = fs.opendir(dir).unwrap();
        let listed = names(fs.readdir(fh, 0).await.unwrap());
        assert_eq!(listed, [".", "..", "known", "unseen"]);
    }

    #[tokio::test]
    async fn overwrite_and_delete_need_their_flags() {
        let (_, fs) = fs_with(&[("k", b"v")], config(), true).await;
        assert!(matches!(
            fs.create(ROOT_INO, "k", 0).await,
            Err(FsError::Exists)
        ));
        let a = fs.lookup(ROOT_INO, "k").await.unwrap();
        let trunc = OpenMode {
            write: true,
            truncate: true,
            ..Default::default()
        };
        assert!(matches!(
            fs.open(a.ino, trunc, 0).await,
            Err(FsError::NotPermitted(_))
        ));
        assert!(matches!(
            fs.unlink(ROOT_INO, "k").await,
            Err(FsError::NotPermitted(_))
        ));

        let mut c = config();
        c.allow_overwrite = true;
        c.allow_delete = true;
        let (fake, fs) = fs_with(&[("k", b"v")], c, true).await;
        let a = fs.lookup(ROOT_INO, "k").await.unwrap();
        let fh = fs.open(a.ino, trunc, 0).await.unwrap().fh;
        fs.write(fh, 0, b"new").await.unwrap();
        fs.release(fh).await.unwrap();
        assert_eq!(&fake.object("k").unwrap()[..], b"new");
        fs.unlink(ROOT_INO, "k").await.unwrap();
        assert!(fake.object("k").is_none());
    }

    #[tokio::test]
    async fn rename_is_atomic_on_directory_buckets_and_exdev_elsewhere() {
        let (fake, fs) = fs_with(&[("a", b"1"), ("d/x", b"2")], config(), true).await;
        let d = fs.lookup(ROOT_INO, "d").await.unwrap();
        fs.rename(ROOT_INO, "a", d.ino, "b", false).await.unwrap();
        assert_eq!(&fake.object("d/b").unwrap()[..], b"1");
        assert!(fake.object("a").is_none());
        assert!(matches!(
            fs.rename(d.ino, "b", d.ino, "x", false).await,
            Err(FsError::NotPermitted(_))
        ));
        let (_, general) = fs_with(&[("a", b"1")], config(), false).await;
        assert!(matches!(
            general.rename(ROOT_INO, "a", ROOT_INO, "b", false).await,
            Err(FsError::CrossDevice(_))
        ));
    }

    #[tokio::test]
    async fn mkdir_rmdir_and_read_only() {
        let (_, fs) = fs_with(&[("full/x", b"1")], config(), true).await;
        let m = fs.mkdir(ROOT_INO, "m").await.unwrap();
        assert_eq!(fs.lookup(ROOT_INO, "m").await.unwrap().ino, m.ino);
        fs.rmdir(ROOT_INO, "m").await.unwrap();
        fs.lookup(ROOT_INO, "full").await.unwrap();
        assert!(matches!(
            fs.rmdir(ROOT_INO, "full").await,
            Err(FsError::NotEmpty)
        ));
        let mut c = config();
        c.read_only = true;
        let (_, ro) = fs_with(&[], c, true).await;
        assert!(matches!(
            ro.create(ROOT_INO, "x", 0).await,
            Err(FsError::ReadOnly)
        ));
        assert!(matches!(
            ro.mkdir(ROOT_INO, "x").await,
            Err(FsError::ReadOnly)
        ));
    }
}
