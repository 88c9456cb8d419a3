//! `expressfs-warm-bench`: how fast `expressfs warm` fills the cache, against the raw client's limit for the
//! same bytes, and what it buys: the epoch that follows a warm-up against one on an unwarmed mount. The tree
//! mixes shards and small files (1 GiB by default); the emulator adds a time to first byte like S3
//! Express's. All traffic is on 127.0.0.1.
//!
//! `target/release/expressfs-warm-bench` (see docs/BENCHMARKS.md for how figures are recorded).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use clap::Parser;
use expressfs_bench::mounts::Mount;
use expressfs_bench::s3::{self, MIB, emulator_gets};
use futures::StreamExt;

const BUCKET: &str = "warm--use1-az4--x-s3";

#[derive(Parser, Debug)]
#[command(about = "expressfs warm: rate against the raw-client limit, and the epoch after it")]
struct Args {
    /// Shards in the tree
    #[arg(long, default_value_t = 24)]
    shards: u64,
    /// Size of each shard, MiB
    #[arg(long, default_value_t = 32)]
    shard_mib: u64,
    /// Small files in the tree (64 KiB each, in 16 directories)
    #[arg(long, default_value_t = 4096)]
    small_files: usize,
    /// Readers for `expressfs warm --jobs` (64 is its default) and for the epochs; requests in flight for
    /// the limit (the raw client is fastest here at 64: 16 leave it waiting on round trips)
    #[arg(long, default_value_t = 64)]
    jobs: usize,
    /// Time to first byte of the emulator, ms (4 ~ S3 Express in-AZ)
    #[arg(long, default_value_t = 4)]
    ttfb_ms: u64,
    /// Path of the expressfs binary
    #[arg(long, default_value = "target/release/expressfs")]
    expressfs: PathBuf,
    /// Directory for the emulator's data and the cache [default: the temporary directory]
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

const SMALL: usize = 64 * 1024;

fn main() -> Result<()> {
    let args = Args::parse();
    // SAFETY: set before any thread starts; no SDK may try the EC2 metadata address.
    unsafe { std::env::set_var("AWS_EC2_METADATA_DISABLED", "true") };
    let (work, emu) = s3::start_emulator(
        "warm-bench-",
        args.work_dir.as_deref(),
        &[BUCKET],
        Duration::from_millis(args.ttfb_ms),
    )?;
    let endpoint = emu.endpoint_url();
    let rt = tokio::runtime::Runtime::new()?;
    let c = s3::client(&endpoint);

    eprintln!("preparing the tree ...");
    let mut objects: Vec<(String, u64)> = Vec::new();
    rt.block_on(async {
        for i in 0..args.shards {
            let key = format!("tree/shards/{i:04}.tar");
            s3::put_big(&c, BUCKET, &key, args.shard_mib).await?;
            objects.push((key, args.shard_mib * MIB));
        }
        let body = Bytes::from(s3::pattern(7, SMALL));
        let small: Vec<(String, Bytes)> = (0..args.small_files)
            .map(|i| (format!("tree/img/{:02}/{i:06}.jpg", i % 16), body.clone()))
            .collect();
        objects.extend(small.iter().map(|(k, _)| (k.clone(), SMALL as u64)));
        s3::put_many(&c, BUCKET, small.into_iter(), 64).await
    })?;
    let total: u64 = objects.iter().map(|(_, n)| n).sum();
    let mib = total as f64 / MIB as f64;

    eprintln!("raw client limit ...");
    let own_cpu = self_cpu_secs();
    let limit = rt.block_on(raw_limit(&c, &objects, args.jobs))?;
    // The SDK client and the emulator serving it, both in this process.
    let raw_cpu = self_cpu_secs() - own_cpu;

    eprintln!("unwarmed epoch ...");
    let cold_cache = work.path().join("cold-cache");
    let (unwarmed_secs, unwarmed_gets, unwarmed_cpu) = {
        let (mount, _) = mount(&args, &endpoint, &cold_cache)?;
        let gets = emulator_gets(&endpoint).map_or(0, |g| g.0);
        let cpu = mount.cpu_secs();
        let secs = epoch(&mount.root().join("tree"), args.jobs, total)?;
        let cpu = mount.cpu_secs() - cpu;
        (
            secs,
            emulator_gets(&endpoint).map_or(0, |g| g.0) - gets,
            cpu,
        )
    };

    eprintln!("warm-up, then the epoch after it ...");
    let cache = work.path().join("cache");
    let (mount, _) = mount(&args, &endpoint, &cache)?;
    let requests_before = requests_by_operation(&endpoint);
    let (daemon_cpu, client_cpu, emulator_cpu) =
        (mount.cpu_secs(), children_cpu_secs(), self_cpu_secs());
    let started = Instant::now();
    let out = Command::new(&args.expressfs)
        .arg("warm")
        .arg("--jobs")
        .arg(args.jobs.to_string())
        .arg(mount.root().join("tree"))
        .output()
        .context("run expressfs warm")?;
    let warm_secs = started.elapsed().as_secs_f64();
    let (daemon_cpu, client_cpu, emulator_cpu) = (
        mount.cpu_secs() - daemon_cpu,
        children_cpu_secs() - client_cpu,
        self_cpu_secs() - emulator_cpu,
    );
    ensure!(
        out.status.success(),
        "expressfs warm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let warm_requests = requests_by_operation(&endpoint).map(|after| {
        let before = requests_before.unwrap_or_default();
        after
            .into_iter()
            .map(|(op, n)| (op.clone(), n - before.get(&op).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect::<std::collections::BTreeMap<_, _>>()
    });
    wait_for_cache_writes(&cache.join("blocks"));
    let gets = emulator_gets(&endpoint).map_or(0, |g| g.0);
    let warmed_secs = epoch(&mount.root().join("tree"), args.jobs, total)?;
    let warmed_gets = emulator_gets(&endpoint).map_or(0, |g| g.0) - gets;
    drop(mount);

    let warm_rate = mib / warm_secs;
    println!(
        "tree: {} shards of {} MiB + {} files of 64 KiB = {mib:.0} MiB; emulator TTFB {} ms; {} readers\n",
        args.shards, args.shard_mib, args.small_files, args.ttfb_ms, args.jobs
    );
    println!("| | seconds | MiB/s | ratio to the limit | GETs |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| raw client (limit) | {:.2} | {limit:.0} | 1.00 | |",
        mib / limit
    );
    let warm_gets = warm_requests
        .as_ref()
        .and_then(|r| r.get("GetObject"))
        .map_or(String::new(), u64::to_string);
    println!(
        "| `expressfs warm` | {warm_secs:.2} | {warm_rate:.0} | {:.2} | {warm_gets} |",
        warm_rate / limit
    );
    println!(
        "| epoch, unwarmed mount | {unwarmed_secs:.2} | {:.0} | {:.2} | {unwarmed_gets} |",
        mib / unwarmed_secs,
        mib / unwarmed_secs / limit
    );
    println!(
        "| epoch after warm | {warmed_secs:.2} | {:.0} | {:.2} | {warmed_gets} |",
        mib / warmed_secs,
        mib / warmed_secs / limit
    );
    // CPU is the resource on a small machine, and the figure least disturbed by other load.
    println!(
        "\nCPU seconds: raw client and emulator {raw_cpu:.2}; warm-up: daemon {daemon_cpu:.2}, \
         `expressfs warm` {client_cpu:.2}, emulator {emulator_cpu:.2}; unwarmed epoch: daemon {unwarmed_cpu:.2}"
    );
    if let Some(requests) = warm_requests {
        println!("\nrequests during the warm-up: {requests:?}");
    }
    Ok(())
}

/// User + system CPU of this process (the emulator runs in it), seconds.
fn self_cpu_secs() -> f64 {
    rusage_secs(libc::RUSAGE_SELF)
}

/// User + system CPU of the children this process has waited for, seconds.
fn children_cpu_secs() -> f64 {
    rusage_secs(libc::RUSAGE_CHILDREN)
}

fn rusage_secs(who: libc::c_int) -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// Requests the emulator has served so far, by operation, summed over buckets (its `/_emulator/stats`).
fn requests_by_operation(endpoint: &str) -> Option<std::collections::BTreeMap<String, u64>> {
    let body = s3::emulator_admin(endpoint, "GET", "/_emulator/stats", "")?;
    let stats: serde_json::Value = serde_json::from_str(&body).ok()?;
    let mut counts = std::collections::BTreeMap::new();
    for ops in stats.as_object()?.values() {
        for (op, fields) in ops.as_object()? {
            *counts.entry(op.clone()).or_insert(0) += fields["requests"].as_u64().unwrap_or(0);
        }
    }
    Some(counts)
}

fn mount(args: &Args, endpoint: &str, cache: &Path) -> Result<(Mount, Duration)> {
    Mount::expressfs(
        &args.expressfs,
        endpoint,
        BUCKET,
        &[
            "--read-only",
            "--cache",
            cache.to_str().context("cache path")?,
        ],
    )
}

/// The same bytes through the SDK with the best pattern: `jobs` requests in flight, small objects whole,
/// shards in 8 MiB ranges. Returns MiB/s.
async fn raw_limit(c: &aws_sdk_s3::Client, objects: &[(String, u64)], jobs: usize) -> Result<f64> {
    let mut ranges = Vec::new();
    for (key, size) in objects {
        let mut start = 0;
        while start < *size {
            let end = (start + s3::RANGE).min(*size) - 1;
            ranges.push((key.as_str(), start, end));
            start = end + 1;
        }
    }
    let started = Instant::now();
    let mut bytes = 0u64;
    let mut gets = futures::stream::iter(ranges)
        .map(|(key, start, end)| s3::get_range(c, BUCKET, key, start, end))
        .buffer_unordered(jobs.max(1));
    while let Some(body) = gets.next().await {
        bytes += body?.len() as u64;
    }
    Ok(bytes as f64 / MIB as f64 / started.elapsed().as_secs_f64())
}

/// Reads every file under `root` to the end with `jobs` threads (a training epoch). Returns seconds.
fn epoch(root: &Path, jobs: usize, expected: u64) -> Result<f64> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    let started = Instant::now();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                dirs.push(entry.path());
            } else {
                files.push(entry.path());
            }
        }
    }
    let next = AtomicUsize::new(0);
    let read = std::thread::scope(|s| {
        let workers: Vec<_> = (0..jobs.max(1))
            .map(|_| {
                s.spawn(|| -> Result<u64> {
                    use std::io::Read;
                    let mut buf = vec![0u8; MIB as usize];
                    let mut n = 0u64;
                    while let Some(path) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let mut f = std::fs::File::open(path)?;
                        loop {
                            match f.read(&mut buf)? {
                                0 => break,
                                got => n += got as u64,
                            }
                        }
                    }
                    Ok(n)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("reader thread"))
            .sum::<Result<u64>>()
    })?;
    ensure!(
        read == expected,
        "the epoch read {read} bytes, expected {expected}"
    );
    Ok(started.elapsed().as_secs_f64())
}

/// Cache blocks are written in the background: wait until their count has not moved for half a second.
fn wait_for_cache_writes(blocks: &Path) {
    let count = || std::fs::read_dir(blocks).map_or(0, |d| d.count());
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut last, mut since) = (count(), Instant::now());
    while Instant::now() < deadline && since.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(100));
        let now = count();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
}
