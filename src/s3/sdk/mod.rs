//! aws-sdk-s3 implementation of [`ObjectClient`].
//!
//! The SDK does the S3 Express session work (CreateSession, caching, refreshing before expiry) on its own; we
//! never disable it. The read path's GETs are the exception: [`direct`] sends them without the SDK's
//! orchestrator (a GET through it costs about twice the CPU), with credentials and sessions obtained
//! through the SDK. On top of the SDK this module adds what a file system needs:
//! - one error classification ([`errors`]);
//! - GETs that are never short: a body that breaks is resumed from the byte where it stopped, pinned to the
//!   same ETag ([`get`]);
//! - deliberate retry, timeout and stalled-stream settings (see [`SdkClient::new`]);
//! - checksums computed by us for every upload ([`write`]), so "off" really sends none;
//! - a fresh S3 Express session when the service rejects ours as expired (revoked or expired early).
//!
//! Tracing: every call runs in a debug span `s3{op, bucket, key}` and ends with one debug event carrying the
//! duration and the outcome; each HTTP attempt logs its status and request id. Nothing we log carries
//! credentials or session tokens, and error messages are built from `Display` only (never from the SDK's
//! `Debug` output, which includes raw response bodies). The SDK's own TRACE events (`aws_sigv4`,
//! `aws_smithy_runtime`) do print the `x-amz-s3session-token` header: log filters must cap them at DEBUG.

mod direct;
mod endpoint;
mod errors;
mod get;
mod landed;
mod list_xml;
mod options;
mod write;

use std::future::Future;
use std::ops::Range;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use aws_sdk_s3::config::interceptors::FinalizerInterceptorContextRef;
use aws_sdk_s3::config::retry::{RetryConfig, RetryPartition, TokenBucket};
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    AppName, BehaviorVersion, ConfigBag, Intercept, Region, RequestChecksumCalculation,
    RuntimeComponents, StalledStreamProtectionConfig,
};
use aws_sdk_s3::error::BoxError;
use bytes::Bytes;
use tracing::{Instrument, debug, debug_span, warn};

pub(crate) use errors::map_sdk_error;
pub use options::{check_interface, load_ca_bundle, resolve_endpoint};

use super::{
    ClientError, ListPage, ObjectClient, ObjectInfo, PutResult, UploadChecksum, UploadedPart,
    UserMetadata, WriteCondition,
};

/// First pause of the SDK's exponential backoff (full jitter: each pause is random below its cap).
const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// Cap of one backoff pause, so ten attempts stay within about half a minute.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Longest pause between two of our own retries (body resumes, session renewals).
const MAX_OWN_BACKOFF: Duration = Duration::from_secs(1);
/// Retry quota refill (tokens per second; a retry costs 5, a retry after a timeout 10). The quota (500 tokens)
/// stops retry storms when the service is down; the refill lets retries resume after an outage even when
/// few requests succeed.
const RETRY_QUOTA_REFILL_PER_SEC: f32 = 10.0;

/// Everything needed to build the SDK client for one bucket.
///
/// Build it with [`SdkClientConfig::new`] and adjust fields: fields may be added over time.
#[derive(Debug, Clone)]
pub struct SdkClientConfig {
    pub bucket: String,
    pub region: String,
    /// e.g. `http://127.0.0.1:9000`; None = the service's own endpoint resolution.
    pub endpoint_url: Option<String>,
    /// Named profile from ~/.aws/config; None = default credential chain.
    pub profile: Option<String>,
    /// Path-style addressing (needed for local endpoints).
    pub force_path_style: bool,
    pub is_directory_bucket: bool,
    pub upload_checksum: UploadChecksum,
    /// Total attempts per request including the first (Mountpoint default: 10). Also the budget for resuming
    /// one GET whose body keeps breaking.
    pub max_attempts: u32,
    pub connect_timeout: Duration,
    /// Upper bound for one attempt of a request that uploads a body (PutObject, UploadPart, append,
    /// CompleteMultipartUpload, RenameObject), from sending until the answer is read. Default 60 s.
    pub request_timeout: Duration,
    /// Upper bound for one attempt of every other request until its answer starts (for GetObject: the first
    /// byte; HEAD/LIST/DELETE: the whole small answer). Default 10 s.
    pub first_byte_timeout: Duration,
    /// A body (up or down) that moves no byte for this long is cut by the SDK's stalled-stream protection; a
    /// cut GET body is resumed, a cut upload is retried. Default 10 s.
    pub stall_timeout: Duration,
    /// `--sse`: `aws:kms`, `aws:kms:dsse` or `AES256` on every new object (PutObject, CreateMultipartUpload,
    /// CopyObject).
    pub sse: Option<String>,
    /// `--sse-kms-key-id`: a KMS key ARN.
    pub sse_kms_key_id: Option<String>,
    /// `--storage-class` of new objects.
    pub storage_class: Option<String>,
    /// `--infer-content-type`: Content-Type of new objects from the key's extension.
    pub infer_content_type: bool,
    /// `--requester-pays`: `x-amz-request-payer: requester` on every request.
    pub requester_pays: bool,
    /// `--expected-bucket-owner`: `x-amz-expected-bucket-owner` on every request.
    pub expected_bucket_owner: Option<String>,
    /// `--no-sign-request`: anonymous requests, no credentials loaded.
    pub no_sign_request: bool,
    /// `--dual-stack` and `--transfer-acceleration`: endpoint rules (service endpoints only).
    pub dual_stack: bool,
    pub transfer_acceleration: bool,
    /// `--ca-bundle`: PEM roots that replace the system's.
    pub ca_bundle: Option<std::path::PathBuf>,
    /// `--user-agent-prefix`.
    pub user_agent_prefix: Option<String>,
    /// `--bind`: interfaces the client's sockets are bound to (SO_BINDTODEVICE), connections spread over them.
    pub bind: Vec<String>,
}

impl SdkClientConfig {
    /// Defaults for everything but the bucket and region.
    pub fn new(bucket: impl Into<String>, region: impl Into<String>) -> SdkClientConfig {
        let bucket = bucket.into();
        SdkClientConfig {
            is_directory_bucket: bucket.ends_with("--x-s3"),
            bucket,
            region: region.into(),
            endpoint_url: None,
            profile: None,
            force_path_style: false,
            upload_checksum: UploadChecksum::Crc32c,
            max_attempts: 10,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            first_byte_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(10),
            sse: None,
            sse_kms_key_id: None,
            storage_class: None,
            infer_content_type: false,
            requester_pays: false,
            expected_bucket_owner: None,
            no_sign_request: false,
            dual_stack: false,
            transfer_acceleration: false,
            ca_bundle: None,
            user_agent_prefix: None,
            bind: Vec::new(),
        }
    }
}

/// The SDK client with its S3 Express session cache. Replaced as a whole when the service rejects our
/// session as expired: the session cache lives inside the SDK client and cannot be cleared otherwise.
struct Session {
    generation: u64,
    client: aws_sdk_s3::Client,
}

pub struct SdkClient {
    config: SdkClientConfig,
    sdk_config: aws_sdk_s3::Config,
    session: RwLock<Session>,
    /// The read path's GETs and every listing, sent without the orchestrator; None keeps them on the SDK.
    direct: Option<direct::Direct>,
    body_resumes: AtomicU64,
    session_renewals: AtomicU64,
}

/// See [`SdkClient::counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SdkClientCounters {
    /// GET bodies that broke and were resumed (or restarted) from where they stopped.
    pub body_resumes: u64,
    /// S3 Express sessions replaced after the service rejected one as expired.
    pub session_renewals: u64,
}

impl SdkClient {
    /// Builds the client. Makes no request: call [`ObjectClient::head_bucket`] to check the bucket.
    pub async fn new(config: SdkClientConfig) -> Result<SdkClient, ClientError> {
        if config.bucket.is_empty() || config.region.is_empty() {
            return Err(ClientError::Service {
                status: 0,
                code: "InvalidConfiguration".into(),
                message: "bucket and region are required".into(),
            });
        }
        // Credentials: env, profile (config.profile), web identity, ECS, IMDS, in aws-config's usual order.
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(config.region.clone()))
            .app_name(AppName::new("expressfs").expect("valid app name"));
        if let Some(profile) = &config.profile {
            loader = loader.profile_name(profile);
        }
        if config.no_sign_request {
            loader = loader.no_credentials();
        }
        let invalid = |message: String| ClientError::Service {
            status: 0,
            code: "InvalidConfiguration".into(),
            message,
        };
        // What the endpoint rules refuse (acceleration on a directory bucket, path style with an ARN, ...)
        // is refused here, with the rules' reason, before any request.
        options::resolve_endpoint(&config).await.map_err(invalid)?;
        if let Some(http) = options::http_client(&config).map_err(invalid)? {
            loader = loader.http_client(http);
        }
        let shared = loader.load().await;

        let retry = RetryConfig::standard()
            .with_max_attempts(config.max_attempts.max(1))
            .with_initial_backoff(INITIAL_BACKOFF)
            .with_max_backoff(MAX_BACKOFF);
        // Our own partition: another client in this process (tests, a second mount) must not drain our quota.
        let partition = RetryPartition::custom(format!("expressfs-{}", config.bucket))
            .token_bucket(
                TokenBucket::builder()
                    .refill_rate(RETRY_QUOTA_REFILL_PER_SEC)
                    .build(),
            )
            .build();
        // The attempt timeout of the client is the short one; uploads override it per request.
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(config.connect_timeout)
            .operation_attempt_timeout(config.first_byte_timeout)
            .build();
        // Stalled-stream protection is on deliberately, with our grace period: without it a server that stops
        // sending in the middle of a GET body hangs that read forever (attempt timeouts end at the first
        // byte). A cut body surfaces as a body error that get_range resumes from the last byte received.
        let stall = StalledStreamProtectionConfig::enabled()
            .grace_period(config.stall_timeout)
            .build();
        let mut builder = aws_sdk_s3::config::Builder::from(&shared)
            .retry_config(retry)
            .retry_partition(partition)
            .timeout_config(timeouts)
            .stalled_stream_protection(stall)
            // We compute and send upload checksums ourselves (write.rs); the SDK adds one only where the
            // operation requires it. That is what makes `--upload-checksums off` send none.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            // Explicit, so AWS_S3_DISABLE_EXPRESS_SESSION_AUTH cannot turn off CreateSession for directory buckets.
            .disable_s3_express_session_auth(false)
            .force_path_style(config.force_path_style)
            .endpoint_resolver(endpoint::PerBucketEndpoints::default())
            .interceptor(AttemptLog);
        if let Some(url) = &config.endpoint_url {
            builder = builder.endpoint_url(url);
        }
        if config.dual_stack {
            builder = builder.use_dual_stack(true);
        }
        if config.transfer_acceleration {
            builder = builder.accelerate(true);
        }
        if config.no_sign_request {
            // Without credentials the SDK falls back to unsigned requests instead of failing.
            builder = builder.allow_no_auth();
        }
        if let Some(headers) = options::RequestHeaders::from_config(&config) {
            builder = builder.interceptor(headers);
        }
        let sdk_config = builder.build();
        let client = aws_sdk_s3::Client::from_conf(sdk_config.clone());
        let direct = direct::Direct::for_config(&config, &shared)
            .await
            .map_err(invalid)?;
        Ok(SdkClient {
            config,
            sdk_config,
            direct,
            session: RwLock::new(Session {
                generation: 0,
                client,
            }),
            body_resumes: AtomicU64::new(0),
            session_renewals: AtomicU64::new(0),
        })
    }

    pub fn config(&self) -> &SdkClientConfig {
        &self.config
    }

    fn current(&self) -> (u64, aws_sdk_s3::Client) {
        let session = self.session.read().unwrap_or_else(|e| e.into_inner());
        (session.generation, session.client.clone())
    }

    /// Drops the credentials of `generation` by replacing the SDK client: an S3 Express session (its cache
    /// goes with the client), or on a general-purpose bucket the provider's cached credentials. Concurrent
    /// callers that saw the same stale ones replace them only once.
    fn renew_session(&self, generation: u64) {
        let mut session = self.session.write().unwrap_or_else(|e| e.into_inner());
        if session.generation == generation {
            session.client = if self.config.is_directory_bucket {
                // The session cache goes with the client; the long-term credentials stay good.
                aws_sdk_s3::Client::from_conf(self.sdk_config.clone())
            } else {
                // The rejected credentials are the provider's: a cache of its own makes the new client ask
                // the provider again instead of signing with the same cached ones.
                let config = self
                    .sdk_config
                    .to_builder()
                    .identity_cache(aws_sdk_s3::config::IdentityCache::lazy().build())
                    .build();
                aws_sdk_s3::Client::from_conf(config)
            };
            session.generation += 1;
            self.session_renewals.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Runs one SDK request. An answer that says our credentials are no longer valid (a directory bucket's
    /// session revoked or expired before the SDK expected; on a general-purpose bucket, credentials that
    /// expired under the request) is retried with a new client, within the attempt budget.
    async fn run<T, F, Fut>(&self, request: F) -> Result<T, ClientError>
    where
        F: Fn(&aws_sdk_s3::Client) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let mut renewals = 0u32;
        let mut bare_400_retried = false;
        loop {
            let (generation, client) = self.current();
            let result = request(&client).await;
            let renew = match &result {
                // New credentials are not a retry of a failed request: one renewal even with one attempt.
                _ if renewals + 1 >= self.config.max_attempts.max(2) => false,
                Err(e) => session_rejected(e, &mut bare_400_retried),
                Ok(_) => false,
            };
            if !renew {
                return result;
            }
            renewals += 1;
            warn!(
                bucket = %self.config.bucket,
                renewals,
                "session or credentials rejected; trying again with new ones"
            );
            self.renew_session(generation);
            tokio::time::sleep(backoff_delay(renewals)).await;
        }
    }

    /// Counters of the recovery work this client did (for tests, logs and metrics).
    pub fn counters(&self) -> SdkClientCounters {
        SdkClientCounters {
            body_resumes: self.body_resumes.load(Ordering::Relaxed),
            session_renewals: self.session_renewals.load(Ordering::Relaxed),
        }
    }

    /// Wraps one client call in its span and logs how it ended.
    async fn traced<T>(
        &self,
        op: &'static str,
        key: &str,
        call: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        let span = debug_span!("s3", op, bucket = %self.config.bucket, key);
        let started = Instant::now();
        let result = call.instrument(span.clone()).await;
        let elapsed = started.elapsed();
        let ms = elapsed.as_millis() as u64;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.code(),
        };
        crate::metrics::s3_request(op, outcome, elapsed);
        let _entered = span.enter();
        match &result {
            Ok(_) => debug!(ms, "s3 call done"),
            Err(e) => debug!(ms, code = e.code(), error = %e, "s3 call failed"),
        }
        result
    }

    /// Per-request override giving uploads the longer attempt timeout.
    fn upload_timeouts(&self) -> aws_sdk_s3::config::Builder {
        aws_sdk_s3::config::Builder::default().timeout_config(
            TimeoutConfig::builder()
                .operation_attempt_timeout(self.config.request_timeout)
                .build(),
        )
    }

    fn map_err<E>(
        &self,
        key: &str,
    ) -> impl Fn(aws_sdk_s3::error::SdkError<E, HttpResponse>) -> ClientError + '_
    where
        E: aws_sdk_s3::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let key = key.to_string();
        move |e| map_sdk_error(&e, &self.config.bucket, &key)
    }
}

type HttpResponse = aws_smithy_runtime_api::client::orchestrator::HttpResponse;

fn to_system_time(t: Option<&aws_smithy_types::DateTime>) -> SystemTime {
    t.and_then(|t| SystemTime::try_from(*t).ok())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Exponential with jitter: 25 ms, 50 ms, ... up to 1 s, each scaled by a factor in 0.5..1. Used between our
/// own retries (body resumes, session renewals); the SDK has its own backoff for failed requests.
fn backoff_delay(failures: u32) -> Duration {
    let base = Duration::from_millis(25)
        .saturating_mul(1 << failures.min(10))
        .min(MAX_OWN_BACKOFF);
    base.mul_f64(0.5 + unit_random() / 2.0)
}

/// An answer saying the credentials we signed with are no longer valid: an S3 Express session revoked or
/// expired early, or (general-purpose buckets) the provider's credentials expired under the request. HEAD
/// answers have no body, so either on a HEAD is a bare 400: that counts once.
fn session_rejected(e: &ClientError, bare_400_retried: &mut bool) -> bool {
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

/// A random number in 0..1 for backoff jitter. `RandomState` is seeded per thread and bumped per call, so
/// concurrent retries do not wait in step.
fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

fn non_negative(n: Option<i64>) -> Option<u64> {
    n.and_then(|n| u64::try_from(n).ok())
}

/// Logs the HTTP status of every attempt (retries included), inside the caller's span.
#[derive(Debug)]
struct AttemptLog;

impl Intercept for AttemptLog {
    fn name(&self) -> &'static str {
        "expressfs::AttemptLog"
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        match context.response() {
            Some(response) => {
                let request_id = response.headers().get("x-amz-request-id").unwrap_or("");
                debug!(
                    status = response.status().as_u16(),
                    request_id, "s3 attempt answered"
                );
            }
            None => {
                let error = match context.output_or_error() {
                    Some(Err(e)) => e.to_string(),
                    _ => String::new(),
                };
                debug!(error, "s3 attempt got no answer");
            }
        }
        Ok(())
    }
}

#[async_trait]
impl ObjectClient for SdkClient {
    fn bucket(&self) -> &str {
        &self.config.bucket
    }

    fn is_directory_bucket(&self) -> bool {
        self.config.is_directory_bucket
    }

    async fn head_bucket(&self) -> Result<(), ClientError> {
        let call = self.run(|client| {
            let request = client.head_bucket().bucket(&self.config.bucket);
            async move { request.send().await.map(|_| ()).map_err(self.map_err("")) }
        });
        self.traced("HeadBucket", "", call).await
    }

    async fn head_object(&self, key: &str) -> Result<ObjectInfo, ClientError> {
        let call = self.run(|client| {
            let request = client.head_object().bucket(&self.config.bucket).key(key);
            async move {
                let out = request.send().await.map_err(self.map_err(key))?;
                let size = non_negative(out.content_length()).ok_or_else(|| {
                    ClientError::Malformed(format!("HEAD {key}: no Content-Length"))
                })?;
                let etag = out
                    .e_tag()
                    .ok_or_else(|| ClientError::Malformed(format!("HEAD {key}: no ETag")))?;
                Ok(ObjectInfo {
                    key: key.to_string(),
                    size,
                    etag: etag.to_string(),
                    last_modified: to_system_time(out.last_modified()),
                    metadata: user_metadata(out.metadata()),
                })
            }
        });
        self.traced("HeadObject", key, call).await
    }

    async fn head_with_first_bytes(
        &self,
        key: &str,
        len: u64,
    ) -> Result<(ObjectInfo, Bytes), ClientError> {
        self.traced("GetObject", key, self.head_and_first_bytes(key, len))
            .await
    }

    async fn list_objects(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        continuation_token: Option<&str>,
        max_keys: i32,
    ) -> Result<ListPage, ClientError> {
        if let Some(direct) = &self.direct {
            let call = direct.list(self, prefix, delimiter, continuation_token, max_keys);
            return self.traced("ListObjectsV2", prefix, call).await;
        }
        let call = self.run(|client| {
            let request = client
                .list_objects_v2()
                .bucket(&self.config.bucket)
                .set_prefix((!prefix.is_empty()).then(|| prefix.to_string()))
                .set_delimiter(delimiter.map(str::to_string))
                .set_continuation_token(continuation_token.map(str::to_string))
                .max_keys(max_keys);
            // Bucket-level call: a 404 is a missing bucket, never a missing "prefix object".
            async move { list_page(request.send().await.map_err(self.map_err(""))?) }
        });
        self.traced("ListObjectsV2", prefix, call).await
    }

    async fn get_object(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<Bytes, ClientError> {
        self.traced("GetObject", key, self.get_range(key, range, if_match))
            .await
    }

    async fn put_object_with_metadata(
        &self,
        key: &str,
        body: Bytes,
        condition: WriteCondition,
        metadata: &UserMetadata,
    ) -> Result<PutResult, ClientError> {
        self.traced("PutObject", key, self.put(key, body, condition, metadata))
            .await
    }

    async fn append_object(
        &self,
        key: &str,
        offset: u64,
        body: Bytes,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        self.traced(
            "PutObject(append)",
            key,
            self.append(key, offset, body, condition),
        )
        .await
    }

    async fn create_multipart_upload_with_metadata(
        &self,
        key: &str,
        metadata: &UserMetadata,
    ) -> Result<String, ClientError> {
        self.traced(
            "CreateMultipartUpload",
            key,
            self.create_upload(key, metadata),
        )
        .await
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        part_number: i32,
        body: Bytes,
    ) -> Result<UploadedPart, ClientError> {
        self.traced(
            "UploadPart",
            key,
            self.put_part(key, upload_id, part_number, body),
        )
        .await
    }

    async fn upload_part_copy(
        &self,
        key: &str,
        upload_id: &str,
        part_number: i32,
        source_key: &str,
        range: Range<u64>,
        source_etag: &str,
    ) -> Result<UploadedPart, ClientError> {
        self.traced(
            "UploadPartCopy",
            key,
            self.copy_part(key, upload_id, part_number, source_key, range, source_etag),
        )
        .await
    }

    async fn complete_multipart_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<UploadedPart>,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        self.traced(
            "CompleteMultipartUpload",
            key,
            self.complete_upload(key, upload_id, &parts, condition),
        )
        .await
    }

    async fn abort_multipart_upload(&self, key: &str, upload_id: &str) -> Result<(), ClientError> {
        self.traced(
            "AbortMultipartUpload",
            key,
            self.abort_upload(key, upload_id),
        )
        .await
    }

    async fn delete_object(&self, key: &str) -> Result<(), ClientError> {
        let call = self.run(|client| {
            let request = client.delete_object().bucket(&self.config.bucket).key(key);
            async move { request.send().await.map(|_| ()).map_err(self.map_err(key)) }
        });
        self.traced("DeleteObject", key, call).await
    }

    async fn copy_object(
        &self,
        source_key: &str,
        source_if_match: Option<&str>,
        destination_key: &str,
        destination_condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        self.traced(
            "CopyObject",
            source_key,
            self.copy(
                source_key,
                source_if_match,
                destination_key,
                destination_condition,
            ),
        )
        .await
    }

    async fn replace_metadata(
        &self,
        key: &str,
        metadata: &UserMetadata,
        if_match: &str,
    ) -> Result<PutResult, ClientError> {
        self.traced(
            "CopyObject(metadata)",
            key,
            self.replace_user_metadata(key, metadata, if_match),
        )
        .await
    }

    async fn rename_object(
        &self,
        source_key: &str,
        destination_key: &str,
        destination_condition: WriteCondition,
    ) -> Result<(), ClientError> {
        self.traced(
            "RenameObject",
            source_key,
            self.rename(source_key, destination_key, destination_condition),
        )
        .await
    }
}

/// The SDK's user metadata (names without the `x-amz-meta-` prefix) with names in lower case, as HTTP
/// header names compare.
pub(super) fn user_metadata(
    metadata: Option<&std::collections::HashMap<String, String>>,
) -> UserMetadata {
    metadata
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
        .collect()
}

fn list_page(
    out: aws_sdk_s3::operation::list_objects_v2::ListObjectsV2Output,
) -> Result<ListPage, ClientError> {
    let mut objects = Vec::with_capacity(out.contents().len());
    for o in out.contents() {
        let key = o
            .key()
            .ok_or_else(|| ClientError::Malformed("ListObjectsV2 entry without a key".into()))?;
        objects.push(ObjectInfo {
            key: key.to_string(),
            size: non_negative(o.size()).unwrap_or(0),
            etag: o.e_tag().unwrap_or_default().to_string(),
            last_modified: crate::s3::whole_seconds(to_system_time(o.last_modified())),
            metadata: UserMetadata::new(),
        });
    }
    let entries = objects.len() + out.common_prefixes().len();
    let common_prefixes = out
        .common_prefixes()
        .iter()
        .filter_map(|p| p.prefix().map(str::to_string))
        .collect();
    checked_page(
        objects,
        common_prefixes,
        entries,
        ListedEnd {
            is_truncated: out.is_truncated(),
            next_token: out.next_continuation_token(),
            key_count: out.key_count().map(i64::from),
        },
    )
}

/// What a ListObjectsV2 answer says about itself: whether more follows, and how many entries it holds.
pub(super) struct ListedEnd<'a> {
    pub is_truncated: Option<bool>,
    pub next_token: Option<&'a str>,
    pub key_count: Option<i64>,
}

/// A page whose answer is consistent with itself (`entries`: contents and common prefixes it held). Whichever
/// parser read it, the same answers are refused.
pub(super) fn checked_page(
    objects: Vec<ObjectInfo>,
    common_prefixes: Vec<String>,
    entries: usize,
    end: ListedEnd<'_>,
) -> Result<ListPage, ClientError> {
    let next_continuation_token = match (end.is_truncated, end.next_token) {
        (Some(false), _) => None,
        (_, Some(token)) if !token.is_empty() => Some(token.to_string()),
        // Truncated without a token: continuing is impossible and stopping would hide entries.
        (Some(true), _) => {
            return Err(ClientError::Malformed(
                "ListObjectsV2 truncated without a continuation token".into(),
            ));
        }
        // Every ListObjectsV2 answer says whether it is truncated; a document without it was cut short (the
        // SDK's parser accepts an unterminated document), and reading it as "empty" would hide entries.
        (None, _) => {
            return Err(ClientError::Malformed(
                "ListObjectsV2 answer without IsTruncated (cut short or not a listing)".into(),
            ));
        }
    };
    if let Some(count) = end.key_count
        && count != entries as i64
    {
        return Err(ClientError::Malformed(format!(
            "ListObjectsV2 KeyCount {count} but {entries} entries"
        )));
    }
    Ok(ListPage {
        objects,
        common_prefixes,
        next_continuation_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_s3::operation::list_objects_v2::ListObjectsV2Output;
    use aws_sdk_s3::types::{CommonPrefix, Object};

    #[test]
    fn jitter_is_spread_over_zero_to_one() {
        let draws: Vec<f64> = (0..200).map(|_| unit_random()).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        assert!(draws.iter().any(|d| *d < 0.25) && draws.iter().any(|d| *d > 0.75));
    }

    #[test]
    fn list_pages_map_and_check_truncation() {
        let out = ListObjectsV2Output::builder()
            .contents(
                Object::builder()
                    .key("a/b")
                    .size(3)
                    .e_tag("\"e\"")
                    .last_modified(aws_smithy_types::DateTime::from_millis(1_795_680_001_500))
                    .build(),
            )
            .common_prefixes(CommonPrefix::builder().prefix("a/c/").build())
            .is_truncated(true)
            .next_continuation_token("tok")
            .build();
        let page = list_page(out).unwrap();
        assert_eq!(page.objects.len(), 1);
        // Whole seconds, as a HEAD of the same object says (`s3::whole_seconds`).
        let listed = page.objects[0].last_modified;
        let at = listed.duration_since(std::time::UNIX_EPOCH).unwrap();
        assert_eq!(at.as_millis(), 1_795_680_001_000);
        assert_eq!(page.objects[0].key, "a/b");
        assert_eq!(page.objects[0].size, 3);
        assert_eq!(page.common_prefixes, vec!["a/c/".to_string()]);
        assert_eq!(page.next_continuation_token.as_deref(), Some("tok"));

        let last = ListObjectsV2Output::builder()
            .is_truncated(false)
            .next_continuation_token("stale")
            .build();
        assert_eq!(list_page(last).unwrap().next_continuation_token, None);

        let broken = ListObjectsV2Output::builder().is_truncated(true).build();
        assert!(matches!(list_page(broken), Err(ClientError::Malformed(_))));
        let cut = ListObjectsV2Output::builder().build();
        assert!(matches!(list_page(cut), Err(ClientError::Malformed(_))));
        let miscounted = ListObjectsV2Output::builder()
            .is_truncated(false)
            .key_count(2)
            .build();
        assert!(matches!(
            list_page(miscounted),
            Err(ClientError::Malformed(_))
        ));
    }

    #[test]
    fn backoff_is_bounded() {
        for n in 1..40 {
            let d = backoff_delay(n);
            assert!(
                d <= MAX_OWN_BACKOFF && d >= Duration::from_millis(12),
                "{d:?}"
            );
        }
    }

    #[test]
    fn config_defaults() {
        let c = SdkClientConfig::new("data--use1-az4--x-s3", "us-east-1");
        assert!(c.is_directory_bucket);
        assert_eq!(c.upload_checksum, UploadChecksum::Crc32c);
        assert!(c.first_byte_timeout <= c.request_timeout);
        assert!(!SdkClientConfig::new("plain-bucket", "us-east-1").is_directory_bucket);
    }
}
