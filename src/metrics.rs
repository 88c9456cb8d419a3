//! Every metric the daemon exports, by name, in one place; the Prometheus endpoint (`--metrics-addr`); and
//! the snapshot the periodic summary prints. Layers that keep their own counters (the S3 client, the caches,
//! the file system's tables) register a probe here when they are built, so the summary reads one place and
//! knows none of them.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{self, Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const FUSE_REQUESTS: &str = "expressfs_fuse_requests_total";
pub const FUSE_ERRORS: &str = "expressfs_fuse_errors_total";
pub const READ_BYTES: &str = "expressfs_read_bytes_total";
pub const WRITTEN_BYTES: &str = "expressfs_written_bytes_total";
pub const S3_REQUESTS: &str = "expressfs_s3_requests_total";
pub const S3_REQUEST_SECONDS: &str = "expressfs_s3_request_seconds";
pub const OPEN_HANDLES: &str = "expressfs_open_handles";
pub const OPEN_WRITERS: &str = "expressfs_open_writers";
pub const INODES: &str = "expressfs_inodes";
pub const BUFFER_BYTES: &str = "expressfs_buffer_bytes";
pub const BUFFER_BYTES_PEAK: &str = "expressfs_buffer_bytes_peak";
pub const BUFFER_BUDGET_REFUSALS: &str = "expressfs_buffer_budget_refusals";
pub const READ_AHEAD_SHARED_BYTES: &str = "expressfs_read_ahead_shared_bytes";
pub const S3_BODY_RESUMES: &str = "expressfs_s3_body_resumes";
pub const S3_SESSION_RENEWALS: &str = "expressfs_s3_session_renewals";
pub const CACHE_HITS: &str = "expressfs_cache_hits";
pub const CACHE_MISSES: &str = "expressfs_cache_misses";
pub const CACHE_EVICTIONS: &str = "expressfs_cache_evictions";
pub const CACHE_CORRUPT_BLOCKS: &str = "expressfs_cache_corrupt_blocks";
pub const CACHE_BYTES: &str = "expressfs_cache_bytes";
pub const IOCTLS_REFUSED: &str = "expressfs_ioctls_refused_total";
pub const PAGE_CACHE_PRELOADS: &str = "expressfs_page_cache_preloads_total";
pub const PAGE_CACHE_PRELOADED_BYTES: &str = "expressfs_page_cache_preloaded_bytes_total";
pub const IDLE_MEMORY_RELEASES: &str = "expressfs_idle_memory_releases_total";

/// ioctls answered ENOTTY since the process started, for the summary (one mount per process).
static IOCTLS_REFUSED_COUNT: AtomicU64 = AtomicU64::new(0);

/// Latency buckets of the S3 histogram, in seconds (Express answers in single milliseconds).
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// Serves Prometheus text at `http://addr/metrics`. Must run inside the tokio runtime (the listener is a
/// task on it).
pub fn serve(addr: SocketAddr) -> Result<(), String> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(SECONDS_BUCKETS)
        .and_then(|b| b.install())
        .map_err(|e| format!("--metrics-addr {addr}: {e}"))?;
    describe();
    Ok(())
}

/// The HELP lines of the endpoint.
fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(FUSE_REQUESTS, "Requests from the kernel, by operation");
    describe_counter!(
        FUSE_ERRORS,
        "Requests answered with an error, by operation and errno"
    );
    describe_counter!(
        READ_BYTES,
        "Bytes returned to readers (through READ, or with an open into the page cache)"
    );
    describe_counter!(WRITTEN_BYTES, "Bytes accepted from writers");
    describe_counter!(S3_REQUESTS, "S3 requests, by operation and result");
    describe_histogram!(S3_REQUEST_SECONDS, "S3 request latency, by operation");
    describe_gauge!(OPEN_HANDLES, "Open file and directory handles");
    describe_gauge!(OPEN_WRITERS, "Files open for writing");
    describe_gauge!(INODES, "Inodes the kernel holds");
    describe_gauge!(
        BUFFER_BYTES,
        "Bytes of read-ahead and upload buffers in use"
    );
    describe_gauge!(BUFFER_BYTES_PEAK, "Most buffer bytes in use at once");
    describe_gauge!(
        BUFFER_BUDGET_REFUSALS,
        "Buffer reservations the memory target refused"
    );
    describe_gauge!(
        READ_AHEAD_SHARED_BYTES,
        "Read-ahead windows of all readers together (past twice --max-prefetch only by readers' one-part floors)"
    );
    describe_gauge!(S3_BODY_RESUMES, "GET bodies resumed after breaking");
    describe_gauge!(
        S3_SESSION_RENEWALS,
        "S3 Express sessions renewed after expiring"
    );
    describe_gauge!(CACHE_HITS, "Data cache block hits");
    describe_gauge!(CACHE_MISSES, "Data cache block misses");
    describe_gauge!(CACHE_EVICTIONS, "Data cache blocks evicted");
    describe_gauge!(
        CACHE_CORRUPT_BLOCKS,
        "Data cache blocks that failed their check"
    );
    describe_gauge!(CACHE_BYTES, "Bytes in the data cache");
    describe_counter!(
        IOCTLS_REFUSED,
        "ioctls answered ENOTTY (Python's open() asks each file for TCGETS)"
    );
    describe_counter!(
        PAGE_CACHE_PRELOADS,
        "Small files put into the kernel's page cache with the answer to their open"
    );
    describe_counter!(
        PAGE_CACHE_PRELOADED_BYTES,
        "Bytes put into the kernel's page cache with the answer to an open"
    );
    describe_counter!(
        IDLE_MEMORY_RELEASES,
        "Times the traffic went quiet and the buffers' memory went back to the system"
    );
}

/// A small file's bytes went into the page cache with its open: its first read costs no READ request. They
/// count as read bytes too, as they would have had they come back through READ.
pub fn page_cache_preload(bytes: usize) {
    ::metrics::counter!(PAGE_CACHE_PRELOADS).increment(1);
    ::metrics::counter!(PAGE_CACHE_PRELOADED_BYTES).increment(bytes as u64);
    read_bytes(bytes as u64);
}

/// The traffic went quiet and the memory its buffers held went back to the system (`crate::idle`).
pub fn idle_memory_given_back() {
    ::metrics::counter!(IDLE_MEMORY_RELEASES).increment(1);
}

/// One request from the kernel: what a workload costs in round trips, and proof that the kernel skips the
/// ones we ask it to (FOPEN_NOFLUSH).
pub fn fuse_request(op: &'static str) {
    TOTALS.fuse_requests.fetch_add(1, Relaxed);
    ::metrics::counter!(FUSE_REQUESTS, "op" => op).increment(1);
}

pub fn fuse_error(op: &'static str, errno: i32) {
    TOTALS.fuse_errors.fetch_add(1, Relaxed);
    ::metrics::counter!(FUSE_ERRORS, "op" => op, "errno" => errno.to_string()).increment(1);
}

/// One ioctl answered ENOTTY.
pub fn ioctl_refused() {
    IOCTLS_REFUSED_COUNT.fetch_add(1, Ordering::Relaxed);
    ::metrics::counter!(IOCTLS_REFUSED).increment(1);
}

/// ioctls answered ENOTTY so far in this process.
pub fn ioctls_refused() -> u64 {
    IOCTLS_REFUSED_COUNT.load(Ordering::Relaxed)
}

pub fn read_bytes(n: u64) {
    TOTALS.read_bytes.fetch_add(n, Relaxed);
    ::metrics::counter!(READ_BYTES).increment(n);
}

pub fn written_bytes(n: u64) {
    TOTALS.written_bytes.fetch_add(n, Relaxed);
    ::metrics::counter!(WRITTEN_BYTES).increment(n);
}

/// One S3 request's outcome ("ok" or the error code) and latency.
pub fn s3_request(op: &'static str, outcome: &str, elapsed: Duration) {
    TOTALS.s3_requests.fetch_add(1, Relaxed);
    if outcome != "ok" {
        TOTALS.s3_errors.fetch_add(1, Relaxed);
    }
    ::metrics::counter!(S3_REQUESTS, "op" => op, "result" => outcome.to_string()).increment(1);
    ::metrics::histogram!(S3_REQUEST_SECONDS, "op" => op).record(elapsed.as_secs_f64());
}

/// The data cache's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheSample {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub corrupt: u64,
    pub bytes: u64,
    /// The cache's own one-line account (every counter it keeps).
    pub summary: String,
}

/// What the periodic summary prints and the gauges report, as the probes found it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub open_handles: usize,
    pub open_writers: u64,
    pub inodes: usize,
    pub buffer_bytes: u64,
    pub buffer_peak: u64,
    pub budget_refusals: u64,
    /// What readers' windows hold of the mount's read-ahead share.
    pub read_ahead_shared: u64,
    pub body_resumes: u64,
    pub session_renewals: u64,
    pub ioctls_refused: u64,
    pub cache: Option<CacheSample>,
    /// The shared (`--cache-xz`) cache's one-line account.
    pub shared_cache: Option<String>,
}

impl Snapshot {
    /// Sets the gauges of the endpoint (a no-op without `--metrics-addr`).
    pub fn publish(&self) {
        use ::metrics::gauge;
        gauge!(OPEN_HANDLES).set(self.open_handles as f64);
        gauge!(OPEN_WRITERS).set(self.open_writers as f64);
        gauge!(INODES).set(self.inodes as f64);
        gauge!(BUFFER_BYTES).set(self.buffer_bytes as f64);
        gauge!(BUFFER_BYTES_PEAK).set(self.buffer_peak as f64);
        gauge!(BUFFER_BUDGET_REFUSALS).set(self.budget_refusals as f64);
        gauge!(READ_AHEAD_SHARED_BYTES).set(self.read_ahead_shared as f64);
        gauge!(S3_BODY_RESUMES).set(self.body_resumes as f64);
        gauge!(S3_SESSION_RENEWALS).set(self.session_renewals as f64);
        if let Some(c) = &self.cache {
            gauge!(CACHE_HITS).set(c.hits as f64);
            gauge!(CACHE_MISSES).set(c.misses as f64);
            gauge!(CACHE_EVICTIONS).set(c.evictions as f64);
            gauge!(CACHE_CORRUPT_BLOCKS).set(c.corrupt as f64);
            gauge!(CACHE_BYTES).set(c.bytes as f64);
        }
    }

    /// The summary line of the log.
    pub fn line(&self) -> String {
        let mut line = format!(
            "open_handles={} open_writers={} inodes={} body_resumes={} session_renewals={} buffer_peak_mib={} budget_refusals={} ioctls_refused={}",
            self.open_handles,
            self.open_writers,
            self.inodes,
            self.body_resumes,
            self.session_renewals,
            self.buffer_peak >> 20,
            self.budget_refusals,
            self.ioctls_refused
        );
        if let Some(c) = &self.cache {
            line.push_str(" cache: ");
            line.push_str(&c.summary);
        }
        line
    }
}

type Probe = Box<dyn Fn(&mut Snapshot) + Send + Sync>;

/// The sources of a [`Snapshot`]; each fills in the fields it knows.
#[derive(Default)]
pub struct Probes {
    probes: Mutex<Vec<Probe>>,
}

impl Probes {
    pub fn add(&self, probe: impl Fn(&mut Snapshot) + Send + Sync + 'static) {
        self.probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::new(probe));
    }

    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for probe in self.probes.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            probe(&mut snapshot);
        }
        snapshot
    }
}

/// Every `period`: the gauges, and one summary line in the log when something changed. With `traffic`
/// (`--log-metrics`) the line also carries what the period moved (requests, bytes, S3 calls), so an idle
/// mount stays quiet and a busy one reports its rates. Runs until the runtime stops.
pub async fn summarize(probes: Arc<Probes>, period: Duration, traffic: bool) {
    let mut last = String::new();
    let mut before = (Totals::now(), Instant::now());
    loop {
        let snapshot = probes.snapshot();
        snapshot.publish();
        let line = snapshot.line();
        if traffic {
            let now = (Totals::now(), Instant::now());
            if now.0 != before.0 || line != last {
                let rates = now.0.since(&before.0, now.1 - before.1);
                tracing::info!(target: "expressfs::metrics", "metrics: {rates} {line}");
            }
            before = now;
            last = line;
        } else if line != last {
            tracing::info!(summary = %line, "activity");
            last = line;
        }
        tokio::time::sleep(period).await;
    }
}

/// Running totals of the traffic counters, kept as plain atomics so that `--log-metrics` works without a
/// metrics recorder (the Prometheus one is installed only with `--metrics-addr`).
#[derive(Default)]
struct Counters {
    fuse_requests: AtomicU64,
    fuse_errors: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    s3_requests: AtomicU64,
    s3_errors: AtomicU64,
}

static TOTALS: Counters = Counters {
    fuse_requests: AtomicU64::new(0),
    fuse_errors: AtomicU64::new(0),
    read_bytes: AtomicU64::new(0),
    written_bytes: AtomicU64::new(0),
    s3_requests: AtomicU64::new(0),
    s3_errors: AtomicU64::new(0),
};

/// The traffic totals at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub fuse_requests: u64,
    pub fuse_errors: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub s3_requests: u64,
    pub s3_errors: u64,
}

impl Totals {
    pub fn now() -> Totals {
        Totals {
            fuse_requests: TOTALS.fuse_requests.load(Relaxed),
            fuse_errors: TOTALS.fuse_errors.load(Relaxed),
            read_bytes: TOTALS.read_bytes.load(Relaxed),
            written_bytes: TOTALS.written_bytes.load(Relaxed),
            s3_requests: TOTALS.s3_requests.load(Relaxed),
            s3_errors: TOTALS.s3_errors.load(Relaxed),
        }
    }

    /// What moved between `earlier` and `self`, over `elapsed`: counts, and bytes as MiB/s.
    pub fn since(&self, earlier: &Totals, elapsed: Duration) -> String {
        let secs = elapsed.as_secs_f64().max(1e-3);
        let mib_s = |now: u64, then: u64| now.saturating_sub(then) as f64 / secs / (1 << 20) as f64;
        format!(
            "fuse_requests={} fuse_errors={} read_mib_s={:.1} written_mib_s={:.1} s3_requests={} s3_errors={}",
            self.fuse_requests.saturating_sub(earlier.fuse_requests),
            self.fuse_errors.saturating_sub(earlier.fuse_errors),
            mib_s(self.read_bytes, earlier.read_bytes),
            mib_s(self.written_bytes, earlier.written_bytes),
            self.s3_requests.saturating_sub(earlier.s3_requests),
            self.s3_errors.saturating_sub(earlier.s3_errors),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_fill_one_snapshot_and_the_line_shows_it() {
        let probes = Probes::default();
        assert_eq!(probes.snapshot(), Snapshot::default());
        probes.add(|s| {
            s.open_handles = 3;
            s.open_writers = 1;
            s.inodes = 40;
            s.buffer_peak = 5 << 20;
            s.budget_refusals = 2;
        });
        probes.add(|s| {
            s.body_resumes = 7;
            s.session_renewals = 8;
            s.ioctls_refused = 9;
        });
        let s = probes.snapshot();
        assert_eq!(
            s.line(),
            "open_handles=3 open_writers=1 inodes=40 body_resumes=7 session_renewals=8 buffer_peak_mib=5 budget_refusals=2 ioctls_refused=9"
        );
        probes.add(|s| {
            s.cache = Some(CacheSample {
                hits: 1,
                summary: "hits=1 misses=0".into(),
                ..CacheSample::default()
            })
        });
        assert!(
            probes
                .snapshot()
                .line()
                .ends_with(" cache: hits=1 misses=0")
        );
    }

    #[test]
    fn traffic_line_shows_what_the_period_moved() {
        let before = Totals::now();
        fuse_request("read");
        read_bytes(3 << 20);
        s3_request("GetObject", "NoSuchKey", Duration::from_millis(1));
        let after = Totals::now();
        // Other tests in this process may add to the totals too, hence the lower bounds.
        assert!(after.fuse_requests > before.fuse_requests);
        assert!(after.read_bytes >= before.read_bytes + (3 << 20));
        assert!(after.s3_errors > before.s3_errors);
        let fixed = Totals {
            fuse_requests: 10,
            read_bytes: 4 << 20,
            s3_requests: 2,
            s3_errors: 1,
            ..Totals::default()
        };
        assert_eq!(
            fixed.since(&Totals::default(), Duration::from_secs(2)),
            "fuse_requests=10 fuse_errors=0 read_mib_s=2.0 written_mib_s=0.0 s3_requests=2 s3_errors=1"
        );
    }

    #[test]
    fn every_name_is_ours_and_distinct() {
        let names = [
            FUSE_REQUESTS,
            FUSE_ERRORS,
            READ_BYTES,
            WRITTEN_BYTES,
            S3_REQUESTS,
            S3_REQUEST_SECONDS,
            OPEN_HANDLES,
            OPEN_WRITERS,
            INODES,
            BUFFER_BYTES,
            BUFFER_BYTES_PEAK,
            BUFFER_BUDGET_REFUSALS,
            S3_BODY_RESUMES,
            S3_SESSION_RENEWALS,
            CACHE_HITS,
            CACHE_MISSES,
            CACHE_EVICTIONS,
            CACHE_CORRUPT_BLOCKS,
            CACHE_BYTES,
            IOCTLS_REFUSED,
        ];
        let distinct: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), names.len());
        assert!(names.iter().all(|n| n.starts_with("expressfs_")));
    }
}
