//! `expressfs-writers-bench`: the writers that expect a local file, against the raw client on the same
//! emulator in the same run.
//! - Patch: 4 KiB written in the middle of an existing object (1 GiB by default) through the mount, then
//!   close, against the raw client re-uploading the whole object (what a tool without server-side copy does).
//!   The ratio is the raw time over ours (10 = ten times faster); the bytes the emulator received are shown.
//! - Orbax: `StandardCheckpointer().save` of a pytree of the same size through the mount (Python from
//!   `.venv-frameworks`, see scripts/install-frameworks.sh), against the raw client's multipart upload of the
//!   same bytes; skipped when the venv is missing. The same save into /dev/shm shows Orbax's own cost.
//!
//! Rounds alternate the clients. All traffic is on 127.0.0.1.
//!
//! `target/release/expressfs-writers-bench` (see docs/BENCHMARKS.md for how figures are recorded).

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use clap::Parser;
use expressfs_bench::mounts::Mount;
use expressfs_bench::s3::{self, MIB, emulator_bytes_in};

const BUCKET: &str = "writers--use1-az4--x-s3";
const PATCH: usize = 4096;

#[derive(Parser, Debug)]
#[command(about = "writers: patch in place and Orbax save, against the raw client")]
struct Args {
    /// Size of the object patched and of the Orbax pytree, MiB
    #[arg(long, default_value_t = 1024)]
    mib: u64,
    /// Rounds (the median is reported)
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Time to first byte of the emulator, ms (4 ~ S3 Express in-AZ)
    #[arg(long, default_value_t = 4)]
    ttfb_ms: u64,
    /// Path of the expressfs binary
    #[arg(long, default_value = "target/release/expressfs")]
    expressfs: PathBuf,
    /// Python with orbax-checkpoint and jax (skip the Orbax rows if it does not exist)
    #[arg(long, default_value = ".venv-frameworks/bin/python")]
    python: PathBuf,
    /// Directory for the emulator's data [default: the temporary directory]
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    // SAFETY: set before any thread starts; no SDK may try the EC2 metadata address.
    unsafe { std::env::set_var("AWS_EC2_METADATA_DISABLED", "true") };
    let (_work, emu) = s3::start_emulator(
        "writers-bench-",
        args.work_dir.as_deref(),
        &[BUCKET],
        Duration::from_millis(args.ttfb_ms),
    )?;
    let endpoint = emu.endpoint_url();
    let rt = tokio::runtime::Runtime::new()?;
    let c = s3::client(&endpoint);
    eprintln!("preparing a {} MiB object ...", args.mib);
    rt.block_on(s3::put_big(&c, BUCKET, "big.bin", args.mib))?;

    let orbax = args.python.exists();
    let (mut raw_upload, mut patch, mut patch_in) = (Vec::new(), Vec::new(), Vec::new());
    let (mut orbax_mount, mut orbax_local) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        eprintln!("round {} ...", round + 1);
        let started = Instant::now();
        rt.block_on(s3::put_big(&c, BUCKET, "raw-copy.bin", args.mib))?;
        raw_upload.push(started.elapsed().as_secs_f64());

        let (mount, _) = Mount::expressfs(
            &args.expressfs,
            &endpoint,
            BUCKET,
            &["--allow-overwrite", "--allow-delete"],
        )?;
        let before = emulator_bytes_in(&endpoint);
        let at = args.mib * MIB / 2 + 12_345;
        let started = Instant::now();
        {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(mount.root().join("big.bin"))
                .context("open for the patch")?;
            f.write_all_at(&[round as u8 + 1; PATCH], at)?;
            f.sync_all().context("fsync of the patch")?;
        }
        patch.push(started.elapsed().as_secs_f64());
        patch_in.push(emulator_bytes_in(&endpoint).zip(before).map(|(a, b)| a - b));
        let got = rt.block_on(s3::get_range(
            &c,
            BUCKET,
            "big.bin",
            at,
            at + PATCH as u64 - 1,
        ))?;
        ensure!(
            got.iter().all(|b| *b == round as u8 + 1),
            "patch not in the object"
        );

        if orbax {
            let dir = mount.root().join(format!("orbax-{round}"));
            orbax_mount.push(orbax_save(&args, &dir)?);
        }
        drop(mount);
        if orbax {
            let local = tempfile::Builder::new()
                .prefix("orbax-")
                .tempdir_in("/dev/shm")?;
            orbax_local.push(orbax_save(&args, &local.path().join("ckpt"))?);
        }
    }

    let mib = args.mib as f64;
    let raw = median(&raw_upload);
    let ours = median(&patch);
    println!(
        "object {} MiB; emulator TTFB {} ms; {} rounds, medians\n",
        args.mib, args.ttfb_ms, args.rounds
    );
    println!("| workload | raw client | expressfs | ratio | bytes received by the emulator |");
    println!("|---|---:|---:|---:|---:|");
    let received = patch_in
        .iter()
        .map(|b| {
            b.map_or("?".to_string(), |b| {
                format!("{:.1} MiB", b as f64 / MIB as f64)
            })
        })
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "| patch 4 KiB in the middle + fsync (raw: re-upload the whole object) | {raw:.2} s | {ours:.3} s | {:.1}x | {received} (raw: {} MiB) |",
        raw / ours,
        args.mib
    );
    if orbax {
        let ours = median(&orbax_mount);
        let local = median(&orbax_local);
        println!(
            "| Orbax StandardCheckpointer save (raw: multipart upload of the same bytes) | {:.0} MB/s | {:.0} MB/s | {:.2} | (Orbax into /dev/shm: {:.0} MB/s) |",
            mib / raw,
            mib / ours,
            raw / ours,
            mib / local
        );
    } else {
        println!(
            "| Orbax save | | not run: {} missing | | |",
            args.python.display()
        );
    }
    Ok(())
}

/// Seconds for Orbax to save a pytree of `--mib` MiB of random float32 arrays (64 MiB each) to `dir`,
/// measured in Python around `save` + `wait_until_finished`.
fn orbax_save(args: &Args, dir: &Path) -> Result<f64> {
    let script = r#"
import sys, time
import numpy as np
import orbax.checkpoint as ocp
mib, path = int(sys.argv[1]), sys.argv[2]
n = max(1, mib // 64)
rng = np.random.default_rng(7)
# Random values: tensorstore compresses chunks, and constant arrays would shrink to nothing.
tree = {f"w{i}": rng.random(64 * 1024 * 1024 // 4, dtype=np.float32) for i in range(n)}
ckptr = ocp.StandardCheckpointer()
t = time.perf_counter()
ckptr.save(path, tree)
ckptr.wait_until_finished()
print(time.perf_counter() - t)
"#;
    let mut child = Command::new(&args.python)
        .arg("-")
        .arg(args.mib.to_string())
        .arg(dir)
        .env("JAX_PLATFORMS", "cpu")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("start python")?;
    child
        .stdin
        .take()
        .context("python stdin")?
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "orbax save failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .context("orbax save printed no time")
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
