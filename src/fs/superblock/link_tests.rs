//! Symbolic links through the core, with the fake client: the stored format, what lookups and listings
//! cost, and which changes are refused.

use crate::fs::test_support::{config, fs_with};
use crate::fs::{FileKind, FsError, ROOT_INO, S3Filesystem};
use crate::s3::fake::Op;

/// The entries of directory `ino` (without `.` and `..`), sorted, with their kinds.
async fn entries(fs: &S3Filesystem, ino: u64) -> Vec<(String, FileKind)> {
    let fh = fs.opendir(ino).unwrap();
    let mut found: Vec<_> = fs
        .readdir(fh, 0)
        .await
        .unwrap()
        .iter()
        .filter(|e| e.name != "." && e.name != "..")
        .map(|e| (e.name.clone(), e.kind))
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

#[tokio::test]
async fn a_link_is_an_object_named_rclonelink_holding_its_target() {
    let (fake, fs) = fs_with(&[("blobs/abc", b"weights")], config(), true).await;
    let snap = fs.sb.mkdir(ROOT_INO, "snap").await.unwrap().ino;
    let link = fs.sb.symlink(snap, "model", b"../blobs/abc").await.unwrap();
    assert_eq!(
        (link.kind, link.perm, link.size),
        (FileKind::Symlink, 0o777, 12)
    );
    assert_eq!(
        fake.object("snap/model.rclonelink").as_deref(),
        Some(&b"../blobs/abc"[..])
    );
    assert!(fake.object("snap/model").is_none());
    // The target written is kept: readlink needs no request.
    let before = fake.counts();
    assert_eq!(
        &fs.sb.readlink(link.ino).await.unwrap()[..],
        b"../blobs/abc"
    );
    assert_eq!(fake.counts().since(&before).total(), 0);
    assert_eq!(
        entries(&fs, snap).await,
        vec![("model".to_string(), FileKind::Symlink)]
    );
    // A file is not a link.
    let blobs = fs.sb.lookup(ROOT_INO, "blobs").await.unwrap().ino;
    let blob = fs.sb.lookup(blobs, "abc").await.unwrap().ino;
    assert!(matches!(
        fs.sb.readlink(blob).await,
        Err(FsError::InvalidArgument(_))
    ));
}

#[tokio::test]
async fn links_are_known_from_the_listing_after_a_remount() {
    let files: [(&str, &[u8]); 3] = [
        ("snap/a.rclonelink", b"../blobs/1"),
        ("snap/b.rclonelink", b"../blobs/2"),
        ("snap/c", b"plain"),
    ];
    for read_only in [false, true] {
        let mut c = config();
        c.read_only = read_only;
        let (fake, fs) = fs_with(&files, c, true).await;
        let snap = fs.sb.lookup(ROOT_INO, "snap").await.unwrap().ino;
        let before = fake.counts();
        assert_eq!(
            entries(&fs, snap).await,
            vec![
                ("a".to_string(), FileKind::Symlink),
                ("b".to_string(), FileKind::Symlink),
                ("c".to_string(), FileKind::File),
            ]
        );
        assert_eq!(
            fake.counts().since(&before).total(),
            1,
            "one LIST, nothing per link"
        );
        // Listed entries are fresh: the lookup is free, the target costs one read of the object.
        let a = fs.sb.lookup(snap, "a").await.unwrap();
        assert_eq!((a.kind, a.size), (FileKind::Symlink, 10));
        assert_eq!(fake.counts().since(&before).total(), 1);
        assert_eq!(&fs.sb.readlink(a.ino).await.unwrap()[..], b"../blobs/1");
        let after_first = fake.counts();
        assert_eq!(&fs.sb.readlink(a.ino).await.unwrap()[..], b"../blobs/1");
        assert_eq!(
            fake.counts().since(&after_first).total(),
            0,
            "the target is kept"
        );
    }
}

#[tokio::test]
async fn a_lookup_asks_for_the_link_only_when_the_name_is_missing() {
    let files: [(&str, &[u8]); 2] = [("l.rclonelink", b"target"), ("f", b"data")];
    let (fake, fs) = fs_with(&files, config(), true).await;
    // As in a directory bigger than one page: each lookup asks for its own name.
    fs.sb.as_if_bigger_than_a_page(ROOT_INO);
    let before = fake.counts();
    fs.sb.lookup(ROOT_INO, "f").await.unwrap();
    let file = fake.counts().since(&before);
    assert_eq!(
        (file.get(Op::Head), file.get(Op::List)),
        (1, 1),
        "an existing file costs what it did"
    );
    let before = fake.counts();
    let l = fs.sb.lookup(ROOT_INO, "l").await.unwrap();
    assert_eq!(l.kind, FileKind::Symlink);
    let link = fake.counts().since(&before);
    // The object `l` (missing), the prefix `l/`, then the link with its body (a single GET on S3).
    assert_eq!((link.get(Op::Head), link.get(Op::List)), (2, 1));
    let before = fake.counts();
    assert_eq!(&fs.sb.readlink(l.ino).await.unwrap()[..], b"target");
    assert_eq!(
        fake.counts().since(&before).total(),
        0,
        "the lookup brought the target"
    );
    // A missing name: one request more than before, then remembered.
    let before = fake.counts();
    assert!(matches!(
        fs.sb.lookup(ROOT_INO, "none").await,
        Err(FsError::NotFound)
    ));
    assert_eq!(fake.counts().since(&before).total(), 3);
    let before = fake.counts();
    assert!(fs.sb.lookup(ROOT_INO, "none").await.is_err());
    assert_eq!(fake.counts().since(&before).total(), 0);
}

#[tokio::test]
async fn a_file_or_directory_of_the_same_name_wins_over_a_link() {
    let files: [(&str, &[u8]); 4] = [
        ("x", b"file"),
        ("x.rclonelink", b"elsewhere"),
        ("d/inside", b"1"),
        ("d.rclonelink", b"elsewhere"),
    ];
    let (_, fs) = fs_with(&files, config(), true).await;
    assert_eq!(
        fs.sb.lookup(ROOT_INO, "x").await.unwrap().kind,
        FileKind::File
    );
    assert_eq!(
        fs.sb.lookup(ROOT_INO, "d").await.unwrap().kind,
        FileKind::Directory
    );
    assert_eq!(
        entries(&fs, ROOT_INO).await,
        vec![
            ("d".to_string(), FileKind::Directory),
            ("x".to_string(), FileKind::File),
        ]
    );
}

#[tokio::test]
async fn a_link_is_not_made_over_anything_nor_on_a_read_only_mount() {
    let files: [(&str, &[u8]); 3] = [("f", b"1"), ("d/x", b"2"), ("l.rclonelink", b"f")];
    let (fake, fs) = fs_with(&files, config(), true).await;
    for name in ["f", "d", "l"] {
        assert!(
            matches!(
                fs.sb.symlink(ROOT_INO, name, b"t").await,
                Err(FsError::Exists)
            ),
            "{name}"
        );
    }
    assert_eq!(fake.object("l.rclonelink").as_deref(), Some(&b"f"[..]));
    assert!(fake.object("f.rclonelink").is_none());
    assert!(matches!(
        fs.sb.symlink(ROOT_INO, "long", &[b'a'; 4096]).await,
        Err(FsError::NameTooLong)
    ));
    let mut c = config();
    c.read_only = true;
    let (_, fs) = fs_with(&[], c, true).await;
    assert!(matches!(
        fs.sb.symlink(ROOT_INO, "l", b"t").await,
        Err(FsError::ReadOnly)
    ));
}

#[tokio::test]
async fn unlink_deletes_the_link_object_and_nothing_else() {
    let mut c = config();
    c.allow_delete = true;
    let files: [(&str, &[u8]); 2] = [("l.rclonelink", b"t"), ("t", b"data")];
    let (fake, fs) = fs_with(&files, c, false).await;
    fs.sb.unlink(ROOT_INO, "l").await.unwrap();
    assert!(fake.object("l.rclonelink").is_none());
    assert_eq!(fake.object("t").as_deref(), Some(&b"data"[..]));
    assert!(matches!(
        fs.sb.lookup(ROOT_INO, "l").await,
        Err(FsError::NotFound)
    ));
}

#[tokio::test]
async fn rename_moves_the_link_object_on_both_bucket_kinds() {
    let mut c = config();
    c.allow_overwrite = true;
    let files: [(&str, &[u8]); 2] = [("a.rclonelink", b"t"), ("f", b"data")];
    let (fake, fs) = fs_with(&files, c.clone(), true).await;
    fs.sb.lookup(ROOT_INO, "a").await.unwrap();
    fs.rename(ROOT_INO, "a", ROOT_INO, "b", false)
        .await
        .unwrap();
    assert!(fake.object("a.rclonelink").is_none());
    assert_eq!(fake.object("b.rclonelink").as_deref(), Some(&b"t"[..]));
    let b = fs.sb.lookup(ROOT_INO, "b").await.unwrap();
    assert_eq!(b.kind, FileKind::Symlink);
    assert_eq!(&fs.sb.readlink(b.ino).await.unwrap()[..], b"t");
    // A link does not replace a file (two different keys), nor a file a link.
    assert!(matches!(
        fs.rename(ROOT_INO, "b", ROOT_INO, "f", false).await,
        Err(FsError::CrossDevice(_))
    ));
    assert!(matches!(
        fs.rename(ROOT_INO, "f", ROOT_INO, "b", false).await,
        Err(FsError::CrossDevice(_))
    ));
    assert_eq!(fake.object("f").as_deref(), Some(&b"data"[..]));

    // General-purpose buckets: copy, then delete.
    let (fake, fs) = fs_with(&files, c, false).await;
    fs.rename(ROOT_INO, "a", ROOT_INO, "b", false)
        .await
        .unwrap();
    assert!(fake.object("a.rclonelink").is_none());
    assert_eq!(fake.object("b.rclonelink").as_deref(), Some(&b"t"[..]));
    let b = fs.sb.lookup(ROOT_INO, "b").await.unwrap();
    assert_eq!(b.kind, FileKind::Symlink);
}

#[tokio::test]
async fn a_link_cannot_be_opened() {
    let (_, fs) = fs_with(&[("l.rclonelink", b"t")], config(), true).await;
    let l = fs.sb.lookup(ROOT_INO, "l").await.unwrap();
    let mode = crate::fs::OpenMode {
        read: true,
        ..Default::default()
    };
    assert!(matches!(
        fs.open(l.ino, mode, 1).await,
        Err(FsError::SymlinkLoop)
    ));
}

#[tokio::test]
async fn a_create_sends_no_request_about_links() {
    let (fake, fs) = fs_with(&[], config(), true).await;
    let before = fake.counts();
    fs.create(ROOT_INO, "new.bin", 1).await.unwrap();
    let sent = fake.counts().since(&before);
    // The object and the prefix, as before links existed.
    assert_eq!(
        (sent.get(Op::Head), sent.get(Op::List), sent.total()),
        (1, 1, 2)
    );
}

/// A link whose own name is close to the 255-byte limit has an object name over it (`.rclonelink` adds 11
/// bytes): it still shows in listings, and is found by name.
#[tokio::test]
async fn a_link_with_a_long_name_shows_in_listings() {
    let long = "l".repeat(250);
    let key = format!("d/{long}.rclonelink");
    let files: [(&str, &[u8]); 2] = [("d/f", b"plain"), (key.as_str(), b"f")];
    for directory in [true, false] {
        let (_, fs) = fs_with(&files, config(), directory).await;
        let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap().ino;
        assert_eq!(
            entries(&fs, d).await,
            vec![
                ("f".to_string(), FileKind::File),
                (long.clone(), FileKind::Symlink),
            ]
        );
        let link = fs.sb.lookup(d, &long).await.unwrap();
        assert_eq!(link.kind, FileKind::Symlink);
        assert_eq!(&fs.sb.readlink(link.ino).await.unwrap()[..], b"f");
    }
}
