//! Where the expressfs daemons run.
//!
//! `direct`: expressfs is started by the driver and detaches into its own session. It outlives the driver
//! process, but not the driver's container: stopping a container kills every process in its PID namespace
//! or, with hostPID, in its cgroups. Good for tests and a driver run by hand.
//!
//! `host` (the DaemonSet's): the daemon belongs to the host, not to the container. The driver copies its
//! expressfs binary into a host directory (named by content hash, so a rollout never overwrites a binary
//! that running daemons use), then starts it in the namespaces of the host process (PID 1; the DaemonSet has
//! hostPID) and outside the container's cgroups: as a transient systemd unit when the host runs systemd,
//! else in a cgroup of its own made next to the host process's.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::hostcgroup::MountCgroup;
use crate::hostfiles::{
    TokenCopy, collect_old_binaries, hex, install, through_root, write_new_private, write_private,
};
use crate::mounts;
use crate::podauth::PodCredentials;

/// Namespaces a host daemon joins, in order: the cgroup namespace before the cgroup move (the move is
/// judged from the writer's cgroup namespace), the mount namespace last (paths change with it).
const NAMESPACES: &[&str] = &["cgroup", "ipc", "uts", "net", "pid", "mnt"];

/// The inode of the kernel's first PID namespace (PROC_PID_INIT_INO), the host's on a real node.
const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// The oldest systemd whose systemd-run takes our command line: `--collect` (CollectMode=) came with 236,
/// EnvironmentFile= for transient units with 228. Amazon Linux 2 has 219: there daemons get a cgroup of
/// their own instead.
pub const MIN_SYSTEMD: u32 = 236;

/// The version in `systemd-run --version`'s first line: "systemd 252 (252.22-1~deb12u1)".
pub fn systemd_version(output: &str) -> Option<u32> {
    output
        .lines()
        .next()?
        .strip_prefix("systemd ")?
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

pub enum Launcher {
    /// `directory` holds the pods' tokens (`authenticationSource: pod`).
    Direct {
        directory: PathBuf,
    },
    Host(HostLauncher),
}

/// Changes to a daemon's environment on top of the driver's: variables to drop, then to set.
#[derive(Default)]
pub struct EnvChanges {
    remove: &'static [&'static str],
    set: Vec<(String, String)>,
}

impl EnvChanges {
    fn apply(&self, command: &mut tokio::process::Command) {
        for name in self.remove {
            command.env_remove(name);
        }
        command.envs(self.set.iter().cloned());
    }

    fn apply_to(&self, env: &mut BTreeMap<String, String>) {
        for name in self.remove {
            env.remove(*name);
        }
        env.extend(self.set.iter().cloned());
    }
}

pub struct HostLauncher {
    /// /proc/PID of the process whose namespaces are the host's (PID 1 with hostPID).
    host_proc: PathBuf,
    /// The installed expressfs as the host sees it.
    binary: PathBuf,
    /// Host directory for the environment files handed to systemd.
    state_dir: PathBuf,
    /// The host's systemd-run, when the host runs systemd.
    systemd_run: Option<PathBuf>,
    /// `--host-directory`, a host path.
    host_dir: PathBuf,
    /// The driver's own credential tokens (IRSA, Pod Identity), copied where host daemons can read them.
    tokens: Vec<TokenCopy>,
}

/// The unit and cgroup name of the mount at `target`: one per target path, stable across drivers.
pub fn unit_name(target: &Path) -> String {
    let digest = Sha256::digest(target.as_os_str().as_encoded_bytes());
    format!("expressfs-{}", &hex(&digest)[..16])
}

/// The driver's environment a daemon needs: AWS settings, logging and proxies. systemd starts units with
/// an empty environment, so these go into the unit's EnvironmentFile.
pub fn daemon_environment(
    vars: impl Iterator<Item = (OsString, OsString)>,
) -> BTreeMap<String, String> {
    const NAMES: &[&str] = &[
        "RUST_LOG",
        "RUST_BACKTRACE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
    ];
    vars.filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, v)| {
            (k.starts_with("AWS_") || NAMES.contains(&k.to_ascii_uppercase().as_str()))
                && !v.contains('\n')
        })
        .collect()
}

/// An EnvironmentFile: double-quoted values, with the characters systemd unescapes escaped.
pub fn environment_file(vars: &BTreeMap<String, String>) -> String {
    vars.iter()
        .map(|(k, v)| {
            let mut quoted = String::new();
            for c in v.chars() {
                if matches!(c, '\\' | '"' | '$' | '`') {
                    quoted.push('\\');
                }
                quoted.push(c);
            }
            format!("{k}=\"{quoted}\"\n")
        })
        .collect()
}

/// How long systemd gives a unit to stop: SIGTERM makes the daemon unmount and finish the uploads of closed
/// files, for at most 45 s (FINISH_AFTER_UNMOUNT, src/daemon.rs), before SIGKILL would cut them short.
const UNIT_STOP_TIMEOUT: u32 = 60;

/// The systemd-run command line that starts expressfs as unit `unit`. Type=forking: systemd-run returns
/// once expressfs's first process has exited, i.e. once the mount is live, with its exit status; the
/// daemon it forked stays in the unit's cgroup, and --collect drops the unit when it exits or fails.
/// Ordered after network-online.target, so that at shutdown, which stops units in the reverse order, the
/// daemon's uploads go out before the network does.
pub fn systemd_run_args(
    unit: &str,
    target: &Path,
    env_file: &Path,
    binary: &Path,
    args: &[String],
) -> Vec<String> {
    let mut argv = vec![
        format!("--unit={unit}"),
        format!("--description=expressfs mount at {}", target.display()),
        "--collect".into(),
        "--quiet".into(),
        "--property=Type=forking".into(),
        "--property=TimeoutStartSec=120".into(),
        format!("--property=TimeoutStopSec={UNIT_STOP_TIMEOUT}"),
        "--property=Wants=network-online.target".into(),
        "--property=After=network-online.target".into(),
        format!("--property=EnvironmentFile={}", env_file.display()),
        "--".into(),
    ];
    // The service manager expands `$NAME` and `${NAME}` in a unit's command line, and an S3 prefix, a bucket
    // option or a path may hold a `$`: each is written `$$`, which it turns back into one `$`.
    let command =
        std::iter::once(binary.to_string_lossy().into_owned()).chain(args.iter().cloned());
    argv.extend(command.map(|a| a.replace('$', "$$")));
    argv
}

/// Where the log of a unit's daemon is. What goes wrong before the daemon runs (its first process's stderr)
/// is in the unit's journal; once it runs, it logs to the files of its `--log-directory` when it has one
/// (the driver's `--daemon-log-directory`), else to syslog, which the journal files under the unit as well.
fn log_hint(unit: &str, args: &[String]) -> String {
    let directory = args
        .iter()
        .position(|a| a == "--log-directory")
        .and_then(|at| args.get(at + 1));
    match directory {
        Some(dir) => format!(
            "on the node, journalctl -u {unit} has the daemon's start-up errors and {dir} its log"
        ),
        None => format!("on the node, journalctl -u {unit} has the daemon's log"),
    }
}

/// Opens the host process's namespaces, to be joined by a child before it execs.
fn namespace_fds(host_proc: &Path) -> Result<Vec<OwnedFd>, String> {
    NAMESPACES
        .iter()
        .map(|ns| {
            let path = host_proc.join("ns").join(ns);
            std::fs::File::open(&path).map(OwnedFd::from).map_err(|e| {
                format!(
                    "opening {}: {e} (the driver needs hostPID and privileges)",
                    path.display()
                )
            })
        })
        .collect()
}

/// Makes `command`'s child join `namespaces` and write itself into `cgroup_procs` (after the cgroup
/// namespace, before the others) between fork and exec, where the child is single-threaded as
/// setns(CLONE_NEWNS) needs. The first process of expressfs does not serve the mount: the daemon it
/// forks does, and it is born in the host's PID namespace and in our cgroup.
fn enter_host(
    command: &mut tokio::process::Command,
    namespaces: &[OwnedFd],
    cgroup_procs: &[OwnedFd],
) {
    let namespaces: Vec<RawFd> = namespaces.iter().map(AsRawFd::as_raw_fd).collect();
    let procs: Vec<RawFd> = cgroup_procs.iter().map(AsRawFd::as_raw_fd).collect();
    // SAFETY: the closure only makes system calls on descriptors the parent keeps open until the child
    // has exec'd; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            for (i, fd) in namespaces.iter().enumerate() {
                if libc::setns(*fd, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if i == 0 {
                    for procs_fd in &procs {
                        if libc::write(*procs_fd, b"0".as_ptr().cast(), 1) != 1 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                }
            }
            Ok(())
        });
    }
}

/// Removes the environment files a driver that died while starting a unit left in `dir` (the driver's
/// credentials, in files no unit will read): one driver runs per node, so none is being read now.
fn remove_environment_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("expressfs-") && name.ends_with(".env")) {
            continue;
        }
        if let Err(e) = std::fs::remove_file(entry.path()) {
            tracing::warn!(file = %entry.path().display(), "removing a stale environment file: {e}");
        }
    }
}

/// The version of the host's systemd-run, run in the host's namespaces; None when it does not say.
async fn host_systemd_version(host_proc: &Path, systemd_run: &Path) -> Option<u32> {
    let namespaces = namespace_fds(host_proc).ok()?;
    let mut command = tokio::process::Command::new(systemd_run);
    command
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    enter_host(&mut command, &namespaces, &[]);
    let output = tokio::time::timeout(std::time::Duration::from_secs(30), command.output())
        .await
        .ok()?
        .ok()?;
    systemd_version(&String::from_utf8_lossy(&output.stdout))
}

impl HostLauncher {
    /// Installs `bundled` into `host_dir` on the host of process `host_pid` and finds out how to start
    /// daemons there.
    pub async fn new(
        host_pid: u32,
        host_dir: &Path,
        bundled: &Path,
    ) -> Result<HostLauncher, String> {
        // Without hostPID the driver's PID namespace is the pod's: PID 1 is the driver itself (or the pod's
        // pause process), and daemons "on the host" would be in the pod after all.
        if host_pid == std::process::id() {
            return Err(format!(
                "--launcher host: PID {host_pid} is this driver, so it runs in a PID namespace of its \
                 own; the DaemonSet needs hostPID: true"
            ));
        }
        let host_proc = PathBuf::from(format!("/proc/{host_pid}"));
        namespace_fds(&host_proc)?;
        let initial = std::fs::metadata(host_proc.join("ns/pid")).map(|m| m.ino());
        if initial.ok() != Some(INITIAL_PID_NAMESPACE) {
            tracing::warn!(
                host_pid,
                "the host process is not in the kernel's initial PID namespace: unless the node itself \
                 is a container (kind), the DaemonSet lacks hostPID and daemons die with the pod"
            );
        }
        let binary = install(bundled, &host_proc, host_dir)?;
        collect_old_binaries(&host_proc, host_dir, &binary);
        let state_dir = host_dir.join("run");
        remove_environment_files(&through_root(&host_proc, &state_dir));
        // systemd's own test for "booted with systemd" (sd_booted), plus its client.
        let booted = through_root(&host_proc, Path::new("/run/systemd/system")).is_dir();
        let candidate = ["/usr/bin/systemd-run", "/bin/systemd-run"]
            .iter()
            .map(PathBuf::from)
            .find(|p| booted && through_root(&host_proc, p).is_file());
        let systemd_run = match candidate {
            Some(path) => match host_systemd_version(&host_proc, &path).await {
                Some(version) if version >= MIN_SYSTEMD => Some(path),
                version => {
                    tracing::warn!(
                        ?version,
                        "the host's systemd-run predates systemd {MIN_SYSTEMD} (--collect, \
                         EnvironmentFile=): daemons get a cgroup of their own instead of a unit"
                    );
                    None
                }
            },
            None => None,
        };
        let tokens: Vec<TokenCopy> = [
            ("AWS_WEB_IDENTITY_TOKEN_FILE", "web-identity-token"),
            (
                "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
                "pod-identity-token",
            ),
        ]
        .into_iter()
        .filter_map(|(variable, name)| {
            let source = std::env::var_os(variable)?;
            let copy = host_dir.join("credentials/driver").join(name);
            Some(TokenCopy {
                variable,
                source: PathBuf::from(source),
                reachable: through_root(&host_proc, &copy),
                copy,
            })
        })
        .collect();
        for token in &tokens {
            token.refresh()?;
        }
        Ok(HostLauncher {
            host_proc,
            binary,
            state_dir,
            systemd_run,
            host_dir: host_dir.to_path_buf(),
            tokens,
        })
    }

    /// Copies the driver's tokens again when called (kubelet rotates them; an expired one is refused).
    pub fn token_refresher(&self) -> impl Fn() -> Result<(), String> + Send + 'static {
        let tokens = self.tokens.clone();
        move || tokens.iter().try_for_each(TokenCopy::refresh)
    }

    /// What a daemon's environment needs beyond the driver's own.
    fn environment(&self) -> BTreeMap<String, String> {
        let mut env = daemon_environment(std::env::vars_os());
        for token in &self.tokens {
            env.insert(
                token.variable.into(),
                token.copy.to_string_lossy().into_owned(),
            );
        }
        env
    }

    pub fn uses_systemd(&self) -> bool {
        self.systemd_run.is_some()
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    async fn start(
        &self,
        args: &[String],
        target: &Path,
        changes: &EnvChanges,
    ) -> Result<(), String> {
        let unit = unit_name(target);
        match &self.systemd_run {
            Some(systemd_run) => {
                self.start_unit(systemd_run, &unit, args, target, changes)
                    .await
            }
            None => self.start_in_cgroup(&unit, args, changes).await,
        }
    }

    async fn start_unit(
        &self,
        systemd_run: &Path,
        unit: &str,
        args: &[String],
        target: &Path,
        changes: &EnvChanges,
    ) -> Result<(), String> {
        // A unit of that name is stale (its mount is not live, or we would not be here): without this,
        // systemd-run would refuse the name.
        self.systemctl(systemd_run, &["stop", unit]).await;
        // Everything that can fail before systemd-run comes before the credentials file.
        let namespaces = namespace_fds(&self.host_proc)?;
        let mut env = self.environment();
        changes.apply_to(&mut env);
        let env_file = self.state_dir.join(format!("{unit}.env"));
        let reachable = through_root(&self.host_proc, &env_file);
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(reachable.parent().unwrap_or(&reachable))?;
            write_new_private(&reachable, environment_file(&env).as_bytes())
        };
        write().map_err(|e| format!("writing {}: {e}", reachable.display()))?;
        let mut command = tokio::process::Command::new(systemd_run);
        command.args(systemd_run_args(
            unit,
            target,
            &env_file,
            &self.binary,
            args,
        ));
        enter_host(&mut command, &namespaces, &[]);
        let started = mounts::run_until_mounted(command, "systemd-run").await;
        // systemd read the file when it started the unit; no credentials stay on the host's disk.
        let _ = std::fs::remove_file(&reachable);
        if let Err(e) = started {
            // A unit still starting (our timeout) is stopped; a failed one was collected already.
            self.systemctl(systemd_run, &["stop", unit]).await;
            return Err(format!("{e} ({})", log_hint(unit, args)));
        }
        Ok(())
    }

    /// Runs the host's systemctl (next to its systemd-run) in the host's namespaces; best effort.
    async fn systemctl(&self, systemd_run: &Path, args: &[&str]) {
        let Ok(namespaces) = namespace_fds(&self.host_proc) else {
            return;
        };
        let mut command = tokio::process::Command::new(systemd_run.with_file_name("systemctl"));
        command
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        enter_host(&mut command, &namespaces, &[]);
        match tokio::time::timeout(std::time::Duration::from_secs(30), command.status()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(?args, "systemctl: {e}"),
            Err(_) => tracing::warn!(?args, "systemctl did not finish within 30 s"),
        }
    }

    async fn start_in_cgroup(
        &self,
        unit: &str,
        args: &[String],
        changes: &EnvChanges,
    ) -> Result<(), String> {
        let cgroup = MountCgroup::locate(&self.host_proc, unit)?;
        // Left over from a daemon that died without its mount: nothing there serves anyone.
        cgroup.destroy().await?;
        cgroup.create()?;
        let opened: Result<Vec<OwnedFd>, String> = cgroup
            .procs_files()
            .iter()
            .map(|f| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(f)
                    .map(OwnedFd::from)
                    .map_err(|e| format!("opening {}: {e}", f.display()))
            })
            .collect();
        let started = match (opened, namespace_fds(&self.host_proc)) {
            (Ok(procs), Ok(namespaces)) => {
                let mut command = tokio::process::Command::new(&self.binary);
                command.args(args).envs(self.environment());
                changes.apply(&mut command);
                enter_host(&mut command, &namespaces, &procs);
                mounts::run_until_mounted(command, "expressfs").await
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        if started.is_err() {
            // Whatever the failed start left running (a daemon that forked, then lost its mount) goes.
            if let Err(e) = cgroup.destroy().await {
                tracing::warn!(unit, "cleaning up after a failed start: {e}");
            }
        }
        started
    }

    /// After an unmount: the daemon has exited; anything left in the mount's cgroup is killed with it.
    async fn forget(&self, target: &Path) -> Result<(), String> {
        if let Some(systemd_run) = &self.systemd_run {
            // systemd collects the unit when its daemon exits; one still running here outlived its mount
            // (detached under it) and would keep its credentials: stop it, as the cgroup path kills it.
            self.systemctl(systemd_run, &["stop", &unit_name(target)])
                .await;
            return Ok(());
        }
        MountCgroup::locate(&self.host_proc, &unit_name(target))?
            .destroy()
            .await
    }
}

impl Launcher {
    /// Starts expressfs with `args` (ending in BUCKET TARGET) and returns once the mount at `target` is
    /// live; with `pod`, on the pod's credentials instead of the driver's. On failure nothing it started
    /// is left running.
    pub async fn start(
        &self,
        bundled: &Path,
        args: &[String],
        target: &Path,
        pod: Option<&PodCredentials>,
    ) -> Result<(), String> {
        let changes = match pod {
            Some(credentials) => {
                let token_file = self.write_pod_token(target, credentials)?;
                let (remove, set) = credentials.environment(&token_file);
                EnvChanges { remove, set }
            }
            None => EnvChanges::default(),
        };
        let result = match self {
            Launcher::Direct { .. } => {
                let mut command = tokio::process::Command::new(bundled);
                command.args(args);
                changes.apply(&mut command);
                let result = mounts::run_until_mounted(command, "expressfs").await;
                if result.is_err() {
                    for pid in mounts::daemon_pids(target) {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
                result
            }
            Launcher::Host(host) => host.start(args, target, &changes).await,
        };
        if result.is_err() {
            self.remove_credentials(target);
            // The start may have failed after the mount went live (a timeout, a launcher that reports
            // failure late); its daemon is killed by now, and a dead mount left on the target would fail
            // every access of the pod, with no unpublish to come after a final error.
            if mounts::mounted_at(target).is_some_and(|m| m.is_ours())
                && let Err(e) = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH)
            {
                tracing::warn!(target = %target.display(), "detaching after a failed start: {e}");
            }
        }
        result
    }

    /// Called once `target` is unmounted (or was not mounted): releases what the launcher kept for it.
    pub async fn forget(&self, target: &Path) -> Result<(), String> {
        self.remove_credentials(target);
        match self {
            Launcher::Direct { .. } => Ok(()),
            Launcher::Host(host) => host.forget(target).await,
        }
    }

    /// The directory of the mount's pod token: as the daemon sees it, and as the driver reaches it.
    fn credentials_dir(&self, target: &Path) -> (PathBuf, PathBuf) {
        let relative = Path::new("credentials").join(unit_name(target));
        match self {
            Launcher::Direct { directory } => {
                let dir = directory.join(relative);
                (dir.clone(), dir)
            }
            Launcher::Host(host) => {
                let dir = host.host_dir.join(relative);
                (dir.clone(), through_root(&host.host_proc, &dir))
            }
        }
    }

    /// Writes the pod's token for the mount at `target` (also on a republish, which brings a fresh one
    /// before the old expires) and returns the file's path as the daemon sees it.
    pub fn write_pod_token(
        &self,
        target: &Path,
        credentials: &PodCredentials,
    ) -> Result<PathBuf, String> {
        let (dir, reachable) = self.credentials_dir(target);
        let name = "web-identity-token";
        write_private(&reachable.join(name), credentials.token.as_bytes())
            .map_err(|e| format!("writing the pod's token in {}: {e}", reachable.display()))?;
        Ok(dir.join(name))
    }

    fn remove_credentials(&self, target: &Path) {
        let (_, reachable) = self.credentials_dir(target);
        match std::fs::remove_dir_all(&reachable) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(dir = %reachable.display(), "removing a pod token: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_unit_command_line() {
        let target = Path::new("/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv/mount");
        let unit = unit_name(target);
        assert!(unit.starts_with("expressfs-") && unit.len() == "expressfs-".len() + 16);
        assert_ne!(unit, unit_name(Path::new("/other")));
        let argv = systemd_run_args(
            &unit,
            target,
            Path::new("/var/lib/expressfs-csi/run/u.env"),
            Path::new("/var/lib/expressfs-csi/bin/0123456789abcdef/expressfs"),
            &[
                "--read-only".into(),
                "b".into(),
                target.to_string_lossy().into(),
            ],
        );
        assert_eq!(argv[0], format!("--unit={unit}"));
        assert!(argv.contains(&"--collect".to_string()));
        assert!(argv.contains(&"--property=Type=forking".to_string()));
        // Stopped before the network at shutdown, with the time the daemon's last uploads take.
        for property in [
            "After=network-online.target",
            "Wants=network-online.target",
            "TimeoutStopSec=60",
        ] {
            let want = format!("--property={property}");
            assert!(argv.contains(&want), "{want} missing: {argv:?}");
        }
        assert!(
            argv.contains(
                &"--property=EnvironmentFile=/var/lib/expressfs-csi/run/u.env".to_string()
            )
        );
        let dashes = argv.iter().position(|a| a == "--").unwrap();
        assert_eq!(
            argv[dashes + 1..],
            [
                "/var/lib/expressfs-csi/bin/0123456789abcdef/expressfs",
                "--read-only",
                "b",
                target.to_str().unwrap()
            ]
        );
    }

    #[test]
    fn dollars_reach_expressfs_unexpanded() {
        let argv = systemd_run_args(
            "expressfs-0",
            Path::new("/mnt/$HOME"),
            Path::new("/run/u.env"),
            Path::new("/bin/expressfs"),
            &["--prefix=data${x}/$y/".into(), "/mnt/$HOME".into()],
        );
        let dashes = argv.iter().position(|a| a == "--").unwrap();
        assert_eq!(
            argv[dashes + 1..],
            ["/bin/expressfs", "--prefix=data$${x}/$$y/", "/mnt/$$HOME"]
        );
    }

    #[test]
    fn failures_of_a_unit_point_at_the_daemon_log() {
        let args = |extra: &[&str]| -> Vec<String> {
            extra
                .iter()
                .chain(&["--read-only", "b", "/mnt/t"])
                .map(|a| a.to_string())
                .collect()
        };
        assert_eq!(
            log_hint("expressfs-0", &args(&[])),
            "on the node, journalctl -u expressfs-0 has the daemon's log"
        );
        assert_eq!(
            log_hint(
                "expressfs-0",
                &args(&["--log-directory", "/var/log/expressfs/pv-1"])
            ),
            "on the node, journalctl -u expressfs-0 has the daemon's start-up errors and \
             /var/log/expressfs/pv-1 its log"
        );
    }

    #[test]
    fn systemd_versions() {
        assert_eq!(
            systemd_version("systemd 252 (252.22-1~deb12u1)\n+PAM +AUDIT\n"),
            Some(252)
        );
        assert_eq!(systemd_version("systemd 219\n+PAM +AUDIT\n"), Some(219));
        assert_eq!(systemd_version("systemd 256~rc1 (256~rc1)\n"), Some(256));
        assert_eq!(systemd_version(""), None);
        assert_eq!(systemd_version("usage: systemd-run ...\n"), None);
        assert!(systemd_version("systemd 219").unwrap() < MIN_SYSTEMD);
    }

    #[test]
    fn unit_environment_keeps_aws_and_proxies_only() {
        let vars = [
            ("AWS_REGION", "us-east-1"),
            ("AWS_SECRET_ACCESS_KEY", "a\"b$c\\d"),
            ("https_proxy", "http://proxy:3128"),
            ("HOME", "/root"),
            ("AWS_BAD", "two\nlines"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let env = daemon_environment(vars.into_iter());
        assert_eq!(
            env.keys().collect::<Vec<_>>(),
            ["AWS_REGION", "AWS_SECRET_ACCESS_KEY", "https_proxy"]
        );
        assert_eq!(
            environment_file(&env),
            "AWS_REGION=\"us-east-1\"\nAWS_SECRET_ACCESS_KEY=\"a\\\"b\\$c\\\\d\"\nhttps_proxy=\"http://proxy:3128\"\n"
        );
    }
}
