//! The CSI Identity and Node services. There is no controller: a volume is a bucket that already exists,
//! named in the PV's attributes (static provisioning).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::csi;
use crate::csi::volume_capability::access_mode::Mode;
use crate::launcher::Launcher;
use crate::mounts;
use crate::options::{self, PublishInput};
use crate::podauth;

pub struct Driver {
    pub name: String,
    pub node_id: String,
    pub expressfs: PathBuf,
    pub allow_insecure_endpoints: bool,
    /// `--cache-root`: where a volume's `cache` may be.
    pub cache_roots: Vec<PathBuf>,
    pub daemon_log_directory: Option<PathBuf>,
    /// Starts daemons: in the driver's own namespaces, or the host's so they outlive its container.
    pub launcher: Launcher,
    /// One mount or unmount at a time: kubelet retries freely, and two calls for one target must not race.
    pub lock: Arc<Mutex<()>>,
    /// When mounts went whose daemons were still finishing their uploads at the end of an unpublish.
    pub departures: mounts::Departures,
}

/// kubelet gives a CSI call 2 minutes. An unpublish waits for daemons until this long after the call came
/// in (it may have waited for the lock first), which leaves room for ending a stuck daemon (7 s) and for the
/// launcher's cleanup (a systemctl call, 30 s at most).
const UNPUBLISH_WAIT: Duration = Duration::from_secs(75);

/// Daemons still finishing uploads are a reason to come back, not a failure: kubelet retries Unavailable.
fn unmount_status(error: mounts::UnmountError) -> Status {
    match error {
        mounts::UnmountError::Finishing { .. } => Status::unavailable(error.to_string()),
        _ => Status::internal(error.to_string()),
    }
}

#[tonic::async_trait]
impl csi::identity_server::Identity for Arc<Driver> {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        // Node service only: no controller, no topology constraints.
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: Vec::new(),
        }))
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        let ready = find_binary(&self.expressfs).is_some();
        if !ready {
            return Err(Status::failed_precondition(format!(
                "expressfs binary {} not found",
                self.expressfs.display()
            )));
        }
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

/// `path` itself when it has a directory part, else the first match on PATH.
pub fn find_binary(path: &Path) -> Option<PathBuf> {
    if path.components().count() > 1 {
        return path.is_file().then(|| path.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|dirs| {
        std::env::split_paths(&dirs)
            .map(|d| d.join(path))
            .find(|p| p.is_file())
    })
}

fn read_only_mode(capability: &csi::VolumeCapability) -> bool {
    let mode = capability
        .access_mode
        .as_ref()
        .map(|m| m.mode())
        .unwrap_or(Mode::Unknown);
    matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)
}

#[tonic::async_trait]
impl csi::node_server::Node for Arc<Driver> {
    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.target_path.is_empty() || !Path::new(&req.target_path).is_absolute() {
            return Err(Status::invalid_argument(
                "target_path must be an absolute path",
            ));
        }
        let capability = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
        let mount = match &capability.access_type {
            Some(csi::volume_capability::AccessType::Mount(m)) => m,
            _ => {
                return Err(Status::invalid_argument(
                    "only mount volumes are supported (no block access)",
                ));
            }
        };
        if !mount.fs_type.is_empty() && mount.fs_type != "expressfs" && mount.fs_type != "fuse" {
            return Err(Status::invalid_argument(format!(
                "fs_type {:?} is not expressfs",
                mount.fs_type
            )));
        }
        let input = PublishInput {
            volume_context: req.volume_context.clone(),
            mount_flags: mount.mount_flags.clone(),
            mount_group: mount.volume_mount_group.clone(),
            read_only: req.readonly || read_only_mode(capability),
            allow_insecure_endpoints: self.allow_insecure_endpoints,
            cache_roots: self.cache_roots.clone(),
        };
        let plan = options::plan(&input).map_err(Status::invalid_argument)?;
        let pod_credentials =
            podauth::from_context(&req.volume_context).map_err(Status::invalid_argument)?;
        let binary = find_binary(&self.expressfs).ok_or_else(|| {
            Status::failed_precondition(format!("{} not found", self.expressfs.display()))
        })?;

        let guard = self.lock.clone().lock_owned().await;
        let target = PathBuf::from(&req.target_path);
        // Nothing may stat a mount point before its health check: a wedged daemon would hang the call.
        let mounted = mounts::mounted_at(&mounts::resolved(&target)).is_some();
        if !mounted {
            std::fs::create_dir_all(&target).or_else(|e| {
                // A dead mount of a crashed daemon: expressfs detaches it itself before mounting.
                if e.raw_os_error() == Some(libc::ENOTCONN) {
                    Ok(())
                } else {
                    Err(Status::internal(format!(
                        "creating {}: {e}",
                        target.display()
                    )))
                }
            })?;
        }
        let target = mounts::resolved(&target);
        if let Some(existing) = mounts::mounted_at(&target) {
            if !existing.is_ours() {
                return Err(Status::failed_precondition(format!(
                    "{} holds a {} mount of {}",
                    target.display(),
                    existing.fstype,
                    existing.source
                )));
            }
            match mounts::health(&target).await {
                mounts::Health::Silent => {
                    return Err(Status::unavailable(format!(
                        "{} is mounted but its expressfs daemon does not answer; unpublish it",
                        target.display()
                    )));
                }
                mounts::Health::Answers if existing.source == plan.source() => {
                    tracing::info!(target = %target.display(), "already published");
                    // kubelet republishes to hand over a fresh token before the last one expires.
                    if let Some(credentials) = &pod_credentials {
                        self.launcher
                            .write_pod_token(&target, credentials)
                            .map_err(Status::internal)?;
                    }
                    return Ok(Response::new(csi::NodePublishVolumeResponse {}));
                }
                mounts::Health::Answers => {
                    return Err(Status::already_exists(format!(
                        "{} already mounts {}, not {}",
                        target.display(),
                        existing.source,
                        plan.source()
                    )));
                }
                // A dead mount of a crashed daemon: expressfs detaches it itself before mounting.
                mounts::Health::Dead => {}
            }
        }
        let mut args = plan.args.clone();
        if let Some(logs) = &self.daemon_log_directory {
            // The volume id is the CO's string: keep it to one plain path component.
            let name: String = req
                .volume_id
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let dir = logs.join(name.trim_start_matches('.'));
            std::fs::create_dir_all(&dir)
                .map_err(|e| Status::internal(format!("creating {}: {e}", dir.display())))?;
            args.push("--log-directory".into());
            args.push(dir.to_string_lossy().into_owned());
        }
        args.push(plan.bucket.clone());
        args.push(target.to_string_lossy().into_owned());
        tracing::info!(volume = %req.volume_id, target = %target.display(), ?args, "mounting");
        // The caller's deadline (kubelet's grpc-timeout, 2 min) drops this future when it passes, and with it
        // any await in progress. The start, and its cleanup after a failure (the unit, the cgroup, the
        // environment file, the pod's token, a dead mount), runs to its end in a task of its own, which holds
        // the lock until then.
        let driver = Arc::clone(self);
        tokio::spawn(async move {
            let _guard = guard;
            driver
                .launcher
                .start(&binary, &args, &target, pod_credentials.as_ref())
                .await
        })
        .await
        .map_err(|e| Status::internal(format!("starting the mount: {e}")))?
        .map_err(Status::internal)?;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let arrived = Instant::now();
        let req = request.into_inner();
        if req.volume_id.is_empty() || req.target_path.is_empty() {
            return Err(Status::invalid_argument(
                "volume_id and target_path are required",
            ));
        }
        let _guard = self.lock.lock().await;
        let target = mounts::resolved(Path::new(&req.target_path));
        if mounts::mounted_at(&target).is_some() {
            tracing::info!(volume = %req.volume_id, target = %target.display(), "unmounting");
        }
        // Also when the mount is gone: a retry finds the daemons of the last call still finishing, and the
        // launcher's cleanup (SIGKILL for what is left in the mount's cgroup, the pod's token) waits for them.
        mounts::unmount(&target, &self.departures, arrived + UNPUBLISH_WAIT)
            .await
            .map_err(unmount_status)?;
        self.launcher
            .forget(&target)
            .await
            .map_err(Status::internal)?;
        // The target directory is ours to remove once nothing is mounted on it; kubelet made its parent.
        match std::fs::remove_dir(&target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(target = %target.display(), "removing target: {e}"),
        }
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::{Rpc, Type, rpc};
        // VOLUME_MOUNT_GROUP: kubelet hands us the pod's fsGroup instead of chowning every object.
        let capability = csi::NodeServiceCapability {
            r#type: Some(Type::Rpc(Rpc {
                r#type: rpc::Type::VolumeMountGroup as i32,
            })),
        };
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: vec![capability],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}
