//! Where the read path gets its bytes: a [`ReadSource`] answers ETag-pinned ranged reads and the lookup's
//! head-with-first-bytes, and nothing else.
//!
//! The bucket is a source ([`BucketSource`]); a cache is a [`CacheLayer`] stacked on the source below it by
//! [`Cached`], itself a source, so caches stack in any order without posing as object clients. The file system
//! core holds a [`ReadSources`] pair and picks one at open (O_DIRECT skips the caches), so it never knows
//! which caches exist. It is its own module, not part of [`crate::cache`] or [`crate::fs`], because both
//! depend on it (the caches implement [`CacheLayer`], the core reads through [`ReadSource`]) and the core must
//! not depend on the caches.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::s3::{ClientError, ObjectClient, ObjectInfo, first_bytes_of};

/// The reads of object data the file system makes.
#[async_trait]
pub trait ReadSource: Send + Sync + 'static {
    /// Bucket the bytes come from: caches make it part of every entry's identity.
    fn bucket(&self) -> &str;

    /// The object's current metadata, from the bucket (never cached: a cache is keyed by the ETag it gives).
    async fn head(&self, key: &str) -> Result<ObjectInfo, ClientError>;

    /// Exactly the bytes of `range` (clamped to the object's size) of the version of `key` with this ETag,
    /// or an error ([`ClientError::PreconditionFailed`] once the object was replaced); never a short body.
    async fn read(&self, key: &str, range: Range<u64>, etag: &str) -> Result<Bytes, ClientError>;

    /// The lookup's question: the object's metadata and its first `len` bytes (fewer for a smaller object,
    /// none if they could not be had).
    async fn first_bytes(&self, key: &str, len: u64) -> Result<(ObjectInfo, Bytes), ClientError>;

    /// For a warm-up: makes a cache hold the bytes of `range` of this version, fetching only what none holds
    /// yet, and returns once they are kept. Nothing comes back and nothing already held is read. `false`
    /// when there is no cache to keep them in (nothing is fetched then).
    async fn keep(&self, key: &str, range: Range<u64>, etag: &str) -> Result<bool, ClientError>;
}

/// The bucket itself as a source.
pub struct BucketSource {
    client: Arc<dyn ObjectClient>,
}

impl BucketSource {
    pub fn shared(client: Arc<dyn ObjectClient>) -> Arc<dyn ReadSource> {
        Arc::new(BucketSource { client })
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl ReadSource for BucketSource {
    fn bucket(&self) -> &str {
        self.client.bucket()
    }

    async fn head(&self, key: &str) -> Result<ObjectInfo, ClientError> {
        self.client.head_object(key).await
    }

    async fn read(&self, key: &str, range: Range<u64>, etag: &str) -> Result<Bytes, ClientError> {
        self.client.get_object(key, range, Some(etag)).await
    }

    /// The client's own answer: one ranged GET from the SDK client.
    async fn first_bytes(&self, key: &str, len: u64) -> Result<(ObjectInfo, Bytes), ClientError> {
        self.client.head_with_first_bytes(key, len).await
    }

    /// The bucket keeps nothing for anyone.
    async fn keep(&self, _key: &str, _range: Range<u64>, _etag: &str) -> Result<bool, ClientError> {
        Ok(false)
    }
}

/// What a cache does: serve a read from what it holds, asking `below` for what it lacks (and keeping it).
#[async_trait]
pub trait CacheLayer: Send + Sync + 'static {
    async fn read(
        &self,
        below: &dyn ReadSource,
        key: &str,
        range: Range<u64>,
        etag: &str,
    ) -> Result<Bytes, ClientError>;

    /// [`ReadSource::keep`] through this cache.
    async fn keep(
        &self,
        below: &dyn ReadSource,
        key: &str,
        range: Range<u64>,
        etag: &str,
    ) -> Result<bool, ClientError>;
}

/// A cache stacked on the source below it. Everything but the data passes to `below`, here once for every
/// cache, so that a cache holds only its own logic.
pub struct Cached<L> {
    layer: L,
    below: Arc<dyn ReadSource>,
}

impl<L: CacheLayer> Cached<L> {
    pub fn new(layer: L, below: Arc<dyn ReadSource>) -> Cached<L> {
        Cached { layer, below }
    }

    /// The cache itself (for its counters).
    pub fn layer(&self) -> &L {
        &self.layer
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<L: CacheLayer> ReadSource for Cached<L> {
    fn bucket(&self) -> &str {
        self.below.bucket()
    }

    async fn head(&self, key: &str) -> Result<ObjectInfo, ClientError> {
        self.below.head(key).await
    }

    async fn read(&self, key: &str, range: Range<u64>, etag: &str) -> Result<Bytes, ClientError> {
        self.layer.read(self.below.as_ref(), key, range, etag).await
    }

    /// HEAD, then the first bytes through this cache: two requests where the bucket alone needs one, but a
    /// cached start of the file costs no GET.
    async fn first_bytes(&self, key: &str, len: u64) -> Result<(ObjectInfo, Bytes), ClientError> {
        let info = self.head(key).await?;
        let bytes = first_bytes_of(&info, len, |range| self.read(key, range, &info.etag)).await;
        Ok((info, bytes))
    }

    async fn keep(&self, key: &str, range: Range<u64>, etag: &str) -> Result<bool, ClientError> {
        self.layer.keep(self.below.as_ref(), key, range, etag).await
    }
}

/// The two ways a file's bytes are read: through the caches, or straight from the bucket (O_DIRECT, which
/// asks for what is in the bucket now).
#[derive(Clone)]
pub struct ReadSources {
    pub cached: Arc<dyn ReadSource>,
    pub direct: Arc<dyn ReadSource>,
}

impl ReadSources {
    /// No caches: both ways read the bucket.
    pub fn bucket(client: Arc<dyn ObjectClient>) -> ReadSources {
        let source = BucketSource::shared(client);
        ReadSources {
            cached: Arc::clone(&source),
            direct: source,
        }
    }

    /// The source for a file opened with (`direct`) or without O_DIRECT.
    pub fn for_open(&self, direct: bool) -> &Arc<dyn ReadSource> {
        if direct { &self.direct } else { &self.cached }
    }

    /// Whether any cache is stacked on the bucket (else both ways are the bucket itself).
    pub fn has_caches(&self) -> bool {
        !Arc::ptr_eq(&self.cached, &self.direct)
    }

    /// The source lookups fetch first bytes from: those bytes serve later opens without O_DIRECT.
    pub fn for_lookup(&self) -> &dyn ReadSource {
        self.cached.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::WriteCondition;
    use crate::s3::fake::{FakeClient, Op, transient};
    use std::sync::Mutex;

    /// A cache that holds nothing and records what it was asked for.
    #[derive(Default)]
    struct Recorder {
        reads: Mutex<Vec<(String, Range<u64>, String)>>,
    }

    #[async_trait]
    impl CacheLayer for Recorder {
        async fn read(
            &self,
            below: &dyn ReadSource,
            key: &str,
            range: Range<u64>,
            etag: &str,
        ) -> Result<Bytes, ClientError> {
            let asked = (key.to_string(), range.clone(), etag.to_string());
            self.reads.lock().unwrap().push(asked);
            below.read(key, range, etag).await
        }

        async fn keep(
            &self,
            below: &dyn ReadSource,
            key: &str,
            range: Range<u64>,
            etag: &str,
        ) -> Result<bool, ClientError> {
            below.keep(key, range, etag).await
        }
    }

    async fn bucket_with(data: &'static [u8]) -> (Arc<FakeClient>, String) {
        let fake = Arc::new(FakeClient::new("b", true));
        let etag = fake
            .put_object("k", Bytes::from_static(data), WriteCondition::None)
            .await
            .unwrap()
            .etag;
        (fake, etag)
    }

    #[tokio::test]
    async fn a_cache_sees_the_reads_and_the_lookups_first_bytes_but_not_direct_reads() {
        let (fake, etag) = bucket_with(b"0123456789").await;
        let bucket = BucketSource::shared(fake.clone());
        let cached = Arc::new(Cached::new(Recorder::default(), Arc::clone(&bucket)));
        let sources = ReadSources {
            cached: cached.clone(),
            direct: bucket,
        };
        assert_eq!(sources.for_lookup().bucket(), "b");

        let (info, first) = sources.for_lookup().first_bytes("k", 4).await.unwrap();
        assert_eq!(
            (info.size, &info.etag, &first[..]),
            (10, &etag, &b"0123"[..])
        );
        let read = sources.for_open(false);
        assert_eq!(
            &read.read("k", 2..20, &etag).await.unwrap()[..],
            b"23456789"
        );
        let direct = sources.for_open(true);
        assert_eq!(&direct.read("k", 5..7, &etag).await.unwrap()[..], b"56");

        let seen = cached.layer().reads.lock().unwrap().clone();
        assert_eq!(
            seen,
            [("k".into(), 0..4, etag.clone()), ("k".into(), 2..20, etag)],
            "the first bytes and the cached read go through the cache, the direct read does not"
        );
    }

    #[tokio::test]
    async fn first_bytes_of_an_empty_object_ask_only_the_head() {
        let (fake, _) = bucket_with(b"").await;
        let cached = Cached::new(Recorder::default(), BucketSource::shared(fake.clone()));
        let before = fake.counts();
        let (info, first) = cached.first_bytes("k", 4).await.unwrap();
        assert_eq!((info.size, first.len()), (0, 0));
        let sent = fake.counts().since(&before);
        assert_eq!((sent.get(Op::Head), sent.total()), (1, 1));
        assert!(cached.layer().reads.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_failed_read_of_the_first_bytes_keeps_the_head() {
        let (fake, etag) = bucket_with(b"abc").await;
        let cached = Cached::new(Recorder::default(), BucketSource::shared(fake.clone()));
        fake.faults().fail_next(Op::Get, 1, transient());
        let (info, first) = cached.first_bytes("k", 4).await.unwrap();
        assert_eq!((info.size, info.etag, first.len()), (3, etag, 0));
        assert!(matches!(
            cached.first_bytes("missing", 4).await,
            Err(ClientError::NotFound { .. })
        ));
    }
}
