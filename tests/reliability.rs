//! Reliability through real mounts: under injected faults of every kind, reads and writes either complete with
//! the exact bytes or fail loudly (never a wrong byte); a daemon killed mid-write leaves no partial object and
//! the bucket mounts again; no credential or session token reaches the logs; cache files are private.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{
    Mount, admin_get, admin_post, fresh_bucket, get, pattern, put, put_many, sha256_hex,
    start_emulator,
};
use expressfs_emulator::EmulatorConfig;

const MIB: usize = 1024 * 1024;

fn faults_json(rate: f64, seed: u64, kinds: &[&str]) -> String {
    let kinds: Vec<String> = kinds.iter().map(|k| format!("{k:?}")).collect();
    format!(
        r#"{{"rate":{rate},"seed":{seed},"operations":[],"kinds":[{}]}}"#,
        kinds.join(",")
    )
}

/// Total errors the emulator answered (injected faults show up here).
fn emulator_errors(emu: &expressfs_emulator::Emulator) -> u64 {
    let (_, body) = admin_get(emu, "/_emulator/stats");
    body.match_indices("\"errors\":")
        .map(|(i, m)| {
            body[i + m.len()..]
                .trim_start()
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap_or(0)
        })
        .sum()
}

#[test]
fn faults_never_produce_wrong_bytes() {
    let bucket = fresh_bucket(true, "faults");
    let emu = start_emulator(EmulatorConfig {
        buckets: vec![bucket.clone()],
        ..Default::default()
    });
    let big = pattern(1, 64 * MIB + 5);
    let small: Vec<(String, Vec<u8>)> = (0..250)
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
    for seed in [1u64, 2] {
        let mount = Mount::on(&emu, &bucket, &["--metadata-ttl", "minimal"]);
        let (status, answer) =
            admin_post(&emu, "/_emulator/faults", &faults_json(0.1, seed, &kinds));
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
        let written = pattern(100 + seed, 24 * MIB + 3);
        let path = mount.path().join(format!("out-{seed}.bin"));
        let result = (|| -> std::io::Result<()> {
            let mut f = std::fs::File::create(&path)?;
            for chunk in written.chunks(MIB) {
                f.write_all(chunk)?;
            }
            f.sync_all()
        })();
        admin_post(&emu, "/_emulator/faults", &faults_json(0.0, 0, &[]));
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
        emulator_errors(&emu) > 20,
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
