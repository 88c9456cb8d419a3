//! The CSI Identity and Node services. There is no controller: a volume is a bucket that already exists,
//! named in the PV's attributes (static provisioning).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, OwnedMutexGuard};
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
    /// One mount or unmount at a time per target: kubelet retries freely, and two calls for one target must
    /// not race; calls for other targets go on meanwhile.
    pub targets: TargetLocks,
    /// When mounts went whose daemons were still finishing their uploads at the end of an unpublish.
    pub departures: mounts::Departures,
}

/// kubelet gives a CSI call 2 minutes. An unpublish waits for daemons until this long after the call came
/// in (it may have waited for an earlier call on its target first), which leaves room for ending a stuck
/// daemon (7 s) and for the launcher's cleanup (a systemctl call, 30 s at most).
const UNPUBLISH_WAIT: Duration = Duration::from_secs(75);

/// A lock per target path. An unpublish may wait a minute for a daemon's uploads and a start two minutes:
/// with one lock per node, every other pod's calls would wait behind them, past kubelet's deadline.
#[derive(Clone, Default)]
pub struct TargetLocks(Arc<std::sync::Mutex<HashMap<PathBuf, Slot>>>);

/// A target's lock and how many calls hold it or wait for it; the entry goes with the last of them.
struct Slot {
    lock: Arc<Mutex<()>>,
    users: usize,
}

/// A call's place at its target's lock, from when it starts waiting: a call dropped while it waits (its
/// deadline passed) gives its place up too.
pub struct TargetGuard {
    locks: TargetLocks,
    target: PathBuf,
    held: Option<OwnedMutexGuard<()>>,
}

impl TargetLocks {
    pub async fn lock(&self, target: &Path) -> TargetGuard {
        let lock = {
            let mut slots = self.slots();
            let slot = slots.entry(target.to_path_buf()).or_insert_with(|| Slot {
                lock: Default::default(),
                users: 0,
            });
            slot.users += 1;
            Arc::clone(&slot.lock)
        };
        let mut guard = TargetGuard {
            locks: self.clone(),
            target: target.to_path_buf(),
            held: None,
        };
        guard.held = Some(lock.lock_owned().await);
        guard
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Slot>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for TargetGuard {
    fn drop(&mut self) {
        // Released before the entry may go: a call that then makes a new lock never runs beside this one.
        self.held.take();
        let mut slots = self.locks.slots();
        if let Some(slot) = slots.get_mut(&self.target) {
            slot.users -= 1;
            if slot.users == 0 {
                slots.remove(&self.target);
            }
        }
    }
}

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

        let target = PathBuf::from(&req.target_path);
        // Keyed as unpublish keys it; kubelet made the parent, so the key is the same once we make `target`.
        let key = mounts::resolved(&target);
        let guard = self.targets.lock(&key).await;
        // Nothing may stat a mount point before its health check: a wedged daemon would hang the call.
        let mounted = mounts::mounted_at(&key).is_some();
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
        // the target's lock until then.
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
        let target = mounts::resolved(Path::new(&req.target_path));
        let _guard = self.targets.lock(&target).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(locks: &TargetLocks, target: &str) -> usize {
        locks.slots().get(Path::new(target)).map_or(0, |s| s.users)
    }

    #[tokio::test]
    async fn calls_wait_only_for_their_own_target() {
        let locks = TargetLocks::default();
        let a = locks.lock(Path::new("/t/a")).await;
        let brief = Duration::from_millis(50);
        let b = tokio::time::timeout(brief, locks.lock(Path::new("/t/b"))).await;
        assert!(b.is_ok(), "another target waited");
        let again = tokio::time::timeout(brief, locks.lock(Path::new("/t/a"))).await;
        assert!(again.is_err(), "two calls held one target");
        // The call dropped while it waited gave its place up.
        assert_eq!(waiting(&locks, "/t/a"), 1);
        let next = tokio::spawn({
            let locks = locks.clone();
            async move {
                let _held = locks.lock(Path::new("/t/a")).await;
            }
        });
        while waiting(&locks, "/t/a") < 2 {
            tokio::task::yield_now().await;
        }
        drop(a);
        next.await.unwrap();
        drop(b);
        assert!(locks.slots().is_empty(), "entries outlived their calls");
    }
}
