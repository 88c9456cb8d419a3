//! Local disk block cache. Blocks are files named by a hash of (bucket, key, ETag, block index, block size),
//! so a changed object can never be served from old blocks. Each file starts with a header naming exactly
//! those values plus the data length and a CRC32C of the data, checked on every read: a torn or corrupted
//! block is discarded (and refetched by the caller), never returned. LRU eviction keeps the total under a
//! byte limit and the disk at least 5% free. The cache survives remounts: existing files are indexed at start.

use std::fs::{self, File};
use std::io::{IoSlice, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use lru::LruCache;
use sha2::{Digest, Sha256};
use tracing::{debug, warn};

const MAGIC: &[u8; 8] = b"XFSBLK01";

/// What one block is: every field goes into its name and its header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockId<'a> {
    pub bucket: &'a str,
    pub key: &'a str,
    pub etag: &'a str,
    pub index: u64,
    pub block_size: u64,
}

impl BlockId<'_> {
    fn header(&self) -> Vec<u8> {
        format!(
            "{}\0{}\0{}\0{}\0{}",
            self.bucket, self.key, self.etag, self.index, self.block_size
        )
        .into_bytes()
    }

    fn file_name(&self) -> String {
        hex::encode(Sha256::digest(self.header()))
    }
}

#[derive(Debug, Default)]
pub struct CacheCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub hit_bytes: AtomicU64,
    pub corrupt: AtomicU64,
    pub errors: AtomicU64,
    pub evictions: AtomicU64,
    pub writes: AtomicU64,
}

impl CacheCounters {
    pub fn summary(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "hits={} misses={} hit_bytes={} writes={} evictions={} corrupt={} errors={}",
            g(&self.hits),
            g(&self.misses),
            g(&self.hit_bytes),
            g(&self.writes),
            g(&self.evictions),
            g(&self.corrupt),
            g(&self.errors)
        )
    }
}

/// File name -> size on disk, least recently used first out, and their total. One lock covers both, so
/// the total cannot drift from the entries (it once did: a block evicted between another thread's insert
/// and its addition to a separate counter took the counter below zero).
struct BlockIndex {
    blocks: LruCache<String, u64>,
    used: u64,
}

impl BlockIndex {
    fn new() -> BlockIndex {
        BlockIndex {
            blocks: LruCache::unbounded(),
            used: 0,
        }
    }

    fn insert(&mut self, name: String, size: u64) {
        if let Some(old) = self.blocks.put(name, size) {
            self.used -= old;
        }
        self.used += size;
    }

    /// Whether the block is indexed; marks it recently used.
    fn touch(&mut self, name: &str) -> bool {
        self.blocks.get(name).is_some()
    }

    fn remove(&mut self, name: &str) {
        if let Some(size) = self.blocks.pop(name) {
            self.used -= size;
        }
    }

    fn pop_oldest(&mut self) -> Option<String> {
        let (name, size) = self.blocks.pop_lru()?;
        self.used -= size;
        Some(name)
    }

    /// Evicts until `incoming` more bytes fit under `limit`, and counts them at once, before they are
    /// written: writes at once must not each count the same free room (two did, and a cache limited to 8 MiB
    /// held 808 bytes more). Returns the evicted names, and whether the bytes fit: they do not when what
    /// other writes counted and have not written yet leaves no room.
    fn reserve(&mut self, incoming: u64, limit: u64) -> (Vec<String>, bool) {
        let mut evicted = Vec::new();
        while self.used + incoming > limit {
            match self.pop_oldest() {
                Some(name) => evicted.push(name),
                None => return (evicted, false),
            }
        }
        self.used += incoming;
        (evicted, true)
    }

    /// Indexes a block whose size [`BlockIndex::reserve`] counted already.
    fn insert_reserved(&mut self, name: String, size: u64) {
        if let Some(old) = self.blocks.put(name, size) {
            self.used -= old;
        }
    }

    /// Gives back what [`BlockIndex::reserve`] counted for a write that failed.
    fn unreserve(&mut self, size: u64) {
        self.used -= size;
    }
}

pub struct DiskCache {
    dir: PathBuf,
    max_bytes: u64,
    index: Mutex<BlockIndex>,
    pub counters: CacheCounters,
    warned: std::sync::atomic::AtomicBool,
    keep_disk_free: bool,
}

/// How old a temporary block file of a process that is gone must be before it is removed.
const TEMP_FILE_STALE: std::time::Duration = std::time::Duration::from_secs(60);

/// The process that was writing temporary block file `name` (`.tmp-<block>-<pid>-<n>`), if it is one.
fn writer_of_temp_file(name: &str) -> Option<i32> {
    let rest = name.strip_prefix(".tmp-")?;
    let mut fields = rest.rsplitn(3, '-');
    let _serial = fields.next()?;
    fields.next()?.parse().ok()
}

fn process_runs(pid: i32) -> bool {
    // Signal 0 checks only that the process exists (EPERM: it does, as another user's).
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

impl DiskCache {
    /// Opens (or creates, mode 0700) the cache directory and indexes blocks left by earlier mounts.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<DiskCache> {
        DiskCache::open_with(dir, max_bytes, true)
    }

    /// `keep_disk_free`: also evict while the disk has less than 5% free (off only in unit tests, which must
    /// not depend on how full the host's disk is).
    pub fn open_with(
        dir: &Path,
        max_bytes: u64,
        keep_disk_free: bool,
    ) -> std::io::Result<DiskCache> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mut existing: Vec<(std::time::SystemTime, String, u64)> = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.len() != 64 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
                // A block being written by a daemon that died (SIGKILL, OOM) before it could rename it: in no
                // index, so never counted nor evicted. Removed, unless its writer is still running (a mount
                // sharing the directory).
                // (A minute old at least: a mount in another pid namespace may be writing one whose pid
                // means nothing here, and a block takes far less than that to write.)
                let stale = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > TEMP_FILE_STALE));
                if let Some(pid) = writer_of_temp_file(&name)
                    && stale
                    && !process_runs(pid)
                {
                    let _ = fs::remove_file(entry.path());
                }
                continue;
            }
            let meta = entry.metadata()?;
            existing.push((
                meta.modified().unwrap_or(std::time::UNIX_EPOCH),
                name,
                meta.len(),
            ));
        }
        existing.sort();
        let mut index = BlockIndex::new();
        for (_, name, len) in existing {
            index.insert(name, len);
        }
        let cache = DiskCache {
            dir: dir.to_path_buf(),
            max_bytes,
            index: Mutex::new(index),
            counters: CacheCounters::default(),
            warned: false.into(),
            keep_disk_free,
        };
        cache.make_room(0);
        Ok(cache)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Whether the block is indexed (no file I/O, not counted, the LRU order unchanged): lets a reader skip
    /// the hand-off to a blocking thread when nothing of a range is cached.
    pub fn holds(&self, id: &BlockId<'_>) -> bool {
        self.index().blocks.contains(&id.file_name())
    }

    /// The block's data if it is cached and intact. Blocking (file I/O): call from a blocking thread.
    pub fn get(&self, id: &BlockId<'_>) -> Option<Bytes> {
        let name = id.file_name();
        let known = self.index().touch(&name);
        if !known {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        match self.read_block(&name, id) {
            Ok(data) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .hit_bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                Some(data)
            }
            Err(why) => {
                self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                warn!(
                    key = id.key,
                    block = id.index,
                    why,
                    "discarding corrupt cache block"
                );
                self.remove(&name);
                None
            }
        }
    }

    fn read_block(&self, name: &str, id: &BlockId<'_>) -> Result<Bytes, String> {
        // fs::read sizes its buffer from the file's length: one allocation, no growing copies.
        let raw = fs::read(self.path(name)).map_err(|e| e.to_string())?;
        let header = id.header();
        let fixed = MAGIC.len() + 4;
        if raw.len() < fixed || &raw[..MAGIC.len()] != MAGIC {
            return Err("bad magic".into());
        }
        let header_len = u32::from_le_bytes(raw[8..12].try_into().unwrap()) as usize;
        let data_at = fixed + header_len + 12;
        if raw.len() < data_at || raw[fixed..fixed + header_len] != header[..] {
            return Err("header names another block".into());
        }
        let meta = &raw[fixed + header_len..data_at];
        let len = u64::from_le_bytes(meta[..8].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(meta[8..12].try_into().unwrap());
        let raw = Bytes::from(raw);
        let data = raw.slice(data_at..);
        if data.len() != len {
            return Err(format!("length {} but header says {len}", data.len()));
        }
        if crc32c::crc32c(&data) != crc {
            return Err("checksum mismatch".into());
        }
        // Hand out the file's buffer itself: no second copy on every cache hit.
        Ok(data)
    }

    /// Stores a block (write to a temporary file, then rename, so readers never see half a block).
    /// Blocking; failures are counted and logged once, never surfaced to readers.
    pub fn put(&self, id: &BlockId<'_>, data: &[u8]) {
        let name = id.file_name();
        let header = id.header();
        let mut head = Vec::with_capacity(header.len() + 24);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&(header.len() as u32).to_le_bytes());
        head.extend_from_slice(&header);
        head.extend_from_slice(&(data.len() as u64).to_le_bytes());
        head.extend_from_slice(&crc32c::crc32c(data).to_le_bytes());
        let size = (head.len() + data.len()) as u64;
        if size > self.max_bytes || !self.make_room(size) {
            return;
        }
        // Unique per write: two writes of one block at once (a read's and a warm-up's) must not share a file.
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let n = WRITES.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!(".tmp-{name}-{}-{n}", std::process::id()));
        let result = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| write_both(&mut f, &head, data))
            .and_then(|_| fs::rename(&tmp, self.path(&name)));
        match result {
            Ok(()) => {
                self.counters.writes.fetch_add(1, Ordering::Relaxed);
                self.index().insert_reserved(name, size);
            }
            Err(e) => {
                self.index().unreserve(size);
                let _ = fs::remove_file(&tmp);
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                if !self.warned.swap(true, Ordering::Relaxed) {
                    warn!(dir = %self.dir.display(), error = %e, "cache write failed; reads continue from the bucket");
                }
            }
        }
    }

    fn remove(&self, name: &str) {
        self.index().remove(name);
        let _ = fs::remove_file(self.path(name));
    }

    /// Evicts least-recently-used blocks until `incoming` more bytes fit under the limit (and counts them:
    /// the caller writes them or gives them back) and the disk keeps 5% free. False when they do not fit.
    fn make_room(&self, incoming: u64) -> bool {
        let (evicted, fits) = self.index().reserve(incoming, self.max_bytes);
        for name in evicted {
            self.remove_evicted(&name);
        }
        while self.disk_nearly_full() {
            let Some(name) = self.index().pop_oldest() else {
                break;
            };
            self.remove_evicted(&name);
        }
        fits
    }

    fn remove_evicted(&self, name: &str) {
        let _ = fs::remove_file(self.path(name));
        self.counters.evictions.fetch_add(1, Ordering::Relaxed);
        debug!(name, "evicted cache block");
    }

    fn disk_nearly_full(&self) -> bool {
        if !self.keep_disk_free {
            return false;
        }
        match nix::sys::statvfs::statvfs(&self.dir) {
            Ok(s) => s.blocks_available() < s.blocks() / 20,
            Err(_) => false,
        }
    }

    pub fn used_bytes(&self) -> u64 {
        self.index().used
    }

    fn index(&self) -> std::sync::MutexGuard<'_, BlockIndex> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Writes `head` then `data`, gathered by the kernel: the block is not first joined into one buffer (a copy
/// and an allocation per block, a good part of a warm-up's CPU).
fn write_both(file: &mut File, mut head: &[u8], mut data: &[u8]) -> std::io::Result<()> {
    while !head.is_empty() || !data.is_empty() {
        let n = match file.write_vectored(&[IoSlice::new(head), IoSlice::new(data)]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let from_head = n.min(head.len());
        head = &head[from_head..];
        data = &data[n - from_head..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(index: u64) -> BlockId<'static> {
        BlockId {
            bucket: "b",
            key: "k",
            etag: "\"e\"",
            index,
            block_size: 4,
        }
    }

    #[test]
    fn writes_at_once_cannot_count_the_same_room() {
        let mut index = BlockIndex::new();
        index.insert("old".into(), 150);
        // Two writes of 200 under a limit of 300, neither written yet: the first evicts "old" and counts its
        // bytes; the second finds no room left, as the first one's bytes are counted already.
        let (evicted, fits) = index.reserve(200, 300);
        assert_eq!((evicted, fits), (vec!["old".to_string()], true));
        let (evicted, fits) = index.reserve(200, 300);
        assert!(evicted.is_empty() && !fits, "both counted the same room");
        assert_eq!(index.used, 200);
        index.insert_reserved("a".into(), 200);
        assert_eq!(index.used, 200, "counted once");
        let (_, fits) = index.reserve(100, 300);
        assert!(fits);
        index.unreserve(100);
        assert_eq!(index.used, 200, "a failed write gives its bytes back");
    }

    /// A block left half written by a daemon that died is removed when the cache opens; one a running
    /// process is writing stays.
    #[test]
    fn temporary_files_of_dead_writers_are_removed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let block = "a".repeat(64);
        // Pid 0x7fff_fff0 is above pid_max (at most 2^22): no process has it.
        let dead = dir.path().join(format!(".tmp-{block}-{}-0", 0x7fff_fff0));
        let alive = dir
            .path()
            .join(format!(".tmp-{block}-{}-1", std::process::id()));
        let young = dir.path().join(format!(".tmp-{block}-{}-2", 0x7fff_fff0));
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
        for path in [&dead, &alive, &young] {
            std::fs::write(path, vec![0u8; 4096]).unwrap();
        }
        for path in [&dead, &alive] {
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        let _cache = DiskCache::open_with(dir.path(), 1 << 20, false).unwrap();
        assert!(!dead.exists(), "a dead writer's file stayed");
        assert!(alive.exists(), "a running writer's file went");
        assert!(young.exists(), "a file too young to be stale went");
    }

    #[test]
    fn round_trip_corruption_and_eviction() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open_with(dir.path(), 300, false).unwrap();
        assert!(cache.get(&id(0)).is_none());
        cache.put(&id(0), b"abcd");
        assert_eq!(&cache.get(&id(0)).unwrap()[..], b"abcd");
        // Another ETag is another block.
        assert!(
            cache
                .get(&BlockId {
                    etag: "\"f\"",
                    ..id(0)
                })
                .is_none()
        );
        // Flip a data byte: discarded, not returned.
        let path = dir.path().join(id(0).file_name());
        let mut raw = fs::read(&path).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        fs::write(&path, raw).unwrap();
        assert!(cache.get(&id(0)).is_none());
        assert_eq!(cache.counters.corrupt.load(Ordering::Relaxed), 1);
        // Each block file is ~30 bytes of header plus data; the limit keeps only the most recent ones.
        for i in 0..40 {
            cache.put(&id(i), b"wxyz");
        }
        assert!(cache.used_bytes() <= 300);
        assert!(cache.get(&id(39)).is_some());
        assert!(cache.get(&id(0)).is_none());
        assert!(cache.counters.evictions.load(Ordering::Relaxed) > 0);
        // A new instance over the same directory finds the blocks again.
        drop(cache);
        let again = DiskCache::open_with(dir.path(), 300, false).unwrap();
        assert_eq!(&again.get(&id(39)).unwrap()[..], b"wxyz");
    }
}
