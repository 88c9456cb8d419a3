//! Caches as layers around reads: [`CachingClient`] wraps any [`ObjectClient`] and serves ETag-pinned
//! ranged GETs from the local block cache, fetching only the missing runs of blocks from the bucket.
//! Everything but `get_object` passes straight through.

pub mod disk;
pub mod shared;

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};

use crate::s3::{
    ClientError, ListPage, ObjectClient, ObjectInfo, PutResult, UploadedPart, WriteCondition,
};
use disk::{BlockId, DiskCache};

pub struct CachingClient {
    inner: Arc<dyn ObjectClient>,
    cache: Arc<DiskCache>,
    block_size: u64,
}

impl CachingClient {
    pub fn new(
        inner: Arc<dyn ObjectClient>,
        cache: Arc<DiskCache>,
        block_size: u64,
    ) -> CachingClient {
        CachingClient {
            inner,
            cache,
            block_size: block_size.max(64 * 1024),
        }
    }

    pub fn cache(&self) -> &Arc<DiskCache> {
        &self.cache
    }

    async fn cached_blocks(
        &self,
        key: &str,
        etag: &str,
        first: u64,
        last: u64,
    ) -> Vec<Option<Bytes>> {
        let (cache, bucket, key, etag, bs) = (
            Arc::clone(&self.cache),
            self.inner.bucket().to_string(),
            key.to_string(),
            etag.to_string(),
            self.block_size,
        );
        tokio::task::spawn_blocking(move || {
            (first..=last)
                .map(|index| {
                    cache.get(&BlockId {
                        bucket: &bucket,
                        key: &key,
                        etag: &etag,
                        index,
                        block_size: bs,
                    })
                })
                .collect()
        })
        .await
        .unwrap_or_else(|_| vec![None; (last - first + 1) as usize])
    }

    /// Stores fetched blocks in the background, off the read's critical path.
    fn store_blocks(&self, key: &str, etag: &str, first: u64, data: Bytes) {
        let (cache, bucket, key, etag, bs) = (
            Arc::clone(&self.cache),
            self.inner.bucket().to_string(),
            key.to_string(),
            etag.to_string(),
            self.block_size,
        );
        tokio::task::spawn_blocking(move || {
            for (i, chunk) in data.chunks(bs as usize).enumerate() {
                let id = BlockId {
                    bucket: &bucket,
                    key: &key,
                    etag: &etag,
                    index: first + i as u64,
                    block_size: bs,
                };
                cache.put(&id, chunk);
            }
        });
    }
}

#[async_trait]
impl ObjectClient for CachingClient {
    fn bucket(&self) -> &str {
        self.inner.bucket()
    }

    fn is_directory_bucket(&self) -> bool {
        self.inner.is_directory_bucket()
    }

    async fn head_bucket(&self) -> Result<(), ClientError> {
        self.inner.head_bucket().await
    }

    async fn head_object(&self, key: &str) -> Result<ObjectInfo, ClientError> {
        self.inner.head_object(key).await
    }

    async fn list_objects(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        token: Option<&str>,
        max_keys: i32,
    ) -> Result<ListPage, ClientError> {
        self.inner
            .list_objects(prefix, delimiter, token, max_keys)
            .await
    }

    async fn get_object(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<Bytes, ClientError> {
        // Only reads pinned to an ETag can be cached safely.
        let Some(etag) = if_match.filter(|e| !e.is_empty()) else {
            return self.inner.get_object(key, range, if_match).await;
        };
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let bs = self.block_size;
        let (first, last) = (range.start / bs, (range.end - 1) / bs);
        let mut blocks = self.cached_blocks(key, etag, first, last).await;
        // Fetch each run of missing blocks with one GET.
        let mut i = 0;
        while i < blocks.len() {
            if blocks[i].is_some() {
                i += 1;
                continue;
            }
            let mut j = i;
            while j + 1 < blocks.len() && blocks[j + 1].is_none() {
                j += 1;
            }
            let start = (first + i as u64) * bs;
            let end = (first + j as u64 + 1) * bs;
            let data = self.inner.get_object(key, start..end, Some(etag)).await?;
            self.store_blocks(key, etag, first + i as u64, data.clone());
            for (n, slot) in blocks[i..=j].iter_mut().enumerate() {
                let from = (n as u64 * bs) as usize;
                let to = ((n as u64 + 1) * bs) as usize;
                *slot = Some(if from >= data.len() {
                    Bytes::new()
                } else {
                    data.slice(from..to.min(data.len()))
                });
            }
            i = j + 1;
        }
        let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
        for (n, block) in blocks.into_iter().enumerate() {
            let block = block.unwrap_or_default();
            let block_start = (first + n as u64) * bs;
            let from = range
                .start
                .saturating_sub(block_start)
                .min(block.len() as u64) as usize;
            let to = (range.end - block_start).min(block.len() as u64) as usize;
            if from < to {
                out.extend_from_slice(&block[from..to]);
            }
        }
        Ok(out.freeze())
    }

    async fn put_object(
        &self,
        key: &str,
        body: Bytes,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        self.inner.put_object(key, body, condition).await
    }

    async fn append_object(
        &self,
        key: &str,
        offset: u64,
        body: Bytes,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        self.inner.append_object(key, offset, body, condition).await
    }

    async fn create_multipart_upload(&self, key: &str) -> Result<String, ClientError> {
        self.inner.create_multipart_upload(key).await
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        part_number: i32,
        body: Bytes,
    ) -> Result<UploadedPart, ClientError> {
        self.inner
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
        self.inner
            .complete_multipart_upload(key, upload_id, parts, condition)
            .await
    }

    async fn abort_multipart_upload(&self, key: &str, upload_id: &str) -> Result<(), ClientError> {
        self.inner.abort_multipart_upload(key, upload_id).await
    }

    async fn delete_object(&self, key: &str) -> Result<(), ClientError> {
        self.inner.delete_object(key).await
    }

    async fn rename_object(
        &self,
        source_key: &str,
        destination_key: &str,
        condition: WriteCondition,
    ) -> Result<(), ClientError> {
        self.inner
            .rename_object(source_key, destination_key, condition)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::fake::FakeClient;
    use std::sync::atomic::Ordering;

    #[tokio::test(flavor = "multi_thread")]
    async fn second_read_is_served_from_disk() {
        let fake = Arc::new(FakeClient::new("b", true));
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let etag = fake
            .put_object("k", Bytes::from(data.clone()), WriteCondition::None)
            .await
            .unwrap()
            .etag;
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(DiskCache::open_with(dir.path(), 1 << 30, false).unwrap());
        let c = CachingClient::new(fake.clone(), Arc::clone(&cache), 64 * 1024);
        for (s, e) in [(0u64, 300_000u64), (70_000, 200_001), (299_990, 300_000)] {
            assert_eq!(
                &c.get_object("k", s..e, Some(&etag)).await.unwrap()[..],
                &data[s as usize..e as usize]
            );
        }
        // Let the background writes land, then read everything again without the bucket.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let before = fake.counts();
        assert_eq!(
            &c.get_object("k", 5..299_999, Some(&etag)).await.unwrap()[..],
            &data[5..299_999]
        );
        assert_eq!(fake.counts(), before, "went to the bucket");
        assert!(cache.counters.hits.load(Ordering::Relaxed) >= 5);
    }
}
