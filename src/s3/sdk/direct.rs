//! GetObject without the SDK's orchestrator.
//!
//! A small file read once costs one GET, and through the SDK's orchestrator a GET costs about twice the CPU
//! of the same signed request sent from here over the same HTTP stack (`expressfs-get-cost`,
//! docs/BENCHMARKS.md, "GETs without the orchestrator"). So the read path's GETs are sent here, and
//! everything else (HEAD, LIST, writes, CreateSession) stays with the SDK:
//! - endpoint and signing scheme come from the SDK's endpoint rules, once;
//! - credentials come from the SDK: its credentials provider (general-purpose buckets), or a CreateSession
//!   sent through the SDK client (directory buckets); both are kept until shortly before they expire;
//! - the request is signed with aws-sigv4, the SDK's own signer, with the settings the SDK uses for S3;
//! - it travels over aws-smithy-http-client's connector, the SDK's HTTP stack, with the same TLS trust and
//!   `--bind` interfaces;
//! - answers are classified by [`classify`], as SDK answers are, and transient failures are retried with the
//!   SDK's backoff and a retry quota of the same shape.
//!
//! A configuration this path does not cover (unsigned requests, SSE flags, an auth scheme other than SigV4,
//! headers a directory bucket's session would not carry) keeps every GET on the SDK.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sdk_s3::config::endpoint::{DefaultResolver, Params, ResolveEndpoint};
use aws_sdk_s3::primitives::ByteStream;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode, sign,
};
use aws_smithy_runtime_api::client::http::{HttpConnector, SharedHttpConnector};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_types::Document;
use aws_smithy_types::body::SdkBody;
use tracing::debug;

use super::errors::{classify, create_session_failure, describe};
use super::{INITIAL_BACKOFF, MAX_BACKOFF, RETRY_QUOTA_REFILL_PER_SEC, SdkClient, SdkClientConfig};
use crate::s3::ClientError;

/// What a GET answered: the headers the read path uses, and the body still streaming.
pub(super) struct GetAnswer {
    pub content_length: Option<u64>,
    pub content_range: Option<String>,
    pub e_tag: Option<String>,
    pub last_modified: Option<aws_smithy_types::DateTime>,
    pub metadata: HashMap<String, String>,
    pub body: ByteStream,
}

impl From<aws_sdk_s3::operation::get_object::GetObjectOutput> for GetAnswer {
    fn from(out: aws_sdk_s3::operation::get_object::GetObjectOutput) -> GetAnswer {
        GetAnswer {
            content_length: super::non_negative(out.content_length),
            content_range: out.content_range,
            e_tag: out.e_tag,
            last_modified: out.last_modified,
            metadata: out.metadata.unwrap_or_default(),
            body: out.body,
        }
    }
}

/// How requests are signed: the SigV4 service name and region the endpoint rules chose.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Signing {
    name: String,
    region: String,
    /// S3 Express session auth: the session token travels as `x-amz-s3session-token`.
    express: bool,
}

/// Credentials, with the time after which they are fetched again.
#[derive(Clone)]
struct Held {
    credentials: Credentials,
    refresh_at: Option<Instant>,
}

pub(super) struct DirectGet {
    connector: SharedHttpConnector,
    /// The bucket's endpoint as the rules give it (with the bucket in the path for path-style), no `/` at the end.
    base: String,
    signing: Signing,
    /// Signed headers every GET carries (requester pays, expected owner).
    extra_headers: Vec<(&'static str, String)>,
    user_agent: String,
    /// None for directory buckets: their credentials come from CreateSession.
    provider: Option<SharedCredentialsProvider>,
    held: Mutex<Option<Held>>,
    /// One fetch of credentials at a time; the others wait for its result.
    fetching: tokio::sync::Mutex<()>,
    attempt_timeout: Duration,
    max_attempts: u32,
    quota: RetryQuota,
}

impl DirectGet {
    /// None when this configuration keeps GETs on the SDK (see the module docs).
    pub(super) async fn for_config(
        config: &SdkClientConfig,
        provider: Option<SharedCredentialsProvider>,
    ) -> Result<Option<DirectGet>, String> {
        let Some(provider) = provider else {
            return Ok(None);
        };
        let session_headers = config.requester_pays || config.expected_bucket_owner.is_some();
        if config.no_sign_request
            || config.sse.is_some()
            || config.sse_kms_key_id.is_some()
            || (config.is_directory_bucket && session_headers)
        {
            return Ok(None);
        }
        let Some((base, signing)) = bucket_endpoint(config).await? else {
            return Ok(None);
        };
        if signing.express != config.is_directory_bucket {
            return Ok(None);
        }
        let mut extra_headers = Vec::new();
        if config.requester_pays {
            extra_headers.push(("x-amz-request-payer", "requester".to_string()));
        }
        if let Some(owner) = &config.expected_bucket_owner {
            extra_headers.push(("x-amz-expected-bucket-owner", owner.clone()));
        }
        let agent = format!("expressfs/{}", env!("CARGO_PKG_VERSION"));
        Ok(Some(DirectGet {
            connector: super::options::direct_connector(config)?,
            base,
            signing,
            extra_headers,
            user_agent: match &config.user_agent_prefix {
                Some(prefix) => format!("{prefix} {agent}"),
                None => agent,
            },
            provider: (!config.is_directory_bucket).then_some(provider),
            held: Mutex::new(None),
            fetching: tokio::sync::Mutex::new(()),
            attempt_timeout: config.first_byte_timeout,
            max_attempts: config.max_attempts.max(1),
            quota: RetryQuota::new(),
        }))
    }

    /// One GET of `range_header` (`bytes=a-b`), retried while the failure is transient, within the attempt
    /// budget and the retry quota. On a directory bucket, an answer rejecting the session gets a new one.
    pub(super) async fn get(
        &self,
        sdk: &SdkClient,
        key: &str,
        range_header: &str,
        if_match: Option<&str>,
    ) -> Result<GetAnswer, ClientError> {
        let bucket = &sdk.config.bucket;
        let mut attempt = 0u32;
        let mut bare_400_retried = false;
        loop {
            attempt += 1;
            let result = self.attempt(sdk, key, range_header, if_match).await;
            let last = attempt >= self.max_attempts;
            match &result {
                Ok(_) => self.quota.succeeded(),
                Err(ClientError::Transient { code, .. }) if !last => {
                    if self.quota.take(code == "Timeout") {
                        debug!(bucket, key, attempt, code, "GET failed; retrying");
                        tokio::time::sleep(sdk_backoff(attempt)).await;
                        continue;
                    }
                }
                Err(e)
                    if self.signing.express
                        && !last
                        && self.session_rejected(e, &mut bare_400_retried) =>
                {
                    self.forget(sdk);
                    tokio::time::sleep(super::backoff_delay(attempt)).await;
                    continue;
                }
                Err(_) => {}
            }
            return result;
        }
    }

    /// An answer saying our S3 Express session is no longer valid (revoked, or expired early).
    fn session_rejected(&self, e: &ClientError, bare_400_retried: &mut bool) -> bool {
        match e {
            ClientError::AccessDenied { code, .. } => code == "ExpiredToken",
            ClientError::Service {
                status: 400, code, ..
            } if code.is_empty() && !*bare_400_retried => {
                *bare_400_retried = true;
                true
            }
            _ => false,
        }
    }

    /// Drops the held session; the next GET creates another.
    fn forget(&self, sdk: &SdkClient) {
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = None;
        sdk.session_renewals.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(bucket = %sdk.config.bucket, "session rejected; creating a new one");
    }

    async fn attempt(
        &self,
        sdk: &SdkClient,
        key: &str,
        range_header: &str,
        if_match: Option<&str>,
    ) -> Result<GetAnswer, ClientError> {
        let credentials = self.credentials(sdk).await?;
        let request = self.signed_request(&credentials, key, range_header, if_match)?;
        let call = self.connector.call(request);
        let response = match tokio::time::timeout(self.attempt_timeout, call).await {
            Err(_) => {
                return Err(ClientError::Transient {
                    code: "Timeout".into(),
                    message: format!("no answer to GET {key} within {:?}", self.attempt_timeout),
                });
            }
            Ok(Err(e)) => return Err(connector_failure(&e)),
            Ok(Ok(response)) => response,
        };
        let status = response.status().as_u16();
        let request_id = response
            .headers()
            .get("x-amz-request-id")
            .unwrap_or_default();
        debug!(status, request_id, "GET attempt answered");
        if !(200..300).contains(&status) {
            let body = error_body(response.into_body()).await;
            let (code, message) = error_code_and_message(&body);
            return Err(classify(
                status,
                code.as_deref(),
                &message,
                &sdk.config.bucket,
                key,
            ));
        }
        let headers = response.headers();
        let header = |name: &str| headers.get(name).map(str::to_string);
        let content_length = match headers.get("content-length") {
            Some(v) => Some(v.trim().parse::<u64>().map_err(|_| {
                ClientError::Malformed(format!("GET {key}: unparsable Content-Length {v:?}"))
            })?),
            None => None,
        };
        let last_modified = headers.get("last-modified").and_then(|v| {
            aws_smithy_types::DateTime::from_str(v, aws_smithy_types::date_time::Format::HttpDate)
                .ok()
        });
        let metadata = headers
            .iter()
            .filter_map(|(name, value)| {
                let name = name.to_ascii_lowercase();
                name.strip_prefix("x-amz-meta-")
                    .map(|k| (k.to_string(), value.to_string()))
            })
            .collect();
        Ok(GetAnswer {
            content_length,
            content_range: header("content-range"),
            e_tag: header("etag"),
            last_modified,
            metadata,
            body: ByteStream::new(response.into_body()),
        })
    }

    fn signed_request(
        &self,
        credentials: &Credentials,
        key: &str,
        range_header: &str,
        if_match: Option<&str>,
    ) -> Result<HttpRequest, ClientError> {
        let invalid = |what: String| ClientError::Service {
            status: 0,
            code: "RequestConstruction".into(),
            message: format!("GET {key}: {what}"),
        };
        let url = object_url(&self.base, key);
        let mut builder = http::Request::builder()
            .method("GET")
            .uri(&url)
            .header("range", range_header);
        if let Some(etag) = if_match {
            builder = builder.header("if-match", etag);
        }
        for (name, value) in &self.extra_headers {
            builder = builder.header(*name, value.as_str());
        }
        let mut request = builder
            .body(SdkBody::empty())
            .map_err(|e| invalid(e.to_string()))?;
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        if self.signing.express {
            settings.session_token_name_override = Some("x-amz-s3session-token");
        }
        let identity = credentials.clone().into();
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.signing.region)
            .name(&self.signing.name)
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| invalid(e.to_string()))?
            .into();
        let headers = request
            .headers()
            .iter()
            .map(|(k, v)| Ok((k.as_str(), v.to_str().map_err(|e| invalid(e.to_string()))?)))
            .collect::<Result<Vec<_>, ClientError>>()?;
        let signable = SignableRequest::new(
            "GET",
            &url,
            headers.into_iter(),
            SignableBody::UnsignedPayload,
        )
        .map_err(|e| invalid(e.to_string()))?;
        let (instructions, _signature) = sign(signable, &params)
            .map_err(|e| invalid(e.to_string()))?
            .into_parts();
        instructions.apply_to_request_http1x(&mut request);
        // After signing, as the SDK does: SigV4 leaves User-Agent out of the signature.
        if let Ok(agent) = http::HeaderValue::from_str(&self.user_agent) {
            request
                .headers_mut()
                .insert(http::header::USER_AGENT, agent);
        }
        HttpRequest::try_from(request).map_err(|e| invalid(e.to_string()))
    }

    /// The credentials to sign with, fetched again shortly before they expire.
    async fn credentials(&self, sdk: &SdkClient) -> Result<Credentials, ClientError> {
        if let Some(held) = self.fresh() {
            return Ok(held);
        }
        let _one_fetch = self.fetching.lock().await;
        if let Some(held) = self.fresh() {
            return Ok(held);
        }
        let credentials = match &self.provider {
            Some(provider) => provider
                .provide_credentials()
                .await
                .map_err(|e| credentials_failure(&e))?,
            None => self.create_session(sdk).await?,
        };
        let refresh_at = credentials.expiry().map(refresh_time);
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(Held {
            credentials: credentials.clone(),
            refresh_at,
        });
        Ok(credentials)
    }

    fn fresh(&self) -> Option<Credentials> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.as_ref()
            .filter(|h| h.refresh_at.is_none_or(|at| Instant::now() < at))
            .map(|h| h.credentials.clone())
    }

    async fn create_session(&self, sdk: &SdkClient) -> Result<Credentials, ClientError> {
        let (_, client) = sdk.current();
        let bucket = &sdk.config.bucket;
        let out = client
            .create_session()
            .bucket(bucket)
            .send()
            .await
            .map_err(|e| create_session_failure(&e, bucket))?;
        let Some(c) = out.credentials else {
            return Err(ClientError::Malformed(
                "CreateSession answer without credentials".into(),
            ));
        };
        let expiry = SystemTime::try_from(c.expiration).ok();
        Ok(Credentials::new(
            c.access_key_id,
            c.secret_access_key,
            Some(c.session_token),
            expiry,
            "expressfs-s3express-session",
        ))
    }
}

/// When credentials expiring at `expiry` are fetched again: a fifth of their remaining life early, at most a
/// minute early (an S3 Express session lives five minutes).
fn refresh_time(expiry: SystemTime) -> Instant {
    let left = expiry
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    let early = (left / 5).min(Duration::from_secs(60));
    Instant::now() + (left - early)
}

/// The endpoint the rules give a request on this bucket, and how to sign for it. None when the rules ask for
/// a scheme this module does not speak (SigV4a, S3 on Outposts, Object Lambda).
async fn bucket_endpoint(config: &SdkClientConfig) -> Result<Option<(String, Signing)>, String> {
    let params = Params::builder()
        .bucket(config.bucket.clone())
        .region(config.region.clone())
        .use_fips(false)
        .use_dual_stack(config.dual_stack)
        .accelerate(config.transfer_acceleration)
        .force_path_style(config.force_path_style)
        .set_endpoint(config.endpoint_url.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let endpoint = DefaultResolver::new()
        .resolve_endpoint(&params)
        .await
        .map_err(|e| describe(&*e))?;
    let base = endpoint.url().trim_end_matches('/').to_string();
    // Newer SDKs give the schemes apart from the properties; older ones kept them in `authSchemes`.
    let first = match endpoint.auth_schemes().first() {
        Some(scheme) => Some(scheme.as_document()),
        None => match endpoint.properties().get("authSchemes") {
            Some(Document::Array(schemes)) => schemes.first().cloned(),
            _ => None,
        },
    };
    let signing = first.and_then(|scheme| signing_of(&scheme, &config.region));
    Ok(signing.map(|s| (base, s)))
}

/// How to sign for the endpoint's first auth scheme, when it is SigV4 (plain or S3 Express) on S3.
fn signing_of(scheme: &Document, default_region: &str) -> Option<Signing> {
    let Document::Object(scheme) = scheme else {
        return None;
    };
    let text = |name: &str| match scheme.get(name) {
        Some(Document::String(s)) => Some(s.as_str()),
        _ => None,
    };
    let express = match text("name")? {
        "sigv4" => false,
        "sigv4-s3express" => true,
        _ => return None,
    };
    let name = text("signingName")?;
    if name != if express { "s3express" } else { "s3" } {
        return None;
    }
    // The signer must not encode the path again: S3 signs the path as sent.
    if matches!(
        scheme.get("disableDoubleEncoding"),
        Some(Document::Bool(false))
    ) {
        return None;
    }
    Some(Signing {
        name: name.to_string(),
        region: text("signingRegion").unwrap_or(default_region).to_string(),
        express,
    })
}

/// The object's URL, its key encoded as the SDK encodes GetObject's greedy `{Key+}` label.
fn object_url(base: &str, key: &str) -> String {
    let encoded =
        aws_smithy_http::label::fmt_string(key, aws_smithy_http::label::EncodingStrategy::Greedy);
    format!("{base}/{encoded}")
}

fn connector_failure(e: &ConnectorError) -> ClientError {
    let detail = describe(e);
    if e.is_timeout() {
        ClientError::Transient {
            code: "Timeout".into(),
            message: detail,
        }
    } else if e.is_io() || e.as_other() == Some(aws_smithy_types::retry::ErrorKind::TransientError)
    {
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

fn credentials_failure(e: &CredentialsError) -> ClientError {
    let detail = describe(e);
    match e {
        CredentialsError::ProviderTimedOut(_) => ClientError::Transient {
            code: "CredentialsTimeout".into(),
            message: detail,
        },
        _ => ClientError::NoCredentials(detail),
    }
}

/// Reads an error answer's body: at most 64 KiB and 5 seconds (error documents are small).
async fn error_body(body: SdkBody) -> String {
    const MOST: usize = 64 << 10;
    let mut stream = ByteStream::new(body);
    let mut out = Vec::new();
    let read = async {
        while let Some(Ok(chunk)) = stream.next().await {
            out.extend_from_slice(&chunk[..chunk.len().min(MOST - out.len())]);
            if out.len() >= MOST {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// `<Code>` and `<Message>` of an S3 error document; no code when the body is not one.
fn error_code_and_message(body: &str) -> (Option<String>, String) {
    let element = |name: &str| {
        let open = format!("<{name}>");
        let close = format!("</{name}>");
        let start = body.find(&open)? + open.len();
        let end = start + body[start..].find(&close)?;
        Some(unescape(&body[start..end]))
    };
    let code = element("Code").filter(|c| !c.is_empty());
    (code, element("Message").unwrap_or_default())
}

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// The SDK's standard backoff: exponential, capped, full jitter.
fn sdk_backoff(attempt: u32) -> Duration {
    let cap = INITIAL_BACKOFF
        .saturating_mul(1 << attempt.saturating_sub(1).min(10))
        .min(MAX_BACKOFF);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    cap.mul_f64(f64::from(nanos % 1000) / 1000.0)
}

/// The SDK's retry quota, same shape: 500 tokens, a retry costs 5 (10 after a timeout), a success gives one
/// back, and the quota refills over time. When it is empty, failures are returned without retrying.
struct RetryQuota {
    state: Mutex<(f64, Instant)>,
}

impl RetryQuota {
    const CAPACITY: f64 = 500.0;

    fn new() -> RetryQuota {
        RetryQuota {
            state: Mutex::new((Self::CAPACITY, Instant::now())),
        }
    }

    fn refill(state: &mut (f64, Instant)) {
        let now = Instant::now();
        let added =
            now.duration_since(state.1).as_secs_f64() * f64::from(RETRY_QUOTA_REFILL_PER_SEC);
        state.0 = (state.0 + added).min(Self::CAPACITY);
        state.1 = now;
    }

    fn take(&self, after_timeout: bool) -> bool {
        let cost = if after_timeout { 10.0 } else { 5.0 };
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        Self::refill(&mut state);
        if state.0 < cost {
            return false;
        }
        state.0 -= cost;
        true
    }

    fn succeeded(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.0 < Self::CAPACITY {
            state.0 = (state.0 + 1.0).min(Self::CAPACITY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scheme(pairs: &[(&str, Document)]) -> Document {
        Document::Object(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        )
    }

    fn s(text: &str) -> Document {
        Document::String(text.into())
    }

    #[test]
    fn sigv4_schemes_on_s3_are_spoken_and_others_are_left_to_the_sdk() {
        let express = scheme(&[
            ("name", s("sigv4-s3express")),
            ("signingName", s("s3express")),
            ("signingRegion", s("us-east-1")),
            ("disableDoubleEncoding", Document::Bool(true)),
        ]);
        assert_eq!(
            signing_of(&express, "eu-west-1"),
            Some(Signing {
                name: "s3express".into(),
                region: "us-east-1".into(),
                express: true
            })
        );
        let plain = scheme(&[("name", s("sigv4")), ("signingName", s("s3"))]);
        assert_eq!(
            signing_of(&plain, "eu-west-1"),
            Some(Signing {
                name: "s3".into(),
                region: "eu-west-1".into(),
                express: false
            })
        );
        let sigv4a = scheme(&[("name", s("sigv4a")), ("signingName", s("s3"))]);
        assert_eq!(signing_of(&sigv4a, "us-east-1"), None);
        let outposts = scheme(&[("name", s("sigv4")), ("signingName", s("s3-outposts"))]);
        assert_eq!(signing_of(&outposts, "us-east-1"), None);
        let double = scheme(&[
            ("name", s("sigv4")),
            ("signingName", s("s3")),
            ("disableDoubleEncoding", Document::Bool(false)),
        ]);
        assert_eq!(signing_of(&double, "us-east-1"), None);
        assert_eq!(signing_of(&Document::Array(vec![]), "us-east-1"), None);
        assert_eq!(
            signing_of(&scheme(&[("signingName", s("s3"))]), "us-east-1"),
            None
        );
    }

    #[test]
    fn keys_are_encoded_as_the_sdk_encodes_them() {
        assert_eq!(
            object_url("http://h:1/b", "dir/a b+c%é.jpg"),
            "http://h:1/b/dir/a%20b%2Bc%25%C3%A9.jpg"
        );
        assert_eq!(
            object_url("https://b.s3.x", "/lead"),
            "https://b.s3.x//lead"
        );
    }

    #[test]
    fn error_documents_give_code_and_message() {
        let body = "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>a &amp; b</Message></Error>";
        assert_eq!(
            error_code_and_message(body),
            (Some("NoSuchKey".into()), "a & b".into())
        );
        assert_eq!(error_code_and_message("<html>oops"), (None, String::new()));
        assert_eq!(
            error_code_and_message("<Error><Code></Code></Error>").0,
            None
        );
    }

    #[test]
    fn credentials_are_fetched_again_before_they_expire() {
        let now = Instant::now();
        let five_minutes = refresh_time(SystemTime::now() + Duration::from_secs(300));
        let after = five_minutes.duration_since(now);
        assert!(
            after >= Duration::from_secs(239) && after <= Duration::from_secs(241),
            "{after:?}"
        );
        let two_seconds = refresh_time(SystemTime::now() + Duration::from_secs(2));
        let after = two_seconds.duration_since(now);
        assert!(
            after >= Duration::from_millis(1500) && after <= Duration::from_millis(1700),
            "{after:?}"
        );
        // Already expired: fetch again at once.
        assert!(refresh_time(SystemTime::now() - Duration::from_secs(1)) <= Instant::now());
    }

    #[test]
    fn the_retry_quota_runs_dry_and_successes_give_back() {
        let quota = RetryQuota::new();
        let mut granted = 0;
        while quota.take(true) {
            granted += 1;
            assert!(granted <= 60, "the quota never ran dry");
        }
        // 500 tokens at 10 a retry after a timeout (plus what refills meanwhile).
        assert!((50..=51).contains(&granted), "{granted}");
        for _ in 0..5 {
            quota.succeeded();
        }
        assert!(quota.take(false));
    }

    #[test]
    fn backoff_stays_under_its_cap() {
        for attempt in 1..20 {
            let cap = INITIAL_BACKOFF
                .saturating_mul(1 << (attempt - 1).min(10))
                .min(MAX_BACKOFF);
            assert!(sdk_backoff(attempt) <= cap);
        }
    }
}
