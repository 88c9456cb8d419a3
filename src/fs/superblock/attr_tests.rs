//! `--preserve-metadata` through the core, with the fake client.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;

use crate::fs::attrs::StoredAttrs;
use crate::fs::test_support::{Landing, config, fs_with};
use crate::fs::{FsConfig, FsError, ROOT_INO, S3Filesystem};
use crate::s3::fake::Op;
use crate::s3::{ObjectClient, UserMetadata, WriteCondition};

fn preserving() -> FsConfig {
    FsConfig {
        preserve_metadata: true,
        ..config()
    }
}

fn s3fs_metadata() -> UserMetadata {
    [
        ("mode", "33216"),
        ("uid", "42"),
        ("gid", "43"),
        ("mtime", "1600000000"),
        ("atime", "1600000001.5"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

#[tokio::test]
async fn stat_shows_stored_attributes_only_with_the_flag() {
    for preserve in [true, false] {
        let cfg = if preserve { preserving() } else { config() };
        let (fake, fs) = fs_with(&[("plain", b"p")], cfg, true).await;
        fake.put_object_with_metadata(
            "kept",
            Bytes::from_static(b"k"),
            WriteCondition::None,
            &s3fs_metadata(),
        )
        .await
        .unwrap();
        let kept = fs.sb.lookup(ROOT_INO, "kept").await.unwrap();
        let plain = fs.sb.lookup(ROOT_INO, "plain").await.unwrap();
        if preserve {
            assert_eq!((kept.perm, kept.uid, kept.gid), (0o700, 42, 43));
            assert_eq!(kept.mtime, UNIX_EPOCH + Duration::from_secs(1_600_000_000));
            assert_eq!(
                kept.atime,
                UNIX_EPOCH + Duration::from_millis(1_600_000_001_500)
            );
        } else {
            assert_eq!((kept.perm, kept.uid, kept.gid), (0o644, 1000, 1000));
            assert_ne!(kept.mtime, UNIX_EPOCH + Duration::from_secs(1_600_000_000));
        }
        // An object without metadata shows the mount's defaults either way.
        assert_eq!((plain.perm, plain.uid, plain.gid), (0o644, 1000, 1000));
        assert!(!kept.provisional && !plain.provisional);
    }
}

/// A bucket holding `kept` with s3fs metadata, mounted with or without `--preserve-metadata`, entries
/// trusted for a minute.
async fn bucket_with_kept(
    preserve: bool,
    directory: bool,
) -> (
    std::sync::Arc<crate::s3::fake::FakeClient>,
    crate::fs::S3Filesystem,
) {
    let cfg = FsConfig {
        metadata_ttl: Duration::from_secs(60),
        ..if preserve { preserving() } else { config() }
    };
    let (fake, fs) = fs_with(&[], cfg, directory).await;
    fake.put_object_with_metadata(
        "kept",
        Bytes::from_static(b"k"),
        WriteCondition::None,
        &s3fs_metadata(),
    )
    .await
    .unwrap();
    (fake, fs)
}

#[tokio::test]
async fn listed_files_need_a_head_for_their_metadata_only_with_the_flag() {
    for preserve in [true, false] {
        let (fake, fs) = bucket_with_kept(preserve, false).await;
        let fh = fs.opendir(ROOT_INO).unwrap();
        let entries = fs.readdir(fh, 0).await.unwrap();
        let ino = entries.iter().find(|e| e.name == "kept").unwrap().ino;
        // The listing carried no metadata: with the flag the kernel must not keep these attributes.
        assert_eq!(fs.cached_attr(ino).unwrap().provisional, preserve);
        let heads = fake.count(Op::Head);
        let attr = fs.sb.getattr(ino).await.unwrap();
        assert_eq!(fake.count(Op::Head) - heads, u64::from(preserve));
        assert_eq!(attr.uid, if preserve { 42 } else { 1000 });
        assert!(!attr.provisional);
        // Known now: another stat (and a new listing of the same version) costs nothing.
        let fh = fs.opendir(ROOT_INO).unwrap();
        fs.readdir(fh, 0).await.unwrap();
        fs.sb.getattr(ino).await.unwrap();
        assert_eq!(fake.count(Op::Head) - heads, u64::from(preserve));
    }
}

fn change(mode: Option<u32>, uid: Option<u32>, mtime: Option<u64>) -> StoredAttrs {
    StoredAttrs {
        mode,
        uid,
        mtime: mtime.map(|s| UNIX_EPOCH + Duration::from_secs(s)),
        ..StoredAttrs::default()
    }
}

#[tokio::test]
async fn chmod_chown_and_utimens_replace_the_metadata_of_a_closed_file() {
    for directory in [true, false] {
        let (fake, fs) = fs_with(&[("f", b"data")], preserving(), directory).await;
        let f = fs.sb.lookup(ROOT_INO, "f").await.unwrap();
        let before = fake.head_object("f").await.unwrap();
        let counts = fake.counts();

        let attr = fs
            .setattr(f.ino, None, None, change(Some(0o100_755), None, None))
            .await
            .unwrap();
        assert_eq!(attr.perm, 0o755);
        // The date shown before is kept although the copy gave the object a new one.
        assert_eq!(attr.mtime, before.last_modified);
        let attr = fs
            .setattr(
                f.ino,
                None,
                None,
                change(None, Some(7), Some(1_500_000_000)),
            )
            .await
            .unwrap();
        assert_eq!((attr.perm, attr.uid, attr.gid), (0o755, 7, 1000));
        assert_eq!(attr.mtime, UNIX_EPOCH + Duration::from_secs(1_500_000_000));

        // Server-side only: a copy each, no bytes through the host; one HEAD, as the second change knows the
        // metadata the first one wrote.
        let used = fake.counts();
        assert_eq!(used.get(Op::Copy) - counts.get(Op::Copy), 2);
        assert_eq!(used.get(Op::Head) - counts.get(Op::Head), 1);
        for op in [Op::Get, Op::Put, Op::CreateUpload] {
            assert_eq!(used.get(op), counts.get(op), "{op:?}");
        }
        let stored = fake.head_object("f").await.unwrap();
        assert_eq!(fake.object("f").unwrap(), Bytes::from_static(b"data"));
        assert_eq!(stored.metadata["mode"], "33261");
        assert_eq!(stored.metadata["uid"], "7");
        assert_eq!(stored.metadata["mtime"], "1500000000");
        // The node carries the new version: the next open reads without a conflict.
        assert_eq!(
            fs.sb.node(f.ino).unwrap().stat().etag.as_deref(),
            Some(stored.etag.as_str())
        );
    }
}

#[tokio::test]
async fn attributes_are_accepted_and_not_kept_without_the_flag() {
    let (fake, fs) = fs_with(&[("f", b"data")], config(), true).await;
    let f = fs.sb.lookup(ROOT_INO, "f").await.unwrap();
    let attr = fs
        .setattr(f.ino, None, None, change(Some(0o100_700), Some(7), None))
        .await
        .unwrap();
    assert_eq!((attr.perm, attr.uid), (0o644, 1000));
    assert_eq!(fake.count(Op::Copy), 0);
    assert!(fake.head_object("f").await.unwrap().metadata.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_replaced_meanwhile_fails_the_change_and_keeps_the_new_object() {
    let (fake, fs) = fs_with(&[("f", b"data")], preserving(), true).await;
    let f = fs.sb.lookup(ROOT_INO, "f").await.unwrap();
    let fs = Arc::new(fs);
    let gate = fake.faults().hold(Op::Head);
    let task = {
        let fs = Arc::clone(&fs);
        tokio::spawn(async move {
            fs.setattr(f.ino, None, None, change(Some(0o100_600), None, None))
                .await
        })
    };
    while gate.held() == 0 {
        tokio::task::yield_now().await;
    }
    // Another client replaces the object after the HEAD read it.
    fake.put_object("f", Bytes::from_static(b"other"), WriteCondition::None)
        .await
        .unwrap();
    gate.open();
    assert!(matches!(
        task.await.unwrap(),
        Err(FsError::ObjectChanged { .. })
    ));
    assert_eq!(fake.object("f").unwrap(), Bytes::from_static(b"other"));
    assert!(fake.head_object("f").await.unwrap().metadata.is_empty());
}

#[tokio::test]
async fn new_files_carry_their_creator_and_the_attributes_set_while_open() {
    for preserve in [true, false] {
        let cfg = if preserve { preserving() } else { config() };
        let (fake, fs) = fs_with(&[], cfg, true).await;
        let owner = StoredAttrs {
            mode: Some(0o100_640),
            uid: Some(5),
            gid: Some(6),
            ..StoredAttrs::default()
        };
        let (attr, fh) = fs.create_as(ROOT_INO, "new", 0, owner).await.unwrap();
        fs.write(fh, 0, b"abc").await.unwrap();
        // utimens and chmod on the open file: no request now, they ride on the upload.
        let copies = fake.count(Op::Copy);
        let shown = fs
            .setattr(
                attr.ino,
                None,
                Some(fh),
                change(Some(0o600), None, Some(1_400_000_000)),
            )
            .await
            .unwrap();
        assert_eq!(fake.count(Op::Copy), copies);
        fs.flush(fh, 0).await.unwrap();
        fs.release(fh).await.unwrap();
        let stored = fake.head_object("new").await.unwrap().metadata;
        if preserve {
            assert_eq!((shown.perm, shown.uid), (0o600, 5));
            assert_eq!(stored["mode"], (0o100_600).to_string());
            assert_eq!((stored["uid"].as_str(), stored["gid"].as_str()), ("5", "6"));
            assert_eq!(stored["mtime"], "1400000000");
            assert_eq!(fake.count(Op::Copy), copies, "carried by the PutObject");
        } else {
            assert!(stored.is_empty(), "{stored:?}");
        }
    }
}

/// rsync's temporary file: written, closed, then utimens and chmod by name. The upload wrote the object's
/// whole metadata, so neither change needs a HEAD first; each is one metadata copy, and what they store
/// keeps the attributes the upload carried.
#[tokio::test]
async fn attributes_set_after_our_own_upload_need_no_head() {
    for directory in [true, false] {
        let (fake, fs) = fs_with(&[], preserving(), directory).await;
        let owner = StoredAttrs {
            mode: Some(0o100_600),
            uid: Some(5),
            gid: Some(6),
            ..StoredAttrs::default()
        };
        let (attr, fh) = fs.create_as(ROOT_INO, ".f.tmp", 0, owner).await.unwrap();
        fs.write(fh, 0, b"abc").await.unwrap();
        fs.flush(fh, 0).await.unwrap();
        fs.release(fh).await.unwrap();
        let counts = fake.counts();
        fs.setattr(
            attr.ino,
            None,
            None,
            change(None, None, Some(1_400_000_000)),
        )
        .await
        .unwrap();
        fs.setattr(attr.ino, None, None, change(Some(0o100_644), None, None))
            .await
            .unwrap();
        let used = fake.counts().since(&counts);
        assert_eq!((used.get(Op::Head), used.get(Op::Copy)), (0, 2));
        let stored = fake.head_object(".f.tmp").await.unwrap().metadata;
        assert_eq!(stored["mode"], (0o100_644).to_string());
        assert_eq!((stored["uid"].as_str(), stored["gid"].as_str()), ("5", "6"));
        assert_eq!(stored["mtime"], "1400000000");
    }
}

#[tokio::test]
async fn a_new_file_without_explicit_times_stores_its_upload_time() {
    let (fake, fs) = fs_with(&[], preserving(), false).await;
    let before = std::time::SystemTime::now() - Duration::from_secs(1);
    let (_, fh) = fs.create(ROOT_INO, "t", 0).await.unwrap();
    fs.write(fh, 0, b"x").await.unwrap();
    fs.release(fh).await.unwrap();
    let stored = StoredAttrs::from_metadata(&fake.head_object("t").await.unwrap().metadata);
    assert!(stored.mtime.unwrap() >= before, "{stored:?}");
}

/// A new file with nothing written is dated when it is made: stat shows, from the create on, exactly the
/// time its upload stores (it showed whole seconds while open, then the upload's own time).
#[tokio::test]
async fn a_new_empty_file_shows_the_time_it_stores() {
    let (fake, fs) = fs_with(&[], preserving(), true).await;
    let (attr, fh) = fs.create(ROOT_INO, "empty", 0).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    fs.flush(fh, 0).await.unwrap();
    fs.release(fh).await.unwrap();
    let stored = StoredAttrs::from_metadata(&fake.head_object("empty").await.unwrap().metadata);
    assert_eq!(stored.mtime, Some(attr.mtime));
    assert_eq!(fs.sb.getattr(attr.ino).await.unwrap().mtime, attr.mtime);
}

#[tokio::test]
async fn attributes_set_after_the_upload_left_follow_by_a_metadata_copy() {
    let (fake, fs) = fs_with(&[], preserving(), true).await;
    let (attr, fh) = fs.create(ROOT_INO, "f", 0).await.unwrap();
    fs.write(fh, 0, b"abc").await.unwrap();
    // fsync uploads; a later utimens on the same handle cannot ride on that upload any more.
    fs.flush(fh, 0).await.unwrap();
    let uploaded = fake.head_object("f").await.unwrap().etag;
    fs.setattr(
        attr.ino,
        None,
        Some(fh),
        change(None, None, Some(1_300_000_000)),
    )
    .await
    .unwrap();
    fs.release(fh).await.unwrap();
    let now = fake.head_object("f").await.unwrap();
    assert_eq!(now.metadata["mtime"], "1300000000");
    assert_ne!(now.etag, uploaded);
    assert_eq!(fake.object("f").unwrap(), Bytes::from_static(b"abc"));
    assert_eq!(fake.count(Op::Put), 1, "no second upload of the bytes");
}

#[tokio::test]
async fn a_lookup_after_a_listing_reads_the_metadata_only_with_the_flag() {
    for preserve in [true, false] {
        let (fake, fs) = bucket_with_kept(preserve, true).await;
        let fh = fs.opendir(ROOT_INO).unwrap();
        fs.readdir(fh, 0).await.unwrap();
        let heads = fake.count(Op::Head);
        let attr = fs.sb.lookup(ROOT_INO, "kept").await.unwrap();
        assert_eq!(fake.count(Op::Head) - heads, u64::from(preserve));
        assert_eq!(attr.perm, if preserve { 0o700 } else { 0o644 });
    }
}

/// The second of two changes uses what the first wrote; if another client replaced the object in between, the
/// conditional copy fails and the change is made on what is there now, never on the old version's metadata.
#[tokio::test]
async fn a_change_after_our_own_copy_follows_a_replacement_in_between() {
    for directory in [true, false] {
        let (fake, fs) = fs_with(&[("f", b"data")], preserving(), directory).await;
        let f = fs.sb.lookup(ROOT_INO, "f").await.unwrap();
        fs.setattr(f.ino, None, None, change(Some(0o100_700), None, None))
            .await
            .unwrap();
        let mut theirs = UserMetadata::new();
        theirs.insert("owner".into(), "them".into());
        fake.put_object_with_metadata(
            "f",
            Bytes::from_static(b"new bytes"),
            WriteCondition::None,
            &theirs,
        )
        .await
        .unwrap();
        let attr = fs
            .setattr(f.ino, None, None, change(None, Some(9), None))
            .await
            .unwrap();
        assert_eq!(attr.uid, 9);
        let stored = fake.head_object("f").await.unwrap();
        assert_eq!(fake.object("f").unwrap(), Bytes::from_static(b"new bytes"));
        assert_eq!(stored.metadata["owner"], "them", "their metadata kept");
        assert_eq!(stored.metadata["uid"], "9");
        assert!(
            !stored.metadata.contains_key("mode"),
            "our first change was to the old version"
        );
    }
}

/// chown by name while a released writer's last upload is under way (its release uploads, as after a
/// `touch -d` whose staged change waits for the release): no handle reaches the writer any more, so the
/// change waits for that upload to land and is then stored on what landed. CI once saw it accepted and lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_by_name_waits_for_a_released_writers_upload() {
    for directory in [true, false] {
        let landing = Landing::held(directory, preserving(), None, &[]).await;
        let (fake, fs, ino) = (
            Arc::clone(&landing.fake),
            Arc::clone(&landing.fs),
            landing.ino,
        );
        let owner = StoredAttrs {
            uid: Some(1234),
            gid: Some(5678),
            ..StoredAttrs::default()
        };
        let chown =
            move |fs: Arc<S3Filesystem>| async move { fs.setattr(ino, None, None, owner).await };
        let shown = landing.answer(chown).await.unwrap();
        assert_eq!((shown.uid, shown.gid), (1234, 5678));
        let stored = fake.head_object("f").await.unwrap().metadata;
        assert_eq!(
            (stored["uid"].as_str(), stored["gid"].as_str()),
            ("1234", "5678")
        );
        assert_eq!(fake.object("f").unwrap(), Bytes::from_static(b"written"));
        let now = fs.sb.getattr(ino).await.unwrap();
        assert_eq!((now.uid, now.gid, now.size), (1234, 5678, 7));
    }
}

/// The kernel is told to keep an object's attributes only for what is left of the mount's own trust in them;
/// a directory's (the mount's own) and a file being written (only here) for the whole TTL.
#[tokio::test]
async fn the_kernel_keeps_attributes_no_longer_than_the_mount_trusts_them() {
    let ttl = Duration::from_secs(60);
    let cfg = FsConfig {
        metadata_ttl: ttl,
        ..config()
    };
    let (_fake, fs) = fs_with(&[("d/a", b"a")], cfg, true).await;
    let dir = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
    let first = fs.sb.lookup(dir.ino, "a").await.unwrap();
    assert!(first.trusted_for <= ttl && first.trusted_for > ttl - Duration::from_secs(5));
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Answered from what the mount holds: what is left of the TTL.
    let again = fs.sb.lookup(dir.ino, "a").await.unwrap();
    assert!(again.trusted_for <= first.trusted_for - Duration::from_millis(50));
    assert!(fs.sb.getattr(again.ino).await.unwrap().trusted_for <= again.trusted_for);
    assert_eq!(fs.sb.getattr(dir.ino).await.unwrap().trusted_for, ttl);
    let (made, _fh) = fs.create(dir.ino, "new", 0).await.unwrap();
    assert_eq!(made.trusted_for, ttl);
}
