//! `expressfs-get-cost`: client CPU per small GET, through the SDK's orchestrator and through the daemon's
//! own S3 client (which sends the read path's GETs without it, `src/s3/sdk/direct.rs`).
//!
//! Run an emulator in another process (so its CPU is not counted), then:
//!
//! ```sh
//! target/release/expressfs-emulator --listen 127.0.0.1:9611 --data-dir /dev/shm/get-cost \
//!     --bucket cost--use1-az4--x-s3 --bucket cost-general &
//! AWS_EC2_METADATA_DISABLED=true target/release/expressfs-get-cost --endpoint http://127.0.0.1:9611 \
//!     --bucket cost--use1-az4--x-s3
//! ```
//!
//! Each round runs the same GETs (64 objects of `--size` bytes, `--gets` ranged GETs, `--concurrency` in
//! flight) with each client in turn and prints GETs/s and client CPU (user + system of this process) per GET.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use clap::Parser;
use expressfs::s3::sdk::{SdkClient, SdkClientConfig};
use expressfs::s3::{ObjectClient, WriteCondition};
use futures::StreamExt;

#[derive(Parser)]
struct Args {
    /// The emulator (or any S3 endpoint on loopback).
    #[arg(long)]
    endpoint: String,
    /// A directory bucket (`--x-s3`) or a general-purpose one.
    #[arg(long)]
    bucket: String,
    #[arg(long, default_value_t = 20_000)]
    gets: usize,
    #[arg(long, default_value_t = 100_000)]
    size: usize,
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

const KEY: &str = "AKIDEXPRESSFSTEST";
const SECRET: &str = "expressfs-test-secret";
const REGION: &str = "us-east-1";

fn cpu_secs() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(r.ru_utime) + secs(r.ru_stime)
}

fn main() -> Result<()> {
    let args = Args::parse();
    // Loopback only: credentials and region explicit, no instance-metadata lookups.
    // SAFETY: set before any thread starts.
    unsafe {
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        std::env::set_var("AWS_ACCESS_KEY_ID", KEY);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET);
        std::env::set_var("AWS_REGION", REGION);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let sdk = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::new()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .region(aws_sdk_s3::config::Region::new(REGION))
            .credentials_provider(aws_sdk_s3::config::Credentials::new(
                KEY, SECRET, None, None, "get-cost",
            ))
            .endpoint_url(&args.endpoint)
            .force_path_style(true)
            .build(),
    );
    let mut config = SdkClientConfig::new(&args.bucket, REGION);
    config.endpoint_url = Some(args.endpoint.clone());
    config.force_path_style = true;
    let ours = SdkClient::new(config).await.context("expressfs client")?;
    let body = Bytes::from(vec![7u8; args.size]);
    for i in 0..64 {
        ours.put_object(&format!("get-cost/{i}"), body.clone(), WriteCondition::None)
            .await?;
    }
    println!(
        "{} GETs of {} B, {} in flight, bucket {}",
        args.gets, args.size, args.concurrency, args.bucket
    );
    for round in 1..=args.rounds {
        for through_sdk in [true, false] {
            let (cpu, started) = (cpu_secs(), Instant::now());
            let bytes = futures::stream::iter(0..args.gets)
                .map(|i| {
                    let (sdk, ours, bucket) = (&sdk, &ours, &args.bucket);
                    let key = format!("get-cost/{}", i % 64);
                    let end = args.size as u64;
                    async move {
                        if through_sdk {
                            let out = sdk
                                .get_object()
                                .bucket(bucket)
                                .key(&key)
                                .range(format!("bytes=0-{}", end - 1))
                                .send()
                                .await?;
                            Ok::<_, anyhow::Error>(out.body.collect().await?.into_bytes().len())
                        } else {
                            Ok(ours.get_object(&key, 0..end, None).await?.len())
                        }
                    }
                })
                .buffer_unordered(args.concurrency)
                .fold(Ok::<usize, anyhow::Error>(0), |total, got| async move {
                    Ok(total? + got?)
                })
                .await?;
            ensure!(bytes == args.gets * args.size, "short reads: {bytes} bytes");
            let secs = started.elapsed().as_secs_f64();
            let used = cpu_secs() - cpu;
            println!(
                "round {round} {:<32} {:>7.0} GETs/s  {:>6.1} µs CPU per GET",
                if through_sdk {
                    "aws-sdk-s3 get_object"
                } else {
                    "expressfs SdkClient::get_object"
                },
                args.gets as f64 / secs,
                used * 1e6 / args.gets as f64
            );
        }
    }
    Ok(())
}
