//! Logging: tracing to stderr (foreground), to a daily file in `--log-directory`, or, in the background
//! without a directory, to the local syslog socket (journald reads it too). Credentials never reach the logs:
//! the client layer logs keys and operations, never signatures, tokens or secrets.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing_subscriber::EnvFilter;

mod syslog;

pub use syslog::SOCKET_ENV as SYSLOG_SOCKET_ENV;

/// Keeps the file writer's flush guard alive for the life of the daemon.
pub struct LogGuard {
    _guard: Option<tracing_appender::non_blocking::WorkerGuard>,
}

/// Swaps the live subscriber's filter: set once by whichever `init` installed the subscriber.
type Reload = Box<dyn Fn(EnvFilter) -> bool + Send + Sync>;

static RELOAD: OnceLock<Reload> = OnceLock::new();

/// Whether the daemon started with `--debug`, and whether SIGUSR2 has switched the filter away from the one it
/// started with (`--debug`, `RUST_LOG`): the next SIGUSR2 switches back.
static STARTED_WITH_DEBUG: AtomicBool = AtomicBool::new(false);
static SWITCHED: Mutex<bool> = Mutex::new(false);

/// Installs the live subscriber's reload handle; later calls (a second `init`) are ignored, as `try_init` is.
fn keep_reload<N, E, W>(
    handle: tracing_subscriber::reload::Handle<
        EnvFilter,
        tracing_subscriber::fmt::Formatter<N, E, W>,
    >,
) where
    tracing_subscriber::fmt::Formatter<N, E, W>: tracing::Subscriber + 'static,
{
    let _ = RELOAD.set(Box::new(move |f| handle.reload(f).is_ok()));
}

/// SIGUSR2, without remounting: the opposite of `--debug` as the daemon started (debug for expressfs whatever
/// `RUST_LOG` said, or info), and at the next signal the starting filter again. Returns whether debug is on
/// now, or None when no subscriber can be changed.
pub fn toggle_debug() -> Option<bool> {
    let reload = RELOAD.get()?;
    let mut switched = SWITCHED.lock().unwrap_or_else(|e| e.into_inner());
    let started = STARTED_WITH_DEBUG.load(Ordering::Relaxed);
    let next = if *switched {
        filter(started)
    } else {
        with_quiet_internals(EnvFilter::new(default_directives(!started)))
    };
    if !reload(next) {
        return None;
    }
    *switched = !*switched;
    Some(started != *switched)
}

/// `RUST_LOG` wins when set; otherwise `--debug` selects debug for expressfs and warnings elsewhere.
pub fn init(debug: bool, log_directory: Option<&Path>, quiet: bool) -> std::io::Result<LogGuard> {
    STARTED_WITH_DEBUG.store(debug, Ordering::Relaxed);
    let filter = filter(debug);
    if let Some(dir) = log_directory {
        std::fs::create_dir_all(dir)?;
        let appender = tracing_appender::rolling::daily(dir, "expressfs.log");
        let (writer, guard) = tracing_appender::non_blocking(appender);
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(writer)
            .with_ansi(false)
            .with_filter_reloading();
        let handle = builder.reload_handle();
        if builder.try_init().is_ok() {
            keep_reload(handle);
        }
        return Ok(LogGuard {
            _guard: Some(guard),
        });
    }
    if !quiet {
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_filter_reloading();
        let handle = builder.reload_handle();
        if builder.try_init().is_ok() {
            keep_reload(handle);
        }
    }
    Ok(LogGuard { _guard: None })
}

/// A background daemon without `--log-directory`: each event becomes one RFC 3164 datagram to the syslog
/// socket (`/dev/log`, or `$EXPRESSFS_SYSLOG_SOCKET`), identifier `expressfs`. Returns false, logging
/// nothing, when there is no such socket (a container without one), as before syslog support.
pub fn init_syslog(debug: bool) -> bool {
    let Some(sink) = syslog::Sink::open() else {
        return false;
    };
    STARTED_WITH_DEBUG.store(debug, Ordering::Relaxed);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(debug))
        .with_writer(sink)
        .with_ansi(false)
        .without_time()
        .with_level(false)
        .with_filter_reloading();
    let handle = builder.reload_handle();
    if builder.try_init().is_ok() {
        keep_reload(handle);
    }
    true
}

fn default_directives(debug: bool) -> &'static str {
    if debug {
        "expressfs=debug,warn"
    } else {
        "expressfs=info,warn"
    }
}

fn filter(debug: bool) -> EnvFilter {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(default_directives(debug)));
    with_quiet_internals(filter)
}

/// The SDK logs request details at debug/trace; keep its signing internals out even with --debug.
fn with_quiet_internals(filter: EnvFilter) -> EnvFilter {
    filter
        .add_directive("aws_sigv4=warn".parse().expect("static directive"))
        .add_directive("aws_smithy_runtime=info".parse().expect("static directive"))
}
