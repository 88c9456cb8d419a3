//! expressfs-csi: the Kubernetes CSI node plugin. kubelet calls it over a unix socket to mount a bucket
//! (an expressfs daemon) at a pod's volume path and to unmount it again.

mod controller;
mod hostcgroup;
mod hostfiles;
mod launcher;
mod mounts;
mod options;
mod podauth;
mod service;

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use tokio_stream::wrappers::UnixListenerStream;

#[allow(clippy::all, clippy::pedantic)]
pub mod csi {
    tonic::include_proto!("csi.v1");
}

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Kubernetes CSI node plugin that mounts S3 buckets with expressfs"
)]
struct Args {
    /// Socket to serve CSI on, e.g. unix:///csi/csi.sock
    #[arg(long, env = "CSI_ENDPOINT")]
    endpoint: String,
    /// This node's name (usually the Kubernetes node name)
    #[arg(long, env = "CSI_NODE_ID")]
    node_id: String,
    /// Driver name registered with Kubernetes (the CSIDriver object and PVs use it)
    #[arg(long, default_value = "s3.csi.expressfs.dev")]
    driver_name: String,
    /// Accept `endpoint-url http://...` mount options (test clusters with a local S3)
    #[arg(long)]
    allow_insecure_endpoints: bool,
    /// The expressfs binary (default: the one next to this binary, else from PATH)
    #[arg(long)]
    expressfs: Option<PathBuf>,
    /// Each daemon logs to files in DIR/VOLUME_ID (detached daemons log nothing otherwise)
    #[arg(long, value_name = "DIR")]
    daemon_log_directory: Option<PathBuf>,
    /// Where daemons run: `direct` (children of the driver that detach; they die with its container) or
    /// `host` (in the host's namespaces and out of the container's cgroups; needs hostPID and privileges)
    #[arg(long, value_enum, default_value = "direct")]
    launcher: LauncherKind,
    /// With --launcher host: the process whose namespaces and cgroups are the host's
    #[arg(long, default_value_t = 1, value_name = "PID")]
    host_pid: u32,
    /// Host directory for the installed expressfs binaries (bin/HASH/expressfs, with --launcher host) and
    /// the pods' tokens (credentials/, volumes with `authenticationSource: pod`)
    #[arg(long, default_value = "/var/lib/expressfs-csi", value_name = "DIR")]
    host_directory: PathBuf,
    /// A directory a volume's `cache` mount option may name, or a directory under it (repeatable). The
    /// daemon writes and evicts there as root; with --launcher host these are the host's paths
    #[arg(
        long = "cache-root",
        default_value = "/var/cache/expressfs",
        value_name = "DIR"
    )]
    cache_roots: Vec<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LauncherKind {
    Direct,
    Host,
}

fn socket_path(endpoint: &str) -> Result<PathBuf, String> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if path.starts_with('/') {
        Ok(PathBuf::from(path))
    } else {
        Err(format!(
            "endpoint {endpoint:?} is not unix:///absolute/path"
        ))
    }
}

fn default_expressfs() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("expressfs")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("expressfs"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let socket = socket_path(&args.endpoint)?;
    let expressfs = args.expressfs.unwrap_or_else(default_expressfs);
    let launcher = match args.launcher {
        LauncherKind::Direct => launcher::Launcher::Direct {
            directory: args.host_directory.clone(),
        },
        LauncherKind::Host => {
            let bundled = service::find_binary(&expressfs)
                .ok_or_else(|| format!("expressfs binary {} not found", expressfs.display()))?;
            let host =
                launcher::HostLauncher::new(args.host_pid, &args.host_directory, &bundled).await?;
            tracing::info!(
                binary = %host.binary().display(),
                systemd = host.uses_systemd(),
                "daemons run on the host"
            );
            launcher::Launcher::Host(host)
        }
    };
    if let launcher::Launcher::Host(host) = &launcher {
        // The copy must stay fresher than the token's refresh by kubelet; a minute is plenty.
        let host = host.token_refresher();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
            loop {
                tick.tick().await;
                if let Err(e) = host() {
                    tracing::warn!("refreshing the daemons' copy of the web-identity token: {e}");
                }
            }
        });
    }
    let driver = Arc::new(service::Driver {
        name: args.driver_name,
        node_id: args.node_id,
        expressfs,
        launcher,
        allow_insecure_endpoints: args.allow_insecure_endpoints,
        cache_roots: args.cache_roots,
        daemon_log_directory: args.daemon_log_directory,
        targets: Default::default(),
        departures: Default::default(),
    });

    // Mounts of an earlier driver keep running in their own daemons; report them. Every call reads
    // mountinfo again, so they are unpublished like our own.
    for entry in mounts::mounts().into_iter().filter(|m| m.is_ours()) {
        let pids = mounts::daemon_pids(&entry.target);
        tracing::info!(target = %entry.target.display(), source = %entry.source, ?pids, "adopted existing mount");
    }

    // A socket file left by the driver before us would make bind fail.
    match std::fs::remove_file(&socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("removing old socket {}: {e}", socket.display()).into()),
    }
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let listener = tokio::net::UnixListener::bind(&socket)?;
    tracing::info!(socket = %socket.display(), expressfs = %driver.expressfs.display(), "serving CSI");

    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("stopping; mounts stay up");
    };
    tonic::transport::Server::builder()
        .add_service(csi::identity_server::IdentityServer::new(driver.clone()))
        .add_service(csi::controller_server::ControllerServer::new(
            driver.clone(),
        ))
        .add_service(csi::node_server::NodeServer::new(driver))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await?;
    let _ = std::fs::remove_file(&socket);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::socket_path;
    use std::path::Path;

    #[test]
    fn endpoints() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").unwrap(),
            Path::new("/csi/csi.sock")
        );
        assert_eq!(socket_path("unix:/x.sock").unwrap(), Path::new("/x.sock"));
        assert!(socket_path("tcp://127.0.0.1:1").is_err());
        assert!(socket_path("unix://relative").is_err());
    }
}
