//! `expressfs-bench`: runs the workloads against one emulator (with a latency profile) through an expressfs
//! mount, through the peers that are installed (s3fs, rclone mount, Mountpoint's engine) and through a raw
//! aws-sdk-s3 client (the limit: same bytes, best request pattern, no FUSE), then prints a table with ratios
//! to the limit and draws them as a PNG bar chart. All traffic is on 127.0.0.1.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use bytes::Bytes;
use clap::Parser;

use expressfs_bench::{chart, mounts, peers, report, s3, shards, workloads};
use mounts::Mount;
use peers::{Kind, Peer};
use report::{Report, Spec};
use s3::MIB;
use workloads::{Cell, Dataset, Results};

/// The bucket expressfs, rclone and the limit read: a directory bucket (S3 Express).
const DIR_BUCKET: &str = "bench--use1-az4--x-s3";
/// Its general-purpose twin (no `--x-s3` suffix) with the same objects, for s3fs, which has no CreateSession.
const GP_BUCKET: &str = "bench-general";
/// Reads of the random-read workload.
const RANDOM_READS: usize = 400;
/// Reads of its 1 MiB half.
const RANDOM_BIG_READS: usize = 200;

#[derive(Parser, Debug)]
#[command(about = "expressfs benchmark suite (emulator on loopback)")]
struct Args {
    /// Time to first byte of the emulator, ms (4 ~ S3 Express in-AZ, 30 ~ S3 Standard)
    #[arg(long, default_value_t = 4)]
    ttfb_ms: u64,
    /// Size of the big sequential file, MiB (the parallel workload reads 4 files of a quarter of it)
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(4..))]
    big_mib: u64,
    /// Number of 100 KB files for the small-file workload
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    small_files: u64,
    /// Entries in the listing workload
    #[arg(long, default_value_t = 20000)]
    list_entries: u64,
    /// Checkpoint size, MiB
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    checkpoint_mib: u64,
    /// Number of WebDataset-style tar shards (workload 6)
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    shards: u64,
    /// Size of each shard, MiB
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    shard_mib: u64,
    /// Path of the expressfs binary
    #[arg(long, default_value = "target/release/expressfs")]
    expressfs: PathBuf,
    /// Run the installed peers (s3fs, rclone mount, Mountpoint) too [default]
    #[arg(long, overrides_with = "no_peers")]
    peers: bool,
    /// Skip the peers
    #[arg(long, overrides_with = "peers")]
    no_peers: bool,
    /// rclone binary [default: rclone on PATH, else .venv/bin/rclone]
    #[arg(long)]
    rclone: Option<PathBuf>,
    /// Mountpoint peer binary [default: bench/mountpoint/target/release/expressfs-bench-mountpoint, else
    /// expressfs-bench-mountpoint on PATH; scripts/build-mountpoint-peer.sh builds it]
    #[arg(long)]
    mountpoint: Option<PathBuf>,
    /// Give up on one workload of one client after this many seconds (the mount is then killed)
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// Where to write the PNG bar chart of ratios to the limit
    #[arg(long, default_value = "docs/benchmarks.png")]
    chart: PathBuf,
    /// Do not draw the chart
    #[arg(long)]
    no_chart: bool,
    /// TrueType font for the chart's text [default: $EXPRESSFS_BENCH_FONT, common paths, fc-match]
    #[arg(long)]
    chart_font: Option<PathBuf>,
    /// Extra flag for the expressfs mounts, repeatable (e.g. `--expressfs-arg=--max-prefetch=16M`); the
    /// report lists them
    #[arg(long, allow_hyphen_values = true)]
    expressfs_arg: Vec<String>,
    /// Rounds: every client and the limit are measured this many times, each on fresh mounts, and each
    /// cell is the median
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    repeat: u32,
    /// Run only these workloads (comma-separated numbers, e.g. `2,6`) [default: all]
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u8).range(1..=8))]
    only: Vec<u8>,
    /// Print the table as markdown with machine, date and command, for docs/BENCHMARKS.md
    #[arg(long)]
    markdown: bool,
    /// Where the emulator keeps object bytes [default: the temp directory]. A tmpfs (`/dev/shm`) keeps the
    /// disk's writeback out of the figures; it needs RAM for the data set and the checkpoints.
    #[arg(long)]
    emulator_dir: Option<PathBuf>,
    /// Also run the PyTorch workloads (bench/pytorch_bench.py: DataLoader over the mount against
    /// s3torchconnector) when the venv of scripts/install-pytorch-peer.sh exists; `--repeat` rounds
    #[arg(long)]
    pytorch: bool,
    /// Run only the PyTorch workloads
    #[arg(long)]
    pytorch_only: bool,
    /// Emulator TTFBs of the PyTorch workloads, ms, comma-separated (one emulator each)
    #[arg(long, default_value = "4,0")]
    pytorch_ttfb_ms: String,
    /// Python with torch (and s3torchconnector) [default: .venv-pytorch/bin/python]
    #[arg(long)]
    pytorch_python: Option<PathBuf>,
    /// Extra argument for bench/pytorch_bench.py, repeatable (e.g. `--pytorch-arg=--small-files=100`)
    #[arg(long, allow_hyphen_values = true)]
    pytorch_arg: Vec<String>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    // SAFETY: set before any thread starts. Every SDK and tool would otherwise try the EC2 metadata address.
    unsafe { std::env::set_var("AWS_EC2_METADATA_DISABLED", "true") };
    let peers = if args.no_peers {
        Vec::new()
    } else {
        peers::discover(args.rclone.as_deref(), args.mountpoint.as_deref())
    };
    let timeout = Duration::from_secs(args.timeout_secs);
    if args.pytorch_only {
        return run_pytorch(&args);
    }

    let (_data_dir, emu) = s3::start_emulator(
        "bench-emu-",
        args.emulator_dir.as_deref(),
        &[DIR_BUCKET, GP_BUCKET],
        Duration::from_millis(args.ttfb_ms),
    )?;
    let endpoint = emu.endpoint_url();
    let rt = tokio::runtime::Runtime::new()?;
    let c = s3::client(&endpoint);

    let data = Arc::new(prepare(&rt, &c, &args)?);
    if peers
        .iter()
        .any(|p| p.kind == Kind::S3fs && p.exe.is_some())
    {
        eprintln!("copying the objects into {GP_BUCKET} for s3fs ...");
        let n = rt.block_on(s3::mirror(&c, DIR_BUCKET, GP_BUCKET))?;
        eprintln!("copied {n} objects");
    }
    // Every round measures every client afresh (new mounts, cold caches), the limit included; the report
    // gives each cell's median, so one unlucky moment on a shared machine does not decide a ratio.
    let rounds = args.repeat.max(1);
    let mut limit_rounds = Vec::new();
    let mut client_rounds: Vec<Vec<(&str, Results)>> = Vec::new();
    for round in 1..=rounds {
        if rounds > 1 {
            eprintln!("round {round} of {rounds}");
        }
        limit_rounds.push(measure_limits(&rt, &c, &data, args.checkpoint_mib)?);
        let mut clients = vec![(
            "expressfs",
            run_expressfs(&args, &endpoint, &data, timeout, round)?,
        )];
        for peer in &peers {
            clients.push((peer.name, run_peer(peer, &endpoint, &data, timeout)));
        }
        client_rounds.push(clients);
    }
    let limits = median_limits(&limit_rounds);
    let clients = median_clients(client_rounds);

    let report = Report::new(specs(&args, &limits), clients, preamble(&args, &peers));
    if args.markdown {
        print!("{}", report.markdown());
    } else {
        print!("{}", report.text());
    }
    if !args.no_chart {
        let title = format!(
            "Ratio to the raw-SDK limit, emulator TTFB {} ms, {}",
            args.ttfb_ms,
            report::today()
        );
        match chart::write_png(&args.chart, &report, &title, args.chart_font.as_deref()) {
            Ok(()) => eprintln!("chart written to {}", args.chart.display()),
            Err(e) => eprintln!("warning: no chart: {e:#}"),
        }
    }
    if args.pytorch {
        println!();
        run_pytorch(&args)?;
    }
    Ok(())
}

/// The PyTorch workloads through the Python driver, or a note saying why not.
fn run_pytorch(args: &Args) -> Result<()> {
    let Some(python) = expressfs_bench::pytorch::python(args.pytorch_python.as_deref()) else {
        println!(
            "PyTorch workloads: skipped (no .venv-pytorch; run scripts/install-pytorch-peer.sh)."
        );
        return Ok(());
    };
    expressfs_bench::pytorch::run(&expressfs_bench::pytorch::Run {
        python: &python,
        expressfs: &args.expressfs,
        ttfb_ms: &args.pytorch_ttfb_ms,
        rounds: args.repeat,
        emulator_dir: args.emulator_dir.as_deref(),
        expressfs_args: &args.expressfs_arg,
        markdown: args.markdown,
        extra: &args.pytorch_arg,
    })
}

/// Uploads the data set into the directory bucket. Memory stays bounded whatever the sizes: big objects
/// are multipart uploads of slices of one 64 MiB buffer, small ones go 64 at a time, shards stream.
fn prepare(rt: &tokio::runtime::Runtime, c: &aws_sdk_s3::Client, args: &Args) -> Result<Dataset> {
    eprintln!("preparing data ...");
    rt.block_on(async {
        s3::put_big(c, DIR_BUCKET, "big/seq.bin", args.big_mib).await?;
        for i in 0..4 {
            s3::put_big(c, DIR_BUCKET, &format!("par/{i}.bin"), args.big_mib / 4).await?;
        }
        let body = Bytes::from(s3::pattern(3, 100_000));
        let small = (0..args.small_files).map(|i| (format!("small/{i:06}.jpg"), body.clone()));
        let list =
            (0..args.list_entries).map(|i| (format!("list/{i:06}"), Bytes::from_static(b"x")));
        s3::put_many(c, DIR_BUCKET, small.chain(list), 64).await
    })?;
    let shards = shards::write_shards(
        rt.handle(),
        c,
        DIR_BUCKET,
        args.shards as usize,
        args.shard_mib,
    )?;
    eprintln!(
        "{} shards hold {} samples",
        shards.keys.len(),
        shards.samples
    );
    Ok(Dataset {
        big: args.big_mib * MIB,
        quarter: args.big_mib / 4 * MIB,
        small_files: args.small_files as usize,
        list_entries: args.list_entries as usize,
        random_reads: RANDOM_READS,
        random_big_reads: RANDOM_BIG_READS,
        shards,
        selected: selected_workloads(&args.only),
    })
}

/// `--only`'s workloads (all when empty); 3 brings its 1 MiB half along.
fn selected_workloads(only: &[u8]) -> std::collections::BTreeSet<u8> {
    let mut ids: std::collections::BTreeSet<u8> = if only.is_empty() {
        (1..=8).collect()
    } else {
        only.iter().copied().collect()
    };
    if ids.contains(&3) {
        ids.insert(workloads::RANDOM_1M);
    }
    ids
}

fn per_sec(count: f64, started: Instant) -> f64 {
    count / started.elapsed().as_secs_f64()
}

/// The raw client's figure for each workload that has one.
fn measure_limits(
    rt: &tokio::runtime::Runtime,
    c: &aws_sdk_s3::Client,
    d: &Dataset,
    checkpoint_mib: u64,
) -> Result<BTreeMap<u8, f64>> {
    eprintln!("raw client (the limit) ...");
    // Selected, and then with nothing dirty left to write back during the measurement.
    let settled = |id: u8| {
        let selected = d.selected.contains(&id);
        if selected {
            workloads::settle();
        }
        selected
    };
    rt.block_on(async {
        let mut l = BTreeMap::new();
        if settled(1) {
            l.insert(1, s3::raw_read(c, DIR_BUCKET, "big/seq.bin", d.big).await?);
        }
        if settled(2) {
            l.insert(2, s3::limit_parallel(c, DIR_BUCKET, d.quarter).await?);
        }
        if settled(3) {
            let rate = s3::limit_random(c, DIR_BUCKET, d.big, d.random_reads, 65536).await?;
            l.insert(3, rate);
        }
        if settled(workloads::RANDOM_1M) {
            let rate = s3::limit_random(c, DIR_BUCKET, d.big, d.random_big_reads, MIB).await?;
            l.insert(workloads::RANDOM_1M, rate);
        }
        if settled(4) {
            l.insert(4, s3::limit_small(c, DIR_BUCKET, d.small_files).await?);
        }
        if settled(5) {
            let (listed, rate) = s3::limit_list(c, DIR_BUCKET).await?;
            ensure!(
                listed == d.list_entries,
                "listed {listed}, expected {}",
                d.list_entries
            );
            l.insert(5, rate);
        }
        if settled(6) {
            let started = Instant::now();
            let samples = shards::raw_samples(c, DIR_BUCKET, &d.shards).await?;
            ensure!(
                samples == d.shards.samples,
                "counted {samples} samples, expected {}",
                d.shards.samples
            );
            l.insert(6, per_sec(samples as f64, started));
        }
        if settled(7) {
            let started = Instant::now();
            s3::put_big(c, DIR_BUCKET, "raw-ckpt.bin", checkpoint_mib).await?;
            l.insert(7, per_sec(checkpoint_mib as f64, started));
        }
        Ok(l)
    })
}

/// expressfs: the read workloads on a read-only mount, then the checkpoint on a writable one.
fn run_expressfs(
    args: &Args,
    endpoint: &str,
    data: &Arc<Dataset>,
    timeout: Duration,
    round: u32,
) -> Result<Results> {
    workloads::settle();
    let extra: Vec<&str> = args.expressfs_arg.iter().map(String::as_str).collect();
    let read_only: Vec<&str> = std::iter::once("--read-only")
        .chain(extra.iter().copied())
        .collect();
    let (mut m, took) = Mount::expressfs(&args.expressfs, endpoint, DIR_BUCKET, &read_only)?;
    let first = workloads::first_byte(&mut m, took, timeout);
    let mut results = workloads::run_reads(&mut m, data, endpoint, timeout);
    results.insert(8, first);
    drop(m);
    if !data.selected.contains(&7) {
        results.insert(7, Cell::missing("not run"));
        return Ok(results);
    }
    let (mut m, _) = Mount::expressfs(&args.expressfs, endpoint, DIR_BUCKET, &extra)?;
    results.insert(
        7,
        workloads::run_checkpoint(
            &mut m,
            &format!("ckpt-{round}.bin"),
            args.checkpoint_mib,
            timeout,
        ),
    );
    Ok(results)
}

/// Each workload's median limit over the rounds.
fn median_limits(rounds: &[BTreeMap<u8, f64>]) -> BTreeMap<u8, f64> {
    let mut by_id: BTreeMap<u8, Vec<f64>> = BTreeMap::new();
    for round in rounds {
        for (id, v) in round {
            by_id.entry(*id).or_default().push(*v);
        }
    }
    by_id
        .into_iter()
        .filter_map(|(id, v)| {
            let median = workloads::lower_median(v.into_iter().map(|x| (x, x)).collect())?;
            Some((id, median))
        })
        .collect()
}

/// Each client's median cell per workload over the rounds (clients are in the same order every round).
fn median_clients(rounds: Vec<Vec<(&str, Results)>>) -> Vec<(&str, Results)> {
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    let names: Vec<&str> = first.iter().map(|(n, _)| *n).collect();
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let ids: Vec<u8> = rounds[0][i].1.keys().copied().collect();
            let merged = ids
                .into_iter()
                .map(|id| {
                    let cells = rounds
                        .iter()
                        .filter_map(|r| r[i].1.get(&id).cloned())
                        .collect();
                    (id, workloads::median(cells))
                })
                .collect();
            (*name, merged)
        })
        .collect()
}

/// Every workload marked with the same reason.
fn all(why: &str) -> Results {
    selected_workloads(&[])
        .into_iter()
        .map(|id| (id, Cell::missing(why)))
        .collect()
}

/// A peer: the read workloads and the first byte. Peers are mounted read-only, so no checkpoint.
fn run_peer(peer: &Peer, endpoint: &str, data: &Arc<Dataset>, timeout: Duration) -> Results {
    let Some(exe) = &peer.exe else {
        return all("not installed");
    };
    workloads::settle();
    let mounted = match peer.kind {
        Kind::S3fs => Mount::s3fs(exe, endpoint, GP_BUCKET),
        Kind::Rclone => Mount::rclone(exe, endpoint, DIR_BUCKET),
        Kind::Mountpoint => Mount::mountpoint(exe, endpoint, DIR_BUCKET),
    };
    let (mut m, took) = match mounted {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{}: {e:#}", peer.name);
            return all("mount failed");
        }
    };
    let first = workloads::first_byte(&mut m, took, timeout);
    let mut results = workloads::run_reads(&mut m, data, endpoint, timeout);
    results.insert(8, first);
    results.insert(7, Cell::missing("n/a"));
    results
}

fn specs(args: &Args, limits: &BTreeMap<u8, f64>) -> Vec<Spec> {
    let spec = |id: u8, title: String, short, unit| Spec {
        id,
        title,
        short,
        unit,
        limit: limits.get(&id).copied(),
    };
    vec![
        spec(
            1,
            format!("1. sequential read, 1 x {} MiB", args.big_mib),
            "1 sequential",
            "MB/s",
        ),
        spec(
            2,
            format!("2. parallel read, 4 x {} MiB", args.big_mib / 4),
            "2 parallel",
            "MB/s",
        ),
        spec(
            3,
            "3. random 64 KiB reads, 1 thread".into(),
            "3 random 64K",
            "reads/s",
        ),
        spec(
            workloads::RANDOM_1M,
            "3b. random 1 MiB reads, 1 thread".into(),
            "3b random 1M",
            "reads/s",
        ),
        spec(
            4,
            format!("4. {} files of 100 KB, 64 threads", args.small_files),
            "4 small files",
            "files/s",
        ),
        spec(
            5,
            format!("5. list + stat {} entries", args.list_entries),
            "5 list+stat",
            "entries/s",
        ),
        spec(
            6,
            format!(
                "6. tar shards, {} x {} MiB, {} workers",
                args.shards,
                args.shard_mib,
                shards::WORKERS
            ),
            "6 tar shards",
            "samples/s",
        ),
        spec(
            7,
            format!("7. checkpoint write {} MiB + fsync", args.checkpoint_mib),
            "7 checkpoint",
            "MB/s",
        ),
        spec(8, "8. start to first byte".into(), "8 first byte", "ms"),
    ]
}

/// What the reader needs to interpret the table: latency profile, who the peers are and how they ran.
fn preamble(args: &Args, peers: &[Peer]) -> Vec<String> {
    let mut lines = vec![format!(
        "Emulator TTFB {} ms. limit = raw aws-sdk-s3 client, same bytes, best request pattern; ratio = client / limit.",
        args.ttfb_ms
    )];
    lines.push(
        "Workload 3 notes count GetObject requests and the bytes their responses declared (a client that \
         drops a long range early is counted for all of it)."
            .into(),
    );
    if args.repeat > 1 {
        lines.push(format!(
            "Each figure is the median of {} rounds; every round mounts every client afresh.",
            args.repeat
        ));
    }
    if !args.expressfs_arg.is_empty() {
        lines.push(format!(
            "expressfs mounted with `{}`.",
            args.expressfs_arg.join(" ")
        ));
    }
    if args.no_peers {
        lines.push("Peers: skipped (--no-peers).".into());
    }
    for p in peers {
        lines.push(match (&p.exe, p.kind) {
            (None, _) => format!("{}: not installed.", p.name),
            (Some(_), Kind::S3fs) => format!(
                "s3fs: {}, options `{}` (defaults otherwise), path-style, general-purpose bucket {GP_BUCKET} with the same objects.",
                p.version,
                mounts::S3FS_OPTIONS
            ),
            (Some(_), Kind::Rclone) => format!(
                "rclone: {}, `rclone mount {}`, directory bucket.",
                p.version,
                mounts::RCLONE_FLAGS.join(" ")
            ),
            (Some(_), Kind::Mountpoint) => format!(
                "mountpoint: Mountpoint for Amazon S3's file system library and CRT client in our bench-only \
                 wrapper (bench/mountpoint), {}, `{}` (mount-s3's defaults otherwise), on the directory bucket.",
                p.version,
                mounts::MOUNTPOINT_FLAGS.join(" ")
            ),
        });
    }
    if !peers.is_empty() {
        lines.push(
            "Peers are mounted read-only: workload 7 (writing) runs for expressfs only.".into(),
        );
    }
    lines
}
