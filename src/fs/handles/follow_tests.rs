//! Handles follow a rename: of their file, of a directory above it, and not at all when replaced; an
//! unlinked file stays gone whatever its handles still write.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::open::Patience;
use crate::fs::test_support::{self, Landing, RO, RW, fs_with};
use crate::fs::{FsConfig, FsError, OpenMode, ROOT_INO, S3Filesystem};
use crate::s3::fake::{FakeClient, Op};
use crate::s3::{ObjectClient, WriteCondition};

/// Overwriting, and deleting (a rename may replace, an unlink delete).
fn overwriting(dir: &tempfile::TempDir) -> FsConfig {
    let mut c = test_support::overwriting(dir);
    c.allow_delete = true;
    c
}

#[tokio::test]
async fn a_staged_file_uploads_under_its_new_name_after_a_rename() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (fake, fs) = fs_with(&[("f", b"0123456789")], overwriting(&dir), directory).await;
        let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
        let h = fs.open(ino, RW, 1).await.unwrap();
        fs.write(h.fh, 2, b"ab").await.unwrap();
        // close(2) uploaded; the release has not come yet when the file moves.
        fs.flush(h.fh, 1).await.unwrap();
        fs.rename(ROOT_INO, "f", ROOT_INO, "g", false)
            .await
            .unwrap();
        // A descriptor opened again meanwhile shares the staged file, and writes on.
        let again = fs.open(ino, RW, 1).await.unwrap();
        fs.write(again.fh, 4, b"cd").await.unwrap();
        fs.flush(again.fh, 1).await.unwrap();
        fs.release(again.fh).await.unwrap();
        fs.release(h.fh).await.unwrap();
        assert_eq!(
            fake.object("g").unwrap(),
            &b"01abcd6789"[..],
            "directory bucket: {directory}"
        );
        assert!(
            fake.object("f").is_none(),
            "nothing under the old name (directory bucket: {directory})"
        );
    }
}

#[tokio::test]
async fn handles_below_a_renamed_directory_follow_it() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let objects: [(&str, &[u8]); 2] = [("d/staged", b"0123"), ("d/streamed", b"")];
        let (fake, fs) = fs_with(&objects, overwriting(&dir), directory).await;
        let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap().ino;
        let staged = fs.sb.lookup(d, "staged").await.unwrap().ino;
        let h = fs.open(staged, RW, 1).await.unwrap();
        fs.write(h.fh, 1, b"x").await.unwrap();
        fs.fsync(h.fh).await.unwrap();
        // A new file, streamed and uploaded by fsync, its descriptor still open.
        let (_, w) = fs.create(d, "new", 1).await.unwrap();
        fs.write(w, 0, b"first").await.unwrap();
        fs.fsync(w).await.unwrap();
        fs.rename(ROOT_INO, "d", ROOT_INO, "e", false)
            .await
            .unwrap();
        fs.write(h.fh, 3, b"y").await.unwrap();
        fs.write(w, 5, b" second").await.unwrap();
        fs.release(h.fh).await.unwrap();
        fs.release(w).await.unwrap();
        assert_eq!(
            fake.object("e/staged").unwrap(),
            &b"0x2y"[..],
            "directory bucket: {directory}"
        );
        assert_eq!(
            fake.object("e/new").unwrap(),
            &b"first second"[..],
            "directory bucket: {directory}"
        );
        for old in ["d/staged", "d/new"] {
            assert!(
                fake.object(old).is_none(),
                "{old} (directory bucket: {directory})"
            );
        }
    }
}

#[tokio::test]
async fn a_file_replaced_by_a_rename_uploads_nothing_more() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let objects: [(&str, &[u8]); 2] = [("src", b"moved in"), ("dst", b"old bytes")];
        let (fake, fs) = fs_with(&objects, overwriting(&dir), directory).await;
        let dst = fs.sb.lookup(ROOT_INO, "dst").await.unwrap().ino;
        fs.sb.lookup(ROOT_INO, "src").await.unwrap();
        let h = fs.open(dst, RW, 1).await.unwrap();
        fs.write(h.fh, 0, b"OLD").await.unwrap();
        fs.fsync(h.fh).await.unwrap();
        fs.rename(ROOT_INO, "src", ROOT_INO, "dst", false)
            .await
            .unwrap();
        // As on a local disk, the descriptor writes to a file without a name now.
        fs.write(h.fh, 0, b"late").await.unwrap();
        fs.flush(h.fh, 1).await.unwrap();
        fs.release(h.fh).await.unwrap();
        assert_eq!(
            fake.object("dst").unwrap(),
            &b"moved in"[..],
            "directory bucket: {directory}"
        );
        assert!(fake.object("src").is_none());
    }
}

#[tokio::test]
async fn truncate_by_name_reaches_the_bucket_while_a_handle_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, fs) = fs_with(&[("f", b"0123456789")], overwriting(&dir), true).await;
    let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
    let h = fs.open(ino, RW, 1).await.unwrap();
    fs.write(h.fh, 0, b"A").await.unwrap();
    fs.flush(h.fh, 1).await.unwrap();
    fs.setattr(ino, Some(4), None, Default::default())
        .await
        .unwrap();
    assert_eq!(
        fake.object("f").unwrap(),
        &b"A123"[..],
        "uploaded before any release"
    );
    // Nothing left to upload: a directory rename is not held up by the open handle.
    fs.rename(ROOT_INO, "f", ROOT_INO, "g", false)
        .await
        .unwrap();
    fs.release(h.fh).await.unwrap();
    assert_eq!(fake.object("g").unwrap(), &b"A123"[..]);
}

#[tokio::test]
async fn a_file_another_client_replaced_moves_but_its_handles_do_not_overwrite_it() {
    use crate::fs::FsError;
    use crate::s3::{ObjectClient, WriteCondition};
    // RENAME_NOREPLACE puts a condition on the destination too: a refused source pin must not read as EEXIST.
    for no_replace in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (fake, fs) = fs_with(&[("f", b"ours")], overwriting(&dir), false).await;
        let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
        let h = fs.open(ino, RW, 1).await.unwrap();
        fs.write(h.fh, 0, b"OURS").await.unwrap();
        fs.fsync(h.fh).await.unwrap();
        // Another client replaces the object behind the open handle.
        fake.put_object(
            "f",
            bytes::Bytes::from_static(b"theirs"),
            WriteCondition::None,
        )
        .await
        .unwrap();
        fs.rename(ROOT_INO, "f", ROOT_INO, "g", no_replace)
            .await
            .unwrap();
        assert_eq!(fake.object("g").unwrap(), &b"theirs"[..]);
        assert!(fake.object("f").is_none());
        // The handle still holds its own version: its next upload is refused, not a silent overwrite.
        fs.write(h.fh, 0, b"late").await.unwrap();
        let refused = fs.flush(h.fh, 1).await;
        assert!(
            matches!(refused, Err(FsError::ObjectChanged { .. })),
            "{refused:?}"
        );
        let _ = fs.release(h.fh).await;
        assert_eq!(
            fake.object("g").unwrap(),
            &b"theirs"[..],
            "no_replace: {no_replace}"
        );
    }
}

#[tokio::test]
async fn an_unlinked_file_is_not_brought_back_by_a_handle_still_open() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (fake, fs) = fs_with(&[], overwriting(&dir), directory).await;
        let (attr, w) = fs.create(ROOT_INO, "f", 1).await.unwrap();
        fs.write(w, 0, b"first").await.unwrap();
        // Uploaded and settled: the file is no longer busy, but the descriptor is still open.
        fs.fsync(w).await.unwrap();
        let staged = fs.open(attr.ino, RW, 1).await.unwrap();
        fs.unlink(ROOT_INO, "f").await.unwrap();
        assert!(fake.object("f").is_none());
        fs.write(staged.fh, 0, b"again").await.unwrap();
        fs.flush(staged.fh, 1).await.unwrap();
        fs.release(staged.fh).await.unwrap();
        fs.release(w).await.unwrap();
        assert!(fake.object("f").is_none(), "directory bucket: {directory}");
    }
}

/// A new file unlinked while open for writing keeps what its descriptor wrote, before the unlink and after
/// (Python's `TemporaryFile` creates, unlinks, then writes and reads back), and uploads nothing, not even an
/// empty object at its close: its bytes go on in a staged file that never uploads.
#[tokio::test]
async fn an_unlinked_new_file_reads_back_its_writes_and_uploads_nothing() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (fake, fs) = fs_with(&[], overwriting(&dir), directory).await;
        // Written before the unlink, read after it.
        let (w_attr, w) = fs.create(ROOT_INO, "w", 1).await.unwrap();
        let w_ino = w_attr.ino;
        fs.write(w, 0, b"secret").await.unwrap();
        fs.unlink(ROOT_INO, "w").await.unwrap();
        assert_eq!(&fs.read(w, 0, 100).await.unwrap()[..], b"secret");
        fs.write(w, 6, b" kept").await.unwrap();
        assert_eq!(&fs.read(w, 0, 100).await.unwrap()[..], b"secret kept");
        // Opened again by inode (/proc/self/fd/N), although no name stands for it any more.
        let again = fs.open(w_ino, RO, 1).await.unwrap();
        assert_eq!(
            &fs.read(again.fh, 0, 100).await.unwrap()[..],
            b"secret kept"
        );
        fs.release(again.fh).await.unwrap();
        // Unlinked at once, then read, written and read.
        let (_, t) = fs.create(ROOT_INO, "t", 1).await.unwrap();
        fs.unlink(ROOT_INO, "t").await.unwrap();
        assert!(fs.read(t, 0, 100).await.unwrap().is_empty());
        fs.write(t, 0, b"temporary").await.unwrap();
        assert_eq!(&fs.read(t, 0, 100).await.unwrap()[..], b"temporary");
        // Uploaded by an fsync, deleted by the unlink, written again.
        let (_, s) = fs.create(ROOT_INO, "s", 1).await.unwrap();
        fs.write(s, 0, b"before").await.unwrap();
        fs.fsync(s).await.unwrap();
        fs.unlink(ROOT_INO, "s").await.unwrap();
        fs.write(s, 6, b" after").await.unwrap();
        assert_eq!(&fs.read(s, 0, 100).await.unwrap()[..], b"before after");
        let before = fake.counts();
        for fh in [w, t, s] {
            fs.fsync(fh).await.unwrap();
            fs.flush(fh, 1).await.unwrap();
            fs.release(fh).await.unwrap();
        }
        assert_eq!(
            fake.counts().since(&before).total(),
            0,
            "directory bucket: {directory}"
        );
        for key in ["w", "t", "s"] {
            assert!(fake.object(key).is_none(), "{key} came back");
        }
    }
}

/// FUSE sends release after close(2) has returned, so a file opened again right after a close shares a
/// staged file with the handle not yet released. An O_TRUNC open is a change of its own: its close uploads
/// the emptied file. (It used to wait for the last release, the directory counted as being written until
/// then, and a rename of it failed EBUSY: the model test found it with releases delayed.)
#[tokio::test]
async fn a_truncating_open_of_a_file_not_yet_released_uploads_at_its_close() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (fake, fs) = fs_with(&[("d/", b"")], overwriting(&dir), directory).await;
        let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap().ino;
        let (attr, first) = fs.create(d, "f", 1).await.unwrap();
        fs.write(first, 0, b"ab").await.unwrap();
        fs.flush(first, 1).await.unwrap();
        let truncating = OpenMode {
            read: false,
            truncate: true,
            ..RW
        };
        let second = fs.open(attr.ino, truncating, 1).await.unwrap().fh;
        fs.flush(second, 1).await.unwrap();
        assert_eq!(
            fake.object("d/f").unwrap(),
            &b""[..],
            "closed, so in the bucket (directory bucket: {directory})"
        );
        fs.rename(ROOT_INO, "d", ROOT_INO, "e", false)
            .await
            .unwrap_or_else(|e| panic!("directory bucket {directory}: {e}"));
        fs.release(second).await.unwrap();
        fs.release(first).await.unwrap();
        assert_eq!(
            fake.object("e/f").unwrap(),
            &b""[..],
            "directory bucket: {directory}"
        );
        assert!(
            fake.object("d/f").is_none(),
            "directory bucket: {directory}"
        );
    }
}

/// A file made here and opened again before its first release (so staged, shared by the descriptors) exists
/// in the bucket once its descriptors are closed, though none wrote: a rename right then finds an object to
/// move, not a file still being written (EBUSY).
#[tokio::test]
async fn a_new_file_shared_by_descriptors_exists_once_they_are_closed() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (fake, fs) = fs_with(&[], overwriting(&dir), directory).await;
        let (attr, first) = fs.create(ROOT_INO, "f", 1).await.unwrap();
        let second = fs.open(attr.ino, RW, 1).await.unwrap().fh;
        let third = fs.open(attr.ino, RW, 1).await.unwrap().fh;
        assert!(fs.read(second, 0, 10).await.unwrap().is_empty());
        for fh in [first, second, third] {
            fs.flush(fh, 1).await.unwrap();
        }
        assert_eq!(
            fake.object("f").unwrap(),
            &b""[..],
            "closed, so in the bucket (directory bucket: {directory})"
        );
        fs.rename(ROOT_INO, "f", ROOT_INO, "g", false)
            .await
            .unwrap_or_else(|e| panic!("directory bucket {directory}: {e}"));
        for fh in [first, second, third] {
            fs.release(fh).await.unwrap();
        }
        assert_eq!(
            fake.object("g").unwrap(),
            &b""[..],
            "directory bucket: {directory}"
        );
        assert!(fake.object("f").is_none(), "directory bucket: {directory}");
    }
}

/// The kernel opens the inode its lookup found. Once the name stands for another file (a rename replaced it
/// here), or the bucket no longer has the object (another client deleted it), that open is stale: the kernel
/// then looks the name up again and opens what it is now, and a vanished object's name is asked about anew.
#[tokio::test]
async fn an_open_of_a_file_its_name_no_longer_stands_for_is_stale() {
    use crate::fs::FsError;
    use crate::s3::ObjectClient;

    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let objects: [(&str, &[u8]); 3] =
            [("src", b"moved in"), ("dst", b"old"), ("gone", b"soon")];
        let (fake, fs) = fs_with(&objects, overwriting(&dir), directory).await;
        let dst = fs.sb.lookup(ROOT_INO, "dst").await.unwrap().ino;
        fs.sb.lookup(ROOT_INO, "src").await.unwrap();
        fs.rename(ROOT_INO, "src", ROOT_INO, "dst", false)
            .await
            .unwrap();
        for mode in [RO, RW] {
            assert!(
                matches!(fs.open(dst, mode, 1).await, Err(FsError::Stale)),
                "directory bucket: {directory}"
            );
        }
        let moved = fs.sb.lookup(ROOT_INO, "dst").await.unwrap().ino;
        assert_ne!(moved, dst);
        let h = fs.open(moved, RO, 1).await.unwrap();
        assert_eq!(&fs.read(h.fh, 0, 100).await.unwrap()[..], b"moved in");
        fs.release(h.fh).await.unwrap();

        let gone = fs.sb.lookup(ROOT_INO, "gone").await.unwrap().ino;
        fake.delete_object("gone").await.unwrap();
        assert!(matches!(fs.open(gone, RW, 1).await, Err(FsError::Stale)));
        assert!(matches!(
            fs.sb.lookup(ROOT_INO, "gone").await,
            Err(FsError::NotFound)
        ));
    }
}

/// rename(2) right after the last close, its upload still under way: it waits for the upload to land and
/// moves what landed, not EBUSY. So does the rename of a directory above the file (Orbax renames its
/// temporary checkpoint directory once its files are closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_waits_for_a_released_writers_upload() {
    let file = (None, "f", "g", ("f", "g"));
    let its_directory = (Some("d"), "d", "e", ("d/f", "e/f"));
    for (under, from, to, (old_key, new_key)) in [file, its_directory] {
        for directory in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let landing = Landing::held(directory, overwriting(&dir), under, &[]).await;
            let fake = Arc::clone(&landing.fake);
            let rename = move |fs: Arc<S3Filesystem>| async move {
                fs.rename(ROOT_INO, from, ROOT_INO, to, false).await
            };
            landing.answer(rename).await.unwrap();
            assert_eq!(fake.object(new_key).unwrap(), &b"written"[..], "{new_key}");
            assert!(fake.object(old_key).is_none(), "{old_key}");
        }
    }
}

/// A rename onto a file whose last upload is still under way: it waits, so that upload cannot land after the
/// move and overwrite the file moved there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_onto_a_released_writers_file_waits_for_its_upload() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let seed: &[(&str, &[u8])] = &[("src", b"moved")];
        let landing = Landing::held(directory, overwriting(&dir), None, seed).await;
        let fake = Arc::clone(&landing.fake);
        landing.fs.sb.lookup(ROOT_INO, "src").await.unwrap();
        let rename = |fs: Arc<S3Filesystem>| async move {
            fs.rename(ROOT_INO, "src", ROOT_INO, "f", false).await
        };
        landing.answer(rename).await.unwrap();
        assert_eq!(fake.object("f").unwrap(), &b"moved"[..]);
        assert!(fake.object("src").is_none());
    }
}

/// unlink(2) right after the last close, its upload still under way: the object that upload makes must not
/// outlive the unlink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlink_waits_for_a_released_writers_upload() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let landing = Landing::held(directory, overwriting(&dir), None, &[]).await;
        let (fake, fs) = (Arc::clone(&landing.fake), Arc::clone(&landing.fs));
        let unlink = |fs: Arc<S3Filesystem>| async move { fs.unlink(ROOT_INO, "f").await };
        landing.answer(unlink).await.unwrap();
        assert!(fake.object("f").is_none(), "the unlinked file came back");
        assert!(matches!(
            fs.sb.lookup(ROOT_INO, "f").await,
            Err(FsError::NotFound)
        ));
    }
}

/// open(2) for reading right after the last close, its upload still under way: it waits for the upload and
/// reads what landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_waits_for_a_released_writers_upload() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let landing = Landing::held(directory, overwriting(&dir), None, &[]).await;
        let ino = landing.ino;
        let read = move |fs: Arc<S3Filesystem>| async move {
            let h = fs.open(ino, RO, 1).await?;
            let bytes = fs.read(h.fh, 0, 100).await;
            fs.release(h.fh).await?;
            bytes
        };
        assert_eq!(&landing.answer(read).await.unwrap()[..], b"written");
    }
}

/// O_TRUNC without `--allow-overwrite` on a file made here whose upload is still under way: once it lands
/// the file is an object like any other, and the open is refused as it would have been a moment later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overwrite_waits_for_the_upload_and_then_needs_the_flag() {
    for directory in [true, false] {
        let landing = Landing::held(directory, test_support::config(), None, &[]).await;
        let (fake, ino) = (Arc::clone(&landing.fake), landing.ino);
        let truncating = OpenMode {
            truncate: true,
            ..RW
        };
        let open = move |fs: Arc<S3Filesystem>| async move {
            fs.open(ino, truncating, 1).await.map(|o| o.fh)
        };
        let opened = landing.answer(open).await;
        assert!(matches!(opened, Err(FsError::NotPermitted(_))));
        assert_eq!(fake.object("f").unwrap(), &b"written"[..]);
    }
}

/// A call waits for a released writer's upload only as long as its patience lasts, then says the file is busy
/// rather than act on a version about to be replaced; the file is still there to act on once it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_released_writer_ends_in_ebusy_when_its_patience_runs_out() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let landing = Landing::held(directory, overwriting(&dir), None, &[]).await;
        let (fake, fs, ino) = (
            Arc::clone(&landing.fake),
            Arc::clone(&landing.fs),
            landing.ino,
        );
        let patience = Duration::from_millis(200);
        let started = Instant::now();
        let waited = fs
            .until_released_writer_lands(ino, Patience::for_at_most(patience))
            .await;
        assert!(matches!(waited, Err(FsError::Busy(_))), "{waited:?}");
        assert!(started.elapsed() >= patience);
        let wait = move |fs: Arc<S3Filesystem>| async move {
            fs.until_released_writer_lands(ino, Patience::new()).await
        };
        assert!(landing.answer(wait).await.unwrap(), "it waited");
        assert_eq!(fake.object("f").unwrap(), &b"written"[..]);
    }
}

/// An O_TRUNC open of a file made here, while its last upload is under way, when that upload then finds
/// that another client made the object meanwhile: the name is no longer ours, so the open says so (ESTALE:
/// the kernel looks the name up again) instead of writing over the other client's object without
/// `--allow-overwrite`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overwrite_after_a_lost_race_for_a_new_name_is_refused() {
    for directory in [true, false] {
        let theirs = |fake: Arc<FakeClient>| async move {
            let body = Bytes::from_static(b"theirs");
            fake.put_object("f", body, WriteCondition::None)
                .await
                .unwrap();
        };
        let landing =
            Landing::held_after(directory, test_support::config(), None, &[], theirs).await;
        let (fake, fs, ino) = (
            Arc::clone(&landing.fake),
            Arc::clone(&landing.fs),
            landing.ino,
        );
        let truncating = OpenMode {
            read: false,
            truncate: true,
            ..RW
        };
        let open = move |fs: Arc<S3Filesystem>| async move { fs.open(ino, truncating, 1).await };
        let (opened, released) = landing.answer_and_release(open).await;
        assert!(released.is_err(), "the upload lost the race");
        match opened {
            Err(FsError::Stale) => {}
            Err(e) => panic!("{e:?}"),
            Ok(opened) => {
                fs.write(opened.fh, 0, b"x").await.unwrap();
                let closed = fs.flush(opened.fh, 1).await;
                let _ = fs.release(opened.fh).await;
                panic!("opened, and its close said {closed:?}");
            }
        }
        assert_eq!(fake.object("f").unwrap(), &b"theirs"[..]);
    }
}

/// A rename onto a file whose writer is released while the rename uploads the moving file's own bytes: that
/// writer's last upload would land on what moved there, so the rename waits for it, then moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_onto_a_file_released_meanwhile_waits_for_its_upload() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = overwriting(&dir);
        c.write_part_size = 5 << 20;
        let (fake, fs) = fs_with(&[], c, directory).await;
        let fs = Arc::new(fs);
        let (_, moving) = fs.create(ROOT_INO, "f", 1).await.unwrap();
        fs.write(moving, 0, b"A").await.unwrap();
        let (_, replaced) = fs.create(ROOT_INO, "g", 1).await.unwrap();
        fs.write(replaced, 0, &vec![b'g'; 6 << 20]).await.unwrap();
        // The rename uploads f's byte first, as fsync would; held there.
        let put = fake.faults().hold(Op::Put);
        let rename = tokio::spawn({
            let fs = Arc::clone(&fs);
            async move { fs.rename(ROOT_INO, "f", ROOT_INO, "g", false).await }
        });
        while put.held() == 0 {
            tokio::task::yield_now().await;
        }
        // Meanwhile g's writer is released; its upload's completion held.
        let complete = fake.faults().hold(Op::CompleteUpload);
        let release = tokio::spawn({
            let fs = Arc::clone(&fs);
            async move { fs.release(replaced).await }
        });
        while complete.held() == 0 {
            tokio::task::yield_now().await;
        }
        put.open();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!rename.is_finished(), "moved before g's upload landed");
        complete.open();
        release.await.unwrap().unwrap();
        rename.await.unwrap().unwrap();
        fs.release(moving).await.unwrap();
        assert_eq!(
            fake.object("g").unwrap(),
            &b"A"[..],
            "directory bucket: {directory}"
        );
        assert!(fake.object("f").is_none());
    }
}

/// A file unlinked while open (a lock file, `TemporaryFile(dir=d)`) is no longer in its directory: the
/// directory moves although the file's descriptor still writes, and the file comes back under neither name.
#[tokio::test]
async fn a_directory_moves_while_a_file_unlinked_from_it_is_still_written() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (fake, fs) = fs_with(&[], overwriting(&dir), directory).await;
        let d = fs.sb.mkdir(ROOT_INO, "d").await.unwrap().ino;
        let (_, fh) = fs.create(d, "x", 1).await.unwrap();
        fs.write(fh, 0, b"scratch").await.unwrap();
        fs.unlink(d, "x").await.unwrap();
        fs.rename(ROOT_INO, "d", ROOT_INO, "e", false)
            .await
            .unwrap();
        fs.write(fh, 7, b" more").await.unwrap();
        fs.flush(fh, 1).await.unwrap();
        fs.release(fh).await.unwrap();
        assert!(fake.object("d/x").is_none() && fake.object("e/x").is_none());
        let e = fs.sb.lookup(ROOT_INO, "e").await.unwrap().ino;
        assert!(matches!(fs.sb.lookup(e, "x").await, Err(FsError::NotFound)));
    }
}
