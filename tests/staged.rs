//! Staged files on real mounts: edits of existing objects, conflicts with other clients, server faults and
//! crashes during a staged upload, what a patch costs on the wire, the size limit, several descriptors, and
//! files unlinked while open for writing (which go on as staged files that never upload).
//!
//! Each test runs in its own process under nextest, so tests that set emulator-wide faults use their own
//! emulator and never disturb another test.

mod common;

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::IntoRawFd;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::*;
use expressfs_emulator::{Emulator, EmulatorConfig};

const MIB: usize = 1024 * 1024;

/// close(2) itself, so its result is seen (dropping a File ignores it).
fn close(f: File) -> std::io::Result<()> {
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was just taken out of the File, so it is open and owned by nobody else.
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn open_rw(path: &std::path::Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// An emulator of this test alone (faults are emulator-wide), with its data in `data` (e.g. in /dev/shm).
fn own_emulator(bucket: &str, data: Option<&std::path::Path>) -> Emulator {
    let config = EmulatorConfig {
        buckets: vec![bucket.to_string()],
        ..Default::default()
    };
    let Some(dir) = data else {
        return start_emulator(config);
    };
    isolate_env();
    Emulator::start_background(EmulatorConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        access_key: ACCESS_KEY.into(),
        secret_key: SECRET_KEY.into(),
        region: REGION.into(),
        data_dir: dir.to_path_buf(),
        ..config
    })
    .expect("emulator starts")
}

fn bucket_name(directory: bool, tag: &str) -> String {
    if directory {
        directory_bucket(tag)
    } else {
        general_bucket(tag)
    }
}

fn open_uploads(emu: &Emulator, bucket: &str) -> String {
    let (status, body) = admin_get(emu, &format!("/_emulator/uploads?bucket={bucket}"));
    assert_eq!(status, 200, "{body}");
    body
}

/// Last closes of staged files whose upload failed, from the daemon's log.
fn release_failures(mount: &Mount) -> usize {
    mount
        .log()
        .matches("last close of a staged file: upload failed")
        .count()
}

fn patched(old: &[u8], at: usize, patch: &[u8]) -> Vec<u8> {
    let mut v = old.to_vec();
    if v.len() < at + patch.len() {
        v.resize(at + patch.len(), 0);
    }
    v[at..at + patch.len()].copy_from_slice(patch);
    v
}

/// Another client replaces the object between our open and close: close fails with EIO, the object is
/// theirs, and our staged copy is kept in the staging directory.
#[test]
fn a_concurrent_change_fails_the_close_and_keeps_the_staged_copy() {
    for directory in [true, false] {
        for size in [100_000, 20 * MIB] {
            let bucket = fresh_bucket(directory, "conflict");
            let emu = emulator();
            put(emu, &bucket, "f", pattern(1, size));
            let cache = tempfile::tempdir().unwrap();
            let mount = Mount::new(
                &bucket,
                &[
                    "--allow-overwrite",
                    "--cache",
                    cache.path().to_str().unwrap(),
                    "--metadata-ttl",
                    "minimal",
                ],
            );
            let f = open_rw(&mount.path().join("f"));
            f.write_all_at(b"ours", (size / 2) as u64).unwrap();
            let theirs = pattern(2, size);
            put(emu, &bucket, "f", theirs.clone());
            assert_eq!(
                errno_of(close(f)),
                libc::EIO,
                "directory {directory}, size {size}"
            );
            assert!(
                get(emu, &bucket, "f").unwrap() == theirs,
                "directory {directory}, size {size}: the other client's object stays"
            );
            let kept_dir = cache.path().join("staging").join("expressfs-kept");
            let kept: Vec<_> = std::fs::read_dir(&kept_dir)
                .unwrap_or_else(|e| panic!("{}: {e}\n{}", kept_dir.display(), mount.log()))
                .map(|e| e.unwrap().path())
                .collect();
            assert_eq!(kept.len(), 1, "{kept:?}");
            let copy = std::fs::read(&kept[0]).unwrap();
            assert_eq!(copy.len(), size);
            assert_eq!(&copy[size / 2..size / 2 + 4], b"ours");
            assert!(
                mount.log().contains("replaced by someone else"),
                "{}",
                mount.log()
            );
            assert_eq!(open_uploads(emu, &bucket), "[]");
            // The mount carries on with the new object.
            assert!(std::fs::read(mount.path().join("f")).unwrap() == theirs);
        }
    }
}

/// A request of a staged upload fails for good (every retry): close gives EIO, the object is exactly the
/// old one, no upload is left open, and the mount works again once the server does.
#[test]
fn server_faults_during_a_staged_upload_leave_the_old_object() {
    let bucket = directory_bucket("stagedfault");
    let emu = own_emulator(&bucket, None);
    let old = pattern(3, 24 * MIB);
    put(&emu, &bucket, "f", old.clone());
    let mount = Mount::on(
        &emu,
        &bucket,
        &["--allow-overwrite", "--metadata-ttl", "minimal"],
    );
    for (i, op) in ["UploadPart", "UploadPartCopy", "CompleteMultipartUpload"]
        .into_iter()
        .enumerate()
    {
        let f = open_rw(&mount.path().join("f"));
        let at = 12 * MIB + i * 4096;
        f.write_all_at(&[0xCC; 4096], at as u64).unwrap();
        set_faults(&emu, 1.0, 5, &[op], &["internal-error"]);
        let failures = release_failures(&mount);
        assert_eq!(errno_of(close(f)), libc::EIO, "{op}");
        // The release after that close tries once more (the file is still changed): let it fail too
        // before the server is well again, or it would upload the edit after all.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while release_failures(&mount) == failures {
            assert!(
                std::time::Instant::now() < deadline,
                "{op}: no release\n{}",
                mount.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        set_faults(&emu, 0.0, 0, &[], &[]);
        assert!(
            get(&emu, &bucket, "f").unwrap() == old,
            "{op}: not the old object"
        );
        assert_eq!(open_uploads(&emu, &bucket), "[]", "{op}");
    }
    // And with the server well again, the same edit goes through whole.
    let f = open_rw(&mount.path().join("f"));
    f.write_all_at(&[0xDD; 4096], (12 * MIB) as u64).unwrap();
    close(f).unwrap();
    let new = patched(&old, 12 * MIB, &[0xDD; 4096]);
    assert!(get(&emu, &bucket, "f").unwrap() == new);
}

/// Faults the client absorbs or not, at random: whatever close says, the object is the old or the new one,
/// never a mix, and a successful close means the new one.
#[test]
fn random_faults_during_staged_uploads_never_mix_versions() {
    for directory in [true, false] {
        let bucket = bucket_name(directory, "stagedrandom");
        let emu = own_emulator(&bucket, None);
        let mount = Mount::on(
            &emu,
            &bucket,
            &["--allow-overwrite", "--metadata-ttl", "minimal"],
        );
        let mut current = pattern(4, 20 * MIB);
        put(&emu, &bucket, "f", current.clone());
        let (mut ok, mut failed) = (0, 0);
        for seed in 0..3u64 {
            let f = open_rw(&mount.path().join("f"));
            let patch = vec![seed as u8 + 1; 8192];
            let at = (seed as usize * 5 + 3) * MIB;
            f.write_all_at(&patch, at as u64).unwrap();
            set_faults(
                &emu,
                0.8,
                seed,
                &[
                    "UploadPart",
                    "UploadPartCopy",
                    "CompleteMultipartUpload",
                    "CreateMultipartUpload",
                ],
                &["internal-error", "slow-down", "reset-before-body"],
            );
            let failures = release_failures(&mount);
            let result = close(f);
            let new = patched(&current, at, &patch);
            if result.is_err() {
                // The release that follows a failed close tries again: wait for its outcome.
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                while release_failures(&mount) == failures
                    && get(&emu, &bucket, "f").unwrap() != new
                {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "seed {seed}: no release"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            set_faults(&emu, 0.0, 0, &[], &[]);
            let stored = get(&emu, &bucket, "f").unwrap();
            match result {
                Ok(()) => {
                    assert!(
                        stored == new,
                        "seed {seed}: close succeeded, object not new"
                    );
                    current = new;
                    ok += 1;
                }
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EIO), "seed {seed}");
                    assert!(
                        stored == current || stored == new,
                        "seed {seed}: a mix of versions"
                    );
                    if stored == new {
                        current = new;
                    }
                    failed += 1;
                }
            }
        }
        eprintln!("directory {directory}: {ok} closes succeeded, {failed} failed");
    }
}

/// The daemon is killed while a staged upload is held mid-way: the object is the old one, and the staged copy
/// (24 MiB) is not left behind in the staging directory.
#[test]
fn kill_during_a_staged_upload_leaves_the_old_object() {
    let bucket = directory_bucket("stagedkill");
    let emu = own_emulator(&bucket, None);
    let old = pattern(5, 24 * MIB);
    put(&emu, &bucket, "f", old.clone());
    let cache = tempfile::tempdir().unwrap();
    let staging = cache.path().join("staging");
    let mut mount = Mount::on(
        &emu,
        &bucket,
        &[
            "--allow-overwrite",
            "--cache",
            cache.path().to_str().unwrap(),
        ],
    );
    let f = open_rw(&mount.path().join("f"));
    f.write_all_at(&[0xEE; 4096], (12 * MIB) as u64).unwrap();
    // The part sent is held 20 s by the server; the copies go through.
    set_faults(&emu, 1.0, 1, &["UploadPart"], &["stall"]);
    let closer = std::thread::spawn(move || close(f));
    // Wait until the upload has begun (the multipart upload exists), then crash.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while open_uploads(&emu, &bucket) == "[]" {
        assert!(std::time::Instant::now() < deadline, "no upload began");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    // The daemon holds its staged copy open in the staging directory (a file with no name there).
    let pid = mount.pid().unwrap();
    let held = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.starts_with(&staging))
        .count();
    assert!(held > 0, "no staged copy open under {}", staging.display());
    mount.kill();
    let closed = closer.join().unwrap();
    assert!(closed.is_err(), "close cannot succeed on a killed daemon");
    let left: Vec<_> = std::fs::read_dir(&staging).unwrap().collect();
    assert!(left.is_empty(), "left in the staging directory: {left:?}");
    set_faults(&emu, 0.0, 0, &[], &[]);
    assert!(get(&emu, &bucket, "f").unwrap() == old);
    // Even once the held part is answered, nothing completes the upload.
    std::thread::sleep(Duration::from_secs(1));
    assert!(get(&emu, &bucket, "f").unwrap() == old);
}

/// Patching 4 KiB in the middle of a 256 MiB object sends at most two parts and copies the rest.
#[test]
fn patching_a_big_object_sends_a_part_and_copies_the_rest() {
    let bucket = directory_bucket("stagedcount");
    // 256 MiB of emulator data: in memory if the machine has /dev/shm.
    let shm = std::path::Path::new("/dev/shm");
    let data = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let emu = own_emulator(&bucket, Some(data.path()));
    let size = 256 * MIB;
    let old = pattern(6, size);
    put(&emu, &bucket, "big", old.clone());
    let mount = Mount::on(&emu, &bucket, &["--allow-overwrite"]);
    let (status, _) = admin_post(&emu, "/_emulator/stats/reset", "");
    assert_eq!(status, 200);
    let at = size / 2 - 2048;
    let mut f = OpenOptions::new()
        .write(true)
        .open(mount.path().join("big"))
        .unwrap();
    f.seek(SeekFrom::Start(at as u64)).unwrap();
    f.write_all(&[0x5A; 4096]).unwrap();
    close(f).unwrap();
    let bytes_in = emulator_stat(&emu, None, None, "bytes_in");
    let bytes_out = emulator_stat(&emu, None, None, "bytes_out");
    let (_, stats) = admin_get(&emu, "/_emulator/stats");
    let count = |op: &str| emulator_stat(&emu, None, Some(op), "requests");
    eprintln!("bytes in {bytes_in}, out {bytes_out}\n{stats}");
    assert!(bytes_in < 32 * MIB as u64, "sent {bytes_in} bytes");
    assert!(bytes_out < 32 * MIB as u64, "fetched {bytes_out} bytes");
    assert!(count("UploadPart") <= 2, "{stats}");
    // The untouched ranges on either side of the patch, each one copy (merged up to 512 MiB).
    assert!(count("UploadPartCopy") >= 2, "{stats}");
    assert_eq!(count("PutObject"), 0);
    assert!(get(&emu, &bucket, "big").unwrap() == patched(&old, at, &[0x5A; 4096]));
}

/// Past --max-staged-file-size a write is refused with EFBIG; what was written before it is kept.
#[test]
fn writes_past_the_staging_limit_are_too_big() {
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, "stagedlimit");
        let emu = emulator();
        let old = pattern(7, 24 * MIB);
        put(emu, &bucket, "f", old.clone());
        let mount = Mount::new(
            &bucket,
            &["--allow-overwrite", "--max-staged-file-size", "1M"],
        );
        let f = open_rw(&mount.path().join("f"));
        f.write_all_at(&[1u8; 512 * 1024], (4 * MIB) as u64)
            .unwrap();
        assert_eq!(
            errno_of(f.write_all_at(&vec![2u8; MIB], (16 * MIB) as u64)),
            libc::EFBIG
        );
        // Growing past it too.
        assert_eq!(errno_of(f.set_len(30 * MIB as u64)), libc::EFBIG);
        close(f).unwrap();
        assert!(get(emu, &bucket, "f").unwrap() == patched(&old, 4 * MIB, &[1u8; 512 * 1024]));
        assert!(
            mount.log().contains("max-staged-file-size"),
            "{}",
            mount.log()
        );
    }
}

/// One descriptor writes, others read (in this process and in another): each sees the other's bytes.
#[test]
fn a_writer_and_readers_of_one_file_see_each_others_bytes() {
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, "stagedshare");
        let mount = Mount::new(&bucket, &["--allow-overwrite"]);
        let path = mount.path().join("shared.txt");
        let mut w = File::create(&path).unwrap();
        w.write_all(b"first line\n").unwrap();
        let mut r = File::open(&path).unwrap();
        let mut got = String::new();
        r.read_to_string(&mut got).unwrap();
        assert_eq!(got, "first line\n");
        w.write_all(b"second\n").unwrap();
        got.clear();
        r.read_to_string(&mut got).unwrap();
        assert_eq!(got, "second\n", "the reader carries on where it was");
        // Another process.
        let out = std::process::Command::new("cat")
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"first line\nsecond\n");
        // A second writer's bytes reach the first descriptor's reads.
        let other = OpenOptions::new().write(true).open(&path).unwrap();
        other.write_all_at(b"FIRST", 0).unwrap();
        let mut back = [0u8; 5];
        r.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(&back, b"FIRST");
        close(other).unwrap();
        close(w).unwrap();
        drop(r);
        assert_eq!(
            get(emulator(), &bucket, "shared.txt").unwrap(),
            b"FIRST line\nsecond\n"
        );
    }
}

/// `>>` on an existing object (no --incremental-upload): a staged edit that appends, on both bucket kinds.
#[test]
fn appending_to_an_existing_object_edits_it() {
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, "stagedappend");
        put(emulator(), &bucket, "log.txt", b"line 1\n".to_vec());
        let mount = Mount::new(&bucket, &["--allow-overwrite"]);
        let path = mount.path().join("log.txt");
        for line in ["line 2\n", "line 3\n"] {
            let mut f = OpenOptions::new().append(true).open(&path).unwrap();
            f.write_all(line.as_bytes()).unwrap();
            close(f).unwrap();
        }
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("echo 'line 4' >> '{}'", path.display()))
            .status()
            .unwrap();
        assert!(out.success());
        assert_eq!(
            get(emulator(), &bucket, "log.txt").unwrap(),
            b"line 1\nline 2\nline 3\nline 4\n",
            "directory bucket: {directory}"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"line 1\nline 2\nline 3\nline 4\n"
        );
    }
}

/// fsync of a staged edit uploads it before the close; the close after it sends nothing more.
#[test]
fn fsync_uploads_a_staged_edit() {
    let bucket = fresh_bucket(true, "stagedfsync");
    put(emulator(), &bucket, "f", b"0123456789".to_vec());
    let mount = Mount::new(&bucket, &["--allow-overwrite"]);
    let f = open_rw(&mount.path().join("f"));
    f.write_all_at(b"AB", 4).unwrap();
    assert_eq!(get(emulator(), &bucket, "f").unwrap(), b"0123456789");
    f.sync_all().unwrap();
    assert_eq!(get(emulator(), &bucket, "f").unwrap(), b"0123AB6789");
    let puts = op_count(&bucket, "PutObject");
    close(f).unwrap();
    assert_eq!(op_count(&bucket, "PutObject"), puts, "nothing left to send");
    assert_eq!(get(emulator(), &bucket, "f").unwrap(), b"0123AB6789");
}

/// A descriptor follows its file when the file, or the directory above it, is renamed, as on a local disk:
/// what it writes afterwards lands under the new name, never under the old one. On a general-purpose bucket
/// the move is a copy of the descriptor's own version, which its later upload then replaces.
#[test]
fn an_open_descriptor_follows_a_rename() {
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, "stagedfollow");
        put(emulator(), &bucket, "d/f", b"0123456789".to_vec());
        let mount = Mount::new(&bucket, &["--allow-overwrite", "--allow-delete"]);
        let f = open_rw(&mount.path().join("d/f"));
        f.write_all_at(b"AB", 2).unwrap();
        f.sync_all().unwrap();
        std::fs::rename(mount.path().join("d/f"), mount.path().join("d/g")).unwrap();
        f.write_all_at(b"CD", 4).unwrap();
        f.sync_all().unwrap();
        std::fs::rename(mount.path().join("d"), mount.path().join("e")).unwrap();
        f.write_all_at(b"EF", 6).unwrap();
        close(f).unwrap();
        assert_eq!(
            get(emulator(), &bucket, "e/g").as_deref(),
            Some(&b"01ABCDEF89"[..]),
            "directory bucket: {directory}"
        );
        for old in ["d/f", "d/g", "e/f"] {
            assert_eq!(get(emulator(), &bucket, old), None, "{old}");
        }
        assert_eq!(
            std::fs::read(mount.path().join("e/g")).unwrap(),
            b"01ABCDEF89"
        );
    }
}

/// unlink(2) of a file whose descriptor is still open but has nothing left to upload: later writes through
/// the descriptor work, as on a local disk, and never bring the name back.
#[test]
fn an_unlinked_file_stays_gone_whatever_its_descriptor_writes() {
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, "stagedunlink");
        put(emulator(), &bucket, "f", b"0123456789".to_vec());
        let mount = Mount::new(&bucket, &["--allow-overwrite", "--allow-delete"]);
        let f = open_rw(&mount.path().join("f"));
        f.write_all_at(b"AB", 2).unwrap();
        f.sync_all().unwrap();
        std::fs::remove_file(mount.path().join("f")).unwrap();
        assert_eq!(get(emulator(), &bucket, "f"), None);
        f.write_all_at(b"CD", 4).unwrap();
        let mut back = vec![0u8; 10];
        f.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, b"01ABCD6789", "the descriptor reads what it wrote");
        f.sync_all().unwrap();
        close(f).unwrap();
        assert_eq!(
            get(emulator(), &bucket, "f"),
            None,
            "directory bucket: {directory}"
        );
        assert!(!mount.path().join("f").exists());
    }
}

/// The flags of the sweep that found the unlinked-while-open bugs.
const UNLINK_FLAGS: &[&str] = &["--allow-overwrite", "--allow-delete", "--preserve-metadata"];

/// Every key of `bucket`, through the SDK (not the mount).
fn keys(bucket: &str) -> Vec<String> {
    let client = s3_client(emulator());
    let listed = runtime()
        .block_on(client.list_objects_v2().bucket(bucket).send())
        .unwrap_or_else(|e| panic!("list {bucket}: {e:?}"));
    listed
        .contents()
        .iter()
        .filter_map(|o| o.key().map(str::to_string))
        .collect()
}

/// open(O_RDWR | O_CREAT | O_TRUNC).
fn create_rw(path: &std::path::Path) -> std::fs::File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap()
}

/// Runs `case` on a fresh mount of each bucket kind (`--allow-delete`), with files it makes and unlinks while
/// open; once its descriptors are closed, nothing of them may be in the bucket, in the mount, or in a new
/// mount of the bucket.
fn unlinked_while_open(tag: &str, args: &[&str], case: impl Fn(&std::path::Path)) {
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, tag);
        let mount = Mount::new(&bucket, args);
        case(mount.path());
        let left: Vec<String> = std::fs::read_dir(mount.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            left.is_empty(),
            "names came back: {left:?} (directory bucket: {directory})"
        );
        // The kernel sends the last releases after close(2) returns; the unmount waits for them, so what they
        // would (wrongly) upload is in the bucket by now.
        drop(mount);
        let keys = keys(&bucket);
        assert!(
            keys.is_empty(),
            "objects came back: {keys:?} (directory bucket: {directory})"
        );
        let again = Mount::new(&bucket, args);
        assert_eq!(
            std::fs::read_dir(again.path()).unwrap().count(),
            0,
            "directory bucket: {directory}"
        );
    }
}

/// Python's `tempfile.TemporaryFile` (O_TMPFILE is not offered): a new file unlinked at once, then written,
/// read back from the start, and closed. The descriptor reads every byte it wrote, and no object appears.
#[test]
fn a_temporary_file_reads_back_what_it_wrote_after_its_unlink() {
    unlinked_while_open("unlinktmp", UNLINK_FLAGS, |mnt| {
        let path = mnt.join("tmpabcd1234");
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(!path.exists());
        let data = pattern(21, 100_000);
        f.write_all(&data).unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        let mut back = Vec::new();
        f.read_to_end(&mut back).unwrap();
        assert!(
            back == data,
            "read {} bytes, not what was written",
            back.len()
        );
        // Written again, in place and past the end: still read back exactly.
        f.write_all_at(b"patched", 10).unwrap();
        f.write_all_at(b"tail", 100_000).unwrap();
        let mut want = data.clone();
        want[10..17].copy_from_slice(b"patched");
        want.extend_from_slice(b"tail");
        let mut back = vec![0u8; want.len()];
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back == want);
        assert_eq!(f.metadata().unwrap().len(), want.len() as u64);
        close(f).unwrap();
        assert!(!path.exists(), "the unlinked name came back");
    });
}

/// Bytes written before the unlink, still in the writer's memory or already streamed in parts (with the
/// local copy kept within --max-staged-file-size), read back through the descriptor after it, with what is
/// written after it.
#[test]
fn a_descriptor_reads_what_it_wrote_before_the_unlink() {
    unlinked_while_open("unlinkpread", UNLINK_FLAGS, |mnt| {
        let small = mnt.join("w");
        let f = create_rw(&small);
        f.write_all_at(b"secret", 0).unwrap();
        std::fs::remove_file(&small).unwrap();
        let mut back = vec![0u8; 100];
        let n = f.read_at(&mut back, 0).unwrap();
        assert_eq!(&back[..n], b"secret");
        f.write_all_at(b" kept", 6).unwrap();
        let n = f.read_at(&mut back, 0).unwrap();
        assert_eq!(&back[..n], b"secret kept");
        close(f).unwrap();

        // Past one write part (8 MiB): the first part left for the bucket before the unlink.
        let big = mnt.join("big");
        let data = pattern(22, 12 * MIB);
        let mut f = create_rw(&big);
        f.write_all(&data).unwrap();
        std::fs::remove_file(&big).unwrap();
        let mut back = vec![0u8; data.len()];
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back == data, "the streamed file read back wrong");
        close(f).unwrap();
    });
}

/// A new file unlinked before anything was written, read (nothing) and closed: no empty object appears, and
/// the name stays gone.
#[test]
fn an_empty_file_unlinked_while_open_does_not_come_back_at_close() {
    unlinked_while_open("unlinkempty", UNLINK_FLAGS, |mnt| {
        let path = mnt.join("b");
        let f = create_rw(&path);
        std::fs::remove_file(&path).unwrap();
        let mut back = vec![0u8; 100];
        assert_eq!(f.read_at(&mut back, 0).unwrap(), 0);
        f.sync_all().unwrap();
        close(f).unwrap();
        assert!(!path.exists(), "the unlinked name came back");
    });
}

/// write, fsync (the object is uploaded), unlink (it is deleted), write again, read: the descriptor reads its
/// bytes, from before the fsync and after the unlink, and neither its fsync nor its close uploads again.
#[test]
fn a_file_fsynced_then_unlinked_reads_back_its_writes() {
    unlinked_while_open("unlinkfsync", UNLINK_FLAGS, |mnt| {
        let path = mnt.join("s");
        let f = create_rw(&path);
        f.write_all_at(b"before", 0).unwrap();
        f.sync_all().unwrap();
        std::fs::remove_file(&path).unwrap();
        f.write_all_at(b" after", 6).unwrap();
        let mut back = vec![0u8; 100];
        let n = f.read_at(&mut back, 0).unwrap();
        assert_eq!(&back[..n], b"before after");
        f.sync_all().unwrap();
        let n = f.read_at(&mut back, 0).unwrap();
        assert_eq!(&back[..n], b"before after");
        close(f).unwrap();
    });
}

/// Parts already uploaded, past --max-staged-file-size so no local copy was kept: the unlink deletes the only
/// other copy of those bytes. A read then fails (EIO), never answers zeros or a short file; nothing appears.
#[test]
fn bytes_no_longer_held_after_the_unlink_read_as_an_error() {
    let args = [UNLINK_FLAGS, &["--max-staged-file-size", "1M"]].concat();
    unlinked_while_open("unlinklost", &args, |mnt| {
        let path = mnt.join("huge");
        let mut f = create_rw(&path);
        f.write_all(&pattern(23, 9 * MIB)).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut back = vec![0u8; 100];
        assert_eq!(errno_of(f.read_at(&mut back, 0)), libc::EIO);
        // Writes go on (nothing is uploaded); reads keep failing.
        f.write_all(b"more").unwrap();
        assert_eq!(errno_of(f.read_at(&mut back, 0)), libc::EIO);
        close(f).unwrap();
    });
}

/// A log rotated with `mv` while its writer keeps writing: the rename uploads what was written and moves the
/// file, and the writer's later bytes follow it, however its writes fall around the move.
#[test]
fn a_file_renamed_while_its_writer_keeps_writing_moves() {
    let bucket = fresh_bucket(true, "rotate");
    let mount = Mount::new(&bucket, &["--allow-overwrite", "--allow-delete"]);
    for round in 0..5 {
        let path = mount.path().join(format!("app{round}.log"));
        let moved = mount.path().join(format!("app{round}.log.1"));
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(b"start\n").unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut lines = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    f.write_all(format!("line {lines}\n").as_bytes()).unwrap();
                    lines += 1;
                }
                f.sync_all().unwrap();
                lines
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        let renamed = std::fs::rename(&path, &moved);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let lines = writer.join().unwrap();
        renamed.unwrap_or_else(|e| panic!("round {round}: rename while writing: {e}"));
        let mut want = b"start\n".to_vec();
        for i in 0..lines {
            want.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        assert!(
            get(emulator(), &bucket, &format!("app{round}.log.1")).unwrap() == want,
            "round {round}"
        );
    }
}

/// A staged edit whose fsync failed (another client replaced the object) and whose descriptor stays open holds
/// no one else up: a new descriptor edits what the bucket holds now and uploads it, a `truncate(2)` by name
/// goes to the bucket too, and the failed descriptor keeps its error to the end.
#[test]
fn a_failed_staged_edit_still_open_leaves_new_writers_alone() {
    let bucket = fresh_bucket(true, "failedstaged");
    put(emulator(), &bucket, "f", pattern(1, 1000));
    let mount = Mount::new(&bucket, &["--allow-overwrite", "--metadata-ttl", "60"]);
    let p = mount.path().join("f");
    let mut failed = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    failed.write_all(b"ours").unwrap();
    let theirs = pattern(2, 1000);
    put(emulator(), &bucket, "f", theirs.clone());
    assert_eq!(errno_of(failed.sync_all()), libc::EIO);

    let mut second = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    second.write_all(b"second").unwrap();
    second
        .sync_all()
        .expect("a new descriptor's edit of what the bucket holds");
    drop(second);
    let mut want = theirs.clone();
    want[..6].copy_from_slice(b"second");
    assert!(get(emulator(), &bucket, "f").unwrap() == want);

    nix::unistd::truncate(&p, 10).expect("truncate(2) by name");
    want.truncate(10);
    assert_eq!(get(emulator(), &bucket, "f").unwrap(), want);

    assert_eq!(
        errno_of(failed.write_all(b"more").and_then(|()| failed.sync_all())),
        libc::EIO,
        "the failed descriptor keeps its error"
    );
    drop(failed);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(get(emulator(), &bucket, "f").unwrap(), want);
    assert_eq!(std::fs::read(&p).unwrap(), want);
}
