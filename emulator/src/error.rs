//! S3 error answers: status, code and message as the service sends them.

use http::StatusCode;

#[derive(Debug, Clone, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct S3Error {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl S3Error {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        S3Error {
            status: StatusCode::from_u16(status).expect("valid status"),
            code,
            message: message.into(),
        }
    }

    pub fn internal(e: std::io::Error) -> Self {
        S3Error::new(
            500,
            "InternalError",
            format!("We encountered an internal error: {e}"),
        )
    }
    pub fn no_such_key() -> Self {
        S3Error::new(404, "NoSuchKey", "The specified key does not exist.")
    }
    pub fn no_such_bucket() -> Self {
        S3Error::new(404, "NoSuchBucket", "The specified bucket does not exist")
    }
    pub fn no_such_upload() -> Self {
        S3Error::new(
            404,
            "NoSuchUpload",
            "The specified multipart upload does not exist. The upload ID might be invalid, or the multipart upload might have been aborted or completed.",
        )
    }
    pub fn precondition_failed(condition: &str) -> Self {
        S3Error::new(
            412,
            "PreconditionFailed",
            format!("At least one of the pre-conditions you specified did not hold: {condition}"),
        )
    }
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        S3Error::new(400, "InvalidArgument", message)
    }
    pub fn invalid_request(message: impl Into<String>) -> Self {
        S3Error::new(400, "InvalidRequest", message)
    }
    pub fn not_implemented(what: &str) -> Self {
        S3Error::new(
            501,
            "NotImplemented",
            format!(
                "A header or query you provided implies functionality that is not implemented: {what}"
            ),
        )
    }
    pub fn access_denied(message: impl Into<String>) -> Self {
        S3Error::new(403, "AccessDenied", message)
    }
    pub fn incomplete_body(message: String) -> Self {
        S3Error::new(400, "IncompleteBody", message)
    }
    pub fn entity_too_large(limit: u64) -> Self {
        S3Error::new(
            400,
            "EntityTooLarge",
            format!("Your proposed upload exceeds the maximum allowed size of {limit} bytes"),
        )
    }
    pub fn bad_digest(which: &str) -> Self {
        S3Error::new(
            400,
            "BadDigest",
            format!("The {which} you specified did not match the calculated checksum."),
        )
    }

    /// The XML document S3 sends with an error (HEAD answers carry none).
    pub fn to_xml(&self, resource: &str, request_id: &str) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message><Resource>{}</Resource><RequestId>{}</RequestId></Error>",
            self.code,
            crate::xml::escape(&self.message),
            crate::xml::escape(resource),
            request_id
        )
    }
}
