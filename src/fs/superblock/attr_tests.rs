//! `--preserve-metadata` through the core, with the fake client.

use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;

use crate::fs::test_support::{config, fs_with};
use crate::fs::{FsConfig, ROOT_INO};
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
        let kept = fs.lookup(ROOT_INO, "kept").await.unwrap();
        let plain = fs.lookup(ROOT_INO, "plain").await.unwrap();
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

#[tokio::test]
async fn listed_files_need_a_head_for_their_metadata_only_with_the_flag() {
    for preserve in [true, false] {
        let cfg = FsConfig {
            metadata_ttl: Duration::from_secs(60),
            ..if preserve { preserving() } else { config() }
        };
        let (fake, fs) = fs_with(&[], cfg, false).await;
        fake.put_object_with_metadata(
            "kept",
            Bytes::from_static(b"k"),
            WriteCondition::None,
            &s3fs_metadata(),
        )
        .await
        .unwrap();
        let fh = fs.opendir(ROOT_INO).unwrap();
        let entries = fs.readdir(fh, 0).await.unwrap();
        let ino = entries.iter().find(|e| e.name == "kept").unwrap().ino;
        // The listing carried no metadata: with the flag the kernel must not keep these attributes.
        assert_eq!(fs.cached_attr(ino).unwrap().provisional, preserve);
        let heads = fake.count(Op::Head);
        let attr = fs.getattr(ino).await.unwrap();
        assert_eq!(fake.count(Op::Head) - heads, u64::from(preserve));
        assert_eq!(attr.uid, if preserve { 42 } else { 1000 });
        assert!(!attr.provisional);
        // Known now: another stat (and a new listing of the same version) costs nothing.
        let fh = fs.opendir(ROOT_INO).unwrap();
        fs.readdir(fh, 0).await.unwrap();
        fs.getattr(ino).await.unwrap();
        assert_eq!(fake.count(Op::Head) - heads, u64::from(preserve));
    }
}
