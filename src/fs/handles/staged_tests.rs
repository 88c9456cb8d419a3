//! Staged files through the core's handle operations, with the fake client.

use crate::fs::attrs::StoredAttrs;
use crate::fs::test_support::{RO, RW, config, fs_with, overwriting};
use crate::fs::{FsError, OpenMode, ROOT_INO};
use crate::s3::fake::Op;
use crate::s3::{ObjectClient, WriteCondition};

#[tokio::test]
async fn a_second_open_of_a_streamed_file_shares_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, fs) = fs_with(&[], overwriting(&dir), true).await;
    let (attr, w) = fs.create(ROOT_INO, "f", 1).await.unwrap();
    assert_eq!(fs.write(w, 0, b"hello ").await.unwrap(), 6);
    let r = fs.open(attr.ino, RO, 1).await.unwrap();
    assert_eq!(&fs.read(r.fh, 0, 100).await.unwrap()[..], b"hello ");
    // Written after the second open: still seen through it.
    fs.write(w, 6, b"world").await.unwrap();
    assert_eq!(&fs.read(r.fh, 0, 100).await.unwrap()[..], b"hello world");
    assert_eq!(&fs.read(r.fh, 3, 4).await.unwrap()[..], b"lo w");
    // A second writer, too.
    let w2 = fs.open(attr.ino, RW, 1).await.unwrap();
    fs.write(w2.fh, 0, b"H").await.unwrap();
    assert_eq!(&fs.read(r.fh, 0, 100).await.unwrap()[..], b"Hello world");
    fs.release(r.fh).await.unwrap();
    fs.release(w2.fh).await.unwrap();
    assert!(fake.object("f").is_none(), "a handle is still open");
    assert_eq!(fake.count(Op::Put) + fake.count(Op::CompleteUpload), 0);
    fs.release(w).await.unwrap();
    assert_eq!(fake.object("f").unwrap(), &b"Hello world"[..]);
    assert_eq!(fs.sb.getattr(attr.ino).await.unwrap().size, 11);
}

#[tokio::test]
async fn an_existing_object_is_not_changed_without_allow_overwrite() {
    let (fake, fs) = fs_with(&[("f", b"old")], config(), true).await;
    let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
    for mode in [
        RW,
        OpenMode { read: false, ..RW },
        OpenMode { append: true, ..RW },
    ] {
        assert!(matches!(
            fs.open(ino, mode, 1).await,
            Err(FsError::NotPermitted(_))
        ));
    }
    assert!(matches!(
        fs.setattr(ino, Some(1), None, StoredAttrs::default()).await,
        Err(FsError::NotPermitted(_))
    ));
    assert_eq!(fake.object("f").unwrap(), &b"old"[..]);
    assert_eq!(fake.count(Op::Put), 1, "only the test's own put");
}

#[tokio::test]
async fn edits_upload_at_the_release_of_the_last_handle() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, fs) = fs_with(&[("f", b"0123456789")], overwriting(&dir), true).await;
    let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
    let a = fs.open(ino, RW, 1).await.unwrap();
    let b = fs.open(ino, RW, 1).await.unwrap();
    let before = fake.counts();
    fs.write(a.fh, 2, b"ab").await.unwrap();
    // Reads through either handle: the base overlaid with what was written.
    assert_eq!(&fs.read(b.fh, 0, 100).await.unwrap()[..], b"01ab456789");
    assert_eq!(fs.sb.getattr(ino).await.unwrap().size, 10);
    fs.release(a.fh).await.unwrap();
    assert_eq!(fake.object("f").unwrap(), &b"0123456789"[..]);
    assert_eq!(fake.counts().since(&before).get(Op::Put), 0);
    fs.write(b.fh, 10, b"XY").await.unwrap();
    assert_eq!(fs.sb.getattr(ino).await.unwrap().size, 12);
    fs.release(b.fh).await.unwrap();
    assert_eq!(fake.object("f").unwrap(), &b"01ab456789XY"[..]);
    assert_eq!(fake.counts().since(&before).get(Op::Put), 1);
    // Open, read only, close: nothing uploaded.
    let c = fs.open(ino, RW, 1).await.unwrap();
    fs.read(c.fh, 0, 4).await.unwrap();
    let quiet = fake.counts();
    fs.release(c.fh).await.unwrap();
    assert_eq!(fake.counts().since(&quiet).get(Op::Put), 0);
}

#[tokio::test]
async fn flush_of_a_handle_that_wrote_uploads_and_others_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, fs) = fs_with(&[("f", b"abc")], overwriting(&dir), true).await;
    let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
    let a = fs.open(ino, RW, 1).await.unwrap();
    let b = fs.open(ino, RW, 1).await.unwrap();
    fs.write(a.fh, 0, b"A").await.unwrap();
    fs.flush(b.fh, 1).await.unwrap();
    assert_eq!(fake.object("f").unwrap(), &b"abc"[..], "b wrote nothing");
    fs.flush(a.fh, 1).await.unwrap();
    assert_eq!(fake.object("f").unwrap(), &b"Abc"[..]);
    let puts = fake.count(Op::Put);
    fs.release(a.fh).await.unwrap();
    fs.release(b.fh).await.unwrap();
    assert_eq!(fake.count(Op::Put), puts, "nothing changed since the flush");
}

#[tokio::test]
async fn a_write_handle_reads_what_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, fs) = fs_with(&[], overwriting(&dir), true).await;
    let (_, w) = fs.create(ROOT_INO, "new", 1).await.unwrap();
    fs.write(w, 0, b"abcdef").await.unwrap();
    assert_eq!(&fs.read(w, 1, 3).await.unwrap()[..], b"bcd");
    // A seek back after the read.
    fs.write(w, 0, b"Z").await.unwrap();
    assert_eq!(&fs.read(w, 0, 100).await.unwrap()[..], b"Zbcdef");
    fs.release(w).await.unwrap();
    assert_eq!(fake.object("new").unwrap(), &b"Zbcdef"[..]);
}

#[tokio::test]
async fn truncate_of_a_closed_file_uploads_once() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, fs) = fs_with(&[("f", b"0123456789")], overwriting(&dir), true).await;
    let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
    let before = fake.counts();
    let attr = fs
        .setattr(ino, Some(4), None, StoredAttrs::default())
        .await
        .unwrap();
    assert_eq!(attr.size, 4);
    assert_eq!(fake.object("f").unwrap(), &b"0123"[..]);
    assert_eq!(fake.counts().since(&before).get(Op::Put), 1);
    // Growing reads zeros, not the old bytes.
    let attr = fs
        .setattr(ino, Some(8), None, StoredAttrs::default())
        .await
        .unwrap();
    assert_eq!(attr.size, 8);
    assert_eq!(fake.object("f").unwrap(), &b"0123\0\0\0\0"[..]);
    assert_eq!(fake.counts().since(&before).get(Op::Put), 2);
    // The same size again: nothing sent.
    let same = fake.counts();
    fs.setattr(ino, Some(8), None, StoredAttrs::default())
        .await
        .unwrap();
    assert_eq!(fake.counts().since(&same).get(Op::Put), 0);
}

#[tokio::test]
async fn ftruncate_and_fallocate_through_a_handle() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, fs) = fs_with(&[("f", b"0123456789")], overwriting(&dir), true).await;
    let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
    let a = fs.open(ino, RW, 1).await.unwrap();
    fs.setattr(ino, Some(6), Some(a.fh), StoredAttrs::default())
        .await
        .unwrap();
    fs.fallocate(
        a.fh,
        1,
        2,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    )
    .await
    .unwrap();
    assert_eq!(&fs.read(a.fh, 0, 100).await.unwrap()[..], b"0\x00\x00345");
    assert!(fake.object("f").unwrap().len() == 10, "not uploaded yet");
    fs.release(a.fh).await.unwrap();
    assert_eq!(fake.object("f").unwrap(), &b"0\x00\x00345"[..]);
}

#[tokio::test]
async fn a_conflicting_release_fails_and_keeps_the_copy() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, fs) = fs_with(&[("f", b"old")], overwriting(&dir), true).await;
    let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
    let a = fs.open(ino, RW, 1).await.unwrap();
    fs.write(a.fh, 0, b"ours").await.unwrap();
    {
        use crate::s3::{ObjectClient, WriteCondition};
        fake.put_object(
            "f",
            bytes::Bytes::from_static(b"theirs"),
            WriteCondition::None,
        )
        .await
        .unwrap();
    }
    assert!(matches!(
        fs.release(a.fh).await,
        Err(FsError::ObjectChanged { .. })
    ));
    assert_eq!(fake.object("f").unwrap(), &b"theirs"[..]);
    let kept: Vec<_> = std::fs::read_dir(dir.path().join("expressfs-kept"))
        .unwrap()
        .collect();
    assert_eq!(kept.len(), 1);
    let copy = std::fs::read(kept[0].as_ref().unwrap().path()).unwrap();
    assert_eq!(&copy[..4], b"ours");
    // A new open sees the other writer's object.
    let b = fs.open(ino, RW, 1).await.unwrap();
    assert_eq!(&fs.read(b.fh, 0, 100).await.unwrap()[..], b"theirs");
    fs.release(b.fh).await.unwrap();
}

#[tokio::test]
async fn an_ftruncate_is_uploaded_by_the_close_of_its_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, fs) = fs_with(&[("f", b"0123456789")], overwriting(&dir), true).await;
    let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
    let a = fs.open(ino, RW, 1).await.unwrap();
    fs.setattr(ino, Some(4), Some(a.fh), StoredAttrs::default())
        .await
        .unwrap();
    fs.flush(a.fh, 1).await.unwrap();
    assert_eq!(
        fake.object("f").unwrap(),
        &b"0123"[..],
        "closed, so uploaded"
    );
    fs.release(a.fh).await.unwrap();
    assert_eq!(fake.object("f").unwrap(), &b"0123"[..]);
}

/// `fopen(path, "w+")`: streamed, then read back, which stages the file. What the descriptor streamed is its
/// own change: its close uploads it.
#[tokio::test]
async fn bytes_streamed_before_staging_are_uploaded_by_the_close() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, fs) = fs_with(&[("f", b"old bytes")], overwriting(&dir), true).await;
    let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
    let w_plus = crate::fs::OpenMode {
        truncate: true,
        ..RW
    };
    let h = fs.open(ino, w_plus, 1).await.unwrap();
    fs.write(h.fh, 0, b"abc").await.unwrap();
    assert_eq!(&fs.read(h.fh, 0, 10).await.unwrap()[..], b"abc");
    fs.flush(h.fh, 1).await.unwrap();
    assert_eq!(
        fake.object("f").unwrap(),
        &b"abc"[..],
        "closed, so uploaded"
    );
    fs.release(h.fh).await.unwrap();
    assert_eq!(fake.object("f").unwrap(), &b"abc"[..]);
}

/// An open refused for want of a writer slot changes nothing: its O_TRUNC does not empty the staged file the
/// other descriptors share (which their close would then upload), and a refused first open of an object
/// leaves no staged file behind counted as written.
#[tokio::test]
async fn an_open_refused_a_writer_slot_changes_nothing() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = overwriting(&dir);
        c.max_writers = 1;
        let (fake, fs) = fs_with(&[("f", b"hello"), ("g", b"world")], c, directory).await;
        let f = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
        let g = fs.sb.lookup(ROOT_INO, "g").await.unwrap().ino;
        let h = fs.open(f, RW, 1).await.unwrap();
        let truncating = OpenMode {
            truncate: true,
            ..RW
        };
        let refused = fs.open(f, truncating, 1).await;
        assert!(matches!(refused, Err(FsError::TooManyWriters(1))));
        assert_eq!(&fs.read(h.fh, 0, 100).await.unwrap()[..], b"hello");
        let refused = fs.open(g, RW, 1).await;
        assert!(matches!(refused, Err(FsError::TooManyWriters(1))));
        fs.release(h.fh).await.unwrap();
        assert_eq!(fake.object("f").unwrap(), &b"hello"[..]);
        for ino in [f, g] {
            assert!(!fs.sb.node(ino).unwrap().is_being_written(), "{ino}");
            assert!(fs.handles.staged.peek(ino).is_none(), "{ino} still staged");
        }
        // The slot is free again, and the next writer of g edits what the bucket holds.
        let h = fs.open(g, RW, 1).await.unwrap();
        fs.write(h.fh, 0, b"W").await.unwrap();
        fs.flush(h.fh, 1).await.unwrap();
        fs.release(h.fh).await.unwrap();
        assert_eq!(fake.object("g").unwrap(), &b"World"[..]);
    }
}

/// A read handle opened before another descriptor edited the file reads the edit while it is staged, and
/// still reads it once the edit is uploaded: it follows the version the edit made, not back to the one it
/// opened (whose bytes it may still hold, or which the bucket no longer has).
#[tokio::test]
async fn a_reader_that_saw_an_edit_keeps_seeing_it_after_the_upload() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let old = vec![b'a'; 3 << 20];
        let (fake, fs) = fs_with(&[("f", &old)], overwriting(&dir), directory).await;
        let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
        let r = fs.open(ino, RO, 1).await.unwrap();
        assert_eq!(&fs.read(r.fh, 0, 4).await.unwrap()[..], b"aaaa");
        let w = fs.open(ino, RW, 1).await.unwrap();
        fs.write(w.fh, 0, b"bbbb").await.unwrap();
        assert_eq!(&fs.read(r.fh, 0, 4).await.unwrap()[..], b"bbbb");
        fs.flush(w.fh, 1).await.unwrap();
        fs.release(w.fh).await.unwrap();
        assert_eq!(&fake.object("f").unwrap()[..4], b"bbbb");
        assert_eq!(&fs.read(r.fh, 0, 4).await.unwrap()[..], b"bbbb");
        let tail = fs.read(r.fh, (3 << 20) - 4, 4).await.unwrap();
        assert_eq!(&tail[..], b"aaaa", "directory bucket: {directory}");
        fs.release(r.fh).await.unwrap();
    }
}

/// A staged file whose close failed because another client replaced the object keeps its error for its own
/// descriptor; an open for reading before that descriptor's release reads what the bucket holds, not the
/// failed file's error.
#[tokio::test]
async fn a_reader_opened_after_a_failed_close_reads_the_bucket() {
    for directory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = overwriting(&dir);
        c.metadata_ttl = std::time::Duration::ZERO;
        let (fake, fs) = fs_with(&[("f", b"old bytes")], c, directory).await;
        let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
        let h = fs.open(ino, RW, 1).await.unwrap();
        fs.write(h.fh, 0, b"OUR").await.unwrap();
        fake.put_object(
            "f",
            bytes::Bytes::from_static(b"theirs"),
            WriteCondition::None,
        )
        .await
        .unwrap();
        assert!(fs.flush(h.fh, 1).await.is_err(), "the close failed");
        let r = fs.open(ino, RO, 1).await.unwrap();
        assert_eq!(&fs.read(r.fh, 0, 100).await.unwrap()[..], b"theirs");
        assert!(fs.read(h.fh, 0, 100).await.is_err(), "its own error");
        assert!(fs.release(h.fh).await.is_err());
        assert_eq!(&fs.read(r.fh, 0, 100).await.unwrap()[..], b"theirs");
        fs.release(r.fh).await.unwrap();
        assert_eq!(fake.object("f").unwrap(), &b"theirs"[..]);
    }
}
