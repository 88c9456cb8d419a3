//! expressfs-emulator: a local S3 server that behaves like S3 Express One Zone directory buckets (and
//! general-purpose buckets) where expressfs depends on it: SigV4, CreateSession and session tokens,
//! directory-bucket listing rules and order, conditional writes, appends, RenameObject, multipart limits,
//! time-to-first-byte, request counters and fault injection. See docs/EMULATOR.md.
//!
//! Library API (used by the `expressfs-emulator` binary and by in-process tests):
//! `Emulator::start_background(config)` binds, serves on its own thread/runtime, and returns a handle.

pub mod access;
pub mod body;
pub mod buckets;
pub mod copy;
pub mod error;
pub mod faults;
pub mod listing;
pub mod meta;
pub mod multipart;
pub mod objects;
pub mod server;
pub mod sigv4;
pub mod store;
pub mod tls;
pub mod xml;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Fault injection settings (issue 8). All fields default to "no faults".
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct FaultConfig {
    /// Fraction of requests (0.0..=1.0) that get a fault, kinds mixed.
    pub rate: f64,
    pub seed: u64,
    /// Limit faults to these operation names (e.g. "GetObject", "UploadPart"); empty = all.
    pub operations: Vec<String>,
    /// Limit faults to these kinds; empty = the retryable kinds mixed: "internal-error", "slow-down",
    /// "reset-before-body", "reset-mid-body", "truncated-body", "latency-spike", "expired-token". Opt-in by name:
    /// "malformed-xml", "unexpected-status", "stall".
    pub kinds: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct EmulatorConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Buckets created at start; directory bucket if the name ends in `--x-s3`.
    pub buckets: Vec<String>,
    pub access_key: String,
    pub secret_key: String,
    pub region: String,
    pub session_ttl: Duration,
    /// Added before the first byte of every response.
    pub ttfb: Duration,
    pub log_requests: bool,
    pub faults: FaultConfig,
    /// General purpose buckets that serve anonymous reads (as a public bucket policy would).
    pub public_buckets: Vec<String>,
    /// Access point aliases, each standing for a bucket: `(alias, bucket)`.
    pub access_point_aliases: Vec<(String, String)>,
    /// Keep the headers of recent requests for `GET /_emulator/requests` (also switched at run time).
    pub record_requests: bool,
    /// Serve HTTPS with this certificate instead of plain HTTP.
    pub tls: Option<tls::TlsFiles>,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        EmulatorConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: std::env::temp_dir().join("expressfs-emulator"),
            buckets: Vec::new(),
            access_key: "AKIDEXPRESSFSTEST".into(),
            secret_key: "expressfs-test-secret".into(),
            region: "us-east-1".into(),
            session_ttl: Duration::from_secs(300),
            ttfb: Duration::ZERO,
            log_requests: false,
            faults: FaultConfig::default(),
            public_buckets: Vec::new(),
            access_point_aliases: Vec::new(),
            record_requests: false,
            tls: None,
        }
    }
}

/// A running emulator. Dropping it stops the server.
pub struct Emulator {
    addr: SocketAddr,
    https: bool,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Emulator {
    /// Binds and serves on a dedicated thread with its own tokio runtime; usable from sync tests.
    pub fn start_background(config: EmulatorConfig) -> anyhow::Result<Emulator> {
        let listener = std::net::TcpListener::bind(config.listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let https = config.tls.is_some();
        let state = prepare(config)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("emulator".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .thread_name("emulator-worker")
                    .enable_all()
                    .build()
                    .expect("emulator runtime");
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                    tokio::select! {
                        _ = serve(listener, state) => {}
                        _ = rx => {}
                    }
                });
            })?;
        Ok(Emulator {
            addr,
            https,
            shutdown: Some(tx),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (an IP, not `localhost`: the SDK goes virtual-hosted for directory buckets on names),
    /// `https://` with TLS.
    pub fn endpoint_url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Validates the configuration and creates the data directory and the pre-declared buckets.
pub fn prepare(config: EmulatorConfig) -> anyhow::Result<Arc<server::State>> {
    let faults = faults::Faults::new(config.faults.clone()).map_err(|e| anyhow::anyhow!(e))?;
    if config.access_key.is_empty() || config.secret_key.is_empty() {
        anyhow::bail!("access key and secret key must not be empty");
    }
    let store = store::Store::new(&config.data_dir)
        .map_err(|e| anyhow::anyhow!("data directory {}: {e}", config.data_dir.display()))?;
    for bucket in &config.buckets {
        store
            .create_bucket(bucket)
            .map_err(|e| anyhow::anyhow!("bucket {bucket:?}: {}", e.message))?;
    }
    // A bad certificate or key fails here, at start, not at the first connection.
    let tls = config.tls.as_ref().map(tls::acceptor).transpose()?;
    let access = access::Access::new(
        &config.public_buckets,
        &config.access_point_aliases,
        config.record_requests,
    );
    Ok(Arc::new(server::State {
        access,
        config,
        store,
        faults: std::sync::Mutex::new(faults),
        paused_until: std::sync::Mutex::new(None),
        tls,
    }))
}

/// Accepts connections forever; each connection is served on its own task (HTTP/1.1 keep-alive).
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<server::State>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            match state.tls.clone() {
                None => serve_connection(stream, state).await,
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(stream) => serve_connection(stream, state).await,
                    // A client that does not trust the certificate hangs up here: worth a line in the log.
                    Err(e) => tracing::info!("TLS handshake failed: {e}"),
                },
            }
        });
    }
}

async fn serve_connection<S>(stream: S, state: Arc<server::State>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| server::handle(Arc::clone(&state), req));
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
}
