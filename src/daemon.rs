//! Process lifecycle: checks, detaching, readiness, signals, the mount loop. What the flags mean for each
//! layer is decided in [`crate::config`]; the layers are put together in [`crate::stack`].
//!
//! By default the process forks before any thread exists; the parent waits on a pipe and exits 0 only once
//! the mount is live, or prints why it is not and exits 1. `--foreground` stays attached. SIGINT/SIGTERM
//! unmount cleanly; an external `umount` ends the session and the daemon exits 0. SIGUSR2 toggles debug logs.

use std::io::{BufRead, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long the daemon keeps finishing releases after the unmount (a release may be uploading a staged file):
/// under the stop timeout of our unit (60 s, `systemd/expressfs@.service`), so it is not killed while waiting.
const FINISH_AFTER_UNMOUNT: Duration = Duration::from_secs(45);

use clap::Parser;
use tracing::info;

use crate::bucket;
use crate::cli::{Args, expand_mount_options};
use crate::config::prepare_host;
use crate::fuse;
use crate::metrics::Probes;
use crate::mountpoint::MountTarget;
use crate::stack::{build_stack, probe_filesystem};

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
    // mount(8)'s helper always means a mount, even of a bucket named `warm`.
    if invoked_as != "mount.expressfs"
        && crate::warm::is_warm_invocation(&argv[1.min(argv.len())..])
    {
        return crate::warm::main(&argv);
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
    let name = match args.bucket_name() {
        Ok(n) => n,
        Err(e) => return terminal.fail(&e),
    };
    let region = match args.region(&name) {
        Ok(r) => r,
        Err(e) => return terminal.fail(&e),
    };
    let target = match args.mount_target() {
        Ok(t) => t,
        Err(e) => return terminal.fail(&e),
    };
    let healed = match &target {
        MountTarget::Directory(path) => match crate::mountpoint::prepare(path) {
            Ok(note) => note,
            Err(e) => return terminal.fail(&e),
        },
        // The caller opened /dev/fuse and mounted it: this process needs neither.
        MountTarget::Descriptor(fd) => match crate::mountpoint::check_fuse_descriptor(*fd) {
            Ok(()) => None,
            Err(e) => return terminal.fail(&e),
        },
    };
    if matches!(target, MountTarget::Directory(_)) && !Path::new("/dev/fuse").exists() {
        return terminal.fail("FUSE is not available: /dev/fuse is missing (load the fuse module; in a container, pass --device /dev/fuse)");
    }
    if args.foreground {
        return serve(args, name, region, Reporter::Terminal, healed);
    }
    match detach() {
        Ok(Detached::Child(pipe)) => serve(
            args,
            name,
            region,
            Reporter::Parent(std::fs::File::from(pipe)),
            healed,
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

enum Detached {
    Parent(i32),
    Child(OwnedFd),
}

/// Forks (before any thread exists). The parent waits for the child's report and returns its exit code.
fn detach() -> std::io::Result<Detached> {
    // Close-on-exec: with --auto-unmount, fusermount3 lives as long as the mount and (before libfuse 3.17)
    // keeps what it inherited; the report is one line either way, so the parent reads no further than it.
    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // SAFETY: single-threaded at this point (no runtime, no logging thread yet).
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Parent { .. } => {
            drop(write_end);
            let mut answer = String::new();
            let _ = std::io::BufReader::new(std::fs::File::from(read_end)).read_line(&mut answer);
            let line = answer.lines().next().unwrap_or("");
            if line.starts_with("OK") {
                Ok(Detached::Parent(0))
            } else if let Some(message) = line.strip_prefix("ERR ") {
                eprintln!("expressfs: error: {message}");
                Ok(Detached::Parent(1))
            } else {
                eprintln!(
                    "expressfs: error: the daemon exited before the mount was ready (see the system log, journalctl -t expressfs, or --log-directory)"
                );
                Ok(Detached::Parent(1))
            }
        }
        nix::unistd::ForkResult::Child => {
            drop(read_end);
            let _ = nix::unistd::setsid();
            // Detach from the terminal: stdio goes to /dev/null, logs to --log-directory or syslog.
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

fn serve(
    args: Args,
    name: bucket::BucketName,
    region: String,
    mut reporter: Reporter,
    healed: Option<String>,
) -> i32 {
    let background = matches!(reporter, Reporter::Parent(_));
    // In the background with nowhere else to write, logs go to syslog (journald), as mount-s3's do.
    let to_syslog = background && !args.no_log && args.log_directory.is_none();
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
    if to_syslog {
        crate::logging::init_syslog(args.debug);
    }
    if let Some(note) = healed {
        tracing::warn!("{note}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .thread_name("expressfs-io")
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return reporter.fail(&format!("cannot start the async runtime: {e}")),
    };
    let config = args.fs_config();
    let memory_target = config.memory.limit();
    let probes = Arc::new(Probes::default());
    let fs = match runtime.block_on(build_stack(&args, &name, &region, config, &probes)) {
        Ok(fs) => Arc::new(fs),
        Err(e) => return reporter.fail(&e),
    };
    let prompt_release = match prepare_host(fs.config()) {
        Ok(p) => p,
        Err(e) => return reporter.fail(&e),
    };
    info!(
        memory_target_mib = memory_target >> 20,
        prompt_release, "read-ahead and upload buffers share this budget"
    );
    if let Some(addr) = args.metrics_addr {
        let _guard = runtime.enter();
        if let Err(e) = crate::metrics::serve(addr) {
            return reporter.fail(&e);
        }
    }
    probe_filesystem(&fs, &probes);
    runtime.spawn(crate::metrics::summarize(
        Arc::clone(&probes),
        if args.log_metrics {
            Duration::from_secs_f64(args.log_metrics_interval)
        } else {
            Duration::from_secs(60)
        },
        args.log_metrics,
    ));
    runtime.spawn(crate::idle::give_back_when_idle(crate::idle::tick()));
    // SIGINT/SIGTERM are caught from before the mount is live: one sent as soon as "mounted" is logged (or
    // systemd's stop right after start) must unmount cleanly, not kill the process with the mount left dead.
    let signals = {
        use tokio::signal::unix::{SignalKind, signal};
        let _guard = runtime.enter();
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    // SIGUSR2 turns debug logging on and off on a live mount (its default action would end the process).
    if let Ok(mut usr2) = {
        let _guard = runtime.enter();
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())
    } {
        runtime.spawn(async move {
            while usr2.recv().await.is_some() {
                match crate::logging::toggle_debug() {
                    Some(true) => info!("SIGUSR2: debug logging on"),
                    Some(false) => info!("SIGUSR2: debug logging off"),
                    None => {}
                }
            }
        });
    }
    let options = args.fuse_options(&name);
    let mounted = match fuse::mount(fs, runtime.handle().clone(), &options) {
        Ok(m) => m,
        Err(e) => {
            // Read from before its mount, a /dev/fuse descriptor answers EPERM.
            let hint = match options.target {
                MountTarget::Descriptor(fd) if e.raw_os_error() == Some(libc::EPERM) => {
                    format!(
                        " (the descriptor is not mounted: mount /dev/fuse with fd={fd} before starting expressfs)"
                    )
                }
                _ => String::new(),
            };
            return reporter.fail(&format!(
                "cannot mount at {}: {e}{hint}",
                args.mountpoint.display()
            ));
        }
    };
    if let MountTarget::Directory(path) = &options.target {
        raise_readahead(path, args.read_ahead_kb);
    }
    info!(bucket = %name.name, mountpoint = %args.mountpoint.display(), %region, "mounted");
    reporter.ready(&format!(
        "{} mounted at {}",
        name.name,
        args.mountpoint.display()
    ));
    drop(reporter);

    let by_descriptor = matches!(options.target, MountTarget::Descriptor(_));
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        runtime.spawn(async move {
            let (Some(mut int), Some(mut term)) = signals else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            stop.store(true, Ordering::SeqCst);
        });
    }
    let outstanding = loop {
        if mounted.is_finished() {
            info!("unmounted");
            notify_systemd("STOPPING=1");
            let left = mounted.finish_outstanding(FINISH_AFTER_UNMOUNT);
            let _ = mounted.join();
            break left;
        }
        if stop.load(Ordering::SeqCst) {
            if by_descriptor {
                info!(
                    "signal received; refusing new requests, finishing the uploads of closed files, then \
                     leaving: the mount is its caller's to unmount"
                );
            } else {
                info!("signal received; unmounting");
            }
            notify_systemd("STOPPING=1");
            match mounted.unmount(FINISH_AFTER_UNMOUNT) {
                Ok(left) => break left,
                Err(e) => {
                    tracing::error!("unmount failed: {e}");
                    return 1;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let lost = outstanding > 0;
    if lost {
        tracing::error!(
            outstanding,
            "releases still unfinished {FINISH_AFTER_UNMOUNT:?} after unmount; abandoned: the uploads among them are lost"
        );
    }
    let last = probes.snapshot();
    info!(summary = %last.line(), "at unmount");
    if let Some(cache) = &last.cache {
        info!(counters = %cache.summary, "data cache at unmount");
    }
    if let Some(shared) = &last.shared_cache {
        info!(counters = %shared, "shared cache at unmount");
    }
    runtime.shutdown_timeout(Duration::from_secs(5));
    // Not "unmounted cleanly" when closed files' uploads were cut short.
    i32::from(lost)
}
