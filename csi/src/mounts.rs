//! The node's mounts and the expressfs daemons behind them. /proc/self/mountinfo and /proc/PID/cmdline are
//! the truth, so a restarted driver picks up the mounts and daemons of the one before it without any state
//! file. The one thing remembered between calls is when a mount went while its daemon still ran
//! ([`Departures`]), and a driver without that memory counts from when it first looks.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::mount::MntFlags;
use nix::sys::signal::Signal;

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

/// A stat of a mount point that has not answered yet.
#[derive(Clone)]
struct Probe {
    started: Instant,
    answer: tokio::sync::watch::Receiver<Option<bool>>,
}

/// The probes in flight, by target. A stat stuck in a wedged daemon returns only when the mount goes away:
/// later probes of the target wait for that one instead of leaving a stuck thread each.
static PROBES: std::sync::Mutex<BTreeMap<PathBuf, Probe>> = std::sync::Mutex::new(BTreeMap::new());

fn probes() -> std::sync::MutexGuard<'static, BTreeMap<PathBuf, Probe>> {
    PROBES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Stats `target` without letting a hung daemon hang the caller (and with it every later call for the
/// target).
pub async fn health(target: &Path) -> Health {
    let probe = {
        let mut in_flight = probes();
        match in_flight.get(target) {
            Some(probe) => probe.clone(),
            None => {
                let (answer, answered) = tokio::sync::watch::channel(None);
                let path = target.to_path_buf();
                // A thread of its own, not the runtime's blocking pool, which a stuck stat would keep. It
                // takes its entry out (before it answers, so a later probe stats again rather than take an
                // old answer) only once this call has put it in and let go of the map.
                std::thread::Builder::new()
                    .name("expressfs-probe".into())
                    .spawn(move || {
                        let answers = std::fs::metadata(&path).is_ok();
                        probes().remove(&path);
                        let _ = answer.send(Some(answers));
                    })
                    .expect("starting a probe thread");
                let probe = Probe {
                    started: Instant::now(),
                    answer: answered,
                };
                in_flight.insert(target.to_path_buf(), probe.clone());
                probe
            }
        }
    };
    // A probe that has not answered within ANSWER_TIMEOUT of its start is Silent at once.
    let deadline = tokio::time::Instant::from_std(probe.started + ANSWER_TIMEOUT);
    let mut answer = probe.answer;
    match tokio::time::timeout_at(deadline, answer.wait_for(Option::is_some)).await {
        Ok(Ok(answered)) if *answered == Some(true) => Health::Answers,
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

/// How long the driver tries to take a mount away: the kernel may call it busy while a last access drains.
const DETACH_LIMIT: Duration = Duration::from_secs(20);
/// The pause between two tries, so a mount the table keeps listing does not spin a thread.
const DETACH_PAUSE: Duration = Duration::from_millis(200);

/// How long a daemon may run on once its mount is gone. It finishes the uploads of files closed before the
/// unmount for at most FINISH_AFTER_UNMOUNT (45 s, src/daemon.rs), ignoring SIGTERM meanwhile, then gives
/// its runtime up to 5 s to stop; the rest is slack for a loaded node. Until then it is not killed.
pub const FINISHING: Duration = Duration::from_secs(45 + 10);
/// How long a daemon past `FINISHING` has after SIGTERM before SIGKILL, and SIGKILL to take effect.
const TERM_GRACE: Duration = Duration::from_secs(5);
const KILL_GRACE: Duration = Duration::from_secs(2);

/// Why an unmount did not end with every daemon of the mount gone.
#[derive(Debug)]
pub enum UnmountError {
    Unmount {
        target: PathBuf,
        source: Errno,
    },
    StillMounted {
        target: PathBuf,
        last: String,
    },
    /// Not a failure: the call has to answer before the daemons may be ended. Worth a retry.
    Finishing {
        target: PathBuf,
        pids: Vec<i32>,
        left: Duration,
    },
    Stuck {
        target: PathBuf,
        pids: Vec<i32>,
    },
}

impl std::fmt::Display for UnmountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnmountError::Unmount { target, source } => {
                write!(f, "unmount {}: {source}", target.display())
            }
            UnmountError::StillMounted { target, last } => write!(
                f,
                "{} is still mounted after {DETACH_LIMIT:?} of tries (last: {last})",
                target.display()
            ),
            UnmountError::Finishing { target, pids, left } => write!(
                f,
                "expressfs daemons {pids:?} of {} are finishing the uploads of files closed before the \
                 unmount (for at most {} s more)",
                target.display(),
                left.as_secs() + 1
            ),
            UnmountError::Stuck { target, pids } => write!(
                f,
                "expressfs daemons {pids:?} of {} outlived their uploads and SIGKILL",
                target.display()
            ),
        }
    }
}

impl std::error::Error for UnmountError {}

/// When each mount went while its daemons still ran. An unpublish that has to answer before they exit
/// leaves the time here, so kubelet's retry knows how long they have had to finish. A driver started since,
/// or a mount someone else took away, counts from the first time it finds the daemons without their mount:
/// later than the truth, so never too early to end them.
#[derive(Default)]
pub struct Departures(std::sync::Mutex<HashMap<PathBuf, Instant>>);

impl Departures {
    fn went(&self, target: &Path, at: Instant) {
        self.times().insert(target.to_path_buf(), at);
    }

    /// When the mount at `target` went, as far as this driver knows.
    fn since(&self, target: &Path) -> Instant {
        *self
            .times()
            .entry(target.to_path_buf())
            .or_insert_with(Instant::now)
    }

    fn forget(&self, target: &Path) {
        self.times().remove(target);
    }

    fn times(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Instant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One try to take a mount away: what umount2 said, and whether the daemon behind it was wedged.
struct Attempt {
    result: nix::Result<()>,
    wedged: bool,
}

async fn try_unmount(target: &Path) -> Attempt {
    let health = health(target).await;
    let flags = if health == Health::Answers {
        MntFlags::empty()
    } else {
        // Nobody answers behind a dead or wedged mount; only a lazy detach takes it away.
        MntFlags::MNT_DETACH
    };
    Attempt {
        result: nix::mount::umount2(target, flags),
        wedged: health == Health::Silent,
    }
}

/// Tries to take the mount at `target` away until `listed` no longer finds it, pausing between tries, and
/// gives up at `deadline`. umount2 may succeed, or say EINVAL or ENOENT, while the table still lists the
/// path (for a moment, or for good). Returns whether the daemon behind it was wedged.
async fn take_away<F>(
    target: &Path,
    deadline: Instant,
    mut listed: impl FnMut() -> bool,
    mut attempt: impl FnMut() -> F,
) -> Result<bool, UnmountError>
where
    F: Future<Output = Attempt>,
{
    let mut wedged = false;
    loop {
        let tried = attempt().await;
        wedged |= tried.wedged;
        match tried.result {
            Ok(()) | Err(Errno::EINVAL | Errno::ENOENT | Errno::EBUSY) => {}
            Err(source) => {
                return Err(UnmountError::Unmount {
                    target: target.to_path_buf(),
                    source,
                });
            }
        }
        if !listed() {
            return Ok(wedged);
        }
        if Instant::now() >= deadline {
            let last = match tried.result {
                Ok(()) => "umount2 succeeded".to_string(),
                Err(e) => format!("umount2: {e}"),
            };
            return Err(UnmountError::StillMounted {
                target: target.to_path_buf(),
                last,
            });
        }
        tokio::time::sleep(DETACH_PAUSE).await;
    }
}

/// Unmounts `target` when it is mounted, and waits (until `deadline` at most) for every daemon that served
/// it to exit, so none is left behind holding credentials and cache space. A daemon is not killed while it
/// may still be finishing uploads (`FINISHING` after its mount went): a call that has to answer first says
/// so (`Finishing`). One still running after that is stuck, and ended.
pub async fn unmount(
    target: &Path,
    departures: &Departures,
    deadline: Instant,
) -> Result<(), UnmountError> {
    let pids = daemon_pids(target);
    if mounted_at(target).is_some() {
        let wedged = take_away(
            target,
            Instant::now() + DETACH_LIMIT,
            || mounted_at(target).is_some(),
            || try_unmount(target),
        )
        .await?;
        departures.went(target, Instant::now());
        if wedged {
            // A stopped daemon finishes nothing, and a hung one would not see its mount go.
            signal_all(&pids, Signal::SIGTERM);
        }
    }
    let finished_by = departures.since(target) + FINISHING;
    wait_gone(&pids, finished_by.min(deadline)).await;
    let left = alive(&pids);
    if left.is_empty() {
        departures.forget(target);
        return Ok(());
    }
    let now = Instant::now();
    if now < finished_by {
        return Err(UnmountError::Finishing {
            target: target.to_path_buf(),
            pids: left,
            left: finished_by - now,
        });
    }
    tracing::warn!(
        target = %target.display(),
        pids = ?left,
        "daemons still running {FINISHING:?} after their mount went: ending them"
    );
    end(&left).await;
    let left = alive(&left);
    if !left.is_empty() {
        return Err(UnmountError::Stuck {
            target: target.to_path_buf(),
            pids: left,
        });
    }
    departures.forget(target);
    Ok(())
}

/// SIGTERM, then SIGKILL for a daemon that is past its uploads.
async fn end(pids: &[i32]) {
    signal_all(pids, Signal::SIGTERM);
    wait_gone(pids, Instant::now() + TERM_GRACE).await;
    signal_all(&alive(pids), Signal::SIGKILL);
    wait_gone(pids, Instant::now() + KILL_GRACE).await;
}

/// Sends `signal` to each of `pids`, and SIGCONT after it: a stopped daemon would keep it pending forever.
fn signal_all(pids: &[i32], signal: Signal) {
    for pid in pids {
        let pid = nix::unistd::Pid::from_raw(*pid);
        let _ = nix::sys::signal::kill(pid, signal);
        let _ = nix::sys::signal::kill(pid, Signal::SIGCONT);
    }
}

fn alive(pids: &[i32]) -> Vec<i32> {
    pids.iter().copied().filter(|p| !is_zombie(*p)).collect()
}

async fn wait_gone(pids: &[i32], deadline: Instant) {
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

    /// A try that gives `result`, counted in `tries`.
    fn counted(
        tries: &std::cell::Cell<u32>,
        result: nix::Result<()>,
    ) -> std::future::Ready<Attempt> {
        tries.set(tries.get() + 1);
        std::future::ready(Attempt {
            result,
            wedged: false,
        })
    }

    /// umount2 says EINVAL (or ENOENT) while the table keeps listing the path: the tries pause and end at
    /// the deadline. (The stand-in umount2 fails for real after 50 tries, so tries without a pause end the
    /// test rather than spin it for good.)
    #[tokio::test]
    async fn a_mount_the_table_keeps_listing_is_given_up_at_the_deadline() {
        for errno in [Errno::EINVAL, Errno::ENOENT] {
            let tries = std::cell::Cell::new(0);
            let started = Instant::now();
            let outcome = take_away(
                Path::new("/mnt/x"),
                started + Duration::from_millis(500),
                || true,
                || match tries.get() {
                    0..50 => counted(&tries, Err(errno)),
                    _ => counted(&tries, Err(Errno::EPERM)),
                },
            )
            .await;
            let err = outcome.unwrap_err();
            assert!(
                matches!(err, UnmountError::StillMounted { .. }),
                "{errno}: {err}"
            );
            assert!(err.to_string().contains(&errno.to_string()), "{err}");
            assert!(tries.get() <= 4, "{errno}: {} tries in 500 ms", tries.get());
            assert!(started.elapsed() >= Duration::from_millis(500));
        }
    }

    #[tokio::test]
    async fn a_busy_mount_is_tried_again_and_other_errors_end_the_tries() {
        let tries = std::cell::Cell::new(0);
        let deadline = Instant::now() + Duration::from_secs(5);
        let outcome = take_away(
            Path::new("/mnt/x"),
            deadline,
            || tries.get() < 3,
            || match tries.get() {
                0 | 1 => counted(&tries, Err(Errno::EBUSY)),
                _ => counted(&tries, Ok(())),
            },
        )
        .await;
        assert!(!outcome.unwrap());
        assert_eq!(tries.get(), 3);
        let tries = std::cell::Cell::new(0);
        let outcome = take_away(
            Path::new("/mnt/x"),
            deadline,
            || true,
            || counted(&tries, Err(Errno::EPERM)),
        )
        .await;
        assert!(matches!(
            outcome,
            Err(UnmountError::Unmount {
                source: Errno::EPERM,
                ..
            })
        ));
        assert_eq!(tries.get(), 1);
    }

    /// A process daemon_pids takes for the daemon of `target`, which ignores SIGTERM as a daemon does while
    /// it finishes its uploads.
    fn finishing_daemon(target: &Path) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sh")
            .arg0("/stand-in/expressfs")
            .args(["-c", "trap '' TERM; while :; do sleep 1; done", "sh"])
            .arg(target)
            .spawn()
            .unwrap()
    }

    /// Its mount already gone (an earlier call, or a driver before this one, took it away): the daemon is
    /// finishing, and a call that has to answer first says so and leaves it running. Once the daemon has had
    /// its time, it is stuck: ended despite ignoring SIGTERM.
    #[tokio::test]
    async fn a_daemon_without_its_mount_is_left_to_finish_then_ended() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("mount");
        let mut daemon = finishing_daemon(&target);
        let pid = daemon.id() as i32;
        let started = Instant::now();
        while daemon_pids(&target).is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the stand-in did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let departures = Departures::default();
        let deadline = Instant::now() + Duration::from_millis(300);
        let err = unmount(&target, &departures, deadline).await.unwrap_err();
        assert!(
            matches!(&err, UnmountError::Finishing { pids, .. } if pids == &[pid]),
            "{err}"
        );
        assert!(Instant::now() < deadline + Duration::from_secs(1));
        assert_eq!(
            daemon.try_wait().unwrap(),
            None,
            "a finishing daemon was ended"
        );
        // A retry: still within its time (counted from the first call), so still left alone.
        let err = unmount(
            &target,
            &departures,
            Instant::now() + Duration::from_millis(100),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, UnmountError::Finishing { .. }), "{err}");
        assert_eq!(daemon.try_wait().unwrap(), None);

        departures.went(&target, Instant::now() - FINISHING);
        let far = Instant::now() + Duration::from_secs(60);
        unmount(&target, &departures, far).await.unwrap();
        let status = daemon.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        assert!(departures.times().is_empty());
    }
}
