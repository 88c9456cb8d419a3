//! Buckets, objects, multipart uploads and sessions. Object bytes live in files under the data directory;
//! only metadata is held in memory. A write lands in a fresh file and is swapped in under the lock, so
//! readers that already opened the old file keep reading consistent (old) bytes, as with S3.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

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

#[derive(Debug, Clone)]
pub struct Object {
    pub file: PathBuf,
    pub size: u64,
    pub etag: String,
    pub last_modified: SystemTime,
    pub content_type: String,
    /// `(algorithm, base64 value)` of a full-object checksum, when known.
    pub checksum: Option<(String, String)>,
    /// Number of appends/parts the object is made of (directory buckets cap appends at 10,000).
    pub parts: u32,
}

#[derive(Debug, Clone)]
pub struct Part {
    pub file: PathBuf,
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
}

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
