//! mount-s3 users switch by renaming the binary: the example command lines of Mountpoint's README and
//! CONFIGURATION (and its fstab lines) run here with only `mount-s3` renamed and the bucket and endpoint
//! pointed at the emulator, and either mount or fail for a reason mount-s3 gives too. The flags that change
//! requests are checked in the headers the emulator received. docs/MIGRATING.md is the table of the same.

mod common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    Mount, admin_get, admin_post, emulator, expressfs_command, fresh_bucket, is_mounted, put,
};

const KMS_KEY: &str = "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab";

/// What a documented command line must do here.
enum Expect {
    /// Mounts, and this file (relative to the mount) reads back with this content.
    Mounts(&'static str, &'static [u8]),
    /// Exits non-zero before mounting, saying this.
    Fails(&'static str),
}

/// Buckets and paths the documented lines refer to, created on the shared emulator.
struct Fixture {
    gp: String,
    xz: String,
    cache_xz: String,
    public: String,
    alias: String,
    dirs: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let gp = fresh_bucket(false, "mig");
        put(emulator(), &gp, "hello.txt", b"hello".to_vec());
        put(
            emulator(),
            &gp,
            "my/prefix/here/p.txt",
            b"prefixed".to_vec(),
        );
        put(emulator(), &gp, "2023/Files/data.json", b"{}".to_vec());
        let xz = fresh_bucket(true, "mig");
        put(emulator(), &xz, "hello.txt", b"hello".to_vec());
        let cache_xz = fresh_bucket(true, "migcache");
        let public = fresh_bucket(false, "migpublic");
        put(emulator(), &public, "hello.txt", b"public".to_vec());
        let (status, _) = admin_post(
            emulator(),
            &format!("/_emulator/public?bucket={public}"),
            "",
        );
        assert_eq!(status, 200);
        // The alias form of mount-s3's example: `<access point name>-<random>-s3alias`.
        let alias = format!("my-access-point-{}-s3alias", std::process::id());
        let (status, _) = admin_post(
            emulator(),
            &format!("/_emulator/alias?alias={alias}&bucket={gp}"),
            "",
        );
        assert_eq!(status, 200);
        let dirs = tempfile::tempdir().unwrap();
        std::fs::write(dirs.path().join("garbage.pem"), "not a certificate\n").unwrap();
        Fixture {
            gp,
            xz,
            cache_xz,
            public,
            alias,
            dirs,
        }
    }

    /// The documented line with its placeholders filled in.
    fn fill(&self, line: &str) -> Vec<String> {
        let dirs = self.dirs.path().display().to_string();
        line.replace("{gp}", &self.gp)
            .replace("{xz}", &self.xz)
            .replace("{cache_xz}", &self.cache_xz)
            .replace("{public}", &self.public)
            .replace("{alias}", &self.alias)
            .replace("{dirs}", &dirs)
            .replace("{ca}", "/etc/ssl/certs/ca-certificates.crt")
            .split_whitespace()
            .map(String::from)
            .collect()
    }
}

/// Runs each line (`BUCKET /path/to/mount FLAGS...`, mount-s3's order) and checks its outcome.
fn check_lines(fixture: &Fixture, lines: &[(&str, &str, Expect)]) {
    for (doc, line, expect) in lines {
        let argv = fixture.fill(line);
        assert_eq!(
            argv[1], "/path/to/mount",
            "{doc}: lines name the mount point second"
        );
        let (source, flags) = (&argv[0], &argv[2..]);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        match expect {
            Expect::Mounts(file, content) => {
                let mount = Mount::new(source, &flags);
                assert_eq!(
                    std::fs::read(mount.path().join(file)).unwrap_or_default(),
                    *content,
                    "{doc}: {line}\n{}",
                    mount.log()
                );
                assert!(mount.unmount().success(), "{doc}: {line}");
            }
            Expect::Fails(reason) => {
                let dir = tempfile::tempdir().unwrap();
                let out = expressfs_command(emulator())
                    .arg(source)
                    .arg(dir.path())
                    .args(&flags)
                    .stdin(Stdio::null())
                    .output()
                    .unwrap();
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(!out.status.success(), "{doc}: {line} mounted");
                assert!(!is_mounted(dir.path()));
                assert!(
                    stderr.contains(reason),
                    "{doc}: {line}: expected {reason:?} in:\n{stderr}"
                );
            }
        }
    }
}

#[test]
fn readme_and_bucket_forms() {
    let f = Fixture::new();
    let config = f.dirs.path().join("aws-config");
    std::fs::write(
        &config,
        format!(
            "[profile marketingadmin]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            common::ACCESS_KEY,
            common::SECRET_KEY
        ),
    )
    .unwrap();
    // SAFETY: set before any mount of this test starts; children inherit it.
    unsafe { std::env::set_var("AWS_CONFIG_FILE", &config) };
    check_lines(
        &f,
        &[
            (
                "README",
                "{gp} /path/to/mount",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: credentials",
                "{gp} /path/to/mount --profile marketingadmin",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: public buckets",
                "{public} /path/to/mount --no-sign-request",
                Expect::Mounts("hello.txt", b"public"),
            ),
            (
                "CONFIGURATION: directory buckets",
                "{xz} /path/to/mount",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: directory buckets",
                "{xz} /path/to/mount --bucket-type directory",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: prefix URI",
                "s3://{gp}/my/prefix/here/ /path/to/mount",
                Expect::Mounts("p.txt", b"prefixed"),
            ),
            (
                "CONFIGURATION: prefix",
                "{gp} /path/to/mount --prefix 2023/",
                Expect::Mounts("Files/data.json", b"{}"),
            ),
            (
                "CONFIGURATION: prefix",
                "{gp} /path/to/mount --prefix 2023/Files/",
                Expect::Mounts("data.json", b"{}"),
            ),
            (
                "CONFIGURATION: access points",
                "{alias} /path/to/mount",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: endpoints",
                "{gp} /path/to/mount --force-path-style",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            // The same endpoint rules as mount-s3's CRT: an explicit endpoint is the host, so neither
            // acceleration nor dual-stack can choose another.
            (
                "CONFIGURATION: endpoints",
                "{gp} /path/to/mount --transfer-acceleration",
                Expect::Fails("A custom endpoint cannot be combined with S3 Accelerate"),
            ),
            (
                "CONFIGURATION: endpoints",
                "{gp} /path/to/mount --dual-stack",
                Expect::Fails("Cannot set dual-stack in combination with a custom endpoint"),
            ),
            (
                "CONFIGURATION: prefix URI",
                "s3://arn:aws:s3:us-east-1:111122223333:accesspoint/ap/ /path/to/mount",
                Expect::Fails("ARN cannot be written as an s3:// URI"),
            ),
            (
                "CONFIGURATION: prefix URI",
                "s3://{gp}/my/ /path/to/mount --prefix 2023/",
                Expect::Fails("give the prefix once"),
            ),
            (
                "CONFIGURATION: directory buckets",
                "{gp} /path/to/mount --bucket-type directory",
                Expect::Fails("is not a directory bucket name"),
            ),
            // Not supported here (mount-s3 mounts these): said so at startup.
            (
                "CONFIGURATION: Outposts",
                "arn:aws:s3-outposts:region:123456789012:outpost/op-01ac5d28a6a232904/bucket/example-outposts-bucket /path/to/mount",
                Expect::Fails("S3 on Outposts is not supported"),
            ),
        ],
    );
    // Without the bucket's consent an unsigned request is refused, as S3 does.
    check_lines(
        &f,
        &[(
            "CONFIGURATION: public buckets",
            "{gp} /path/to/mount --no-sign-request",
            Expect::Fails("access denied"),
        )],
    );
}

#[test]
fn request_and_file_system_flags() {
    let f = Fixture::new();
    check_lines(
        &f,
        &[
            (
                "CONFIGURATION: CA bundle",
                "{gp} /path/to/mount --ca-bundle {ca}",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: CA bundle",
                "{gp} /path/to/mount --ca-bundle /path/to/ca.pem",
                Expect::Fails("--ca-bundle: /path/to/ca.pem"),
            ),
            (
                "CONFIGURATION: CA bundle",
                "{gp} /path/to/mount --ca-bundle {dirs}/garbage.pem",
                Expect::Fails("no certificate"),
            ),
            (
                "CONFIGURATION: encryption",
                &format!("{{gp}} /path/to/mount --sse aws:kms --sse-kms-key-id {KMS_KEY}"),
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: encryption",
                "{gp} /path/to/mount --sse aws:kms:dsse",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: encryption",
                "{xz} /path/to/mount --sse AES256",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: encryption",
                "{gp} /path/to/mount --sse-kms-key-id alias/my-key --sse aws:kms",
                Expect::Fails("full ARN"),
            ),
            (
                "CONFIGURATION: other bucket configuration",
                "{gp} /path/to/mount --requester-pays",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: other bucket configuration",
                "{gp} /path/to/mount --expected-bucket-owner 111122223333",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: storage class",
                "{gp} /path/to/mount --storage-class INTELLIGENT_TIERING",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: storage class",
                "{xz} /path/to/mount --storage-class STANDARD",
                Expect::Fails("EXPRESS_ONEZONE"),
            ),
            (
                "CONFIGURATION: content type",
                "{gp} /path/to/mount --infer-content-type",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: file system",
                "{gp} /path/to/mount --allow-delete --allow-overwrite --uid 7 --gid 7 --dir-mode 0750 --file-mode 0640",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: file system",
                "{gp} /path/to/mount --read-only --allow-other",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: file system",
                "{xz} /path/to/mount --incremental-upload",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: performance",
                "{gp} /path/to/mount --maximum-throughput-gbps 100 --max-threads 32 --part-size 16777216 --memory-target 2048",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: metadata cache",
                "{gp} /path/to/mount --metadata-ttl 300",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: metadata cache",
                "{gp} /path/to/mount --metadata-ttl indefinite",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: metadata cache",
                "{gp} /path/to/mount --metadata-ttl minimal",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: local cache",
                "{gp} /path/to/mount --cache {dirs}/mp-cache",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: local cache",
                "{gp} /path/to/mount --cache {dirs}/mp-cache --max-cache-size 1024",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: shared cache",
                "{gp} /path/to/mount --cache-xz {cache_xz}",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: combined cache",
                "{gp} /path/to/mount --cache {dirs}/mp-cache2 --cache-xz {cache_xz}",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            // mount-s3's example names NICs this machine lacks: both refuse them.
            (
                "CONFIGURATION: multiple NICs",
                "{gp} /path/to/mount --bind ens0 --bind ens1",
                Expect::Fails("no network interface named \"ens0\""),
            ),
            (
                "CONFIGURATION: multiple NICs",
                "{gp} /path/to/mount --bind lo --bind lo",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "CONFIGURATION: fstab",
                "{gp} /path/to/mount --user-agent-prefix foo,bar",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "--help: logging",
                "{gp} /path/to/mount -d -l {dirs}/logs --debug-crt",
                Expect::Mounts("hello.txt", b"hello"),
            ),
            (
                "--help: checksums",
                "{gp} /path/to/mount --upload-checksums off",
                Expect::Mounts("hello.txt", b"hello"),
            ),
        ],
    );
    let logs = std::fs::read_dir(f.dirs.path().join("logs"))
        .unwrap()
        .count();
    assert!(logs > 0, "-l DIR writes the log there");
}

/// mount(8) runs `mount.expressfs SOURCE DIR -o OPTIONS` for an fstab line: mount-s3's fstab examples, with
/// the type renamed and the emulator's endpoint added to the options.
#[test]
fn documented_fstab_lines() {
    let f = Fixture::new();
    let endpoint = emulator().endpoint_url();
    for (source, options, file, content) in [
        (
            format!("s3://{}/my/prefix/here/", f.gp),
            "_netdev,nosuid,nodev,nofail,rw".to_string(),
            "p.txt",
            &b"prefixed"[..],
        ),
        (
            format!("s3://{}", f.gp),
            "_netdev,nosuid,nodev,nofail,rw,allow-delete,uid=7,region=us-east-1,allow-other".into(),
            "hello.txt",
            b"hello",
        ),
        (
            format!("s3://{}", f.gp),
            r"_netdev,nosuid,nodev,nofail,rw,user-agent-prefix=foo\,bar".into(),
            "hello.txt",
            b"hello",
        ),
        (
            format!("s3://{}/", f.gp),
            "_netdev,nosuid,nodev,rw,nofail,allow-other".into(),
            "hello.txt",
            b"hello",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_expressfs"))
            .arg0("mount.expressfs")
            .arg(&source)
            .arg(dir.path())
            .arg("-o")
            .arg(format!("{options},endpoint-url={endpoint}"))
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_ACCESS_KEY_ID", common::ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", common::SECRET_KEY)
            .env("AWS_REGION", common::REGION)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{source} {options}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let read = std::fs::read(dir.path().join(file));
        unmount(dir.path());
        assert_eq!(read.unwrap(), content, "{source} {options}");
    }
}

fn unmount(dir: &Path) {
    assert!(Command::new("umount").arg(dir).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while is_mounted(dir) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The requests the emulator recorded for a bucket (and key, and operation when given).
fn recorded(bucket: &str, key: Option<&str>, op: Option<&str>) -> Vec<serde_json::Value> {
    let mut path = format!("/_emulator/requests?bucket={bucket}");
    if let Some(key) = key {
        path.push_str(&format!("&key={key}"));
    }
    if let Some(op) = op {
        path.push_str(&format!("&op={op}"));
    }
    let (status, body) = admin_get(emulator(), &path);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<Vec<serde_json::Value>>(&body).unwrap()
}

fn header<'a>(request: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    request["headers"][name].as_str()
}

#[test]
fn request_flags_reach_the_service() {
    assert_eq!(
        admin_post(emulator(), "/_emulator/requests/record?on=true", "").0,
        200
    );
    let bucket = fresh_bucket(false, "headers");
    put(emulator(), &bucket, "old.txt", b"old".to_vec());
    let mount = Mount::new(
        &bucket,
        &[
            "--sse",
            "aws:kms",
            "--sse-kms-key-id",
            KMS_KEY,
            "--storage-class",
            "STANDARD_IA",
            "--infer-content-type",
            "--requester-pays",
            "--expected-bucket-owner",
            "111122223333",
            "--user-agent-prefix",
            "team-a/1.0",
            "--write-part-size",
            "5M",
        ],
    );
    std::fs::write(mount.path().join("a.json"), b"{\"a\":1}").unwrap();
    std::fs::write(mount.path().join("big.bin"), vec![7u8; 6 << 20]).unwrap();
    std::fs::write(mount.path().join("noext"), b"x").unwrap();
    assert_eq!(std::fs::read(mount.path().join("old.txt")).unwrap(), b"old");
    assert!(mount.unmount().success());

    let put_json = recorded(&bucket, Some("a.json"), Some("PutObject"));
    assert_eq!(put_json.len(), 1, "{put_json:?}");
    let mpu = recorded(&bucket, Some("big.bin"), Some("CreateMultipartUpload"));
    assert_eq!(
        mpu.len(),
        1,
        "a 6 MiB file with 5 MiB parts is a multipart upload"
    );
    for (request, content_type) in [
        (&put_json[0], "application/json"),
        (&mpu[0], "application/octet-stream"),
    ] {
        assert_eq!(
            header(request, "x-amz-server-side-encryption"),
            Some("aws:kms")
        );
        assert_eq!(
            header(request, "x-amz-server-side-encryption-aws-kms-key-id"),
            Some(KMS_KEY)
        );
        assert_eq!(header(request, "x-amz-storage-class"), Some("STANDARD_IA"));
        assert_eq!(header(request, "content-type"), Some(content_type));
    }
    let noext = recorded(&bucket, Some("noext"), Some("PutObject"));
    assert_ne!(header(&noext[0], "content-type"), Some("application/json"));
    // The part uploads carry no object settings (S3 takes them from CreateMultipartUpload).
    let part = &recorded(&bucket, Some("big.bin"), Some("UploadPart"))[0];
    assert_eq!(header(part, "x-amz-storage-class"), None);

    let all = recorded(&bucket, None, None);
    let ours: Vec<_> = all
        .iter()
        .filter(|r| header(r, "user-agent").is_some_and(|a| a.starts_with("team-a/1.0 ")))
        .collect();
    // Every request of the mount (HeadBucket, listings, reads, writes) carries the flags; the test's own
    // setup PUT does not.
    assert!(ours.len() >= 8, "{} of {} requests", ours.len(), all.len());
    for request in &ours {
        assert_eq!(
            header(request, "x-amz-request-payer"),
            Some("requester"),
            "{request}"
        );
        assert_eq!(
            header(request, "x-amz-expected-bucket-owner"),
            Some("111122223333"),
            "{request}"
        );
        assert_eq!(request["signed"], true);
    }
    for op in [
        "HeadBucket",
        "ListObjectsV2",
        "GetObject",
        "PutObject",
        "UploadPart",
        "CompleteMultipartUpload",
    ] {
        assert!(ours.iter().any(|r| r["op"] == op), "no {op} with the flags");
    }
}

#[test]
fn directory_buckets_get_sse_on_writes() {
    assert_eq!(
        admin_post(emulator(), "/_emulator/requests/record?on=true", "").0,
        200
    );
    let bucket = fresh_bucket(true, "xzsse");
    let mount = Mount::new(
        &bucket,
        &[
            "--sse",
            "aws:kms",
            "--storage-class",
            "EXPRESS_ONEZONE",
            "--infer-content-type",
            "--expected-bucket-owner",
            "111122223333",
            "--user-agent-prefix",
            "xz/1",
        ],
    );
    std::fs::write(mount.path().join("page.html"), b"<p>").unwrap();
    assert!(mount.unmount().success());
    let put = recorded(&bucket, Some("page.html"), Some("PutObject"));
    assert_eq!(put.len(), 1);
    assert_eq!(
        header(&put[0], "x-amz-server-side-encryption"),
        Some("aws:kms")
    );
    assert_eq!(
        header(&put[0], "x-amz-storage-class"),
        Some("EXPRESS_ONEZONE")
    );
    assert_eq!(header(&put[0], "content-type"), Some("text/html"));
    // Session-signed requests carry the owner header too (signed with the session's keys).
    let ours: Vec<_> = recorded(&bucket, None, None)
        .into_iter()
        .filter(|r| header(r, "user-agent").is_some_and(|a| a.starts_with("xz/1 ")))
        .collect();
    assert!(ours.iter().any(|r| r["op"] == "ListObjectsV2"));
    for request in &ours {
        assert_eq!(
            header(request, "x-amz-expected-bucket-owner"),
            Some("111122223333"),
            "{request}"
        );
    }
}

#[test]
fn unsigned_requests_read_a_public_bucket() {
    assert_eq!(
        admin_post(emulator(), "/_emulator/requests/record?on=true", "").0,
        200
    );
    let bucket = fresh_bucket(false, "anon");
    put(emulator(), &bucket, "open.txt", b"open".to_vec());
    assert_eq!(
        admin_post(
            emulator(),
            &format!("/_emulator/public?bucket={bucket}"),
            ""
        )
        .0,
        200
    );
    let mount = Mount::new(&bucket, &["--no-sign-request", "--read-only"]);
    assert_eq!(
        std::fs::read(mount.path().join("open.txt")).unwrap(),
        b"open"
    );
    assert!(mount.unmount().success());
    let gets = recorded(&bucket, Some("open.txt"), Some("GetObject"));
    assert!(!gets.is_empty());
    for get in &gets {
        assert_eq!(get["signed"], false, "{get}");
    }
    // A public bucket takes no anonymous writes.
    let mount = Mount::new(&bucket, &["--no-sign-request"]);
    let mut file = std::fs::File::create(mount.path().join("new.txt")).unwrap();
    std::io::Write::write_all(&mut file, b"x").unwrap();
    assert_eq!(
        common::errno_of(file.sync_all()),
        libc::EACCES,
        "the upload is refused"
    );
    drop(file);
    drop(mount);
    assert!(common::get(emulator(), &bucket, "new.txt").is_none());
}

/// `--bind lo`: the daemon's connections to the emulator are bound to lo (ss shows `%lo` on them).
#[test]
fn bind_puts_the_sockets_on_the_interface() {
    let bucket = fresh_bucket(false, "bind");
    put(emulator(), &bucket, "f", b"bound".to_vec());
    let port = emulator().addr().port();
    let bound_connections = || {
        let out = Command::new("ss")
            .args(["-tnH", "state", "established"])
            .output();
        let Ok(out) = out else { return None };
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        Some(
            text.lines()
                .filter(|l| l.contains("%lo:") && l.contains(&format!("127.0.0.1:{port}")))
                .count(),
        )
    };
    if bound_connections().is_none() {
        eprintln!("skipping the socket check: ss is not installed");
    }
    let plain = Mount::new(&bucket, &[]);
    assert_eq!(std::fs::read(plain.path().join("f")).unwrap(), b"bound");
    let unbound = bound_connections();
    assert!(plain.unmount().success());
    let mount = Mount::new(&bucket, &["--bind", "lo", "--bind", "lo"]);
    assert_eq!(std::fs::read(mount.path().join("f")).unwrap(), b"bound");
    if let (Some(before), Some(after)) = (unbound, bound_connections()) {
        assert_eq!(before, 0, "without --bind no socket is bound to a device");
        assert!(
            after > 0,
            "with --bind lo the daemon's sockets are bound to lo"
        );
    }
    assert!(mount.unmount().success());
}

#[test]
fn access_point_alias_is_a_bucket_name() {
    let bucket = fresh_bucket(false, "aliased");
    put(emulator(), &bucket, "via-alias.txt", b"ap".to_vec());
    let alias = format!("analytics-ap-{}-s3alias", std::process::id());
    assert_eq!(
        admin_post(
            emulator(),
            &format!("/_emulator/alias?alias={alias}&bucket={bucket}"),
            ""
        )
        .0,
        200
    );
    let mount = Mount::new(&alias, &[]);
    assert_eq!(
        std::fs::read(mount.path().join("via-alias.txt")).unwrap(),
        b"ap"
    );
    std::fs::write(mount.path().join("written.txt"), b"w").unwrap();
    assert!(mount.unmount().success());
    assert_eq!(
        common::get(emulator(), &bucket, "written.txt").unwrap(),
        b"w"
    );
}

/// `--ca-bundle` over real TLS: an emulator serving HTTPS with a certificate from a private CA. With the CA
/// as the bundle the mount reads and writes; without it the daemon refuses to start, names the certificate
/// problem, and leaves nothing mounted.
#[test]
fn ca_bundle_trusts_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (ca_pem, cert_pem, key_pem) = private_ca_and_server_cert("127.0.0.1");
    let ca = dir.path().join("ca.pem");
    let cert = dir.path().join("server.pem");
    let key = dir.path().join("server.key");
    std::fs::write(&ca, ca_pem).unwrap();
    std::fs::write(&cert, cert_pem).unwrap();
    std::fs::write(&key, key_pem).unwrap();
    let bucket = common::general_bucket("tls");
    let emu = common::start_emulator(expressfs_emulator::EmulatorConfig {
        buckets: vec![bucket.clone()],
        tls: Some(expressfs_emulator::tls::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        }),
        ..Default::default()
    });
    assert!(emu.endpoint_url().starts_with("https://127.0.0.1:"));
    let ca_arg = ca.to_str().unwrap();

    let mount = Mount::on(&emu, &bucket, &["--ca-bundle", ca_arg]);
    std::fs::write(mount.path().join("over-tls.txt"), b"encrypted in transit").unwrap();
    assert!(mount.unmount().success());
    // A second daemon (no cache) reads it back from the bucket, over TLS again.
    let mount = Mount::on(&emu, &bucket, &["--ca-bundle", ca_arg, "--read-only"]);
    assert_eq!(
        std::fs::read(mount.path().join("over-tls.txt")).unwrap(),
        b"encrypted in transit"
    );
    assert!(mount.unmount().success());

    // The system's roots do not know the private CA: the mount fails at startup, saying why.
    let target = tempfile::tempdir().unwrap();
    let out = expressfs_command(&emu)
        .args(["--foreground", &bucket])
        .arg(target.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "mounted without the CA:\n{stderr}");
    assert!(
        stderr.contains("invalid peer certificate: UnknownIssuer")
            && stderr.contains("--ca-bundle"),
        "the error names the certificate problem and the flag:\n{stderr}"
    );
    assert!(!is_mounted(target.path()));
    // A bundle without that CA in it fails the same way (the bundle replaces the system's roots).
    let other = dir.path().join("other-ca.pem");
    std::fs::write(&other, private_ca_and_server_cert("127.0.0.1").0).unwrap();
    let out = expressfs_command(&emu)
        .args([
            "--foreground",
            "--ca-bundle",
            other.to_str().unwrap(),
            &bucket,
        ])
        .arg(target.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .to_lowercase()
            .contains("certificate")
    );
    assert!(!is_mounted(target.path()));
}

/// A CA certificate (PEM), and a server certificate it signed for `ip` with the server's key (PEM).
fn private_ca_and_server_cert(ip: &str) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "expressfs test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    // An IP string becomes an IP address SAN, which is what a client connecting to 127.0.0.1 checks.
    let server_params = CertificateParams::new(vec![ip.to_string()]).unwrap();
    let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();
    (ca_cert.pem(), server_cert.pem(), server_key.serialize_pem())
}

/// An access point ARN mounts a general-purpose bucket. The SDK's endpoint rules send its requests to the
/// access point's own host (`NAME-ACCOUNT.` before the endpoint's host), a name no resolver here knows, so
/// the daemon reaches it through an HTTP proxy (`HTTP_PROXY`, honoured as by the SDK's default client) that
/// is the emulator itself, where `NAME-ACCOUNT` is an access point for the bucket. Path-style addressing would
/// have asked for a bucket named after the file: every answer below proves the access point's host was used.
#[test]
fn access_point_arn_mounts_through_its_own_host() {
    let bucket = fresh_bucket(false, "arnap");
    put(emulator(), &bucket, "via-arn.txt", b"arn".to_vec());
    let (account, name) = ("123456789012", format!("ap{}", std::process::id()));
    let (status, _) = admin_post(
        emulator(),
        &format!("/_emulator/alias?alias={name}-{account}&bucket={bucket}"),
        "",
    );
    assert_eq!(status, 200);
    let arn = format!("arn:aws:s3:{}:{account}:accesspoint/{name}", common::REGION);
    let proxy = emulator().endpoint_url();
    let env = [
        ("HTTP_PROXY", proxy.as_str()),
        ("http_proxy", proxy.as_str()),
        ("NO_PROXY", ""),
        ("no_proxy", ""),
    ];
    let mount = Mount::with_env(&arn, &[], &env);
    assert_eq!(
        std::fs::read(mount.path().join("via-arn.txt")).unwrap(),
        b"arn"
    );
    let names: Vec<_> = std::fs::read_dir(mount.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["via-arn.txt"]);
    std::fs::write(mount.path().join("written.txt"), b"w").unwrap();
    assert!(mount.unmount().success());
    assert_eq!(
        common::get(emulator(), &bucket, "written.txt").unwrap(),
        b"w"
    );
}
