//! `expressfs-soak`: mixed reads, writes, overwrites, deletes, listings and checkpoint commits (write a
//! temporary file, rename it over the last one, patch it in place) through one expressfs mount for a long time
//! with faults injected by the emulator. It checks every byte read against what must be there,
//! checks at the end (faults off, through a raw client) that every acknowledged write landed, and samples the
//! daemon's RSS and open file descriptors, which must stay flat. Exit status 1 on any violation.
//!
//! `target/release/expressfs-soak --minutes 30 --fault-rate 0.05` (see docs/RELIABILITY.md).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use expressfs_bench::mounts::Mount;
use expressfs_bench::s3::{KEY, SECRET, client, emulator_admin, pattern};
use expressfs_emulator::{Emulator, EmulatorConfig};

const DIRECTORY_BUCKET: &str = "soak--use1-az4--x-s3";
const GENERAL_BUCKET: &str = "soak-general";
const MIB: usize = 1024 * 1024;

#[derive(Parser, Debug)]
#[command(
    about = "long mixed workload with injected faults; RSS and fds must stay flat, bytes exact"
)]
struct Args {
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Fraction of S3 requests that get a fault (the emulator's retryable kinds, mixed)
    #[arg(long, default_value_t = 0.05)]
    fault_rate: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds between RSS/fd samples
    #[arg(long, default_value_t = 10)]
    sample_secs: u64,
    #[arg(long, default_value_t = 3)]
    readers: usize,
    #[arg(long, default_value = "target/release/expressfs")]
    expressfs: PathBuf,
    /// Soak a general-purpose bucket (rename is a copy and a delete there) instead of a directory bucket
    #[arg(long)]
    general_purpose: bool,
    /// Mix in faults no client absorbs (HTTP 418, not retried), so failed writes, commits and patches happen
    /// and what they leave behind is checked
    #[arg(long)]
    loud_faults: bool,
}

/// Small xorshift generator for choosing operations (no need for a crate).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

#[derive(Default)]
struct Counters {
    reads_ok: AtomicU64,
    reads_failed: AtomicU64,
    bytes_read: AtomicU64,
    writes_ok: AtomicU64,
    writes_failed: AtomicU64,
    deletes: AtomicU64,
    commits_ok: AtomicU64,
    commits_failed: AtomicU64,
    patches_ok: AtomicU64,
    patches_failed: AtomicU64,
    listings_ok: AtomicU64,
    listings_failed: AtomicU64,
    violations: Mutex<Vec<String>>,
}

impl Counters {
    fn violation(&self, what: String) {
        eprintln!("VIOLATION: {what}");
        self.violations.lock().unwrap().push(what);
    }
}

/// What a key must hold: a pattern (by seed and length), or once patched the bytes themselves; after a
/// commit or patch that failed, any of the versions it could have left, or perhaps nothing.
#[derive(Clone)]
enum Expect {
    Absent,
    Pattern(u64, usize),
    Bytes(Arc<Vec<u8>>),
    OneOf(Vec<Expect>),
}

impl Expect {
    /// The bytes, when exactly one version is possible.
    fn exact(&self) -> Option<Vec<u8>> {
        match self {
            Expect::Pattern(seed, len) => Some(pattern(*seed, *len)),
            Expect::Bytes(b) => Some(b.to_vec()),
            Expect::Absent | Expect::OneOf(_) => None,
        }
    }

    fn matches(&self, got: &[u8]) -> bool {
        match self {
            Expect::Absent => false,
            Expect::Pattern(seed, len) => got.len() == *len && got == &pattern(*seed, *len)[..],
            Expect::Bytes(b) => got == &b[..],
            Expect::OneOf(all) => all.iter().any(|e| e.matches(got)),
        }
    }

    fn allows_missing(&self) -> bool {
        match self {
            Expect::Absent => true,
            Expect::OneOf(all) => all.iter().any(Expect::allows_missing),
            _ => false,
        }
    }
}

type Acked = Mutex<HashMap<String, Expect>>;

/// One admin request to the emulator; an unreachable emulator is an error here (the soak needs its answers).
fn admin(emu: &Emulator, method: &str, path: &str, body: &str) -> Result<String> {
    emulator_admin(&emu.endpoint_url(), method, path, body)
        .with_context(|| format!("{method} {path} on the emulator"))
}

/// Reads random prepared files and compares every byte.
fn reader(
    mnt: &Path,
    files: &[(String, Arc<Vec<u8>>)],
    seed: u64,
    stop: &AtomicBool,
    c: &Counters,
) {
    let mut rng = Rng(seed | 1);
    while !stop.load(Ordering::Relaxed) {
        let (name, expected) = &files[rng.below(files.len() as u64) as usize];
        match std::fs::read(mnt.join(name)) {
            Ok(got) if got == **expected => {
                c.reads_ok.fetch_add(1, Ordering::Relaxed);
                c.bytes_read.fetch_add(got.len() as u64, Ordering::Relaxed);
            }
            Ok(got) => c.violation(format!(
                "wrong bytes from {name}: {} bytes, expected {}",
                got.len(),
                expected.len()
            )),
            Err(_) => {
                c.reads_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn write_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    for chunk in data.chunks(MIB) {
        f.write_all(chunk)?;
    }
    f.sync_all()
}

/// Reads through the mount, retrying loud failures (faults are on); None if it never succeeded.
fn read_back(path: &Path) -> Option<std::io::Result<Vec<u8>>> {
    for _ in 0..8 {
        match std::fs::read(path) {
            Ok(d) => return Some(Ok(d)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(Err(e)),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    None
}

/// Writes, overwrites and deletes files in `out/`; remembers what each key must hold (by the seed of its
/// content) once the write was acknowledged.
fn writer(mnt: &Path, seed: u64, stop: &AtomicBool, c: &Counters, acked: &Acked) {
    let mut rng = Rng(seed | 1);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let name = format!("out/w-{:02}", rng.below(16));
        let path = mnt.join(&name);
        let before = acked.lock().unwrap().get(&name).cloned();
        if before.is_some() && rng.below(10) == 0 {
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    acked.lock().unwrap().remove(&name);
                    c.deletes.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    c.writes_failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            continue;
        }
        // Mostly small (checkpoint metadata, logs), sometimes multipart-sized.
        let len = if rng.below(4) == 0 {
            (8 + rng.below(20)) as usize * MIB + rng.below(4096) as usize
        } else {
            1 + rng.below(300_000) as usize
        };
        let content_seed = seed * 1_000_000 + n;
        let data = pattern(content_seed, len);
        match write_file(&path, &data) {
            Ok(()) => {
                c.writes_ok.fetch_add(1, Ordering::Relaxed);
                acked
                    .lock()
                    .unwrap()
                    .insert(name.clone(), Expect::Pattern(content_seed, len));
                match read_back(&path) {
                    Some(Ok(got)) if got == data => {}
                    Some(Ok(got)) => c.violation(format!(
                        "{name}: read back {} bytes that differ from the acknowledged write of {} bytes",
                        got.len(),
                        data.len()
                    )),
                    Some(Err(e)) => {
                        c.violation(format!("{name}: acknowledged write not found: {e}"))
                    }
                    None => {}
                }
            }
            Err(_) => {
                c.writes_failed.fetch_add(1, Ordering::Relaxed);
                // The key holds the old object or nothing: never a part of the new one.
                if let Some(Ok(got)) = read_back(&path)
                    && !before.as_ref().is_some_and(|b| b.matches(&got))
                {
                    c.violation(format!(
                        "{name}: failed write left {} bytes that are not the previous object; \
                         the failed write's own bytes: {}",
                        got.len(),
                        got == data
                    ));
                }
                // The name's state is unknown now only if it was never acknowledged; keep the expectation.
            }
        }
    }
}

/// The checkpoint patterns, on names of its own (`out/c-N`) so what each must hold is known: write a
/// temporary file and rename it over the last commit (Orbax, `torch.save` through a temporary name), or patch a
/// committed file in place (open without truncating, write at an offset, fsync: h5py, sqlite).
fn checkpointer(mnt: &Path, seed: u64, stop: &AtomicBool, c: &Counters, acked: &Acked) {
    let mut rng = Rng(seed | 1);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let name = format!("out/c-{}", rng.below(8));
        let before = acked
            .lock()
            .unwrap()
            .get(&name)
            .cloned()
            .unwrap_or(Expect::Absent);
        match before.exact() {
            Some(old) if rng.below(3) == 0 => patch(mnt, &name, before, old, &mut rng, c, acked),
            _ => commit(mnt, &name, before, seed * 1_000_000 + n, &mut rng, c, acked),
        }
    }
}

/// Writes `name`'s next version under a temporary name, then renames it over `name`.
fn commit(
    mnt: &Path,
    name: &str,
    before: Expect,
    content_seed: u64,
    rng: &mut Rng,
    c: &Counters,
    acked: &Acked,
) {
    let len = 1 + rng.below(2 * MIB as u64) as usize;
    let new = Expect::Pattern(content_seed, len);
    let data = pattern(content_seed, len);
    let (path, tmp) = (
        mnt.join(name),
        mnt.join(format!("{name}.tmp-{content_seed}")),
    );
    if write_file(&tmp, &data).is_err() {
        c.commits_failed.fetch_add(1, Ordering::Relaxed);
        let _ = std::fs::remove_file(&tmp);
        return;
    }
    if std::fs::rename(&tmp, &path).is_err() {
        c.commits_failed.fetch_add(1, Ordering::Relaxed);
        settle(&path, name, before, new, c, acked);
        let _ = std::fs::remove_file(&tmp);
        return;
    }
    c.commits_ok.fetch_add(1, Ordering::Relaxed);
    acked.lock().unwrap().insert(name.to_string(), new);
    check_read_back(&path, name, &data, "a commit", c);
    if std::fs::symlink_metadata(&tmp).is_ok() {
        c.violation(format!("{}: still there after its rename", tmp.display()));
    }
}

/// Overwrites a few bytes of a committed `name` at a random offset (perhaps past its end) and fsyncs.
fn patch(
    mnt: &Path,
    name: &str,
    before: Expect,
    old: Vec<u8>,
    rng: &mut Rng,
    c: &Counters,
    acked: &Acked,
) {
    use std::os::unix::fs::FileExt;
    let path = mnt.join(name);
    let at = rng.below(old.len() as u64 + 1) as usize;
    let chunk = pattern(rng.below(u64::MAX), 1 + rng.below(64 * 1024) as usize);
    let mut data = old;
    if data.len() < at + chunk.len() {
        data.resize(at + chunk.len(), 0);
    }
    data[at..at + chunk.len()].copy_from_slice(&chunk);
    let expected = data.clone();
    let new = Expect::Bytes(Arc::new(data));
    let written = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .and_then(|f| {
            f.write_all_at(&chunk, at as u64)?;
            f.sync_all()
        });
    if written.is_err() {
        c.patches_failed.fetch_add(1, Ordering::Relaxed);
        settle(&path, name, before, new, c, acked);
        return;
    }
    c.patches_ok.fetch_add(1, Ordering::Relaxed);
    acked.lock().unwrap().insert(name.to_string(), new);
    check_read_back(&path, name, &expected, "a patch", c);
}

/// Reads `path` back after `what` succeeded: it must hold exactly `expected`.
fn check_read_back(path: &Path, name: &str, expected: &[u8], what: &str, c: &Counters) {
    match read_back(path) {
        Some(Ok(got)) if got == expected => {}
        Some(Ok(got)) => c.violation(format!(
            "{name}: {} bytes after {what}, not the {} it wrote",
            got.len(),
            expected.len()
        )),
        Some(Err(e)) => c.violation(format!("{name}: not found after {what}: {e}")),
        None => {}
    }
}

/// After a commit or patch that failed loudly, `name` must hold the version before (or nothing, if there may
/// have been none) or the new one, whole. Which one is not promised (a staged file's upload may still land
/// at its release), so from then on either is accepted.
fn settle(path: &Path, name: &str, before: Expect, new: Expect, c: &Counters, acked: &Acked) {
    match read_back(path) {
        Some(Ok(got)) if !before.matches(&got) && !new.matches(&got) => c.violation(format!(
            "{name}: a failed commit or patch left {} bytes, neither the version before nor the new one",
            got.len()
        )),
        Some(Err(_)) if !before.allows_missing() => c.violation(format!(
            "{name}: a failed commit or patch lost the version before"
        )),
        _ => {}
    }
    acked
        .lock()
        .unwrap()
        .insert(name.to_string(), Expect::OneOf(vec![before, new]));
}

fn lister(mnt: &Path, expected: usize, stop: &AtomicBool, c: &Counters) {
    while !stop.load(Ordering::Relaxed) {
        match std::fs::read_dir(mnt.join("data")).and_then(|d| d.collect::<Result<Vec<_>, _>>()) {
            Ok(entries) if entries.len() == expected => {
                c.listings_ok.fetch_add(1, Ordering::Relaxed);
            }
            Ok(entries) => c.violation(format!(
                "data/ listed {} entries, expected {expected}",
                entries.len()
            )),
            Err(_) => {
                c.listings_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        let _ = std::fs::read_dir(mnt.join("out")).map(|d| d.count());
        std::thread::sleep(Duration::from_millis(300));
    }
}

struct Sample {
    secs: u64,
    rss_mib: f64,
    fds: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    // SAFETY: set before any thread starts.
    unsafe { std::env::set_var("AWS_EC2_METADATA_DISABLED", "true") };
    let bucket = if args.general_purpose {
        GENERAL_BUCKET
    } else {
        DIRECTORY_BUCKET
    };
    let data_dir = tempfile::Builder::new().prefix("soak-emu-").tempdir()?;
    let emu = Emulator::start_background(EmulatorConfig {
        data_dir: data_dir.path().to_path_buf(),
        buckets: vec![bucket.into()],
        access_key: KEY.into(),
        secret_key: SECRET.into(),
        ttfb: Duration::from_millis(2),
        ..Default::default()
    })?;
    let rt = tokio::runtime::Runtime::new()?;
    let client = client(&emu.endpoint_url());

    eprintln!("preparing data ...");
    let mut files: Vec<(String, Arc<Vec<u8>>)> = Vec::new();
    for i in 0..4u64 {
        files.push((format!("data/big-{i}"), Arc::new(pattern(i, 32 * MIB + 17))));
    }
    for i in 0..200u64 {
        files.push((
            format!("data/small-{i:03}"),
            Arc::new(pattern(100 + i, 100_000)),
        ));
    }
    rt.block_on(async {
        for (key, body) in &files {
            client
                .put_object()
                .bucket(bucket)
                .key(key)
                .body(body.to_vec().into())
                .send()
                .await?;
        }
        anyhow::Ok(())
    })?;

    let (mut daemon, _) = Mount::expressfs(
        &args.expressfs,
        &emu.endpoint_url(),
        bucket,
        &["--allow-delete", "--allow-overwrite"],
    )?;
    let root = daemon.root().to_path_buf();
    std::fs::create_dir_all(root.join("out"))?;
    // The default mix is the kinds a client is expected to absorb by retrying.
    let kinds = if args.loud_faults {
        r#""internal-error","slow-down","reset-before-body","reset-mid-body","truncated-body","latency-spike","expired-token","unexpected-status""#
    } else {
        ""
    };
    let faults = format!(
        r#"{{"rate":{},"seed":{},"operations":[],"kinds":[{kinds}]}}"#,
        args.fault_rate, args.seed
    );
    admin(&emu, "POST", "/_emulator/faults", &faults)?;

    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let acked = Arc::new(Mutex::new(HashMap::new()));
    let files = Arc::new(files);
    let mut workers = Vec::new();
    for r in 0..args.readers {
        let (m, f, s, c) = (root.clone(), files.clone(), stop.clone(), counters.clone());
        let seed = args.seed * 97 + r as u64;
        workers.push(std::thread::spawn(move || reader(&m, &f, seed, &s, &c)));
    }
    {
        let (m, s, c, a) = (root.clone(), stop.clone(), counters.clone(), acked.clone());
        let seed = args.seed;
        workers.push(std::thread::spawn(move || writer(&m, seed, &s, &c, &a)));
        let (m, s, c, a) = (root.clone(), stop.clone(), counters.clone(), acked.clone());
        let seed = args.seed * 31 + 7;
        workers.push(std::thread::spawn(move || {
            checkpointer(&m, seed, &s, &c, &a)
        }));
        let (m, s, c, n) = (root.clone(), stop.clone(), counters.clone(), files.len());
        workers.push(std::thread::spawn(move || lister(&m, n, &s, &c)));
    }

    let started = Instant::now();
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let mut samples = Vec::new();
    eprintln!(
        "{:>6} {:>9} {:>5} {:>8} {:>7} {:>7} {:>7}",
        "secs", "rss MiB", "fds", "reads", "r.fail", "writes", "w.fail"
    );
    while started.elapsed() < total {
        std::thread::sleep(Duration::from_secs(args.sample_secs).min(total));
        if daemon.exited() {
            counters.violation("the daemon exited during the soak".into());
            break;
        }
        let s = Sample {
            secs: started.elapsed().as_secs(),
            rss_mib: daemon.rss_mib(),
            fds: daemon.open_fds(),
        };
        let c = &counters;
        eprintln!(
            "{:>6} {:>9.1} {:>5} {:>8} {:>7} {:>7} {:>7}",
            s.secs,
            s.rss_mib,
            s.fds,
            c.reads_ok.load(Ordering::Relaxed),
            c.reads_failed.load(Ordering::Relaxed),
            c.writes_ok.load(Ordering::Relaxed),
            c.writes_failed.load(Ordering::Relaxed)
        );
        samples.push(s);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    let injected = admin(&emu, "GET", "/_emulator/faults", "")?;
    admin(&emu, "POST", "/_emulator/faults", r#"{"rate":0.0}"#)?;

    // Every acknowledged write must be in the bucket, exactly (checked without the mount and without faults).
    let acked = acked.lock().unwrap().clone();
    rt.block_on(async {
        for (name, expect) in &acked {
            let got = client.get_object().bucket(bucket).key(name).send().await;
            match got {
                Ok(o) => {
                    let body = o.body.collect().await?.into_bytes();
                    if !expect.matches(&body) {
                        counters.violation(format!(
                            "{name}: bucket holds other bytes than acknowledged"
                        ));
                    }
                }
                Err(_) if expect.allows_missing() => {}
                Err(e) => counters.violation(format!("{name}: acknowledged write missing: {e}")),
            }
        }
        anyhow::Ok(())
    })?;
    let uploads = admin(
        &emu,
        "GET",
        &format!("/_emulator/uploads?bucket={bucket}"),
        "",
    )?;
    drop(daemon);

    report(&args, &counters, &samples, &injected, &uploads, acked.len())
}

fn report(
    args: &Args,
    c: &Counters,
    samples: &[Sample],
    injected: &str,
    uploads: &str,
    acked: usize,
) -> Result<()> {
    let quarter = (samples.len() / 4).max(1);
    let max_rss = |s: &[Sample]| s.iter().map(|x| x.rss_mib).fold(0.0, f64::max);
    let max_fds = |s: &[Sample]| s.iter().map(|x| x.fds).max().unwrap_or(0);
    let (early, late) = (
        &samples[..quarter.min(samples.len())],
        &samples[samples.len().saturating_sub(quarter)..],
    );
    let injected: serde_json::Value = serde_json::from_str(injected).unwrap_or_default();
    println!(
        "## Soak: {} min, fault rate {}{}, seed {}, {}",
        args.minutes,
        args.fault_rate,
        if args.loud_faults {
            " (loud faults mixed in)"
        } else {
            ""
        },
        args.seed,
        if args.general_purpose {
            "general-purpose bucket"
        } else {
            "directory bucket"
        }
    );
    println!();
    println!("| measure | value |");
    println!("|---|---:|");
    let line = |k: &str, v: String| println!("| {k} | {v} |");
    line(
        "whole-file reads verified",
        c.reads_ok.load(Ordering::Relaxed).to_string(),
    );
    line(
        "reads that failed loudly (EIO)",
        c.reads_failed.load(Ordering::Relaxed).to_string(),
    );
    line(
        "GiB read and compared",
        format!(
            "{:.1}",
            c.bytes_read.load(Ordering::Relaxed) as f64 / (1u64 << 30) as f64
        ),
    );
    line(
        "writes acknowledged (fsync ok)",
        c.writes_ok.load(Ordering::Relaxed).to_string(),
    );
    line(
        "writes that failed loudly",
        c.writes_failed.load(Ordering::Relaxed).to_string(),
    );
    line("deletes", c.deletes.load(Ordering::Relaxed).to_string());
    let pair = |ok: &AtomicU64, failed: &AtomicU64| {
        format!(
            "{} / {}",
            ok.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed)
        )
    };
    line(
        "commits (temporary file renamed over the last) ok / failed loudly",
        pair(&c.commits_ok, &c.commits_failed),
    );
    line(
        "patches in place (fsync ok) ok / failed loudly",
        pair(&c.patches_ok, &c.patches_failed),
    );
    line(
        "listings ok / failed",
        format!(
            "{} / {}",
            c.listings_ok.load(Ordering::Relaxed),
            c.listings_failed.load(Ordering::Relaxed)
        ),
    );
    line("acknowledged keys verified at the end", acked.to_string());
    line("faults injected", injected["injected_total"].to_string());
    line(
        "daemon RSS, max in first / last quarter (MiB)",
        format!("{:.0} / {:.0}", max_rss(early), max_rss(late)),
    );
    line(
        "daemon open fds, max in first / last quarter",
        format!("{} / {}", max_fds(early), max_fds(late)),
    );
    line("multipart uploads left behind", uploads.trim().to_string());
    let violations = c.violations.lock().unwrap();
    line(
        "violations (wrong bytes, lost writes)",
        violations.len().to_string(),
    );
    println!();
    if let Some(list) = injected["injected"].as_array() {
        let mut by_kind: std::collections::BTreeMap<String, u64> = Default::default();
        for item in list {
            *by_kind
                .entry(item["kind"].as_str().unwrap_or("?").to_string())
                .or_default() += item["count"].as_u64().unwrap_or(0);
        }
        println!("| fault kind | injected |");
        println!("|---|---:|");
        for (k, n) in by_kind {
            println!("| {k} | {n} |");
        }
    }
    let rss_grew = max_rss(late) > max_rss(early) * 1.5 + 64.0;
    let fds_grew = max_fds(late) > max_fds(early) + 16;
    if !violations.is_empty() || rss_grew || fds_grew || uploads.trim() != "[]" {
        bail!(
            "soak failed: {} violations, rss grew: {rss_grew}, fds grew: {fds_grew}, uploads: {}",
            violations.len(),
            uploads.trim()
        );
    }
    Ok(())
}
