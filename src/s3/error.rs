//! Errors of the object client layer. The file system core maps these to its own errors; errno is chosen
//! only at the FUSE edge.

use thiserror::Error;

#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ClientError {
    /// NoSuchKey / 404 on an object.
    #[error("object not found: {key}")]
    NotFound { key: String },

    /// NoSuchUpload: the multipart upload is gone (completed, or aborted by a lifecycle rule or another
    /// client). A failed write, not a missing file.
    #[error("multipart upload gone for {key}")]
    UploadGone { key: String },

    /// NoSuchBucket / 404 on the bucket.
    #[error("bucket not found: {bucket}")]
    NoSuchBucket { bucket: String },

    /// 412: If-Match / If-None-Match failed (object replaced, or already exists).
    #[error("precondition failed for {key}")]
    PreconditionFailed { key: String },

    /// 409 ConditionalRequestConflict or similar racing writer.
    #[error("conflicting concurrent write to {key}: {message}")]
    Conflict { key: String, message: String },

    /// Append at the wrong offset (InvalidWriteOffset).
    #[error("invalid write offset for {key}: {message}")]
    InvalidWriteOffset { key: String, message: String },

    /// 416 InvalidRange.
    #[error("invalid range for {key}")]
    InvalidRange { key: String },

    /// 403: credentials rejected or not permitted (for directory buckets: s3express:CreateSession).
    #[error("access denied ({code}): {message}")]
    AccessDenied { code: String, message: String },

    /// No credentials could be loaded at all.
    #[error("no credentials: {0}")]
    NoCredentials(String),

    /// The operation is not supported by this bucket type or server (501, or rename on a general-purpose bucket).
    #[error("not supported: {0}")]
    NotSupported(String),

    /// Retries exhausted on a transient failure (5xx, throttling, connection errors, timeouts).
    #[error("transient failure after retries ({code}): {message}")]
    Transient { code: String, message: String },

    /// The server answered something we could not understand (malformed XML, short body, bad checksum).
    #[error("malformed response: {0}")]
    Malformed(String),

    /// Any other service error, with its code and HTTP status.
    #[error("service error {status} {code}: {message}")]
    Service {
        status: u16,
        code: String,
        message: String,
    },
}

impl ClientError {
    /// The service error code for logs ("NoSuchKey", "SlowDown", ...).
    pub fn code(&self) -> &str {
        match self {
            ClientError::NotFound { .. } => "NoSuchKey",
            ClientError::NoSuchBucket { .. } => "NoSuchBucket",
            ClientError::UploadGone { .. } => "NoSuchUpload",
            ClientError::PreconditionFailed { .. } => "PreconditionFailed",
            ClientError::Conflict { .. } => "ConditionalRequestConflict",
            ClientError::InvalidWriteOffset { .. } => "InvalidWriteOffset",
            ClientError::InvalidRange { .. } => "InvalidRange",
            ClientError::AccessDenied { code, .. } => code,
            ClientError::NoCredentials(_) => "NoCredentials",
            ClientError::NotSupported(_) => "NotImplemented",
            ClientError::Transient { code, .. } => code,
            ClientError::Malformed(_) => "MalformedResponse",
            ClientError::Service { code, .. } => code,
        }
    }
}
