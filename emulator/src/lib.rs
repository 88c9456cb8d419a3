//! expressfs-emulator: a local S3 server that behaves like S3 Express One Zone directory buckets (and
//! general-purpose buckets) where expressfs depends on it. (Being written.)
//!
//! Library API (used by the `expressfs-emulator` binary and by in-process tests):
//! `Emulator::start_background(config)` binds, serves on its own thread/runtime, and returns a handle.

use std::net::SocketAddr;
use std::path::PathBuf;
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
    /// Limit faults to these kinds; empty = all kinds. Names: "internal-error", "slow-down", "reset-before-body",
    /// "reset-mid-body", "truncated-body", "latency-spike", "expired-token".
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
        }
    }
}

/// A running emulator. Dropping it stops the server.
pub struct Emulator {
    addr: SocketAddr,
}

impl Emulator {
    /// Binds and serves on a dedicated thread with its own tokio runtime; usable from sync tests.
    pub fn start_background(config: EmulatorConfig) -> anyhow::Result<Emulator> {
        let _ = config;
        anyhow::bail!("not yet implemented")
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (an IP, not `localhost`: the SDK goes virtual-hosted for directory buckets on names).
    pub fn endpoint_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}
