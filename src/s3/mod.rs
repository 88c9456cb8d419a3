//! Object client layer: the only part of the daemon that talks to S3.
//!
//! The file system core depends on the [`ObjectClient`] trait, never on aws-sdk-s3 directly, so unit tests can
//! run the core against the in-memory `fake::FakeClient` (built only for tests: `cfg(test)` or the `testing`
//! feature) and caches can wrap any client as a layer.
//! One client instance serves exactly one bucket.

pub mod error;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod sdk;

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;

pub use error::ClientError;

/// Largest source a single CopyObject may copy (5 GB, the service's limit); larger ones need UploadPartCopy.
pub const MAX_COPY_OBJECT_SIZE: u64 = 5_000_000_000;

/// An object's user metadata: the `x-amz-meta-*` headers, keyed by the lowercase name after the prefix.
pub type UserMetadata = BTreeMap<String, String>;

/// Metadata of one object as returned by HeadObject or ListObjectsV2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    /// Quoted ETag exactly as the service sent it (directory-bucket ETags are not MD5: treat as opaque).
    pub etag: String,
    pub last_modified: SystemTime,
    /// User metadata from HEAD or GET; always empty from a listing, which carries none.
    pub metadata: UserMetadata,
}

/// `Last-Modified` in whole seconds. HEAD and GET carry it as an HTTP date, in seconds; some servers (MinIO
/// among them) list it with milliseconds. Taken as listed, a file's mtime would move each time a listing or a
/// HEAD refreshed it, and `rsync -a` or `make` would see a change that never happened.
pub fn whole_seconds(t: SystemTime) -> SystemTime {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(since) => SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(since.as_secs()),
        Err(_) => t,
    }
}

/// One page of ListObjectsV2 results. Order is whatever the service returned (unordered on directory buckets).
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    pub objects: Vec<ObjectInfo>,
    /// Full common prefixes as returned, each ending in the delimiter.
    pub common_prefixes: Vec<String>,
    pub next_continuation_token: Option<String>,
}

/// Preconditions for writes (conditional PUT / complete / rename).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WriteCondition {
    /// Unconditional overwrite.
    #[default]
    None,
    /// `If-None-Match: *`: fail with [`ClientError::PreconditionFailed`] if the key exists.
    IfNoneMatch,
    /// `If-Match: <etag>`: fail unless the current object has this ETag.
    IfMatch(String),
}

/// Additional checksum algorithm sent with uploads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UploadChecksum {
    #[default]
    Crc32c,
    Crc64Nvme,
    Off,
}

/// Result of a completed upload (PutObject, CompleteMultipartUpload or an append).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutResult {
    pub etag: String,
    /// Size of the object after the write, when the service reports it or it is known.
    pub size: Option<u64>,
}

/// One uploaded part, as needed by CompleteMultipartUpload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadedPart {
    pub part_number: i32,
    pub etag: String,
    /// Base64 checksum returned/sent for this part, if checksums are on.
    pub checksum: Option<String>,
}

/// HEAD, then a GET of the first `len` bytes pinned to its ETag. The bytes are optional: a GET that fails
/// (the object replaced in between, say) leaves the answer of the HEAD, and the open will fetch.
pub async fn head_then_first_bytes<C: ObjectClient + ?Sized>(
    client: &C,
    key: &str,
    len: u64,
) -> Result<(ObjectInfo, Bytes), ClientError> {
    let info = client.head_object(key).await?;
    let bytes = first_bytes_of(&info, len, |range| {
        client.get_object(key, range, Some(&info.etag))
    })
    .await;
    Ok((info, bytes))
}

/// The first `len` bytes of the object `info` describes, fetched by `get` (which pins them to its ETag): none
/// asked for an empty object, and none kept when the GET fails (the caller keeps the HEAD's answer).
pub async fn first_bytes_of<F, Fut>(info: &ObjectInfo, len: u64, get: F) -> Bytes
where
    F: FnOnce(Range<u64>) -> Fut,
    Fut: std::future::Future<Output = Result<Bytes, ClientError>>,
{
    match len.min(info.size) {
        0 => Bytes::new(),
        end => get(0..end).await.unwrap_or_default(),
    }
}

/// The object-storage operations the file system needs, for one bucket.
///
/// Implementations must never return a short or partial body: `get_object` either returns exactly
/// `range.end - range.start` bytes (clamped to the object size) or an error.
#[async_trait]
pub trait ObjectClient: Send + Sync + 'static {
    /// Bucket this client is bound to (for logs and cache keys).
    fn bucket(&self) -> &str;

    /// True when the bucket is a directory bucket (S3 Express One Zone).
    fn is_directory_bucket(&self) -> bool;

    /// HeadBucket: used at mount time to fail early with a clear message.
    async fn head_bucket(&self) -> Result<(), ClientError>;

    async fn head_object(&self, key: &str) -> Result<ObjectInfo, ClientError>;

    /// The object's metadata and its first `len` bytes (fewer if the object is smaller). Lookups use it: a
    /// ranged GET answers with the size, ETag and date a HEAD gives, so opening and reading a small file
    /// afterwards needs no request of its own. This default asks twice (HEAD, then a GET pinned to the ETag),
    /// which keeps cache layers in front of the GET; the SDK client asks once.
    async fn head_with_first_bytes(
        &self,
        key: &str,
        len: u64,
    ) -> Result<(ObjectInfo, Bytes), ClientError> {
        head_then_first_bytes(self, key, len).await
    }

    /// One ListObjectsV2 page. `delimiter` is `Some("/")` or `None`; on directory buckets `prefix` must be empty
    /// or end in `/`.
    async fn list_objects(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        continuation_token: Option<&str>,
        max_keys: i32,
    ) -> Result<ListPage, ClientError>;

    /// Ranged GET. `if_match` pins the read to an ETag so a replaced object yields
    /// [`ClientError::PreconditionFailed`] instead of mixed bytes.
    async fn get_object(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<Bytes, ClientError>;

    async fn put_object(
        &self,
        key: &str,
        body: Bytes,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        self.put_object_with_metadata(key, body, condition, &UserMetadata::new())
            .await
    }

    /// PutObject that stores `metadata` as the new object's user metadata.
    async fn put_object_with_metadata(
        &self,
        key: &str,
        body: Bytes,
        condition: WriteCondition,
        metadata: &UserMetadata,
    ) -> Result<PutResult, ClientError>;

    /// Directory buckets only: PutObject with `x-amz-write-offset-bytes` (append at `offset`, which must equal
    /// the current size). `condition` is normally `IfMatch(etag)` of the object being appended to.
    async fn append_object(
        &self,
        key: &str,
        offset: u64,
        body: Bytes,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError>;

    /// Returns the upload id.
    async fn create_multipart_upload(&self, key: &str) -> Result<String, ClientError> {
        self.create_multipart_upload_with_metadata(key, &UserMetadata::new())
            .await
    }

    /// CreateMultipartUpload whose completed object carries `metadata`. Returns the upload id.
    async fn create_multipart_upload_with_metadata(
        &self,
        key: &str,
        metadata: &UserMetadata,
    ) -> Result<String, ClientError>;

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        part_number: i32,
        body: Bytes,
    ) -> Result<UploadedPart, ClientError>;

    /// UploadPartCopy: part `part_number` of `upload_id` (for `key`) becomes bytes `range` of `source_key`,
    /// copied server-side (no data through us), only while the source's ETag is `source_etag`: otherwise
    /// [`ClientError::PreconditionFailed`]. The service copies a range only from a source over 5 MiB.
    #[allow(clippy::too_many_arguments)]
    async fn upload_part_copy(
        &self,
        key: &str,
        upload_id: &str,
        part_number: i32,
        source_key: &str,
        range: Range<u64>,
        source_etag: &str,
    ) -> Result<UploadedPart, ClientError>;

    async fn complete_multipart_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<UploadedPart>,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError>;

    async fn abort_multipart_upload(&self, key: &str, upload_id: &str) -> Result<(), ClientError>;

    async fn delete_object(&self, key: &str) -> Result<(), ClientError>;

    /// Server-side CopyObject of `source_key` to `destination_key` in this bucket (no bytes pass through
    /// us). `destination_condition` applies to the destination (`IfNoneMatch` refuses to replace an object);
    /// `source_if_match` copies only that version of the source. Either refusing gives
    /// [`ClientError::PreconditionFailed`], naming the source when only the source had a condition. The
    /// service copies at most [`MAX_COPY_OBJECT_SIZE`] bytes this way.
    async fn copy_object(
        &self,
        source_key: &str,
        source_if_match: Option<&str>,
        destination_key: &str,
        destination_condition: WriteCondition,
    ) -> Result<PutResult, ClientError>;

    /// Replaces the user metadata of `key` server-side (CopyObject onto itself with the REPLACE directive; no
    /// data through us), only while its ETag is `if_match`: otherwise [`ClientError::PreconditionFailed`].
    /// The object gets a new ETag and modification date; appends on directory buckets keep the metadata.
    async fn replace_metadata(
        &self,
        key: &str,
        metadata: &UserMetadata,
        if_match: &str,
    ) -> Result<PutResult, ClientError>;

    /// Directory buckets only: atomic RenameObject. `destination_condition` applies to the destination key
    /// (`IfNoneMatch` refuses to replace an existing object).
    async fn rename_object(
        &self,
        source_key: &str,
        destination_key: &str,
        destination_condition: WriteCondition,
    ) -> Result<(), ClientError>;
}
