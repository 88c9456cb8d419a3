//! Shared cache in a second bucket (`--cache-xz`): small objects (up to `max_object_size`) are stored whole in
//! the cache bucket so that a fleet of hosts reads them from there instead of each hitting the source.
//!
//! Entry key: `expressfs-cache/v1/<sha256 of (source bucket, key, ETag, block 0, max size)>`. The entry body is
//! a header naming exactly those values, the data length and a CRC32C, then the data. A read checks all of it;
//! an entry that does not match (another object, truncated, tampered) is ignored and counted, never returned.
//! Misses are filled in the background with a conditional PUT (If-None-Match), bounded in concurrency.

use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use lru::LruCache;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::s3::{ClientError, ObjectClient, WriteCondition};
use crate::source::{CacheLayer, ReadSource};

const MAGIC: &[u8; 8] = b"XFSSHR01";
const PREFIX: &str = "expressfs-cache/v1/";
/// Background fills in flight at once (each holds at most one small object in memory).
const MAX_FILLS: usize = 8;

#[derive(Debug, Default)]
pub struct SharedCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub rejected: AtomicU64,
    pub fills: AtomicU64,
    pub errors: AtomicU64,
}

impl SharedCounters {
    pub fn summary(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "hits={} misses={} rejected_entries={} fills={} errors={}",
            g(&self.hits),
            g(&self.misses),
            g(&self.rejected),
            g(&self.fills),
            g(&self.errors)
        )
    }
}

/// The shared cache as a layer: stack it with [`crate::source::Cached`]. Its entries live in the cache bucket,
/// reached through that bucket's own client (a client, not a source: the layer writes entries too).
pub struct SharedCache {
    cache: Arc<dyn ObjectClient>,
    max_object_size: u64,
    fills: Arc<Semaphore>,
    pub counters: Arc<SharedCounters>,
    /// Versions a miss found too big for an entry: later reads of them go straight to the layers below,
    /// instead of asking the cache bucket and fetching the object's first `max_object_size` bytes each time.
    too_big: Mutex<LruCache<(String, String), ()>>,
}

/// How many too-big versions are remembered.
const TOO_BIG_REMEMBERED: usize = 4096;

impl SharedCache {
    pub fn new(cache: Arc<dyn ObjectClient>, max_object_size: u64) -> SharedCache {
        SharedCache {
            cache,
            max_object_size,
            fills: Arc::new(Semaphore::new(MAX_FILLS)),
            counters: Arc::new(SharedCounters::default()),
            too_big: Mutex::new(LruCache::new(
                NonZeroUsize::new(TOO_BIG_REMEMBERED).expect("not zero"),
            )),
        }
    }

    fn known_too_big(&self, key: &str, etag: &str) -> bool {
        let mut too_big = self.too_big.lock().unwrap_or_else(|e| e.into_inner());
        too_big.get(&(key.to_string(), etag.to_string())).is_some()
    }

    fn found_too_big(&self, key: &str, etag: &str) {
        let mut too_big = self.too_big.lock().unwrap_or_else(|e| e.into_inner());
        too_big.put((key.to_string(), etag.to_string()), ());
    }

    /// `bucket` is the source bucket the object is read from.
    fn header(&self, bucket: &str, key: &str, etag: &str) -> Vec<u8> {
        format!("{bucket}\0{key}\0{etag}\00\0{}", self.max_object_size).into_bytes()
    }

    fn entry_key(&self, bucket: &str, key: &str, etag: &str) -> String {
        format!(
            "{PREFIX}{}",
            hex::encode(Sha256::digest(self.header(bucket, key, etag)))
        )
    }

    fn encode(&self, bucket: &str, key: &str, etag: &str, data: &[u8]) -> Bytes {
        let header = self.header(bucket, key, etag);
        let mut out = BytesMut::with_capacity(data.len() + header.len() + 24);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(data).to_le_bytes());
        out.extend_from_slice(data);
        out.freeze()
    }

    /// The object's bytes if the entry is exactly what it claims to be.
    fn decode(&self, bucket: &str, key: &str, etag: &str, raw: &Bytes) -> Option<Bytes> {
        let header = self.header(bucket, key, etag);
        let fixed = MAGIC.len() + 4;
        if raw.len() < fixed || &raw[..MAGIC.len()] != MAGIC {
            return None;
        }
        let header_len = u32::from_le_bytes(raw[8..12].try_into().ok()?) as usize;
        let data_at = fixed + header_len + 12;
        if raw.len() < data_at || raw[fixed..fixed + header_len] != header[..] {
            return None;
        }
        let len = u64::from_le_bytes(
            raw[fixed + header_len..fixed + header_len + 8]
                .try_into()
                .ok()?,
        ) as usize;
        let crc = u32::from_le_bytes(raw[fixed + header_len + 8..data_at].try_into().ok()?);
        let data = raw.slice(data_at..);
        (data.len() == len && crc32c::crc32c(&data) == crc).then_some(data)
    }

    fn fill_in_background(&self, bucket: &str, key: &str, etag: &str, data: Bytes) {
        let Ok(permit) = Arc::clone(&self.fills).try_acquire_owned() else {
            return;
        };
        let fill = self.fill(bucket, key, etag, &data);
        tokio::spawn(async move {
            let _permit = permit;
            fill.await
        });
    }

    /// Writes the entry (If-None-Match: another host may have written it first, which is fine); resolves to
    /// whether the bucket holds an entry now.
    fn fill(
        &self,
        bucket: &str,
        key: &str,
        etag: &str,
        data: &[u8],
    ) -> impl Future<Output = bool> + Send + 'static {
        let (cache, counters) = (Arc::clone(&self.cache), Arc::clone(&self.counters));
        let entry = self.entry_key(bucket, key, etag);
        let body = self.encode(bucket, key, etag, data);
        async move {
            match cache
                .put_object(&entry, body, WriteCondition::IfNoneMatch)
                .await
            {
                Ok(_) => {
                    counters.fills.fetch_add(1, Ordering::Relaxed);
                    true
                }
                Err(ClientError::PreconditionFailed { .. }) => true,
                Err(e) => {
                    if counters.errors.fetch_add(1, Ordering::Relaxed) == 0 {
                        warn!(error = %e, "shared cache write failed; reads continue from the source");
                    }
                    false
                }
            }
        }
    }

    /// A miss: the object from `below`, whole if it fits in an entry. One byte more than the limit tells
    /// whether it does.
    async fn read_on_miss(
        &self,
        below: &dyn ReadSource,
        key: &str,
        etag: &str,
    ) -> Result<Bytes, ClientError> {
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        below.read(key, 0..self.max_object_size + 1, etag).await
    }

    /// The object's bytes from its entry, if there is an entry and it is exactly what it claims to be.
    async fn entry(&self, bucket: &str, key: &str, etag: &str) -> Option<Bytes> {
        let entry = self.entry_key(bucket, key, etag);
        match self
            .cache
            .get_object(&entry, 0..self.max_object_size + 4096, None)
            .await
        {
            Ok(raw) => match self.decode(bucket, key, etag, &raw) {
                Some(data) => {
                    self.counters.hits.fetch_add(1, Ordering::Relaxed);
                    return Some(data);
                }
                _ => {
                    self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                    debug!(key, "ignoring a shared cache entry that does not match");
                }
            },
            Err(ClientError::NotFound { .. }) => {}
            Err(e) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                debug!(key, error = %e, "shared cache read failed");
            }
        }
        None
    }
}

fn slice(data: &Bytes, range: &Range<u64>) -> Bytes {
    let len = data.len() as u64;
    data.slice(range.start.min(len) as usize..range.end.min(len) as usize)
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl CacheLayer for SharedCache {
    async fn read(
        &self,
        below: &dyn ReadSource,
        key: &str,
        range: Range<u64>,
        etag: &str,
    ) -> Result<Bytes, ClientError> {
        // Only reads pinned to an ETag within the first `max_object_size` bytes can be served from an entry.
        if etag.is_empty() || range.end > self.max_object_size || self.known_too_big(key, etag) {
            return below.read(key, range, etag).await;
        }
        let bucket = below.bucket();
        if let Some(data) = self.entry(bucket, key, etag).await {
            return Ok(slice(&data, &range));
        }
        let data = self.read_on_miss(below, key, etag).await?;
        if data.len() as u64 <= self.max_object_size {
            self.fill_in_background(bucket, key, etag, data.clone());
        } else {
            self.found_too_big(key, etag);
        }
        Ok(slice(&data, &range))
    }

    /// A small object's entry is written unless there is one, and waited for (a read's fill is skipped when
    /// too many are under way; a warm-up's is not); anything bigger is for the layers below.
    async fn keep(
        &self,
        below: &dyn ReadSource,
        key: &str,
        range: Range<u64>,
        etag: &str,
    ) -> Result<bool, ClientError> {
        if etag.is_empty() || range.end > self.max_object_size {
            return below.keep(key, range, etag).await;
        }
        let bucket = below.bucket();
        if self.entry(bucket, key, etag).await.is_some() {
            return Ok(true);
        }
        let data = self.read_on_miss(below, key, etag).await?;
        if data.len() as u64 > self.max_object_size {
            return below.keep(key, range, etag).await;
        }
        // A failed write keeps nothing: the warm-up then reads the file instead.
        let _permit = self.fills.acquire().await;
        Ok(self.fill(bucket, key, etag, &data).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::fake::{FakeClient, Op};
    use crate::source::{BucketSource, Cached};

    /// One host's shared cache in front of `source`.
    fn host(source: &Arc<FakeClient>, cache: &Arc<FakeClient>) -> Cached<SharedCache> {
        Cached::new(
            SharedCache::new(cache.clone(), 4096),
            BucketSource::shared(source.clone()),
        )
    }

    /// A version found too big for an entry is remembered: later reads of it ask neither the cache bucket
    /// nor the source for more than they want.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_version_too_big_for_an_entry_is_read_around_the_cache_from_then_on() {
        let source = Arc::new(FakeClient::new("src", true));
        let cache = Arc::new(FakeClient::new("cache", true));
        let etag = source
            .put_object("big", Bytes::from(vec![7u8; 20_000]), WriteCondition::None)
            .await
            .unwrap()
            .etag;
        let c = host(&source, &cache);
        assert_eq!(c.read("big", 0..100, &etag).await.unwrap().len(), 100);
        let (asked, fetched) = (cache.count(Op::Get), source.count(Op::Get));
        for block in 1..8u64 {
            let range = block * 500..block * 500 + 100;
            assert_eq!(c.read("big", range, &etag).await.unwrap().len(), 100);
        }
        assert_eq!(
            cache.count(Op::Get),
            asked,
            "the cache bucket was asked again"
        );
        assert_eq!(source.count(Op::Get) - fetched, 7);
    }

    /// Hosts running other versions share the bucket: an entry's name must not change with the code.
    #[test]
    fn entry_keys_are_the_ones_other_hosts_compute() {
        let layer = SharedCache::new(Arc::new(FakeClient::new("cache", true)), 4096);
        assert_eq!(
            layer.entry_key("src", "img/1.jpg", "\"abc\""),
            "expressfs-cache/v1/7554889127223ec45187a2c435478476baf8b83aa946c90b3f8621744236aae2"
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn small_objects_are_shared_and_bad_entries_ignored() {
        let source = Arc::new(FakeClient::new("src", true));
        let cache = Arc::new(FakeClient::new("cache", true));
        let small: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let etag = source
            .put_object("s", Bytes::from(small.clone()), WriteCondition::None)
            .await
            .unwrap()
            .etag;
        let big_etag = source
            .put_object("b", Bytes::from(vec![1u8; 3000]), WriteCondition::None)
            .await
            .unwrap()
            .etag;
        let c = host(&source, &cache);
        assert_eq!(&c.read("s", 0..5000, &etag).await.unwrap()[..], &small[..]);
        // 5000 bytes > 4096: not cached. 3000 bytes: cached.
        assert_eq!(c.read("b", 0..3000, &big_etag).await.unwrap().len(), 3000);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(
            cache
                .object(&c.layer().entry_key("src", "s", &etag))
                .is_none()
        );
        assert!(
            cache
                .object(&c.layer().entry_key("src", "b", &big_etag))
                .is_some()
        );
        // A second host reads from the cache bucket.
        let other = host(&source, &cache);
        let before = source.counts();
        assert_eq!(
            other.read("b", 100..200, &big_etag).await.unwrap(),
            Bytes::from(vec![1u8; 100])
        );
        assert_eq!(source.counts(), before);
        // A tampered entry is ignored.
        let entry = other.layer().entry_key("src", "b", &big_etag);
        let mut raw = cache.object(&entry).unwrap().to_vec();
        let last = raw.len() - 1;
        raw[last] ^= 0xff;
        cache
            .put_object(&entry, Bytes::from(raw), WriteCondition::None)
            .await
            .unwrap();
        assert_eq!(
            other.read("b", 0..3000, &big_etag).await.unwrap(),
            Bytes::from(vec![1u8; 3000])
        );
        assert_eq!(other.layer().counters.rejected.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn keep_writes_a_small_objects_entry_before_it_returns_and_passes_big_ones_down() {
        let source = Arc::new(FakeClient::new("src", true));
        let cache = Arc::new(FakeClient::new("cache", true));
        let etag = source
            .put_object("s", Bytes::from(vec![7u8; 3000]), WriteCondition::None)
            .await
            .unwrap()
            .etag;
        let c = host(&source, &cache);
        assert!(c.keep("s", 0..3000, &etag).await.unwrap());
        // Written when keep returns, no wait: another host reads it without the source.
        assert!(
            cache
                .object(&c.layer().entry_key("src", "s", &etag))
                .is_some()
        );
        let before = source.counts();
        assert!(c.keep("s", 0..3000, &etag).await.unwrap(), "kept already");
        let other = host(&source, &cache);
        assert_eq!(other.read("s", 0..3000, &etag).await.unwrap().len(), 3000);
        assert_eq!(source.counts(), before);
        // Over the entry size: nothing here keeps it, and the bucket below keeps nothing.
        let big = source
            .put_object("b", Bytes::from(vec![1u8; 5000]), WriteCondition::None)
            .await
            .unwrap()
            .etag;
        assert!(!c.keep("b", 0..5000, &big).await.unwrap());
    }
}
