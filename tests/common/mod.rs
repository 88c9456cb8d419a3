//! Shared harness for the integration tests: one in-process emulator per test binary, real `expressfs`
//! daemons mounting it through FUSE, and an aws-sdk-s3 client for setting up and checking buckets.
//!
//! Every request goes to 127.0.0.1; credentials and region are always explicit and instance metadata is
//! disabled, so no SDK ever looks for the EC2 metadata service.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_s3::config::{Credentials, Region};
use expressfs_emulator::{Emulator, EmulatorConfig};

pub const ACCESS_KEY: &str = "AKIDEXPRESSFSTEST";
pub const SECRET_KEY: &str = "expressfs-test-secret";
pub const REGION: &str = "us-east-1";

/// Emulator data of this test process. Statics are never dropped, so the directory outlives the process;
/// it carries the pid, and each new process removes the directories of processes that are gone (otherwise
/// repeated local runs fill the disk, and the block cache's 5%-free rule then evicts everything).
static DATA_DIR: LazyLock<tempfile::TempDir> = LazyLock::new(|| {
    remove_dead_data_dirs();
    tempfile::Builder::new()
        .prefix(&format!("expressfs-emu-{}-", std::process::id()))
        .tempdir()
        .unwrap()
});

fn remove_dead_data_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("expressfs-emu-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

static EMULATOR: LazyLock<Emulator> = LazyLock::new(|| start_emulator(EmulatorConfig::default()));

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
});

static NAME_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Makes sure no SDK in this process (or a child) tries the instance-metadata address.
pub fn isolate_env() {
    // SAFETY: set before any thread reads the environment for these names; values are constant.
    unsafe {
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
        std::env::set_var("AWS_REGION", REGION);
        std::env::remove_var("AWS_PROFILE");
        std::env::remove_var("AWS_SESSION_TOKEN");
    }
}

/// Starts an extra emulator with its own settings (e.g. a short session TTL or a latency profile).
pub fn start_emulator(mut config: EmulatorConfig) -> Emulator {
    isolate_env();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.access_key = ACCESS_KEY.into();
    config.secret_key = SECRET_KEY.into();
    config.region = REGION.into();
    let n = NAME_COUNTER.fetch_add(1, Ordering::Relaxed);
    config.data_dir = DATA_DIR.path().join(format!("emu{n}"));
    Emulator::start_background(config).expect("emulator starts")
}

/// A fresh bucket (a directory bucket if `directory`) on an emulator of the test's own, so the faults it
/// injects reach no other test.
pub fn own_emulator(directory: bool, tag: &str) -> (String, Emulator) {
    let bucket = fresh_bucket(directory, tag);
    let emu = start_emulator(EmulatorConfig {
        buckets: vec![bucket.clone()],
        ..Default::default()
    });
    (bucket, emu)
}

/// The emulator shared by every test of this binary.
pub fn emulator() -> &'static Emulator {
    &EMULATOR
}

pub fn runtime() -> &'static tokio::runtime::Runtime {
    &RUNTIME
}

/// A fresh directory-bucket name, unique within this process and across test processes.
pub fn directory_bucket(tag: &str) -> String {
    format!("{}--use1-az4--x-s3", unique_base(tag))
}

/// A fresh general-purpose bucket name.
pub fn general_bucket(tag: &str) -> String {
    unique_base(tag)
}

fn unique_base(tag: &str) -> String {
    let n = NAME_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tag: String = tag
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(20)
        .collect::<String>()
        .to_lowercase();
    format!("{tag}-{}-{n}", std::process::id())
}

/// An aws-sdk-s3 client for `emu`, with explicit credentials and region.
pub fn s3_client(emu: &Emulator) -> aws_sdk_s3::Client {
    isolate_env();
    let config = aws_sdk_s3::config::Builder::new()
        .behavior_version_latest()
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new(
            ACCESS_KEY,
            SECRET_KEY,
            None,
            None,
            "expressfs-tests",
        ))
        .endpoint_url(emu.endpoint_url())
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// Creates `bucket` on `emu` through the SDK. CreateBucket is signed with the long-term keys (no session),
/// as it goes to the regional control endpoint for directory buckets.
pub fn create_bucket(emu: &Emulator, bucket: &str) {
    let client = aws_sdk_s3::Client::from_conf(
        s3_client(emu)
            .config()
            .to_builder()
            .disable_s3_express_session_auth(true)
            .build(),
    );
    runtime()
        .block_on(client.create_bucket().bucket(bucket).send())
        .unwrap_or_else(|e| panic!("create bucket {bucket}: {e:?}"));
}

/// Uploads `data` under `key` through the SDK (PutObject).
pub fn put(emu: &Emulator, bucket: &str, key: &str, data: impl Into<Vec<u8>>) {
    let client = s3_client(emu);
    let body = aws_sdk_s3::primitives::ByteStream::from(data.into());
    runtime()
        .block_on(
            client
                .put_object()
                .bucket(bucket)
                .key(key)
                .body(body)
                .send(),
        )
        .unwrap_or_else(|e| panic!("put {bucket}/{key}: {e:?}"));
}

/// Reads a whole object through the SDK.
pub fn get(emu: &Emulator, bucket: &str, key: &str) -> Option<Vec<u8>> {
    let client = s3_client(emu);
    runtime().block_on(async {
        match client.get_object().bucket(bucket).key(key).send().await {
            Ok(out) => Some(out.body.collect().await.unwrap().into_bytes().to_vec()),
            Err(e)
                if e.as_service_error()
                    .map(|s| s.is_no_such_key())
                    .unwrap_or(false) =>
            {
                None
            }
            Err(e) => panic!("get {bucket}/{key}: {e:?}"),
        }
    })
}

/// Deterministic pseudo-random bytes (xorshift), so large test data needs no storage and no RNG crate.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let bytes = state.to_le_bytes();
        let take = (len - out.len()).min(8);
        out.extend_from_slice(&bytes[..take]);
    }
    out
}

pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::Digest;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// A live `expressfs --foreground` mount of a bucket on the emulator. Dropping it unmounts and reaps the daemon.
pub struct Mount {
    dir: tempfile::TempDir,
    /// The daemon's TMPDIR, so staged copies it keeps (deliberate conflicts, refused uploads) go with the test.
    _tmp: tempfile::TempDir,
    child: Option<Child>,
    pub bucket: String,
    log_path: PathBuf,
}

/// Base command for the daemon with the loopback endpoint and explicit credentials.
pub fn expressfs_command(emu: &Emulator) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_expressfs"));
    cmd.env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", REGION)
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .arg("--endpoint-url")
        .arg(emu.endpoint_url())
        .arg("--region")
        .arg(REGION);
    cmd
}

impl Mount {
    /// Mounts `bucket` from the shared emulator with extra CLI `args`.
    pub fn new(bucket: &str, args: &[&str]) -> Mount {
        Mount::on(emulator(), bucket, args)
    }

    /// [`Mount::new`] with extra environment variables for the daemon.
    pub fn with_env(bucket: &str, args: &[&str], env: &[(&str, &str)]) -> Mount {
        Mount::start(emulator(), bucket, args, env)
    }

    pub fn on(emu: &Emulator, bucket: &str, args: &[&str]) -> Mount {
        Mount::start(emu, bucket, args, &[])
    }

    /// [`Mount::on`] with extra environment variables for the daemon.
    pub fn on_with_env(emu: &Emulator, bucket: &str, args: &[&str], env: &[(&str, &str)]) -> Mount {
        Mount::start(emu, bucket, args, env)
    }

    fn start(emu: &Emulator, bucket: &str, args: &[&str], env: &[(&str, &str)]) -> Mount {
        let dir = tempfile::Builder::new()
            .prefix("expressfs-mnt-")
            .tempdir()
            .unwrap();
        let log_path = dir.path().with_extension("log");
        let log = std::fs::File::create(&log_path).unwrap();
        let tmp = tempfile::Builder::new()
            .prefix("expressfs-tmp-")
            .tempdir()
            .unwrap();
        let mut cmd = expressfs_command(emu);
        cmd.arg("--foreground")
            .args(args)
            .arg(bucket)
            .arg(dir.path())
            .env("TMPDIR", tmp.path())
            .envs(env.iter().copied());
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child = cmd.spawn().expect("spawn expressfs");
        let mut mount = Mount {
            dir,
            _tmp: tmp,
            child: Some(child),
            bucket: bucket.to_string(),
            log_path,
        };
        mount.wait_mounted();
        mount
    }

    fn wait_mounted(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if is_mounted(self.dir.path()) {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "expressfs exited with {status} before mounting:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("mount did not appear within 30 s:\n{}", self.log());
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Descriptors the daemon holds open.
    pub fn open_fds(&self) -> usize {
        let pid = self.child.as_ref().map_or(0, |c| c.id());
        std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
    }

    /// The daemon's peak resident memory so far (VmHWM), MiB.
    pub fn peak_rss_mib(&self) -> u64 {
        self.status_mib("VmHWM:")
    }

    /// The daemon's resident memory now (VmRSS), MiB.
    pub fn rss_mib(&self) -> u64 {
        self.status_mib("VmRSS:")
    }

    /// A memory line of the daemon's /proc status, MiB.
    fn status_mib(&self, field: &str) -> u64 {
        let pid = self.child.as_ref().map_or(0, |c| c.id());
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            / 1024
    }

    /// The daemon's log so far (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Unmounts with umount(8)-style unmount and waits for the daemon to exit; returns its exit status.
    pub fn unmount(mut self) -> ExitStatus {
        let status = self.unmount_inner();
        status.expect("daemon exits")
    }

    /// Unmounts as `umount(8)` does and waits for the daemon to exit: its status, how long after the unmount
    /// began it was gone, and its whole log.
    pub fn unmount_with_log(mut self) -> (ExitStatus, Duration, String) {
        let started = Instant::now();
        let status = self.unmount_inner().expect("daemon exits");
        (status, started.elapsed(), self.log())
    }

    /// SIGTERMs the daemon (`systemctl stop`) and waits (at most 20 s) for it to exit: its status, and its log.
    pub fn terminate_with_log(mut self) -> (Option<ExitStatus>, String) {
        let Some(mut child) = self.child.take() else {
            return (None, self.log());
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
        (status, self.log())
    }

    /// The daemon's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILLs the daemon (a crash), then detaches the dead mount as an operator would (`umount -l`).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
    }

    fn unmount_inner(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let mut unmounted = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::empty());
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut tries = 0;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            // The kernel may call the mount busy for a moment (EBUSY) while a test's last access drains;
            // ask again instead of waiting for a daemon that was never told to stop.
            tries += 1;
            if unmounted.is_err() && tries % 25 == 0 && is_mounted(self.dir.path()) {
                unmounted = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::empty());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("umount of {}: {unmounted:?}", self.dir.path().display());
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
        let _ = child.kill();
        let status = child.wait().ok();
        panic!(
            "daemon did not exit within 20 s of unmount ({status:?}):\n{}",
            self.log()
        );
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.child.is_some() {
            if std::thread::panicking() {
                eprintln!("--- expressfs log ---\n{}", self.log());
                if let Some(mut child) = self.child.take() {
                    let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
                    let _ = child.kill();
                    let _ = child.wait();
                }
            } else {
                self.unmount_inner();
            }
        }
        let _ = std::fs::remove_file(&self.log_path);
    }
}

/// True when `dir` is a mount point listed in /proc/self/mountinfo.
pub fn is_mounted(dir: &Path) -> bool {
    let target = dir.to_string_lossy();
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|info| {
            info.lines()
                .any(|line| line.split(' ').nth(4) == Some(&*target))
        })
        .unwrap_or(false)
}

/// Uploads many objects concurrently through the SDK (setup for listing tests).
pub fn put_many(emu: &Emulator, bucket: &str, objects: Vec<(String, Vec<u8>)>) {
    let client = s3_client(emu);
    let bucket = bucket.to_string();
    runtime().block_on(async {
        // 32 at a time, each task taking the next object from a shared queue.
        let queue = std::sync::Arc::new(std::sync::Mutex::new(objects));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..32 {
            let (client, queue, bucket) = (client.clone(), queue.clone(), bucket.clone());
            tasks.spawn(async move {
                loop {
                    let next = queue.lock().unwrap().pop();
                    let Some((key, data)) = next else { break };
                    client
                        .put_object()
                        .bucket(&bucket)
                        .key(&key)
                        .body(data.into())
                        .send()
                        .await
                        .unwrap_or_else(|e| panic!("put {key}: {e:?}"));
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("upload task");
        }
    });
}

/// Creates a bucket of the given kind on the shared emulator and returns its name.
pub fn fresh_bucket(directory: bool, tag: &str) -> String {
    let name = if directory {
        directory_bucket(tag)
    } else {
        general_bucket(tag)
    };
    create_bucket(emulator(), &name);
    name
}

/// The raw OS error of an io::Result, for errno assertions.
pub fn errno_of<T: std::fmt::Debug>(result: std::io::Result<T>) -> i32 {
    match result {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("not an OS error: {e}")),
    }
}

/// A call to the emulator's unauthenticated admin endpoints (`/_emulator/...`): (status, body).
pub fn admin(emu: &Emulator, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(emu.addr()).expect("connect to emulator");
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        emu.addr(),
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

pub fn admin_get(emu: &Emulator, path: &str) -> (u16, String) {
    admin(emu, "GET", path, "")
}

pub fn admin_post(emu: &Emulator, path: &str, body: &str) -> (u16, String) {
    admin(emu, "POST", path, body)
}

/// The body of `POST /_emulator/faults` (empty `operations` or `kinds` mean all).
pub fn faults_json(rate: f64, seed: u64, operations: &[&str], kinds: &[&str]) -> String {
    let list = |v: &[&str]| {
        v.iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        r#"{{"rate":{rate},"seed":{seed},"operations":[{}],"kinds":[{}]}}"#,
        list(operations),
        list(kinds)
    )
}

/// Sets `emu`'s fault plan (rate 0 clears it).
pub fn set_faults(emu: &Emulator, rate: f64, seed: u64, operations: &[&str], kinds: &[&str]) {
    let (status, answer) = admin_post(
        emu,
        "/_emulator/faults",
        &faults_json(rate, seed, operations, kinds),
    );
    assert_eq!(status, 200, "{answer}");
}

/// Every upload `emu` is sent is answered with a status no client retries, until the faults are cleared.
pub fn refuse_every_upload(emu: &Emulator) {
    let uploads = [
        "PutObject",
        "CreateMultipartUpload",
        "UploadPart",
        "CompleteMultipartUpload",
    ];
    set_faults(emu, 1.0, 1, &uploads, &["unexpected-status"]);
}

/// Requests of one operation (`GetObject`, `HeadObject`, ...) the shared emulator served for `bucket`.
pub fn op_count(bucket: &str, op: &str) -> u64 {
    op_stat(bucket, op, "requests")
}

/// One counter (`requests`, `errors`, `unsigned_payload`, ...) of one operation the shared emulator served
/// for `bucket`.
pub fn op_stat(bucket: &str, op: &str, counter: &str) -> u64 {
    emulator_stat(emulator(), Some(bucket), Some(op), counter)
}

/// One counter of `emu`'s stats (`{"bucket": {"GetObject": {"requests": N, ...}}}`), summed over every bucket
/// and operation, or only those named.
pub fn emulator_stat(emu: &Emulator, bucket: Option<&str>, op: Option<&str>, counter: &str) -> u64 {
    let (status, body) = admin_get(emu, "/_emulator/stats");
    assert_eq!(status, 200, "{body}");
    let stats: serde_json::Value = serde_json::from_str(&body).expect("the stats are JSON");
    let mut total = 0;
    for (name, ops) in stats.as_object().expect("buckets") {
        if bucket.is_some_and(|want| want != name) {
            continue;
        }
        for (name, counters) in ops.as_object().expect("operations") {
            if op.is_some_and(|want| want != name) {
                continue;
            }
            total += counters[counter]
                .as_u64()
                .unwrap_or_else(|| panic!("no counter {counter} in {counters}"));
        }
    }
    total
}

/// A loopback address for a daemon's `--metrics-addr`.
pub fn free_metrics_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// One sample of the daemon's Prometheus text at `addr` (`series` is the name with its labels), once the
/// endpoint answers; a series it does not show (a counter never incremented) is 0.
pub fn daemon_metric(addr: &str, series: &str) -> f64 {
    use std::io::{Read, Write};
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
            let mut body = String::new();
            let _ = s.read_to_string(&mut body);
            if let Some(v) = body
                .lines()
                .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            {
                return v;
            }
            if body.contains("expressfs_fuse_requests_total") {
                return 0.0;
            }
        }
        assert!(Instant::now() < deadline, "no {series} at {addr}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
