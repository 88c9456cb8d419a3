//! `expressfs-bench-mountpoint`: the engine of Mountpoint for Amazon S3 (its file system library
//! `mountpoint-s3-fs` and its CRT-based client `mountpoint-s3-client`, both from crates.io) behind a
//! minimal command line, so that the benchmark suite can run it as a peer of expressfs against the
//! emulator. The `mount-s3` binary itself is not published on crates.io, hence this wrapper.
//!
//! For benchmarking only: it is not shipped, not packaged, not part of the main workspace and not built
//! by CI. It sets nothing that mount-s3 would not set by default (8 MiB parts, the 10 Gbit/s throughput
//! target mount-s3 uses off EC2, a memory target of 95% of the machine's memory, the default prefetcher,
//! no data cache, minimal metadata TTLs, 16 FUSE threads, jemalloc), except that the endpoint, region and
//! credentials must be given: it never looks for credentials or a region anywhere else. It mounts in the
//! foreground and unmounts on SIGINT/SIGTERM; when the file system is unmounted from outside, it exits.
//!
//! Logs go to stderr; `RUST_LOG` overrides the default filter (`RUST_LOG=debug,awscrt=debug` shows every
//! request the CRT makes).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use mountpoint_s3_client::config::{
    AddressingStyle, Allocator, CredentialsProvider, CredentialsProviderStaticOptions,
    RustLogAdapter, S3ClientAuthConfig,
};
use mountpoint_s3_client::user_agent::UserAgent;
use mountpoint_s3_fs::data_cache::DataCacheConfig;
use mountpoint_s3_fs::fuse::config::{FuseOptions, FuseSessionConfig, MountPoint};
use mountpoint_s3_fs::memory::{
    CandidateSize, MINIMUM_MEM_LIMIT, PagedPool, effective_total_memory,
};
use mountpoint_s3_fs::s3::config::{
    ClientConfig, MemoryLimitSetting, PartConfig, Region, TargetThroughputSetting,
};
use mountpoint_s3_fs::s3::{Bucket, Prefix, S3Path, S3Personality};
use mountpoint_s3_fs::{
    MountpointConfig, Runtime, S3FilesystemConfig, Superblock, SuperblockConfig,
};

// mount-s3 is built with jemalloc as its allocator; the same here, so memory figures are comparable.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Printed by `--version`; the suite puts it in its report. Keep the library versions in step with the
/// pins in Cargo.toml.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (mountpoint-s3-fs 0.11.0, mountpoint-s3-client 0.22.1)"
);

/// mount-s3's default part size for GET and PUT.
const PART_SIZE: usize = 8 * 1024 * 1024;
/// The block size mount-s3 registers with its memory pool (that of its data caches, off here).
const CACHE_BLOCK_SIZE: usize = 1024 * 1024;

#[derive(Parser, Debug)]
#[command(
    version = VERSION,
    about = "Mountpoint for Amazon S3's engine behind a minimal CLI, for expressfs's benchmark suite only"
)]
struct Args {
    /// Bucket to mount (a directory bucket name ends in --x-s3)
    bucket: String,
    /// Directory to mount it on
    mount_point: PathBuf,
    /// S3 endpoint, e.g. http://127.0.0.1:9000 (required: this tool never talks to AWS by default)
    #[arg(long)]
    endpoint_url: String,
    /// Region to sign requests for
    #[arg(long)]
    region: String,
    /// Path-style addressing (bucket in the path, not in the host name)
    #[arg(long)]
    force_path_style: bool,
    /// Mount read-only
    #[arg(long)]
    read_only: bool,
    /// Mount only the keys under this prefix (must end in '/')
    #[arg(long)]
    prefix: Option<String>,
    /// FUSE worker threads (mount-s3's default)
    #[arg(long, default_value_t = 16)]
    max_threads: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    init_logging()?;
    let session = mount(&args)?;
    println!("mounted {} at {}", args.bucket, args.mount_point.display());
    // Returns once the file system is unmounted from outside, or after unmounting it on SIGINT/SIGTERM
    // (the library installs those handlers when it creates the session).
    session.join().context("FUSE session failed")
}

/// tracing to stderr, with the CRT's own log forwarded into it under the `awscrt` target.
fn init_logging() -> Result<()> {
    RustLogAdapter::try_init().context("CRT log adapter")?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("warn,mountpoint_s3=info,awscrt=off")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init()
        .map_err(|e| anyhow::anyhow!("logging: {e}"))
}

fn mount(args: &Args) -> Result<mountpoint_s3_fs::fuse::session::FuseSession> {
    let prefix = match &args.prefix {
        Some(p) => Prefix::new(p).context("invalid --prefix")?,
        None => Prefix::empty(),
    };
    let s3_path = S3Path::new(Bucket::new(&args.bucket)?, prefix);

    // The memory target mount-s3 picks when it is not given one: 95% of what the machine (or cgroup) has.
    let total = (effective_total_memory() as f64 * 0.95) as usize;
    let memory = MemoryLimitSetting::Default(total.max(MINIMUM_MEM_LIMIT));
    let parts = PartConfig::with_part_size(PART_SIZE).validate(memory)?;
    let pool = PagedPool::config()
        .with_candidate_sizes([
            CandidateSize::prunable(CACHE_BLOCK_SIZE),
            CandidateSize::prunable(parts.read_size_bytes),
            CandidateSize::new(parts.write_size_bytes),
        ])
        .with_memory_limit(memory.bytes())
        .with_maintenance_interval(Duration::from_secs(60))
        .build();

    let client_config = ClientConfig {
        region: Region::new_user_specified(args.region.clone()),
        endpoint_url: Some(args.endpoint_url.clone()),
        addressing_style: if args.force_path_style {
            AddressingStyle::Path
        } else {
            AddressingStyle::Automatic
        },
        dual_stack: false,
        transfer_acceleration: false,
        auth_config: S3ClientAuthConfig::Provider(static_credentials()?),
        requester_pays: false,
        expected_bucket_owner: None,
        throughput_target: TargetThroughputSetting::Default,
        bind: None,
        part_config: parts,
        user_agent: UserAgent::new(Some(format!(
            "expressfs-bench-mountpoint/{}",
            env!("CARGO_PKG_VERSION")
        ))),
        tls_config: None,
    };
    // Also sends one ListObjectsV2 to check the bucket is there, as mount-s3 does before mounting.
    let client = client_config
        .create_client(pool.clone(), Some(&s3_path))
        .context("S3 client")?;
    let runtime = Runtime::new(client.event_loop_group());
    // Directory bucket or not, as the CRT's endpoint rules see the name (`--x-s3` means S3 Express).
    let personality = S3Personality::infer_from_bucket(&args.bucket, &client.endpoint_config());
    tracing::info!(?personality, "S3 personality");

    let fs_config = S3FilesystemConfig {
        read_only: args.read_only,
        s3_personality: personality,
        ..Default::default()
    };
    let superblock = Superblock::new(
        client.clone(),
        s3_path,
        SuperblockConfig {
            cache_config: fs_config.cache_config.clone(),
            s3_personality: personality,
        },
    );
    let fuse_options = FuseOptions {
        read_only: args.read_only,
        ..Default::default()
    };
    let fuse_config = FuseSessionConfig::new(
        MountPoint::new(&args.mount_point)?,
        fuse_options,
        args.max_threads,
    )?;
    MountpointConfig::new(fuse_config, fs_config, DataCacheConfig::default())?
        .create_fuse_session(superblock, client, runtime, pool)
}

/// The access key from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN if set), as a
/// fixed provider: no profile files, no instance metadata.
fn static_credentials() -> Result<CredentialsProvider> {
    let key = std::env::var("AWS_ACCESS_KEY_ID").context("AWS_ACCESS_KEY_ID is not set")?;
    let secret =
        std::env::var("AWS_SECRET_ACCESS_KEY").context("AWS_SECRET_ACCESS_KEY is not set")?;
    let token = std::env::var("AWS_SESSION_TOKEN").ok();
    let options = CredentialsProviderStaticOptions {
        access_key_id: &key,
        secret_access_key: &secret,
        session_token: token.as_deref(),
    };
    CredentialsProvider::new_static(&Allocator::default(), options)
        .context("static credentials provider")
}
