//! The node's mounts and the expressfs daemons behind them. Nothing is remembered between calls:
//! /proc/self/mountinfo and /proc/PID/cmdline are the truth, so a restarted driver picks up the mounts and
//! daemons of the one before it without any state file.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// One mount from /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub target: PathBuf,
    pub fstype: String,
    pub source: String,
}

impl MountEntry {
    /// An expressfs mount: `fuse.expressfs` through fusermount3, or `fuse` with our `expressfs:` source
    /// when root mounts with mount(2) (the kernel drops the subtype there).
    pub fn is_ours(&self) -> bool {
        self.fstype == "fuse.expressfs"
            || (self.fstype.starts_with("fuse") && self.source.starts_with("expressfs:"))
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = (bytes[i] == b'\\' && i + 4 <= bytes.len())
            .then(|| std::str::from_utf8(&bytes[i + 1..i + 4]).ok())
            .flatten()
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        if let Some(v) = octal {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dash = fields.iter().position(|f| *f == "-")?;
            Some(MountEntry {
                target: PathBuf::from(unescape(fields.get(4)?)),
                fstype: fields.get(dash + 1)?.to_string(),
                source: unescape(fields.get(dash + 2)?),
            })
        })
        .collect()
}

pub fn mounts() -> Vec<MountEntry> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default()
}

/// The top mount at `target` (the last one listed wins when mounts are stacked).
pub fn mounted_at(target: &Path) -> Option<MountEntry> {
    mounts().into_iter().rev().find(|m| m.target == target)
}

/// Resolves `path` as mountinfo shows it, without touching `path` itself (a dead FUSE mount there fails
/// every stat).
pub fn resolved(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent)
            .map(|p| p.join(name))
            .unwrap_or_else(|_| path.to_path_buf()),
        _ => path.to_path_buf(),
    }
}

/// How long a mount may take to answer a stat before it counts as hung.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// What a stat of a mount point says about the daemon behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Answers,
    /// The daemon died: ENOTCONN (or another error) at once.
    Dead,
    /// No answer within `ANSWER_TIMEOUT`: a stopped or wedged daemon.
    Silent,
}

/// Stats `target` without letting a hung daemon hang the caller (and with it every CSI call, since
/// publish and unpublish share one lock).
pub async fn health(target: &Path) -> Health {
    let path = target.to_path_buf();
    let (answer, answered) = tokio::sync::oneshot::channel();
    // A thread of its own, not the runtime's blocking pool: a stat stuck in a wedged daemon returns only
    // when the mount goes away.
    std::thread::spawn(move || {
        let _ = answer.send(std::fs::metadata(&path).is_ok());
    });
    match tokio::time::timeout(ANSWER_TIMEOUT, answered).await {
        Ok(Ok(true)) => Health::Answers,
        Ok(_) => Health::Dead,
        Err(_) => Health::Silent,
    }
}

/// Live expressfs processes whose last argument is `target` (the mount point of their command line).
pub fn daemon_pids(target: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let want = target.as_os_str().as_encoded_bytes();
    let mut pids = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .collect();
        let is_expressfs = args
            .first()
            .map(|a| a.ends_with(b"/expressfs") || *a == b"expressfs")
            .unwrap_or(false);
        if is_expressfs && args.last() == Some(&want) && !is_zombie(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// A zombie has exited; only its parent's wait is missing (ours may be a container's init that never reaps).
fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// Runs `command` (expressfs without --foreground, or a launcher of it that waits as long) to its exit.
/// expressfs forks a daemon into its own session and exits 0 once the mount is live, so the daemon is no
/// child of ours and survives a restart of the driver. Its stderr becomes the error otherwise; killed if
/// it takes longer than 120 s.
pub async fn run_until_mounted(
    mut command: tokio::process::Command,
    what: &str,
) -> Result<(), String> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command
        .spawn()
        .map_err(|e| format!("starting {what}: {e}"))?;
    let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .map_err(|_| format!("{what} did not report a live mount within 120 s"))?
        .map_err(|e| format!("waiting for {what}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(format!(
            "{what} failed ({}): {}",
            output.status,
            stderr.trim()
        ))
    }
}

/// Unmounts `target` and waits until every daemon that served it has exited, so no daemon is left behind
/// holding credentials and cache space. A daemon that ignores the unmount is terminated.
pub async fn unmount(target: &Path) -> Result<(), String> {
    let pids = daemon_pids(target);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut wedged = false;
    while mounted_at(target).is_some() {
        let health = health(target).await;
        wedged |= health == Health::Silent;
        let flags = if health == Health::Answers {
            nix::mount::MntFlags::empty()
        } else {
            // Nobody answers behind a dead or wedged mount; only a lazy detach takes it away.
            nix::mount::MntFlags::MNT_DETACH
        };
        match nix::mount::umount2(target, flags) {
            Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
            Err(nix::errno::Errno::EBUSY) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(format!("unmount {}: {e}", target.display())),
        }
    }
    // A daemon that answered finishes its uploads and exits by itself; a wedged one will not.
    let grace = if wedged { 2 } else { 30 };
    wait_gone(&pids, Duration::from_secs(grace)).await;
    let left: Vec<i32> = pids.iter().copied().filter(|p| !is_zombie(*p)).collect();
    if !left.is_empty() {
        for pid in &left {
            let pid = nix::unistd::Pid::from_raw(*pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            // A stopped daemon would keep the TERM pending forever.
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        }
        wait_gone(&left, Duration::from_secs(10)).await;
        if left.iter().any(|p| !is_zombie(*p)) {
            return Err(format!(
                "expressfs daemons {left:?} of {} did not exit",
                target.display()
            ));
        }
    }
    Ok(())
}

async fn wait_gone(pids: &[i32], limit: Duration) {
    let deadline = Instant::now() + limit;
    while pids.iter().any(|p| !is_zombie(*p)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_mounts_from_mountinfo() {
        let text = "\
36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
90 26 0:52 / /var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/pv\\040a/mount rw,nosuid,nodev - fuse expressfs:data--use1-az4--x-s3 rw,user_id=0
91 26 0:53 / /mnt/user rw - fuse.expressfs expressfs:b/train rw
92 26 0:54 / /mnt/other rw - fuse.sshfs host:/x rw
";
        let entries = parse_mountinfo(text);
        assert_eq!(entries.len(), 4);
        assert_eq!(
            entries[1].target,
            Path::new("/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/pv a/mount")
        );
        let ours: Vec<bool> = entries.iter().map(MountEntry::is_ours).collect();
        assert_eq!(ours, [false, true, true, false]);
        assert_eq!(entries[2].source, "expressfs:b/train");
    }
}
