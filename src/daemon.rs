//! Process lifecycle: checks, detaching, readiness, signals.
//!
//! By default the process forks before any thread exists; the parent waits on a pipe and exits 0 only once
//! the mount is live, or prints why it is not and exits 1. `--foreground` stays attached. SIGINT/SIGTERM
//! unmount cleanly; an external `umount` ends the session and the daemon exits 0.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Parser;
use tracing::info;

use crate::bucket;
use crate::cli::{Args, expand_mount_options};
use crate::fs::{FsConfig, S3Filesystem};
use crate::fuse::{self, FuseOptions};
use crate::s3::sdk::{SdkClient, SdkClientConfig};
use crate::s3::{ClientError, ObjectClient};

/// Where startup outcome goes: straight to the terminal, or through the pipe to the waiting parent.
enum Reporter {
    Terminal,
    Parent(std::fs::File),
}

impl Reporter {
    fn ready(&mut self, message: &str) {
        match self {
            Reporter::Terminal => eprintln!("{message}"),
            Reporter::Parent(pipe) => {
                let _ = writeln!(pipe, "OK {message}");
            }
        }
        notify_systemd("READY=1");
    }

    fn fail(&mut self, message: &str) -> i32 {
        match self {
            Reporter::Terminal => eprintln!("expressfs: error: {message}"),
            Reporter::Parent(pipe) => {
                let _ = writeln!(pipe, "ERR {message}");
            }
        }
        1
    }
}

/// Tells systemd (Type=notify units) about our state; a no-op elsewhere.
fn notify_systemd(state: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sock = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(_) => return,
    };
    let path = socket.to_string_lossy().into_owned();
    let _ = if let Some(abstract_name) = path.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes())
            .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
    } else {
        sock.send_to(state.as_bytes(), &path)
    };
}

/// Entry point of the binary; returns the exit code.
pub fn main() -> i32 {
    let mut argv: Vec<String> = std::env::args().collect();
    let invoked_as = argv
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
        .unwrap_or_default();
    if invoked_as == "mount.expressfs" {
        argv = match mount_helper_args(&argv[1..]) {
            Ok(Some(a)) => a,
            Ok(None) => return 0,
            Err(e) => {
                eprintln!("mount.expressfs: error: {e}");
                return 1;
            }
        };
    }
    if argv.iter().any(|a| a == "--version" || a == "-V") {
        println!(
            "expressfs {} (commit {}, {} build)",
            env!("CARGO_PKG_VERSION"),
            option_env!("EXPRESSFS_COMMIT").unwrap_or("unknown"),
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
        );
        return 0;
    }
    let argv = match expand_mount_options(argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("expressfs: error: {e}");
            return 2;
        }
    };
    let args = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let mut terminal = Reporter::Terminal;
    if let Err(e) = args.validate() {
        return terminal.fail(&e);
    }
    let name = match bucket::parse(&args.bucket) {
        Ok(n) => n,
        Err(e) => return terminal.fail(&e),
    };
    let region = match resolve_region(&args, &name) {
        Ok(r) => r,
        Err(e) => return terminal.fail(&e),
    };
    if let Err(e) = check_mountpoint(&args.mountpoint) {
        return terminal.fail(&e);
    }
    if !Path::new("/dev/fuse").exists() {
        return terminal.fail("FUSE is not available: /dev/fuse is missing (load the fuse module; in a container, pass --device /dev/fuse)");
    }
    if args.foreground {
        return serve(args, name, region, Reporter::Terminal);
    }
    match detach() {
        Ok(Detached::Child(pipe)) => serve(
            args,
            name,
            region,
            Reporter::Parent(std::fs::File::from(pipe)),
        ),
        Ok(Detached::Parent(code)) => code,
        Err(e) => terminal.fail(&format!("cannot start the background daemon: {e}")),
    }
}

/// mount(8) runs `mount.expressfs SOURCE DIR [-sfnv] [-N ns] [-o opts] [-t type]` for fstab lines of type
/// `expressfs`. Returns the equivalent `expressfs` command line, or None for a fake (`-f`) mount.
pub fn mount_helper_args(args: &[String]) -> Result<Option<Vec<String>>, String> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "-o" => options.push(iter.next().ok_or("-o needs options")?.clone()),
            "-t" | "-N" => {
                iter.next();
            }
            "-f" => return Ok(None),
            "-s" | "-n" | "-v" => {}
            other if other.starts_with("-o") => options.push(other[2..].to_string()),
            other => positional.push(other.to_string()),
        }
    }
    let [source, target] = positional.as_slice() else {
        return Err("usage: mount.expressfs BUCKET MOUNTPOINT [-o options]".into());
    };
    let mut argv = vec!["expressfs".to_string(), source.clone(), target.clone()];
    for o in options {
        argv.push("-o".into());
        argv.push(o);
    }
    Ok(Some(argv))
}

fn resolve_region(args: &Args, name: &bucket::BucketName) -> Result<String, String> {
    if let Some(r) = &args.region {
        return Ok(r.clone());
    }
    if let Some(zone) = &name.zone {
        return bucket::region_of_zone(zone).map(str::to_string).ok_or_else(|| {
            format!("cannot tell the region of availability zone {zone:?} (bucket {}): pass --region", name.name)
        });
    }
    Ok(std::env::var("AWS_REGION")
        .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
        .unwrap_or_else(|_| "us-east-1".into()))
}

fn check_mountpoint(path: &Path) -> Result<(), String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("mount point {}: {e}", path.display()))?;
    if !meta.is_dir() {
        return Err(format!("mount point {} is not a directory", path.display()));
    }
    let mut entries =
        std::fs::read_dir(path).map_err(|e| format!("mount point {}: {e}", path.display()))?;
    if entries.next().is_some() {
        return Err(format!("mount point {} is not empty", path.display()));
    }
    Ok(())
}

enum Detached {
    Parent(i32),
    Child(OwnedFd),
}

/// Forks (before any thread exists). The parent waits for the child's report and returns its exit code.
fn detach() -> std::io::Result<Detached> {
    let (read_end, write_end) = nix::unistd::pipe()?;
    // SAFETY: single-threaded at this point (no runtime, no logging thread yet).
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Parent { .. } => {
            drop(write_end);
            let mut answer = String::new();
            let _ = std::fs::File::from(read_end).read_to_string(&mut answer);
            let line = answer.lines().next().unwrap_or("");
            if line.starts_with("OK") {
                Ok(Detached::Parent(0))
            } else if let Some(message) = line.strip_prefix("ERR ") {
                eprintln!("expressfs: error: {message}");
                Ok(Detached::Parent(1))
            } else {
                eprintln!(
                    "expressfs: error: the daemon exited before the mount was ready (see --log-directory)"
                );
                Ok(Detached::Parent(1))
            }
        }
        nix::unistd::ForkResult::Child => {
            drop(read_end);
            let _ = nix::unistd::setsid();
            // Detach from the terminal: stdio goes to /dev/null, logs to --log-directory.
            if let Ok(null) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
            {
                use std::os::fd::AsRawFd;
                for fd in 0..3 {
                    // SAFETY: dup2 onto the standard descriptors of this process.
                    unsafe { libc::dup2(null.as_raw_fd(), fd) };
                }
            }
            Ok(Detached::Child(write_end))
        }
    }
}

/// The kernel starts FUSE mounts with 128 KiB of readahead, so buffered reads arrive in 128 KiB pieces.
/// Raising the mount's bdi `read_ahead_kb` lets sequential reads arrive in 1 MiB requests (needs root;
/// best effort).
fn raise_readahead(mountpoint: &Path, kb: u32) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    match std::fs::write(&path, kb.to_string()) {
        Ok(()) => tracing::debug!(path, kb, "raised readahead"),
        Err(e) => tracing::debug!(path, error = %e, "could not raise readahead"),
    }
}

/// Every 60 s: gauges for the metrics endpoint and one summary line in the log (when something changed).
fn spawn_summary(
    runtime: &tokio::runtime::Runtime,
    fs: Arc<S3Filesystem>,
    sdk: Arc<SdkClient>,
    cache: Option<Arc<crate::cache::disk::DiskCache>>,
) {
    runtime.spawn(async move {
        let mut last = String::new();
        loop {
            let (handles, writers, inodes) = fs.usage();
            metrics::gauge!("expressfs_open_handles").set(handles as f64);
            metrics::gauge!("expressfs_open_writers").set(writers as f64);
            metrics::gauge!("expressfs_inodes").set(inodes as f64);
            let memory = &fs.config().memory;
            metrics::gauge!("expressfs_buffer_bytes").set(memory.used() as f64);
            metrics::gauge!("expressfs_buffer_bytes_peak").set(memory.peak() as f64);
            metrics::gauge!("expressfs_buffer_budget_refusals").set(memory.refused() as f64);
            let recovered = sdk.counters();
            metrics::gauge!("expressfs_s3_body_resumes").set(recovered.body_resumes as f64);
            metrics::gauge!("expressfs_s3_session_renewals").set(recovered.session_renewals as f64);
            let mut line = format!(
                "open_handles={handles} open_writers={writers} inodes={inodes} body_resumes={} session_renewals={} buffer_peak_mib={} budget_refusals={}",
                recovered.body_resumes,
                recovered.session_renewals,
                memory.peak() >> 20,
                memory.refused()
            );
            if let Some(c) = &cache {
                use std::sync::atomic::Ordering::Relaxed;
                let counters = &c.counters;
                metrics::gauge!("expressfs_cache_hits").set(counters.hits.load(Relaxed) as f64);
                metrics::gauge!("expressfs_cache_misses").set(counters.misses.load(Relaxed) as f64);
                metrics::gauge!("expressfs_cache_evictions")
                    .set(counters.evictions.load(Relaxed) as f64);
                metrics::gauge!("expressfs_cache_corrupt_blocks")
                    .set(counters.corrupt.load(Relaxed) as f64);
                metrics::gauge!("expressfs_cache_bytes").set(c.used_bytes() as f64);
                line.push_str(&format!(" cache: {}", counters.summary()));
            }
            if line != last {
                info!(summary = %line, "activity");
                last = line;
            }
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
    });
}

/// Explains a failure of the startup checks in terms a user can act on.
fn explain(e: &ClientError, bucket: &str, region: &str, directory: bool) -> String {
    match e {
        ClientError::NoSuchBucket { .. } => {
            format!("bucket {bucket} does not exist (region {region})")
        }
        ClientError::NotFound { .. } => format!("bucket {bucket} does not exist (region {region})"),
        ClientError::AccessDenied { code, message } => {
            let hint = if directory {
                "; directory buckets need the s3express:CreateSession permission on the bucket"
            } else {
                "; check s3:ListBucket and s3:GetObject permissions"
            };
            format!("access denied to bucket {bucket} ({code}: {message}){hint}")
        }
        ClientError::NoCredentials(m) => format!(
            "no AWS credentials found ({m}): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, use --profile, or run with an instance role"
        ),
        other => format!("cannot use bucket {bucket} (region {region}): {other}"),
    }
}

fn serve(args: Args, name: bucket::BucketName, region: String, mut reporter: Reporter) -> i32 {
    let background = matches!(reporter, Reporter::Parent(_));
    let _log = match crate::logging::init(
        args.debug,
        if args.no_log {
            None
        } else {
            args.log_directory.as_deref()
        },
        args.no_log || background,
    ) {
        Ok(g) => g,
        Err(e) => return reporter.fail(&format!("log directory: {e}")),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .thread_name("expressfs-io")
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return reporter.fail(&format!("cannot start the async runtime: {e}")),
    };
    let prefix = args.prefix.clone().unwrap_or_default();
    let mut sdk = SdkClientConfig::new(name.name.clone(), region.clone());
    sdk.endpoint_url = args.endpoint_url.clone();
    sdk.force_path_style = args.force_path_style || args.endpoint_url.is_some();
    sdk.profile = args.profile.clone();
    sdk.is_directory_bucket = name.is_directory();
    sdk.upload_checksum = args.upload_checksum();
    let client = runtime.block_on(async {
        let client = SdkClient::new(sdk).await?;
        // A listing proves the session (CreateSession) and read access, not just that the bucket exists. Both
        // checks run at once (one round trip less before the mount appears); the bucket's error is the
        // clearer one, so it is reported first.
        let (bucket, listing) = tokio::join!(
            client.head_bucket(),
            client.list_objects(&prefix, Some("/"), None, 1)
        );
        bucket?;
        listing?;
        Ok::<_, ClientError>(client)
    });
    let sdk_client = match client {
        Ok(c) => Arc::new(c),
        Err(e) => return reporter.fail(&explain(&e, &name.name, &region, name.is_directory())),
    };
    let bucket_source = crate::source::BucketSource::shared(sdk_client.clone());
    let mut source = Arc::clone(&bucket_source);
    let mut shared_counters = None;
    if let Some(xz) = &args.cache_xz {
        let xz_name = match bucket::parse(xz) {
            Ok(n) => n,
            Err(e) => return reporter.fail(&format!("--cache-xz: {e}")),
        };
        let mut xz_config = SdkClientConfig::new(xz_name.name.clone(), region.clone());
        xz_config.endpoint_url = args.endpoint_url.clone();
        xz_config.force_path_style = args.force_path_style || args.endpoint_url.is_some();
        xz_config.profile = args.profile.clone();
        xz_config.is_directory_bucket = xz_name.is_directory();
        xz_config.upload_checksum = args.upload_checksum();
        let xz_client = runtime.block_on(async {
            let c = SdkClient::new(xz_config).await?;
            c.head_bucket().await?;
            Ok::<_, ClientError>(c)
        });
        let xz_client: Arc<dyn ObjectClient> = match xz_client {
            Ok(c) => Arc::new(c),
            Err(e) => {
                return reporter.fail(&format!(
                    "--cache-xz: {}",
                    explain(&e, &xz_name.name, &region, xz_name.is_directory())
                ));
            }
        };
        let shared =
            crate::cache::shared::SharedCache::new(xz_client, args.cache_xz_max_object_size);
        shared_counters = Some(Arc::clone(&shared.counters));
        source = Arc::new(crate::source::Cached::new(shared, source));
    }
    let mut disk_cache = None;
    let source: Arc<dyn crate::source::ReadSource> = match &args.cache {
        None => source,
        Some(dir) => {
            let max = args
                .max_cache_size
                .map_or(u64::MAX, |mib| mib.saturating_mul(1024 * 1024));
            match crate::cache::disk::DiskCache::open(&dir.join("blocks"), max) {
                Ok(cache) => {
                    let cache = Arc::new(cache);
                    disk_cache = Some(Arc::clone(&cache));
                    let blocks = crate::cache::BlockCache::new(cache, args.cache_block_size * 1024);
                    Arc::new(crate::source::Cached::new(blocks, source))
                }
                Err(e) => return reporter.fail(&format!("cache directory {}: {e}", dir.display())),
            }
        }
    };

    let mut config = FsConfig::new(
        args.uid.unwrap_or_else(|| nix::unistd::getuid().as_raw()),
        args.gid.unwrap_or_else(|| nix::unistd::getgid().as_raw()),
    );
    config.prefix = prefix.clone();
    config.dir_mode = args.dir_mode;
    config.file_mode = args.file_mode;
    config.read_only = args.read_only;
    config.allow_overwrite = args.allow_overwrite;
    config.allow_delete = args.allow_delete;
    config.incremental_upload = args.incremental_upload;
    config.read_part_size = args.read_part_size();
    config.write_part_size = args.write_part_size();
    config.max_prefetch = args.max_prefetch;
    config.lookup_prefetch = args.lookup_prefetch;
    config.direct_io_threshold = args.direct_io_threshold;
    config.max_writers = args.max_open_writers;
    let memory_target = args
        .memory_target
        .unwrap_or_else(crate::memory::default_target);
    config.memory = crate::memory::MemoryBudget::new(memory_target);
    crate::buffers::limit_to(memory_target);
    let prompt_release = crate::memory::return_freed_buffers_promptly_if_tight(memory_target);
    info!(
        memory_target_mib = memory_target >> 20,
        prompt_release, "read-ahead and upload buffers share this budget"
    );
    config.metadata_ttl = args.metadata_ttl();
    config.negative_metadata_ttl = args.negative_metadata_ttl.unwrap_or(config.metadata_ttl);
    config.staging_limit = args.max_staged_file_size;
    config.staging_dir = if args.max_staged_file_size == 0 {
        None
    } else {
        let dir = args
            .cache
            .as_ref()
            .map_or_else(std::env::temp_dir, |c| c.join("staging"));
        if let Err(e) = std::fs::create_dir_all(&dir) {
            return reporter.fail(&format!("staging directory {}: {e}", dir.display()));
        }
        Some(dir)
    };
    if let Some(addr) = args.metrics_addr {
        let _guard = runtime.enter();
        let installed = metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .set_buckets(&[
                0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
            ])
            .and_then(|b| b.install());
        if let Err(e) = installed {
            return reporter.fail(&format!("--metrics-addr {addr}: {e}"));
        }
    }
    let sources = crate::source::ReadSources {
        cached: source,
        direct: bucket_source,
    };
    let fs = S3Filesystem::new(sdk_client.clone(), config).with_read_sources(sources);
    // The root mount path ignores the subtype (the type is plain "fuse"), so the source names us and the bucket.
    let fs_name = if prefix.is_empty() {
        format!("expressfs:{}", name.name)
    } else {
        format!("expressfs:{}/{}", name.name, prefix.trim_end_matches('/'))
    };
    let options = FuseOptions {
        mountpoint: args.mountpoint.clone(),
        fs_name,
        read_only: args.read_only,
        allow_other: args.allow_other,
        allow_root: args.allow_root,
        auto_unmount: args.auto_unmount,
        threads: args.max_threads,
    };
    let fs = Arc::new(fs);
    spawn_summary(&runtime, Arc::clone(&fs), sdk_client, disk_cache.clone());
    let mounted = match fuse::mount(fs, runtime.handle().clone(), &options) {
        Ok(m) => m,
        Err(e) => {
            return reporter.fail(&format!(
                "cannot mount at {}: {e}",
                args.mountpoint.display()
            ));
        }
    };
    raise_readahead(&args.mountpoint, args.read_ahead_kb);
    info!(bucket = %name.name, mountpoint = %args.mountpoint.display(), %region, "mounted");
    reporter.ready(&format!(
        "{} mounted at {}",
        name.name,
        args.mountpoint.display()
    ));
    drop(reporter);

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        runtime.spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            stop.store(true, Ordering::SeqCst);
        });
    }
    loop {
        if mounted.is_finished() {
            info!("unmounted");
            let _ = mounted.join();
            break;
        }
        if stop.load(Ordering::SeqCst) {
            info!("signal received; unmounting");
            if let Err(e) = mounted.unmount() {
                tracing::error!("unmount failed: {e}");
                return 1;
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Some(cache) = &disk_cache {
        info!(counters = %cache.counters.summary(), "data cache at unmount");
    }
    if let Some(shared) = &shared_counters {
        info!(counters = %shared.summary(), "shared cache at unmount");
    }
    notify_systemd("STOPPING=1");
    runtime.shutdown_timeout(Duration::from_secs(5));
    0
}
