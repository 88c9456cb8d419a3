//! Shared cache in a second bucket (`--cache-xz`): small objects (up to `max_object_size`) are stored whole in
//! the cache bucket so that a fleet of hosts reads them from there instead of each hitting the source.
//!
//! Entry key: `expressfs-cache/v1/<sha256 of (source bucket, key, ETag, block 0, max size)>`. The entry body is
//! a header naming exactly those values, the data length and a CRC32C, then the data. A read checks all of it;
//! an entry that does not match (another object, truncated, tampered) is ignored and counted, never returned.
//! Misses are filled in the background with a conditional PUT (If-None-Match), bounded in concurrency.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::s3::{
    ClientError, ListPage, ObjectClient, ObjectInfo, PutResult, UploadedPart, WriteCondition,
};

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

pub struct SharedCacheClient {
    source: Arc<dyn ObjectClient>,
    cache: Arc<dyn ObjectClient>,
    max_object_size: u64,
    fills: Arc<Semaphore>,
    pub counters: Arc<SharedCounters>,
}

impl SharedCacheClient {
    pub fn new(
        source: Arc<dyn ObjectClient>,
        cache: Arc<dyn ObjectClient>,
        max_object_size: u64,
    ) -> SharedCacheClient {
        SharedCacheClient {
            source,
            cache,
            max_object_size,
            fills: Arc::new(Semaphore::new(MAX_FILLS)),
            counters: Arc::new(SharedCounters::default()),
        }
    }

    fn header(&self, key: &str, etag: &str) -> Vec<u8> {
        format!(
            "{}\0{key}\0{etag}\00\0{}",
            self.source.bucket(),
            self.max_object_size
        )
        .into_bytes()
    }

    fn entry_key(&self, key: &str, etag: &str) -> String {
        format!(
            "{PREFIX}{}",
            hex::encode(Sha256::digest(self.header(key, etag)))
        )
    }

    fn encode(&self, key: &str, etag: &str, data: &[u8]) -> Bytes {
        let header = self.header(key, etag);
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
    fn decode(&self, key: &str, etag: &str, raw: &Bytes) -> Option<Bytes> {
        let header = self.header(key, etag);
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

    fn fill_in_background(&self, key: &str, etag: &str, data: Bytes) {
        let Ok(permit) = Arc::clone(&self.fills).try_acquire_owned() else {
            return;
        };
        let (cache, counters) = (Arc::clone(&self.cache), Arc::clone(&self.counters));
        let (entry, body) = (self.entry_key(key, etag), self.encode(key, etag, &data));
        tokio::spawn(async move {
            let _permit = permit;
            match cache
                .put_object(&entry, body, WriteCondition::IfNoneMatch)
                .await
            {
                Ok(_) => {
                    counters.fills.fetch_add(1, Ordering::Relaxed);
                }
                // Another host filled it first: fine.
                Err(ClientError::PreconditionFailed { .. }) => {}
                Err(e) => {
                    if counters.errors.fetch_add(1, Ordering::Relaxed) == 0 {
                        warn!(error = %e, "shared cache write failed; reads continue from the source");
                    }
                }
            }
        });
    }
}

fn slice(data: &Bytes, range: &Range<u64>) -> Bytes {
    let len = data.len() as u64;
    data.slice(range.start.min(len) as usize..range.end.min(len) as usize)
}

#[async_trait]
impl ObjectClient for SharedCacheClient {
    fn bucket(&self) -> &str {
        self.source.bucket()
    }

    fn is_directory_bucket(&self) -> bool {
        self.source.is_directory_bucket()
    }

    async fn head_bucket(&self) -> Result<(), ClientError> {
        self.source.head_bucket().await
    }

    async fn head_object(&self, key: &str) -> Result<ObjectInfo, ClientError> {
        self.source.head_object(key).await
    }

    async fn list_objects(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        token: Option<&str>,
        max_keys: i32,
    ) -> Result<ListPage, ClientError> {
        self.source
            .list_objects(prefix, delimiter, token, max_keys)
            .await
    }

    async fn get_object(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<Bytes, ClientError> {
        // Only reads pinned to an ETag within the first `max_object_size` bytes can be served from an entry.
        let etag = match if_match {
            Some(e) if !e.is_empty() && range.end <= self.max_object_size => e,
            _ => return self.source.get_object(key, range, if_match).await,
        };
        let entry = self.entry_key(key, etag);
        match self
            .cache
            .get_object(&entry, 0..self.max_object_size + 4096, None)
            .await
        {
            Ok(raw) => match self.decode(key, etag, &raw) {
                Some(data) => {
                    self.counters.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(slice(&data, &range));
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
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        // One byte more than the limit tells whether the whole object fits.
        let data = self
            .source
            .get_object(key, 0..self.max_object_size + 1, Some(etag))
            .await?;
        if data.len() as u64 <= self.max_object_size {
            self.fill_in_background(key, etag, data.clone());
        }
        Ok(slice(&data, &range))
    }

    async fn put_object(
        &self,
        key: &str,
        body: Bytes,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        self.source.put_object(key, body, condition).await
    }

    async fn append_object(
        &self,
        key: &str,
        offset: u64,
        body: Bytes,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        self.source
            .append_object(key, offset, body, condition)
            .await
    }

    async fn create_multipart_upload(&self, key: &str) -> Result<String, ClientError> {
        self.source.create_multipart_upload(key).await
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        part_number: i32,
        body: Bytes,
    ) -> Result<UploadedPart, ClientError> {
        self.source
            .upload_part(key, upload_id, part_number, body)
            .await
    }

    async fn complete_multipart_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<UploadedPart>,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        self.source
            .complete_multipart_upload(key, upload_id, parts, condition)
            .await
    }

    async fn abort_multipart_upload(&self, key: &str, upload_id: &str) -> Result<(), ClientError> {
        self.source.abort_multipart_upload(key, upload_id).await
    }

    async fn delete_object(&self, key: &str) -> Result<(), ClientError> {
        self.source.delete_object(key).await
    }

    async fn rename_object(
        &self,
        source_key: &str,
        destination_key: &str,
        condition: WriteCondition,
    ) -> Result<(), ClientError> {
        self.source
            .rename_object(source_key, destination_key, condition)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::fake::FakeClient;

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
        let c = SharedCacheClient::new(source.clone(), cache.clone(), 4096);
        assert_eq!(
            &c.get_object("s", 0..5000, Some(&etag)).await.unwrap()[..],
            &small[..]
        );
        // 5000 bytes > 4096: not cached. 3000 bytes: cached.
        assert_eq!(
            c.get_object("b", 0..3000, Some(&big_etag))
                .await
                .unwrap()
                .len(),
            3000
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(cache.object(&c.entry_key("s", &etag)).is_none());
        assert!(cache.object(&c.entry_key("b", &big_etag)).is_some());
        // A second host reads from the cache bucket.
        let other = SharedCacheClient::new(source.clone(), cache.clone(), 4096);
        let before = source.counts();
        assert_eq!(
            other
                .get_object("b", 100..200, Some(&big_etag))
                .await
                .unwrap(),
            Bytes::from(vec![1u8; 100])
        );
        assert_eq!(source.counts(), before);
        // A tampered entry is ignored.
        let entry = other.entry_key("b", &big_etag);
        let mut raw = cache.object(&entry).unwrap().to_vec();
        let last = raw.len() - 1;
        raw[last] ^= 0xff;
        cache
            .put_object(&entry, Bytes::from(raw), WriteCondition::None)
            .await
            .unwrap();
        assert_eq!(
            other
                .get_object("b", 0..3000, Some(&big_etag))
                .await
                .unwrap(),
            Bytes::from(vec![1u8; 3000])
        );
        assert_eq!(other.counters.rejected.load(Ordering::Relaxed), 1);
    }
}
