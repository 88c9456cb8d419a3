//! One cgroup per mount, made in every cgroup hierarchy the host has mounted, next to the host process's own
//! cgroup. A container runtime stops a container by killing every process in the container's cgroups
//! (with hostPID there is no PID namespace to tear down), so a daemon that moved out of them before it
//! forked is not among them. Paths are reached through /proc/HOST/root, so the driver needs no hostPath
//! mount of /sys/fs/cgroup.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Parent of the per-mount cgroups, under the host process's cgroup.
const GROUP: &str = "expressfs-csi";

/// One mounted hierarchy: where it is mounted on the host, the mount's own root inside the hierarchy,
/// and whether it is v2 or which v1 controllers (or `name=`) it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub mount_point: PathBuf,
    pub mount_root: String,
    /// None for cgroup2.
    pub controllers: Option<Vec<String>>,
}

/// The cgroup hierarchies in a mountinfo text (the host process's, so the mount points are host paths).
pub fn hierarchies(mountinfo: &str) -> Vec<Hierarchy> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(root), Some(mount_point), Some(fstype), Some(options)) = (
            fields.get(3),
            fields.get(4),
            fields.get(dash + 1),
            fields.get(dash + 3),
        ) else {
            continue;
        };
        let controllers = match *fstype {
            "cgroup2" => None,
            "cgroup" => Some(
                options
                    .split(',')
                    .filter(|o| !matches!(*o, "rw" | "ro") && !o.contains("release_agent"))
                    .map(str::to_string)
                    .collect(),
            ),
            _ => continue,
        };
        // The same hierarchy mounted twice (bind mounts) needs one cgroup only.
        if out.iter().any(|h: &Hierarchy| h.controllers == controllers) {
            continue;
        }
        out.push(Hierarchy {
            mount_point: PathBuf::from(mount_point),
            mount_root: root.to_string(),
            controllers,
        });
    }
    out
}

/// The host process's cgroup in `hierarchy`, from its /proc/PID/cgroup text, relative to the mount.
/// A path we cannot place (another cgroup namespace shows `/..`) falls back to the hierarchy's root.
pub fn own_cgroup(proc_cgroup: &str, hierarchy: &Hierarchy) -> PathBuf {
    let path = proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, list, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = match &hierarchy.controllers {
            None => list.is_empty(),
            Some(controllers) => {
                !list.is_empty() && list.split(',').all(|c| controllers.iter().any(|o| o == c))
            }
        };
        matches.then(|| path.to_string())
    });
    let path = path.unwrap_or_default();
    if path.contains("/..") || !path.starts_with('/') {
        return PathBuf::new();
    }
    let relative = if hierarchy.mount_root == "/" {
        Some(path.as_str())
    } else {
        path.strip_prefix(hierarchy.mount_root.as_str())
    };
    PathBuf::from(relative.unwrap_or("").trim_start_matches('/'))
}

/// A mount's cgroup in every hierarchy, as paths the driver can open (through /proc/HOST/root).
#[derive(Debug, Clone)]
pub struct MountCgroup {
    pub dirs: Vec<PathBuf>,
}

impl MountCgroup {
    /// Where the cgroup named `unit` lives for the process at `host_proc` (e.g. /proc/1).
    pub fn locate(host_proc: &Path, unit: &str) -> Result<MountCgroup, String> {
        let read = |name: &str| {
            std::fs::read_to_string(host_proc.join(name))
                .map_err(|e| format!("reading {}/{name}: {e}", host_proc.display()))
        };
        let (mountinfo, cgroup) = (read("mountinfo")?, read("cgroup")?);
        let root = host_proc.join("root");
        let dirs: Vec<PathBuf> = hierarchies(&mountinfo)
            .iter()
            .map(|h| {
                let mount = root.join(h.mount_point.strip_prefix("/").unwrap_or(&h.mount_point));
                mount.join(own_cgroup(&cgroup, h)).join(GROUP).join(unit)
            })
            .collect();
        if dirs.is_empty() {
            return Err(format!(
                "no cgroup file system is mounted for {}",
                host_proc.display()
            ));
        }
        Ok(MountCgroup { dirs })
    }

    /// Makes the cgroup in every hierarchy; v1 cpuset cgroups start with no CPUs and get their parent's.
    pub fn create(&self) -> Result<(), String> {
        for dir in &self.dirs {
            for level in [dir.parent().unwrap_or(dir), dir.as_path()] {
                match std::fs::create_dir(level) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(format!("creating cgroup {}: {e}", level.display())),
                }
                // Also when it was there: the shared parent may be one another mount's start has just made
                // and not filled in yet.
                inherit_cpuset(level)?;
            }
        }
        Ok(())
    }

    /// The `cgroup.procs` files, to be written by the child that joins.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Processes in the cgroup, in any hierarchy.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .procs_files()
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok())
            .flat_map(|t| procs_pids(&t))
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Kills whatever is left in the cgroup and removes it. Used after a failed start and after an unmount
    /// (the daemon has exited by then; anything still there is an orphan).
    pub async fn destroy(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "processes {pids:?} survive SIGKILL in {:?}",
                    self.dirs
                ));
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for dir in &self.dirs {
            // Another process of a dying daemon can hold it a moment longer.
            let mut tries = 0;
            loop {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) if tries < 50 => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => return Err(format!("removing cgroup {}: {e}", dir.display())),
                }
            }
        }
        Ok(())
    }
}

/// The PIDs in a `cgroup.procs` text. cgroup2 lists a process outside the reader's PID namespace as 0, and
/// kill(0) would signal the driver's own process group: only positive PIDs.
fn procs_pids(text: &str) -> Vec<i32> {
    text.lines()
        .filter_map(|l| l.trim().parse().ok())
        .filter(|pid| *pid > 0)
        .collect()
}

fn inherit_cpuset(dir: &Path) -> Result<(), String> {
    for name in ["cpuset.cpus", "cpuset.mems"] {
        let file = dir.join(name);
        let Ok(current) = std::fs::read_to_string(&file) else {
            return Ok(()); // not a v1 cpuset hierarchy
        };
        if !current.trim().is_empty() {
            continue;
        }
        let parent = dir.parent().unwrap_or(dir).join(name);
        let value = std::fs::read_to_string(&parent)
            .map_err(|e| format!("reading {}: {e}", parent.display()))?;
        std::fs::write(&file, value.trim())
            .map_err(|e| format!("writing {}: {e}", file.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
30 1 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
32 30 0:28 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset
33 30 0:29 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
34 30 0:30 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
35 1 0:28 /kubepods /mnt/cpuset rw - cgroup cgroup rw,cpuset
";

    #[test]
    fn finds_every_hierarchy_once() {
        let h = hierarchies(MOUNTINFO);
        let points: Vec<&Path> = h.iter().map(|h| h.mount_point.as_path()).collect();
        assert_eq!(
            points,
            [
                "/sys/fs/cgroup/cpu,cpuacct",
                "/sys/fs/cgroup/cpuset",
                "/sys/fs/cgroup/systemd",
                "/sys/fs/cgroup/unified"
            ]
            .map(Path::new)
        );
        assert_eq!(h[3].controllers, None);
        assert_eq!(
            h[2].controllers.as_deref(),
            Some(&["xattr".to_string(), "name=systemd".to_string()][..])
        );
    }

    #[test]
    fn procs_lists_only_processes_we_can_signal() {
        assert_eq!(procs_pids("12\n0\n345\n\n-1\nx\n"), [12, 345]);
    }

    #[test]
    fn places_the_group_under_the_host_process_cgroup() {
        let h = hierarchies(MOUNTINFO);
        let cgroup =
            "5:cpu,cpuacct:/system\n4:cpuset:/\n3:name=systemd:/init.scope\n0::/init.scope\n";
        let own: Vec<PathBuf> = h.iter().map(|h| own_cgroup(cgroup, h)).collect();
        assert_eq!(
            own,
            ["system", "", "init.scope", "init.scope"].map(PathBuf::from)
        );
        // Seen from another cgroup namespace the path is unusable: the hierarchy's root instead.
        assert_eq!(own_cgroup("0::/../../x\n", &h[3]), PathBuf::new());
        // A mount of a sub-tree: paths are relative to its root.
        let sub = Hierarchy {
            mount_point: "/mnt/cpuset".into(),
            mount_root: "/kubepods".into(),
            controllers: Some(vec!["cpuset".into()]),
        };
        assert_eq!(
            own_cgroup("4:cpuset:/kubepods/a\n", &sub),
            PathBuf::from("a")
        );
    }
}
