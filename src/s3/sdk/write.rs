//! Uploads, multipart uploads, append and rename.
//!
//! Checksums are computed here, over the bytes we hold, and sent as `x-amz-checksum-*` headers: the service
//! (and the emulator) verifies them, the SDK sends exactly what we computed on every retry, and the part
//! checksums needed by CompleteMultipartUpload are known without relying on the server echoing them.
//!
//! A body that carries such a checksum is sent with `UNSIGNED-PAYLOAD`: the checksum already guards the bytes,
//! and a SHA-256 of every part for the signature would cost both ends a second pass over the data (Mountpoint
//! uploads the same way). With `--upload-checksums off` the payload stays signed, so some hash always covers it.

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    ChecksumAlgorithm, ChecksumType, CompletedMultipartUpload, CompletedPart, MetadataDirective,
    ServerSideEncryption, StorageClass,
};
use bytes::Bytes;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use tracing::warn;

use super::landed::{Attempts, may_be_own_write};
use super::{SdkClient, non_negative};
use crate::s3::{
    ClientError, PutResult, UploadChecksum, UploadedPart, UserMetadata, WriteCondition,
};

/// Characters left as they are in the rename source: RFC 3986 unreserved plus the key's `/` separators.
const RENAME_SOURCE_KEEP: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// The checksum of one upload body, ready for the request headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BodyChecksum {
    algorithm: UploadChecksum,
    /// Base64 of the big-endian checksum, as S3 expects in `x-amz-checksum-*`.
    value: String,
}

pub(super) fn body_checksum(algorithm: UploadChecksum, body: &[u8]) -> Option<BodyChecksum> {
    let smithy = match algorithm {
        UploadChecksum::Crc32c => aws_smithy_checksums::ChecksumAlgorithm::Crc32c,
        UploadChecksum::Crc64Nvme => aws_smithy_checksums::ChecksumAlgorithm::Crc64Nvme,
        UploadChecksum::Off => return None,
    };
    let mut hasher = smithy.into_impl();
    hasher.update(body);
    Some(BodyChecksum {
        algorithm,
        value: aws_smithy_types::base64::encode(hasher.finalize()),
    })
}

fn sdk_algorithm(algorithm: UploadChecksum) -> Option<ChecksumAlgorithm> {
    match algorithm {
        UploadChecksum::Crc32c => Some(ChecksumAlgorithm::Crc32C),
        UploadChecksum::Crc64Nvme => Some(ChecksumAlgorithm::Crc64Nvme),
        UploadChecksum::Off => None,
    }
}

/// Sets what every new object gets from the flags (`--sse`, `--sse-kms-key-id`, `--storage-class`) on a
/// request builder that creates one (PutObject, CreateMultipartUpload, CopyObject: a copy without them
/// would fall back to the bucket's defaults).
macro_rules! with_object_settings {
    ($request:expr, $config:expr) => {{
        let config = $config;
        $request
            .set_server_side_encryption(config.sse.as_deref().map(ServerSideEncryption::from))
            .set_ssekms_key_id(config.sse_kms_key_id.clone())
            .set_storage_class(config.storage_class.as_deref().map(StorageClass::from))
    }};
}

/// `--infer-content-type`: the type the key's extension names, None (the service's default) otherwise.
pub(super) fn content_type(infer: bool, key: &str) -> Option<String> {
    if !infer {
        return None;
    }
    let name = key.rsplit('/').next().unwrap_or(key);
    mime_guess::from_path(name).first_raw().map(str::to_string)
}

/// Sets the checksum fields of a request builder that has `checksum_algorithm`, `checksum_crc32_c` and
/// `checksum_crc64_nvme` setters (PutObject, UploadPart).
macro_rules! with_checksum {
    ($request:expr, $checksum:expr) => {{
        let request = $request;
        match $checksum {
            None => request,
            Some(c) => match c.algorithm {
                UploadChecksum::Crc32c => request
                    .checksum_algorithm(ChecksumAlgorithm::Crc32C)
                    .checksum_crc32_c(c.value.clone()),
                UploadChecksum::Crc64Nvme => request
                    .checksum_algorithm(ChecksumAlgorithm::Crc64Nvme)
                    .checksum_crc64_nvme(c.value.clone()),
                UploadChecksum::Off => request,
            },
        }
    }};
}

/// Adds the upload timeouts and, when the body carries a checksum, skips the payload hash in the signature.
/// For `put_object` and `upload_part` builders (the operations that have `disable_payload_signing`).
macro_rules! customize_upload {
    ($request:expr, $checksum:expr, $timeouts:expr) => {{
        let request = $request.customize().config_override($timeouts);
        if $checksum.is_some() {
            request.disable_payload_signing()
        } else {
            request
        }
    }};
}

/// Sets If-Match / If-None-Match on a request builder with `if_match` and `if_none_match` setters.
macro_rules! with_condition {
    ($request:expr, $condition:expr) => {{
        let request = $request;
        match $condition {
            WriteCondition::None => request,
            WriteCondition::IfNoneMatch => request.if_none_match("*"),
            WriteCondition::IfMatch(etag) => request.if_match(etag.clone()),
        }
    }};
}

impl SdkClient {
    pub(super) async fn put(
        &self,
        key: &str,
        body: Bytes,
        condition: WriteCondition,
        metadata: &UserMetadata,
    ) -> Result<PutResult, ClientError> {
        let size = body.len() as u64;
        let checksum = body_checksum(self.config.upload_checksum, &body);
        let attempts = Attempts::default();
        let put = self
            .again_after_conflict(|| {
                self.run(|client| {
                    let request = client
                        .put_object()
                        .bucket(&self.config.bucket)
                        .key(key)
                        .set_metadata(sdk_metadata(metadata))
                        .set_content_type(content_type(self.config.infer_content_type, key))
                        .body(ByteStream::from(body.clone()));
                    let request = with_object_settings!(request, &self.config);
                    let request = with_condition!(with_checksum!(request, &checksum), &condition);
                    let request = customize_upload!(request, checksum, self.upload_timeouts())
                        .interceptor(attempts.clone());
                    async move {
                        let out = request.send().await.map_err(self.map_err(key))?;
                        Ok(PutResult {
                            etag: required_etag(out.e_tag(), "PutObject", key)?,
                            size: Some(size),
                        })
                    }
                })
            })
            .await;
        match put {
            Err(e) if condition != WriteCondition::None && may_be_own_write(&e, &attempts) => {
                self.landed_or(key, 0, &body, e).await
            }
            put => put,
        }
    }

    pub(super) async fn append(
        &self,
        key: &str,
        offset: u64,
        body: Bytes,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        if !self.config.is_directory_bucket {
            return Err(ClientError::NotSupported(
                "append needs a directory bucket".into(),
            ));
        }
        let offset_header = i64::try_from(offset).map_err(|_| ClientError::InvalidWriteOffset {
            key: key.to_string(),
            message: format!("offset {offset}"),
        })?;
        let expected_size = offset + body.len() as u64;
        let checksum = body_checksum(self.config.upload_checksum, &body);
        let attempts = Attempts::default();
        let appended = self
            .run(|client| {
                let request = client
                    .put_object()
                    .bucket(&self.config.bucket)
                    .key(key)
                    .write_offset_bytes(offset_header)
                    .body(ByteStream::from(body.clone()));
                let request = with_condition!(with_checksum!(request, &checksum), &condition);
                let request = customize_upload!(request, checksum, self.upload_timeouts())
                    .interceptor(attempts.clone());
                async move {
                    let out = request.send().await.map_err(self.map_err(key))?;
                    let size = non_negative(out.size()).unwrap_or(expected_size);
                    Ok(PutResult {
                        etag: required_etag(out.e_tag(), "PutObject(append)", key)?,
                        size: Some(size),
                    })
                }
            })
            .await;
        match appended {
            Err(e) if may_be_own_write(&e, &attempts) => {
                self.landed_or(key, offset, &body, e).await
            }
            appended => appended,
        }
    }

    pub(super) async fn create_upload(
        &self,
        key: &str,
        metadata: &UserMetadata,
    ) -> Result<String, ClientError> {
        let algorithm = sdk_algorithm(self.config.upload_checksum);
        // CRC64NVME exists only as a full-object checksum on S3.
        let checksum_type = (self.config.upload_checksum == UploadChecksum::Crc64Nvme)
            .then_some(ChecksumType::FullObject);
        self.run(|client| {
            let request = client
                .create_multipart_upload()
                .bucket(&self.config.bucket)
                .key(key)
                .set_metadata(sdk_metadata(metadata))
                .set_content_type(content_type(self.config.infer_content_type, key))
                .set_checksum_algorithm(algorithm.clone())
                .set_checksum_type(checksum_type.clone());
            let request = with_object_settings!(request, &self.config);
            async move {
                let out = request.send().await.map_err(self.map_err(key))?;
                out.upload_id()
                    .filter(|id| !id.is_empty())
                    .map(str::to_string)
                    .ok_or_else(|| {
                        ClientError::Malformed(format!("CreateMultipartUpload {key}: no UploadId"))
                    })
            }
        })
        .await
    }

    pub(super) async fn put_part(
        &self,
        key: &str,
        upload_id: &str,
        part_number: i32,
        body: Bytes,
    ) -> Result<UploadedPart, ClientError> {
        let checksum = body_checksum(self.config.upload_checksum, &body);
        self.run(|client| {
            let request = client
                .upload_part()
                .bucket(&self.config.bucket)
                .key(key)
                .upload_id(upload_id)
                .part_number(part_number)
                .body(ByteStream::from(body.clone()));
            let request = with_checksum!(request, &checksum);
            let request = customize_upload!(request, checksum, self.upload_timeouts());
            let sent_checksum = checksum.as_ref().map(|c| c.value.clone());
            async move {
                let out = request.send().await.map_err(self.map_err(key))?;
                Ok(UploadedPart {
                    part_number,
                    etag: required_etag(out.e_tag(), "UploadPart", key)?,
                    checksum: sent_checksum,
                })
            }
        })
        .await
    }

    /// UploadPartCopy of `range` of `source_key`, pinned to `source_etag`. The part's checksum, which
    /// CompleteMultipartUpload needs when the upload has an algorithm, comes from the service's answer: the
    /// bytes never pass through us.
    pub(super) async fn copy_part(
        &self,
        key: &str,
        upload_id: &str,
        part_number: i32,
        source_key: &str,
        range: std::ops::Range<u64>,
        source_etag: &str,
    ) -> Result<UploadedPart, ClientError> {
        let source = copy_source(&self.config.bucket, source_key);
        let bytes = format!("bytes={}-{}", range.start, range.end.saturating_sub(1));
        let algorithm = self.config.upload_checksum;
        self.run(|client| {
            let request = client
                .upload_part_copy()
                .bucket(&self.config.bucket)
                .key(key)
                .upload_id(upload_id)
                .part_number(part_number)
                .copy_source(source.clone())
                .copy_source_range(bytes.clone())
                .copy_source_if_match(source_etag)
                .customize()
                .config_override(self.upload_timeouts());
            async move {
                let out = request.send().await.map_err(self.map_err(source_key))?;
                let result = out.copy_part_result();
                let checksum = result.and_then(|r| match algorithm {
                    UploadChecksum::Crc32c => r.checksum_crc32_c(),
                    UploadChecksum::Crc64Nvme => r.checksum_crc64_nvme(),
                    UploadChecksum::Off => None,
                });
                Ok(UploadedPart {
                    part_number,
                    etag: required_etag(result.and_then(|r| r.e_tag()), "UploadPartCopy", key)?,
                    checksum: checksum.map(str::to_string),
                })
            }
        })
        .await
    }

    pub(super) async fn complete_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[UploadedPart],
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        let completed: Vec<CompletedPart> = parts
            .iter()
            .map(|p| {
                let part = CompletedPart::builder()
                    .part_number(p.part_number)
                    .e_tag(&p.etag);
                match self.config.upload_checksum {
                    UploadChecksum::Crc32c => part.set_checksum_crc32_c(p.checksum.clone()),
                    UploadChecksum::Crc64Nvme => part.set_checksum_crc64_nvme(p.checksum.clone()),
                    UploadChecksum::Off => part,
                }
                .build()
            })
            .collect();
        let upload = CompletedMultipartUpload::builder()
            .set_parts(Some(completed))
            .build();
        self.run(|client| {
            let request = client
                .complete_multipart_upload()
                .bucket(&self.config.bucket)
                .key(key)
                .upload_id(upload_id)
                .multipart_upload(upload.clone());
            let request = with_condition!(request, &condition);
            // S3 may take a while to assemble a large object: give it the upload timeout.
            let request = request.customize().config_override(self.upload_timeouts());
            async move {
                let out = request.send().await.map_err(self.map_err(key))?;
                Ok(PutResult {
                    etag: required_etag(out.e_tag(), "CompleteMultipartUpload", key)?,
                    size: None,
                })
            }
        })
        .await
    }

    pub(super) async fn abort_upload(&self, key: &str, upload_id: &str) -> Result<(), ClientError> {
        self.run(|client| {
            let request = client
                .abort_multipart_upload()
                .bucket(&self.config.bucket)
                .key(key)
                .upload_id(upload_id);
            async move { request.send().await.map(|_| ()).map_err(self.map_err(key)) }
        })
        .await
    }

    pub(super) async fn copy(
        &self,
        source_key: &str,
        source_if_match: Option<&str>,
        destination_key: &str,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        let source = copy_source(&self.config.bucket, source_key);
        let attempts = Attempts::default();
        let result = self
            .again_after_conflict(|| {
                self.run(|client| {
                    let request = client
                        .copy_object()
                        .bucket(&self.config.bucket)
                        .key(destination_key)
                        .copy_source(source.clone())
                        .set_copy_source_if_match(source_if_match.map(str::to_string));
                    let request = with_object_settings!(request, &self.config);
                    let request = with_condition!(request, &condition);
                    let request = request
                        .customize()
                        .config_override(self.upload_timeouts())
                        .interceptor(attempts.clone());
                    async move {
                        let out = request.send().await.map_err(self.map_err(source_key))?;
                        let etag = out.copy_object_result().and_then(|r| r.e_tag());
                        Ok(PutResult {
                            etag: required_etag(etag, "CopyObject", destination_key)?,
                            size: None,
                        })
                    }
                })
            })
            .await;
        let result = match result {
            Err(e @ ClientError::PreconditionFailed { .. })
                if condition != WriteCondition::None && attempts.went_unanswered() =>
            {
                self.copy_landed_or(source_key, destination_key, e).await
            }
            result => result,
        };
        // A 412 does not say which side refused: name the source only when it alone had a condition.
        let refused = match (source_if_match, &condition) {
            (Some(_), WriteCondition::None) => source_key,
            _ => destination_key,
        };
        result.map_err(|e| match e {
            ClientError::PreconditionFailed { .. } => ClientError::PreconditionFailed {
                key: refused.to_string(),
            },
            other => other,
        })
    }

    pub(super) async fn replace_user_metadata(
        &self,
        key: &str,
        metadata: &UserMetadata,
        if_match: &str,
    ) -> Result<PutResult, ClientError> {
        let source = copy_source(&self.config.bucket, key);
        let attempts = Attempts::default();
        let replaced = self
            .again_after_conflict(|| {
                self.run(|client| {
                    // The source is the destination: its If-Match pins the object whose metadata we replace.
                    let request = client
                        .copy_object()
                        .bucket(&self.config.bucket)
                        .key(key)
                        .copy_source(source.clone())
                        .copy_source_if_match(if_match)
                        .metadata_directive(MetadataDirective::Replace)
                        .set_metadata(sdk_metadata(metadata))
                        // Replacing the metadata replaces the Content-Type too.
                        .set_content_type(content_type(self.config.infer_content_type, key));
                    let request = with_object_settings!(request, &self.config)
                        .customize()
                        .config_override(self.upload_timeouts())
                        .interceptor(attempts.clone());
                    async move {
                        let out = request.send().await.map_err(self.map_err(key))?;
                        let etag = out.copy_object_result().and_then(|r| r.e_tag());
                        Ok(PutResult {
                            etag: required_etag(etag, "CopyObject", key)?,
                            size: None,
                        })
                    }
                })
            })
            .await;
        match replaced {
            Err(e @ ClientError::PreconditionFailed { .. }) if attempts.went_unanswered() => {
                self.metadata_landed_or(key, metadata, e).await
            }
            replaced => replaced,
        }
    }

    /// Sends a conditional PutObject or CopyObject again after a 409 ConditionalRequestConflict, as the API
    /// references advise: another operation on the key ran while it was under way, which says nothing about
    /// who holds the key now (a delete may have raced it). The condition is checked anew, so a write that
    /// really lost gets its 412 then.
    async fn again_after_conflict<T, Fut>(&self, send: impl Fn() -> Fut) -> Result<T, ClientError>
    where
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        const TRIES: u32 = 4;
        let mut tries = 1;
        loop {
            match send().await {
                Err(ClientError::Conflict { key, .. }) if tries < TRIES => {
                    tries += 1;
                    warn!(
                        key,
                        tries, "conditional write raced by another operation; sending it again"
                    );
                    tokio::time::sleep(super::backoff_delay(tries)).await;
                }
                done => return done,
            }
        }
    }

    pub(super) async fn rename(
        &self,
        source_key: &str,
        destination_key: &str,
        condition: WriteCondition,
    ) -> Result<(), ClientError> {
        if !self.config.is_directory_bucket {
            return Err(ClientError::NotSupported(
                "RenameObject needs a directory bucket".into(),
            ));
        }
        let source = rename_source(source_key);
        // The SDK generates the idempotency token (x-amz-client-token) once per call and reuses it on retries,
        // so a retry after a lost answer succeeds instead of failing on the vanished source.
        let result = self
            .run(|client| {
                let request = client
                    .rename_object()
                    .bucket(&self.config.bucket)
                    .key(destination_key)
                    .rename_source(source.clone());
                let request = match &condition {
                    WriteCondition::None => request,
                    WriteCondition::IfNoneMatch => request.destination_if_none_match("*"),
                    WriteCondition::IfMatch(etag) => request.destination_if_match(etag.clone()),
                };
                let request = request.customize().config_override(self.upload_timeouts());
                async move {
                    request
                        .send()
                        .await
                        .map(|_| ())
                        .map_err(self.map_err(source_key))
                }
            })
            .await;
        // Our only preconditions are on the destination.
        result.map_err(|e| match e {
            ClientError::PreconditionFailed { .. } => ClientError::PreconditionFailed {
                key: destination_key.to_string(),
            },
            other => other,
        })
    }
}

/// `x-amz-copy-source`: bucket and key, URL-encoded, without a leading `/`.
/// `None` for no metadata, so requests without any stay as they were.
fn sdk_metadata(metadata: &UserMetadata) -> Option<std::collections::HashMap<String, String>> {
    (!metadata.is_empty()).then(|| {
        metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    })
}

pub(super) fn copy_source(bucket: &str, source_key: &str) -> String {
    format!(
        "{bucket}/{}",
        utf8_percent_encode(source_key, RENAME_SOURCE_KEEP)
    )
}

/// `x-amz-rename-source`: the source key in the same bucket, URL-encoded, with a leading `/` (as in the
/// RenameObject API examples; Mountpoint sends the bare key, which S3 also accepts).
pub(super) fn rename_source(source_key: &str) -> String {
    format!("/{}", utf8_percent_encode(source_key, RENAME_SOURCE_KEEP))
}

fn required_etag(etag: Option<&str>, op: &str, key: &str) -> Result<String, ClientError> {
    etag.filter(|e| !e.is_empty())
        .map(str::to_string)
        .ok_or_else(|| ClientError::Malformed(format!("{op} {key}: answer without ETag")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_match_known_values() {
        // CRC32C("123456789") = 0xE3069283, CRC64/NVME("123456789") = 0xAE8B14860A799888.
        let c = body_checksum(UploadChecksum::Crc32c, b"123456789").unwrap();
        assert_eq!(
            c.value,
            aws_smithy_types::base64::encode(0xE306_9283u32.to_be_bytes())
        );
        let c = body_checksum(UploadChecksum::Crc64Nvme, b"123456789").unwrap();
        assert_eq!(
            c.value,
            aws_smithy_types::base64::encode(0xAE8B_1486_0A79_9888u64.to_be_bytes())
        );
        assert_eq!(body_checksum(UploadChecksum::Off, b"123456789"), None);
        // Our CRC32C agrees with the crc32c crate the emulator uses.
        let c = body_checksum(UploadChecksum::Crc32c, b"hello world").unwrap();
        assert_eq!(
            c.value,
            aws_smithy_types::base64::encode(crc32c::crc32c(b"hello world").to_be_bytes())
        );
    }

    #[test]
    fn content_type_comes_from_the_extension_only_when_asked() {
        assert_eq!(content_type(false, "a/b.json"), None);
        assert_eq!(
            content_type(true, "a/b.json").as_deref(),
            Some("application/json")
        );
        assert_eq!(
            content_type(true, "img.v2/photo.PNG").as_deref(),
            Some("image/png")
        );
        assert_eq!(content_type(true, "dir.d/no-extension"), None);
    }

    #[test]
    fn rename_source_is_url_encoded() {
        assert_eq!(rename_source("dir/file.txt"), "/dir/file.txt");
        assert_eq!(rename_source("a b/ü+x"), "/a%20b/%C3%BC%2Bx");
        assert_eq!(copy_source("bk", "a b/ü+x"), "bk/a%20b/%C3%BC%2Bx");
    }

    #[test]
    fn missing_etag_is_malformed() {
        assert!(matches!(
            required_etag(None, "PutObject", "k"),
            Err(ClientError::Malformed(_))
        ));
        assert!(matches!(
            required_etag(Some(""), "PutObject", "k"),
            Err(ClientError::Malformed(_))
        ));
        assert_eq!(
            required_etag(Some("\"e\""), "PutObject", "k").unwrap(),
            "\"e\""
        );
    }
}
