//! GetObject and ListObjectsV2 without the SDK's orchestrator.
//!
//! A small file read once costs one GET, and through the SDK's orchestrator a GET costs about twice the CPU
//! of the same signed request sent from here over the same HTTP stack (`expressfs-get-cost`,
//! docs/BENCHMARKS.md, "GETs without the orchestrator"). A listing page of 1,000 keys cost about twice as much
//! through the SDK as read here, most of it the SDK's XML deserializer (BENCHMARKS, "LIST without the
//! orchestrator"), and a directory being read is listed again once per TTL. So the read path's GETs and every
//! listing are sent here, and everything else (HEAD, writes, CreateSession) stays with the SDK:
//! - endpoint and signing scheme come from the SDK's endpoint rules, once;
//! - credentials come from the SDK: its credentials provider (general-purpose buckets), or a CreateSession
//!   sent through the SDK client (directory buckets); both are kept until shortly before they expire;
//! - the request is signed with aws-sigv4, the SDK's own signer, with the settings the SDK uses for S3;
//! - it travels over aws-smithy-http-client's connector, the SDK's HTTP stack, with the same TLS trust and
//!   `--bind` interfaces;
//! - answers are classified by [`classify`], as SDK answers are, and transient failures are retried with the
//!   SDK's backoff and a retry quota of the same shape.
//!
//! - no `x-amz-checksum-mode`: S3 returns full-object checksums only on 200 answers, and these GETs are
//!   ranged (206); get.rs checks every answer's Content-Range and length instead.
//! - a listing's answer is read by `list_xml.rs` and checked as the SDK's answer was (`checked_page`).
//!
//! A configuration this path does not cover (unsigned requests, SSE flags, an auth scheme other than SigV4,
//! headers a directory bucket's session would not carry) keeps every GET and listing on the SDK.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sdk_s3::primitives::ByteStream;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode, sign,
};
use aws_smithy_runtime_api::client::http::{HttpConnector, SharedHttpConnector};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_types::Document;
use aws_smithy_types::body::SdkBody;
use tracing::debug;

use super::errors::{classify, create_session_failure, describe, dispatch_failure};
use super::{
    INITIAL_BACKOFF, MAX_BACKOFF, RETRY_QUOTA_REFILL_PER_SEC, SdkClient, SdkClientConfig,
    session_rejected, unit_random,
};
use crate::s3::ClientError;

/// One request of this path: always a GET (of an object, or of the bucket for a listing).
struct Request<'a> {
    /// For logs and errors: `GET` or `LIST`.
    op: &'static str,
    url: String,
    /// The object's key, or empty for a bucket-level request (a 404 then means the bucket is missing).
    key: &'a str,
    /// Headers besides the signature's and the configuration's (range, if-match).
    headers: Vec<(&'static str, String)>,
}

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
    refresh_at: Instant,
    /// Which fetch this was: a rejection drops the credentials only if no newer fetch replaced them.
    generation: u64,
}

/// How long a credentials fetch may take (the SDK's identity cache allows the same).
const CREDENTIALS_TIMEOUT: Duration = Duration::from_secs(5);
/// Credentials without an expiry are fetched again this often (the SDK's identity cache does the same).
const CREDENTIALS_WITHOUT_EXPIRY: Duration = Duration::from_secs(15 * 60);
/// Error codes S3 uses for throttling: a retry after one costs less quota, as in the SDK.
const THROTTLING_CODES: &[&str] = &[
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "TooManyRequests",
    "RequestLimitExceeded",
    "HTTP429",
];

pub(super) struct Direct {
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
    generations: AtomicU64,
    /// One fetch of credentials at a time; the others wait for its result.
    fetching: tokio::sync::Mutex<()>,
    /// Server clock minus ours, in ms, learned from a RequestTimeTooSkewed answer (the SDK corrects the same).
    skew_ms: AtomicI64,
    attempt_timeout: Duration,
    max_attempts: u32,
    quota: RetryQuota,
}

impl Direct {
    /// None when this configuration keeps GETs on the SDK (see the module docs).
    pub(super) async fn for_config(
        config: &SdkClientConfig,
        shared: &aws_types::SdkConfig,
    ) -> Result<Option<Direct>, String> {
        let Some(provider) = shared.credentials_provider() else {
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
        let Some((base, signing)) = bucket_endpoint(config, shared).await? else {
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
        Ok(Some(Direct {
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
            generations: AtomicU64::new(0),
            fetching: tokio::sync::Mutex::new(()),
            skew_ms: AtomicI64::new(0),
            attempt_timeout: config.first_byte_timeout,
            max_attempts: config.max_attempts.max(1),
            quota: RetryQuota::new(),
        }))
    }

    /// One GET of `range_header` (`bytes=a-b`): its headers checked, its body still streaming.
    pub(super) async fn get(
        &self,
        sdk: &SdkClient,
        key: &str,
        range_header: &str,
        if_match: Option<&str>,
    ) -> Result<GetAnswer, ClientError> {
        let mut headers = vec![("range", range_header.to_string())];
        if let Some(etag) = if_match {
            headers.push(("if-match", etag.to_string()));
        }
        let request = Request {
            op: "GET",
            url: object_url(&self.base, key),
            key,
            headers,
        };
        self.send(sdk, &request, |response| async move {
            parse_answer(key, response)
        })
        .await
    }

    /// One page of ListObjectsV2, its body read whole and parsed here (`list_xml.rs`): through the SDK, the
    /// deserializer was most of the CPU a directory's listing cost (perf, BENCHMARKS "LIST without the
    /// orchestrator"). A body that breaks is a transient failure, sent again.
    pub(super) async fn list(
        &self,
        sdk: &SdkClient,
        prefix: &str,
        delimiter: Option<&str>,
        continuation_token: Option<&str>,
        max_keys: i32,
    ) -> Result<crate::s3::ListPage, ClientError> {
        let request = Request {
            op: "LIST",
            url: list_url(&self.base, prefix, delimiter, continuation_token, max_keys),
            // Bucket-level: a 404 is a missing bucket.
            key: "",
            headers: Vec::new(),
        };
        let stall = sdk.config.stall_timeout;
        self.send(sdk, &request, |response| async move {
            let body = whole_body(response, stall, MOST_LISTING_BYTES).await?;
            super::list_xml::parse_list_page(&body)
        })
        .await
    }

    /// Sends `request`, retried while the failure is transient, within the attempt budget and the retry quota;
    /// `finish` turns a 2xx answer into the result (its failures are retried too when transient). An answer
    /// rejecting our credentials (a directory bucket's session, or credentials that expired under a request to
    /// a general-purpose bucket) gets new ones, and so does a CreateSession answered ExpiredToken (as
    /// `SdkClient::run` does for the SDK's own requests). Any other failure to get credentials ends the
    /// request at once: the SDK already retried the CreateSession or the provider behind it.
    async fn send<T, F, Fut>(
        &self,
        sdk: &SdkClient,
        request: &Request<'_>,
        finish: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(HttpResponse) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let bucket = &sdk.config.bucket;
        let (op, key) = (request.op, request.key);
        let mut attempt = 0u32;
        let mut bare_400_retried = false;
        let mut skew_retried = false;
        // New credentials are not a retry of a failed request: the first renewal is allowed even on the last
        // attempt (AWS_MAX_ATTEMPTS=1 would otherwise fail every request a session expired early under).
        let mut renewals = 0u32;
        // Quota held by the latest retry, given back if the request then succeeds (as the SDK does).
        let mut held_quota = None;
        loop {
            attempt += 1;
            let last = attempt >= self.max_attempts;
            let (credentials, generation) = match self.credentials(sdk).await {
                Ok(held) => held,
                Err(e)
                    if self.signing.express
                        && (!last || renewals == 0)
                        && session_rejected(&e, &mut bare_400_retried) =>
                {
                    renewals += 1;
                    debug!(bucket, key, attempt, op, "CreateSession refused; retrying");
                    tokio::time::sleep(super::backoff_delay(attempt)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let result = match self.attempt(sdk, &credentials, request).await {
                Ok(response) => finish(response).await,
                Err(e) => Err(e),
            };
            match &result {
                Ok(_) => {
                    if let Some(cost) = held_quota {
                        self.quota.give_back(cost);
                    }
                }
                Err(ClientError::Transient { code, .. }) if !last => {
                    if let Some(cost) = self.quota.take(retry_cost(code)) {
                        held_quota = Some(cost);
                        debug!(bucket, key, attempt, code, op, "request failed; retrying");
                        tokio::time::sleep(sdk_backoff(attempt)).await;
                        continue;
                    }
                }
                Err(ClientError::AccessDenied { code, .. })
                    if code == "RequestTimeTooSkewed" && !skew_retried && !last =>
                {
                    // The answer taught us the server's clock: sign again with it.
                    skew_retried = true;
                    continue;
                }
                // The session's on a directory bucket, the provider's on a general-purpose one: new ones may
                // be good.
                Err(e)
                    if (!last || renewals == 0) && session_rejected(e, &mut bare_400_retried) =>
                {
                    renewals += 1;
                    self.forget(sdk, generation);
                    tokio::time::sleep(super::backoff_delay(attempt)).await;
                    continue;
                }
                Err(_) => {}
            }
            return result;
        }
    }

    /// Drops the credentials of `generation` (a directory bucket's session, or what the provider gave)
    /// unless newer ones replaced them already (GETs rejected together renew them once); the next GET asks
    /// for new ones.
    fn forget(&self, sdk: &SdkClient, generation: u64) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.as_ref().is_some_and(|h| h.generation == generation) {
            *held = None;
            sdk.session_renewals.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                bucket = %sdk.config.bucket,
                "session or credentials rejected; asking for new ones"
            );
        }
    }

    /// One try: the answer when it is a 2xx, its error classified otherwise.
    async fn attempt(
        &self,
        sdk: &SdkClient,
        credentials: &Credentials,
        request: &Request<'_>,
    ) -> Result<HttpResponse, ClientError> {
        let (op, key) = (request.op, request.key);
        let call = self
            .connector
            .call(self.signed_request(credentials, request)?);
        let response = match tokio::time::timeout(self.attempt_timeout, call).await {
            Err(_) => {
                return Err(ClientError::Transient {
                    code: "Timeout".into(),
                    message: format!("no answer to {op} {key} within {:?}", self.attempt_timeout),
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
        debug!(status, request_id, op, "attempt answered");
        if !(200..300).contains(&status) {
            let server_date = response.headers().get("date").and_then(http_date);
            let body = error_body(response.into_body()).await;
            let (code, message) = error_code_and_message(&body);
            if code.as_deref() == Some("RequestTimeTooSkewed")
                && let Some(date) = server_date
            {
                self.learn_skew(date);
            }
            return Err(classify(
                status,
                code.as_deref(),
                &message,
                &sdk.config.bucket,
                key,
            ));
        }
        Ok(response)
    }

    fn learn_skew(&self, server: aws_smithy_types::DateTime) {
        let Ok(server) = SystemTime::try_from(server) else {
            return;
        };
        let ms = match server.duration_since(SystemTime::now()) {
            Ok(ahead) => ahead.as_millis() as i64,
            Err(behind) => -(behind.duration().as_millis() as i64),
        };
        self.skew_ms.store(ms, Ordering::Relaxed);
        debug!(
            skew_ms = ms,
            "server clock differs from ours; signing with the server's"
        );
    }

    /// Now, by the server's clock as far as we know it.
    fn signing_time(&self) -> SystemTime {
        let skew = self.skew_ms.load(Ordering::Relaxed);
        let now = SystemTime::now();
        if skew >= 0 {
            now + Duration::from_millis(skew as u64)
        } else {
            now - Duration::from_millis(skew.unsigned_abs())
        }
    }

    fn signed_request(
        &self,
        credentials: &Credentials,
        request: &Request<'_>,
    ) -> Result<HttpRequest, ClientError> {
        let invalid = |what: String| ClientError::Service {
            status: 0,
            code: "RequestConstruction".into(),
            message: format!("{} {}: {what}", request.op, request.key),
        };
        let url = &request.url;
        let mut builder = http::Request::builder().method("GET").uri(url);
        for (name, value) in request.headers.iter().chain(&self.extra_headers) {
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
            .time(self.signing_time())
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
            url,
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

    /// The credentials to sign with and their generation, fetched again shortly before they expire.
    async fn credentials(&self, sdk: &SdkClient) -> Result<(Credentials, u64), ClientError> {
        if let Some(held) = self.fresh() {
            return Ok(held);
        }
        let _one_fetch = self.fetching.lock().await;
        if let Some(held) = self.fresh() {
            return Ok(held);
        }
        let fetch = async {
            match &self.provider {
                Some(provider) => provider
                    .provide_credentials()
                    .await
                    .map_err(|e| credentials_failure(&e)),
                None => self.create_session(sdk).await,
            }
        };
        let credentials = tokio::time::timeout(CREDENTIALS_TIMEOUT, fetch)
            .await
            .map_err(|_| ClientError::Transient {
                code: "CredentialsTimeout".into(),
                message: format!("no credentials within {CREDENTIALS_TIMEOUT:?}"),
            })??;
        let refresh_at = match credentials.expiry() {
            Some(expiry) => refresh_time(expiry),
            None => Instant::now() + CREDENTIALS_WITHOUT_EXPIRY,
        };
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(Held {
            credentials: credentials.clone(),
            refresh_at,
            generation,
        });
        Ok((credentials, generation))
    }

    fn fresh(&self) -> Option<(Credentials, u64)> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.as_ref()
            .filter(|h| Instant::now() < h.refresh_at)
            .map(|h| (h.credentials.clone(), h.generation))
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

/// The headers of a 2xx answer, checked, and its body still streaming.
fn parse_answer(key: &str, response: HttpResponse) -> Result<GetAnswer, ClientError> {
    // What the SDK refuses, we refuse: a header the read path relies on given twice, or unparsable.
    let headers = response.headers();
    let malformed = |what: String| ClientError::Malformed(format!("GET {key}: {what}"));
    let single = |name: &str| -> Result<Option<String>, ClientError> {
        let mut values = headers.get_all(name);
        let first = values.next().map(|v| v.trim().to_string());
        if values.next().is_some() {
            return Err(malformed(format!("{name} given twice")));
        }
        Ok(first)
    };
    let content_length = match single("content-length")? {
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| malformed(format!("unparsable Content-Length {v:?}")))?,
        ),
        None => None,
    };
    let last_modified = match single("last-modified")? {
        Some(v) => Some(
            http_date(&v).ok_or_else(|| malformed(format!("unparsable Last-Modified {v:?}")))?,
        ),
        None => None,
    };
    let mut metadata = HashMap::new();
    for (name, value) in headers.iter() {
        if let Some(k) = name.to_ascii_lowercase().strip_prefix("x-amz-meta-")
            && metadata
                .insert(k.to_string(), value.trim().to_string())
                .is_some()
        {
            return Err(malformed(format!("{name} given twice")));
        }
    }
    let content_range = single("content-range")?;
    let e_tag = single("etag")?;
    Ok(GetAnswer {
        content_length,
        content_range,
        e_tag,
        last_modified,
        metadata,
        body: ByteStream::new(response.into_body()),
    })
}

fn http_date(value: &str) -> Option<aws_smithy_types::DateTime> {
    aws_smithy_types::DateTime::from_str(
        value.trim(),
        aws_smithy_types::date_time::Format::HttpDate,
    )
    .ok()
}

/// Quota a retry costs, as the SDK's token bucket is configured (`SdkClient::new`): 5 after throttling, 10
/// after any other transient failure (timeouts, connection errors, 5xx).
fn retry_cost(code: &str) -> u32 {
    if THROTTLING_CODES.contains(&code) {
        5
    } else {
        10
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
async fn bucket_endpoint(
    config: &SdkClientConfig,
    shared: &aws_types::SdkConfig,
) -> Result<Option<(String, Signing)>, String> {
    // The settings the SDK client ends up with: our flags where we set them (`SdkClient::new`), otherwise
    // what aws-config loaded (AWS_ENDPOINT_URL[_S3], AWS_USE_FIPS_ENDPOINT, AWS_USE_DUALSTACK_ENDPOINT, the
    // profile), taken the way `aws_sdk_s3::config::Builder::from(&SdkConfig)` takes them.
    let endpoint = config
        .endpoint_url
        .clone()
        .or_else(|| shared_endpoint_url(shared));
    let endpoint = super::options::endpoint_of(
        config,
        endpoint,
        shared.use_fips().unwrap_or(false),
        config.dual_stack || shared.use_dual_stack().unwrap_or(false),
    )
    .await?;
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

/// The S3 endpoint URL aws-config loaded, if any: the service-specific one first unless one was set in code.
fn shared_endpoint_url(shared: &aws_types::SdkConfig) -> Option<String> {
    if shared.get_origin("endpoint_url").is_client_config() {
        return shared.endpoint_url().map(str::to_string);
    }
    let key = aws_types::service_config::ServiceConfigKey::builder()
        .service_id("S3")
        .env("AWS_ENDPOINT_URL")
        .profile("endpoint_url")
        .build()
        .ok()?;
    shared
        .service_config()
        .and_then(|c| c.load_config(key))
        .or_else(|| shared.endpoint_url().map(str::to_string))
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

/// The bucket's ListObjectsV2 URL: `/?list-type=2...` after the endpoint (the bucket's host, or the bucket
/// itself for path-style), as the SDK sends it. Values are encoded as the SDK encodes query parameters (a `+`
/// or a space in a prefix must not reach the server as a form-encoded space).
fn list_url(
    base: &str,
    prefix: &str,
    delimiter: Option<&str>,
    continuation_token: Option<&str>,
    max_keys: i32,
) -> String {
    use aws_smithy_http::query::fmt_string;
    let mut url = format!("{base}/?list-type=2&max-keys={max_keys}");
    if !prefix.is_empty() {
        url.push_str(&format!("&prefix={}", fmt_string(prefix)));
    }
    if let Some(delimiter) = delimiter {
        url.push_str(&format!("&delimiter={}", fmt_string(delimiter)));
    }
    if let Some(token) = continuation_token {
        url.push_str(&format!("&continuation-token={}", fmt_string(token)));
    }
    url
}

/// The most a listing page's answer may hold: 1,000 keys of at most 1,024 bytes, each character escaped as a
/// character reference, with their other fields, stay well under it.
const MOST_LISTING_BYTES: usize = 16 << 20;

/// A 2xx answer's body, whole. A body that breaks or stalls for `stall` is a transient failure: the request
/// is sent again. One longer than `most` is not an answer we asked for, and is not read further. Room for the
/// Content-Length it announces (never more than `most`) is made at once: grown by doubling, a listing page of
/// about 250 KB went through several big blocks, each on fresh pages. The length is only a size hint here.
async fn whole_body(
    response: HttpResponse,
    stall: Duration,
    most: usize,
) -> Result<Vec<u8>, ClientError> {
    let announced = response
        .headers()
        .get("content-length")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut stream = ByteStream::new(response.into_body());
    let mut out = Vec::with_capacity(announced.min(most));
    loop {
        let broken = |detail: String| ClientError::Transient {
            code: "BodyInterrupted".into(),
            message: detail,
        };
        match tokio::time::timeout(stall, stream.next()).await {
            Err(_) => return Err(broken(format!("no body bytes for {stall:?}"))),
            Ok(None) => return Ok(out),
            Ok(Some(Ok(chunk))) if out.len() + chunk.len() > most => {
                return Err(ClientError::Malformed(format!(
                    "answer longer than {most} bytes"
                )));
            }
            Ok(Some(Ok(chunk))) => out.extend_from_slice(&chunk),
            Ok(Some(Err(e))) => return Err(broken(describe(&e))),
        }
    }
}

fn connector_failure(e: &ConnectorError) -> ClientError {
    let transient = e.as_other() == Some(aws_smithy_types::retry::ErrorKind::TransientError);
    dispatch_failure(e.is_timeout(), e.is_io() || transient, describe(e))
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
    cap.mul_f64(unit_random())
}

/// The SDK's retry quota as `SdkClient::new` configures it: 500 tokens, refilled over time; a retry takes its
/// cost ([`retry_cost`]) and a GET that then succeeds gives the last retry's cost back. When the quota is
/// empty, failures are returned without retrying. (A pool of its own: the SDK's is not reachable from here.)
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

    /// Takes `cost` if the quota has it.
    fn take(&self, cost: u32) -> Option<u32> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        Self::refill(&mut state);
        if state.0 < f64::from(cost) {
            return None;
        }
        state.0 -= f64::from(cost);
        Some(cost)
    }

    fn give_back(&self, cost: u32) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 = (state.0 + f64::from(cost)).min(Self::CAPACITY);
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
    fn the_retry_quota_runs_dry_and_a_successful_retry_gives_back() {
        let quota = RetryQuota::new();
        let mut granted = 0;
        while quota.take(retry_cost("Timeout")).is_some() {
            granted += 1;
            assert!(granted <= 60, "the quota never ran dry");
        }
        // 500 tokens at 10 a retry after a timeout (plus what refills meanwhile).
        assert!((50..=51).contains(&granted), "{granted}");
        assert_eq!(retry_cost("SlowDown"), 5);
        quota.give_back(10);
        assert_eq!(quota.take(retry_cost("SlowDown")), Some(5));
        assert_eq!(quota.take(retry_cost("InternalError")), None);
    }

    #[test]
    fn sessions_are_rejected_by_expired_tokens_and_one_bare_400() {
        let mut bare = false;
        let expired = ClientError::AccessDenied {
            code: "ExpiredToken".into(),
            message: String::new(),
        };
        assert!(session_rejected(&expired, &mut bare));
        let denied = ClientError::AccessDenied {
            code: "AccessDenied".into(),
            message: String::new(),
        };
        assert!(!session_rejected(&denied, &mut bare));
        let bare_400 = ClientError::Service {
            status: 400,
            code: String::new(),
            message: String::new(),
        };
        assert!(session_rejected(&bare_400, &mut bare));
        assert!(!session_rejected(&bare_400, &mut bare));
    }

    fn answer(
        headers: &[(&str, &str)],
    ) -> aws_smithy_runtime_api::client::orchestrator::HttpResponse {
        let mut response = aws_smithy_runtime_api::client::orchestrator::HttpResponse::new(
            206.try_into().unwrap(),
            SdkBody::from("abc"),
        );
        for (name, value) in headers {
            response
                .headers_mut()
                .append(name.to_string(), value.to_string());
        }
        response
    }

    #[test]
    fn answers_are_read_and_doubtful_headers_refused() {
        let good = parse_answer(
            "k",
            answer(&[
                ("content-length", "3"),
                ("content-range", "bytes 0-2/10"),
                ("etag", "\"e1\""),
                ("last-modified", "Wed, 25 Nov 2026 10:00:00 GMT"),
                ("x-amz-meta-Mode", " 644 "),
            ]),
        )
        .ok()
        .unwrap();
        assert_eq!(good.content_length, Some(3));
        assert_eq!(good.content_range.as_deref(), Some("bytes 0-2/10"));
        assert_eq!(good.e_tag.as_deref(), Some("\"e1\""));
        assert_eq!(good.last_modified.map(|d| d.secs()), Some(1_795_600_800));
        assert_eq!(good.metadata.get("mode").map(String::as_str), Some("644"));
        for bad in [
            answer(&[("etag", "\"a\""), ("etag", "\"b\"")]),
            answer(&[("content-length", "3"), ("content-length", "4")]),
            answer(&[("content-length", "three")]),
            answer(&[("last-modified", "yesterday")]),
            answer(&[("x-amz-meta-a", "1"), ("X-Amz-Meta-A", "2")]),
        ] {
            assert!(matches!(
                parse_answer("k", bad),
                Err(ClientError::Malformed(_))
            ));
        }
    }

    fn shared(
        build: impl FnOnce(aws_types::sdk_config::Builder) -> aws_types::sdk_config::Builder,
    ) -> aws_types::SdkConfig {
        let credentials = Credentials::new("AKID", "secret", None, None, "test");
        build(
            aws_types::SdkConfig::builder()
                .credentials_provider(SharedCredentialsProvider::new(credentials))
                .region(aws_types::region::Region::new("eu-west-1")),
        )
        .build()
    }

    /// The direct path for a configuration that takes it (the test fails if it stays on the SDK).
    async fn direct_for(config: &SdkClientConfig, shared: &aws_types::SdkConfig) -> Direct {
        Direct::for_config(config, shared)
            .await
            .unwrap()
            .expect("GETs go direct")
    }

    #[tokio::test]
    async fn gets_go_where_the_sdk_client_sends_everything_else() {
        let config = SdkClientConfig::new("data", "eu-west-1");
        let plain = direct_for(&config, &shared(|b| b)).await;
        assert_eq!(plain.base, "https://data.s3.eu-west-1.amazonaws.com");
        // Settings aws-config loaded (environment, profile) count as they do for the SDK client.
        let dual = shared(|b| b.use_dual_stack(true));
        let dual = direct_for(&config, &dual).await;
        assert_eq!(
            dual.base,
            "https://data.s3.dualstack.eu-west-1.amazonaws.com"
        );
        let fips = shared(|b| b.use_fips(true));
        let fips = direct_for(&config, &fips).await;
        assert_eq!(fips.base, "https://data.s3-fips.eu-west-1.amazonaws.com");
        let elsewhere = shared(|b| b.endpoint_url("http://10.1.2.3:9000"));
        let mut path_style = config.clone();
        path_style.force_path_style = true;
        let elsewhere = direct_for(&path_style, &elsewhere).await;
        assert_eq!(elsewhere.base, "http://10.1.2.3:9000/data");
        // Our own flag wins over the loaded one, as in SdkClient::new.
        path_style.endpoint_url = Some("http://127.0.0.1:9000".into());
        let ours = shared(|b| b.endpoint_url("http://10.1.2.3:9000"));
        let ours = direct_for(&path_style, &ours).await;
        assert_eq!(ours.base, "http://127.0.0.1:9000/data");
        // No credentials (--no-sign-request) or SSE flags: GETs stay on the SDK.
        let anonymous = aws_types::SdkConfig::builder().build();
        assert!(
            Direct::for_config(&config, &anonymous)
                .await
                .unwrap()
                .is_none()
        );
        let mut sse = config.clone();
        sse.sse = Some("aws:kms".into());
        assert!(
            Direct::for_config(&sse, &shared(|b| b))
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_body_is_read_whole_up_to_a_bound() {
        let stall = Duration::from_secs(5);
        let body = |announced: usize| {
            let mut response = HttpResponse::new(200.try_into().unwrap(), vec![b'x'; 1000].into());
            response
                .headers_mut()
                .insert("content-length", announced.to_string());
            response
        };
        assert_eq!(
            whole_body(body(1000), stall, 1000).await.unwrap().len(),
            1000
        );
        // A Content-Length beyond the bound is not made room for (usize::MAX would abort), and the body is
        // refused once it passes the bound.
        assert!(matches!(
            whole_body(body(usize::MAX), stall, 999).await,
            Err(ClientError::Malformed(_))
        ));
    }

    #[test]
    fn listings_ask_the_bucket_as_the_sdk_does() {
        assert_eq!(
            list_url(
                "https://data.s3.eu-west-1.amazonaws.com",
                "",
                Some("/"),
                None,
                1000
            ),
            "https://data.s3.eu-west-1.amazonaws.com/?list-type=2&max-keys=1000&delimiter=%2F"
        );
        // Path-style: after the bucket's path, with its slash, as the SDK joins them.
        assert_eq!(
            list_url(
                "http://127.0.0.1:9000/data",
                "a b+c/ü&=",
                Some("/"),
                Some("t+k/n="),
                1
            ),
            "http://127.0.0.1:9000/data/?list-type=2&max-keys=1&prefix=a%20b%2Bc%2F%C3%BC%26%3D\
             &delimiter=%2F&continuation-token=t%2Bk%2Fn%3D"
        );
    }

    #[tokio::test]
    async fn a_skewed_clock_is_corrected_from_the_servers_date() {
        let config = SdkClientConfig::new("data", "eu-west-1");
        let direct = direct_for(&config, &shared(|b| b)).await;
        let off = |t: SystemTime| {
            let now = SystemTime::now();
            t.duration_since(now).unwrap_or_else(|e| e.duration())
        };
        assert!(off(direct.signing_time()) < Duration::from_secs(1));
        let server = SystemTime::now() + Duration::from_secs(3600);
        direct.learn_skew(aws_smithy_types::DateTime::from(server));
        let ahead = direct
            .signing_time()
            .duration_since(SystemTime::now())
            .unwrap();
        assert!(
            ahead > Duration::from_secs(3598) && ahead < Duration::from_secs(3602),
            "{ahead:?}"
        );
        direct.learn_skew(aws_smithy_types::DateTime::from(
            SystemTime::now() - Duration::from_secs(60),
        ));
        let behind = SystemTime::now()
            .duration_since(direct.signing_time())
            .unwrap();
        assert!(
            behind > Duration::from_secs(58) && behind < Duration::from_secs(62),
            "{behind:?}"
        );
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
