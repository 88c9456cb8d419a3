//! Logging: tracing to stderr (foreground), to a daily file in `--log-directory`, or, in the background
//! without a directory, to the local syslog socket (journald reads it too). Credentials never reach the logs:
//! the client layer logs keys and operations, never signatures, tokens or secrets.

use std::path::Path;

use tracing_subscriber::EnvFilter;

mod syslog;

pub use syslog::SOCKET_ENV as SYSLOG_SOCKET_ENV;

/// Keeps the file writer's flush guard alive for the life of the daemon.
pub struct LogGuard {
    _guard: Option<tracing_appender::non_blocking::WorkerGuard>,
}

/// `RUST_LOG` wins when set; otherwise `--debug` selects debug for expressfs and warnings elsewhere.
pub fn init(debug: bool, log_directory: Option<&Path>, quiet: bool) -> std::io::Result<LogGuard> {
    let filter = filter(debug);
    if let Some(dir) = log_directory {
        std::fs::create_dir_all(dir)?;
        let appender = tracing_appender::rolling::daily(dir, "expressfs.log");
        let (writer, guard) = tracing_appender::non_blocking(appender);
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(writer)
            .with_ansi(false)
            .try_init();
        return Ok(LogGuard {
            _guard: Some(guard),
        });
    }
    if !quiet {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
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
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter(debug))
        .with_writer(sink)
        .with_ansi(false)
        .without_time()
        .with_level(false)
        .try_init();
    true
}

fn filter(debug: bool) -> EnvFilter {
    let default = if debug {
        "expressfs=debug,warn"
    } else {
        "expressfs=info,warn"
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // The SDK logs request details at debug/trace; keep its signing internals out even with --debug.
    filter
        .add_directive("aws_sigv4=warn".parse().expect("static directive"))
        .add_directive("aws_smithy_runtime=info".parse().expect("static directive"))
}
