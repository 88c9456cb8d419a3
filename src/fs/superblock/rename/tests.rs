//! rename(2) of files and directories on both bucket kinds, with the fake client's request counts.

use crate::fs::test_support::{config, fs_with};
use crate::fs::{FileKind, FsConfig, FsError, ROOT_INO};
use crate::s3::ObjectClient;
use crate::s3::fake::{FakeClient, Op, transient};

/// (RenameObject, CopyObject, DeleteObject) requests sent so far.
fn moves(fake: &FakeClient) -> (u64, u64, u64) {
    let c = fake.counts();
    (c.get(Op::Rename), c.get(Op::Copy), c.get(Op::Delete))
}

fn overwriting() -> FsConfig {
    let mut c = config();
    c.allow_overwrite = true;
    c
}

#[tokio::test]
async fn file_rename_on_general_purpose_buckets_copies_then_deletes() {
    let (fake, fs) = fs_with(&[("a", b"one"), ("d/x", b"2")], config(), false).await;
    let a = fs.sb.lookup(ROOT_INO, "a").await.unwrap();
    let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
    fs.rename(ROOT_INO, "a", d.ino, "b", false).await.unwrap();
    assert_eq!(moves(&fake), (0, 1, 1));
    assert_eq!(&fake.object("d/b").unwrap()[..], b"one");
    assert!(fake.object("a").is_none());
    // The inode moved with its name.
    let b = fs.sb.lookup(d.ino, "b").await.unwrap();
    assert_eq!((b.ino, b.size), (a.ino, 3));
    assert!(matches!(
        fs.sb.lookup(ROOT_INO, "a").await,
        Err(FsError::NotFound)
    ));
}

#[tokio::test]
async fn replacing_a_file_by_rename_needs_allow_overwrite_on_both_kinds() {
    for directory in [true, false] {
        let (fake, fs) = fs_with(&[("a", b"new"), ("b", b"old")], config(), directory).await;
        assert!(matches!(
            fs.rename(ROOT_INO, "a", ROOT_INO, "b", false).await,
            Err(FsError::NotPermitted(_))
        ));
        assert_eq!(moves(&fake), (0, 0, 0), "refused before any request");
        assert_eq!(&fake.object("b").unwrap()[..], b"old");

        let (fake, fs) = fs_with(&[("a", b"new"), ("b", b"old")], overwriting(), directory).await;
        assert!(matches!(
            fs.rename(ROOT_INO, "a", ROOT_INO, "b", true).await,
            Err(FsError::Exists)
        ));
        fs.rename(ROOT_INO, "a", ROOT_INO, "b", false)
            .await
            .unwrap();
        assert_eq!(&fake.object("b").unwrap()[..], b"new");
        assert!(fake.object("a").is_none());
    }
}

#[tokio::test]
async fn directory_rename_moves_every_object_and_the_inodes_follow() {
    for directory in [true, false] {
        let keys: &[(&str, &[u8])] = &[("d/a", b"1"), ("d/s/b", b"22"), ("d/", b""), ("dx", b"x")];
        let (fake, fs) = fs_with(keys, config(), directory).await;
        let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
        let s = fs.sb.lookup(d.ino, "s").await.unwrap();
        fs.rename(ROOT_INO, "d", ROOT_INO, "e", false)
            .await
            .unwrap();
        // The marker `d/` is made anew and deleted, on both kinds (see `move_marker`).
        let expected = if directory { (2, 0, 1) } else { (0, 2, 3) };
        assert_eq!(moves(&fake), expected, "directory bucket: {directory}");
        assert_eq!(&fake.object("e/a").unwrap()[..], b"1");
        assert_eq!(&fake.object("e/s/b").unwrap()[..], b"22");
        assert!(fake.object("e/").is_some());
        assert!(fake.object("d/a").is_none() && fake.object("d/s/b").is_none());
        assert_eq!(&fake.object("dx").unwrap()[..], b"x", "a sibling stays");
        // The directory and the subdirectory already looked up keep their numbers and resolve under the
        // new name: the child never looked up is found through the renamed subdirectory.
        assert_eq!(fs.sb.lookup(ROOT_INO, "e").await.unwrap().ino, d.ino);
        let b = fs.sb.lookup(s.ino, "b").await.unwrap();
        assert_eq!((b.kind, b.size), (FileKind::File, 2));
        assert!(matches!(
            fs.sb.lookup(ROOT_INO, "d").await,
            Err(FsError::NotFound)
        ));
    }
}

#[tokio::test]
async fn directories_past_the_limit_are_refused_before_anything_moves() {
    for directory in [true, false] {
        let mut c = config();
        c.max_rename_objects = 2;
        let keys: &[(&str, &[u8])] = &[("d/a", b"1"), ("d/b", b"2"), ("d/c", b"3")];
        let (fake, fs) = fs_with(keys, c, directory).await;
        assert!(matches!(
            fs.rename(ROOT_INO, "d", ROOT_INO, "e", false).await,
            Err(FsError::CrossDevice(_))
        ));
        assert_eq!(moves(&fake), (0, 0, 0));
        assert!(fake.object("d/a").is_some() && fake.object("d/c").is_some());
        // At the limit it goes through.
        fake.delete_object("d/c").await.unwrap();
        fs.rename(ROOT_INO, "d", ROOT_INO, "e", false)
            .await
            .unwrap();
        assert!(fake.object("e/a").is_some() && fake.object("e/b").is_some());
    }
}

#[tokio::test]
async fn directory_rename_refuses_its_own_subtree_non_empty_targets_and_files() {
    let keys: &[(&str, &[u8])] = &[("d/s/a", b"1"), ("t/x", b"2"), ("f", b"3")];
    let (fake, fs) = fs_with(keys, overwriting(), false).await;
    let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
    let s = fs.sb.lookup(d.ino, "s").await.unwrap();
    assert!(matches!(
        fs.rename(ROOT_INO, "d", s.ino, "in", false).await,
        Err(FsError::InvalidArgument(_))
    ));
    assert!(matches!(
        fs.rename(ROOT_INO, "d", d.ino, "in", false).await,
        Err(FsError::InvalidArgument(_))
    ));
    assert!(matches!(
        fs.rename(ROOT_INO, "d", ROOT_INO, "t", false).await,
        Err(FsError::NotEmpty)
    ));
    assert!(matches!(
        fs.rename(ROOT_INO, "d", ROOT_INO, "f", false).await,
        Err(FsError::NotADirectory)
    ));
    assert_eq!(moves(&fake), (0, 0, 0));
    // An empty directory (made here) may be replaced.
    fs.sb.mkdir(ROOT_INO, "empty").await.unwrap();
    fs.rename(ROOT_INO, "d", ROOT_INO, "empty", false)
        .await
        .unwrap();
    assert_eq!(&fake.object("empty/s/a").unwrap()[..], b"1");
}

#[tokio::test]
async fn a_failure_midway_leaves_every_object_under_one_name_or_both() {
    for (directory, op) in [(true, Op::Rename), (false, Op::Copy), (false, Op::Delete)] {
        let keys: Vec<(String, Vec<u8>)> = (0..40)
            .map(|i| (format!("d/{i:02}"), vec![i as u8]))
            .collect();
        let borrowed: Vec<(&str, &[u8])> = keys
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let (fake, fs) = fs_with(&borrowed, config(), directory).await;
        // Let some moves through, then fail one.
        fake.faults().fail_after(op, 20, 1, transient());
        assert!(
            fs.rename(ROOT_INO, "d", ROOT_INO, "e", false)
                .await
                .is_err()
        );
        let mut moved = 0;
        for (k, v) in &keys {
            let new = format!("e/{}", &k[2..]);
            let (old, new) = (fake.object(k), fake.object(&new));
            assert!(old.is_some() || new.is_some(), "{k} lost ({op:?})");
            for bytes in [old.clone(), new.clone()].into_iter().flatten() {
                assert_eq!(&bytes[..], &v[..]);
            }
            moved += usize::from(old.is_none());
        }
        assert!(moved > 0 && moved < keys.len(), "{op:?}: {moved} moved");
    }
}

/// Directories with marker objects move: on a directory bucket the marker is made anew and deleted (its
/// RenameObject does not take keys ending in '/'); onto an empty marked directory, one marker is left.
#[tokio::test]
async fn marked_directories_move_on_both_bucket_kinds() {
    for directory in [true, false] {
        let keys: &[(&str, &[u8])] = &[("a/", b""), ("a/f", b"1"), ("b/", b""), ("t/", b"")];
        let (fake, fs) = fs_with(keys, config(), directory).await;
        fs.rename(ROOT_INO, "a", ROOT_INO, "moved", false)
            .await
            .unwrap();
        fs.rename(ROOT_INO, "b", ROOT_INO, "t", false)
            .await
            .unwrap();
        for (key, there) in [
            ("moved/", true),
            ("moved/f", true),
            ("t/", true),
            ("a/", false),
            ("a/f", false),
            ("b/", false),
        ] {
            assert_eq!(
                fake.object(key).is_some(),
                there,
                "{key} on directory={directory}"
            );
        }
    }
}

/// The source's marker leaves the list only after the count that says the listing stopped short: a
/// directory bigger than --max-rename-objects is refused whole, even onto a marked one.
#[tokio::test]
async fn a_marked_directory_past_the_rename_limit_moves_nothing() {
    let names: Vec<String> = (0..1100).map(|i| format!("src/{i:04}")).collect();
    let mut keys: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b"x"[..])).collect();
    keys.extend([("src/", &b""[..]), ("dst/", &b""[..])]);
    let mut c = config();
    c.max_rename_objects = 999;
    let (fake, fs) = fs_with(&keys, c, true).await;
    assert!(matches!(
        fs.rename(ROOT_INO, "src", ROOT_INO, "dst", false).await,
        Err(FsError::CrossDevice(_))
    ));
    assert!(fake.object("src/").is_some());
    assert!(fake.object("src/1099").is_some() && fake.object("dst/0000").is_none());
}

/// Everything moved but the old marker could not be deleted: the rename has happened all the same (the
/// table says so), and the marker left behind only brings back an empty directory under the old name.
#[tokio::test]
async fn a_marker_left_behind_does_not_undo_the_rename() {
    for directory in [true, false] {
        let keys: &[(&str, &[u8])] = &[("d/", b""), ("d/x", b"1"), ("t/", b"")];
        let (fake, fs) = fs_with(keys, config(), directory).await;
        let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
        fs.sb.lookup(d.ino, "x").await.unwrap();
        // The last delete is the marker's (on a general-purpose bucket `x` is copied, then deleted first).
        let skip = u64::from(!directory);
        fake.faults().fail_after(Op::Delete, skip, 1, transient());
        fs.rename(ROOT_INO, "d", ROOT_INO, "t", false)
            .await
            .unwrap();
        assert_eq!(fs.sb.lookup(ROOT_INO, "t").await.unwrap().ino, d.ino);
        assert!(fake.object("t/x").is_some() && fake.object("d/x").is_none());
        assert!(fake.object("d/").is_some(), "the marker left behind");
        assert!(matches!(
            fs.sb.lookup(d.ino, "y").await,
            Err(FsError::NotFound)
        ));
        assert_eq!(fs.sb.lookup(d.ino, "x").await.unwrap().size, 1);
    }
}
