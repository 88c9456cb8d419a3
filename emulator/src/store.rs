//! Buckets, objects, multipart uploads and sessions. Object bytes live in files under the data directory
//! ([`Blob`]s); only metadata is held in memory. A write lands in a fresh file and is swapped in under the
//! lock; readers hold the blobs they started on, so they keep reading consistent (old) bytes, as with S3.
//! An object is a list of blobs: a completed multipart upload keeps its parts and an append adds one, so
//! neither copies bytes the service would not copy.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Instant, SystemTime};

use bytes::Bytes;

use crate::error::S3Error;

/// `name--azid--x-s3`: the directory-bucket naming scheme.
pub fn is_directory_bucket_name(name: &str) -> bool {
    name.ends_with("--x-s3") && name.matches("--").count() >= 2
}

/// S3's bucket naming rules (plus the directory-bucket suffix rule).
pub fn validate_bucket_name(name: &str) -> Result<(), String> {
    if name.len() < 3 || name.len() > 63 {
        return Err("bucket names must be 3 to 63 characters long".into());
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return Err("bucket names may contain only lowercase letters, digits, '-' and '.'".into());
    }
    let first = name.as_bytes()[0];
    let last = name.as_bytes()[name.len() - 1];
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return Err("bucket names must begin and end with a letter or digit".into());
    }
    if name.contains("..") || name.parse::<std::net::Ipv4Addr>().is_ok() {
        return Err("bucket names must not contain '..' or look like an IP address".into());
    }
    if name.contains("--") && !is_directory_bucket_name(name) {
        return Err("only directory buckets (base--azid--x-s3) may contain '--'".into());
    }
    if is_directory_bucket_name(name) {
        let parts: Vec<&str> = name.trim_end_matches("--x-s3").split("--").collect();
        if parts.len() != 2 || parts[0].is_empty() || parts[1].is_empty() || parts[0].contains('.')
        {
            return Err("directory bucket names look like base-name--usw2-az1--x-s3".into());
        }
    }
    Ok(())
}

/// One file of object bytes. It is deleted when the last object, part or response holding it lets go.
#[derive(Debug)]
pub struct Blob {
    pub path: PathBuf,
    pub len: u64,
    /// The whole file, when short ([`Blob::short_bytes`]).
    kept: OnceLock<Bytes>,
    /// The whole file mapped read-only, once a GET asked for a long range of it ([`Blob::mapping`]).
    mapped: OnceLock<Bytes>,
}

/// Blobs this short are kept in memory ([`Blob::short_bytes`]).
pub const SHORT_BLOB: u64 = 256 * 1024;

/// A limit on what all blobs together hold (bytes kept in memory, mappings kept): taken before a blob keeps
/// something, given back when it does not keep it after all or when the blob goes.
struct Budget {
    used: AtomicU64,
    limit: u64,
}

impl Budget {
    const fn new(limit: u64) -> Budget {
        Budget {
            used: AtomicU64::new(0),
            limit,
        }
    }

    fn take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used + n <= self.limit).then_some(used + n)
            })
            .is_ok()
    }

    fn give_back(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// Bytes of short blobs kept in memory, all blobs together, at most. Every GET of a short object otherwise
/// reads it from its file again (a copy and a page-cache walk, about a third of the emulator's CPU on 100 KB
/// GETs), on the cores the clients under test share with the emulator.
static KEPT: Budget = Budget::new(1 << 30);

/// Blobs kept mapped ([`Blob::mapping`]), all together, at most: well below the kernel's default map count
/// (65,530), which the rest of the process needs too.
static MAPPED: Budget = Budget::new(8192);

/// Keeps `value` in `cell`, whose budget share (`n` of `budget`) was taken for it; a value another request kept
/// first wins, and the share taken for this one goes back. Returns the kept value.
fn keep(cell: &OnceLock<Bytes>, value: Bytes, budget: &Budget, n: u64) -> Bytes {
    if cell.set(value).is_err() {
        budget.give_back(n);
    }
    cell.get().expect("set just now").clone()
}

/// A blob file whose length is not the one recorded for it.
pub fn length_mismatch(path: &Path, found: u64, expected: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        format!("{}: {found} bytes, {expected} expected", path.display()),
    )
}

impl Blob {
    pub fn new(path: PathBuf, len: u64) -> Arc<Blob> {
        Arc::new(Blob {
            path,
            len,
            kept: OnceLock::new(),
            mapped: OnceLock::new(),
        })
    }

    /// The whole blob mapped read-only: a GET of a long range sends views of it, and the socket copies straight
    /// from the page cache. The mapping is made at the first ask and kept while the blob (or a view of it)
    /// lives, so a GET costs no map and unmap; past [`MAPPED`] blobs kept mapped, a mapping serves
    /// its GET only (the process's map count is finite).
    pub fn mapping(&self) -> std::io::Result<Bytes> {
        if let Some(mapped) = self.mapped.get() {
            return Ok(mapped.clone());
        }
        let file = std::fs::File::open(&self.path)?;
        let on_disk = file.metadata()?.len();
        if on_disk != self.len {
            return Err(length_mismatch(&self.path, on_disk, self.len));
        }
        let len = usize::try_from(self.len).map_err(std::io::Error::other)?;
        let kept = MAPPED.take(1);
        let mut options = memmap2::MmapOptions::new();
        options.len(len);
        if kept {
            // A mapping kept for the blob's life is faulted in once, here on the caller's blocking thread, not
            // page by page in socket writes on the async workers.
            options.populate();
        }
        // SAFETY: a blob is never written after it is made, nor truncated, so the mapped bytes cannot change
        // or vanish while the mapping lives (an unlinked file's pages stay while mapped).
        let map = match unsafe { options.map(&file) } {
            Ok(map) => Bytes::from_owner(map),
            Err(e) => {
                if kept {
                    MAPPED.give_back(1);
                }
                return Err(e);
            }
        };
        if !kept {
            return Ok(map);
        }
        Ok(keep(&self.mapped, map, &MAPPED, 1))
    }

    /// The whole blob, from memory when it is short ([`SHORT_BLOB`]): read and kept at the first ask, while
    /// all blobs kept so far leave room ([`KEPT`]). None for a longer blob. A blob is never written
    /// after it is made, so its bytes cannot go stale.
    pub fn short_bytes(&self) -> std::io::Result<Option<Bytes>> {
        if let Some(kept) = self.kept.get() {
            return Ok(Some(kept.clone()));
        }
        if self.len > SHORT_BLOB {
            return Ok(None);
        }
        // Room first: past the budget, a GET reads only the range it asks for.
        if !KEPT.take(self.len) {
            return Ok(None);
        }
        let bytes = std::fs::read(&self.path).and_then(|bytes| match bytes.len() as u64 {
            found if found == self.len => Ok(Bytes::from(bytes)),
            found => Err(length_mismatch(&self.path, found, self.len)),
        });
        match bytes {
            Ok(bytes) => Ok(Some(keep(&self.kept, bytes, &KEPT, self.len))),
            Err(e) => {
                KEPT.give_back(self.len);
                Err(e)
            }
        }
    }
}

impl Drop for Blob {
    fn drop(&mut self) {
        if self.kept.get().is_some() {
            KEPT.give_back(self.len);
        }
        if self.mapped.get().is_some() {
            MAPPED.give_back(1);
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `len` bytes of `blob` from `offset`: one piece of a ranged read.
pub type Piece = (Arc<Blob>, u64, u64);

/// User metadata (`x-amz-meta-*`): lower-case names without the prefix, in name order.
pub type UserMeta = Vec<(String, String)>;

#[derive(Debug, Clone)]
pub struct Object {
    /// The object's bytes, in order: slices of blobs. A whole upload is one whole blob; a part copied from a
    /// range of another object is a slice of that object's blobs, so server-side copies copy no bytes.
    pub data: Vec<Piece>,
    pub size: u64,
    pub etag: String,
    pub last_modified: SystemTime,
    pub content_type: String,
    /// `(algorithm, base64 value)` of a full-object checksum, when known.
    pub checksum: Option<(String, String)>,
    /// Number of appends/parts the object is made of (directory buckets cap appends at 10,000).
    pub parts: u32,
    pub meta: UserMeta,
}

impl Object {
    /// The pieces of blobs that hold bytes `start..start + len`.
    pub fn pieces(&self, start: u64, len: u64) -> Vec<Piece> {
        let (end, mut at, mut out) = (start + len, 0u64, Vec::new());
        for (blob, offset, piece_len) in &self.data {
            let (from, to) = (start.max(at), end.min(at + piece_len));
            if from < to {
                out.push((Arc::clone(blob), offset + from - at, to - from));
            }
            at += piece_len;
        }
        out
    }
}

#[derive(Debug, Clone)]
pub struct Part {
    /// Slices of blobs: one whole blob for UploadPart, slices of the source's blobs for UploadPartCopy.
    pub data: Vec<Piece>,
    pub size: u64,
    pub etag: String,
    pub md5: Option<[u8; 16]>,
    pub checksums: Vec<(String, String)>,
}

#[derive(Debug)]
pub struct Upload {
    pub key: String,
    pub dir: PathBuf,
    pub initiated: SystemTime,
    pub checksum_algorithm: Option<String>,
    pub parts: BTreeMap<u32, Part>,
    /// Content type and user metadata given at CreateMultipartUpload, for the completed object.
    pub content_type: String,
    pub meta: UserMeta,
}

pub struct Bucket {
    pub name: String,
    pub directory: bool,
    pub created: SystemTime,
    pub dir: PathBuf,
    /// Salt for the listing order of directory buckets (hash order, not name order).
    pub order_salt: u64,
    pub objects: BTreeMap<String, Arc<Object>>,
    pub uploads: HashMap<String, Upload>,
    /// The latest RenameObject idempotency tokens (x-amz-client-token) with the move each made, oldest
    /// first: a retry with the same token succeeds again instead of failing on the moved source.
    pub renames: std::collections::VecDeque<(String, String, String)>,
    /// The latest completed multipart uploads: (upload ID, key, the parts asked for as (number, ETag), the
    /// object's ETag). The service answers a CompleteMultipartUpload sent again for an upload it completed
    /// with the same result, instead of NoSuchUpload.
    pub completed: std::collections::VecDeque<Completed>,
}

pub type Completed = (String, String, Vec<(u32, String)>, String);

impl Bucket {
    /// Position of `key` in a directory bucket's listing order.
    pub fn order_of(&self, key: &str) -> u64 {
        let mut h =
            std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
                .build_hasher();
        h.write_u64(self.order_salt);
        h.write(key.as_bytes());
        h.finish()
    }
}

#[derive(Debug, Clone)]
pub struct Session {
    pub bucket: String,
    pub secret: String,
    pub token: String,
    pub expires: Instant,
    pub expires_wall: SystemTime,
    pub read_only: bool,
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct OpStats {
    pub requests: u64,
    pub errors: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Requests whose body was not hashed for the signature (`x-amz-content-sha256: UNSIGNED-PAYLOAD` or its
    /// streaming form), so a test can see which uploads a client signs.
    pub unsigned_payload: u64,
}

/// What one request adds to its operation's [`OpStats`].
#[derive(Debug, Default, Clone, Copy)]
pub struct Recorded {
    pub error: bool,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub unsigned_payload: bool,
}

pub struct Store {
    root: PathBuf,
    buckets: Mutex<HashMap<String, Bucket>>,
    sessions: Mutex<HashMap<String, Session>>,
    stats: Mutex<BTreeMap<String, BTreeMap<String, OpStats>>>,
    next_id: AtomicU64,
}

impl Store {
    pub fn new(root: &Path) -> std::io::Result<Store> {
        std::fs::create_dir_all(root)?;
        Ok(Store {
            root: root.to_path_buf(),
            buckets: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            stats: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
        })
    }

    pub fn buckets(&self) -> MutexGuard<'_, HashMap<String, Bucket>> {
        self.buckets.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn sessions(&self) -> MutexGuard<'_, HashMap<String, Session>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A process-unique id for file names, upload ids and ETags.
    pub fn unique(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{n:08x}{:016x}", rand::random::<u64>())
    }

    pub fn create_bucket(&self, name: &str) -> Result<(), S3Error> {
        validate_bucket_name(name).map_err(|m| {
            S3Error::new(
                400,
                "InvalidBucketName",
                format!("The specified bucket is not valid: {m}"),
            )
        })?;
        let mut buckets = self.buckets();
        if buckets.contains_key(name) {
            return Err(S3Error::new(
                409,
                "BucketAlreadyOwnedByYou",
                "Your previous request to create the named bucket succeeded and you already own it.",
            ));
        }
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).map_err(S3Error::internal)?;
        buckets.insert(
            name.to_string(),
            Bucket {
                name: name.to_string(),
                directory: is_directory_bucket_name(name),
                created: SystemTime::now(),
                dir,
                order_salt: rand::random(),
                objects: BTreeMap::new(),
                uploads: HashMap::new(),
                renames: Default::default(),
                completed: Default::default(),
            },
        );
        Ok(())
    }

    pub fn delete_bucket(&self, name: &str) -> Result<(), S3Error> {
        let mut buckets = self.buckets();
        let bucket = buckets.get(name).ok_or_else(S3Error::no_such_bucket)?;
        if !bucket.objects.is_empty() || !bucket.uploads.is_empty() {
            return Err(S3Error::new(
                409,
                "BucketNotEmpty",
                "The bucket you tried to delete is not empty",
            ));
        }
        let dir = bucket.dir.clone();
        buckets.remove(name);
        let _ = std::fs::remove_dir_all(dir);
        Ok(())
    }

    /// A new file path inside the bucket's directory for an incoming body.
    pub fn new_file(&self, bucket: &str, kind: &str) -> Result<PathBuf, S3Error> {
        let buckets = self.buckets();
        let b = buckets.get(bucket).ok_or_else(S3Error::no_such_bucket)?;
        Ok(b.dir.join(format!("{kind}-{}", self.unique())))
    }

    pub fn record(&self, bucket: &str, op: &str, outcome: Recorded) {
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        let s = stats
            .entry(bucket.to_string())
            .or_default()
            .entry(op.to_string())
            .or_default();
        s.requests += 1;
        s.errors += u64::from(outcome.error);
        s.bytes_in += outcome.bytes_in;
        s.bytes_out += outcome.bytes_out;
        s.unsigned_payload += u64::from(outcome.unsigned_payload);
    }

    pub fn stats_json(&self) -> String {
        let stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        serde_json::to_string_pretty(&*stats).unwrap_or_default()
    }

    pub fn reset_stats(&self) {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_takes_up_to_its_limit_and_again_what_was_given_back() {
        let budget = Budget::new(10);
        assert!(budget.take(6));
        assert!(!budget.take(5), "past the limit");
        assert!(budget.take(4));
        assert!(!budget.take(1));
        budget.give_back(6);
        assert!(budget.take(6));
    }

    fn object(lens: &[u64], dir: &Path) -> Object {
        let data = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| (Blob::new(dir.join(format!("b{i}")), len), 0, len))
            .collect();
        Object {
            data,
            size: lens.iter().sum(),
            etag: String::new(),
            last_modified: SystemTime::now(),
            content_type: String::new(),
            checksum: None,
            parts: lens.len() as u32,
            meta: Vec::new(),
        }
    }

    fn spans(pieces: Vec<Piece>) -> Vec<(String, u64, u64)> {
        pieces
            .into_iter()
            .map(|(b, o, l)| {
                (
                    b.path.file_name().unwrap().to_string_lossy().into_owned(),
                    o,
                    l,
                )
            })
            .collect()
    }

    #[test]
    fn a_range_maps_onto_the_blobs_it_covers() {
        let dir = Path::new("/nonexistent-expressfs-blobs");
        let o = object(&[10, 0, 5, 20], dir);
        assert_eq!(
            spans(o.pieces(0, 35)),
            [
                ("b0".into(), 0, 10),
                ("b2".into(), 0, 5),
                ("b3".into(), 0, 20)
            ]
        );
        assert_eq!(
            spans(o.pieces(8, 10)),
            [
                ("b0".into(), 8, 2),
                ("b2".into(), 0, 5),
                ("b3".into(), 0, 3)
            ]
        );
        assert_eq!(spans(o.pieces(16, 4)), [("b3".into(), 1, 4)]);
        assert!(o.pieces(35, 0).is_empty());
    }

    #[test]
    fn a_range_of_slices_keeps_each_slice_offset() {
        let dir = Path::new("/nonexistent-expressfs-blobs");
        let (a, b) = (Blob::new(dir.join("a"), 100), Blob::new(dir.join("b"), 100));
        // Bytes 30..70 of a, then 0..10 of b: what a part copied from ranges looks like.
        let o = Object {
            data: vec![(Arc::clone(&a), 30, 40), (Arc::clone(&b), 0, 10)],
            size: 50,
            ..object(&[], dir)
        };
        assert_eq!(
            spans(o.pieces(35, 10)),
            [("a".into(), 65, 5), ("b".into(), 0, 5)]
        );
        assert_eq!(spans(o.pieces(0, 1)), [("a".into(), 30, 1)]);
    }

    #[test]
    fn a_blob_is_deleted_when_its_last_holder_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        std::fs::write(&path, b"bytes").unwrap();
        let blob = Blob::new(path.clone(), 5);
        let reader = Arc::clone(&blob);
        drop(blob);
        assert!(path.exists(), "a reader still holds it");
        drop(reader);
        assert!(!path.exists());
    }
}
