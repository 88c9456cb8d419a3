//! Symbolic links through a real FUSE mount: rclone's `.rclonelink` objects, the Hugging Face hub cache
//! layout (snapshots linking into blobs by relative paths), remounts, `ls -l`, unlink and rename, on both
//! bucket kinds.

mod common;

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;

use common::{Mount, errno_of, fresh_bucket, get, put, sha256_hex};

const BLOB: &str = "2c4ba1fe0d47";

fn snapshot(mount: &Mount) -> std::path::PathBuf {
    mount.path().join("models--org--m/snapshots/rev1")
}

/// Lays out a hub cache entry: one blob, and a snapshot file linking to it as `huggingface_hub` does.
fn make_hf_cache(mount: &Mount, data: &[u8]) {
    let repo = mount.path().join("models--org--m");
    fs::create_dir_all(repo.join("blobs")).unwrap();
    let mut f = File::create(repo.join("blobs").join(BLOB)).unwrap();
    f.write_all(data).unwrap();
    drop(f);
    fs::create_dir_all(snapshot(mount)).unwrap();
    symlink(
        format!("../../blobs/{BLOB}"),
        snapshot(mount).join("model.safetensors"),
    )
    .unwrap();
}

fn assert_link_reads(mount: &Mount, data: &[u8]) {
    let link = snapshot(mount).join("model.safetensors");
    assert_eq!(
        fs::read_link(&link).unwrap(),
        Path::new(&format!("../../blobs/{BLOB}"))
    );
    let meta = fs::symlink_metadata(&link).unwrap();
    assert!(meta.file_type().is_symlink());
    assert_eq!(meta.len(), format!("../../blobs/{BLOB}").len() as u64);
    assert_eq!(sha256_hex(&fs::read(&link).unwrap()), sha256_hex(data));
}

#[test]
fn hub_cache_links_work_and_survive_a_remount_on_both_bucket_kinds() {
    let data = common::pattern(7, 300_000);
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, "hf");
        let mount = Mount::new(&bucket, &[]);
        make_hf_cache(&mount, &data);
        assert_link_reads(&mount, &data);
        // Stored as rclone stores it: the target is the body of `name.rclonelink`.
        assert_eq!(
            get(
                common::emulator(),
                &bucket,
                "models--org--m/snapshots/rev1/model.safetensors.rclonelink"
            )
            .as_deref(),
            Some(format!("../../blobs/{BLOB}").as_bytes()),
            "{bucket}"
        );
        assert!(
            get(
                common::emulator(),
                &bucket,
                "models--org--m/snapshots/rev1/model.safetensors"
            )
            .is_none()
        );
        // A name that exists is not replaced.
        assert_eq!(
            errno_of(symlink("x", snapshot(&mount).join("model.safetensors"))),
            libc::EEXIST
        );
        assert!(mount.unmount().success());

        let mount = Mount::new(&bucket, &[]);
        let ls = Command::new("ls")
            .arg("-l")
            .arg(snapshot(&mount))
            .output()
            .unwrap();
        let ls = String::from_utf8_lossy(&ls.stdout);
        let line = ls
            .lines()
            .find(|l| l.contains("model.safetensors"))
            .unwrap_or_else(|| panic!("{bucket}: ls -l shows no link:\n{ls}"));
        assert!(line.starts_with("lrwxrwxrwx"), "{bucket}: {line}");
        assert!(
            line.ends_with(&format!("model.safetensors -> ../../blobs/{BLOB}")),
            "{bucket}: {line}"
        );
        assert_link_reads(&mount, &data);
        // A fresh mount resolving the link by name (no listing first) finds it too.
        drop(mount);
        let mount = Mount::new(&bucket, &[]);
        assert_link_reads(&mount, &data);
        assert!(mount.unmount().success());
    }
}

#[test]
fn writing_through_a_dangling_link_creates_its_target() {
    let bucket = fresh_bucket(true, "through");
    let mount = Mount::new(&bucket, &[]);
    fs::create_dir(mount.path().join("d")).unwrap();
    symlink("../made.bin", mount.path().join("d/alias")).unwrap();
    fs::write(mount.path().join("d/alias"), b"written through").unwrap();
    assert_eq!(
        get(common::emulator(), &bucket, "made.bin").as_deref(),
        Some(&b"written through"[..])
    );
    assert_eq!(
        fs::read(mount.path().join("d/alias")).unwrap(),
        b"written through"
    );
    assert!(mount.unmount().success());
}

#[test]
fn unlink_and_rename_of_links() {
    for directory in [true, false] {
        let bucket = fresh_bucket(directory, "unl");
        put(common::emulator(), &bucket, "target", b"t".to_vec());
        let mount = Mount::new(&bucket, &["--allow-delete"]);
        symlink("target", mount.path().join("a")).unwrap();
        symlink("target", mount.path().join("gone")).unwrap();
        fs::remove_file(mount.path().join("gone")).unwrap();
        assert!(get(common::emulator(), &bucket, "gone.rclonelink").is_none());
        assert_eq!(
            get(common::emulator(), &bucket, "target").as_deref(),
            Some(&b"t"[..]),
            "{bucket}: unlinking a link leaves its target"
        );
        assert_eq!(
            errno_of(fs::symlink_metadata(mount.path().join("gone"))),
            libc::ENOENT
        );
        // RenameObject on directory buckets, copy + delete on general-purpose ones.
        fs::rename(mount.path().join("a"), mount.path().join("b")).unwrap();
        assert!(get(common::emulator(), &bucket, "a.rclonelink").is_none());
        assert_eq!(
            get(common::emulator(), &bucket, "b.rclonelink").as_deref(),
            Some(&b"target"[..]),
            "{bucket}"
        );
        assert_eq!(
            fs::read_link(mount.path().join("b")).unwrap(),
            Path::new("target")
        );
        assert!(mount.unmount().success());
    }
}

#[test]
fn links_written_by_rclone_show_on_a_read_only_mount() {
    let bucket = fresh_bucket(false, "ro");
    put(
        common::emulator(),
        &bucket,
        "data/real.txt",
        b"real".to_vec(),
    );
    put(
        common::emulator(),
        &bucket,
        "data/alias.txt.rclonelink",
        b"real.txt".to_vec(),
    );
    let mount = Mount::new(&bucket, &["--read-only"]);
    let mut names: Vec<String> = fs::read_dir(mount.path().join("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, vec!["alias.txt", "real.txt"]);
    assert_eq!(
        fs::read(mount.path().join("data/alias.txt")).unwrap(),
        b"real"
    );
    assert_eq!(
        errno_of(symlink("real.txt", mount.path().join("data/new"))),
        libc::EROFS
    );
    assert!(mount.unmount().success());
}
