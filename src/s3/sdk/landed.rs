//! A write whose answer was lost. The SDK sends a request again when an attempt got no answer (a connection
//! reset, a timeout); if the first attempt had landed, a conditional write's next attempt is refused (its
//! If-None-Match or If-Match no longer holds; an append's offset has moved on), and the caller would report
//! a failure for bytes that are in the bucket. Before such a refusal is passed on, the object is read back:
//! when it holds exactly the bytes written, where they were written, the write is taken as done. Only after
//! an attempt that got no answer at all (an attempt answered 500 or 503 did not land), and never for an empty
//! body, which says nothing about who wrote it (a marker, an empty lock file made with O_EXCL).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use aws_sdk_s3::config::interceptors::FinalizerInterceptorContextRef;
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_s3::error::BoxError;
use bytes::Bytes;
use tracing::info;

use super::SdkClient;
use crate::s3::{ClientError, ObjectClient, PutResult, UserMetadata};

/// Counts the attempts of one request that got no answer (interceptor added to that request only).
#[derive(Debug, Clone, Default)]
pub(super) struct Attempts(Arc<AtomicU32>);

impl Attempts {
    /// An attempt went unanswered (its connection dropped, or it timed out): it may have landed unseen.
    pub(super) fn went_unanswered(&self) -> bool {
        self.0.load(Ordering::Relaxed) > 0
    }
}

impl Intercept for Attempts {
    fn name(&self) -> &'static str {
        "expressfs::Attempts"
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if context.response().is_none() {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// What a retried write's refusal may stand for: its own earlier attempt, landed.
pub(super) fn may_be_own_write(e: &ClientError, attempts: &Attempts) -> bool {
    attempts.went_unanswered()
        && matches!(
            e,
            ClientError::PreconditionFailed { .. } | ClientError::InvalidWriteOffset { .. }
        )
}

impl SdkClient {
    /// `refused`, unless `key` now ends at `offset + body.len()` with `body` at `offset`: then the write that
    /// was refused on a later attempt had landed with an earlier one, and its result is the object's.
    pub(super) async fn landed_or(
        &self,
        key: &str,
        offset: u64,
        body: &Bytes,
        refused: ClientError,
    ) -> Result<PutResult, ClientError> {
        if body.is_empty() {
            return Err(refused);
        }
        let end = offset + body.len() as u64;
        let Ok(info) = ObjectClient::head_object(self, key).await else {
            return Err(refused);
        };
        if info.size != end {
            return Err(refused);
        }
        match self.get_range(key, offset..end, Some(&info.etag)).await {
            Ok(there) if there == *body => {}
            _ => return Err(refused),
        }
        info!(
            key,
            offset,
            len = body.len(),
            "a write refused on its retry had landed with its first attempt, whose answer was lost"
        );
        Ok(PutResult {
            etag: info.etag,
            size: Some(end),
        })
    }

    /// A copy refused on its retry: landed if the destination is now the source as it is (same size and
    /// ETag; on a general-purpose bucket a copy of an object made in one PUT keeps its MD5 ETag; otherwise
    /// the refusal stands).
    pub(super) async fn copy_landed_or(
        &self,
        source_key: &str,
        destination_key: &str,
        refused: ClientError,
    ) -> Result<PutResult, ClientError> {
        let (Ok(source), Ok(there)) = (
            ObjectClient::head_object(self, source_key).await,
            ObjectClient::head_object(self, destination_key).await,
        ) else {
            return Err(refused);
        };
        if there.size != source.size || there.etag != source.etag {
            return Err(refused);
        }
        info!(
            source_key,
            destination_key,
            "a copy refused on its retry had landed with its first attempt, whose answer was lost"
        );
        Ok(PutResult {
            etag: there.etag,
            size: Some(there.size),
        })
    }

    /// A metadata replacement refused on its retry: landed if the object now carries exactly `metadata`.
    pub(super) async fn metadata_landed_or(
        &self,
        key: &str,
        metadata: &UserMetadata,
        refused: ClientError,
    ) -> Result<PutResult, ClientError> {
        let Ok(there) = ObjectClient::head_object(self, key).await else {
            return Err(refused);
        };
        let ours: UserMetadata = metadata
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect();
        if metadata.is_empty() || there.metadata != ours {
            return Err(refused);
        }
        info!(
            key,
            "a metadata copy refused on its retry had landed with its first attempt, whose answer was lost"
        );
        Ok(PutResult {
            etag: there.etag,
            size: Some(there.size),
        })
    }
}
