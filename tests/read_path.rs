//! Read path end to end: the real `expressfs` daemon mounts buckets served by the emulator through FUSE, and
//! the tests read them with std::fs, as a training job would.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;

use common::*;
use rand::{Rng, SeedableRng};

fn names(dir: &std::path::Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

#[test]
fn nested_directories_list_and_read() {
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, "nested");
        let emu = emulator();
        put(emu, &bucket, "top.txt", b"top".to_vec());
        put(emu, &bucket, "a/b/c/deep.bin", pattern(1, 5000));
        put(emu, &bucket, "a/b/sibling.txt", b"sib".to_vec());
        put(emu, &bucket, "a/x.txt", b"x".to_vec());
        let mount = Mount::new(&bucket, &[]);
        let root = mount.path();
        assert_eq!(
            names(root),
            BTreeSet::from(["a".to_string(), "top.txt".to_string()])
        );
        assert_eq!(
            names(&root.join("a")),
            BTreeSet::from(["b".to_string(), "x.txt".to_string()])
        );
        assert_eq!(
            names(&root.join("a/b")),
            BTreeSet::from(["c".to_string(), "sibling.txt".to_string()])
        );
        assert!(fs::metadata(root.join("a/b/c")).unwrap().is_dir());
        let deep = fs::metadata(root.join("a/b/c/deep.bin")).unwrap();
        assert!(deep.is_file());
        assert_eq!(deep.len(), 5000);
        assert_eq!(
            fs::read(root.join("a/b/c/deep.bin")).unwrap(),
            pattern(1, 5000)
        );
        assert_eq!(fs::read(root.join("top.txt")).unwrap(), b"top");
        // Default ownership is the mounting user, default modes 0644/0755.
        assert_eq!(deep.mode() & 0o777, 0o644);
        assert_eq!(fs::metadata(root.join("a")).unwrap().mode() & 0o777, 0o755);
        assert_eq!(deep.uid(), nix::unistd::getuid().as_raw());
        assert_eq!(mount.unmount().code(), Some(0));
    }
}

#[test]
fn large_directory_crosses_unordered_pages() {
    let bucket = fresh_bucket(true, "bigdir");
    let emu = emulator();
    let mut expected = BTreeSet::new();
    let mut objects = Vec::new();
    for i in 0..2600 {
        let name = format!("f{i:05}.dat");
        objects.push((format!("big/{name}"), format!("{i}").into_bytes()));
        expected.insert(name);
    }
    // Subdirectories interleaved with files, each holding several keys, so one common prefix is likely to be
    // returned on several pages by the unordered listing.
    for d in 0..30 {
        for j in 0..5 {
            objects.push((format!("big/dir{d:02}/k{j}"), vec![b'z'; 3]));
        }
        expected.insert(format!("dir{d:02}"));
    }
    put_many(emu, &bucket, objects);
    let mount = Mount::new(&bucket, &[]);
    let listed: Vec<String> = fs::read_dir(mount.path().join("big"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let unique: BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(unique.len(), listed.len(), "a name was listed twice");
    assert_eq!(unique, expected);
    assert_eq!(
        fs::read(mount.path().join("big/f01234.dat")).unwrap(),
        b"1234"
    );
}

#[test]
fn directory_shadows_file_of_same_name() {
    let bucket = fresh_bucket(true, "shadow");
    let emu = emulator();
    put(emu, &bucket, "thing", b"i am a file".to_vec());
    put(emu, &bucket, "thing/inner.txt", b"inner".to_vec());
    put(emu, &bucket, "plain", b"plain file".to_vec());
    let mount = Mount::new(&bucket, &[]);
    let root = mount.path();
    assert!(fs::metadata(root.join("thing")).unwrap().is_dir());
    assert_eq!(fs::read(root.join("thing/inner.txt")).unwrap(), b"inner");
    assert!(fs::metadata(root.join("plain")).unwrap().is_file());
    let listed: Vec<_> = fs::read_dir(root).unwrap().map(|e| e.unwrap()).collect();
    let things: Vec<_> = listed.iter().filter(|e| e.file_name() == "thing").collect();
    assert_eq!(things.len(), 1, "shadowed name listed once");
    assert!(things[0].file_type().unwrap().is_dir());
}

#[test]
fn invalid_keys_are_hidden() {
    let bucket = fresh_bucket(false, "invalid");
    let emu = emulator();
    put(emu, &bucket, "ok.txt", b"ok".to_vec());
    put(emu, &bucket, "dir//double", b"x".to_vec());
    put(emu, &bucket, "dot/./x", b"x".to_vec());
    put(emu, &bucket, "dotdot/../x", b"x".to_vec());
    put(emu, &bucket, &"n".repeat(256).to_string(), b"long".to_vec());
    put(emu, &bucket, "marker/", Vec::new());
    let mount = Mount::new(&bucket, &[]);
    let root = mount.path();
    let listed = names(root);
    assert!(listed.contains("ok.txt"));
    assert!(
        !listed.iter().any(|n| n.len() > 255),
        "over-long name listed"
    );
    // A `dir/` marker object is a directory, never a file.
    assert!(fs::metadata(root.join("marker")).unwrap().is_dir());
    // `dir//double` has an empty component: the file must not appear anywhere under `dir`.
    if root.join("dir").exists() {
        assert!(!names(&root.join("dir")).contains("double"));
        assert!(!names(&root.join("dir")).contains(""));
    }
    if root.join("dot").exists() {
        assert!(
            names(&root.join("dot"))
                .iter()
                .all(|n| n != "." && n != "..")
        );
    }
    assert_eq!(fs::read(root.join("ok.txt")).unwrap(), b"ok");
}

#[test]
fn big_object_sequential_read_matches_sha256() {
    let bucket = fresh_bucket(true, "big");
    let emu = emulator();
    let data = pattern(42, 256 << 20);
    let want = sha256_hex(&data);
    put(emu, &bucket, "shard-000.tar", data);
    let mount = Mount::new(&bucket, &[]);
    let path = mount.path().join("shard-000.tar");
    assert_eq!(fs::metadata(&path).unwrap().len(), 256 << 20);
    assert_eq!(sha256_file(&path).unwrap(), want);
}

#[test]
fn random_ranged_reads_match() {
    let bucket = fresh_bucket(true, "random");
    let emu = emulator();
    let len = 24 << 20;
    let data = pattern(7, len);
    put(emu, &bucket, "data.npy", data.clone());
    let mount = Mount::new(&bucket, &[]);
    let mut file = fs::File::open(mount.path().join("data.npy")).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    for _ in 0..1000 {
        let size = rng.random_range(1..=256 * 1024);
        let offset = rng.random_range(0..len as u64);
        file.seek(SeekFrom::Start(offset)).unwrap();
        let mut buf = vec![0u8; size];
        let mut got = 0;
        while got < size {
            let n = file.read(&mut buf[got..]).unwrap();
            if n == 0 {
                break;
            }
            got += n;
        }
        let end = (offset as usize + size).min(len);
        assert_eq!(got, end - offset as usize, "short read at {offset}+{size}");
        assert!(
            buf[..got] == data[offset as usize..end],
            "wrong bytes at {offset}+{size}"
        );
    }
    // Reading at and past the end gives 0 bytes.
    file.seek(SeekFrom::Start(len as u64 + 10)).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(file.read(&mut buf).unwrap(), 0);
}

#[test]
fn missing_file_is_enoent() {
    let bucket = fresh_bucket(true, "missing");
    put(emulator(), &bucket, "present", b"p".to_vec());
    let mount = Mount::new(&bucket, &[]);
    assert_eq!(
        errno_of(fs::metadata(mount.path().join("absent"))),
        libc::ENOENT
    );
    assert_eq!(
        errno_of(fs::read(mount.path().join("no/such/path"))),
        libc::ENOENT
    );
    assert_eq!(
        errno_of(fs::read_dir(mount.path().join("nodir"))),
        libc::ENOENT
    );
}

#[test]
fn read_only_mount_refuses_writes_with_erofs() {
    let bucket = fresh_bucket(true, "readonly");
    put(emulator(), &bucket, "existing", b"e".to_vec());
    let mount = Mount::new(&bucket, &["--read-only"]);
    let root = mount.path();
    assert_eq!(errno_of(fs::write(root.join("new"), b"x")), libc::EROFS);
    assert_eq!(
        errno_of(
            fs::OpenOptions::new()
                .write(true)
                .open(root.join("existing"))
        ),
        libc::EROFS
    );
    assert_eq!(errno_of(fs::create_dir(root.join("d"))), libc::EROFS);
    assert_eq!(
        errno_of(fs::remove_file(root.join("existing"))),
        libc::EROFS
    );
    assert_eq!(fs::read(root.join("existing")).unwrap(), b"e");
}

#[test]
fn object_replaced_under_open_file_gives_eio_not_mixed_bytes() {
    let bucket = fresh_bucket(true, "replaced");
    let emu = emulator();
    let old = pattern(1, 8 << 20);
    put(emu, &bucket, "ckpt.bin", old.clone());
    let mount = Mount::new(&bucket, &[]);
    let mut file = fs::File::open(mount.path().join("ckpt.bin")).unwrap();
    let mut first = vec![0u8; 4096];
    file.read_exact(&mut first).unwrap();
    assert_eq!(first, old[..4096]);
    put(emu, &bucket, "ckpt.bin", pattern(2, 8 << 20));
    // Far from what was read so far, so no prefetched bytes can satisfy it.
    file.seek(SeekFrom::Start(7 << 20)).unwrap();
    let mut buf = vec![0u8; 65536];
    match file.read_exact(&mut buf) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "unexpected error {e}"),
        Ok(()) => assert_eq!(
            buf,
            old[7 << 20..(7 << 20) + 65536],
            "bytes from the new object were mixed in"
        ),
    }
}

#[test]
fn unmount_makes_daemon_exit_zero() {
    let bucket = fresh_bucket(false, "unmount");
    put(emulator(), &bucket, "f", b"f".to_vec());
    let mount = Mount::new(&bucket, &[]);
    assert_eq!(fs::read(mount.path().join("f")).unwrap(), b"f");
    let dir = mount.path().to_path_buf();
    let status = mount.unmount();
    assert_eq!(status.code(), Some(0));
    assert!(!is_mounted(&dir));
}

#[test]
fn session_refresh_keeps_mount_reading() {
    let emu = start_emulator(expressfs_emulator::EmulatorConfig {
        session_ttl: std::time::Duration::from_secs(5),
        ..Default::default()
    });
    let bucket = directory_bucket("session");
    create_bucket(&emu, &bucket);
    for i in 0..20 {
        put(&emu, &bucket, &format!("f{i}"), pattern(i, 10_000));
    }
    let mount = Mount::on(&emu, &bucket, &["--metadata-ttl", "minimal"]);
    let start = std::time::Instant::now();
    let mut i = 0u64;
    while start.elapsed() < std::time::Duration::from_secs(20) {
        let name = format!("f{}", i % 20);
        assert_eq!(
            fs::read(mount.path().join(&name)).unwrap(),
            pattern(i % 20, 10_000),
            "read {name} at {:?}",
            start.elapsed()
        );
        i += 1;
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    assert!(i >= 40);
}

/// A fresh directory bucket holding four shards `shard-N.tar` of `len` bytes (contents from `seed` on).
fn bucket_of_shards(tag: &str, seed: u64, len: usize) -> (String, Vec<(String, Vec<u8>)>) {
    let bucket = fresh_bucket(true, tag);
    let files: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| (format!("shard-{i}.tar"), pattern(seed + i, len)))
        .collect();
    put_many(emulator(), &bucket, files.clone());
    (bucket, files)
}

/// Reads every file through `mount` at once, one thread each, and checks their bytes.
fn read_all_at_once(mount: &Mount, files: &[(String, Vec<u8>)]) {
    std::thread::scope(|s| {
        for (name, data) in files {
            let path = mount.path().join(name);
            s.spawn(move || {
                let got = std::fs::read(&path).unwrap();
                assert!(got == *data, "{name}: wrong bytes");
            });
        }
    });
}

/// `--memory-target` bounds what parallel sequential readers hold: with 64 MiB for four readers that would
/// each prefetch 64 MiB, windows shrink, the bytes stay exact and the daemon's peak RSS stays well below
/// what four full windows would take.
#[test]
fn memory_target_bounds_parallel_readers() {
    let (bucket, files) = bucket_of_shards("memtarget", 700, 96 * 1024 * 1024 + 11);
    let mount = Mount::new(&bucket, &["--memory-target", "64", "--max-prefetch", "64M"]);
    read_all_at_once(&mount, &files);
    let peak = mount.peak_rss_mib();
    eprintln!("daemon peak RSS with --memory-target 64: {peak} MiB");
    // Four full 64 MiB windows alone would be 256 MiB; the budget keeps buffers near 64 MiB + the parts
    // readers are waiting for, the pool shrinks to a quarter of the target, and freed buffers leave the
    // heap (glibc's mmap threshold fixed under a tight target, src/memory.rs): about 105 MiB measured with
    // glibc alone, 127-131 MiB with mimalloc's per-thread heaps for small blocks (src/alloc.rs), 150-210 MiB
    // without the last two.
    assert!(peak < 160, "peak RSS {peak} MiB under a 64 MiB target");
}

/// Once reads stop, the daemon gives back what its buffers held (src/idle.rs): the pool's spare buffers and
/// glibc's free pages. Left alone, a burst like this one stayed resident for as long as the mount lived.
#[test]
fn an_idle_mount_gives_its_buffers_memory_back() {
    let (bucket, files) = bucket_of_shards("idlemem", 900, 48 * 1024 * 1024 + 7);
    let addr = free_metrics_addr();
    // Ticks of 300 ms: quiet for about a second before the memory goes back (5 s ticks in a release build).
    let mount = Mount::with_env(
        &bucket,
        &["--metrics-addr", &addr],
        &[("EXPRESSFS_TEST_IDLE_TICK_MS", "300")],
    );
    read_all_at_once(&mount, &files);
    let busy = mount.rss_mib();
    let releases = || daemon_metric(&addr, "expressfs_idle_memory_releases_total");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while releases() < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no idle release within 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let idle = mount.rss_mib();
    eprintln!("daemon RSS right after the reads {busy} MiB, once idle {idle} MiB");
    // Four readers' windows and the pool held well over 100 MiB (measured: see the eprintln); what stays is
    // the process itself, its connections and mimalloc's small blocks.
    assert!(
        idle + 64 <= busy,
        "RSS {busy} MiB after the reads, {idle} MiB once idle"
    );
    // Reads still work after the memory went back, and a new quiet spell gives it back again.
    let again = std::fs::read(mount.path().join("shard-0.tar")).unwrap();
    assert!(again == files[0].1, "wrong bytes after the release");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while releases() < 2.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no second idle release within 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A fresh directory bucket (named after `tag`) holding `count` objects `dir/NNNN.jpg` of distinct content,
/// the i-th `base_len + i` bytes long; returns the bucket and the objects.
fn bucket_of_jpegs(
    tag: &str,
    dir: &str,
    count: u64,
    base_len: usize,
) -> (String, Vec<(String, Vec<u8>)>) {
    let bucket = fresh_bucket(true, tag);
    let files: Vec<_> = (0..count)
        .map(|i| {
            (
                format!("{dir}/{i:04}.jpg"),
                pattern(i, base_len + i as usize),
            )
        })
        .collect();
    put_many(emulator(), &bucket, files.clone());
    (bucket, files)
}

#[test]
fn a_lookup_brings_the_first_bytes_so_small_files_cost_one_get() {
    let (bucket, files) = bucket_of_jpegs("firstbytes", "img", 40, 100_000);
    let emu = emulator();
    // Bigger than what a lookup fetches (256 KiB): the rest streams after the first bytes.
    let big = pattern(99, (3 << 20) + 5);
    put(emu, &bucket, "img/big.bin", big.clone());
    let counts = || {
        (
            op_count(&bucket, "GetObject"),
            op_count(&bucket, "HeadObject"),
        )
    };

    let mount = Mount::new(&bucket, &[]);
    fs::metadata(mount.path().join("img")).unwrap();
    let (gets0, heads0) = counts();
    for (key, data) in &files {
        assert_eq!(&fs::read(mount.path().join(key)).unwrap(), data, "{key}");
    }
    let (gets, heads) = (counts().0 - gets0, counts().1 - heads0);
    assert_eq!(heads, 0, "lookups should GET, not HEAD");
    assert!(
        gets <= files.len() as u64 + 2,
        "{gets} GETs for {} small files: the open and read should need none of their own",
        files.len()
    );
    assert_eq!(
        sha256_hex(&fs::read(mount.path().join("img/big.bin")).unwrap()),
        sha256_hex(&big)
    );
    drop(mount);

    // --lookup-prefetch 0: lookups are HEADs again, and a GET follows for each file. With the directory bigger
    // than one page, its lookups ask for their names (a directory that fits in its first page is listed by the
    // first lookup that asks, and the rest ask nothing).
    let pad = (0..1000)
        .map(|i| (format!("img/pad-{i:04}"), vec![b'p']))
        .collect();
    put_many(emu, &bucket, pad);
    let mount = Mount::new(&bucket, &["--lookup-prefetch", "0"]);
    fs::metadata(mount.path().join("img")).unwrap();
    let (gets0, heads0) = counts();
    for (key, data) in files.iter().take(10) {
        assert_eq!(&fs::read(mount.path().join(key)).unwrap(), data, "{key}");
    }
    let (gets, heads) = (counts().0 - gets0, counts().1 - heads0);
    assert!(heads >= 10 && gets >= 10, "{heads} HEADs, {gets} GETs");
}

#[test]
fn a_storm_of_lookups_in_one_directory_lists_it_once() {
    let (bucket, files) = bucket_of_jpegs("storm", "shard", 300, 1000);
    let emu = emulator();
    // A directory of the same name as a file: the directory must still win after the listing.
    put(emu, &bucket, "shard/0150.jpg/inner", b"x".to_vec());

    let mount = Mount::new(&bucket, &[]);
    fs::metadata(mount.path().join("shard")).unwrap();
    let lists0 = op_count(&bucket, "ListObjectsV2");
    for (key, data) in &files {
        if key == "shard/0150.jpg" {
            continue;
        }
        assert_eq!(&fs::read(mount.path().join(key)).unwrap(), data, "{key}");
    }
    let lists = op_count(&bucket, "ListObjectsV2") - lists0;
    // Without the storm listing every lookup sends its own one-key LIST (299 here).
    assert!(
        lists < 100,
        "{lists} LISTs for 299 lookups in one directory"
    );
    assert!(
        fs::metadata(mount.path().join("shard/0150.jpg"))
            .unwrap()
            .is_dir()
    );
    assert_eq!(
        fs::read(mount.path().join("shard/0150.jpg/inner")).unwrap(),
        b"x"
    );
    assert_eq!(
        errno_of(fs::metadata(mount.path().join("shard/missing.jpg"))),
        libc::ENOENT
    );
}

#[test]
fn a_directory_read_for_longer_than_the_ttl_is_listed_again_not_name_by_name() {
    let (bucket, files) = bucket_of_jpegs("stormlong", "shard", 300, 1000);
    let emu = emulator();
    let gone = "shard/0250.jpg";

    // The default 1 s metadata TTL. A loader reads each file once, about 100 a second: three TTLs in all.
    let mount = Mount::new(&bucket, &[]);
    fs::metadata(mount.path().join("shard")).unwrap();
    let lists0 = op_count(&bucket, "ListObjectsV2");
    let start = std::time::Instant::now();
    for (i, (key, data)) in files.iter().enumerate() {
        if i == 100 {
            // Deleted by someone else while the directory is being refreshed: no refresh may keep it.
            let client = s3_client(emu);
            runtime()
                .block_on(client.delete_object().bucket(&bucket).key(gone).send())
                .unwrap();
        }
        let read = fs::read(mount.path().join(key));
        if key == gone {
            assert_eq!(errno_of(read), libc::ENOENT, "{key} was deleted 1.5 s ago");
        } else {
            assert_eq!(&read.unwrap(), data, "{key}");
        }
        let due = start + std::time::Duration::from_millis(10 * (i as u64 + 1));
        std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
    }
    let lists = op_count(&bucket, "ListObjectsV2") - lists0;
    let seconds = start.elapsed().as_secs_f64().ceil() as u64;
    // Left to expire, the listed entries go stale together once per TTL, and each window pays at least a storm
    // (16 one-key LISTs) before the next listing lands: about 50 in 3 s. Refreshed while lookups go on: the
    // first storm (17) and at most two one-page listings a second.
    assert!(
        lists <= 21 + 2 * seconds,
        "{lists} LISTs for 300 lookups in {seconds} s"
    );
}

#[test]
fn unchanged_small_files_stay_in_the_page_cache_and_changed_ones_do_not() {
    let bucket = fresh_bucket(true, "keepcache");
    let emu = emulator();
    let first = pattern(5, 300_000);
    put(emu, &bucket, "a.jpg", first.clone());
    let mount = Mount::new(&bucket, &[]);
    let path = mount.path().join("a.jpg");
    assert_eq!(fs::read(&path).unwrap(), first);
    // Past the 1 s metadata TTL: the name is checked again, the bytes come from the page cache. The kernel may
    // still drop cached pages (or the inode) under load at any time, so one of three epochs must make no GET:
    // without FOPEN_KEEP_CACHE every epoch would make one.
    let mut cached_epochs = 0;
    for _ in 0..3 {
        let gets = op_count(&bucket, "GetObject");
        std::thread::sleep(std::time::Duration::from_millis(1300));
        assert_eq!(fs::read(&path).unwrap(), first);
        if op_count(&bucket, "GetObject") == gets {
            cached_epochs += 1;
            break;
        }
    }
    assert_eq!(
        cached_epochs, 1,
        "every later epoch read the file from the bucket again"
    );
    // Replaced in the bucket (same size): the cached bytes of the old version must not be served.
    let second = pattern(6, 300_000);
    put(emu, &bucket, "a.jpg", second.clone());
    std::thread::sleep(std::time::Duration::from_millis(1300));
    assert_eq!(
        fs::read(&path).unwrap(),
        second,
        "stale bytes from the page cache"
    );
}

#[test]
fn big_files_bypass_the_page_cache_and_still_mmap() {
    use std::os::fd::AsRawFd;
    let bucket = fresh_bucket(true, "bigdirect");
    let emu = emulator();
    // Above the default --direct-io-threshold (32 MiB).
    let data = pattern(8, (40 << 20) + 123);
    put(emu, &bucket, "arr.npy", data.clone());
    let mount = Mount::new(&bucket, &[]);
    let path = mount.path().join("arr.npy");
    assert_eq!(sha256_hex(&fs::read(&path).unwrap()), sha256_hex(&data));
    // No page cache: reading it again goes to the bucket again (a small file would be served by the kernel).
    let gets = op_count(&bucket, "GetObject");
    assert_eq!(sha256_hex(&fs::read(&path).unwrap()), sha256_hex(&data));
    assert!(
        op_count(&bucket, "GetObject") > gets,
        "served from the page cache"
    );
    // Unaligned positional reads through direct I/O.
    let file = fs::File::open(&path).unwrap();
    for off in [1u64, 4095, 17 << 20, (40 << 20) + 100] {
        let mut buf = vec![0u8; 5000];
        let n = std::os::unix::fs::FileExt::read_at(&file, &mut buf, off).unwrap();
        let want = &data[off as usize..(off as usize + 5000).min(data.len())];
        assert_eq!(&buf[..n], want, "at {off}");
    }
    // np.load(mmap_mode="r") maps the file shared and read-only.
    let len = data.len();
    // SAFETY: a read-only shared mapping of a file we keep open, unmapped before the file is closed.
    let mapped = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(
        mapped,
        libc::MAP_FAILED,
        "{}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the mapping is `len` readable bytes until munmap below.
    let view = unsafe { std::slice::from_raw_parts(mapped as *const u8, len) };
    assert_eq!(sha256_hex(view), sha256_hex(&data));
    // SAFETY: unmapping what was mapped above, once.
    unsafe { libc::munmap(mapped, len) };
}
