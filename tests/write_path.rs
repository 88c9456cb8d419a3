//! Write path through a real FUSE mount and the real SDK: checkpoints streamed as multipart uploads,
//! conditional creation, overwrite and delete flags, mkdir/rmdir, append, rename of files and directories on
//! both bucket kinds, and out-of-order writes staged locally.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;

use common::{Mount, errno_of, fresh_bucket, get, pattern, put, sha256_hex};

const MIB: usize = 1024 * 1024;

/// Writes `len` bytes of pattern(seed) in 1 MiB writes, fsyncs, closes; returns the sha256.
fn write_checkpoint(path: &std::path::Path, seed: u64, len: usize) -> String {
    let data = pattern(seed, len);
    let mut f = File::create(path).expect("create");
    for chunk in data.chunks(MIB) {
        f.write_all(chunk).expect("write");
    }
    f.sync_all().expect("fsync");
    drop(f);
    sha256_hex(&data)
}

#[test]
fn checkpoint_streams_and_reads_back_on_both_bucket_kinds() {
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, "ckpt");
        let mount = Mount::new(&bucket, &[]);
        let path = mount.path().join("ckpt.pt");
        // 40 MiB: five parts of 8 MiB and a short last one.
        let expected = write_checkpoint(&path, 1, 40 * MIB + 123);
        let through_mount = common::sha256_file(&path).unwrap();
        assert_eq!(
            through_mount, expected,
            "{bucket}: read back through the mount"
        );
        let stored = get(common::emulator(), &bucket, "ckpt.pt").expect("object exists");
        assert_eq!(sha256_hex(&stored), expected, "{bucket}: stored bytes");
        assert_eq!(fs::metadata(&path).unwrap().len(), 40 * MIB as u64 + 123);
        // Each part carries a CRC32C, so its body is not hashed again for the signature.
        let parts = common::op_count(&bucket, "UploadPart");
        assert!(parts >= 6, "{bucket}: {parts} parts");
        assert_eq!(
            common::op_stat(&bucket, "UploadPart", "unsigned_payload"),
            parts,
            "{bucket}: every checksummed part is sent with UNSIGNED-PAYLOAD"
        );
        assert!(mount.unmount().success());
    }
}

#[test]
fn without_upload_checksums_the_payload_stays_signed() {
    let bucket = fresh_bucket(true, "signed");
    let mount = Mount::new(&bucket, &["--upload-checksums", "off"]);
    let path = mount.path().join("ckpt.pt");
    let expected = write_checkpoint(&path, 2, 20 * MIB);
    let stored = get(common::emulator(), &bucket, "ckpt.pt").expect("object exists");
    assert_eq!(sha256_hex(&stored), expected);
    let parts = common::op_count(&bucket, "UploadPart");
    assert!(parts >= 2, "{parts} parts");
    // With no checksum, the SHA-256 in the signature is the only hash that covers the bytes.
    assert_eq!(
        common::op_stat(&bucket, "UploadPart", "unsigned_payload"),
        0
    );
    assert!(mount.unmount().success());
}

#[test]
fn one_gib_checkpoint_and_four_concurrent_writers() {
    let bucket = fresh_bucket(true, "big");
    let mount = Mount::new(&bucket, &[]);
    let big = mount.path().join("model.ckpt");
    let expected = write_checkpoint(&big, 2, 1024 * MIB);
    assert_eq!(common::sha256_file(&big).unwrap(), expected);
    let stored = get(common::emulator(), &bucket, "model.ckpt").unwrap();
    assert_eq!(sha256_hex(&stored), expected);
    drop(stored);

    let dir = mount.path().to_path_buf();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let path = dir.join(format!("shard-{i}.bin"));
            std::thread::spawn(move || {
                (
                    path.clone(),
                    write_checkpoint(&path, 10 + i, 48 * MIB + i as usize),
                )
            })
        })
        .collect();
    for h in handles {
        let (path, sha) = h.join().unwrap();
        assert_eq!(
            common::sha256_file(&path).unwrap(),
            sha,
            "{}",
            path.display()
        );
        let key = path.file_name().unwrap().to_str().unwrap().to_string();
        assert_eq!(
            sha256_hex(&get(common::emulator(), &bucket, &key).unwrap()),
            sha
        );
    }
    let (status, uploads) = common::admin_get(
        common::emulator(),
        &format!("/_emulator/uploads?bucket={bucket}"),
    );
    assert_eq!(status, 200);
    assert_eq!(uploads.trim(), "[]", "multipart uploads left behind");
}

#[test]
fn small_files_are_single_puts_and_visible_at_close() {
    let bucket = fresh_bucket(true, "small");
    let mount = Mount::new(&bucket, &[]);
    fs::create_dir(mount.path().join("sub")).unwrap();
    fs::write(mount.path().join("sub/a.txt"), b"hello").unwrap();
    assert_eq!(
        get(common::emulator(), &bucket, "sub/a.txt").unwrap(),
        b"hello"
    );
    assert_eq!(fs::read(mount.path().join("sub/a.txt")).unwrap(), b"hello");
    // An empty file is an empty object.
    File::create(mount.path().join("empty")).unwrap();
    assert_eq!(get(common::emulator(), &bucket, "empty").unwrap(), b"");

    // A second mount of the same bucket sees the new directory and file.
    let other = Mount::new(&bucket, &["--read-only"]);
    let mut names: Vec<String> = fs::read_dir(other.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, vec!["empty", "sub"]);
    assert_eq!(fs::read(other.path().join("sub/a.txt")).unwrap(), b"hello");
}

#[test]
fn overwrite_needs_the_flag_and_o_trunc() {
    let bucket = fresh_bucket(true, "over");
    put(common::emulator(), &bucket, "k", b"original".to_vec());
    {
        let mount = Mount::new(&bucket, &[]);
        let p = mount.path().join("k");
        assert_eq!(
            errno_of(File::create(&p)),
            libc::EPERM,
            "overwrite without --allow-overwrite"
        );
        assert_eq!(
            errno_of(OpenOptions::new().create_new(true).write(true).open(&p)),
            libc::EEXIST
        );
        assert_eq!(get(common::emulator(), &bucket, "k").unwrap(), b"original");
    }
    {
        let mount = Mount::new(&bucket, &[]);
        assert_eq!(
            errno_of(OpenOptions::new().write(true).open(mount.path().join("k"))),
            libc::EPERM,
            "an edit in place without --allow-overwrite"
        );
    }
    let mount = Mount::new(&bucket, &["--allow-overwrite"]);
    let p = mount.path().join("k");
    // Without O_TRUNC the object is edited in place (staged), and the close uploads the edit.
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"OR", 0).unwrap();
    drop(f);
    assert_eq!(get(common::emulator(), &bucket, "k").unwrap(), b"ORiginal");
    fs::write(&p, b"replaced").unwrap();
    assert_eq!(get(common::emulator(), &bucket, "k").unwrap(), b"replaced");
    assert_eq!(fs::read(&p).unwrap(), b"replaced");
}

#[test]
fn delete_needs_the_flag_and_rmdir_checks_emptiness() {
    let bucket = fresh_bucket(true, "del");
    put(common::emulator(), &bucket, "d/x", b"1".to_vec());
    put(common::emulator(), &bucket, "f", b"2".to_vec());
    {
        let mount = Mount::new(&bucket, &[]);
        assert_eq!(
            errno_of(fs::remove_file(mount.path().join("f"))),
            libc::EPERM
        );
        assert!(get(common::emulator(), &bucket, "f").is_some());
    }
    let mount = Mount::new(&bucket, &["--allow-delete"]);
    fs::remove_file(mount.path().join("f")).unwrap();
    assert!(get(common::emulator(), &bucket, "f").is_none());
    assert_eq!(errno_of(fs::metadata(mount.path().join("f"))), libc::ENOENT);
    assert_eq!(
        errno_of(fs::remove_dir(mount.path().join("d"))),
        libc::ENOTEMPTY
    );
    fs::create_dir(mount.path().join("newdir")).unwrap();
    assert!(mount.path().join("newdir").is_dir());
    fs::remove_dir(mount.path().join("newdir")).unwrap();
    assert_eq!(
        errno_of(fs::metadata(mount.path().join("newdir"))),
        libc::ENOENT
    );
    fs::remove_file(mount.path().join("d/x")).unwrap();
    assert_eq!(
        errno_of(fs::metadata(mount.path().join("d/x"))),
        libc::ENOENT
    );
}

/// Another client appended since the kernel learned the file's size: an O_APPEND open must not write at the
/// old end (over their bytes, or refused as out of place). The open sees the new size, has the kernel look
/// the name up again, and our bytes follow theirs; with native appends and with a staged file alike.
#[test]
fn an_append_follows_another_clients_append() {
    for args in [
        &["--incremental-upload", "--metadata-ttl", "60"][..],
        &["--allow-overwrite", "--metadata-ttl", "60"][..],
    ] {
        let bucket = fresh_bucket(true, "append-theirs");
        put(common::emulator(), &bucket, "log.txt", b"first\n".to_vec());
        let mount = Mount::new(&bucket, args);
        let p = mount.path().join("log.txt");
        assert_eq!(fs::metadata(&p).unwrap().len(), 6);
        let client = common::s3_client(common::emulator());
        common::runtime()
            .block_on(
                client
                    .put_object()
                    .bucket(&bucket)
                    .key("log.txt")
                    .write_offset_bytes(6)
                    .body(b"theirs\n".to_vec().into())
                    .send(),
            )
            .unwrap();
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"ours\n").unwrap();
        f.sync_all().unwrap();
        drop(f);
        assert_eq!(
            get(common::emulator(), &bucket, "log.txt").unwrap(),
            b"first\ntheirs\nours\n",
            "{args:?}"
        );
    }
}

/// Appends of exactly whole parts: every byte is sent as the parts fill, and the fsync and the close that
/// follow have nothing left to send. S3 Express refuses an empty append; neither sends one.
#[test]
fn appends_of_whole_parts_send_no_empty_append() {
    const PART: usize = 5 * 1024 * 1024;
    let bucket = fresh_bucket(true, "append-parts");
    put(common::emulator(), &bucket, "log.bin", b"head".to_vec());
    let mount = Mount::new(
        &bucket,
        &["--incremental-upload", "--write-part-size", "5M"],
    );
    let p = mount.path().join("log.bin");
    let body = pattern(7, 2 * PART);
    let mut f = OpenOptions::new().append(true).open(&p).unwrap();
    f.write_all(&body[..PART]).unwrap();
    f.sync_all().unwrap();
    f.write_all(&body[PART..]).unwrap();
    // SAFETY: closes the descriptor `f` gives up; nothing else holds it.
    let closed = unsafe { libc::close(std::os::fd::IntoRawFd::into_raw_fd(f)) };
    assert_eq!(closed, 0, "close: {}", std::io::Error::last_os_error());
    let mut want = b"head".to_vec();
    want.extend_from_slice(&body);
    let stored = get(common::emulator(), &bucket, "log.bin").unwrap();
    assert!(stored == want, "{} bytes stored", stored.len());
    assert_eq!(fs::metadata(&p).unwrap().len(), want.len() as u64);
}

#[test]
fn append_on_directory_bucket_and_concurrent_writer_gets_eio() {
    let bucket = fresh_bucket(true, "append");
    put(common::emulator(), &bucket, "log.txt", b"first\n".to_vec());
    let mount = Mount::new(&bucket, &["--incremental-upload"]);
    let p = mount.path().join("log.txt");
    let mut f = OpenOptions::new().append(true).open(&p).unwrap();
    f.write_all(b"second\n").unwrap();
    f.sync_all().unwrap();
    assert_eq!(
        get(common::emulator(), &bucket, "log.txt").unwrap(),
        b"first\nsecond\n",
        "visible after fsync"
    );
    f.write_all(b"third\n").unwrap();
    drop(f);
    let other = Mount::new(&bucket, &["--read-only", "--metadata-ttl", "minimal"]);
    assert_eq!(
        fs::read(other.path().join("log.txt")).unwrap(),
        b"first\nsecond\nthird\n"
    );

    // Another client appends behind our back: our next append is at a stale offset.
    let mut f = OpenOptions::new().append(true).open(&p).unwrap();
    f.write_all(b"ours\n").unwrap();
    put(
        common::emulator(),
        &bucket,
        "log.txt",
        b"someone else replaced it\n".to_vec(),
    );
    let result = f.sync_all();
    assert_eq!(errno_of(result), libc::EIO);
    drop(f);
    assert_eq!(
        get(common::emulator(), &bucket, "log.txt").unwrap(),
        b"someone else replaced it\n"
    );
}

/// Another client deleted files this mount still knows (within its TTL, so the kernel's entries are fresh too).
/// Opening one to append with O_CREAT creates it anew with the appended bytes, as a local file system does
/// when the open comes after the unlink; an open without O_CREAT says ENOENT. Before, both said ENOENT: the
/// kernel sent OPEN for the inode it knew, and only an ESTALE answer makes it look the name up again.
#[test]
fn an_append_with_o_creat_makes_again_a_file_another_client_deleted() {
    let emu = common::emulator();
    let client = common::s3_client(emu);
    let delete = |bucket: &str, key: &str| {
        common::runtime()
            .block_on(client.delete_object().bucket(bucket).key(key).send())
            .unwrap();
    };
    for (directory, flag) in [
        (true, "--allow-overwrite"),
        (true, "--incremental-upload"),
        (false, "--allow-overwrite"),
    ] {
        let bucket = fresh_bucket(directory, "stale");
        put(emu, &bucket, "log.txt", b"old\n".to_vec());
        put(emu, &bucket, "other.txt", b"x".to_vec());
        let mount = Mount::new(&bucket, &[flag, "--metadata-ttl", "60"]);
        assert_eq!(fs::read(mount.path().join("log.txt")).unwrap(), b"old\n");
        assert_eq!(fs::read(mount.path().join("other.txt")).unwrap(), b"x");
        delete(&bucket, "log.txt");
        delete(&bucket, "other.txt");
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .open(mount.path().join("log.txt"))
            .unwrap_or_else(|e| panic!("{flag}, directory bucket {directory}: {e}"));
        f.write_all(b"new\n").unwrap();
        drop(f);
        assert_eq!(get(emu, &bucket, "log.txt").unwrap(), b"new\n", "{flag}");
        assert_eq!(fs::read(mount.path().join("log.txt")).unwrap(), b"new\n");
        let without_create = OpenOptions::new()
            .append(true)
            .open(mount.path().join("other.txt"));
        assert_eq!(errno_of(without_create), libc::ENOENT, "{flag}");
        assert_eq!(get(emu, &bucket, "other.txt"), None);
    }
}

#[test]
fn file_rename_on_both_bucket_kinds_and_the_overwrite_rule() {
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, "ren");
        let mount = Mount::new(&bucket, &[]);
        fs::write(mount.path().join("tmp.ckpt"), b"weights").unwrap();
        fs::create_dir(mount.path().join("final")).unwrap();
        fs::rename(
            mount.path().join("tmp.ckpt"),
            mount.path().join("final/model.ckpt"),
        )
        .unwrap();
        assert_eq!(
            get(common::emulator(), &bucket, "final/model.ckpt").unwrap(),
            b"weights"
        );
        assert!(get(common::emulator(), &bucket, "tmp.ckpt").is_none());
        // Directory buckets: one atomic RenameObject; general-purpose: CopyObject then DeleteObject.
        let (renames, copies) = (
            common::op_count(&bucket, "RenameObject"),
            common::op_count(&bucket, "CopyObject"),
        );
        assert_eq!(
            (renames, copies),
            if directory { (1, 0) } else { (0, 1) },
            "{bucket}"
        );
        assert_eq!(
            errno_of(fs::metadata(mount.path().join("tmp.ckpt"))),
            libc::ENOENT
        );
        assert_eq!(
            fs::read(mount.path().join("final/model.ckpt")).unwrap(),
            b"weights"
        );
        // Replacing needs --allow-overwrite, on both kinds.
        fs::write(mount.path().join("b"), b"b").unwrap();
        assert_eq!(
            errno_of(fs::rename(
                mount.path().join("b"),
                mount.path().join("final/model.ckpt")
            )),
            libc::EPERM
        );
        assert_eq!(
            get(common::emulator(), &bucket, "final/model.ckpt").unwrap(),
            b"weights"
        );
        drop(mount);
        let mount = Mount::new(&bucket, &["--allow-overwrite"]);
        fs::rename(
            mount.path().join("b"),
            mount.path().join("final/model.ckpt"),
        )
        .unwrap();
        assert_eq!(
            get(common::emulator(), &bucket, "final/model.ckpt").unwrap(),
            b"b"
        );
        assert!(get(common::emulator(), &bucket, "b").is_none());
        // os.replace(tmp, final) as trainers save checkpoints.
        for step in 0..3u8 {
            fs::write(mount.path().join("ckpt.tmp"), [step; 100]).unwrap();
            fs::rename(mount.path().join("ckpt.tmp"), mount.path().join("ckpt")).unwrap();
            assert_eq!(fs::read(mount.path().join("ckpt")).unwrap(), [step; 100]);
        }
    }
}

/// Rust's `tempfile` persists a temporary file by renaming it before closing it (safetensors' `save_file`
/// does so): the bytes written so far are uploaded first, and what the descriptor writes after the rename
/// lands under the new name. A streamed new file, a bigger one written in parts, and an edited (staged) one.
#[test]
fn a_file_renamed_before_it_is_closed_lands_under_its_new_name() {
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, "persist");
        put(
            common::emulator(),
            &bucket,
            "old.bin",
            b"0123456789".to_vec(),
        );
        let mount = Mount::new(
            &bucket,
            &[
                "--allow-overwrite",
                "--allow-delete",
                "--write-part-size",
                "5242880",
            ],
        );
        let cases: [(&str, Vec<u8>, Option<usize>); 3] = [
            ("small", pattern(1, 4096), None),
            ("parts", pattern(2, 12 << 20), None),
            ("old.bin", b"abc".to_vec(), Some(3)),
        ];
        for (name, bytes, at) in cases {
            let (temp, target) = (
                mount.path().join(name),
                mount.path().join(format!("{name}.final")),
            );
            let f = match at {
                None => File::create(&temp).unwrap(),
                Some(_) => OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&temp)
                    .unwrap(),
            };
            f.write_all_at(&bytes, at.unwrap_or(0) as u64).unwrap();
            fs::rename(&temp, &target).unwrap_or_else(|e| panic!("{bucket} {name}: {e}"));
            let end = at.unwrap_or(0) + bytes.len();
            f.write_all_at(b"tail", end as u64).unwrap();
            drop(f);
            let expected = match at {
                // "012" + "abc" + "tail" over "6789".
                Some(_) => b"012abctail".to_vec(),
                None => [bytes.as_slice(), b"tail"].concat(),
            };
            let key = format!("{name}.final");
            assert!(
                get(common::emulator(), &bucket, &key) == Some(expected.clone()),
                "{bucket}: {key}"
            );
            assert!(
                get(common::emulator(), &bucket, name).is_none(),
                "{bucket}: {name}"
            );
            assert!(
                fs::read(&target).unwrap() == expected,
                "{bucket}: {key} through the mount"
            );
        }
    }
}

#[test]
fn directory_rename_on_both_bucket_kinds() {
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, "dren");
        for key in ["step.tmp/a", "step.tmp/sub/b", "step.tmpx"] {
            put(common::emulator(), &bucket, key, key.as_bytes().to_vec());
        }
        let mount = Mount::new(&bucket, &[]);
        let root = mount.path();
        // Looked up (and a handle to the subdirectory kept) before the rename.
        assert_eq!(fs::read(root.join("step.tmp/a")).unwrap(), b"step.tmp/a");
        let sub = fs::read_dir(root.join("step.tmp/sub")).unwrap().count();
        assert_eq!(sub, 1);
        fs::rename(root.join("step.tmp"), root.join("step_1")).unwrap();
        assert_eq!(
            get(common::emulator(), &bucket, "step_1/sub/b").unwrap(),
            b"step.tmp/sub/b"
        );
        assert!(get(common::emulator(), &bucket, "step_1/a").is_some());
        assert!(get(common::emulator(), &bucket, "step.tmp/a").is_none());
        assert!(get(common::emulator(), &bucket, "step.tmp/sub/b").is_none());
        assert!(get(common::emulator(), &bucket, "step.tmpx").is_some());
        assert_eq!(
            fs::read(root.join("step_1/sub/b")).unwrap(),
            b"step.tmp/sub/b"
        );
        assert_eq!(errno_of(fs::metadata(root.join("step.tmp"))), libc::ENOENT);
        let mut names: Vec<String> = fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["step.tmpx", "step_1"]);
        // Into its own subtree: EINVAL; onto a non-empty directory: ENOTEMPTY; onto an empty one: fine.
        assert_eq!(
            errno_of(fs::rename(root.join("step_1"), root.join("step_1/sub/x"))),
            libc::EINVAL
        );
        fs::create_dir(root.join("full")).unwrap();
        fs::write(root.join("full/f"), b"f").unwrap();
        assert_eq!(
            errno_of(fs::rename(root.join("step_1"), root.join("full"))),
            libc::ENOTEMPTY
        );
        fs::create_dir(root.join("empty")).unwrap();
        fs::rename(root.join("step_1"), root.join("empty")).unwrap();
        assert_eq!(fs::read(root.join("empty/a")).unwrap(), b"step.tmp/a");
    }
}

#[test]
fn directory_rename_past_the_limit_is_exdev_and_moves_nothing() {
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, "dlim");
        for i in 0..4 {
            put(
                common::emulator(),
                &bucket,
                &format!("d/{i}"),
                vec![i as u8],
            );
        }
        let mount = Mount::new(&bucket, &["-o", "max-rename-objects=3"]);
        assert_eq!(
            errno_of(fs::rename(mount.path().join("d"), mount.path().join("e"))),
            libc::EXDEV
        );
        for op in ["RenameObject", "CopyObject", "DeleteObject"] {
            assert_eq!(common::op_count(&bucket, op), 0, "{bucket}: {op}");
        }
        assert!(get(common::emulator(), &bucket, "d/3").is_some());
        drop(mount);
        let mount = Mount::new(&bucket, &["--max-rename-objects", "4"]);
        fs::rename(mount.path().join("d"), mount.path().join("e")).unwrap();
        for i in 0..4 {
            assert_eq!(
                get(common::emulator(), &bucket, &format!("e/{i}")).unwrap(),
                [i as u8]
            );
        }
    }
}

#[test]
fn out_of_order_writes_are_staged_and_uploaded_whole() {
    let bucket = fresh_bucket(true, "zip");
    let mount = Mount::new(&bucket, &[]);
    let p = mount.path().join("archive.bin");
    let mut f = File::create(&p).unwrap();
    f.write_all(&[0u8; 4096]).unwrap();
    f.write_all(b"payload").unwrap();
    // Patch a header at the start, as zipfile and h5py do.
    f.write_all_at(b"HEADER", 0).unwrap();
    f.seek(SeekFrom::End(0)).unwrap();
    f.write_all(b"tail").unwrap();
    drop(f);
    let stored = get(common::emulator(), &bucket, "archive.bin").unwrap();
    assert_eq!(&stored[..6], b"HEADER");
    assert_eq!(&stored[4096..4103], b"payload");
    assert!(stored.ends_with(b"tail"));
    assert_eq!(stored.len(), 4096 + 7 + 4);

    // With staging disabled the seek-back write fails and nothing is uploaded.
    let mount = Mount::new(&bucket, &["--max-staged-file-size", "0"]);
    let p = mount.path().join("nostage.bin");
    let mut f = File::create(&p).unwrap();
    f.write_all(b"abc").unwrap();
    assert_eq!(errno_of(f.write_all_at(b"X", 0)), libc::EINVAL);
    drop(f);
    assert!(get(common::emulator(), &bucket, "nostage.bin").is_none());
}

#[test]
fn metadata_calls_from_copy_tools_do_not_fail() {
    let bucket = fresh_bucket(true, "meta");
    let mount = Mount::new(&bucket, &[]);
    let src = tempfile::NamedTempFile::new().unwrap();
    fs::write(src.path(), b"copied").unwrap();
    let dest = mount.path().join("copied.txt");
    let status = std::process::Command::new("cp")
        .arg("-p")
        .arg(src.path())
        .arg(&dest)
        .status()
        .unwrap();
    assert!(status.success(), "cp -p failed");
    assert_eq!(
        get(common::emulator(), &bucket, "copied.txt").unwrap(),
        b"copied"
    );
    let status = std::process::Command::new("touch")
        .arg(&dest)
        .status()
        .unwrap();
    assert!(status.success(), "touch failed");
    let mut buf = String::new();
    File::open(&dest).unwrap().read_to_string(&mut buf).unwrap();
    assert_eq!(buf, "copied");
}

#[test]
fn shell_redirection_writes_land() {
    // The shell dup2s the new descriptor onto stdout and closes the original (a FUSE flush) before writing.
    let bucket = fresh_bucket(true, "shell");
    let mount = Mount::new(&bucket, &[]);
    let p = mount.path().join("hello.txt");
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("echo hello > '{}'", p.display()))
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        get(common::emulator(), &bucket, "hello.txt").unwrap(),
        b"hello\n"
    );
    assert_eq!(fs::read(&p).unwrap(), b"hello\n");
}

#[test]
fn locks_are_node_local_and_open_writers_are_capped() {
    use std::os::fd::AsRawFd;
    let bucket = fresh_bucket(true, "locks");
    let mount = Mount::new(&bucket, &["--max-open-writers", "3"]);
    fs::write(mount.path().join("lockfile"), b"x").unwrap();
    let a = File::open(mount.path().join("lockfile")).unwrap();
    let b = File::open(mount.path().join("lockfile")).unwrap();
    // SAFETY: flock on descriptors we own.
    assert_eq!(
        unsafe { libc::flock(a.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    assert_eq!(
        unsafe { libc::flock(b.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        -1,
        "second exclusive flock granted"
    );
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EWOULDBLOCK)
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::flock(a.as_raw_fd(), libc::LOCK_UN) }, 0);

    let writers: Vec<File> = (0..3)
        .map(|i| File::create(mount.path().join(format!("w{i}"))).unwrap())
        .collect();
    assert_eq!(
        errno_of(File::create(mount.path().join("w3"))),
        libc::EMFILE
    );
    drop(writers);
    std::thread::sleep(std::time::Duration::from_millis(200)); // releases are asynchronous
    File::create(mount.path().join("w3")).expect("a slot is free again after close");
}

#[test]
fn python_zipfile_with_a_large_member_round_trips() {
    // zipfile seeks back to rewrite each local header after the member's data: with a 20 MiB member, parts
    // are already uploaded when it does, so the local copy takes over.
    let bucket = fresh_bucket(true, "zipfile");
    let mount = Mount::new(&bucket, &[]);
    let archive = mount.path().join("shard.zip");
    let script = format!(
        "import zipfile, os\nwith zipfile.ZipFile('{0}', 'w', zipfile.ZIP_STORED) as z:\n    z.writestr('a.bin', bytes(range(256)) * 81920)\n    z.writestr('b.txt', 'hello')\nwith zipfile.ZipFile('{0}') as z:\n    assert z.testzip() is None\n    assert z.read('b.txt') == b'hello'\n    assert z.read('a.bin') == bytes(range(256)) * 81920\nprint('ok')\n",
        archive.display()
    );
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stored = get(common::emulator(), &bucket, "shard.zip").unwrap();
    assert!(stored.len() > 20 * MIB);
    let (_, uploads) = common::admin_get(
        common::emulator(),
        &format!("/_emulator/uploads?bucket={bucket}"),
    );
    assert_eq!(uploads.trim(), "[]");
}

fn sorted_names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// `--directory-markers`: an empty directory made here lasts. mkdir writes `dir/`; a remount shows it, empty;
/// a rename moves it, onto an empty directory too; rmdir deletes it; a directory emptied of its files stays.
/// Without the flag an empty directory lasts only as long as the mount (Mountpoint's behaviour).
#[test]
fn directory_markers_keep_empty_directories_on_both_bucket_kinds() {
    let emu = common::emulator();
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, "markers");
        let flags: &[&str] = &["--directory-markers", "--allow-delete"];
        let mount = Mount::new(&bucket, flags);
        let root = mount.path();
        fs::create_dir_all(root.join("a/b/c")).unwrap();
        fs::write(root.join("a/file"), b"x").unwrap();
        for name in ["empty", "moved", "target", "gone"] {
            fs::create_dir(root.join(name)).unwrap();
        }
        assert_eq!(errno_of(fs::create_dir(root.join("empty"))), libc::EEXIST);
        fs::rename(root.join("moved"), root.join("renamed")).unwrap();
        // Onto an empty directory that has its own marker: the two become one.
        fs::rename(root.join("renamed"), root.join("target")).unwrap();
        fs::remove_dir(root.join("gone")).unwrap();
        assert_eq!(sorted_names(root), ["a", "empty", "target"]);
        drop(mount);

        for key in ["a/", "a/b/", "a/b/c/", "empty/", "target/"] {
            assert_eq!(get(emu, &bucket, key), Some(vec![]), "{bucket}: {key}");
        }
        for key in ["moved/", "renamed/", "gone/"] {
            assert_eq!(get(emu, &bucket, key), None, "{bucket}: {key}");
        }
        let again = Mount::new(&bucket, flags);
        let root = again.path();
        assert_eq!(sorted_names(root), ["a", "empty", "target"]);
        assert_eq!(sorted_names(&root.join("a")), ["b", "file"]);
        assert!(sorted_names(&root.join("a/b/c")).is_empty());
        assert!(sorted_names(&root.join("empty")).is_empty());
        fs::remove_file(root.join("a/file")).unwrap();
        fs::remove_dir(root.join("a/b/c")).unwrap();
        assert_eq!(get(emu, &bucket, "a/b/c/"), None);
        drop(again);

        let last = Mount::new(&bucket, flags);
        assert_eq!(sorted_names(&last.path().join("a")), ["b"]);
        assert!(sorted_names(&last.path().join("a/b")).is_empty());
    }

    let bucket = fresh_bucket(false, "nomarkers");
    let mount = Mount::new(&bucket, &[]);
    fs::create_dir(mount.path().join("d")).unwrap();
    assert!(mount.path().join("d").is_dir());
    drop(mount);
    assert_eq!(get(emu, &bucket, "d/"), None);
    let again = Mount::new(&bucket, &[]);
    assert_eq!(errno_of(fs::metadata(again.path().join("d"))), libc::ENOENT);
}

/// Without --allow-delete, rmdir of a directory that has a marker is refused and the directory stays.
#[test]
fn rmdir_of_a_directory_marker_needs_allow_delete() {
    let bucket = fresh_bucket(false, "markkeep");
    let mount = Mount::new(&bucket, &["--directory-markers"]);
    fs::create_dir(mount.path().join("d")).unwrap();
    assert_eq!(
        errno_of(fs::remove_dir(mount.path().join("d"))),
        libc::EPERM
    );
    assert!(mount.path().join("d").is_dir());
    assert_eq!(get(common::emulator(), &bucket, "d/"), Some(vec![]));
}

/// A write through an O_SYNC or O_DSYNC descriptor returns once its bytes are in the bucket (`dd oflag=sync`,
/// loggers): after each write, before any close or fsync, the object holds everything written so far.
#[test]
fn o_sync_and_o_dsync_writes_are_in_the_bucket_when_they_return() {
    use std::os::unix::fs::OpenOptionsExt;
    for (directory, flags) in [
        (true, &["--allow-overwrite"][..]),
        (true, &["--allow-overwrite", "--incremental-upload"][..]),
        (false, &["--allow-overwrite"][..]),
    ] {
        let bucket = fresh_bucket(directory, "osync");
        let mount = Mount::new(&bucket, flags);
        for (name, sync_flag) in [("sync.log", libc::O_SYNC), ("dsync.log", libc::O_DSYNC)] {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(sync_flag)
                .open(mount.path().join(name))
                .unwrap();
            let mut expected = Vec::new();
            for (i, len) in [1000usize, 6 << 20, 3].into_iter().enumerate() {
                let piece = pattern(60 + i as u64, len);
                f.write_all(&piece).unwrap();
                expected.extend_from_slice(&piece);
                let stored = get(common::emulator(), &bucket, name);
                assert!(
                    stored.as_deref() == Some(&expected[..]),
                    "{bucket} {flags:?} {name}: after write {i}, the bucket holds {:?} bytes of {}",
                    stored.map(|s| s.len()),
                    expected.len()
                );
            }
            drop(f);
            assert!(fs::read(mount.path().join(name)).unwrap() == expected);
        }
    }
}
