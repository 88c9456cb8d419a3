//! The HTTP front: routing an S3 request to its operation, authentication (SigV4 and S3 Express sessions),
//! fault injection, time-to-first-byte, counters, and the `/_emulator/*` admin endpoints.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use percent_encoding::percent_decode_str;

use crate::body::{BodyFault, ResponseBody};
use crate::error::S3Error;
use crate::faults::{Fault, Faults};
use crate::store::{Recorded, Store};
use crate::{EmulatorConfig, sigv4};

pub struct State {
    pub config: EmulatorConfig,
    /// Public buckets, access point aliases, the header record.
    pub access: crate::access::Access,
    pub store: Store,
    pub faults: Mutex<Faults>,
    /// Set by `POST /_emulator/pause?ms=N`: S3 requests wait until then.
    pub paused_until: Mutex<Option<Instant>>,
    /// Set when the emulator serves HTTPS.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Who signed the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The configured long-term keys.
    Root,
    /// An S3 Express session for one bucket.
    Session { read_only: bool },
    /// An unsigned request, let through by a public bucket (reads only).
    Anonymous,
}

/// One decoded S3 request, as the operations see it.
pub struct Ctx {
    pub method: Method,
    pub headers: HeaderMap,
    pub query: Vec<(String, String)>,
    pub bucket: String,
    pub key: String,
    pub principal: Principal,
    pub body_fault: BodyFault,
}

impl Ctx {
    pub fn q(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    pub fn has(&self, name: &str) -> bool {
        self.query.iter().any(|(k, _)| k == name)
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub type Answer = Result<Response<ResponseBody>, S3Error>;

/// Builds a response with the given status and body.
pub fn respond(status: u16, body: ResponseBody) -> Response<ResponseBody> {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(status).expect("valid status");
    r
}

pub fn xml_response(body: String) -> Response<ResponseBody> {
    let mut r = respond(200, ResponseBody::full(body));
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/xml"));
    r
}

pub fn set_header(r: &mut Response<ResponseBody>, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        r.headers_mut().insert(name, v);
    }
}

fn operation_name(
    method: &Method,
    bucket: &str,
    key: &str,
    query: &[(String, String)],
    headers: &HeaderMap,
) -> &'static str {
    let has = |n: &str| query.iter().any(|(k, _)| k == n);
    match (method.as_str(), bucket.is_empty(), key.is_empty()) {
        // Mountpoint's CRT client asks for a session without a bucket in the path (`GET /?session=`).
        ("GET", true, _) if has("session") => "CreateSession",
        ("GET", true, _) => "ListBuckets",
        ("GET", false, true) if has("session") => "CreateSession",
        ("GET", false, true) if has("uploads") => "ListMultipartUploads",
        ("GET", false, true) if has("location") => "GetBucketLocation",
        ("GET", false, true) if query.iter().any(|(k, v)| k == "list-type" && v == "2") => {
            "ListObjectsV2"
        }
        ("GET", false, true) => "ListObjects",
        ("HEAD", false, true) => "HeadBucket",
        ("PUT", false, true) => "CreateBucket",
        ("DELETE", false, true) => "DeleteBucket",
        ("POST", false, true) if has("delete") => "DeleteObjects",
        ("GET", false, false) if has("uploadId") => "ListParts",
        ("GET", false, false) => "GetObject",
        ("HEAD", false, false) => "HeadObject",
        ("PUT", false, false) if has("uploadId") && headers.contains_key("x-amz-copy-source") => {
            "UploadPartCopy"
        }
        ("PUT", false, false) if has("uploadId") => "UploadPart",
        ("PUT", false, false) if has("renameObject") => "RenameObject",
        ("PUT", false, false) if headers.contains_key("x-amz-copy-source") => "CopyObject",
        ("PUT", false, false) => "PutObject",
        ("POST", false, false) if has("uploads") => "CreateMultipartUpload",
        ("POST", false, false) if has("uploadId") => "CompleteMultipartUpload",
        ("DELETE", false, false) if has("uploadId") => "AbortMultipartUpload",
        ("DELETE", false, false) => "DeleteObject",
        _ => "Unknown",
    }
}

/// Operations a directory bucket serves only to S3 Express sessions. CopyObject and UploadPartCopy are signed
/// with IAM credentials instead (their API references: "You must use IAM credentials ... instead of using the
/// temporary security credentials through the CreateSession API operation"; the SDKs do so). Session-signed
/// copies are accepted too: what the service answers to those is not documented.
fn needs_session(op: &str) -> bool {
    !matches!(
        op,
        "CopyObject"
            | "UploadPartCopy"
            | "CreateSession"
            | "CreateBucket"
            | "DeleteBucket"
            | "HeadBucket"
            | "ListBuckets"
            | "GetBucketLocation"
    )
}

fn is_write(op: &str) -> bool {
    matches!(
        op,
        "PutObject"
            | "CopyObject"
            | "UploadPart"
            | "UploadPartCopy"
            | "RenameObject"
            | "CreateMultipartUpload"
            | "CompleteMultipartUpload"
            | "AbortMultipartUpload"
            | "DeleteObject"
            | "DeleteObjects"
    )
}

/// Splits the target into bucket and key: virtual-hosted (`bucket.host`, or an access point's `NAME-ACCOUNT.host`)
/// or path-style (`/bucket/key`).
fn locate(state: &State, headers: &HeaderMap, raw_path: &str) -> (String, String) {
    let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let host = host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    if let Some((first, _)) = host.split_once('.')
        && host.parse::<std::net::Ipv4Addr>().is_err()
        && (state.store.buckets().contains_key(first) || state.access.is_alias(first))
    {
        return (
            first.to_string(),
            decode(raw_path.strip_prefix('/').unwrap_or(raw_path)),
        );
    }
    let path = raw_path.strip_prefix('/').unwrap_or(raw_path);
    match path.split_once('/') {
        Some((bucket, key)) => (decode(bucket), decode(key)),
        None => (decode(path), String::new()),
    }
}

/// Checks the signature and, for sessions, token, bucket and expiry.
fn authenticate(
    state: &State,
    req_method: &Method,
    raw_path: &str,
    headers: &HeaderMap,
    query: &[(String, String)],
    bucket: &str,
) -> Result<Principal, S3Error> {
    let signed = match sigv4::parse(headers, query) {
        Ok(s) => s,
        Err(sigv4::AuthParseError::Missing) => {
            return Err(S3Error::access_denied(
                "Anonymous access is not allowed: sign requests with SigV4",
            ));
        }
        Err(sigv4::AuthParseError::Malformed(m)) => {
            return Err(S3Error::new(400, "AuthorizationHeaderMalformed", m));
        }
    };
    if signed.region != state.config.region {
        return Err(S3Error::new(
            400,
            "AuthorizationHeaderMalformed",
            format!(
                "The authorization header is malformed; the region '{}' is wrong; expecting '{}'",
                signed.region, state.config.region
            ),
        ));
    }
    if signed.service != "s3" && signed.service != "s3express" {
        return Err(S3Error::new(
            400,
            "AuthorizationHeaderMalformed",
            format!(
                "The authorization header is malformed; incorrect service '{}'",
                signed.service
            ),
        ));
    }
    let signed_at = sigv4::parse_amz_date(&signed.amz_date)
        .ok_or_else(|| S3Error::access_denied("X-Amz-Date is missing or malformed"))?;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    if signed.presigned {
        let expires = signed.expires_secs.unwrap_or(0) as i64;
        if now > signed_at + expires {
            return Err(S3Error::access_denied("Request has expired"));
        }
    } else if (now - signed_at).abs() > 15 * 60 {
        return Err(S3Error::new(
            403,
            "RequestTimeTooSkewed",
            "The difference between the request time and the current time is too large.",
        ));
    }

    let (secret, principal, session) = if signed.access_key == state.config.access_key {
        (state.config.secret_key.clone(), Principal::Root, None)
    } else if let Some(s) = state.store.sessions().get(&signed.access_key).cloned() {
        (
            s.secret.clone(),
            Principal::Session {
                read_only: s.read_only,
            },
            Some(s),
        )
    } else {
        return Err(S3Error::new(
            403,
            "InvalidAccessKeyId",
            "The AWS Access Key Id you provided does not exist in our records.",
        ));
    };
    let expected =
        sigv4::expected_signature(&signed, &secret, req_method, raw_path, query, headers);
    if !sigv4::signatures_equal(&expected, &signed.signature) {
        return Err(S3Error::new(
            403,
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. Check your key and signing method.",
        ));
    }
    if let Some(session) = session {
        let token = headers
            .get("x-amz-s3session-token")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if signed.service != "s3express" || token != session.token {
            return Err(S3Error::access_denied(
                "The session token is missing or does not belong to these credentials",
            ));
        }
        if session.bucket != bucket
            && !(session.bucket.is_empty() && crate::store::is_directory_bucket_name(bucket))
        {
            return Err(S3Error::access_denied(
                "This session was created for another bucket",
            ));
        }
        if Instant::now() >= session.expires {
            return Err(S3Error::new(
                400,
                "ExpiredToken",
                "The provided token has expired.",
            ));
        }
    }
    Ok(principal)
}

/// Serves one HTTP request. An `Err` makes hyper drop the connection (the "reset" faults).
pub async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, std::io::Error> {
    let started = Instant::now();
    let request_id = format!("{:016X}", rand::random::<u64>());
    let raw_path = req.uri().path().to_string();
    if raw_path.starts_with("/_emulator/") {
        return Ok(admin(&state, req).await);
    }
    wait_while_paused(&state).await;
    let raw_query = req.uri().query().unwrap_or("").to_string();
    let query = sigv4::parse_query(&raw_query);
    let method = req.method().clone();
    let headers = req.headers().clone();
    let (bucket, key) = locate(&state, &headers, &raw_path);
    let bucket = state.access.resolve(bucket);
    let op = operation_name(&method, &bucket, &key, &query, &headers);
    state.access.record(op, &bucket, &key, &raw_query, &headers);

    let outcome = run(
        &state, req, op, &method, &raw_path, &headers, query, &bucket, &key,
    )
    .await;
    let mut response = match outcome {
        Ok(r) => r,
        Err(Outcome::Drop) => {
            let outcome = Recorded {
                error: true,
                ..Recorded::default()
            };
            state.store.record(&bucket, op, outcome);
            return Err(std::io::Error::other("injected connection reset"));
        }
        Err(Outcome::Answer(r)) => r,
        Err(Outcome::Error(e)) => {
            let body = if method == Method::HEAD {
                ResponseBody::empty()
            } else {
                ResponseBody::full(e.to_xml(&raw_path, &request_id))
            };
            let mut r = respond(e.status.as_u16(), body);
            if method != Method::HEAD {
                set_header(&mut r, "content-type", "application/xml");
            }
            r
        }
    };
    if !state.config.ttfb.is_zero() {
        tokio::time::sleep(state.config.ttfb).await;
    }
    let status = response.status().as_u16();
    let bytes_out = http_body::Body::size_hint(response.body())
        .exact()
        .unwrap_or(0);
    let bytes_in = headers
        .get("x-amz-decoded-content-length")
        .or_else(|| headers.get("content-length"))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let unsigned_payload = headers
        .get("x-amz-content-sha256")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("UNSIGNED-PAYLOAD"));
    let outcome = Recorded {
        error: status >= 400,
        bytes_in,
        bytes_out,
        unsigned_payload,
    };
    state.store.record(&bucket, op, outcome);
    set_header(&mut response, "x-amz-request-id", &request_id);
    set_header(&mut response, "x-amz-id-2", &request_id);
    set_header(&mut response, "server", "expressfs-emulator");
    set_header(
        &mut response,
        "date",
        &crate::xml::http_date(SystemTime::now()),
    );
    if state.config.log_requests {
        tracing::info!(%method, path = %raw_path, query = %raw_query, op, status, ms = started.elapsed().as_millis() as u64, "request");
    }
    Ok(response)
}

async fn wait_while_paused(state: &State) {
    loop {
        let until = *state.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        match until {
            Some(t) if t > Instant::now() => tokio::time::sleep_until(t.into()).await,
            _ => return,
        }
    }
}

/// Operations whose success answer is an XML document.
fn answers_xml(op: &str) -> bool {
    matches!(
        op,
        "ListObjectsV2"
            | "CreateSession"
            | "CreateMultipartUpload"
            | "CompleteMultipartUpload"
            | "ListParts"
            | "ListMultipartUploads"
            | "ListBuckets"
            | "DeleteObjects"
            | "CopyObject"
            | "UploadPartCopy"
    )
}

/// The answer for a `malformed-xml` fault (see [`Fault::MalformedXml`]).
fn malformed_xml(op: &str) -> Response<ResponseBody> {
    let (status, body) = if matches!(
        op,
        "CompleteMultipartUpload" | "CopyObject" | "UploadPartCopy"
    ) {
        // The real service can fail these after sending 200: the error is in the body (their API
        // references).
        (
            200,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>InternalError</Code><Message>We encountered an internal error. Please try again.</Message></Error>",
        )
    } else if answers_xml(op) {
        (
            200,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult><Name>b</Name><Contents><Key>cut-he",
        )
    } else {
        (500, "<html><body>upstream proxy error</bo")
    };
    let mut r = respond(status, ResponseBody::full(body.to_string()));
    set_header(&mut r, "content-type", "application/xml");
    r
}

enum Outcome {
    Error(S3Error),
    Drop,
    /// A ready answer (faults that are not S3 errors).
    Answer(Response<ResponseBody>),
}

impl From<S3Error> for Outcome {
    fn from(e: S3Error) -> Self {
        Outcome::Error(e)
    }
}

#[allow(clippy::too_many_arguments)]
async fn run(
    state: &Arc<State>,
    req: Request<Incoming>,
    op: &'static str,
    method: &Method,
    raw_path: &str,
    headers: &HeaderMap,
    query: Vec<(String, String)>,
    bucket: &str,
    key: &str,
) -> Result<Response<ResponseBody>, Outcome> {
    if op == "Unknown" {
        return Err(S3Error::not_implemented(&format!("{method} {raw_path}")).into());
    }
    let directory = crate::store::is_directory_bucket_name(bucket);
    let principal = match authenticate(state, method, raw_path, headers, &query, bucket) {
        // S3 answers an unsigned request from its bucket policy: here, reads of a public general purpose
        // bucket. Every other unsigned request stays AccessDenied.
        Err(_)
            if !directory
                && crate::access::anonymous_may(op)
                && state.access.is_public(bucket)
                && matches!(
                    sigv4::parse(headers, &query),
                    Err(sigv4::AuthParseError::Missing)
                ) =>
        {
            Principal::Anonymous
        }
        other => other?,
    };
    if directory && needs_session(op) && principal == Principal::Root {
        let exists = state.store.buckets().contains_key(bucket);
        if !exists {
            return Err(S3Error::no_such_bucket().into());
        }
        return Err(S3Error::access_denied("Directory bucket requests must be signed with S3 Express session credentials from CreateSession").into());
    }
    if principal == (Principal::Session { read_only: true }) && is_write(op) {
        return Err(S3Error::access_denied("This session was created ReadOnly").into());
    }

    let fault = state
        .faults
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .pick(op);
    let mut body_fault = BodyFault::None;
    // Only a first attempt's answer is lost (`amz-sdk-request: attempt=1; max=N` from the AWS SDKs), so that
    // the attempt sent again shows what the first one left behind.
    let lose_answer = fault == Some(Fault::LostAnswer) && first_attempt(headers);
    if fault == Some(Fault::LostAnswer) && !lose_answer {
        state
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .not_applied(Fault::LostAnswer, op);
    }
    match fault {
        Some(Fault::InternalError) => {
            return Err(S3Error::new(
                500,
                "InternalError",
                "We encountered an internal error. Please try again.",
            )
            .into());
        }
        Some(Fault::SlowDown) => {
            return Err(S3Error::new(503, "SlowDown", "Please reduce your request rate.").into());
        }
        Some(Fault::ExpiredToken) => {
            return Err(
                S3Error::new(400, "ExpiredToken", "The provided token has expired.").into(),
            );
        }
        Some(Fault::ResetBeforeBody) => return Err(Outcome::Drop),
        Some(Fault::LatencySpike) => tokio::time::sleep(Duration::from_millis(1500)).await,
        Some(Fault::ResetMidBody) if op == "GetObject" => body_fault = BodyFault::ResetMidBody,
        Some(Fault::TruncatedBody) if op == "GetObject" => body_fault = BodyFault::Truncate,
        Some(Fault::StallMidBody) if op == "GetObject" => body_fault = BodyFault::StallMidBody,
        Some(Fault::ResetMidBody | Fault::TruncatedBody | Fault::StallMidBody) => {
            return Err(Outcome::Drop);
        }
        Some(Fault::MalformedXml) => return Err(Outcome::Answer(malformed_xml(op))),
        Some(Fault::UnexpectedStatus) => {
            let mut r = respond(418, ResponseBody::full("I'm a teapot\n".to_string()));
            set_header(&mut r, "content-type", "text/plain");
            return Err(Outcome::Answer(r));
        }
        Some(Fault::Stall) => tokio::time::sleep(Duration::from_secs(20)).await,
        Some(Fault::ConditionalConflict)
            if matches!(op, "PutObject" | "CompleteMultipartUpload" | "CopyObject")
                && (headers.contains_key("if-match") || headers.contains_key("if-none-match")) =>
        {
            if op == "CompleteMultipartUpload"
                && let Some((_, id)) = query.iter().find(|(k, _)| k == "uploadId")
            {
                crate::multipart::remove_upload(state, bucket, id);
            }
            return Err(crate::objects::conditional_conflict().into());
        }
        Some(Fault::ConditionalConflict) => state
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .not_applied(Fault::ConditionalConflict, op),
        Some(Fault::LostAnswer) | None => {}
    }

    let ctx = Ctx {
        method: method.clone(),
        headers: headers.clone(),
        query,
        bucket: bucket.to_string(),
        key: key.to_string(),
        principal,
        body_fault,
    };
    let body = req.into_body();
    let answer = match op {
        "ListBuckets" => crate::buckets::list_buckets(state),
        "CreateSession" => crate::buckets::create_session(state, &ctx),
        "HeadBucket" => crate::buckets::head_bucket(state, &ctx),
        "CreateBucket" => crate::buckets::create_bucket(state, &ctx),
        "DeleteBucket" => crate::buckets::delete_bucket(state, &ctx),
        "GetBucketLocation" => crate::buckets::location(state, &ctx),
        "ListObjectsV2" => crate::listing::list_objects_v2(state, &ctx),
        "ListObjects" => Err(S3Error::not_implemented(
            "ListObjects (v1); use ListObjectsV2",
        )),
        "ListMultipartUploads" => crate::multipart::list_uploads(state, &ctx),
        "DeleteObjects" => crate::objects::delete_objects(state, &ctx, body).await,
        "GetObject" | "HeadObject" => crate::objects::get_object(state, &ctx),
        "PutObject" => crate::objects::put_object(state, &ctx, body).await,
        "CopyObject" => crate::copy::copy_object(state, &ctx).await,
        "UploadPartCopy" => crate::copy::upload_part_copy(state, &ctx).await,
        "RenameObject" => crate::objects::rename_object(state, &ctx),
        "DeleteObject" => crate::objects::delete_object(state, &ctx),
        "CreateMultipartUpload" => crate::multipart::create(state, &ctx),
        "UploadPart" => crate::multipart::upload_part(state, &ctx, body).await,
        "CompleteMultipartUpload" => crate::multipart::complete(state, &ctx, body).await,
        "AbortMultipartUpload" => crate::multipart::abort(state, &ctx),
        "ListParts" => crate::multipart::list_parts(state, &ctx),
        _ => Err(S3Error::not_implemented(op)),
    };
    match answer {
        Ok(r) if lose_answer && r.status().is_success() => Err(Outcome::Drop),
        Err(e) if lose_answer => {
            // Only a success is lost: the fault is taken back from the report.
            state
                .faults
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .not_applied(Fault::LostAnswer, op);
            Err(Outcome::Error(e))
        }
        answer => answer.map_err(Outcome::Error),
    }
}

/// Whether the request is its client's first attempt: the AWS SDKs number attempts in `amz-sdk-request`; a
/// request without the header counts as a first attempt.
fn first_attempt(headers: &HeaderMap) -> bool {
    headers
        .get("amz-sdk-request")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').find_map(|p| p.trim().strip_prefix("attempt=")))
        .is_none_or(|n| n.trim() == "1")
}

/// Reads a small request body (XML documents) into memory, refusing more than `limit` bytes.
pub async fn small_body(ctx: &Ctx, body: Incoming, limit: usize) -> Result<Bytes, S3Error> {
    let chunked = crate::objects::is_aws_chunked(ctx);
    let collected = http_body_util::Limited::new(body, limit)
        .collect()
        .await
        .map_err(|e| S3Error::new(400, "MalformedXML", format!("request body: {e}")))?
        .to_bytes();
    if chunked {
        crate::body::decode_chunked(&collected).map(Bytes::from)
    } else {
        Ok(collected)
    }
}

async fn admin(state: &State, req: Request<Incoming>) -> Response<ResponseBody> {
    let path = req.uri().path().to_string();
    let query = sigv4::parse_query(req.uri().query().unwrap_or(""));
    let json = |status: u16, body: String| {
        let mut r = respond(status, ResponseBody::full(body));
        set_header(&mut r, "content-type", "application/json");
        r
    };
    match (req.method().as_str(), path.as_str()) {
        ("GET", "/_emulator/health") => json(200, "{\"ok\":true}".into()),
        ("GET", "/_emulator/stats") => json(200, state.store.stats_json()),
        ("POST", "/_emulator/stats/reset") => {
            state.store.reset_stats();
            json(200, "{}".into())
        }
        ("GET", "/_emulator/faults") => {
            let faults = state.faults.lock().unwrap_or_else(|e| e.into_inner());
            json(200, faults.report().to_string())
        }
        ("POST", "/_emulator/pause") => {
            // Whole-server pause: every S3 request that arrives (or is waiting) before the deadline is held.
            let ms = query
                .iter()
                .find(|(k, _)| k == "ms")
                .and_then(|(_, v)| v.parse::<u64>().ok());
            match ms {
                Some(ms) if ms <= 600_000 => {
                    *state.paused_until.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(Instant::now() + Duration::from_millis(ms));
                    json(200, format!("{{\"paused_ms\":{ms}}}"))
                }
                _ => json(
                    400,
                    "{\"error\":\"pause needs ?ms=N (at most 600000)\"}".into(),
                ),
            }
        }
        ("POST", "/_emulator/faults") => {
            let body = match http_body_util::Limited::new(req.into_body(), 64 * 1024)
                .collect()
                .await
            {
                Ok(b) => b.to_bytes(),
                Err(e) => return json(400, format!("{{\"error\":{:?}}}", e.to_string())),
            };
            let parsed = serde_json::from_slice::<crate::FaultConfig>(&body)
                .map_err(|e| e.to_string())
                .and_then(Faults::new);
            match parsed {
                Ok(f) => {
                    *state.faults.lock().unwrap_or_else(|e| e.into_inner()) = f;
                    json(200, "{}".into())
                }
                Err(e) => json(400, format!("{{\"error\":{e:?}}}")),
            }
        }
        ("POST", "/_emulator/public") => match param(&query, "bucket") {
            Some(bucket) => {
                state.access.set_public(bucket);
                json(200, "{}".into())
            }
            None => json(400, "{\"error\":\"public needs ?bucket=NAME\"}".into()),
        },
        ("POST", "/_emulator/alias") => match (param(&query, "alias"), param(&query, "bucket")) {
            (Some(alias), Some(bucket)) => {
                state.access.set_alias(alias, bucket);
                json(200, "{}".into())
            }
            _ => json(400, "{\"error\":\"alias needs ?alias=A&bucket=B\"}".into()),
        },
        ("POST", "/_emulator/requests/record") => {
            state
                .access
                .set_recording(param(&query, "on") != Some("false"));
            json(200, "{}".into())
        }
        ("GET", "/_emulator/requests") => json(
            200,
            state.access.recorded(
                param(&query, "bucket"),
                param(&query, "key"),
                param(&query, "op"),
            ),
        ),
        ("GET", "/_emulator/uploads") => {
            let bucket = query
                .iter()
                .find(|(k, _)| k == "bucket")
                .map(|(_, v)| v.as_str())
                .unwrap_or("");
            let buckets = state.store.buckets();
            match buckets.get(bucket) {
                Some(b) => {
                    let list: Vec<serde_json::Value> = b
                        .uploads
                        .iter()
                        .map(|(id, u)| serde_json::json!({"key": u.key, "upload_id": id, "parts": u.parts.len()}))
                        .collect();
                    json(200, serde_json::to_string(&list).unwrap_or_default())
                }
                None => json(404, "{\"error\":\"no such bucket\"}".into()),
            }
        }
        _ => json(404, "{\"error\":\"unknown admin endpoint\"}".into()),
    }
}

fn param<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}
