//! Caches as layers under the read path (see [`crate::source`]): [`BlockCache`] serves ETag-pinned ranged
//! reads from the local block cache, fetching only the missing runs of blocks from the source below it;
//! [`shared::SharedCache`] keeps small objects whole in a second bucket.

pub mod disk;
mod fetching;
pub mod shared;

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::s3::ClientError;
use crate::source::{CacheLayer, ReadSource};
use disk::{BlockId, DiskCache};
use fetching::{Fetching, Underway};

/// The disk block cache as a layer: stack it with [`crate::source::Cached`].
pub struct BlockCache {
    cache: Arc<DiskCache>,
    block_size: u64,
    fetching: Arc<Fetching>,
}

impl BlockCache {
    pub fn new(cache: Arc<DiskCache>, block_size: u64) -> BlockCache {
        BlockCache {
            cache,
            block_size: block_size.max(64 * 1024),
            fetching: Arc::default(),
        }
    }

    pub fn cache(&self) -> &Arc<DiskCache> {
        &self.cache
    }

    /// The blocks of one version of one object, owned so that blocking tasks can take them.
    fn blocks_of(&self, bucket: &str, key: &str, etag: &str) -> ObjectBlocks {
        ObjectBlocks {
            cache: Arc::clone(&self.cache),
            bucket: bucket.to_string(),
            key: key.to_string(),
            etag: etag.to_string(),
            block_size: self.block_size,
        }
    }
}

struct ObjectBlocks {
    cache: Arc<DiskCache>,
    bucket: String,
    key: String,
    etag: String,
    block_size: u64,
}

impl ObjectBlocks {
    fn id(&self, index: u64) -> BlockId<'_> {
        BlockId {
            bucket: &self.bucket,
            key: &self.key,
            etag: &self.etag,
            index,
            block_size: self.block_size,
        }
    }

    /// Blocks found missing without asking the disk (nothing of theirs is in its index).
    fn count_misses(&self, blocks: u64) {
        self.cache
            .counters
            .misses
            .fetch_add(blocks, std::sync::atomic::Ordering::Relaxed);
    }

    /// Blocks `first..=last` as the disk holds them (read off the async threads).
    async fn cached(self: Arc<Self>, first: u64, last: u64) -> Vec<Option<Bytes>> {
        tokio::task::spawn_blocking(move || {
            (first..=last)
                .map(|index| self.cache.get(&self.id(index)))
                .collect()
        })
        .await
        .unwrap_or_else(|_| vec![None; (last - first + 1) as usize])
    }

    /// Stores fetched blocks from `first` on, on a blocking thread: a read does not wait for it, a warm-up
    /// does. `underway` ends when the blocks are written.
    fn store(
        self: Arc<Self>,
        first: u64,
        data: Bytes,
        underway: Underway,
    ) -> tokio::task::JoinHandle<()> {
        tokio::task::spawn_blocking(move || {
            for (i, chunk) in data.chunks(self.block_size as usize).enumerate() {
                self.cache.put(&self.id(first + i as u64), chunk);
            }
            // The GET's buffer goes back to the pool when the reader's slices and these are all gone.
            drop(underway);
        })
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl CacheLayer for BlockCache {
    async fn read(
        &self,
        below: &dyn ReadSource,
        key: &str,
        range: Range<u64>,
        etag: &str,
    ) -> Result<Bytes, ClientError> {
        // Only reads pinned to an ETag can be cached safely.
        if etag.is_empty() {
            return below.read(key, range, etag).await;
        }
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let bs = self.block_size;
        let (first, last) = (range.start / bs, (range.end - 1) / bs);
        let object = Arc::new(self.blocks_of(below.bucket(), key, etag));
        let any_held = (first..=last).any(|i| object.cache.holds(&object.id(i)));
        let mut blocks = if any_held {
            Arc::clone(&object).cached(first, last).await
        } else {
            // Counted as the misses the lookup would have counted.
            object.count_misses(last - first + 1);
            vec![None; (last - first + 1) as usize]
        };
        if blocks.iter().all(Option::is_none) {
            // Nothing cached (a cold read, the whole of a warm-up): one GET, and its bytes are the answer
            // as they are, not copied into a new buffer.
            let start = first * bs;
            let underway = self.fetching.reading(key, etag, first..last + 1);
            let data = below.read(key, start..(last + 1) * bs, etag).await?;
            Arc::clone(&object).store(first, data.clone(), underway);
            let to = ((range.end - start) as usize).min(data.len());
            let from = ((range.start - start) as usize).min(to);
            // A slice keeps the whole buffer alive for as long as the reader holds it, and the memory budget
            // counted only what was asked for: a small read (random, or a lookup's first bytes) of a big
            // block is copied out so the block's buffer goes once it is stored.
            if (to - from) * 2 < data.len() {
                return Ok(Bytes::copy_from_slice(&data[from..to]));
            }
            return Ok(data.slice(from..to));
        }
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
            let underway = self
                .fetching
                .reading(key, etag, first + i as u64..first + j as u64 + 1);
            let data = below.read(key, start..end, etag).await?;
            Arc::clone(&object).store(first + i as u64, data.clone(), underway);
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
        // A part read back from the cache: its buffer lent from the pool, as a GET's is.
        let mut out = crate::buffers::take((range.end - range.start) as usize);
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
        Ok(crate::buffers::pooled(out))
    }

    /// Fetches the runs of blocks the disk does not hold, one GET each, and waits for their writes. Blocks
    /// another fetch has under way (a small file's GET starts at open) are waited for, not fetched twice;
    /// parts of one warm-up claim disjoint blocks and run side by side.
    async fn keep(
        &self,
        below: &dyn ReadSource,
        key: &str,
        range: Range<u64>,
        etag: &str,
    ) -> Result<bool, ClientError> {
        if etag.is_empty() {
            return below.keep(key, range, etag).await;
        }
        if range.is_empty() {
            return Ok(true);
        }
        let bs = self.block_size;
        let blocks = range.start / bs..(range.end - 1) / bs + 1;
        let object = Arc::new(self.blocks_of(below.bucket(), key, etag));
        loop {
            let landed = self.fetching.landed();
            tokio::pin!(landed);
            // Before the claim: blocks landing between the claim and the wait still wake it.
            landed.as_mut().enable();
            let claim = self.fetching.claim(key, etag, blocks.clone(), |i| {
                object.cache.holds(&object.id(i))
            });
            for run in claim.runs {
                let Range { start, end } = run.blocks();
                object.count_misses(end - start);
                let data = below.read(key, start * bs..end * bs, etag).await?;
                // A write that failed (a full disk) is counted by the cache and is no error of the warm-up's.
                let _ = Arc::clone(&object).store(start, data, run).await;
            }
            if !claim.others_under_way {
                return Ok(true);
            }
            // Claimed again once they land: written then, or to be fetched here if that fetch failed.
            landed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::fake::{FakeClient, Op};
    use crate::s3::{ObjectClient, WriteCondition};
    use crate::source::{BucketSource, Cached};
    use std::sync::atomic::Ordering;

    /// A fake bucket holding `len` patterned bytes as "k", and a disk cache of 64 KiB blocks stacked on it.
    async fn cached_object(
        len: u32,
    ) -> (
        Arc<FakeClient>,
        String,
        Vec<u8>,
        tempfile::TempDir,
        Arc<DiskCache>,
        Cached<BlockCache>,
    ) {
        let fake = Arc::new(FakeClient::new("b", true));
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let etag = fake
            .put_object("k", Bytes::from(data.clone()), WriteCondition::None)
            .await
            .unwrap()
            .etag;
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(DiskCache::open_with(dir.path(), 1 << 30, false).unwrap());
        let c = Cached::new(
            BlockCache::new(Arc::clone(&cache), 64 * 1024),
            BucketSource::shared(fake.clone()),
        );
        (fake, etag, data, dir, cache, c)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn second_read_is_served_from_disk() {
        let (fake, etag, data, _dir, cache, c) = cached_object(300_000).await;
        for (s, e) in [(0u64, 300_000u64), (70_000, 200_001), (299_990, 300_000)] {
            assert_eq!(
                &c.read("k", s..e, &etag).await.unwrap()[..],
                &data[s as usize..e as usize]
            );
        }
        // Let the background writes land, then read everything again without the bucket.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let before = fake.counts();
        assert_eq!(
            &c.read("k", 5..299_999, &etag).await.unwrap()[..],
            &data[5..299_999]
        );
        assert_eq!(fake.counts(), before, "went to the bucket");
        assert!(cache.counters.hits.load(Ordering::Relaxed) >= 5);
        assert!(Arc::ptr_eq(c.layer().cache(), &cache));
    }

    /// A small read of a block not cached yet is its own buffer, not a slice that keeps the whole block
    /// alive (and uncounted) for as long as the reader holds it.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_small_cold_read_holds_only_its_own_bytes() {
        let (_fake, etag, data, _dir, _cache, c) = cached_object(300_000).await;
        let small = c.read("k", 70_000..72_000, &etag).await.unwrap();
        assert_eq!(&small[..], &data[70_000..72_000]);
        let own = small.try_into_mut().expect("a buffer of its own");
        assert!(own.capacity() < 16 * 1024, "{}", own.capacity());
        // A read of most of a block is the block's own buffer, not copied.
        let big = c.read("k", 131_072..190_000, &etag).await.unwrap();
        assert_eq!(&big[..], &data[131_072..190_000]);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn keep_fetches_only_what_is_missing_and_returns_once_it_is_written() {
        let (fake, etag, data, _dir, cache, c) = cached_object(1_000_000).await;
        // Blocks 2 and 3 read (and written in the background) first.
        c.read("k", 150_000..250_000, &etag).await.unwrap();
        let before = fake.counts();
        assert!(c.keep("k", 0..1_000_000, &etag).await.unwrap());
        // The read's blocks were waited for, not fetched again: one run before them, one after.
        let sent = fake.counts().since(&before);
        assert_eq!((sent.get(Op::Get), sent.total()), (2, 2));
        // Every block is on disk when keep returns: the whole object reads back without the bucket.
        let before = fake.counts();
        for block in 0..16 {
            assert!(cache.holds(&BlockId {
                bucket: "b",
                key: "k",
                etag: &etag,
                index: block,
                block_size: 64 * 1024
            }));
        }
        assert_eq!(
            &c.read("k", 0..1_000_000, &etag).await.unwrap()[..],
            &data[..]
        );
        assert!(c.keep("k", 0..1_000_000, &etag).await.unwrap());
        assert_eq!(fake.counts(), before, "kept already: no request");
        // Without a cache there is nothing to keep bytes in, and nothing is fetched.
        let bucket = BucketSource::shared(fake.clone());
        assert!(!bucket.keep("k", 0..1_000_000, &etag).await.unwrap());
        assert_eq!(fake.counts(), before);
    }
}
