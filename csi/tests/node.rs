//! The node service end to end: a real driver process on a unix socket, driven by a gRPC client as kubelet
//! would, mounting buckets of an in-process emulator on 127.0.0.1 through real expressfs daemons.
//!
//! Needs the expressfs binary next to the test's target directory (`cargo build -p expressfs --bin
//! expressfs`) or named by EXPRESSFS_BIN.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use expressfs_emulator::{Emulator, EmulatorConfig};
use hyper_util::rt::TokioIo;
use sha2::Digest;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

#[allow(clippy::all, clippy::pedantic)]
mod csi {
    tonic::include_proto!("csi.v1");
}
use csi::controller_client::ControllerClient;
use csi::identity_client::IdentityClient;
use csi::node_client::NodeClient;
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, MountVolume};

const ACCESS_KEY: &str = "AKIDEXPRESSFSTEST";
const SECRET_KEY: &str = "expressfs-test-secret";
const REGION: &str = "us-east-1";

fn start_emulator(dir: &Path, buckets: &[&str]) -> Emulator {
    let config = EmulatorConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.join("emulator"),
        buckets: buckets.iter().map(|b| b.to_string()).collect(),
        access_key: ACCESS_KEY.into(),
        secret_key: SECRET_KEY.into(),
        region: REGION.into(),
        ..Default::default()
    };
    Emulator::start_background(config).expect("emulator starts")
}

fn expressfs_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("EXPRESSFS_BIN") {
        return path.into();
    }
    // target/debug/deps/node-HASH -> target/debug/expressfs
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join("expressfs");
    assert!(
        path.is_file(),
        "{} missing: run `cargo build -p expressfs --bin expressfs` first",
        path.display()
    );
    path
}

/// A running expressfs-csi process with explicit credentials and no instance metadata in its (and so
/// its daemons') environment.
struct Driver {
    child: Child,
    socket: PathBuf,
}

impl Driver {
    fn start(dir: &Path, insecure: bool) -> Driver {
        Driver::start_with(dir, insecure, &[])
    }

    /// A driver with the host launcher, its host being process `host_pid`.
    fn start_host(dir: &Path, host_pid: &str, host_dir: &Path) -> Driver {
        let host_dir = host_dir.to_str().unwrap();
        let args = [
            "--launcher",
            "host",
            "--host-pid",
            host_pid,
            "--host-directory",
            host_dir,
        ];
        Driver::start_with(dir, true, &args)
    }

    fn start_with(dir: &Path, insecure: bool, extra: &[&str]) -> Driver {
        let (mut cmd, socket) = Driver::command(dir, insecure, extra);
        let child = cmd.spawn().expect("start expressfs-csi");
        Driver { child, socket }
    }

    /// A driver (with --allow-insecure-endpoints) whose environment, and so its daemons', has `env` too.
    fn start_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Driver {
        let (mut cmd, socket) = Driver::command(dir, true, extra);
        let child = cmd
            .envs(env.iter().copied())
            .spawn()
            .expect("start expressfs-csi");
        Driver { child, socket }
    }

    fn command(dir: &Path, insecure: bool, extra: &[&str]) -> (Command, PathBuf) {
        let socket = dir.join("csi/csi.sock");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_expressfs-csi"));
        cmd.env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_REGION", REGION)
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .arg("--node-id")
            .arg("test-node")
            .stdin(Stdio::null());
        if !extra.contains(&"--expressfs") {
            cmd.arg("--expressfs").arg(expressfs_binary());
        }
        if insecure {
            cmd.arg("--allow-insecure-endpoints");
        }
        cmd.args(extra);
        (cmd, socket)
    }

    async fn connect(&self) -> Channel {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let path = self.socket.clone();
            let connector = tower::service_fn(move |_: tonic::transport::Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            });
            match Endpoint::from_static("http://localhost")
                .connect_with_connector(connector)
                .await
            {
                Ok(channel) => return channel,
                Err(e) if Instant::now() > deadline => panic!("driver socket: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// A crash or a container restart: the driver goes away without any cleanup.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// On a failed assertion, detaches whatever the test left mounted so no daemon outlives the test.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for target in &self.0 {
            if is_mounted(target) {
                let _ = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

fn is_mounted(target: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let target = target.to_string_lossy();
    info.lines()
        .any(|line| line.split(' ').nth(4) == Some(&*target))
}

/// Live (non-zombie) expressfs processes serving `target`.
fn daemons_of(target: &Path) -> Vec<u32> {
    let want = target.to_string_lossy().into_owned();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let (Ok(cmdline), Ok(stat)) = (
            std::fs::read(format!("/proc/{pid}/cmdline")),
            std::fs::read_to_string(format!("/proc/{pid}/stat")),
        ) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if !zombie
            && args.first().is_some_and(|a| a.ends_with("/expressfs"))
            && args.last() == Some(&want)
        {
            pids.push(pid);
        }
    }
    pids
}

fn mount_capability(flags: &[String], group: &str, mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: String::new(),
            mount_flags: flags.to_vec(),
            volume_mount_group: group.into(),
        })),
    }
}

fn publish_request(
    id: &str,
    target: &Path,
    bucket: Option<&str>,
    capability: csi::VolumeCapability,
    readonly: bool,
) -> csi::NodePublishVolumeRequest {
    let mut context = std::collections::HashMap::new();
    if let Some(bucket) = bucket {
        context.insert("bucketName".to_string(), bucket.to_string());
    }
    context.insert(
        "csi.storage.k8s.io/pod.name".to_string(),
        "trainer-0".to_string(),
    );
    csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_string_lossy().into_owned(),
        volume_capability: Some(capability),
        readonly,
        volume_context: context,
        ..Default::default()
    }
}

/// A read-write volume of `bucket` on the test's emulator, as a PV with only the endpoint and region set.
fn emulator_volume(
    id: &str,
    target: &Path,
    bucket: &str,
    emulator: &Emulator,
) -> csi::NodePublishVolumeRequest {
    let flags = vec![
        format!("endpoint-url {}", emulator.endpoint_url()),
        format!("region {REGION}"),
    ];
    publish_request(
        id,
        target,
        Some(bucket),
        mount_capability(&flags, "", Mode::SingleNodeWriter),
        false,
    )
}

/// Writes a script (a stand-in for a program the driver runs), and its directory, and makes it executable.
fn write_executable(path: &Path, text: impl AsRef<[u8]>) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn unpublish_request(id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_string_lossy().into_owned(),
    }
}

/// kubelet's layout: it makes the pod's volume directory, the driver makes `mount` under it.
fn pod_target(dir: &Path, volume: &str) -> PathBuf {
    let parent = dir
        .join("pods/uid-1/volumes/kubernetes.io~csi")
        .join(volume);
    std::fs::create_dir_all(&parent).unwrap();
    parent.join("mount")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_survives_driver_restart_and_unpublish_leaves_nothing() {
    let dir = tempfile::Builder::new()
        .prefix("expressfs-csi-")
        .tempdir()
        .unwrap();
    // A pod's user reaches its volume's mount point, as kubelet's directories let it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bucket = format!("csi{}--use1-az4--x-s3", std::process::id());
    let emulator = start_emulator(dir.path(), &[&bucket]);
    let endpoint = format!("endpoint-url {}", emulator.endpoint_url());
    let logs = dir.path().join("logs");
    let driver = Driver::start_with(
        dir.path(),
        true,
        &["--daemon-log-directory", logs.to_str().unwrap()],
    );
    let channel = driver.connect().await;

    let info = IdentityClient::new(channel.clone())
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "s3.csi.expressfs.dev");
    let probe = IdentityClient::new(channel.clone())
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    // No controller is announced, but its capabilities answer (csi-sanity asks before its Node specs) and
    // name no RPC; provisioning calls are refused.
    let plugin = IdentityClient::new(channel.clone())
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(plugin.capabilities.is_empty(), "{plugin:?}");
    let mut controller = ControllerClient::new(channel.clone());
    let controller_caps = controller
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let rpcs: Vec<_> = controller_caps
        .capabilities
        .iter()
        .map(|c| match &c.r#type {
            Some(csi::controller_service_capability::Type::Rpc(rpc)) => rpc.r#type(),
            None => panic!("capability without a type"),
        })
        .collect();
    assert_eq!(
        rpcs,
        [csi::controller_service_capability::rpc::Type::SingleNodeMultiWriter]
    );
    let refused = controller
        .create_volume(csi::CreateVolumeRequest {
            name: "pv-new".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unimplemented);
    let mut node = NodeClient::new(channel);
    let node_info = node
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node_info.node_id, "test-node");
    let caps = node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), 1, "{caps:?}");

    // Read-write volume: allow-overwrite, the PV's uid and the pod's fsGroup.
    let rw = pod_target(dir.path(), "pv-rw");
    let ro = pod_target(dir.path(), "pv-ro");
    let _cleanup = Cleanup(vec![rw.clone(), ro.clone()]);
    let flags = vec![
        endpoint.clone(),
        format!("region {REGION}"),
        "allow-overwrite".to_string(),
        "uid=1000".to_string(),
    ];
    let request = publish_request(
        "pv-rw",
        &rw,
        Some(&bucket),
        mount_capability(&flags, "2000", Mode::SingleNodeWriter),
        false,
    );
    node.node_publish_volume(request.clone()).await.unwrap();
    assert!(is_mounted(&rw));
    std::fs::write(rw.join("hello.txt"), b"first version").unwrap();
    // Overwriting an existing object needs allow-overwrite.
    std::fs::File::create(rw.join("hello.txt"))
        .unwrap()
        .write_all(b"hello from the csi driver")
        .unwrap();
    let meta = std::fs::metadata(rw.join("hello.txt")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1000, 2000));
    // The pod's users are in its fsGroup: they may write, though the files are the PV's uid's.
    let made = as_pod_user(2000, "echo 'from the pod' > \"$1/by-fs-group.txt\"", &rw);
    assert!(
        made.status.success(),
        "fsGroup member cannot write: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    assert_eq!(
        std::fs::read(rw.join("by-fs-group.txt")).unwrap(),
        b"from the pod\n"
    );
    // A second publish of the same volume is a no-op: still one daemon.
    node.node_publish_volume(request.clone()).await.unwrap();
    assert_eq!(daemons_of(&rw).len(), 1);
    // The same target asked for another bucket is a conflict, not a second mount.
    let mut other = request;
    other
        .volume_context
        .insert("bucketName".into(), "other--use1-az4--x-s3".into());
    let status = node.node_publish_volume(other).await.unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    assert_eq!(daemons_of(&rw).len(), 1);

    // Read-only volume of the same bucket, another daemon: what it reads came through the emulator. Its PV
    // is written for writers; the options the daemon refuses next to --read-only are left out.
    let writers_flags: Vec<String> = [
        endpoint.as_str(),
        &format!("region {REGION}"),
        "allow-delete",
        "allow-overwrite",
        "incremental-upload",
        "directory-markers",
    ]
    .map(str::to_string)
    .to_vec();
    let request = publish_request(
        "pv-ro",
        &ro,
        Some(&bucket),
        mount_capability(&writers_flags, "", Mode::MultiNodeReaderOnly),
        true,
    );
    node.node_publish_volume(request).await.unwrap();
    assert_eq!(
        std::fs::read(ro.join("hello.txt")).unwrap(),
        b"hello from the csi driver"
    );
    let err = std::fs::write(ro.join("other.txt"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc_erofs()), "{err}");

    // The driver dies; its mounts do not.
    let daemons: Vec<u32> = [daemons_of(&rw), daemons_of(&ro)].concat();
    assert_eq!(daemons.len(), 2);
    driver.kill();
    assert_eq!(
        std::fs::read(ro.join("hello.txt")).unwrap(),
        b"hello from the csi driver"
    );
    let driver = Driver::start(dir.path(), true);
    let mut node = NodeClient::new(driver.connect().await);

    for (id, target) in [("pv-rw", &rw), ("pv-ro", &ro)] {
        node.node_unpublish_volume(unpublish_request(id, target))
            .await
            .unwrap();
        assert!(!is_mounted(target), "{} still mounted", target.display());
        assert!(daemons_of(target).is_empty(), "daemon of {id} left");
        assert!(!target.exists(), "target dir of {id} left");
        // Unpublishing what is gone is fine too.
        node.node_unpublish_volume(unpublish_request(id, target))
            .await
            .unwrap();
    }
    // Each daemon logged to its volume's own directory.
    for id in ["pv-rw", "pv-ro"] {
        let files = std::fs::read_dir(logs.join(id)).unwrap().count();
        assert!(files > 0, "no log file of {id}");
    }
    for pid in daemons {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let exited = stat.is_empty()
            || stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        assert!(exited, "daemon {pid} still running: {stat}");
    }
}

/// Runs `script` (sh, with `dir` as $1) as a pod's container process would: a user of its own (uid and gid
/// 3000) whose one supplementary group is the pod's fsGroup.
fn as_pod_user(fs_group: u32, script: &str, dir: &Path) -> std::process::Output {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script, "sh"]).arg(dir);
    // SAFETY: only set*id system calls between fork and exec, on memory the closure owns.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            let groups = [fs_group];
            if nix::libc::setgroups(1, groups.as_ptr()) != 0
                || nix::libc::setgid(3000) != 0
                || nix::libc::setuid(3000) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().unwrap()
}

fn libc_erofs() -> i32 {
    30 // EROFS on Linux
}

/// A stopped daemon leaves a mount whose every stat hangs. A call that stats it without a bound would hang,
/// and every later call for the target behind it; instead a republish is Unavailable, and unpublish detaches
/// the mount and ends the daemon. The stat stuck there is the one probe of the target: later calls wait for
/// it rather than leave a stuck thread each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_daemon_stalls_neither_publish_nor_unpublish() {
    let dir = tempfile::Builder::new()
        .prefix("expressfs-csi-")
        .tempdir()
        .unwrap();
    let bucket = format!("wedged{}--use1-az4--x-s3", std::process::id());
    let emulator = start_emulator(dir.path(), &[&bucket]);
    let driver = Driver::start(dir.path(), true);
    let mut node = NodeClient::new(driver.connect().await);
    let target = pod_target(dir.path(), "pv-wedged");
    let _cleanup = Cleanup(vec![target.clone()]);
    let request = emulator_volume("pv-wedged", &target, &bucket, &emulator);
    node.node_publish_volume(request.clone()).await.unwrap();
    let daemons = daemons_of(&target);
    assert_eq!(daemons.len(), 1);
    for pid in &daemons {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid as i32),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
    }
    // Past the kernel's attribute cache of the mount's root (1 s by default), a stat reaches the daemon.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let started = Instant::now();
    let republish = tokio::time::timeout(
        Duration::from_secs(30),
        node.node_publish_volume(request.clone()),
    )
    .await
    .expect("a republish of a wedged mount must not hang")
    .unwrap_err();
    assert_eq!(republish.code(), Code::Unavailable, "{republish:?}");
    assert!(started.elapsed() < Duration::from_secs(20));
    for _ in 0..2 {
        let started = Instant::now();
        let republish = node.node_publish_volume(request.clone()).await.unwrap_err();
        assert_eq!(republish.code(), Code::Unavailable, "{republish:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "a republish waited for a probe already past its time"
        );
    }
    assert_eq!(probe_threads(driver.child.id()), 1);

    tokio::time::timeout(
        Duration::from_secs(90),
        node.node_unpublish_volume(unpublish_request("pv-wedged", &target)),
    )
    .await
    .expect("unpublish of a wedged mount must not hang")
    .unwrap();
    assert!(!is_mounted(&target));
    assert!(daemons_of(&target).is_empty());
}

/// The threads of process `pid` that stat a mount point for the driver.
fn probe_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.trim() == "expressfs-probe")
        })
        .count()
}

/// Every release the daemons of the next test serve is held back this long (a debug build of expressfs
/// reads EXPRESSFS_TEST_RELEASE_DELAY_MS): a file closed just before the unpublish keeps its daemon
/// finishing after the unmount for about this long, as a slow upload would. Within the daemon's own bound
/// (45 s), and past the 30 s and 10 s after SIGTERM (which a finishing daemon ignores) that unpublish once
/// waited.
const SLOW_RELEASE: Duration = Duration::from_secs(44);

/// Whether the daemon that logged to `dir` exited by itself: its summary is the last thing it logs.
fn exited_in_order(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().flatten().any(|file| {
        std::fs::read_to_string(file.path())
            .unwrap_or_default()
            .contains("at unmount")
    })
}

/// Publishes `request`, closes a file written on it, and gives the daemon a moment to get the release.
async fn publish_and_close_a_file(
    node: &mut NodeClient<Channel>,
    request: csi::NodePublishVolumeRequest,
) -> PathBuf {
    let target = PathBuf::from(&request.target_path);
    let name = format!("{}.bin", request.volume_id);
    node.node_publish_volume(request).await.unwrap();
    std::fs::write(target.join(name), b"closed just before the unpublish").unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    target
}

/// A daemon finishes the uploads of files closed before its unmount (for up to 45 s, ignoring SIGTERM).
/// Unpublish waits for it rather than giving up and leaving the next call to kill it: the first call waits,
/// and so does kubelet's retry of a call its deadline cut short, which with the host launcher would once
/// have killed everything in the mount's cgroup, the finishing daemon with it. Two drivers, one per launcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpublish_waits_for_a_daemon_finishing_its_uploads() {
    let dir = tempfile::Builder::new()
        .prefix("expressfs-csi-finish-")
        .tempdir()
        .unwrap();
    let bucket = format!("finish{}--use1-az4--x-s3", std::process::id());
    let emulator = start_emulator(dir.path(), &[&bucket]);
    let logs = dir.path().join("logs");
    let delay = SLOW_RELEASE.as_millis().to_string();
    let env = [("EXPRESSFS_TEST_RELEASE_DELAY_MS", delay.as_str())];
    let log_args = ["--daemon-log-directory", logs.to_str().unwrap()];
    let direct = Driver::start_env(&dir.path().join("direct"), &log_args, &env);
    let host_dir = dir.path().join("host");
    let me = std::process::id().to_string();
    let host_args = [
        &log_args[..],
        &[
            "--launcher",
            "host",
            "--host-pid",
            &me,
            "--host-directory",
            host_dir.to_str().unwrap(),
        ],
    ]
    .concat();
    let host = Driver::start_env(&dir.path().join("host-driver"), &host_args, &env);
    let first = pod_target(dir.path(), "pv-first");
    let retried = pod_target(dir.path(), "pv-retried");
    let _cleanup = Cleanup(vec![first.clone(), retried.clone()]);

    let first_call = async {
        let mut node = NodeClient::new(direct.connect().await);
        let request = emulator_volume("pv-first", &first, &bucket, &emulator);
        let target = publish_and_close_a_file(&mut node, request).await;
        let started = Instant::now();
        node.node_unpublish_volume(unpublish_request("pv-first", &target))
            .await
            .unwrap();
        assert!(!is_mounted(&target));
        assert!(daemons_of(&target).is_empty());
        assert!(started.elapsed() > SLOW_RELEASE - Duration::from_secs(5));
        assert!(exited_in_order(&logs.join("pv-first")));
    };
    let retry = async {
        let mut node = NodeClient::new(host.connect().await);
        let request = emulator_volume("pv-retried", &retried, &bucket, &emulator);
        let target = publish_and_close_a_file(&mut node, request).await;
        let mut cut = tonic::Request::new(unpublish_request("pv-retried", &target));
        cut.set_timeout(Duration::from_secs(2));
        let status = node.node_unpublish_volume(cut).await.unwrap_err();
        assert!(
            matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded),
            "{status:?}"
        );
        assert!(!is_mounted(&target));
        assert_eq!(daemons_of(&target).len(), 1, "no daemon finishing");
        node.node_unpublish_volume(unpublish_request("pv-retried", &target))
            .await
            .unwrap();
        assert!(daemons_of(&target).is_empty());
        assert!(
            exited_in_order(&logs.join("pv-retried")),
            "the daemon was killed while it finished"
        );
    };
    tokio::join!(first_call, retry);
    for dir in own_cgroup_dirs(true) {
        let _ = std::fs::remove_dir(dir.join("expressfs-csi"));
    }
}

/// How long the daemons of the next test hold a release back: long enough that the calls for the other
/// target fit well within the wait for the first one's daemon.
const HELD_RELEASE: Duration = Duration::from_secs(20);

/// Calls are serialised per target, not per node: while an unpublish waits for its daemon's uploads, another
/// pod's volume on the node is published and unpublished without waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpublish_waiting_for_uploads_holds_up_no_other_target() {
    let dir = tempfile::Builder::new()
        .prefix("expressfs-csi-parallel-")
        .tempdir()
        .unwrap();
    let bucket = format!("parallel{}--use1-az4--x-s3", std::process::id());
    let emulator = start_emulator(dir.path(), &[&bucket]);
    let delay = HELD_RELEASE.as_millis().to_string();
    let env = [("EXPRESSFS_TEST_RELEASE_DELAY_MS", delay.as_str())];
    let driver = Driver::start_env(dir.path(), &[], &env);
    let mut node = NodeClient::new(driver.connect().await);
    let slow = pod_target(dir.path(), "pv-slow");
    let other = pod_target(dir.path(), "pv-other");
    let _cleanup = Cleanup(vec![slow.clone(), other.clone()]);
    let request = emulator_volume("pv-slow", &slow, &bucket, &emulator);
    publish_and_close_a_file(&mut node, request).await;
    let mut waiting = node.clone();
    let request = unpublish_request("pv-slow", &slow);
    let unpublish = tokio::spawn(async move { waiting.node_unpublish_volume(request).await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while is_mounted(&slow) {
        assert!(Instant::now() < deadline, "the unpublish did not unmount");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(daemons_of(&slow).len(), 1, "no daemon finishing");

    let started = Instant::now();
    let request = emulator_volume("pv-other", &other, &bucket, &emulator);
    node.node_publish_volume(request).await.unwrap();
    assert!(is_mounted(&other));
    node.node_unpublish_volume(unpublish_request("pv-other", &other))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        !unpublish.is_finished(),
        "the calls for another target waited for the unpublish ({took:?})"
    );
    assert!(!is_mounted(&other));
    assert!(daemons_of(&other).is_empty());
    unpublish.await.unwrap().unwrap();
    assert!(daemons_of(&slow).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_invalid_argument_and_mount_nothing() {
    let dir = tempfile::Builder::new()
        .prefix("expressfs-csi-")
        .tempdir()
        .unwrap();
    let bucket = format!("bad{}--use1-az4--x-s3", std::process::id());
    let emulator = start_emulator(dir.path(), &[&bucket]);
    let endpoint = format!("endpoint-url {}", emulator.endpoint_url());
    // No --allow-insecure-endpoints: the emulator's http:// URL is refused.
    let driver = Driver::start(dir.path(), false);
    let mut node = NodeClient::new(driver.connect().await);
    let target = pod_target(dir.path(), "pv-bad");
    let mode = Mode::SingleNodeWriter;
    let with_flags = |flags: &[&str]| {
        let flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
        publish_request(
            "pv-bad",
            &target,
            Some(&bucket),
            mount_capability(&flags, "", mode),
            false,
        )
    };
    let mut no_bucket = with_flags(&[&endpoint]);
    no_bucket.volume_context.remove("bucketName");
    let mut unknown_attribute = with_flags(&[]);
    unknown_attribute
        .volume_context
        .insert("mounter".into(), "systemd".into());
    let mut block = with_flags(&[]);
    block.volume_capability.as_mut().unwrap().access_type =
        Some(AccessType::Block(csi::volume_capability::BlockVolume {}));
    let mut bad_prefix = with_flags(&[]);
    bad_prefix
        .volume_context
        .insert("prefix".into(), "no-trailing-slash".into());
    let cases = [
        ("no bucketName", no_bucket),
        ("unknown attribute", unknown_attribute),
        ("plain http endpoint", with_flags(&[&endpoint])),
        ("unknown option", with_flags(&["foreground"])),
        ("profile", with_flags(&["profile default"])),
        ("relative cache", with_flags(&["cache ../../etc"])),
        ("non-numeric uid", with_flags(&["uid=root"])),
        (
            "flag smuggled in a value",
            with_flags(&["region --foreground"]),
        ),
        ("block volume", block),
        ("prefix without slash", bad_prefix),
    ];
    for (what, request) in cases {
        let status = node.node_publish_volume(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(!is_mounted(&target), "{what}: mounted");
        assert!(daemons_of(&target).is_empty(), "{what}: daemon started");
    }
}

/// A hostPID container as a runtime makes one, with the test process as the host: the driver runs in
/// its own mount namespace, where the kubelet directory is shared both ways (`mountPropagation:
/// Bidirectional`), optionally its own network namespace (no route to the emulator on the host's
/// loopback), and in cgroups of its own in every hierarchy. Stopping it kills every process in those
/// cgroups, which is what the runtime does to a container that shares the host's PID namespace.
struct Container {
    cgroups: Vec<PathBuf>,
    driver: Option<Driver>,
}

/// The test process's cgroup directory in every mounted hierarchy, v1 cpuset only `with_cpuset` (the
/// container does without: a new cpuset cgroup has no CPUs to run on until configured, and the other
/// hierarchies are enough to find its processes).
fn own_cgroup_dirs(with_cpuset: bool) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let mut dirs = Vec::new();
    let mut seen = Vec::new();
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let dash = fields.iter().position(|f| *f == "-").unwrap();
        let (mount_point, fstype, options) = (fields[4], fields[dash + 1], fields[dash + 3]);
        if !(fstype == "cgroup" || fstype == "cgroup2") || seen.contains(&options) {
            continue;
        }
        seen.push(options);
        let options: Vec<&str> = options.split(',').collect();
        if fstype == "cgroup" && options.contains(&"cpuset") && !with_cpuset {
            continue;
        }
        let path = own.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, list, path) = (parts.next()?, parts.next()?, parts.next()?);
            let matches = if fstype == "cgroup2" {
                list.is_empty()
            } else {
                !list.is_empty() && list.split(',').all(|c| options.contains(&c))
            };
            matches.then(|| path.trim_start_matches('/').to_string())
        });
        dirs.push(Path::new(mount_point).join(path.unwrap()));
    }
    assert!(!dirs.is_empty(), "no cgroup hierarchy mounted");
    dirs
}

impl Container {
    fn start(dir: &Path, own_network: bool, extra: &[&str], env: &[(&str, &Path)]) -> Container {
        let cgroups: Vec<PathBuf> = own_cgroup_dirs(false)
            .iter()
            .map(|d| d.join(format!("expressfs-test-container-{}", std::process::id())))
            .collect();
        for cgroup in &cgroups {
            std::fs::create_dir_all(cgroup).unwrap();
        }
        let (inner, socket) = Driver::command(dir, true, extra);
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "unchanged"]);
        if own_network {
            cmd.arg("--net");
        }
        cmd.arg("--")
            .arg(inner.get_program())
            .args(inner.get_args());
        for (key, value) in inner.get_envs() {
            match value {
                Some(v) => cmd.env(key, v),
                None => cmd.env_remove(key),
            };
        }
        let procs: Vec<std::fs::File> = cgroups
            .iter()
            .map(|c| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(c.join("cgroup.procs"))
                    .unwrap()
            })
            .collect();
        let fds: Vec<i32> = procs.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
        // SAFETY: only write(2) on descriptors that stay open until the child has exec'd.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                for fd in &fds {
                    if nix::libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        cmd.stdin(Stdio::null());
        cmd.envs(env.iter().copied());
        let child = cmd.spawn().expect("start the driver in a container");
        drop(procs);
        Container {
            cgroups,
            driver: Some(Driver { child, socket }),
        }
    }

    fn pids(&self) -> Vec<i32> {
        self.cgroups
            .iter()
            .filter_map(|c| std::fs::read_to_string(c.join("cgroup.procs")).ok())
            .flat_map(|t| {
                t.lines()
                    .map(|l| l.trim().parse::<i32>().unwrap())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The runtime stops the container: SIGKILL to everything in its cgroups, until they are empty.
    fn stop(&mut self) {
        assert!(
            self.kill_all(),
            "container processes {:?} survive",
            self.pids()
        );
    }

    fn kill_all(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                return false;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            // Reap the driver, and give the kernel a moment to empty the cgroups.
            if let Some(mut driver) = self.driver.take() {
                let _ = driver.child.wait();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for cgroup in &self.cgroups {
            let _ = std::fs::remove_dir(cgroup);
        }
        true
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Makes `dir` a mount of its own, shared: a mount made below it in one mount namespace shows in the
/// other (kubelet's directory with Bidirectional propagation). Unmounted when dropped.
struct SharedDir(PathBuf);

impl SharedDir {
    fn new(dir: PathBuf) -> SharedDir {
        use nix::mount::{MsFlags, mount};
        std::fs::create_dir_all(&dir).unwrap();
        mount(
            Some(&dir),
            &dir,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        let shared = SharedDir(dir);
        mount(
            None::<&str>,
            &shared.0,
            None::<&str>,
            MsFlags::MS_SHARED | MsFlags::MS_REC,
            None::<&str>,
        )
        .unwrap();
        shared
    }
}

impl Drop for SharedDir {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn cgroups_of(pid: u32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap()
        .lines()
        .map(|l| l.splitn(3, ':').nth(2).unwrap().to_string())
        .collect()
}

fn same_namespace(pid: u32, ns: &str) -> bool {
    std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap()
        == std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_launcher_mounts_survive_the_container_and_a_new_driver_unpublishes() {
    let dir = tempfile::Builder::new()
        .prefix("expressfs-csi-host-")
        .tempdir()
        .unwrap();
    let bucket = format!("host{}--use1-az4--x-s3", std::process::id());
    let emulator = start_emulator(dir.path(), &[&bucket]);
    let endpoint = format!("endpoint-url {}", emulator.endpoint_url());
    let kubelet = SharedDir::new(dir.path().join("kubelet"));
    let host_dir = dir.path().join("host");
    let me = std::process::id().to_string();
    let host_args = [
        "--launcher",
        "host",
        "--host-pid",
        &me,
        "--host-directory",
        host_dir.to_str().unwrap(),
    ];
    // IRSA's token file, at a path only the container's processes may see.
    let token = dir.path().join("container/eks.amazonaws.com/token");
    std::fs::create_dir_all(token.parent().unwrap()).unwrap();
    std::fs::write(&token, "driver-token-1").unwrap();
    let mut container = Container::start(
        dir.path(),
        true,
        &host_args,
        &[("AWS_WEB_IDENTITY_TOKEN_FILE", &token)],
    );
    let driver_pid = container.driver.as_ref().unwrap().child.id();
    let mut node = NodeClient::new(container.driver.as_ref().unwrap().connect().await);
    assert!(
        !same_namespace(driver_pid, "net") && !same_namespace(driver_pid, "mnt"),
        "the driver is not in namespaces of its own"
    );

    let target = pod_target(&kubelet.0, "pv-host");
    let failed = pod_target(&kubelet.0, "pv-missing");
    let _cleanup = Cleanup(vec![target.clone(), failed.clone()]);
    let flags = vec![endpoint.clone(), format!("region {REGION}")];
    let request = publish_request(
        "pv-host",
        &target,
        Some(&bucket),
        mount_capability(&flags, "", Mode::SingleNodeWriter),
        false,
    );
    node.node_publish_volume(request).await.unwrap();
    assert!(is_mounted(&target));
    std::fs::write(target.join("weights.bin"), b"epoch 7").unwrap();
    let daemons = daemons_of(&target);
    assert_eq!(daemons.len(), 1, "{daemons:?}");
    let daemon = daemons[0];
    // The daemon runs the binary installed on the host, in the host's namespaces (it reached the
    // emulator, which the container's network cannot), and in its own cgroups, none of the container's.
    let exe = std::fs::read_link(format!("/proc/{daemon}/exe")).unwrap();
    assert!(exe.starts_with(host_dir.join("bin")), "{}", exe.display());
    for ns in ["net", "mnt", "pid", "cgroup"] {
        assert!(
            same_namespace(daemon, ns),
            "daemon not in the host's {ns} namespace"
        );
    }
    // Its web-identity token is the driver's, copied to the host.
    let environ = std::fs::read(format!("/proc/{daemon}/environ")).unwrap();
    let copy = host_dir.join("credentials/driver/web-identity-token");
    let want = format!("AWS_WEB_IDENTITY_TOKEN_FILE={}", copy.display());
    assert!(
        environ.split(|b| *b == 0).any(|v| v == want.as_bytes()),
        "{want} not in the daemon's environment"
    );
    assert_eq!(std::fs::read(&copy).unwrap(), b"driver-token-1");
    let mode = std::fs::metadata(&copy).unwrap().mode();
    assert_eq!(mode & 0o777, 0o600);
    let cgroups = cgroups_of(daemon);
    let container_name = format!("expressfs-test-container-{}", std::process::id());
    assert!(
        cgroups.iter().all(|c| !c.contains(&container_name)),
        "{cgroups:?}"
    );
    let unit_cgroups: Vec<&String> = cgroups
        .iter()
        .filter(|c| c.contains("/expressfs-csi/expressfs-"))
        .collect();
    assert!(unit_cgroups.len() >= container.cgroups.len(), "{cgroups:?}");

    // A publish that fails (no such bucket) leaves no daemon and no cgroup behind.
    let request = publish_request(
        "pv-missing",
        &failed,
        Some("missing--use1-az4--x-s3"),
        mount_capability(&flags, "", Mode::SingleNodeWriter),
        false,
    );
    let status = node.node_publish_volume(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(!is_mounted(&failed));
    assert!(daemons_of(&failed).is_empty());

    // The container goes away as in a rollout. The mount keeps serving.
    container.stop();
    assert!(container.pids().is_empty());
    assert!(
        daemons_of(&target).contains(&daemon),
        "the daemon died with the container"
    );
    assert_eq!(
        std::fs::read(target.join("weights.bin")).unwrap(),
        b"epoch 7"
    );
    // (Only the count: a kept DirEntry holds the directory open, and the mount busy.)
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 1);

    // The next driver (here on the host itself) adopts and unpublishes it.
    let driver = Driver::start_with(dir.path(), true, &host_args);
    let mut node = NodeClient::new(driver.connect().await);
    for (id, target) in [("pv-host", &target), ("pv-missing", &failed)] {
        node.node_unpublish_volume(unpublish_request(id, target))
            .await
            .unwrap();
        assert!(!is_mounted(target), "{} still mounted", target.display());
        assert!(daemons_of(target).is_empty(), "daemon of {id} left");
    }
    let stat = std::fs::read_to_string(format!("/proc/{daemon}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty()
            || stat
                .rsplit_once(')')
                .unwrap()
                .1
                .trim_start()
                .starts_with('Z'),
        "daemon {daemon} still running"
    );
    // The mounts' cgroups are gone (the failed one's already at its failure); their parent stays.
    for target in [&target, &failed] {
        let unit = unit_name_of(target);
        assert!(
            unit_cgroups.iter().any(|c| c.ends_with(&unit)) || target == &failed,
            "{unit} is not the daemon's cgroup: {unit_cgroups:?}"
        );
        for dir in own_cgroup_dirs(true) {
            let cgroup = dir.join("expressfs-csi").join(&unit);
            assert!(!cgroup.exists(), "{} left", cgroup.display());
        }
    }
    // A node keeps the common parent; this machine need not (it stays while another test uses it).
    for dir in own_cgroup_dirs(true) {
        let _ = std::fs::remove_dir(dir.join("expressfs-csi"));
    }
}

/// The control: with the direct launcher the same container stop takes the mount down, so the test
/// above would see it if the host launcher did nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_launcher_mounts_die_with_the_container() {
    let dir = tempfile::Builder::new()
        .prefix("expressfs-csi-direct-")
        .tempdir()
        .unwrap();
    let bucket = format!("direct{}--use1-az4--x-s3", std::process::id());
    let emulator = start_emulator(dir.path(), &[&bucket]);
    let kubelet = SharedDir::new(dir.path().join("kubelet"));
    // The host's network: a daemon in the container's own could not reach the emulator at all.
    let mut container = Container::start(dir.path(), false, &[], &[]);
    let mut node = NodeClient::new(container.driver.as_ref().unwrap().connect().await);
    let target = pod_target(&kubelet.0, "pv-direct");
    let _cleanup = Cleanup(vec![target.clone()]);
    let request = emulator_volume("pv-direct", &target, &bucket, &emulator);
    node.node_publish_volume(request).await.unwrap();
    std::fs::write(target.join("x"), b"x").unwrap();
    assert_eq!(daemons_of(&target).len(), 1);
    container.stop();
    assert!(
        daemons_of(&target).is_empty(),
        "the daemon outlived its container"
    );
    assert!(
        std::fs::read_dir(&target).is_err(),
        "the dead mount still answers"
    );
    // A new driver clears the dead mount.
    let driver = Driver::start(dir.path(), true);
    let mut node = NodeClient::new(driver.connect().await);
    node.node_unpublish_volume(unpublish_request("pv-direct", &target))
        .await
        .unwrap();
    assert!(!is_mounted(&target));
}

/// `authenticationSource: pod`: the daemon gets the pod's token as a web-identity token file and none of
/// the driver's credentials. No STS here: a wrapper in place of expressfs records the environment the
/// driver gave it, then runs the real expressfs on the emulator's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_authentication_hands_the_pod_token_to_the_daemon() {
    let dir = tempfile::Builder::new()
        .prefix("expressfs-csi-pod-")
        .tempdir()
        .unwrap();
    let bucket = format!("pod{}--use1-az4--x-s3", std::process::id());
    let emulator = start_emulator(dir.path(), &[&bucket]);
    let dump = dir.path().join("daemon.env");
    let wrapper = dir.path().join("wrapper/expressfs");
    write_executable(
        &wrapper,
        format!(
            "#!/bin/sh\nenv > '{}'\nexec env -u AWS_ROLE_ARN -u AWS_WEB_IDENTITY_TOKEN_FILE \
             -u AWS_SHARED_CREDENTIALS_FILE -u AWS_CONFIG_FILE AWS_ACCESS_KEY_ID={ACCESS_KEY} \
             AWS_SECRET_ACCESS_KEY={SECRET_KEY} '{}' \"$@\"\n",
            dump.display(),
            expressfs_binary().display()
        ),
    );
    let host_dir = dir.path().join("host");
    let driver = Driver::start_with(
        dir.path(),
        true,
        &[
            "--expressfs",
            wrapper.to_str().unwrap(),
            "--host-directory",
            host_dir.to_str().unwrap(),
        ],
    );
    let mut node = NodeClient::new(driver.connect().await);
    let target = pod_target(dir.path(), "pv-pod");
    let _cleanup = Cleanup(vec![target.clone()]);
    let role = "arn:aws:iam::111122223333:role/trainer";
    let request = |token: &str| {
        let flags = vec![
            format!("endpoint-url {}", emulator.endpoint_url()),
            format!("region {REGION}"),
        ];
        let mut r = publish_request(
            "pv-pod",
            &target,
            Some(&bucket),
            mount_capability(&flags, "", Mode::SingleNodeWriter),
            false,
        );
        r.volume_context
            .insert("authenticationSource".into(), "pod".into());
        r.volume_context.insert("roleArn".into(), role.into());
        r.volume_context
            .insert("csi.storage.k8s.io/pod.namespace".into(), "ml".into());
        if !token.is_empty() {
            r.volume_context.insert(
                "csi.storage.k8s.io/serviceAccount.tokens".into(),
                format!(r#"{{"sts.amazonaws.com":{{"token":"{token}","expirationTimestamp":"2030-01-01T00:00:00Z"}}}}"#),
            );
        }
        r
    };

    // Without the token (no tokenRequests in the CSIDriver) nothing is mounted.
    let status = node.node_publish_volume(request("")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("tokenRequests"), "{status:?}");
    assert!(!dump.exists() && !is_mounted(&target));

    node.node_publish_volume(request("aGVhZA.Ym9keQ.c2ln1"))
        .await
        .unwrap();
    assert!(is_mounted(&target));
    std::fs::write(target.join("ok"), b"written on the emulator's keys").unwrap();
    let env = std::fs::read_to_string(&dump).unwrap();
    let var = |name: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .map(str::to_string)
    };
    assert_eq!(var("AWS_ROLE_ARN").as_deref(), Some(role));
    assert_eq!(
        var("AWS_ROLE_SESSION_NAME").as_deref(),
        Some("expressfs-ml-trainer-0")
    );
    assert_eq!(var("AWS_EC2_METADATA_DISABLED").as_deref(), Some("true"));
    assert_eq!(
        var("AWS_ACCESS_KEY_ID"),
        None,
        "the driver's keys reached the daemon"
    );
    assert_eq!(var("AWS_SECRET_ACCESS_KEY"), None);
    let token_file = PathBuf::from(var("AWS_WEB_IDENTITY_TOKEN_FILE").unwrap());
    assert!(token_file.starts_with(host_dir.join("credentials")));
    assert_eq!(std::fs::read(&token_file).unwrap(), b"aGVhZA.Ym9keQ.c2ln1");
    let mode = std::fs::metadata(&token_file).unwrap().mode();
    assert_eq!(mode & 0o777, 0o600);

    // kubelet republishes with a fresh token: the file changes, the daemon stays.
    let daemons = daemons_of(&target);
    assert_eq!(daemons.len(), 1);
    node.node_publish_volume(request("aGVhZA.Ym9keQ.c2ln2"))
        .await
        .unwrap();
    assert_eq!(std::fs::read(&token_file).unwrap(), b"aGVhZA.Ym9keQ.c2ln2");
    assert_eq!(daemons_of(&target), daemons);

    node.node_unpublish_volume(unpublish_request("pv-pod", &target))
        .await
        .unwrap();
    assert!(!is_mounted(&target));
    assert!(!token_file.exists(), "the pod's token outlived its mount");
    assert!(daemons_of(&target).is_empty());
}

/// Without hostPID the driver is PID 1 of the pod's PID namespace and cannot reach the host's: the host
/// launcher refuses to start rather than run "host" daemons that die with the pod.
#[test]
fn host_launcher_refuses_a_pid_namespace_of_its_own() {
    let dir = tempfile::Builder::new()
        .prefix("expressfs-csi-nohostpid-")
        .tempdir()
        .unwrap();
    let host_dir = dir.path().join("host");
    let (inner, _) = Driver::command(
        dir.path(),
        false,
        &[
            "--launcher",
            "host",
            "--host-directory",
            host_dir.to_str().unwrap(),
        ],
    );
    let output = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "--"])
        .arg(inner.get_program())
        .args(inner.get_args())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "started: {stderr}");
    assert!(stderr.contains("hostPID"), "{stderr}");
    assert!(!host_dir.exists(), "installed a binary anyway");
}

/// A stand-in for a host with systemd: a process in a mount namespace of its own (the kubelet directory
/// shared with ours) where /run/systemd/system exists and /usr/bin/systemd-run is a script that answers
/// `--version` with `systemd VERSION`, and otherwise records its command line in `recorded` and does what
/// systemd would for a Type=forking unit (an empty environment plus the EnvironmentFile, run the command,
/// wait for its first process).
struct StandInHost {
    child: Child,
    recorded: PathBuf,
    /// What its /usr/bin/systemctl (a stand-in too) was asked, one call a line.
    systemctl_calls: PathBuf,
}

impl StandInHost {
    fn start(dir: &Path, version: u32) -> StandInHost {
        assert!(
            Path::new("/usr/bin/systemd-run").is_file(),
            "no file to stand in for"
        );
        let recorded = dir.join("systemd-run.args");
        let systemctl_calls = dir.join("systemctl.calls");
        let fake_systemctl = dir.join("systemctl");
        write_executable(
            &fake_systemctl,
            format!(
                "#!/bin/sh\necho \"$*\" >> '{}'\n",
                systemctl_calls.display()
            ),
        );
        let fake = dir.join("systemd-run");
        write_executable(
            &fake,
            format!(
                "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'systemd {version} ({version}.1-1)'; \
                 echo '+PAM +AUDIT'; exit 0; fi\nprintf '%s\\n' \"$@\" > '{}'\nenv_file=\nwhile [ \"$1\" != -- ]; do\n  \
                 case \"$1\" in --property=EnvironmentFile=*) env_file=${{1#--property=EnvironmentFile=}};; esac\n  \
                 shift\ndone\nshift\nexec env -i PATH=/usr/bin:/bin sh -c 'set -a; . \"$0\"; set +a; exec \"$@\"' \
                 \"$env_file\" \"$@\"\n",
                recorded.display()
            ),
        );
        let ready = dir.join("ready");
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "unchanged", "--", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs none /run && mkdir -p /run/systemd/system && \
                 mount --bind '{}' /usr/bin/systemd-run && mount --bind '{}' /usr/bin/systemctl && \
                 touch '{}' && exec sleep 600",
                fake.display(),
                fake_systemctl.display(),
                ready.display()
            ))
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let host = StandInHost {
            child,
            recorded,
            systemctl_calls,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "the stand-in host did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        host
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for StandInHost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The systemd path as far as it goes without systemd, on the stand-in host. The daemon reaching the
/// emulator proves the credentials went through the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_launcher_uses_systemd_run_where_the_host_has_systemd() {
    let dir = tempfile::Builder::new()
        .prefix("expressfs-csi-systemd-")
        .tempdir()
        .unwrap();
    let bucket = format!("unit{}--use1-az4--x-s3", std::process::id());
    let emulator = start_emulator(dir.path(), &[&bucket]);
    let kubelet = SharedDir::new(dir.path().join("kubelet"));
    let host = StandInHost::start(dir.path(), 252);
    let host_pid = host.pid();
    let recorded = host.recorded.clone();

    let host_dir = dir.path().join("host");
    // A driver that died between writing a unit's environment file and starting the unit left it behind,
    // credentials and all: the next driver removes it.
    let stale = host_dir.join("run/expressfs-0123456789abcdef.env");
    std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
    std::fs::write(&stale, format!("AWS_SECRET_ACCESS_KEY=\"{SECRET_KEY}\"\n")).unwrap();
    let host_pid_arg = host_pid.to_string();
    let logs = dir.path().join("logs");
    let driver = Driver::start_with(
        dir.path(),
        true,
        &[
            "--launcher",
            "host",
            "--host-pid",
            &host_pid_arg,
            "--host-directory",
            host_dir.to_str().unwrap(),
            "--daemon-log-directory",
            logs.to_str().unwrap(),
        ],
    );
    let mut node = NodeClient::new(driver.connect().await);
    let target = pod_target(&kubelet.0, "pv-unit");
    let _cleanup = Cleanup(vec![target.clone()]);
    let request = emulator_volume("pv-unit", &target, &bucket, &emulator);
    node.node_publish_volume(request).await.unwrap();
    std::fs::write(target.join("through-a-unit"), b"ok").unwrap();
    assert_eq!(std::fs::read(target.join("through-a-unit")).unwrap(), b"ok");

    let argv = std::fs::read_to_string(&recorded).unwrap();
    let argv: Vec<&str> = argv.lines().collect();
    assert!(argv[0].starts_with("--unit=expressfs-"), "{argv:?}");
    // Stopped before the network at shutdown, and given the time the daemon's last uploads take.
    for want in [
        "--collect",
        "--property=Type=forking",
        "--property=After=network-online.target",
        "--property=Wants=network-online.target",
        "--property=TimeoutStopSec=60",
    ] {
        assert!(argv.contains(&want), "{want} missing: {argv:?}");
    }
    assert_eq!(argv.last(), Some(&target.to_str().unwrap()));
    let daemons = daemons_of(&target);
    assert_eq!(daemons.len(), 1);
    let environ = std::fs::read(format!("/proc/{}/environ", daemons[0])).unwrap();
    let key = format!("AWS_ACCESS_KEY_ID={ACCESS_KEY}");
    assert!(environ.split(|b| *b == 0).any(|v| v == key.as_bytes()));
    // The daemon lives in the host's mount namespace, and the credentials file is gone once started.
    assert_eq!(
        std::fs::read_link(format!("/proc/{}/ns/mnt", daemons[0])).unwrap(),
        std::fs::read_link(format!("/proc/{host_pid}/ns/mnt")).unwrap()
    );
    let env_files = std::fs::read_dir(host_dir.join("run")).unwrap().count();
    assert_eq!(env_files, 0, "an environment file stayed on the host");

    // Before the start: a stale unit of that name goes.
    let unit = argv[0].strip_prefix("--unit=").unwrap().to_string();
    let calls = std::fs::read_to_string(&host.systemctl_calls).unwrap();
    assert_eq!(calls.lines().collect::<Vec<_>>(), [format!("stop {unit}")]);

    node.node_unpublish_volume(unpublish_request("pv-unit", &target))
        .await
        .unwrap();
    assert!(!is_mounted(&target));
    assert!(daemons_of(&target).is_empty());
    // Unpublish stops the unit too, as the cgroup path kills what is left in the mount's cgroup: a daemon
    // that outlived its mount would keep its credentials.
    let calls = std::fs::read_to_string(&host.systemctl_calls).unwrap();
    assert_eq!(calls.lines().last(), Some(format!("stop {unit}").as_str()));
    assert_eq!(calls.lines().count(), 2, "{calls}");

    // A unit that fails points at the daemon's log: its start-up errors in the unit's journal, the rest in
    // the directory the driver gave it.
    let missing = pod_target(&kubelet.0, "pv-missing");
    let request = emulator_volume("pv-missing", &missing, "missing--use1-az4--x-s3", &emulator);
    let status = node.node_publish_volume(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    let hint = format!(
        "journalctl -u {} has the daemon's start-up errors and {} its log",
        unit_name_of(&missing),
        logs.join("pv-missing").display()
    );
    assert!(status.message().contains(&hint), "{status:?}");
}

/// The driver's name for the unit (and cgroup) of the mount at `target`.
fn unit_name_of(target: &Path) -> String {
    let digest = sha2::Sha256::digest(target.as_os_str().as_encoded_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("expressfs-{hex}")
}

/// A host whose systemd is older than `systemd-run --collect` and transient EnvironmentFile= (Amazon Linux 2
/// has systemd 219): the driver does not hand systemd-run a command line it refuses, but starts the daemon
/// in a cgroup of its own as on a host without systemd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_launcher_uses_a_cgroup_where_systemd_is_too_old() {
    let dir = tempfile::Builder::new()
        .prefix("expressfs-csi-oldsystemd-")
        .tempdir()
        .unwrap();
    let bucket = format!("old{}--use1-az4--x-s3", std::process::id());
    let emulator = start_emulator(dir.path(), &[&bucket]);
    let kubelet = SharedDir::new(dir.path().join("kubelet"));
    let host = StandInHost::start(dir.path(), 219);
    let host_dir = dir.path().join("host");
    let host_pid_arg = host.pid().to_string();
    let driver = Driver::start_host(dir.path(), &host_pid_arg, &host_dir);
    let mut node = NodeClient::new(driver.connect().await);
    let target = pod_target(&kubelet.0, "pv-old");
    let _cleanup = Cleanup(vec![target.clone()]);
    let request = emulator_volume("pv-old", &target, &bucket, &emulator);
    node.node_publish_volume(request).await.unwrap();
    std::fs::write(target.join("in-a-cgroup"), b"ok").unwrap();
    assert!(
        !host.recorded.exists(),
        "systemd 219's systemd-run was asked to start a unit"
    );
    let daemons = daemons_of(&target);
    assert_eq!(daemons.len(), 1, "{daemons:?}");
    let cgroups = cgroups_of(daemons[0]);
    assert!(
        cgroups
            .iter()
            .any(|c| c.contains("/expressfs-csi/expressfs-")),
        "{cgroups:?}"
    );
    node.node_unpublish_volume(unpublish_request("pv-old", &target))
        .await
        .unwrap();
    assert!(!is_mounted(&target));
    assert!(daemons_of(&target).is_empty());
    for dir in own_cgroup_dirs(true) {
        let _ = std::fs::remove_dir(dir.join("expressfs-csi"));
    }
}

/// A start that fails after the mount went live (here a launcher that mounts, then reports failure) must
/// not leave the mount behind: its daemon is killed, and a dead mount fails every access of the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_after_mounting_leaves_no_mount() {
    let dir = tempfile::Builder::new()
        .prefix("expressfs-csi-late-")
        .tempdir()
        .unwrap();
    let bucket = format!("late{}--use1-az4--x-s3", std::process::id());
    let emulator = start_emulator(dir.path(), &[&bucket]);
    let wrapper = dir.path().join("wrapper/expressfs");
    write_executable(
        &wrapper,
        format!(
            "#!/bin/sh\n'{}' \"$@\" || exit $?\necho 'failed after mounting' >&2\nexit 1\n",
            expressfs_binary().display()
        ),
    );
    let driver = Driver::start_with(
        dir.path(),
        true,
        &["--expressfs", wrapper.to_str().unwrap()],
    );
    let mut node = NodeClient::new(driver.connect().await);
    let target = pod_target(dir.path(), "pv-late");
    let _cleanup = Cleanup(vec![target.clone()]);
    let request = emulator_volume("pv-late", &target, &bucket, &emulator);
    let status = node.node_publish_volume(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        status.message().contains("failed after mounting"),
        "{status:?}"
    );
    assert!(!is_mounted(&target), "a dead mount stayed on the target");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !daemons_of(&target).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the daemon outlived its failed start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// kubelet's deadline drops the NodePublishVolume call when it passes (tonic enforces grpc-timeout); a start
/// still running then must still clean up after itself when it fails: here the pod's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_past_its_deadline_still_cleans_up() {
    let dir = tempfile::Builder::new()
        .prefix("expressfs-csi-deadline-")
        .tempdir()
        .unwrap();
    let wrapper = dir.path().join("wrapper/expressfs");
    write_executable(
        &wrapper,
        "#!/bin/sh\nsleep 2\necho 'no mount' >&2\nexit 1\n",
    );
    let host_dir = dir.path().join("host");
    let driver = Driver::start_with(
        dir.path(),
        true,
        &[
            "--expressfs",
            wrapper.to_str().unwrap(),
            "--host-directory",
            host_dir.to_str().unwrap(),
        ],
    );
    let mut node = NodeClient::new(driver.connect().await);
    let target = pod_target(dir.path(), "pv-deadline");
    let _cleanup = Cleanup(vec![target.clone()]);
    let mut request = publish_request(
        "pv-deadline",
        &target,
        Some("b--use1-az4--x-s3"),
        mount_capability(&[], "", Mode::SingleNodeWriter),
        false,
    );
    request
        .volume_context
        .insert("authenticationSource".into(), "pod".into());
    request.volume_context.insert(
        "roleArn".into(),
        "arn:aws:iam::111122223333:role/trainer".into(),
    );
    request.volume_context.insert(
        "csi.storage.k8s.io/serviceAccount.tokens".into(),
        r#"{"sts.amazonaws.com":{"token":"aGVhZA.Ym9keQ.c2ln"}}"#.into(),
    );
    let mut request = tonic::Request::new(request);
    request.set_timeout(Duration::from_millis(500));
    let status = node.node_publish_volume(request).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded),
        "{status:?}"
    );
    // The token was written (the start began) and is gone once the start has failed.
    let credentials = host_dir.join("credentials");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = std::fs::read_dir(&credentials)
            .map(|d| d.count())
            .unwrap_or(0);
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pod's token outlived a start cancelled by its deadline"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(credentials.exists(), "the start never wrote the token");
    // The target's lock is free again: an unpublish goes through.
    node.node_unpublish_volume(unpublish_request("pv-deadline", &target))
        .await
        .unwrap();
}
