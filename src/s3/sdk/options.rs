//! The request options mount-s3 users bring: headers every request carries (requester pays, expected
//! owner, a User-Agent prefix), which endpoint the SDK's rules choose (dual-stack, acceleration, access
//! point ARNs), and the HTTP client when it must differ from the SDK's default (a CA bundle, `--bind`).

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use aws_sdk_s3::config::endpoint::{DefaultResolver, Params, ResolveEndpoint};
use aws_sdk_s3::config::interceptors::BeforeTransmitInterceptorContextMut;
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_s3::error::BoxError;
use aws_smithy_http_client::proxy::ProxyConfig;
use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
use aws_smithy_http_client::{Builder as HttpClientBuilder, Connector};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;

use super::SdkClientConfig;

/// Adds the headers the flags ask for to every request the client sends. The SDK's own CreateSession
/// (directory buckets) is built without our interceptors, which is why requester pays is refused for
/// directory buckets at startup; S3 Express has no requester pays and CreateSession no expected owner.
#[derive(Debug)]
pub(super) struct RequestHeaders {
    requester_pays: bool,
    expected_bucket_owner: Option<String>,
    user_agent_prefix: Option<String>,
}

impl RequestHeaders {
    /// None when no flag asks for a header (no interceptor at all then).
    pub(super) fn from_config(config: &SdkClientConfig) -> Option<RequestHeaders> {
        let headers = RequestHeaders {
            requester_pays: config.requester_pays,
            expected_bucket_owner: config.expected_bucket_owner.clone(),
            user_agent_prefix: config.user_agent_prefix.clone(),
        };
        (headers.requester_pays
            || headers.expected_bucket_owner.is_some()
            || headers.user_agent_prefix.is_some())
        .then_some(headers)
    }
}

impl Intercept for RequestHeaders {
    fn name(&self) -> &'static str {
        "expressfs::RequestHeaders"
    }

    // Before signing: these headers are part of what the signature covers, as with the SDK's own fields.
    fn modify_before_signing(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let headers = context.request_mut().headers_mut();
        if self.requester_pays {
            headers.insert("x-amz-request-payer", "requester");
        }
        if let Some(owner) = &self.expected_bucket_owner {
            headers.insert("x-amz-expected-bucket-owner", owner.clone());
        }
        Ok(())
    }

    // After signing: the SDK sets User-Agent while signing and SigV4 leaves that header out of the signature.
    fn modify_before_transmit(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(prefix) = &self.user_agent_prefix {
            let headers = context.request_mut().headers_mut();
            let agent = match headers.get("user-agent") {
                Some(current) => format!("{prefix} {current}"),
                None => prefix.clone(),
            };
            headers.insert("user-agent", agent);
        }
        Ok(())
    }
}

/// The endpoint the SDK's rules give a bucket-level request under this configuration, without sending
/// anything. Startup runs it so that a combination the service refuses (acceleration on a directory bucket
/// or an access point, dual-stack with a custom endpoint, path style with an ARN) fails with the rules' own
/// reason before mounting.
pub async fn resolve_endpoint(config: &SdkClientConfig) -> Result<String, String> {
    let endpoint = endpoint_of(
        config,
        config.endpoint_url.clone(),
        false,
        config.dual_stack,
    )
    .await?;
    Ok(endpoint.url().to_string())
}

/// The endpoint the SDK's rules give a request on the bucket, with the endpoint URL, FIPS and dual-stack
/// settings given (the flags' at startup; what the SDK client ends up with for `direct.rs`). Errors carry the
/// rules' reason.
pub(super) async fn endpoint_of(
    config: &SdkClientConfig,
    endpoint_url: Option<String>,
    use_fips: bool,
    use_dual_stack: bool,
) -> Result<aws_smithy_types::endpoint::Endpoint, String> {
    let params = Params::builder()
        .bucket(config.bucket.clone())
        .region(config.region.clone())
        .use_fips(use_fips)
        .use_dual_stack(use_dual_stack)
        .accelerate(config.transfer_acceleration)
        .force_path_style(config.force_path_style)
        .set_endpoint(endpoint_url)
        .build()
        .map_err(|e| e.to_string())?;
    DefaultResolver::new()
        .resolve_endpoint(&params)
        .await
        .map_err(|e| {
            let mut message = e.to_string();
            let mut source = std::error::Error::source(&*e);
            while let Some(s) = source {
                message = format!("{message}: {s}");
                source = s.source();
            }
            message
        })
}

/// Reads a PEM bundle and checks every certificate in it, so that a bad file fails at startup (the TLS
/// layer would panic on it at the first connection).
pub fn load_ca_bundle(path: &Path) -> Result<Vec<u8>, String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert =
            cert.map_err(|e| format!("{}: not a PEM certificate file ({e})", path.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("{}: a certificate cannot be used ({e})", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "{}: no certificate (expected PEM blocks)",
            path.display()
        ));
    }
    Ok(pem)
}

/// Checks that a network interface exists (SO_BINDTODEVICE would fail at the first connection otherwise).
pub fn check_interface(name: &str) -> Result<(), String> {
    let c_name =
        std::ffi::CString::new(name).map_err(|_| format!("{name:?} is not an interface name"))?;
    // SAFETY: a valid NUL-terminated string; if_nametoindex only reads it.
    if name.is_empty() || unsafe { libc::if_nametoindex(c_name.as_ptr()) } == 0 {
        return Err(format!("no network interface named {name:?}"));
    }
    Ok(())
}

/// The HTTP client for a CA bundle or `--bind`; None keeps the SDK's default client.
pub(super) fn http_client(config: &SdkClientConfig) -> Result<Option<SharedHttpClient>, String> {
    if config.ca_bundle.is_none() && config.bind.is_empty() {
        return Ok(None);
    }
    let tls = tls_context(config)?;
    let clients = interfaces(config)
        .into_iter()
        .map(|interface| {
            let tls = tls.clone();
            HttpClientBuilder::new().build_with_connector_fn(move |settings, components| {
                let mut builder = Connector::builder();
                builder.set_connector_settings(settings.cloned());
                // As the SDK's default client: HTTP(S)_PROXY and NO_PROXY from the environment.
                builder.set_proxy_config(Some(ProxyConfig::from_env()));
                if let Some(components) = components {
                    builder.set_sleep_impl(components.sleep_impl());
                }
                if let Some(name) = &interface {
                    builder.set_interface(name.clone());
                }
                builder
                    .tls_provider(tls::Provider::Rustls(
                        tls::rustls_provider::CryptoMode::AwsLc,
                    ))
                    .tls_context(tls.clone())
                    .build()
            })
        })
        .collect::<Vec<_>>();
    Ok(Some(match <[SharedHttpClient; 1]>::try_from(clients) {
        Ok([one]) => one,
        Err(many) => SharedHttpClient::new(Spread { clients: many }),
    }))
}

fn tls_context(config: &SdkClientConfig) -> Result<TlsContext, String> {
    let trust = match &config.ca_bundle {
        // mount-s3 and the AWS CLI: the bundle replaces the system's roots.
        Some(path) => TrustStore::empty()
            .with_native_roots(false)
            .with_pem_certificate(load_ca_bundle(path)?),
        None => TrustStore::default(),
    };
    TlsContext::builder()
        .with_trust_store(trust)
        .build()
        .map_err(|e| e.to_string())
}

/// The `--bind` interfaces, or one unbound socket.
fn interfaces(config: &SdkClientConfig) -> Vec<Option<String>> {
    if config.bind.is_empty() {
        vec![None]
    } else {
        config.bind.iter().cloned().map(Some).collect()
    }
}

/// The connector of the GETs sent without the orchestrator (`direct.rs`): the SDK's HTTP stack with the
/// settings the SDK client gets (connect timeout, TLS trust, `--bind`), and a pool of its own.
pub(super) fn direct_connector(config: &SdkClientConfig) -> Result<SharedHttpConnector, String> {
    let tls = tls_context(config)?;
    let settings = HttpConnectorSettings::builder()
        .connect_timeout(config.connect_timeout)
        .build();
    let connectors: Vec<SharedHttpConnector> = interfaces(config)
        .into_iter()
        .map(|interface| {
            let mut builder = Connector::builder()
                .connector_settings(settings.clone())
                .sleep_impl(aws_smithy_async::rt::sleep::TokioSleep::new())
                // As the SDK's default client: HTTP(S)_PROXY and NO_PROXY from the environment.
                .proxy_config(ProxyConfig::from_env());
            if let Some(name) = interface {
                builder.set_interface(name);
            }
            SharedHttpConnector::new(
                builder
                    .tls_provider(tls::Provider::Rustls(
                        tls::rustls_provider::CryptoMode::AwsLc,
                    ))
                    .tls_context(tls.clone())
                    .build(),
            )
        })
        .collect();
    Ok(match <[SharedHttpConnector; 1]>::try_from(connectors) {
        Ok([one]) => one,
        Err(many) => SharedHttpConnector::new(RoundRobin {
            connectors: many,
            next: AtomicUsize::new(0),
        }),
    })
}

/// Several interfaces: one client (and connection pool) per interface, requests dealt out in turn, so
/// connections spread over the interfaces as mount-s3's `--bind` does.
#[derive(Debug)]
struct Spread {
    clients: Vec<SharedHttpClient>,
}

impl HttpClient for Spread {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(RoundRobin {
            connectors: self
                .clients
                .iter()
                .map(|c| c.http_connector(settings, components))
                .collect(),
            next: AtomicUsize::new(0),
        })
    }
}

#[derive(Debug)]
struct RoundRobin {
    connectors: Vec<SharedHttpConnector>,
    next: AtomicUsize,
}

impl HttpConnector for RoundRobin {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.connectors.len();
        self.connectors[i].call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(bucket: &str) -> SdkClientConfig {
        SdkClientConfig::new(bucket, "us-west-2")
    }

    #[tokio::test]
    async fn endpoints_follow_dual_stack_acceleration_and_arns() {
        let plain = resolve_endpoint(&config("my-bucket")).await.unwrap();
        assert_eq!(plain, "https://my-bucket.s3.us-west-2.amazonaws.com");
        let mut c = config("my-bucket");
        c.dual_stack = true;
        assert_eq!(
            resolve_endpoint(&c).await.unwrap(),
            "https://my-bucket.s3.dualstack.us-west-2.amazonaws.com"
        );
        let mut c = config("my-bucket");
        c.transfer_acceleration = true;
        assert_eq!(
            resolve_endpoint(&c).await.unwrap(),
            "https://my-bucket.s3-accelerate.amazonaws.com"
        );
        c.dual_stack = true;
        assert_eq!(
            resolve_endpoint(&c).await.unwrap(),
            "https://my-bucket.s3-accelerate.dualstack.amazonaws.com"
        );
        let arn = config("arn:aws:s3:us-west-2:123456789012:accesspoint/my-ap");
        assert_eq!(
            resolve_endpoint(&arn).await.unwrap(),
            "https://my-ap-123456789012.s3-accesspoint.us-west-2.amazonaws.com"
        );
        let mut dual_arn = config("arn:aws:s3:us-west-2:123456789012:accesspoint/my-ap");
        dual_arn.dual_stack = true;
        assert_eq!(
            resolve_endpoint(&dual_arn).await.unwrap(),
            "https://my-ap-123456789012.s3-accesspoint.dualstack.us-west-2.amazonaws.com"
        );
    }

    #[tokio::test]
    async fn combinations_the_service_refuses_fail_with_the_rules_reason() {
        let mut xz = config("data--usw2-az1--x-s3");
        xz.transfer_acceleration = true;
        let e = resolve_endpoint(&xz).await.unwrap_err();
        assert!(e.contains("Accelerate"), "{e}");
        let mut arn = config("arn:aws:s3:us-west-2:123456789012:accesspoint/my-ap");
        arn.transfer_acceleration = true;
        let e = resolve_endpoint(&arn).await.unwrap_err();
        assert!(e.contains("ccelerat"), "{e}");
        let mut path = config("arn:aws:s3:us-west-2:123456789012:accesspoint/my-ap");
        path.force_path_style = true;
        let e = resolve_endpoint(&path).await.unwrap_err();
        assert!(e.contains("ath"), "{e}");
        let mut custom = config("my-bucket");
        custom.endpoint_url = Some("http://127.0.0.1:9000".into());
        custom.dual_stack = true;
        let e = resolve_endpoint(&custom).await.unwrap_err();
        assert!(e.contains("DualStack") || e.contains("ual"), "{e}");
        // With an explicit endpoint the user chose the host: acceleration (a host of its own) cannot apply.
        custom.dual_stack = false;
        custom.transfer_acceleration = true;
        let e = resolve_endpoint(&custom).await.unwrap_err();
        assert!(
            e.contains("custom endpoint cannot be combined with S3 Accelerate"),
            "{e}"
        );
        // An alias is a bucket name to the rules, so it works against any endpoint.
        let mut alias = config("my-ap-hrzrlukc5m36ft7okagglf3gmwluquse1b-s3alias");
        alias.endpoint_url = Some("http://127.0.0.1:9000".into());
        alias.force_path_style = true;
        assert_eq!(
            resolve_endpoint(&alias).await.unwrap(),
            "http://127.0.0.1:9000/my-ap-hrzrlukc5m36ft7okagglf3gmwluquse1b-s3alias"
        );
    }

    #[test]
    fn the_default_client_and_headers_stay_unless_a_flag_asks() {
        let mut c = config("my-bucket");
        assert!(http_client(&c).unwrap().is_none());
        assert!(RequestHeaders::from_config(&c).is_none());
        c.bind = vec!["lo".into(), "lo".into()];
        assert!(http_client(&c).unwrap().is_some());
        c.bind.clear();
        c.ca_bundle = Some("/nonexistent/ca.pem".into());
        assert!(http_client(&c).unwrap_err().contains("/nonexistent/ca.pem"));
        c.ca_bundle = None;
        c.requester_pays = true;
        assert!(RequestHeaders::from_config(&c).is_some());
    }

    #[test]
    fn ca_bundles_and_interfaces_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        assert!(
            load_ca_bundle(&missing)
                .unwrap_err()
                .contains("missing.pem")
        );
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        assert!(
            load_ca_bundle(&garbage)
                .unwrap_err()
                .contains("no certificate")
        );
        let system = Path::new("/etc/ssl/certs/ca-certificates.crt");
        if system.exists() {
            assert!(!load_ca_bundle(system).unwrap().is_empty());
        }
        assert!(check_interface("lo").is_ok());
        assert!(
            check_interface("nosuchif0")
                .unwrap_err()
                .contains("nosuchif0")
        );
        assert!(check_interface("").is_err());
    }
}
