//! The one place SDK errors become [`ClientError`]s.
//!
//! Service answers are classified by error code first and HTTP status second (HEAD answers carry no body, so
//! only the status is known for them). Failures that never produced a usable answer (connection errors,
//! timeouts, credentials, a failed S3 Express CreateSession hidden inside a dispatch failure) are found by
//! walking the error's source chain.

use std::error::Error as StdError;

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::operation::create_session::CreateSessionError;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;

use crate::s3::ClientError;

/// Codes S3 uses for rejected credentials or permissions (all become [`ClientError::AccessDenied`]).
const ACCESS_CODES: &[&str] = &[
    "AccessDenied",
    "AllAccessDisabled",
    "ExpiredToken",
    "InvalidAccessKeyId",
    "InvalidToken",
    "RequestTimeTooSkewed",
    "SignatureDoesNotMatch",
    "TokenRefreshRequired",
];

/// Codes that mean "try again later" whatever the status says.
const TRANSIENT_CODES: &[&str] = &[
    "InternalError",
    "RequestTimeout",
    "ServiceUnavailable",
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "TooManyRequests",
];

/// Maps any SDK error of any operation. `key` is the object the request was about ("" for bucket-level calls,
/// which turns a 404 into [`ClientError::NoSuchBucket`]).
pub(crate) fn map_sdk_error<E>(
    err: &SdkError<E, HttpResponse>,
    bucket: &str,
    key: &str,
) -> ClientError
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
{
    match err {
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            let e = service.err();
            if e.code().is_none() && (200..300).contains(&status) {
                // A success status whose body was neither the expected result nor an error document.
                return ClientError::Malformed(format!("HTTP {status} answer: {}", describe(err)));
            }
            classify(
                status,
                e.code(),
                e.message().unwrap_or_default(),
                bucket,
                key,
            )
        }
        SdkError::ResponseError(response) => {
            // The SDK already retried these (it treats unreadable answers as transient).
            let status = response.raw().status().as_u16();
            let detail = describe(err);
            if (500..600).contains(&status) {
                ClientError::Transient {
                    code: format!("HTTP{status}"),
                    message: detail,
                }
            } else {
                ClientError::Malformed(format!("unreadable HTTP {status} answer: {detail}"))
            }
        }
        SdkError::TimeoutError(_) => ClientError::Transient {
            code: "Timeout".into(),
            message: describe(err),
        },
        SdkError::DispatchFailure(dispatch) => {
            if let Some(found) = classify_source_chain(err, bucket) {
                return found;
            }
            dispatch_failure(dispatch.is_timeout(), dispatch.is_io(), describe(err))
        }
        SdkError::ConstructionFailure(_) => {
            classify_source_chain(err, bucket).unwrap_or_else(|| ClientError::Service {
                status: 0,
                code: "RequestConstruction".into(),
                message: describe(err),
            })
        }
        _ => ClientError::Malformed(describe(err)),
    }
}

/// A request that got no answer: a timeout or a connection error is worth retrying; anything else (endpoint
/// resolution, an invalid request, an identity problem we do not recognise) is not.
pub(crate) fn dispatch_failure(timeout: bool, io: bool, detail: String) -> ClientError {
    if timeout {
        ClientError::Transient {
            code: "Timeout".into(),
            message: detail,
        }
    } else if io {
        ClientError::Transient {
            code: "ConnectionError".into(),
            message: detail,
        }
    } else {
        ClientError::Service {
            status: 0,
            code: "ClientFailure".into(),
            message: detail,
        }
    }
}

/// Looks through the causes of a failure that happened before any answer: missing credentials, or the S3
/// Express CreateSession call that the SDK makes inside identity resolution.
fn classify_source_chain(err: &(dyn StdError + 'static), bucket: &str) -> Option<ClientError> {
    let mut cause = err.source();
    while let Some(current) = cause {
        if let Some(creds) = current.downcast_ref::<CredentialsError>() {
            let detail = describe(creds);
            return Some(match creds {
                CredentialsError::ProviderTimedOut(_) => ClientError::Transient {
                    code: "CredentialsTimeout".into(),
                    message: detail,
                },
                _ => ClientError::NoCredentials(detail),
            });
        }
        if let Some(session) = current.downcast_ref::<SdkError<CreateSessionError, HttpResponse>>()
        {
            return Some(create_session_failure(session, bucket));
        }
        cause = current.source();
    }
    None
}

/// A failed CreateSession. A bucket-level call: a 404 means the bucket is missing, never the object.
pub(crate) fn create_session_failure(
    err: &SdkError<CreateSessionError, HttpResponse>,
    bucket: &str,
) -> ClientError {
    match map_sdk_error(err, bucket, "") {
        ClientError::AccessDenied { code, message } => ClientError::AccessDenied {
            code,
            message: format!("CreateSession refused (needs s3express:CreateSession): {message}"),
        },
        other => other,
    }
}

/// The error and its causes, `Display` only. (The SDK's `DisplayErrorContext` also prints the `Debug` form,
/// which includes raw response bodies: a garbled CreateSession answer would put session keys in our logs.)
pub(crate) fn describe(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(current) = cause {
        let part = current.to_string();
        // Wrappers often repeat their source's text.
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cause = current.source();
    }
    text
}

/// Classifies a service answer by error code (when there is one) and HTTP status.
pub(crate) fn classify(
    status: u16,
    code: Option<&str>,
    message: &str,
    bucket: &str,
    key: &str,
) -> ClientError {
    let code = code.unwrap_or("");
    let message = message.to_string();
    let key_string = || key.to_string();
    if code == "NoSuchBucket" {
        return ClientError::NoSuchBucket {
            bucket: bucket.to_string(),
        };
    }
    // The multipart upload is gone (aborted by a lifecycle rule or another client): the file's object is
    // not missing, its upload failed, which a writer must report as an I/O error, not as ENOENT.
    if code == "NoSuchUpload" {
        return ClientError::UploadGone { key: key_string() };
    }
    if matches!(code, "NoSuchKey" | "NotFound") || status == 404 {
        return if key.is_empty() {
            ClientError::NoSuchBucket {
                bucket: bucket.to_string(),
            }
        } else {
            ClientError::NotFound { key: key_string() }
        };
    }
    if status == 412 || code == "PreconditionFailed" {
        return ClientError::PreconditionFailed { key: key_string() };
    }
    if code == "InvalidWriteOffset" {
        return ClientError::InvalidWriteOffset {
            key: key_string(),
            message,
        };
    }
    if status == 409 || code == "ConditionalRequestConflict" {
        return ClientError::Conflict {
            key: key_string(),
            message,
        };
    }
    if status == 416 || code == "InvalidRange" {
        return ClientError::InvalidRange { key: key_string() };
    }
    if status == 403 || ACCESS_CODES.contains(&code) {
        let code = if code.is_empty() {
            "AccessDenied"
        } else {
            code
        };
        return ClientError::AccessDenied {
            code: code.to_string(),
            message,
        };
    }
    if status == 501 || code == "NotImplemented" {
        return ClientError::NotSupported(if message.is_empty() {
            format!("HTTP {status} {code}")
        } else {
            message
        });
    }
    if (500..600).contains(&status) || status == 429 || TRANSIENT_CODES.contains(&code) {
        let code = if code.is_empty() {
            format!("HTTP{status}")
        } else {
            code.to_string()
        };
        return ClientError::Transient { code, message };
    }
    if code.is_empty() && (200..300).contains(&status) {
        // An error without a code on a success status: the body was not the XML we expected.
        return ClientError::Malformed(format!(
            "HTTP {status} answer that is neither a result nor an error"
        ));
    }
    ClientError::Service {
        status,
        code: code.to_string(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_s3::error::ErrorMetadata;
    use aws_sdk_s3::operation::get_object::GetObjectError;
    use aws_sdk_s3::operation::head_object::HeadObjectError;
    use aws_sdk_s3::operation::put_object::PutObjectError;
    use aws_smithy_runtime_api::client::result::ConnectorError;
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;

    fn response(status: u16) -> HttpResponse {
        HttpResponse::new(StatusCode::try_from(status).unwrap(), SdkBody::empty())
    }

    fn get_error(status: u16, code: Option<&str>) -> SdkError<GetObjectError, HttpResponse> {
        let mut meta = ErrorMetadata::builder().message("msg");
        if let Some(code) = code {
            meta = meta.code(code);
        }
        SdkError::service_error(GetObjectError::generic(meta.build()), response(status))
    }

    fn map_get(status: u16, code: Option<&str>) -> ClientError {
        map_sdk_error(&get_error(status, code), "bkt", "dir/file")
    }

    #[test]
    fn not_found_and_bucket_errors() {
        assert_eq!(
            map_get(404, Some("NoSuchKey")),
            ClientError::NotFound {
                key: "dir/file".into()
            }
        );
        assert_eq!(
            map_get(404, Some("NoSuchBucket")),
            ClientError::NoSuchBucket {
                bucket: "bkt".into()
            }
        );
        // A multipart upload gone is a failed write, not a missing file.
        let gone = map_get(404, Some("NoSuchUpload"));
        assert_eq!(
            gone,
            ClientError::UploadGone {
                key: "dir/file".into()
            }
        );
        let errno = crate::fuse::errno(&crate::fs::FsError::client("dir/file", gone));
        assert_eq!(errno, fuser::Errno::EIO);
        // Bucket-level calls turn every 404 into a missing bucket.
        let err = get_error(404, None);
        assert_eq!(
            map_sdk_error(&err, "bkt", ""),
            ClientError::NoSuchBucket {
                bucket: "bkt".into()
            }
        );
    }

    #[test]
    fn head_answers_without_body_use_the_status() {
        // What the SDK builds for a HEAD 404: code NotFound from the status, no message.
        let meta = ErrorMetadata::builder().code("NotFound").build();
        let err = SdkError::service_error(HeadObjectError::generic(meta), response(404));
        assert_eq!(
            map_sdk_error(&err, "b", "k"),
            ClientError::NotFound { key: "k".into() }
        );
        // HEAD 403 / 412 / 503 have no code at all.
        let bare = |status| {
            let err = SdkError::service_error(
                HeadObjectError::generic(ErrorMetadata::builder().build()),
                response(status),
            );
            map_sdk_error(&err, "b", "k")
        };
        assert_eq!(
            bare(403),
            ClientError::AccessDenied {
                code: "AccessDenied".into(),
                message: String::new()
            }
        );
        assert_eq!(
            bare(412),
            ClientError::PreconditionFailed { key: "k".into() }
        );
        assert!(matches!(bare(503), ClientError::Transient { code, .. } if code == "HTTP503"));
        assert!(matches!(
            bare(400),
            ClientError::Service { status: 400, .. }
        ));
    }

    #[test]
    fn write_conflicts() {
        assert_eq!(
            map_get(412, Some("PreconditionFailed")),
            ClientError::PreconditionFailed {
                key: "dir/file".into()
            }
        );
        assert!(matches!(
            map_get(409, Some("ConditionalRequestConflict")),
            ClientError::Conflict { .. }
        ));
        let meta = ErrorMetadata::builder()
            .code("InvalidWriteOffset")
            .message("offset 3 != size 5")
            .build();
        let err = SdkError::service_error(PutObjectError::generic(meta), response(400));
        assert_eq!(
            map_sdk_error(&err, "b", "k"),
            ClientError::InvalidWriteOffset {
                key: "k".into(),
                message: "offset 3 != size 5".into()
            }
        );
        assert_eq!(
            map_get(416, Some("InvalidRange")),
            ClientError::InvalidRange {
                key: "dir/file".into()
            }
        );
    }

    #[test]
    fn access_errors_keep_their_code() {
        for code in [
            "AccessDenied",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
        ] {
            assert_eq!(
                map_get(403, Some(code)),
                ClientError::AccessDenied {
                    code: code.into(),
                    message: "msg".into()
                }
            );
        }
        // ExpiredToken comes with 400.
        assert_eq!(
            map_get(400, Some("ExpiredToken")),
            ClientError::AccessDenied {
                code: "ExpiredToken".into(),
                message: "msg".into()
            }
        );
    }

    #[test]
    fn transient_unsupported_and_other() {
        assert!(
            matches!(map_get(503, Some("SlowDown")), ClientError::Transient { code, .. } if code == "SlowDown")
        );
        assert!(matches!(
            map_get(500, Some("InternalError")),
            ClientError::Transient { .. }
        ));
        assert!(matches!(
            map_get(400, Some("RequestTimeout")),
            ClientError::Transient { .. }
        ));
        assert!(matches!(
            map_get(501, Some("NotImplemented")),
            ClientError::NotSupported(_)
        ));
        assert_eq!(
            map_get(400, Some("InvalidArgument")),
            ClientError::Service {
                status: 400,
                code: "InvalidArgument".into(),
                message: "msg".into()
            }
        );
        // CompleteMultipartUpload may answer 200 with an error document.
        assert!(matches!(
            map_get(200, Some("InternalError")),
            ClientError::Transient { .. }
        ));
        assert!(matches!(map_get(200, None), ClientError::Malformed(_)));
    }

    #[test]
    fn failures_without_an_answer() {
        let timeout: SdkError<GetObjectError, HttpResponse> =
            SdkError::timeout_error("attempt timed out");
        assert!(
            matches!(map_sdk_error(&timeout, "b", "k"), ClientError::Transient { code, .. } if code == "Timeout")
        );

        let io: SdkError<GetObjectError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::io("connection reset".into()));
        assert!(
            matches!(map_sdk_error(&io, "b", "k"), ClientError::Transient { code, .. } if code == "ConnectionError")
        );

        let slow: SdkError<GetObjectError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::timeout("connect timed out".into()));
        assert!(
            matches!(map_sdk_error(&slow, "b", "k"), ClientError::Transient { code, .. } if code == "Timeout")
        );

        let unreadable: SdkError<GetObjectError, HttpResponse> =
            SdkError::response_error("bad xml", response(200));
        assert!(matches!(
            map_sdk_error(&unreadable, "b", "k"),
            ClientError::Malformed(_)
        ));
        let unreadable_5xx: SdkError<GetObjectError, HttpResponse> =
            SdkError::response_error("bad xml", response(502));
        assert!(matches!(
            map_sdk_error(&unreadable_5xx, "b", "k"),
            ClientError::Transient { .. }
        ));
    }

    #[test]
    fn descriptions_never_include_raw_bodies() {
        let body =
            SdkBody::from("<Credentials><SessionToken>SECRET-TOKEN</SessionToken></Credentials>");
        let raw = HttpResponse::new(StatusCode::try_from(200).unwrap(), body);
        let err: SdkError<GetObjectError, HttpResponse> =
            SdkError::response_error("unexpected XML", raw);
        let text = describe(&err);
        assert!(text.contains("unexpected XML"), "{text}");
        assert!(!text.contains("SECRET-TOKEN"), "{text}");
        let mapped = format!("{:?}", map_sdk_error(&err, "b", "k"));
        assert!(!mapped.contains("SECRET-TOKEN"), "{mapped}");
    }

    #[test]
    fn missing_credentials_are_found_in_the_source_chain() {
        let creds = CredentialsError::not_loaded("no providers in chain provided credentials");
        let err: SdkError<GetObjectError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::other(Box::new(creds), None));
        assert!(matches!(
            map_sdk_error(&err, "b", "k"),
            ClientError::NoCredentials(_)
        ));
    }

    #[test]
    fn create_session_failures_surface_as_bucket_errors() {
        let denied = SdkError::<CreateSessionError, HttpResponse>::service_error(
            CreateSessionError::generic(
                ErrorMetadata::builder()
                    .code("AccessDenied")
                    .message("no")
                    .build(),
            ),
            response(403),
        );
        let err: SdkError<GetObjectError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::other(Box::new(denied), None));
        match map_sdk_error(&err, "b--use1-az4--x-s3", "k") {
            ClientError::AccessDenied { code, message } => {
                assert_eq!(code, "AccessDenied");
                assert!(message.contains("s3express:CreateSession"), "{message}");
            }
            other => panic!("{other:?}"),
        }

        let missing = SdkError::<CreateSessionError, HttpResponse>::service_error(
            CreateSessionError::generic(ErrorMetadata::builder().code("NoSuchBucket").build()),
            response(404),
        );
        let err: SdkError<GetObjectError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::other(Box::new(missing), None));
        assert_eq!(
            map_sdk_error(&err, "b--use1-az4--x-s3", "k"),
            ClientError::NoSuchBucket {
                bucket: "b--use1-az4--x-s3".into()
            }
        );
    }
}
