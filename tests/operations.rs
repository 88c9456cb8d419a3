//! Operating a mount (issue 20): background logs reach syslog, a dead mount left by a killed daemon heals on
//! restart while anything else mounted there is refused, `--log-metrics` prints the traffic, and
//! `expressfs warm` fills the caches so that an epoch, and one after a remount, sends no GET.

mod common;

use std::collections::BTreeMap;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{
    Mount, daemon_metric, emulator, expressfs_command, free_metrics_addr, fresh_bucket, is_mounted,
    op_count, pattern, put, put_many, runtime, s3_client, sha256_hex,
};

const SYSLOG_ENV: &str = "EXPRESSFS_SYSLOG_SOCKET";

fn run(mut cmd: Command) -> Output {
    cmd.stdin(Stdio::null());
    cmd.output().expect("run expressfs")
}

/// A syslog socket of our own, like /dev/log.
struct Syslog {
    _dir: tempfile::TempDir,
    path: PathBuf,
    socket: UnixDatagram,
    seen: Vec<String>,
}

impl Syslog {
    fn bind() -> Syslog {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        Syslog {
            _dir: dir,
            path,
            socket,
            seen: Vec::new(),
        }
    }

    /// The first line (seen before or arriving within 15 s) that contains `needle`.
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(line) = self.seen.iter().find(|l| l.contains(needle)) {
                return line.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no syslog line with {needle:?}; got:\n{}",
                self.seen.join("\n")
            );
            let mut buf = vec![0u8; 65536];
            if let Ok(n) = self.socket.recv(&mut buf) {
                self.seen
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
    }
}

/// The pid in `<PRI>Mmm dd hh:mm:ss expressfs[PID]: ...`.
fn pid_of(line: &str) -> i32 {
    let start = line.find("expressfs[").expect("identifier") + "expressfs[".len();
    line[start..].split(']').next().unwrap().parse().unwrap()
}

fn background_mount(bucket: &str, dir: &Path, syslog: &Path, extra: &[&str]) -> Output {
    let mut cmd = expressfs_command(emulator());
    cmd.env(SYSLOG_ENV, syslog).args(extra).arg(bucket).arg(dir);
    run(cmd)
}

fn wait_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} lives on"
    );
}

/// Detaches whatever a failed test left mounted at the path (a dead mount would outlive the test).
struct DetachOnDrop(PathBuf);

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).unwrap();
}

#[test]
fn background_logs_go_to_syslog_unless_a_log_directory_is_given() {
    let bucket = fresh_bucket(true, "syslog");
    put(emulator(), &bucket, "a.txt", b"a".to_vec());
    let mut syslog = Syslog::bind();
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = DetachOnDrop(dir.path().to_path_buf());
    let out = background_mount(&bucket, dir.path(), &syslog.path, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // info -> LOG_DAEMON|LOG_INFO = 3*8+6.
    let mounted = syslog.wait_for("mounted");
    assert!(mounted.starts_with("<30>"), "{mounted}");
    assert!(mounted.contains(&bucket), "{mounted}");
    let pid = pid_of(&mounted);
    assert_ne!(pid, std::process::id() as i32);
    signal(pid, nix::sys::signal::Signal::SIGTERM);
    let stopping = syslog.wait_for("signal received");
    assert!(
        stopping.starts_with("<30>") && pid_of(&stopping) == pid,
        "{stopping}"
    );
    wait_gone(pid);
    assert!(!is_mounted(dir.path()));

    // With --log-directory the file gets the lines and syslog none.
    let logs = tempfile::tempdir().unwrap();
    let mut quiet = Syslog::bind();
    let out = background_mount(
        &bucket,
        dir.path(),
        &quiet.path,
        &["--log-directory", logs.path().to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut buf = [0u8; 4096];
    assert!(
        quiet.socket.recv(&mut buf).is_err(),
        "a daemon with --log-directory wrote to syslog"
    );
    quiet.seen.clear();
    nix::mount::umount(dir.path()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let written = || {
        std::fs::read_dir(logs.path()).unwrap().flatten().any(|e| {
            std::fs::read_to_string(e.path())
                .unwrap_or_default()
                .contains("mounted")
        })
    };
    while !written() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(written(), "the log directory has no 'mounted' line");
}

/// What systemd's Restart=on-failure does after a crash: start again on the same path.
#[test]
fn a_killed_daemon_leaves_a_dead_mount_that_a_restart_heals() {
    let bucket = fresh_bucket(true, "heal");
    put(emulator(), &bucket, "kept.txt", b"still here".to_vec());
    let mut syslog = Syslog::bind();
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = DetachOnDrop(dir.path().to_path_buf());
    let out = background_mount(&bucket, dir.path(), &syslog.path, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid = pid_of(&syslog.wait_for("mounted"));
    signal(pid, nix::sys::signal::Signal::SIGKILL);
    wait_gone(pid);
    let dead = std::fs::metadata(dir.path()).unwrap_err();
    assert_eq!(dead.raw_os_error(), Some(libc::ENOTCONN), "{dead}");

    let out = background_mount(&bucket, dir.path(), &syslog.path, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(dir.path().join("kept.txt")).unwrap(),
        b"still here"
    );
    // warn -> LOG_DAEMON|LOG_WARNING = 3*8+4.
    let healed = syslog.wait_for("dead expressfs mount");
    assert!(healed.starts_with("<28>"), "{healed}");
    assert_ne!(pid_of(&healed), pid);
    nix::mount::umount(dir.path()).unwrap();
}

#[test]
fn a_live_mount_or_a_dead_foreign_mount_is_refused() {
    let bucket = fresh_bucket(true, "refuse");
    let live = Mount::new(&bucket, &[]);
    let mut cmd = expressfs_command(emulator());
    cmd.arg(&bucket).arg(live.path());
    let out = run(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted over a live mount");
    assert!(stderr.contains("already a live FUSE mount"), "{stderr}");
    assert_eq!(std::fs::read_dir(live.path()).unwrap().count(), 0);
    drop(live);

    // A FUSE mount of some other file system whose server is gone: /dev/fuse opened, mounted, closed.
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = DetachOnDrop(dir.path().to_path_buf());
    {
        use std::os::fd::AsRawFd;
        let fuse = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .unwrap();
        let data = format!(
            "fd={},rootmode=40000,user_id=0,group_id=0",
            fuse.as_raw_fd()
        );
        nix::mount::mount(
            Some("otherfs-source"),
            dir.path(),
            Some("fuse.otherfs"),
            nix::mount::MsFlags::empty(),
            Some(data.as_str()),
        )
        .unwrap();
    }
    let dead = std::fs::metadata(dir.path()).unwrap_err();
    assert_eq!(dead.raw_os_error(), Some(libc::ENOTCONN), "{dead}");
    let mut cmd = expressfs_command(emulator());
    cmd.arg(&bucket).arg(dir.path());
    let out = run(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let still_there = is_mounted(dir.path());
    let _ = nix::mount::umount2(dir.path(), nix::mount::MntFlags::MNT_DETACH);
    assert!(
        !out.status.success(),
        "took over another file system's mount"
    );
    assert!(
        stderr.contains("dead mount of another file system") && stderr.contains("fuse.otherfs"),
        "{stderr}"
    );
    assert!(still_there, "the foreign mount was detached");
}

#[test]
fn log_metrics_prints_the_traffic_of_each_period() {
    let bucket = fresh_bucket(true, "logmetrics");
    put(emulator(), &bucket, "data.bin", pattern(1, 3 << 20));
    let mount = Mount::new(
        &bucket,
        &["-o", "log-metrics", "--log-metrics-interval", "0.2"],
    );
    assert_eq!(
        std::fs::read(mount.path().join("data.bin")).unwrap().len(),
        3 << 20
    );
    let busy = |log: &str| {
        log.lines().any(|l| {
            l.contains("metrics: ")
                && !l.contains("fuse_requests=0 ")
                && !l.contains("read_mib_s=0.0 ")
                && !l.contains("s3_requests=0 ")
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !busy(&mount.log()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(busy(&mount.log()), "no busy metrics line:\n{}", mount.log());
}

fn warm(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_expressfs"));
    cmd.arg("warm").args(args);
    run(cmd)
}

/// Every file under `root`, by path relative to it, with its SHA-256.
fn tree_hashes(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let rel = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.insert(rel, sha256_hex(&std::fs::read(&path).unwrap()));
            }
        }
    }
    out
}

#[test]
fn warm_fills_the_cache_so_an_epoch_and_a_remount_send_no_get() {
    let bucket = fresh_bucket(true, "warm");
    let mut objects: Vec<(String, Vec<u8>)> = (0..150)
        .map(|i| {
            (
                format!("train/part{}/{i:04}.jpg", i % 5),
                pattern(i, 50_000),
            )
        })
        .collect();
    objects.push(("train/shard0.tar".into(), pattern(900, 40 << 20)));
    objects.push(("other/skip.bin".into(), pattern(901, 1 << 20)));
    let expected: BTreeMap<String, String> = objects
        .iter()
        .filter_map(|(k, d)| Some((k.strip_prefix("train/")?.to_string(), sha256_hex(d))))
        .collect();
    put_many(emulator(), &bucket, objects);
    // The block cache keeps 5% of its disk free and evicts to do so: on a shared machine whose disk is
    // nearly full that would decide the test, so the cache lives in memory when it can.
    let shm = Path::new("/dev/shm");
    let cache = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let cache_arg = cache.path().to_str().unwrap();
    let train = |m: &Mount| m.path().join("train");
    {
        let addr = free_metrics_addr();
        let mount = Mount::new(&bucket, &["--cache", cache_arg, "--metrics-addr", &addr]);
        let gets_before = op_count(&bucket, "GetObject");
        let out = warm(&[train(&mount).to_str().unwrap(), "--jobs", "8"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("warmed 151 files in 6 directories") && stdout.contains("0 failed"),
            "{stdout}"
        );
        // The daemon fetched each file into the cache (an ioctl from `expressfs warm`): one GET per small
        // file and per 8 MiB part of the shard, none twice (a small file's GET also starts at its open).
        assert_eq!(
            op_count(&bucket, "GetObject") - gets_before,
            150 + 5,
            "GETs of the warm-up"
        );
        // Its opens say they are not for reading (O_NONBLOCK): no small file went into the page cache.
        assert_eq!(
            daemon_metric(&addr, "expressfs_page_cache_preloads_total"),
            0.0
        );
        // A second warm-up finds everything kept: no GET, nothing read back.
        let gets_before = op_count(&bucket, "GetObject");
        let out = warm(&[train(&mount).to_str().unwrap()]);
        assert!(out.status.success());
        assert_eq!(op_count(&bucket, "GetObject"), gets_before, "warm again");
        // No waiting for the cache writes: the warm-up returns once they are done.
        let before = op_count(&bucket, "GetObject");
        assert_eq!(tree_hashes(&train(&mount)), expected, "epoch after warm");
        assert_eq!(
            op_count(&bucket, "GetObject"),
            before,
            "the epoch after warm went to the bucket"
        );
        assert!(mount.unmount().success());
    }
    let before = op_count(&bucket, "GetObject");
    let mount = Mount::new(&bucket, &["--cache", cache_arg]);
    assert_eq!(tree_hashes(&train(&mount)), expected, "epoch after remount");
    assert_eq!(
        op_count(&bucket, "GetObject"),
        before,
        "the warmed cache did not survive the remount"
    );
}

#[test]
fn warm_listing_only_fills_the_metadata_cache() {
    let bucket = fresh_bucket(true, "warmlist");
    let objects: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| (format!("d{}/f{i}", i % 4), vec![b'x'; 10]))
        .collect();
    put_many(emulator(), &bucket, objects);
    let mount = Mount::new(&bucket, &["--metadata-ttl", "300"]);
    let lists_before = op_count(&bucket, "ListObjectsV2");
    let out = warm(&["--listing-only", mount.path().to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("listed 40 files in 5 directories"),
        "{stdout}"
    );
    let lists = op_count(&bucket, "ListObjectsV2");
    assert!(lists > lists_before, "nothing was listed");
    let (heads, gets) = (
        op_count(&bucket, "HeadObject"),
        op_count(&bucket, "GetObject"),
    );
    // The stats are answered from the listings, and no data is read.
    assert_eq!((heads, gets), (0, 0), "--listing-only sent HEADs or GETs");
    // A second walk with stats is answered from the metadata cache.
    let mut n = 0;
    for d in std::fs::read_dir(mount.path()).unwrap() {
        for f in std::fs::read_dir(d.unwrap().path()).unwrap() {
            assert_eq!(f.unwrap().metadata().unwrap().len(), 10);
            n += 1;
        }
    }
    assert_eq!(n, 40);
    assert_eq!(
        (
            op_count(&bucket, "ListObjectsV2"),
            op_count(&bucket, "HeadObject"),
            op_count(&bucket, "GetObject")
        ),
        (lists, heads, gets),
        "the walk after --listing-only went to the bucket"
    );
}

#[test]
fn warm_lists_the_files_it_could_not_read_and_fails() {
    let bucket = fresh_bucket(true, "warmfail");
    put(emulator(), &bucket, "ok.bin", pattern(3, 100_000));
    put(emulator(), &bucket, "gone.bin", pattern(4, 2 << 20));
    let mount = Mount::new(&bucket, &["--metadata-ttl", "300"]);
    // Known to the mount, then deleted behind its back: the listing and the stat still show it.
    assert_eq!(std::fs::read_dir(mount.path()).unwrap().count(), 2);
    assert!(mount.path().join("gone.bin").metadata().is_ok());
    runtime()
        .block_on(
            s3_client(emulator())
                .delete_object()
                .bucket(&bucket)
                .key("gone.bin")
                .send(),
        )
        .unwrap();
    let out = warm(&[mount.path().to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("1 failed"), "{stdout}");
    let gone = mount.path().join("gone.bin");
    assert!(
        stderr.contains(&format!("  {}: ", gone.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("ok.bin"), "{stderr}");

    // A path that does not exist is a failure too.
    let missing = mount.path().join("no-such-dir");
    let out = warm(&[
        missing.to_str().unwrap(),
        mount.path().join("ok.bin").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-dir"));
}

/// mount-s3 has no subcommands: `expressfs warm DIR --endpoint-url ...` still mounts a bucket named `warm`
/// (here it does not exist, which the mount path reports), while `expressfs warm PATH_ON_A_MOUNT` warms.
/// (Without flags, an empty DIR outside FUSE also means the mount: unit test in `warm`.)
#[test]
fn warm_as_a_bucket_name_still_mounts() {
    let empty = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_expressfs"));
    cmd.env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_ACCESS_KEY_ID", common::ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", common::SECRET_KEY)
        .arg("warm")
        .arg(empty.path())
        .args([
            "--endpoint-url",
            &emulator().endpoint_url(),
            "--region",
            common::REGION,
        ]);
    let out = run(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");

    let bucket = fresh_bucket(true, "warmname");
    put(emulator(), &bucket, "f", b"x".to_vec());
    let mount = Mount::new(&bucket, &[]);
    let out = warm(&[mount.path().to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("warmed 1 files"), "{stdout}");
}

/// A FUSE mount made the way a CSI driver or a container runtime makes one for an unprivileged daemon: this
/// process opens /dev/fuse and mounts it with `fd=N`, then starts `expressfs BUCKET /dev/fd/N` with the
/// descriptor and closes its own copy.
struct DescriptorMount {
    dir: tempfile::TempDir,
    daemon: std::process::Child,
    log: PathBuf,
    /// This process's copy of the descriptor, when kept ([`DescriptorMount::start_keeping`]).
    kept: Option<std::fs::File>,
}

/// Starts `expressfs --foreground BUCKET /dev/fd/N` on `cmd` with descriptor `fd` kept across its exec.
fn spawn_with_descriptor(
    mut cmd: Command,
    fd: std::os::fd::RawFd,
    bucket: &str,
) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    cmd.arg("--foreground")
        .arg(bucket)
        .arg(format!("/dev/fd/{fd}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    // SAFETY: between fork and exec only fcntl, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

impl DescriptorMount {
    fn start(bucket: &str, extra: &[&str]) -> DescriptorMount {
        Self::start_with(bucket, extra, false)
    }

    /// [`DescriptorMount::start`], and this process keeps its copy of the descriptor.
    fn start_keeping(bucket: &str, extra: &[&str]) -> DescriptorMount {
        Self::start_with(bucket, extra, true)
    }

    fn start_with(bucket: &str, extra: &[&str], keep: bool) -> DescriptorMount {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        // Close-on-exec here, so that daemons other tests start meanwhile do not hold it too.
        let fuse = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .unwrap();
        let fd = fuse.as_raw_fd();
        nix::mount::mount(
            Some(format!("expressfs:{bucket}").as_str()),
            dir.path(),
            Some("fuse.expressfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(
                format!("fd={fd},rootmode=40000,user_id=0,group_id=0,default_permissions").as_str(),
            ),
        )
        .unwrap();
        let log = dir.path().with_extension("log");
        let mut cmd = expressfs_command(emulator());
        cmd.args(extra).stderr(std::fs::File::create(&log).unwrap());
        let daemon = spawn_with_descriptor(cmd, fd, bucket);
        // Once the daemon holds it, only the daemon may (unless kept): its exit must end the connection.
        let kept = keep.then_some(fuse);
        let mount = DescriptorMount {
            dir,
            daemon,
            log,
            kept,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::fs::read_dir(mount.path()).is_err() {
            assert!(
                Instant::now() < deadline,
                "the descriptor's mount is not served:\n{}",
                mount.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        mount
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's exit status, waited for at most 30 s.
    fn exit_status(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.daemon.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not exit:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for DescriptorMount {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(&self.log);
    }
}

#[test]
fn a_fuse_descriptor_mounted_by_the_caller_is_served_until_the_caller_unmounts() {
    let bucket = fresh_bucket(true, "fd");
    let seed = pattern(31, 300_000);
    put(emulator(), &bucket, "data/seed.bin", seed.clone());
    let mut mount = DescriptorMount::start(&bucket, &["--allow-overwrite"]);
    assert!(std::fs::read(mount.path().join("data/seed.bin")).unwrap() == seed);
    let written = pattern(32, 3 << 20);
    std::fs::write(mount.path().join("data/new.bin"), &written).unwrap();
    assert!(common::get(emulator(), &bucket, "data/new.bin").unwrap() == written);
    let mut names: Vec<_> = std::fs::read_dir(mount.path().join("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["new.bin", "seed.bin"]);

    // The caller's unmount ends the session, and the daemon exits 0 without trying to unmount anything.
    nix::mount::umount(mount.path()).unwrap();
    let status = mount.exit_status();
    let log = mount.log();
    assert!(status.success(), "{status}:\n{log}");
    assert!(log.contains("mounted at /dev/fd/"), "{log}");
    assert!(!log.to_lowercase().contains("unmount failed"), "{log}");
}

#[test]
fn sigterm_on_a_descriptors_mount_keeps_closed_files_and_abandons_open_ones() {
    let bucket = fresh_bucket(true, "fdterm");
    let mut mount = DescriptorMount::start(&bucket, &[]);
    // Closed before the signal: uploaded at its close.
    let closed = pattern(33, 3 << 20);
    std::fs::write(mount.path().join("closed.bin"), &closed).unwrap();
    // Still being written when the signal comes: past one part, so a multipart upload is under way. The
    // daemon cannot know the writer was done; uploading what it has would leave a torn file that looks whole.
    let mut open = std::fs::File::create(mount.path().join("open.bin")).unwrap();
    std::io::Write::write_all(&mut open, &pattern(34, 20 << 20)).unwrap();
    signal(mount.daemon.id() as i32, nix::sys::signal::Signal::SIGTERM);
    let status = mount.exit_status();
    let log = mount.log();
    assert!(status.success(), "{status}:\n{log}");
    assert!(common::get(emulator(), &bucket, "closed.bin").unwrap() == closed);
    let uploaded = common::get(emulator(), &bucket, "open.bin").map(|b| b.len());
    assert_eq!(uploaded, None, "a file still open was uploaded:\n{log}");
    let (_, uploads) =
        common::admin_get(emulator(), &format!("/_emulator/uploads?bucket={bucket}"));
    assert_eq!(uploads.trim(), "[]", "multipart uploads left behind");
    assert!(
        log.contains("what was written to them is not uploaded"),
        "{log}"
    );
    // The daemon is gone and its descriptor with it: the mount, still the caller's, fails until unmounted.
    let err = std::fs::read_dir(mount.path()).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");
    drop(open);
    nix::mount::umount2(mount.path(), nix::mount::MntFlags::MNT_DETACH).unwrap();
}

#[test]
fn a_descriptor_another_daemon_served_is_refused_not_waited_on() {
    use std::os::fd::AsRawFd;
    let bucket = fresh_bucket(true, "fdtwice");
    let mount = DescriptorMount::start_keeping(&bucket, &[]);
    let fd = mount.kept.as_ref().unwrap().as_raw_fd();
    // Its INIT was answered by the first daemon, and the mount is idle: a second one would wait forever.
    let mut cmd = expressfs_command(emulator());
    cmd.stderr(Stdio::piped());
    let mut second = spawn_with_descriptor(cmd, fd, &bucket);
    let deadline = Instant::now() + Duration::from_secs(30);
    while second.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = second.kill();
            panic!("the second daemon still waits on a descriptor served before");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = second.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("served by a daemon before"), "{stderr}");
    // The first daemon serves on.
    std::fs::write(mount.path().join("still.txt"), b"served").unwrap();
    assert_eq!(
        common::get(emulator(), &bucket, "still.txt").as_deref(),
        Some(&b"served"[..])
    );
}

#[test]
fn a_dev_fd_mount_point_must_be_an_open_fuse_descriptor() {
    let bucket = fresh_bucket(true, "fdbad");
    for (target, says) in [
        ("/dev/fd/1", "3 or above"),
        ("/dev/fd/987", "is not open"),
        ("/dev/fd/x", "/dev/fd/N"),
    ] {
        let mut cmd = expressfs_command(emulator());
        cmd.arg("--foreground").arg(&bucket).arg(target);
        let out = run(cmd);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{target}: {stderr}");
        assert!(stderr.contains(says), "{target}: {stderr}");
    }
    // Descriptors handed over open: one that is not /dev/fuse, and a /dev/fuse nobody mounted yet.
    for (device, says) in [
        ("/dev/null", "is not /dev/fuse"),
        ("/dev/fuse", "the descriptor is not mounted"),
    ] {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(device)
            .unwrap();
        let mut cmd = expressfs_command(emulator());
        cmd.stderr(Stdio::piped());
        let out = spawn_with_descriptor(cmd, file.as_raw_fd(), &bucket)
            .wait_with_output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{device}: {stderr}");
        assert!(stderr.contains(says), "{device}: {stderr}");
    }
}

/// Waits (at most 15 s) until the mount's log holds `needle`; returns the log.
fn log_with(mount: &Mount, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let log = mount.log();
        if log.contains(needle) {
            return log;
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigusr2_turns_debug_logging_on_and_off_on_a_live_mount() {
    let bucket = fresh_bucket(true, "usr2");
    for name in ["a", "b", "c"] {
        put(emulator(), &bucket, name, pattern(40, 1000));
    }
    let mount = Mount::on(emulator(), &bucket, &[]);
    let pid = mount.pid().unwrap() as i32;
    // Each read is a first open: one GET, which logs "s3 call done" at debug only.
    std::fs::read(mount.path().join("a")).unwrap();
    assert!(!mount.log().contains("s3 call done"), "{}", mount.log());

    signal(pid, nix::sys::signal::Signal::SIGUSR2);
    let on = log_with(&mount, "debug logging on").len();
    std::fs::read(mount.path().join("b")).unwrap();
    let log = log_with(&mount, "s3 call done");
    assert!(log[on..].contains("s3 call done"), "{log}");

    signal(pid, nix::sys::signal::Signal::SIGUSR2);
    let off = log_with(&mount, "debug logging off").len();
    std::fs::read(mount.path().join("c")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let log = mount.log();
    assert!(!log[off..].contains("s3 call done"), "{log}");
    assert!(
        !log.contains(common::SECRET_KEY),
        "the secret key was logged"
    );
    assert!(mount.unmount().success());
}
