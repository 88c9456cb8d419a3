//! FUSE mounts driven by the suite: expressfs and the peers (s3fs, rclone, Mountpoint). Each runs in the
//! foreground as our child, logs to a file next to its mount point, and is unmounted (or killed) when
//! dropped, with a deadline on every step so a stuck file system cannot hang the run.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::s3::{KEY, REGION, SECRET};

/// How long a mount may take to appear.
const MOUNT_DEADLINE: Duration = Duration::from_secs(30);

/// rclone options: no VFS cache (data goes straight from S3 to the reader, like the other clients here),
/// read-only, and no per-file modtime lookups (which would cost a HEAD per entry while listing).
pub const RCLONE_FLAGS: &[&str] = &["--read-only", "--vfs-cache-mode", "off", "--no-modtime"];
/// s3fs options besides addressing and credentials: its defaults, read-only. ListObjectsV2 because the
/// emulator does not implement the old ListObjects.
pub const S3FS_OPTIONS: &str = "ro,listobjectsv2";
/// Mountpoint wrapper options besides endpoint, region and credentials: its (mount-s3's) defaults,
/// read-only, path-style (the emulator is an IP address, so there is no host name to put the bucket in).
pub const MOUNTPOINT_FLAGS: &[&str] = &["--read-only", "--force-path-style"];

pub struct Mount {
    pub name: &'static str,
    child: Child,
    mnt: PathBuf,
    log: PathBuf,
    /// Holds the mount point, the log and any config; None once deliberately leaked (see `Drop`).
    work: Option<tempfile::TempDir>,
}

/// A working directory with an empty `mnt/` inside: the mount point, with room next to it for files the
/// server needs (logs, passwords) that must not live under the mount.
fn workdir(name: &str) -> Result<(tempfile::TempDir, PathBuf)> {
    let work = tempfile::Builder::new()
        .prefix(&format!("bench-{name}-"))
        .tempdir()?;
    let mnt = work.path().join("mnt");
    std::fs::create_dir(&mnt)?;
    Ok((work, mnt))
}

impl Mount {
    /// expressfs in the foreground with the emulator's credentials.
    pub fn expressfs(
        exe: &Path,
        endpoint: &str,
        bucket: &str,
        extra: &[&str],
    ) -> Result<(Mount, Duration)> {
        let (work, mnt) = workdir("expressfs")?;
        let mut cmd = Command::new(exe);
        cmd.env("AWS_ACCESS_KEY_ID", KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .args([
                "--foreground",
                "--endpoint-url",
                endpoint,
                "--region",
                REGION,
            ])
            .args(extra)
            .arg(bucket)
            .arg(&mnt);
        Mount::start("expressfs", cmd, work, mnt)
    }

    /// s3fs in the foreground, path-style, against a general-purpose bucket (it has no CreateSession).
    pub fn s3fs(exe: &Path, endpoint: &str, bucket: &str) -> Result<(Mount, Duration)> {
        let (work, mnt) = workdir("s3fs")?;
        let passwd = work.path().join("passwd");
        // s3fs refuses a password file that others can read: create it 0600.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&passwd)?
            .write_all(format!("{KEY}:{SECRET}\n").as_bytes())?;
        let options = format!(
            "{S3FS_OPTIONS},passwd_file={},url={endpoint},endpoint={REGION},use_path_request_style",
            passwd.display()
        );
        let mut cmd = Command::new(exe);
        cmd.arg(bucket).arg(&mnt).args(["-f", "-o", &options]);
        Mount::start("s3fs", cmd, work, mnt)
    }

    /// `rclone mount` in the foreground on the directory bucket, configured through environment variables
    /// (an inline `:s3,endpoint=http://...:` remote would break on the colon of the URL).
    pub fn rclone(exe: &Path, endpoint: &str, bucket: &str) -> Result<(Mount, Duration)> {
        let (work, mnt) = workdir("rclone")?;
        let mut cmd = Command::new(exe);
        for (name, value) in [
            ("TYPE", "s3"),
            ("PROVIDER", "AWS"),
            ("ACCESS_KEY_ID", KEY),
            ("SECRET_ACCESS_KEY", SECRET),
            ("REGION", REGION),
            ("ENDPOINT", endpoint),
            ("FORCE_PATH_STYLE", "true"),
            ("DIRECTORY_BUCKET", "true"),
            // Its Go SDK cannot hash a streamed body over plain http otherwise (only matters for writes).
            ("USE_UNSIGNED_PAYLOAD", "true"),
        ] {
            cmd.env(format!("RCLONE_CONFIG_BENCHEMU_{name}"), value);
        }
        // Debian's rclone fails when AWS_CA_BUNDLE is set; nothing here uses TLS.
        cmd.env_remove("AWS_CA_BUNDLE")
            .arg("mount")
            .arg(format!("benchemu:{bucket}"))
            .arg(&mnt)
            .args(RCLONE_FLAGS);
        Mount::start("rclone", cmd, work, mnt)
    }

    /// Mountpoint's engine (bench/mountpoint) in the foreground, path-style, on the directory bucket. Its CRT
    /// client then sends CreateSession as `GET /?session=`, naming no bucket; the emulator answers that with
    /// a session good for its directory buckets.
    pub fn mountpoint(exe: &Path, endpoint: &str, bucket: &str) -> Result<(Mount, Duration)> {
        let (work, mnt) = workdir("mountpoint")?;
        let mut cmd = Command::new(exe);
        cmd.env("AWS_ACCESS_KEY_ID", KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env_remove("AWS_SESSION_TOKEN")
            .arg(bucket)
            .arg(&mnt)
            .args(["--endpoint-url", endpoint, "--region", REGION])
            .args(MOUNTPOINT_FLAGS);
        Mount::start("mountpoint", cmd, work, mnt)
    }

    /// Spawns the server and waits for its mount. Returns the mount and the time it took to appear.
    fn start(
        name: &'static str,
        mut cmd: Command,
        work: tempfile::TempDir,
        mnt: PathBuf,
    ) -> Result<(Mount, Duration)> {
        let log = work.path().join("server.log");
        let out = File::create(&log)?;
        let started = Instant::now();
        let child = cmd
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let mut m = Mount {
            name,
            child,
            mnt,
            log,
            work: Some(work),
        };
        loop {
            if is_mounted(&m.mnt) {
                return Ok((m, started.elapsed()));
            }
            if let Ok(Some(status)) = m.child.try_wait() {
                bail!("{name} exited ({status}) before mounting: {}", m.log_tail());
            }
            if started.elapsed() > MOUNT_DEADLINE {
                bail!(
                    "{name} did not mount within {MOUNT_DEADLINE:?}: {}",
                    m.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn root(&self) -> &Path {
        &self.mnt
    }

    /// The last lines of the server's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// Peak resident memory of the server, MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        self.status_mib("VmHWM:")
    }

    /// Resident memory of the server now, MiB.
    pub fn rss_mib(&self) -> f64 {
        self.status_mib("VmRSS:")
    }

    /// A `kB` line of the server's /proc status, in MiB (0 once it is gone).
    fn status_mib(&self, field: &str) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    }

    /// Descriptors the server holds open.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).map_or(0, |d| d.count())
    }

    /// Whether the server has exited (it should not, while mounted).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// CPU time (user + system, all threads) of the server so far, seconds.
    pub fn cpu_secs(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace().collect())
            .unwrap_or_default();
        let ticks: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
            + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        ticks / 100.0
    }

    /// Kills the server outright. Readers blocked in the mount then get ENOTCONN instead of waiting
    /// forever; used after a workload timed out. The mount itself is detached when dropped.
    pub fn abort(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        run_for("umount", &["-l"], &self.mnt, Duration::from_secs(5));
    }

    /// Waits up to `limit` for the server to exit.
    fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Mount {
    /// Unmount politely, then less so: umount; SIGTERM (rclone, s3fs and Mountpoint unmount themselves on
    /// it); a lazy umount; finally SIGKILL. If the mount is somehow still there, the working directory is
    /// left behind rather than deleted, since deleting it would recurse into the mounted bucket.
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            run_for("umount", &[], &self.mnt, Duration::from_secs(15));
        }
        if is_mounted(&self.mnt) {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            self.wait_exit(Duration::from_secs(5));
        }
        if is_mounted(&self.mnt) {
            run_for("umount", &["-l"], &self.mnt, Duration::from_secs(5));
        }
        if !self.wait_exit(Duration::from_secs(10)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if is_mounted(&self.mnt) {
            eprintln!(
                "warning: {} still mounted at {}; leaving it",
                self.name,
                self.mnt.display()
            );
            if let Some(work) = self.work.take() {
                let _ = work.keep();
            }
        }
    }
}

/// Whether `path` is a mount point, from /proc/self/mountinfo (field 5; paths here have no spaces).
pub fn is_mounted(path: &Path) -> bool {
    let Some(path) = path.to_str() else {
        return false;
    };
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(path))
}

/// Runs `prog args path`, killing it if it takes longer than `limit`. Returns whether it succeeded.
fn run_for(prog: &str, args: &[&str], path: &Path, limit: Duration) -> bool {
    let Ok(mut child) = Command::new(prog)
        .args(args)
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.success(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}
