//! `expressfs-emulator`: a local S3 Express One Zone stand-in on 127.0.0.1 for tests, benchmarks and demos.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use expressfs_emulator::tls::TlsFiles;
use expressfs_emulator::{EmulatorConfig, FaultConfig};

#[derive(Parser, Debug)]
#[command(
    name = "expressfs-emulator",
    version,
    about = "Local S3 server that behaves like S3 Express One Zone directory buckets (and general purpose buckets)"
)]
struct Args {
    /// Address to listen on. Port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// Where object data lives (created if missing).
    #[arg(long)]
    data_dir: PathBuf,
    /// Bucket to create at start (repeatable). Names ending in --x-s3 are directory buckets.
    #[arg(long = "bucket")]
    buckets: Vec<String>,
    #[arg(long, env = "EMULATOR_ACCESS_KEY", default_value = "AKIDEXPRESSFSTEST")]
    access_key: String,
    #[arg(
        long,
        env = "EMULATOR_SECRET_KEY",
        default_value = "expressfs-test-secret",
        hide_env_values = true
    )]
    secret_key: String,
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// Lifetime of CreateSession credentials, in seconds (the service uses 300).
    #[arg(long, default_value_t = 300)]
    session_ttl: u64,
    /// Time to first byte added to every request, in milliseconds (Express is about 4 in-AZ).
    #[arg(long, default_value_t = 0)]
    ttfb_ms: u64,
    /// Log every request (method, path, operation, status, time).
    #[arg(long)]
    log_requests: bool,
    /// General purpose bucket that serves anonymous reads (repeatable), like a public bucket policy
    #[arg(long = "public-bucket")]
    public_buckets: Vec<String>,
    /// Access point alias standing for a bucket, ALIAS=BUCKET (repeatable); also an access point's host label,
    /// NAME-ACCOUNT=BUCKET, for requests sent to the host an access point ARN resolves to
    #[arg(long = "access-point-alias", value_parser = parse_alias)]
    access_point_aliases: Vec<(String, String)>,
    /// Keep the headers of recent requests for GET /_emulator/requests
    #[arg(long)]
    record_requests: bool,
    /// Serve HTTPS with this certificate chain (PEM, leaf first); needs --tls-key
    #[arg(long, requires = "tls_key", value_name = "PEM")]
    tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert (PEM)
    #[arg(long, requires = "tls_cert", value_name = "PEM")]
    tls_key: Option<PathBuf>,
    /// Fraction of requests (0..=1) that get an injected fault.
    #[arg(long, default_value_t = 0.0)]
    fault_rate: f64,
    #[arg(long, default_value_t = 0)]
    fault_seed: u64,
    /// Only these operations get faults (e.g. GetObject). Repeatable.
    #[arg(long = "fault-op")]
    fault_ops: Vec<String>,
    /// Only these fault kinds. Default: the retryable ones mixed (internal-error, slow-down, reset-before-body,
    /// reset-mid-body, truncated-body, latency-spike, expired-token). Opt-in: malformed-xml, unexpected-status,
    /// stall. Repeatable. A whole-server pause is `POST /_emulator/pause?ms=N`.
    #[arg(long = "fault-kind")]
    fault_kinds: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if !args.listen.ip().is_loopback() {
        eprintln!(
            "warning: listening on {} (not loopback): this emulator is for local testing only",
            args.listen
        );
    }
    let config = EmulatorConfig {
        listen: args.listen,
        data_dir: args.data_dir,
        buckets: args.buckets,
        access_key: args.access_key,
        secret_key: args.secret_key,
        region: args.region,
        session_ttl: Duration::from_secs(args.session_ttl),
        ttfb: Duration::from_millis(args.ttfb_ms),
        log_requests: args.log_requests,
        public_buckets: args.public_buckets,
        access_point_aliases: args.access_point_aliases,
        record_requests: args.record_requests,
        tls: args
            .tls_cert
            .zip(args.tls_key)
            .map(|(cert, key)| TlsFiles { cert, key }),
        faults: FaultConfig {
            rate: args.fault_rate,
            seed: args.fault_seed,
            operations: args.fault_ops,
            kinds: args.fault_kinds,
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
        let addr = listener.local_addr()?;
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let state = expressfs_emulator::prepare(config)?;
        // Scripts wait for this line (and read the port from it).
        println!("listening on {scheme}://{addr}");
        use std::io::Write;
        std::io::stdout().flush()?;
        tokio::select! {
            _ = expressfs_emulator::serve(listener, state) => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok(())
    })
}

fn parse_alias(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(a, b)| !a.is_empty() && !b.is_empty())
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .ok_or_else(|| format!("{s:?}: expected ALIAS=BUCKET"))
}
