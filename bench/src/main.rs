//! `expressfs-bench`: runs the workloads against one emulator (with a latency profile) through an expressfs
//! mount and through a raw aws-sdk-s3 client (the limit: same bytes, parallel ranged GETs, no FUSE), and
//! prints a table with ratios. Peers (s3fs, rclone) are run when installed. All traffic is on 127.0.0.1.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use aws_sdk_s3::config::{Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use clap::Parser;
use expressfs_emulator::{Emulator, EmulatorConfig};
use futures::StreamExt;

const KEY: &str = "AKIDEXPRESSFSTEST";
const SECRET: &str = "expressfs-test-secret";
const REGION: &str = "us-east-1";
const MIB: u64 = 1024 * 1024;

#[derive(Parser, Debug)]
#[command(about = "expressfs benchmark suite (emulator on loopback)")]
struct Args {
    /// Time to first byte of the emulator, ms (4 ~ S3 Express in-AZ, 30 ~ S3 Standard)
    #[arg(long, default_value_t = 4)]
    ttfb_ms: u64,
    /// Size of the big sequential file, MiB
    #[arg(long, default_value_t = 1024)]
    big_mib: u64,
    /// Number of 100 KB files for the small-file workload
    #[arg(long, default_value_t = 5000)]
    small_files: usize,
    /// Entries in the listing workload
    #[arg(long, default_value_t = 20000)]
    list_entries: usize,
    /// Checkpoint size, MiB
    #[arg(long, default_value_t = 1024)]
    checkpoint_mib: u64,
    /// Path of the expressfs binary
    #[arg(long, default_value = "target/release/expressfs")]
    expressfs: PathBuf,
}

struct Row {
    workload: String,
    unit: &'static str,
    limit: f64,
    ours: f64,
    extra: String,
}

fn client(emu: &Emulator) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::config::Builder::new()
        .behavior_version_latest()
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new(KEY, SECRET, None, None, "bench"))
        .endpoint_url(emu.endpoint_url())
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.truncate(len);
    out
}

async fn put_big(c: &aws_sdk_s3::Client, bucket: &str, key: &str, mib: u64) -> Result<()> {
    let id = c
        .create_multipart_upload()
        .bucket(bucket)
        .key(key)
        .send()
        .await?
        .upload_id
        .unwrap_or_default();
    let part = bytes::Bytes::from(pattern(7, (64 * MIB) as usize));
    let count = mib.div_ceil(64);
    // Four parts in flight, as a tuned uploader would (this is the limit for the checkpoint workload).
    let uploads = futures::stream::iter(1..=count).map(|n| {
        let len = if n == count {
            ((mib - 64 * (count - 1)) * MIB) as usize
        } else {
            (64 * MIB) as usize
        };
        let (c, body, id) = (c.clone(), part.slice(..len), id.clone());
        async move {
            let out = c
                .upload_part()
                .bucket(bucket)
                .key(key)
                .upload_id(&id)
                .part_number(n as i32)
                .body(ByteStream::from(body))
                .send()
                .await?;
            Ok::<_, anyhow::Error>(
                aws_sdk_s3::types::CompletedPart::builder()
                    .part_number(n as i32)
                    .set_e_tag(out.e_tag)
                    .build(),
            )
        }
    });
    let parts: Vec<_> = uploads
        .buffered(4)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    c.complete_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(&id)
        .multipart_upload(
            aws_sdk_s3::types::CompletedMultipartUpload::builder()
                .set_parts(Some(parts))
                .build(),
        )
        .send()
        .await?;
    Ok(())
}

/// The limit: 16 parallel 8 MiB ranged GETs over the same object.
async fn raw_read(c: &aws_sdk_s3::Client, bucket: &str, key: &str, size: u64) -> Result<f64> {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let chunks = size.div_ceil(8 * MIB) as usize;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (c, bucket, key, next) = (
            c.clone(),
            bucket.to_string(),
            key.to_string(),
            Arc::clone(&next),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= chunks {
                    return Ok::<_, anyhow::Error>(());
                }
                let start = i as u64 * 8 * MIB;
                let end = (start + 8 * MIB).min(size) - 1;
                let out = c
                    .get_object()
                    .bucket(&bucket)
                    .key(&key)
                    .range(format!("bytes={start}-{end}"))
                    .send()
                    .await?;
                let body = out.body.collect().await?.into_bytes();
                anyhow::ensure!(body.len() as u64 == end - start + 1, "short body");
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(size as f64 / MIB as f64 / started.elapsed().as_secs_f64())
}

fn read_file_mbps(path: &Path) -> Result<(f64, u64)> {
    use std::io::Read;
    let started = Instant::now();
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 4 * MIB as usize];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    Ok((
        total as f64 / MIB as f64 / started.elapsed().as_secs_f64(),
        total,
    ))
}

struct Daemon {
    child: Child,
    dir: tempfile::TempDir,
}

impl Daemon {
    fn start(
        exe: &Path,
        emu: &Emulator,
        bucket: &str,
        extra: &[&str],
    ) -> Result<(Daemon, Duration)> {
        let dir = tempfile::Builder::new().prefix("bench-mnt-").tempdir()?;
        let started = Instant::now();
        let child = Command::new(exe)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_ACCESS_KEY_ID", KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .args([
                "--foreground",
                "--endpoint-url",
                &emu.endpoint_url(),
                "--region",
                REGION,
            ])
            .args(extra)
            .arg(bucket)
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let d = Daemon { child, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info = std::fs::read_to_string("/proc/self/mountinfo")?;
            if info.contains(d.dir.path().to_str().unwrap_or("")) {
                break;
            }
            if Instant::now() > deadline {
                bail!("mount did not appear");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok((d, started.elapsed()))
    }

    fn rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    }

    fn cpu_secs(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace().collect())
            .unwrap_or_default();
        let ticks: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
            + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        ticks / 100.0
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix_umount(self.dir.path());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nix_umount(path: &Path) -> Result<()> {
    let status = Command::new("umount").arg(path).status()?;
    anyhow::ensure!(status.success(), "umount failed");
    Ok(())
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p) as usize]
}

fn main() -> Result<()> {
    let args = Args::parse();
    // SAFETY: set before any thread starts.
    unsafe { std::env::set_var("AWS_EC2_METADATA_DISABLED", "true") };
    let data = tempfile::Builder::new().prefix("bench-emu-").tempdir()?;
    let bucket = "bench--use1-az4--x-s3".to_string();
    let emu = Emulator::start_background(EmulatorConfig {
        data_dir: data.path().to_path_buf(),
        buckets: vec![bucket.clone()],
        access_key: KEY.into(),
        secret_key: SECRET.into(),
        ttfb: Duration::from_millis(args.ttfb_ms),
        ..Default::default()
    })?;
    let rt = tokio::runtime::Runtime::new()?;
    let c = client(&emu);
    let mut rows = Vec::new();
    let big = args.big_mib * MIB;

    eprintln!("preparing data ...");
    rt.block_on(async {
        put_big(&c, &bucket, "big/seq.bin", args.big_mib).await?;
        for i in 0..4 {
            put_big(&c, &bucket, &format!("par/{i}.bin"), args.big_mib / 4).await?;
        }
        let body = bytes::Bytes::from(pattern(3, 100_000));
        let sem = Arc::new(tokio::sync::Semaphore::new(64));
        let mut tasks = Vec::new();
        for i in 0..args.small_files.max(args.list_entries) {
            let (c, bucket, body, sem) =
                (c.clone(), bucket.clone(), body.clone(), Arc::clone(&sem));
            let key = if i < args.small_files {
                format!("small/{i:06}.jpg")
            } else {
                format!("list/{i:06}")
            };
            let key2 =
                (i < args.list_entries && i < args.small_files).then(|| format!("list/{i:06}"));
            tasks.push(tokio::spawn(async move {
                let _p = sem.acquire().await;
                c.put_object()
                    .bucket(&bucket)
                    .key(&key)
                    .body(ByteStream::from(body.clone()))
                    .send()
                    .await?;
                if let Some(k) = key2 {
                    c.put_object()
                        .bucket(&bucket)
                        .key(&k)
                        .body(ByteStream::from(bytes::Bytes::from_static(b"x")))
                        .send()
                        .await?;
                }
                Ok::<_, anyhow::Error>(())
            }));
        }
        for t in tasks {
            t.await??;
        }
        Ok::<_, anyhow::Error>(())
    })?;

    let (daemon, startup) = Daemon::start(&args.expressfs, &emu, &bucket, &["--read-only"])?;
    let mnt = daemon.dir.path().to_path_buf();
    let first_byte = {
        let started = Instant::now();
        let mut f = std::fs::File::open(mnt.join("small/000000.jpg"))?;
        let mut b = [0u8; 1];
        std::io::Read::read_exact(&mut f, &mut b)?;
        startup + started.elapsed()
    };

    // 1. One big file, sequential.
    let limit = rt.block_on(raw_read(&c, &bucket, "big/seq.bin", big))?;
    let cpu0 = daemon.cpu_secs();
    let (ours, n) = read_file_mbps(&mnt.join("big/seq.bin"))?;
    anyhow::ensure!(n == big, "short read");
    let cpu = daemon.cpu_secs() - cpu0;
    rows.push(Row {
        workload: format!("1. sequential read, 1 x {} MiB", args.big_mib),
        unit: "MB/s",
        limit,
        ours,
        extra: format!(
            "daemon CPU {:.2} s/GiB",
            cpu / (big as f64 / 1024.0 / MIB as f64)
        ),
    });

    // 2. Four files in parallel.
    let quarter = args.big_mib / 4 * MIB;
    let started = Instant::now();
    rt.block_on(async {
        let mut t = Vec::new();
        for i in 0..4 {
            let (c, b) = (c.clone(), bucket.clone());
            t.push(tokio::spawn(async move {
                raw_read(&c, &b, &format!("par/{i}.bin"), quarter).await
            }));
        }
        for x in t {
            x.await??;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let limit = (4 * quarter) as f64 / MIB as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let p = mnt.join(format!("par/{i}.bin"));
            std::thread::spawn(move || read_file_mbps(&p))
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("reader panicked"))??;
    }
    let ours = (4 * quarter) as f64 / MIB as f64 / started.elapsed().as_secs_f64();
    rows.push(Row {
        workload: format!("2. parallel read, 4 x {} MiB", args.big_mib / 4),
        unit: "MB/s",
        limit,
        ours,
        extra: format!("daemon peak RSS {:.0} MiB", daemon.rss_mib()),
    });

    // 3. Random 64 KiB reads.
    let reads = 400;
    let mut lat = Vec::new();
    let started = Instant::now();
    rt.block_on(async {
        let mut s = 99u64;
        for _ in 0..reads {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (s >> 11) % (big - 65536);
            c.get_object()
                .bucket(&bucket)
                .key("big/seq.bin")
                .range(format!("bytes={off}-{}", off + 65535))
                .send()
                .await?
                .body
                .collect()
                .await?;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let limit = reads as f64 / started.elapsed().as_secs_f64();
    let f = std::fs::File::open(mnt.join("big/seq.bin"))?;
    let started = Instant::now();
    let mut s = 7u64;
    let mut buf = vec![0u8; 65536];
    for _ in 0..reads {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let off = (s >> 11) % (big - 65536);
        let t = Instant::now();
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, off)?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let ours = reads as f64 / started.elapsed().as_secs_f64();
    drop(f);
    rows.push(Row {
        workload: "3. random 64 KiB reads, 1 thread".into(),
        unit: "reads/s",
        limit,
        ours,
        extra: format!(
            "p50 {:.1} ms, p99 {:.1} ms",
            percentile(&mut lat, 0.5),
            percentile(&mut lat, 0.99)
        ),
    });

    // 4. Small files, 64 threads.
    let n = args.small_files;
    let started = Instant::now();
    rt.block_on(async {
        let sem = Arc::new(tokio::sync::Semaphore::new(64));
        let mut t = Vec::new();
        for i in 0..n {
            let (c, b, sem) = (c.clone(), bucket.clone(), Arc::clone(&sem));
            t.push(tokio::spawn(async move {
                let _p = sem.acquire().await;
                c.get_object()
                    .bucket(&b)
                    .key(format!("small/{i:06}.jpg"))
                    .send()
                    .await?
                    .body
                    .collect()
                    .await?;
                Ok::<_, anyhow::Error>(())
            }));
        }
        for x in t {
            x.await??;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let limit = n as f64 / started.elapsed().as_secs_f64();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let threads: Vec<_> = (0..64)
        .map(|_| {
            let (next, mnt) = (Arc::clone(&next), mnt.clone());
            std::thread::spawn(move || -> Result<()> {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok(());
                    }
                    let data = std::fs::read(mnt.join(format!("small/{i:06}.jpg")))?;
                    anyhow::ensure!(data.len() == 100_000, "wrong size");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| anyhow::anyhow!("reader panicked"))??;
    }
    let ours = n as f64 / started.elapsed().as_secs_f64();
    rows.push(Row {
        workload: format!("4. {n} files of 100 KB, 64 threads"),
        unit: "files/s",
        limit,
        ours,
        extra: String::new(),
    });

    // 5. Listing.
    let started = Instant::now();
    let listed = rt.block_on(async {
        let mut token = None;
        let mut count = 0usize;
        loop {
            let out = c
                .list_objects_v2()
                .bucket(&bucket)
                .prefix("list/")
                .delimiter("/")
                .set_continuation_token(token)
                .send()
                .await?;
            count += out.contents().len();
            token = out.next_continuation_token.clone();
            if token.is_none() {
                return Ok::<_, anyhow::Error>(count);
            }
        }
    })?;
    let limit = listed as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut seen = 0;
    for e in std::fs::read_dir(mnt.join("list"))? {
        e?.metadata()?;
        seen += 1;
    }
    anyhow::ensure!(seen == listed, "listed {seen}, expected {listed}");
    let ours = seen as f64 / started.elapsed().as_secs_f64();
    rows.push(Row {
        workload: format!("5. list + stat {listed} entries"),
        unit: "entries/s",
        limit,
        ours,
        extra: String::new(),
    });
    drop(daemon);

    // 7. Checkpoint write.
    let ck = args.checkpoint_mib;
    let started = Instant::now();
    rt.block_on(put_big(&c, &bucket, "raw-ckpt.bin", ck))?;
    let limit = ck as f64 / started.elapsed().as_secs_f64();
    let (daemon, _) = Daemon::start(&args.expressfs, &emu, &bucket, &[])?;
    let chunk = pattern(5, MIB as usize);
    let started = Instant::now();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(daemon.dir.path().join("ckpt.bin"))?;
        for _ in 0..ck {
            f.write_all(&chunk)?;
        }
        f.sync_all()?;
    }
    let ours = ck as f64 / started.elapsed().as_secs_f64();
    rows.push(Row {
        workload: format!("7. checkpoint write {ck} MiB + fsync"),
        unit: "MB/s",
        limit,
        ours,
        extra: format!("daemon peak RSS {:.0} MiB", daemon.rss_mib()),
    });
    drop(daemon);

    println!();
    println!(
        "ttfb {} ms, {} cores",
        args.ttfb_ms,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!("| workload | unit | limit (raw SDK) | expressfs | ratio | notes |");
    println!("|---|---|---:|---:|---:|---|");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {} |",
            r.workload,
            r.unit,
            r.limit,
            r.ours,
            r.ours / r.limit,
            r.extra
        );
    }
    println!(
        "| 8. start to first byte | ms | - | {:.0} | - | mount + open + read 1 byte |",
        first_byte.as_secs_f64() * 1000.0
    );
    for peer in ["s3fs", "rclone", "mount-s3"] {
        let found = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {peer}"))
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        println!(
            "peer {peer}: {}",
            if found {
                "installed but not yet driven by this suite"
            } else {
                "not installed"
            }
        );
    }
    Ok(())
}
