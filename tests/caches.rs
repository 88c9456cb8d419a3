//! The local data cache through a real mount: a second epoch (and a remount) reads without a single GET to
//! the bucket; changed objects are never served from old blocks; corrupt blocks are refetched; the size
//! limit holds. GETs are counted by the emulator, not guessed.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Mount, emulator, fresh_bucket, op_count, pattern, put, put_many, sha256_hex};

/// GetObject requests the emulator served for `bucket`.
fn gets(bucket: &str) -> u64 {
    op_count(bucket, "GetObject")
}

fn read_all(root: &Path, names: &[String]) -> Vec<String> {
    names
        .iter()
        .map(|n| sha256_hex(&std::fs::read(root.join(n)).unwrap()))
        .collect()
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn second_epoch_and_remount_read_without_gets() {
    let bucket = fresh_bucket(true, "epoch");
    let mut objects: Vec<(String, Vec<u8>)> = (0..2000)
        .map(|i| (format!("img/{i:05}.jpg"), pattern(i, 100_000)))
        .collect();
    for i in 0..4 {
        objects.push((format!("shard/{i}.tar"), pattern(100 + i, 64 << 20)));
    }
    let names: Vec<String> = objects.iter().map(|(k, _)| k.clone()).collect();
    let expected: Vec<String> = objects.iter().map(|(_, d)| sha256_hex(d)).collect();
    put_many(emulator(), &bucket, objects);

    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap();
    {
        let mount = Mount::new(&bucket, &["--cache", cache_arg]);
        assert_eq!(read_all(mount.path(), &names), expected, "epoch 1");
        wait_for_cache_writes(cache.path());
        let before = gets(&bucket);
        assert!(before > 0);
        assert_eq!(read_all(mount.path(), &names), expected, "epoch 2");
        assert_eq!(
            gets(&bucket),
            before,
            "epoch 2 went to the bucket ({})",
            disk_note(cache.path())
        );
        assert!(mount.unmount().success());
    }
    let before = gets(&bucket);
    let mount = Mount::new(&bucket, &["--cache", cache_arg]);
    assert_eq!(read_all(mount.path(), &names), expected, "after remount");
    assert_eq!(
        gets(&bucket),
        before,
        "the cache did not survive the remount ({})",
        disk_note(cache.path())
    );
}

/// The cache evicts while its disk has less than 5% free (as Mountpoint's does): on a nearly full machine the
/// GET counts above say so, not the code.
fn disk_note(dir: &Path) -> String {
    match nix::sys::statvfs::statvfs(dir) {
        Ok(s) => format!(
            "{:.1}% of the cache's disk free; below 5% the cache evicts",
            100.0 * s.blocks_available() as f64 / s.blocks() as f64
        ),
        Err(e) => format!("statvfs: {e}"),
    }
}

/// Waits until the background cache writes have landed: the number of block files has not changed for
/// half a second (a fixed sleep was too short on a loaded machine). Gives up after 30 s; the caller's
/// request counts then say what is missing.
fn wait_for_cache_writes(cache: &std::path::Path) {
    let count = || {
        std::fs::read_dir(cache.join("blocks"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut last = count();
    let mut stable_since = std::time::Instant::now();
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        let now = count();
        if now != last {
            last = now;
            stable_since = std::time::Instant::now();
        } else if stable_since.elapsed() >= Duration::from_millis(500) {
            return;
        }
    }
}

#[test]
fn changed_objects_and_corrupt_blocks_are_never_served() {
    let bucket = fresh_bucket(true, "fresh");
    put(emulator(), &bucket, "a.bin", pattern(1, 300_000));
    let cache = tempfile::tempdir().unwrap();
    let mount = Mount::new(
        &bucket,
        &[
            "--cache",
            cache.path().to_str().unwrap(),
            "--metadata-ttl",
            "1",
        ],
    );
    let p = mount.path().join("a.bin");
    assert_eq!(std::fs::read(&p).unwrap(), pattern(1, 300_000));
    std::thread::sleep(Duration::from_millis(300));

    // Replaced in the bucket: after the TTL the new bytes come back, not cached old blocks.
    put(emulator(), &bucket, "a.bin", pattern(2, 300_000));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(std::fs::read(&p).unwrap(), pattern(2, 300_000));
    std::thread::sleep(Duration::from_millis(300));

    // Corrupt every cached block: reads still return the right bytes, refetched from the bucket.
    let blocks = cache.path().join("blocks");
    let mut corrupted = 0;
    for entry in std::fs::read_dir(&blocks).unwrap() {
        let path = entry.unwrap().path();
        let mut raw = std::fs::read(&path).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 0xff;
        std::fs::write(&path, raw).unwrap();
        corrupted += 1;
    }
    assert!(corrupted > 0, "nothing was cached");
    let before = gets(&bucket);
    // The kernel still holds this unchanged file's bytes in its page cache: drop them, so the read reaches
    // the daemon and its disk cache.
    let file = std::fs::File::open(&p).unwrap();
    // SAFETY: advice on a descriptor we own; no memory is involved.
    let rc = unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    assert_eq!(rc, 0);
    let mut again = Vec::new();
    std::io::Read::read_to_end(&mut &file, &mut again).unwrap();
    assert_eq!(again, pattern(2, 300_000));
    assert!(gets(&bucket) > before, "corrupt blocks were not refetched");
    assert!(
        mount.log().contains("discarding corrupt cache block"),
        "{}",
        mount.log()
    );
}

#[test]
fn cache_size_limit_holds() {
    let bucket = fresh_bucket(true, "limit");
    let objects: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| (format!("f{i}"), pattern(i, 2 << 20)))
        .collect();
    put_many(emulator(), &bucket, objects.clone());
    let cache = tempfile::tempdir().unwrap();
    let mount = Mount::new(
        &bucket,
        &[
            "--cache",
            cache.path().to_str().unwrap(),
            "--max-cache-size",
            "8",
        ],
    );
    for (name, data) in &objects {
        assert_eq!(&std::fs::read(mount.path().join(name)).unwrap(), data);
    }
    std::thread::sleep(Duration::from_millis(500));
    let used = dir_size(&cache.path().join("blocks"));
    assert!(
        used > 0 && used <= 8 << 20,
        "cache holds {used} bytes with an 8 MiB limit"
    );
}

#[test]
fn listings_and_stats_are_cached_for_the_ttl() {
    let bucket = fresh_bucket(true, "lscache");
    let objects: Vec<(String, Vec<u8>)> = (0..300)
        .map(|i| (format!("d/f{i:03}"), vec![1u8; 10]))
        .collect();
    put_many(emulator(), &bucket, objects);
    let mount = Mount::new(&bucket, &["--metadata-ttl", "60"]);
    let dir = mount.path().join("d");
    let list = |dir: &Path| {
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            assert_eq!(e.unwrap().metadata().unwrap().len(), 10);
            n += 1;
        }
        n
    };
    assert_eq!(list(&dir), 300);
    let (lists, heads) = (
        op_count(&bucket, "ListObjectsV2"),
        op_count(&bucket, "HeadObject"),
    );
    assert_eq!(list(&dir), 300);
    assert_eq!(
        op_count(&bucket, "ListObjectsV2"),
        lists,
        "second ls within the TTL listed again"
    );
    assert_eq!(
        op_count(&bucket, "HeadObject"),
        heads,
        "stat of listed entries went to the bucket"
    );
    // Our own change shows at once.
    std::fs::write(dir.join("new"), b"0123456789").unwrap();
    assert_eq!(list(&dir), 301);
    std::fs::remove_file(dir.join("f000")).unwrap_err(); // no --allow-delete: refused, listing unchanged
    assert_eq!(list(&dir), 301);
}

#[test]
fn shared_cache_bucket_serves_a_second_host() {
    let bucket = fresh_bucket(true, "src");
    let shared = common::directory_bucket("xz");
    common::create_bucket(emulator(), &shared);
    put(emulator(), &bucket, "small.jpg", pattern(1, 200_000));
    put(emulator(), &bucket, "big.bin", pattern(2, 2 << 20));
    let args = ["--cache-xz", shared.as_str()];
    {
        let first = Mount::new(&bucket, &args);
        assert_eq!(
            std::fs::read(first.path().join("small.jpg")).unwrap(),
            pattern(1, 200_000)
        );
        assert_eq!(
            std::fs::read(first.path().join("big.bin")).unwrap(),
            pattern(2, 2 << 20)
        );
        std::thread::sleep(Duration::from_millis(500)); // background fill
    }
    let entries = |b: &str| op_count(b, "PutObject");
    assert_eq!(
        entries(&shared),
        1,
        "exactly the small object is in the shared cache"
    );

    // A second host: its first read of the small file comes from the cache bucket.
    let before = gets(&bucket);
    let second = Mount::new(&bucket, &args);
    assert_eq!(
        std::fs::read(second.path().join("small.jpg")).unwrap(),
        pattern(1, 200_000)
    );
    assert_eq!(
        gets(&bucket),
        before,
        "the source was read although the shared cache had the object"
    );
    drop(second);

    // A tampered entry is ignored: right bytes, from the source.
    let client = common::s3_client(emulator());
    let entry = common::runtime()
        .block_on(client.list_objects_v2().bucket(&shared).send())
        .unwrap()
        .contents()
        .iter()
        .find_map(|o| {
            o.key()
                .filter(|k| k.starts_with("expressfs-cache/"))
                .map(str::to_string)
        });
    let entry = entry.expect("cache entry listed");
    common::put(
        emulator(),
        &shared,
        &entry,
        b"XFSSHR01 not what it claims".to_vec(),
    );
    let before = gets(&bucket);
    let third = Mount::new(&bucket, &args);
    assert_eq!(
        std::fs::read(third.path().join("small.jpg")).unwrap(),
        pattern(1, 200_000)
    );
    assert!(gets(&bucket) > before, "a tampered entry was used");
    // The cache bucket must not be the mounted one.
    let empty = tempfile::tempdir().unwrap();
    let out = common::expressfs_command(emulator())
        .args([
            &bucket,
            empty.path().to_str().unwrap(),
            "--cache-xz",
            &bucket,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("different bucket"));
}

#[test]
fn o_direct_revalidates_and_bypasses_the_caches() {
    use std::os::unix::fs::OpenOptionsExt;
    let bucket = fresh_bucket(true, "direct");
    put(emulator(), &bucket, "f.bin", pattern(1, 100_000));
    let cache = tempfile::tempdir().unwrap();
    let mount = Mount::new(
        &bucket,
        &[
            "--cache",
            cache.path().to_str().unwrap(),
            "--metadata-ttl",
            "60",
        ],
    );
    let p = mount.path().join("f.bin");
    assert_eq!(std::fs::read(&p).unwrap(), pattern(1, 100_000));
    put(emulator(), &bucket, "f.bin", pattern(2, 100_000));
    // Within the TTL a plain read may still see the old version (whole and consistent)...
    assert_eq!(std::fs::read(&p).unwrap(), pattern(1, 100_000));
    // ...while O_DIRECT asks the bucket.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&p)
        .unwrap();
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut f, &mut got).unwrap();
    assert_eq!(got, pattern(2, 100_000));
}

#[test]
fn metadata_ttl_and_negative_ttl_behave_as_documented() {
    let bucket = fresh_bucket(true, "ttl");
    put(emulator(), &bucket, "gone.txt", b"here".to_vec());
    let client = common::s3_client(emulator());
    let delete = |key: &str| {
        common::runtime()
            .block_on(client.delete_object().bucket(&bucket).key(key).send())
            .unwrap();
    };
    {
        // Within a long TTL, an object deleted by another client still answers stat (documented).
        let mount = Mount::new(&bucket, &["--metadata-ttl", "60"]);
        assert_eq!(
            std::fs::metadata(mount.path().join("gone.txt"))
                .unwrap()
                .len(),
            4
        );
        delete("gone.txt");
        assert_eq!(
            std::fs::metadata(mount.path().join("gone.txt"))
                .unwrap()
                .len(),
            4
        );
    }
    put(emulator(), &bucket, "gone.txt", b"here".to_vec());
    {
        // With minimal, it does not.
        let mount = Mount::new(&bucket, &["--metadata-ttl", "minimal"]);
        assert_eq!(
            std::fs::metadata(mount.path().join("gone.txt"))
                .unwrap()
                .len(),
            4
        );
        delete("gone.txt");
        assert_eq!(
            common::errno_of(std::fs::metadata(mount.path().join("gone.txt"))),
            libc::ENOENT
        );
    }
    // Negative entries: remembered for their TTL, then forgotten.
    let mount = Mount::new(
        &bucket,
        &["--metadata-ttl", "1", "--negative-metadata-ttl", "1"],
    );
    assert_eq!(
        common::errno_of(std::fs::metadata(mount.path().join("late.txt"))),
        libc::ENOENT
    );
    put(emulator(), &bucket, "late.txt", b"now".to_vec());
    assert_eq!(
        common::errno_of(std::fs::metadata(mount.path().join("late.txt"))),
        libc::ENOENT,
        "negative entry not cached"
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        std::fs::metadata(mount.path().join("late.txt"))
            .unwrap()
            .len(),
        3,
        "negative entry did not expire"
    );
}

/// The kernel keeps a name no longer than the mount trusts it: a name answered from a listing taken a while ago
/// is kept only for what is left of that listing's TTL, so another client's delete shows within one TTL of the
/// listing, not one TTL after the last lookup.
#[test]
fn the_kernel_keeps_a_name_only_as_long_as_the_mount_trusts_it() {
    const TTL: Duration = Duration::from_secs(3);
    let bucket = fresh_bucket(true, "kttl");
    put(emulator(), &bucket, "dir/gone.txt", b"here".to_vec());
    let mount = Mount::new(&bucket, &["--metadata-ttl", "3"]);
    let dir = mount.path().join("dir");
    let file = dir.join("gone.txt");
    std::fs::metadata(&dir).unwrap();
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let listed = std::time::Instant::now();
    assert_eq!(names, ["gone.txt"]);
    // The kernel lets go of what the listing gave it; the mount still has the listing.
    std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    let client = common::s3_client(emulator());
    common::runtime()
        .block_on(
            client
                .delete_object()
                .bucket(&bucket)
                .key("dir/gone.txt")
                .send(),
        )
        .unwrap();
    // Halfway through the listing's TTL a lookup is answered from it (still within the TTL: documented).
    std::thread::sleep(TTL / 2);
    let looked_up = std::time::Instant::now();
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 4);
    // Past the listing's TTL, well before one TTL after that lookup: the delete shows.
    std::thread::sleep(
        (listed + TTL + Duration::from_millis(300))
            .saturating_duration_since(std::time::Instant::now()),
    );
    assert!(
        looked_up.elapsed() < TTL,
        "the machine was too slow for this test to tell"
    );
    assert_eq!(common::errno_of(std::fs::metadata(&file)), libc::ENOENT);
}
