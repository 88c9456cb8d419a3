//! Reliability through real mounts: under injected faults of every kind, reads and writes either complete with
//! the exact bytes or fail loudly (never a wrong byte); a daemon killed mid-write leaves no partial object and
//! the bucket mounts again; no credential or session token reaches the logs; cache files are private.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{
    Mount, admin_get, admin_post, emulator_stat, faults_json, fresh_bucket, get, own_emulator,
    pattern, put, put_many, refuse_every_upload, set_faults, sha256_hex,
};

const MIB: usize = 1024 * 1024;

/// Sizes of the fault test: CI-sized by default; `EXPRESSFS_FAULT_SCALE=full` runs the sizes (1 GiB
/// read, 2,000 small files, 1 GiB write) and `EXPRESSFS_FAULT_SEEDS=1,2,3,4` picks the seeds.
fn fault_test_plan() -> (usize, usize, usize, Vec<u64>) {
    let full = std::env::var("EXPRESSFS_FAULT_SCALE").is_ok_and(|v| v == "full");
    let seeds = std::env::var("EXPRESSFS_FAULT_SEEDS")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2]);
    if full {
        (1024 * MIB + 5, 2000, 1024 * MIB + 3, seeds)
    } else {
        (64 * MIB + 5, 250, 24 * MIB + 3, seeds)
    }
}

#[test]
fn faults_never_produce_wrong_bytes() {
    let (bucket, emu) = own_emulator(true, "faults");
    let (big_len, small_count, write_len, seeds) = fault_test_plan();
    let big = pattern(1, big_len);
    let small: Vec<(String, Vec<u8>)> = (0..small_count as u64)
        .map(|i| (format!("small/{i:04}"), pattern(10 + i, 20_000)))
        .collect();
    put(&emu, &bucket, "big.bin", big.clone());
    put_many(&emu, &bucket, small.clone());
    // Every kind but latency spikes (which only slow things down) at 10%.
    let kinds = [
        "internal-error",
        "slow-down",
        "reset-before-body",
        "reset-mid-body",
        "truncated-body",
        "expired-token",
    ];
    let mut completed = 0;
    let mut loud_failures = 0;
    for seed in seeds {
        let mount = Mount::on(&emu, &bucket, &["--metadata-ttl", "minimal"]);
        let (status, answer) = admin_post(
            &emu,
            "/_emulator/faults",
            &faults_json(0.1, seed, &[], &kinds),
        );
        assert_eq!(status, 200, "{answer}");

        match std::fs::read(mount.path().join("big.bin")) {
            Ok(data) => {
                assert!(
                    data == big,
                    "seed {seed}: wrong bytes from a sequential read"
                );
                completed += 1;
            }
            Err(e) => {
                eprintln!("seed {seed}: big read failed loudly: {e}");
                loud_failures += 1;
            }
        }
        for (name, data) in &small {
            match std::fs::read(mount.path().join(name)) {
                Ok(got) => {
                    assert!(&got == data, "seed {seed}: wrong bytes in {name}");
                    completed += 1;
                }
                Err(_) => loud_failures += 1,
            }
        }
        let written = pattern(100 + seed, write_len);
        let path = mount.path().join(format!("out-{seed}.bin"));
        let result = (|| -> std::io::Result<()> {
            let mut f = std::fs::File::create(&path)?;
            for chunk in written.chunks(MIB) {
                f.write_all(chunk)?;
            }
            f.sync_all()
        })();
        set_faults(&emu, 0.0, 0, &[], &[]);
        let stored = get(&emu, &bucket, &format!("out-{seed}.bin"));
        match result {
            Ok(()) => {
                assert_eq!(
                    stored.map(|s| sha256_hex(&s)),
                    Some(sha256_hex(&written)),
                    "seed {seed}: acknowledged write not intact"
                );
                completed += 1;
            }
            Err(e) => {
                eprintln!("seed {seed}: write failed loudly: {e}");
                assert!(
                    stored.is_none(),
                    "seed {seed}: a failed write left an object behind"
                );
                loud_failures += 1;
            }
        }
        drop(mount);
    }
    assert!(
        emulator_stat(&emu, None, None, "errors") > 20,
        "few faults were injected; the test tested little"
    );
    assert!(
        completed > loud_failures * 10,
        "retries should absorb 10% faults: {completed} ok, {loud_failures} failed"
    );
    let (_, uploads) = admin_get(&emu, &format!("/_emulator/uploads?bucket={bucket}"));
    assert_eq!(uploads.trim(), "[]", "multipart uploads left behind");
}

#[test]
fn sigkill_mid_write_leaves_no_partial_object() {
    let bucket = fresh_bucket(true, "kill");
    put(
        common::emulator(),
        &bucket,
        "kept.bin",
        b"old contents".to_vec(),
    );
    let mut mount = Mount::new(&bucket, &["--allow-overwrite"]);
    let mut fresh = std::fs::File::create(mount.path().join("new.bin")).unwrap();
    let mut replace = std::fs::File::create(mount.path().join("kept.bin")).unwrap();
    let data = pattern(5, 20 * MIB);
    fresh.write_all(&data).unwrap();
    replace.write_all(&data).unwrap();
    std::thread::sleep(Duration::from_millis(300)); // let some parts reach the bucket
    mount.kill();
    drop((fresh, replace));
    assert!(
        get(common::emulator(), &bucket, "new.bin").is_none(),
        "partial new object"
    );
    assert_eq!(
        get(common::emulator(), &bucket, "kept.bin").unwrap(),
        b"old contents"
    );

    // Appends: only whole, acknowledged appends are visible; the object is old bytes plus whole parts.
    let mut mount = Mount::new(&bucket, &["--incremental-upload"]);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(mount.path().join("kept.bin"))
        .unwrap();
    f.write_all(&data).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    mount.kill();
    drop(f);
    let after = get(common::emulator(), &bucket, "kept.bin").unwrap();
    assert!(after.starts_with(b"old contents"));
    let appended = &after[b"old contents".len()..];
    assert_eq!(
        appended.len() % (8 * MIB),
        0,
        "a torn append: {} bytes",
        appended.len()
    );
    assert_eq!(appended, &data[..appended.len()]);

    // The bucket mounts again and reads.
    let again = Mount::new(&bucket, &[]);
    let mut back = Vec::new();
    std::fs::File::open(again.path().join("kept.bin"))
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert_eq!(back, after);
}

#[test]
fn no_credentials_or_session_tokens_in_debug_logs() {
    let bucket = fresh_bucket(true, "secrets");
    put(common::emulator(), &bucket, "f", b"x".to_vec());
    let mount = Mount::new(&bucket, &["--debug"]);
    std::fs::read(mount.path().join("f")).unwrap();
    std::fs::write(mount.path().join("g"), b"y").unwrap();
    let log = mount.log();
    assert!(
        log.contains("HeadObject") || log.contains("GetObject"),
        "debug log is empty: nothing was checked"
    );
    for secret in [
        common::SECRET_KEY,
        "SessionToken",
        "SecretAccessKey",
        "x-amz-s3session-token: ",
        "Signature=",
    ] {
        assert!(!log.contains(secret), "log contains {secret:?}");
    }
}

#[test]
fn cache_and_staging_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let bucket = fresh_bucket(true, "perm");
    put(common::emulator(), &bucket, "f", pattern(1, 100_000));
    let cache = tempfile::tempdir().unwrap();
    let mount = Mount::new(&bucket, &["--cache", cache.path().to_str().unwrap()]);
    std::fs::read(mount.path().join("f")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let blocks = cache.path().join("blocks");
    assert_eq!(
        std::fs::metadata(&blocks).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let mut files = 0;
    for e in std::fs::read_dir(&blocks).unwrap() {
        let mode = e.unwrap().metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        files += 1;
    }
    assert!(files > 0);
}

fn fault_only(emu: &expressfs_emulator::Emulator, ops: &[&str], kinds: &[&str]) {
    let body = faults_json(1.0, 3, ops, kinds);
    let (status, answer) = admin_post(emu, "/_emulator/faults", &body);
    assert_eq!(status, 200, "{answer}");
}

/// Answers no S3 client expects (a cut XML document, a 200 carrying an error, a 418 with a text body, a
/// 500 with an HTML body) make the operation fail with EIO; nothing is half-written and everything works
/// again once the server behaves.
#[test]
fn malformed_answers_and_odd_statuses_fail_loudly_and_lose_nothing() {
    let (bucket, emu) = own_emulator(true, "malformed");
    let data = pattern(5, 3 * MIB + 1);
    put(&emu, &bucket, "dir/f.bin", data.clone());
    let mount = Mount::on(
        &emu,
        &bucket,
        &["--metadata-ttl", "minimal", "--allow-overwrite"],
    );
    assert!(mount.path().join("dir/f.bin").exists());

    fault_only(&emu, &["ListObjectsV2"], &["malformed-xml"]);
    let listed =
        std::fs::read_dir(mount.path().join("dir")).and_then(|d| d.collect::<Result<Vec<_>, _>>());
    assert_eq!(common::errno_of(listed), libc::EIO, "cut listing XML");

    // (A 500 with an HTML body is retried like any 500; the retryable kinds are covered above.)
    fault_only(&emu, &["GetObject"], &["unexpected-status"]);
    let read = std::fs::read(mount.path().join("dir/f.bin"));
    assert_eq!(common::errno_of(read), libc::EIO, "HTTP 418 on GetObject");

    // CompleteMultipartUpload answering 200 with an <Error> inside: the write must fail, not succeed.
    fault_only(&emu, &["CompleteMultipartUpload"], &["malformed-xml"]);
    let big = pattern(6, 12 * MIB);
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(mount.path().join("dir/new.bin"))?;
        f.write_all(&big)?;
        f.sync_all()
    })();
    assert_eq!(
        common::errno_of(result),
        libc::EIO,
        "a completion that failed inside a 200"
    );

    set_faults(&emu, 0.0, 0, &[], &[]);
    assert!(
        get(&emu, &bucket, "dir/new.bin").is_none(),
        "nothing partial under the key"
    );
    assert_eq!(std::fs::read(mount.path().join("dir/f.bin")).unwrap(), data);
    assert_eq!(
        std::fs::read_dir(mount.path().join("dir")).unwrap().count(),
        1
    );
    let log = mount.log();
    assert!(
        log.contains("dir/f.bin") && log.contains("418") && log.contains("ListObjectsV2 answer"),
        "failures are logged with their key:\n{log}"
    );
    drop(mount);
    let (_, uploads) = admin_get(&emu, &format!("/_emulator/uploads?bucket={bucket}"));
    assert_eq!(uploads.trim(), "[]", "the failed upload was aborted");
}

/// A whole-server pause: reads in progress wait (or time out with an error), never return wrong or short
/// data, and the mount works normally afterwards.
#[test]
fn a_paused_server_delays_but_does_not_corrupt() {
    let (bucket, emu) = own_emulator(true, "pause");
    let data = pattern(8, 20 * MIB + 3);
    put(&emu, &bucket, "f.bin", data.clone());
    let mount = Mount::on(&emu, &bucket, &["--metadata-ttl", "minimal"]);
    let (status, answer) = common::admin(&emu, "POST", "/_emulator/pause?ms=4000", "");
    assert_eq!(status, 200, "{answer}");
    let started = std::time::Instant::now();
    match std::fs::read(mount.path().join("f.bin")) {
        Ok(got) => assert!(got == data, "wrong bytes after a pause"),
        Err(e) => eprintln!("read failed loudly during the pause: {e}"),
    }
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "the pause did not hold the request"
    );
    assert_eq!(std::fs::read(mount.path().join("f.bin")).unwrap(), data);
    let (status, _) = common::admin(&emu, "POST", "/_emulator/pause?ms=nope", "");
    assert_eq!(status, 400);
}

/// Without --allow-other, another uid is refused by the kernel (EACCES); with it, the other uid can read.
#[test]
fn other_users_need_allow_other() {
    use std::os::unix::process::CommandExt;
    let bucket = fresh_bucket(true, "uid");
    put(common::emulator(), &bucket, "f", b"hello".to_vec());
    let as_nobody = |path: &std::path::Path| {
        std::process::Command::new("cat")
            .arg(path)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    let private = Mount::new(&bucket, &[]);
    let out = as_nobody(&private.path().join("f"));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(private);
    let shared = Mount::new(&bucket, &["--allow-other"]);
    let out = as_nobody(&shared.path().join("f"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"hello");
}

/// 10,000 handles open at once: every one reads its bytes, and the daemon does not hold a descriptor per
/// handle.
#[test]
fn ten_thousand_open_files() {
    let bucket = fresh_bucket(true, "manyopen");
    let files: Vec<(String, Vec<u8>)> = (0..100)
        .map(|i| (format!("f{i:03}"), pattern(900 + i, 4096)))
        .collect();
    put_many(common::emulator(), &bucket, files.clone());
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 20_000, 20_000)
        .unwrap();
    let mount = Mount::new(&bucket, &[]);
    let mut handles = Vec::with_capacity(10_000);
    for i in 0..10_000 {
        let (name, _) = &files[i % files.len()];
        handles.push(std::fs::File::open(mount.path().join(name)).unwrap());
    }
    let daemon_fds = mount.open_fds();
    for (i, f) in handles.iter_mut().enumerate() {
        let mut first = [0u8; 16];
        f.read_exact(&mut first).unwrap();
        assert_eq!(first, files[i % files.len()].1[..16]);
    }
    assert!(
        daemon_fds < 200,
        "daemon holds {daemon_fds} fds for 10,000 handles"
    );
    drop(handles);
}

/// A full staging or cache file system: the write that needs the space fails loudly (and leaves nothing
/// under its key); reads go on, served from the bucket.
#[test]
fn full_cache_and_staging_disk() {
    let bucket = fresh_bucket(true, "enospc");
    let data = pattern(31, 6 * MIB);
    put(common::emulator(), &bucket, "big.bin", data.clone());
    let cache = tempfile::tempdir().unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        cache.path(),
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    struct Unmount<'a>(&'a std::path::Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _tmpfs = Unmount(cache.path());
    let mount = Mount::new(
        &bucket,
        &[
            "--cache",
            cache.path().to_str().unwrap(),
            "--max-cache-size",
            "64",
        ],
    );
    for _ in 0..2 {
        assert!(std::fs::read(mount.path().join("big.bin")).unwrap() == data);
    }
    // Writing backwards needs staging (in the full cache directory).
    let path = mount.path().join("staged.bin");
    let block = pattern(32, MIB);
    let mut acknowledged = Vec::new();
    let mut errno = 0;
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&path).unwrap();
        for i in (0..4u64).rev() {
            match f.write_all_at(&block, i * MIB as u64) {
                Ok(()) => acknowledged.push(i),
                Err(e) => {
                    errno = e.raw_os_error().unwrap_or(0);
                    break;
                }
            }
        }
    }
    assert!(errno == libc::ENOSPC || errno == libc::EIO, "errno {errno}");
    // What was acknowledged is kept, as on a local disk; the rest is holes. Never other bytes: each page of
    // the refused block is all its bytes or all zeros.
    if let Some(stored) = get(common::emulator(), &bucket, "staged.bin") {
        for (i, got) in stored.chunks(MIB).enumerate() {
            if acknowledged.contains(&(i as u64)) {
                assert!(got == &block[..], "acknowledged block {i} lost");
            }
            for (page, want) in got.chunks(4096).zip(block.chunks(4096)) {
                assert!(
                    page == want || page.iter().all(|b| *b == 0),
                    "block {i}: mixed bytes"
                );
            }
        }
    }
    assert!(std::fs::read(mount.path().join("big.bin")).unwrap() == data);
}

/// A write the service refuses leaves the file as the bucket holds it: through a new open, the old object,
/// whole and at its old size, never the failed writer's size or bytes; a new file leaves no name. (A soak on a general-purpose bucket
/// read back the first bytes of the old object, cut at the failed writer's size.)
#[test]
fn a_refused_overwrite_leaves_the_old_file_visible() {
    for directory in [true, false] {
        let (bucket, emu) = own_emulator(directory, "refusedwrite");
        let old = pattern(31, 3 * MIB + 5);
        put(&emu, &bucket, "ckpt.bin", old.clone());
        let mount = Mount::on(
            &emu,
            &bucket,
            &["--allow-overwrite", "--metadata-ttl", "60"],
        );
        let path = mount.path().join("ckpt.bin");
        assert!(std::fs::read(&path).unwrap() == old, "{bucket}: first read");
        refuse_every_upload(&emu);
        // Shorter than the old object in one PUT, longer in parts.
        for new_len in [MIB + 3, 9 * MIB + 1] {
            let new = pattern(32, new_len);
            let written = (|| -> std::io::Result<()> {
                let mut f = std::fs::File::create(&path)?;
                for chunk in new.chunks(MIB) {
                    f.write_all(chunk)?;
                }
                // The kernel now caches the writer's size (for the 60 s TTL): it must be told to forget it.
                assert_eq!(f.metadata()?.len(), new_len as u64);
                f.sync_all()
            })();
            assert!(written.is_err(), "{bucket}: every upload was refused");
            let size = std::fs::metadata(&path).unwrap().len();
            assert_eq!(
                size,
                old.len() as u64,
                "{bucket}: size after a refused {new_len}-byte write"
            );
            let got = std::fs::read(&path).unwrap();
            assert!(
                got == old,
                "{bucket}: after a refused {new_len}-byte write, read {} bytes, not the old object",
                got.len()
            );
        }
        // A new file whose upload is refused leaves no name behind.
        let fresh = mount.path().join("never.bin");
        let written = (|| -> std::io::Result<()> {
            let mut f = std::fs::File::create(&fresh)?;
            f.write_all(&pattern(33, MIB))?;
            f.sync_all()
        })();
        assert!(
            written.is_err(),
            "{bucket}: the new file's upload was refused"
        );
        // The kernel is told from a thread of its own (it takes the directory's lock): allow it a moment,
        // far less than the 60 s it would otherwise keep the name.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while fresh.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            std::fs::metadata(&fresh)
                .map(|m| m.len())
                .map_err(|e| e.kind()),
            Err(std::io::ErrorKind::NotFound),
            "{bucket}: a new file that never reached the bucket"
        );
        set_faults(&emu, 0.0, 0, &[], &[]);
        assert_eq!(
            get(&emu, &bucket, "ckpt.bin").map(|b| sha256_hex(&b)),
            Some(sha256_hex(&old)),
            "{bucket}: the bucket still holds the old object"
        );
    }
}

/// A file fsynced, then changed again by the same descriptor, whose last upload is refused: once its handle is
/// gone it is what its fsync left in the bucket, not the size of the refused change.
#[test]
fn a_refused_change_after_fsync_leaves_the_fsynced_file() {
    let (bucket, emu) = own_emulator(true, "refusedafterfsync");
    let mount = Mount::on(
        &emu,
        &bucket,
        &["--allow-overwrite", "--metadata-ttl", "60"],
    );
    let path = mount.path().join("log.bin");
    let first = pattern(41, MIB + 9);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&first).unwrap();
    f.sync_all().unwrap();
    refuse_every_upload(&emu);
    // The same descriptor goes on writing (it becomes a staged file); its close and release cannot upload.
    let more = (|| -> std::io::Result<()> {
        f.write_all(&pattern(42, 2 * MIB))?;
        f.sync_all()
    })();
    assert!(more.is_err(), "the change after fsync was refused");
    drop(f);
    // The release (after close, asynchronous) gives the file back to what the bucket holds.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&path).unwrap().len() != first.len() as u64
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        first.len() as u64,
        "the size its fsync uploaded"
    );
    assert!(
        std::fs::read(&path).unwrap() == first,
        "the bytes its fsync uploaded"
    );
    set_faults(&emu, 0.0, 0, &[], &[]);
}

/// A descriptor whose upload failed, still open (its fsync said EIO; or a dup of it keeps its release from
/// coming), does not pass its failure on: a new open of the file starts from what the bucket holds and can
/// write it, by truncating it or by changing it in place. The failed descriptor keeps its own error, and its
/// ftruncate changes nobody's file.
#[test]
fn a_failed_writer_still_open_leaves_the_next_open_alone() {
    for directory in [true, false] {
        let (bucket, emu) = own_emulator(directory, "failedstillopen");
        let old = pattern(51, MIB + 7);
        put(&emu, &bucket, "state.bin", old.clone());
        let metrics = common::free_metrics_addr();
        let mount = Mount::on(
            &emu,
            &bucket,
            &[
                "--allow-overwrite",
                "--metadata-ttl",
                "60",
                "--metrics-addr",
                &metrics,
            ],
        );
        let path = mount.path().join("state.bin");
        refuse_every_upload(&emu);
        let mut failed = std::fs::File::create(&path).unwrap();
        failed.write_all(&pattern(52, 2 * MIB)).unwrap();
        assert!(failed.sync_all().is_err(), "every upload was refused");
        set_faults(&emu, 0.0, 0, &[], &[]);

        let rewritten = pattern(53, MIB + 1);
        let mut again = std::fs::File::create(&path).expect("a new truncating open");
        again.write_all(&rewritten).unwrap();
        again.sync_all().expect("the new descriptor's upload");
        drop(again);
        assert!(
            std::fs::read(&path).unwrap() == rewritten,
            "the new open's bytes"
        );

        let mut patch = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("a new open that changes the file in place");
        std::io::Seek::seek(&mut patch, std::io::SeekFrom::Start(10)).unwrap();
        patch.write_all(b"patched").unwrap();
        // The failed descriptor cannot cut the file the new one is changing (a staged file both could reach).
        assert!(
            failed.set_len(3).is_err(),
            "ftruncate of the failed descriptor"
        );
        patch.sync_all().expect("the patch's upload");
        drop(patch);
        let mut expected = rewritten.clone();
        expected[10..17].copy_from_slice(b"patched");
        // truncate(2) by name goes to a live handle or to the bucket, not to the failed one.
        nix::unistd::truncate(&path, 100).expect("truncate by name");
        expected.truncate(100);

        assert!(
            failed
                .write_all(b"more")
                .and_then(|()| failed.sync_all())
                .is_err(),
            "the failed descriptor keeps its error"
        );
        drop(failed);
        // Its release comes after close(2) returns: wait until every handle opened is released.
        let requests = |op: &str| {
            common::daemon_metric(
                &metrics,
                &format!("expressfs_fuse_requests_total{{op=\"{op}\"}}"),
            )
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while requests("release") < requests("open") + requests("create") {
            assert!(
                std::time::Instant::now() < deadline,
                "{bucket}: a release never came"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            std::fs::read(&path).unwrap() == expected,
            "the failed descriptor's release changes nothing"
        );
        assert_eq!(
            get(&emu, &bucket, "state.bin").map(|b| sha256_hex(&b)),
            Some(sha256_hex(&expected)),
            "the bucket holds the patched file"
        );
    }
}

/// `AWS_MAX_ATTEMPTS` sets the attempts per request, as for the AWS CLI and mount-s3: a GET the bucket
/// keeps failing is sent that many times, then the read fails.
#[test]
fn aws_max_attempts_bounds_the_attempts_of_a_failing_get() {
    let (bucket, emu) = own_emulator(true, "attempts");
    put(&emu, &bucket, "d/f", pattern(50, 4096));
    // GETs the failed read sent with one attempt each (the open's, then the kernel's reads).
    let mut requests = 0;
    for attempts in [1u64, 3] {
        let value = attempts.to_string();
        let mount = Mount::on_with_env(
            &emu,
            &bucket,
            &["--read-only"],
            &[("AWS_MAX_ATTEMPTS", value.as_str())],
        );
        // The listing answers the lookup, so the open's GET is the only one.
        let names: Vec<_> = std::fs::read_dir(mount.path().join("d"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["f"]);
        let before = emulator_stat(&emu, Some(&bucket), Some("GetObject"), "requests");
        set_faults(&emu, 1.0, 7, &["GetObject"], &["internal-error"]);
        let read = std::fs::read(mount.path().join("d/f"));
        set_faults(&emu, 0.0, 0, &[], &[]);
        assert_eq!(
            read.map_err(|e| e.raw_os_error()).unwrap_err(),
            Some(libc::EIO)
        );
        let sent = emulator_stat(&emu, Some(&bucket), Some("GetObject"), "requests") - before;
        if attempts == 1 {
            assert!(sent >= 1, "{}", mount.log());
            requests = sent;
        }
        assert_eq!(
            sent,
            attempts * requests,
            "AWS_MAX_ATTEMPTS={attempts}:\n{}",
            mount.log()
        );
        assert!(mount.unmount().success());
    }
    // A value that is no count is refused before mounting.
    let mut cmd = common::expressfs_command(&emu);
    cmd.env("AWS_MAX_ATTEMPTS", "many")
        .arg("--foreground")
        .arg(&bucket)
        .arg("/nonexistent")
        .stdin(std::process::Stdio::null());
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("AWS_MAX_ATTEMPTS"), "{stderr}");
}

/// A conditional write during which another operation ran on its key gets 409 ConditionalRequestConflict;
/// the API references say to send it again, and its condition is then checked anew. Renames on a
/// general-purpose bucket (conditional copies) of which half the copies are answered 409 all succeed.
#[test]
fn a_conflict_answer_is_sent_again() {
    let (bucket, emu) = own_emulator(false, "conflict");
    let names: Vec<String> = (0..6).map(|i| format!("f{i}.bin")).collect();
    for (i, name) in names.iter().enumerate() {
        put(&emu, &bucket, name, pattern(i as u64, 1000));
    }
    let mount = Mount::on(&emu, &bucket, &["--metadata-ttl", "minimal"]);
    let body = faults_json(0.5, 5, &["CopyObject"], &["conditional-conflict"]);
    let (status, answer) = admin_post(&emu, "/_emulator/faults", &body);
    assert_eq!(status, 200, "{answer}");
    for name in &names {
        let to = format!("moved-{name}");
        std::fs::rename(mount.path().join(name), mount.path().join(&to)).unwrap();
    }
    let (_, report) = admin_get(&emu, "/_emulator/faults");
    set_faults(&emu, 0.0, 0, &[], &[]);
    assert!(report.contains("conditional-conflict"), "{report}");
    for (i, name) in names.iter().enumerate() {
        assert!(get(&emu, &bucket, name).is_none(), "{name}");
        assert_eq!(
            get(&emu, &bucket, &format!("moved-{name}")).unwrap(),
            pattern(i as u64, 1000)
        );
    }
}

/// Writes that land while their answers are lost (the connection drops after the server carried them out):
/// the SDK sends each again, and the retry is refused because the first attempt changed the object (a new
/// file's If-None-Match, an append's If-Match). The daemon reads the object back, finds exactly its bytes
/// where it wrote them, and reports success; the bytes are there once, whole. A rename sent again carries
/// its first attempt's idempotency token, which the service (and the emulator) answer as done.
#[test]
fn a_write_whose_answer_was_lost_is_recognised_as_landed() {
    let (bucket, emu) = own_emulator(true, "lostanswer");
    let mount = Mount::on(&emu, &bucket, &["--incremental-upload"]);
    fault_only(&emu, &["PutObject"], &["lost-answer"]);
    let path = mount.path().join("log.txt");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(b"first\n").unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(get(&emu, &bucket, "log.txt").unwrap(), b"first\n");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"second\n").unwrap();
    f.sync_all().unwrap();
    f.write_all(b"third\n").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let (_, report) = admin_get(&emu, "/_emulator/faults");
    set_faults(&emu, 0.0, 0, &[], &[]);
    assert!(report.contains("lost-answer"), "{report}");
    assert_eq!(
        get(&emu, &bucket, "log.txt").unwrap(),
        b"first\nsecond\nthird\n"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"first\nsecond\nthird\n");
    // A CompleteMultipartUpload sent again for an upload completed with the same parts gets the same answer.
    // (A mount without --incremental-upload: with it, new files are written by appends too.)
    let streaming = Mount::on(&emu, &bucket, &[]);
    fault_only(&emu, &["CompleteMultipartUpload"], &["lost-answer"]);
    let big = pattern(9, 20 * MIB + 3);
    let mut f = std::fs::File::create(streaming.path().join("big.bin")).unwrap();
    f.write_all(&big).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let (_, report) = admin_get(&emu, "/_emulator/faults");
    set_faults(&emu, 0.0, 0, &[], &[]);
    assert!(report.contains("CompleteMultipartUpload"), "{report}");
    assert!(get(&emu, &bucket, "big.bin").unwrap() == big);
    // A RenameObject sent again carries the same idempotency token, and succeeds again.
    fault_only(&emu, &["RenameObject"], &["lost-answer"]);
    std::fs::rename(&path, mount.path().join("moved.txt")).unwrap();
    set_faults(&emu, 0.0, 0, &[], &[]);
    assert!(get(&emu, &bucket, "log.txt").is_none());
    assert_eq!(
        get(&emu, &bucket, "moved.txt").unwrap(),
        b"first\nsecond\nthird\n"
    );
    let log = mount.log();
    assert!(
        log.contains("had landed with its first attempt"),
        "the recovery is logged:\n{log}"
    );
}

/// CopyObject can fail after its 200 was sent, with the error in the body (its API reference). A rename on a
/// general-purpose bucket (a copy, then a delete; one CopyObject up to 5 GB) answered so fails, and keeps the
/// file under its old name: the copy never happened, so the source must not be deleted.
#[test]
fn a_copy_that_failed_inside_a_200_keeps_the_source() {
    let (bucket, emu) = own_emulator(false, "copy200");
    put(&emu, &bucket, "small.bin", pattern(10, 1000));
    put(&emu, &bucket, "big.bin", pattern(11, 12 * MIB));
    let mount = Mount::on(&emu, &bucket, &["--metadata-ttl", "minimal"]);
    for (name, len, ops) in [
        ("small.bin", 1000, &["CopyObject"][..]),
        ("big.bin", 12 * MIB, &["CopyObject"][..]),
    ] {
        fault_only(&emu, ops, &["malformed-xml"]);
        let renamed = std::fs::rename(mount.path().join(name), mount.path().join("moved.bin"));
        set_faults(&emu, 0.0, 0, &[], &[]);
        assert!(
            renamed.is_err(),
            "{name}: a failed copy reported as a rename"
        );
        let seed = if name == "small.bin" { 10 } else { 11 };
        assert!(
            get(&emu, &bucket, name).unwrap() == pattern(seed, len),
            "{name}: the source is gone or changed"
        );
        assert!(get(&emu, &bucket, "moved.bin").is_none(), "{name}");
    }
}

/// The other side of the read-back: a write whose first attempt went unanswered without landing, refused on
/// its retry because another client made the object meanwhile, is not taken for our own: the close fails and
/// the other client's object stays.
#[test]
fn a_retried_write_refused_for_someone_elses_object_still_fails() {
    let (bucket, emu) = own_emulator(true, "notours");
    let mount = Mount::on(
        &emu,
        &bucket,
        &["--metadata-ttl", "60", "--negative-metadata-ttl", "60"],
    );
    let path = mount.path().join("k.txt");
    assert_eq!(common::errno_of(std::fs::metadata(&path)), libc::ENOENT);
    // Another client makes the name the mount still remembers as missing.
    put(&emu, &bucket, "k.txt", b"theirs".to_vec());
    // Our upload's first attempt is dropped before it is carried out; a later attempt gets the 412.
    let body = faults_json(0.5, 3, &["PutObject"], &["reset-before-body"]);
    let (status, answer) = admin_post(&emu, "/_emulator/faults", &body);
    assert_eq!(status, 200, "{answer}");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(b"ours!!").unwrap();
    let synced = f.sync_all();
    drop(f);
    let (_, report) = admin_get(&emu, "/_emulator/faults");
    set_faults(&emu, 0.0, 0, &[], &[]);
    assert!(report.contains("reset-before-body"), "{report}");
    assert_eq!(common::errno_of(synced), libc::EIO);
    assert_eq!(get(&emu, &bucket, "k.txt").unwrap(), b"theirs");
}

/// Copies whose answers were lost. On a general-purpose bucket, a rename's conditional copy refused on its
/// retry is taken as landed when the destination is the source as it is (so the rename completes instead of
/// answering EEXIST with the object under both names). On a directory bucket, where a copy gives the object a
/// new ETag, a chmod's metadata copy refused on its retry (its source If-Match no longer holds) is taken as
/// landed when the object carries exactly the metadata sent.
#[test]
fn a_copy_whose_answer_was_lost_is_recognised_as_landed() {
    use std::os::unix::fs::PermissionsExt;
    for directory in [false, true] {
        let (bucket, emu) = own_emulator(directory, "lostcopy");
        put(&emu, &bucket, "a.bin", pattern(12, 5000));
        // (Nothing trusted without asking: the chmod reads the metadata it copies from a HEAD.)
        let args = ["--preserve-metadata", "--metadata-ttl", "minimal"];
        let mount = Mount::on(&emu, &bucket, &args);
        assert!(mount.path().join("a.bin").exists());
        fault_only(&emu, &["CopyObject"], &["lost-answer"]);
        let name = if directory {
            "a.bin"
        } else {
            std::fs::rename(mount.path().join("a.bin"), mount.path().join("b.bin")).unwrap();
            "b.bin"
        };
        let mode = std::fs::Permissions::from_mode(0o600);
        std::fs::set_permissions(mount.path().join(name), mode).unwrap();
        let (_, report) = admin_get(&emu, "/_emulator/faults");
        set_faults(&emu, 0.0, 0, &[], &[]);
        let lost = if directory {
            "\"count\":1"
        } else {
            "\"count\":2"
        };
        assert!(report.contains(lost), "{report}");
        if !directory {
            assert!(get(&emu, &bucket, "a.bin").is_none());
        }
        assert_eq!(get(&emu, &bucket, name).unwrap(), pattern(12, 5000));
        drop(mount);
        let again = Mount::on(&emu, &bucket, &args);
        let shown = std::fs::metadata(again.path().join(name)).unwrap();
        assert_eq!(shown.permissions().mode() & 0o777, 0o600, "{name}");
    }
}
