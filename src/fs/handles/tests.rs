//! Open, read, write and release through the core, with the fake client.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{WriterMark, WriterSlots};
use crate::fs::inode::{InodeTable, Kind, Stat};
use crate::fs::test_support::{RO, config, fs_with};
use crate::fs::{FsError, KernelNotice, OpenMode, ROOT_INO};
use crate::s3::fake::Op;
use crate::s3::{ObjectClient, WriteCondition};

#[tokio::test]
async fn open_and_read_after_a_lookup_need_no_request() {
    let (fake, fs) = fs_with(&[("img.jpg", &[7u8; 5000])], config(), true).await;
    // As in a directory bigger than one page: the lookup asks for the name, with its first bytes.
    fs.sb.as_if_bigger_than_a_page(ROOT_INO);
    let attr = fs.sb.lookup(ROOT_INO, "img.jpg").await.unwrap();
    let read_mode = OpenMode {
        read: true,
        ..Default::default()
    };
    let before = fake.counts();
    let opened = fs.open(attr.ino, read_mode, 1).await.unwrap();
    assert!(!opened.keep_cache, "nothing cached yet");
    assert_eq!(
        &fs.read(opened.fh, 0, 8192).await.unwrap()[..],
        &[7u8; 5000][..]
    );
    assert_eq!(fake.counts(), before);
    // The bytes were handed over once: a second open reads from the bucket.
    let opened = fs.open(attr.ino, read_mode, 1).await.unwrap();
    assert!(opened.keep_cache, "same version: the page cache is kept");
    assert_eq!(
        &fs.read(opened.fh, 0, 8192).await.unwrap()[..],
        &[7u8; 5000][..]
    );
    assert!(fake.counts().since(&before).get(Op::Get) > 0);
}

#[tokio::test]
async fn writes_bypass_the_page_cache_where_the_kernel_can_still_mmap() {
    let mut c = config();
    c.allow_overwrite = true;
    let (_, fs) = fs_with(&[("old", b"v")], c, true).await;
    let trunc = OpenMode {
        write: true,
        truncate: true,
        ..Default::default()
    };
    let old = fs.sb.lookup(ROOT_INO, "old").await.unwrap().ino;
    let opened = fs.open(old, trunc, 1).await.unwrap();
    assert!(opened.bypass_page_cache && !opened.keep_cache);
    fs.release(opened.fh).await.unwrap();
    assert!(fs.writes_bypass_page_cache());
    fs.keep_big_files_in_page_cache();
    assert!(!fs.writes_bypass_page_cache());
    let opened = fs.open(old, trunc, 1).await.unwrap();
    assert!(!opened.bypass_page_cache);
}

#[tokio::test]
async fn big_files_bypass_the_page_cache() {
    let mut config = config();
    config.direct_io_threshold = 4096;
    let (_, fs) = fs_with(
        &[("small", &[1u8; 100]), ("big", &[2u8; 4096])],
        config,
        true,
    )
    .await;
    let read_mode = OpenMode {
        read: true,
        ..Default::default()
    };
    for (name, bypass) in [("small", false), ("big", true)] {
        let attr = fs.sb.lookup(ROOT_INO, name).await.unwrap();
        let first = fs.open(attr.ino, read_mode, 1).await.unwrap();
        let again = fs.open(attr.ino, read_mode, 1).await.unwrap();
        assert_eq!(first.bypass_page_cache, bypass, "{name}");
        // Nothing of a bypassed file is in the page cache to keep.
        assert_eq!(again.keep_cache, !bypass, "{name}");
    }
    // A kernel that cannot mmap direct-I/O files: big files use the page cache, O_DIRECT still not.
    fs.keep_big_files_in_page_cache();
    let big = fs.sb.lookup(ROOT_INO, "big").await.unwrap().ino;
    assert!(!fs.open(big, read_mode, 1).await.unwrap().bypass_page_cache);
    let direct = OpenMode {
        direct: true,
        ..read_mode
    };
    assert!(fs.open(big, direct, 1).await.unwrap().bypass_page_cache);
}

/// The page cache is one per inode: while a handle on an older version is open (and may be adding its bytes
/// to it), a handle on the new version reads around it, so neither ever reads the other's pages.
#[tokio::test]
async fn a_handle_on_an_older_version_stops_the_page_cache_from_being_kept() {
    let mut config = config();
    config.metadata_ttl = Duration::ZERO;
    let (fake, fs) = fs_with(&[("f", b"one")], config, true).await;
    let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
    let read_mode = OpenMode {
        read: true,
        ..Default::default()
    };
    let old = fs.open(ino, read_mode, 1).await.unwrap();
    fake.put_object("f", Bytes::from_static(b"two"), WriteCondition::None)
        .await
        .unwrap();
    let new = fs.open(ino, read_mode, 1).await.unwrap();
    assert!(!new.keep_cache, "another version");
    assert!(new.bypass_page_cache, "the old version is open");
    assert!(!old.bypass_page_cache);
    // Same version, but the handle on the old one may still be filling the page cache.
    let same = fs.open(ino, read_mode, 1).await.unwrap();
    assert!(!same.keep_cache && same.bypass_page_cache);
    fs.release(old.fh).await.unwrap();
    let after = fs.open(ino, read_mode, 1).await.unwrap();
    assert!(
        !after.keep_cache && !after.bypass_page_cache,
        "what the old handle read may still be cached"
    );
    assert!(fs.open(ino, read_mode, 1).await.unwrap().keep_cache);
    assert_eq!(&fs.read(new.fh, 0, 10).await.unwrap()[..], b"two");
}

#[tokio::test]
async fn create_write_close_then_read_back() {
    let (fake, fs) = fs_with(&[], config(), true).await;
    let (attr, fh) = fs.create(ROOT_INO, "new.bin", 0).await.unwrap();
    fs.write(fh, 0, b"hello ").await.unwrap();
    fs.write(fh, 6, b"world").await.unwrap();
    assert_eq!(fs.sb.getattr(attr.ino).await.unwrap().size, 11);
    fs.flush(fh, 0).await.unwrap();
    fs.release(fh).await.unwrap();
    assert_eq!(&fake.object("new.bin").unwrap()[..], b"hello world");
    let rh = fs
        .open(
            attr.ino,
            OpenMode {
                read: true,
                ..Default::default()
            },
            0,
        )
        .await
        .unwrap()
        .fh;
    assert_eq!(&fs.read(rh, 0, 100).await.unwrap()[..], b"hello world");
}

#[tokio::test]
async fn overwrite_and_delete_need_their_flags() {
    let (_, fs) = fs_with(&[("k", b"v")], config(), true).await;
    assert!(matches!(
        fs.create(ROOT_INO, "k", 0).await,
        Err(FsError::Exists)
    ));
    let a = fs.sb.lookup(ROOT_INO, "k").await.unwrap();
    let trunc = OpenMode {
        write: true,
        truncate: true,
        ..Default::default()
    };
    assert!(matches!(
        fs.open(a.ino, trunc, 0).await,
        Err(FsError::NotPermitted(_))
    ));
    assert!(matches!(
        fs.sb.unlink(ROOT_INO, "k").await,
        Err(FsError::NotPermitted(_))
    ));

    let mut c = config();
    c.allow_overwrite = true;
    c.allow_delete = true;
    let (fake, fs) = fs_with(&[("k", b"v")], c, true).await;
    let a = fs.sb.lookup(ROOT_INO, "k").await.unwrap();
    let fh = fs.open(a.ino, trunc, 0).await.unwrap().fh;
    fs.write(fh, 0, b"new").await.unwrap();
    fs.release(fh).await.unwrap();
    assert_eq!(&fake.object("k").unwrap()[..], b"new");
    fs.sb.unlink(ROOT_INO, "k").await.unwrap();
    assert!(fake.object("k").is_none());
}

#[test]
fn a_write_handle_counts_once_among_its_nodes_writers() {
    let mut t = InodeTable::new("");
    let far = Instant::now() + Duration::from_secs(60);
    let ino = t.upsert(
        ROOT_INO,
        "f",
        Kind::File,
        Stat::directory(),
        far,
        Instant::now(),
    );
    let n = t.get_mut(ino).unwrap();
    let a = WriterMark::start(Some(&mut *n));
    let b = WriterMark::start(Some(&mut *n));
    a.wrote(n);
    a.settled(n);
    a.settled(n);
    assert!(
        n.is_being_written(),
        "b still counts; a took away only its own"
    );
    b.settled(n);
    assert!(!n.is_being_written());
    a.wrote(n);
    assert!(n.is_being_written(), "written again after its upload");
}

#[test]
fn writer_slots_stop_at_the_limit_until_one_is_given_back() {
    let slots = WriterSlots::new(2);
    slots.reserve().unwrap();
    slots.reserve().unwrap();
    assert!(matches!(slots.reserve(), Err(FsError::TooManyWriters(2))));
    assert_eq!(slots.open(), 2, "a refused reservation holds nothing");
    slots.give_back();
    slots.reserve().unwrap();
    assert_eq!(slots.open(), 2);
}

/// Lock files are deleted while held (tensorstore): the name goes at once, the open handles keep working and
/// upload nothing, so no object is left behind or brought back.
#[tokio::test]
async fn unlink_of_an_open_file_removes_the_name_and_uploads_nothing_more() {
    let mut c = config();
    c.allow_overwrite = true;
    c.allow_delete = true;
    let (fake, fs) = fs_with(&[("old.bin", b"0123456789")], c, true).await;
    // A new file, never uploaded: no request at all.
    let (_, fh) = fs.create(ROOT_INO, "x.__lock", 0).await.unwrap();
    fs.write(fh, 0, b"held").await.unwrap();
    let before = fake.counts();
    fs.unlink(ROOT_INO, "x.__lock").await.unwrap();
    assert_eq!(fake.counts().since(&before).total(), 0);
    assert!(matches!(
        fs.sb.lookup(ROOT_INO, "x.__lock").await,
        Err(FsError::NotFound)
    ));
    fs.write(fh, 4, b" still").await.unwrap();
    fs.release(fh).await.unwrap();
    assert!(fake.object("x.__lock").is_none());
    // An object being edited: deleted, and its staged edits are not uploaded at close.
    let ino = fs.sb.lookup(ROOT_INO, "old.bin").await.unwrap().ino;
    let rw = OpenMode {
        read: true,
        write: true,
        ..Default::default()
    };
    let opened = fs.open(ino, rw, 1).await.unwrap();
    fs.write(opened.fh, 2, b"XY").await.unwrap();
    assert_eq!(
        &fs.read(opened.fh, 0, 100).await.unwrap()[..],
        b"01XY456789"
    );
    fs.unlink(ROOT_INO, "old.bin").await.unwrap();
    assert!(fake.object("old.bin").is_none());
    // What was read or written before the unlink is local: it still reads.
    assert_eq!(
        &fs.read(opened.fh, 0, 100).await.unwrap()[..],
        b"01XY456789"
    );
    fs.release(opened.fh).await.unwrap();
    assert!(fake.object("old.bin").is_none(), "brought back at close");
}

/// `expressfs warm`'s request: kept in bounded steps through the caches, refused where nothing can keep it.
#[tokio::test(flavor = "multi_thread")]
async fn keep_in_cache_fills_the_cache_and_is_refused_where_nothing_keeps_bytes() {
    use crate::cache::{BlockCache, disk::DiskCache};
    use crate::source::{BucketSource, Cached, ReadSources};
    use std::sync::Arc;
    let data = vec![3u8; 300_000];
    let (fake, fs) = fs_with(&[("f", &data)], config(), true).await;
    let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
    let ro = OpenMode {
        read: true,
        ..Default::default()
    };
    // No cache at all: refused, nothing fetched, whatever the file.
    let opened = fs.open(ino, ro, 1).await.unwrap();
    let before = fake.counts();
    assert!(matches!(
        fs.keep_in_cache(opened.fh, 0).await,
        Err(FsError::OperationNotSupported(_))
    ));
    assert_eq!(fake.counts(), before);
    fs.release(opened.fh).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let disk = Arc::new(DiskCache::open_with(dir.path(), 1 << 30, false).unwrap());
    let client: Arc<dyn ObjectClient> = fake.clone();
    let bucket = BucketSource::shared(client);
    let fs = fs.with_read_sources(ReadSources {
        cached: Arc::new(Cached::new(
            BlockCache::new(Arc::clone(&disk), 64 << 10),
            Arc::clone(&bucket),
        )),
        direct: bucket,
    });
    let opened = fs.open(ino, ro, 1).await.unwrap();
    assert_eq!(
        fs.keep_in_cache(opened.fh, 0).await.unwrap(),
        (300_000, false)
    );
    // Asked again from where it ended: nothing more to keep, no request.
    let before = fake.counts();
    assert_eq!(
        fs.keep_in_cache(opened.fh, 300_000).await.unwrap(),
        (300_000, false)
    );
    assert_eq!(fake.counts(), before);
    fs.release(opened.fh).await.unwrap();
    // O_DIRECT reads the bucket itself: that handle has no cache to fill.
    let direct = OpenMode { direct: true, ..ro };
    let opened = fs.open(ino, direct, 1).await.unwrap();
    assert!(matches!(
        fs.keep_in_cache(opened.fh, 0).await,
        Err(FsError::NotCacheable)
    ));
}

#[tokio::test]
async fn a_small_file_never_cached_comes_with_its_bytes_for_the_page_cache_once() {
    let small: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let mut c = config();
    c.allow_overwrite = true;
    let (fake, fs) = fs_with(
        &[
            ("small.jpg", &small[..]),
            ("empty", b""),
            ("big.bin", &vec![1u8; 2 << 20][..]),
            ("direct.jpg", &small[..]),
            ("rewritten.jpg", &small[..]),
            ("opened.jpg", &small[..]),
            ("truncated.jpg", &small[..]),
        ],
        c,
        true,
    )
    .await;
    let read_mode = OpenMode {
        read: true,
        ..Default::default()
    };
    let ino = |name: &'static str| {
        let fs = &fs;
        async move { fs.sb.lookup(ROOT_INO, name).await.unwrap().ino }
    };
    // As in a directory bigger than one page: each lookup asks for its name, with its first bytes.
    fs.sb.as_if_bigger_than_a_page(ROOT_INO);
    let small_ino = ino("small.jpg").await;
    let before = fake.counts();
    let opened = fs.open(small_ino, read_mode, 1).await.unwrap();
    assert_eq!(
        opened.preload.as_ref().map(|p| &p.bytes()[..]),
        Some(&small[..]),
        "the whole file, exactly"
    );
    assert!(!opened.keep_cache);
    // A READ that comes anyway (the kernel did not take the bytes) is served without another request.
    assert_eq!(&fs.read(opened.fh, 0, 8192).await.unwrap()[..], &small[..]);
    assert_eq!(
        fake.counts(),
        before,
        "the lookup's first bytes served both"
    );
    let preload = opened.preload.as_ref().unwrap();
    assert!(
        preload.store_if_untouched(|b| b == &small[..]),
        "untouched: stored"
    );
    fs.release(opened.fh).await.unwrap();
    // The page cache has been used: the next open keeps it and pushes nothing.
    let again = fs.open(small_ino, read_mode, 1).await.unwrap();
    assert!(again.keep_cache && again.preload.is_none());
    fs.release(again.fh).await.unwrap();

    let opened = fs.open(ino("empty").await, read_mode, 1).await.unwrap();
    assert!(opened.preload.is_none(), "nothing to push");
    let opened = fs.open(ino("big.bin").await, read_mode, 1).await.unwrap();
    assert!(opened.preload.is_none(), "over one window: reads fetch it");
    let direct = OpenMode {
        read: true,
        direct: true,
        ..Default::default()
    };
    let opened = fs.open(ino("direct.jpg").await, direct, 1).await.unwrap();
    assert!(opened.preload.is_none() && opened.bypass_page_cache);

    // A write open may have put bytes into the page cache: a later read open pushes nothing.
    let rewritten = ino("rewritten.jpg").await;
    let trunc = OpenMode {
        write: true,
        truncate: true,
        ..Default::default()
    };
    let w = fs.open(rewritten, trunc, 1).await.unwrap();
    fs.write(w.fh, 0, b"new").await.unwrap();
    fs.release(w.fh).await.unwrap();
    let opened = fs.open(rewritten, read_mode, 1).await.unwrap();
    assert!(opened.preload.is_none());

    // Another open, or a truncation, of the inode before the edge stored the bytes voids the preload: the
    // other's reads could hold the pages the store fills, or bring another version's bytes.
    let first = fs
        .open(ino("opened.jpg").await, read_mode, 1)
        .await
        .unwrap();
    let second = fs
        .open(ino("opened.jpg").await, read_mode, 2)
        .await
        .unwrap();
    assert!(second.preload.is_none());
    let voided = first.preload.as_ref().expect("the first open's");
    assert!(!voided.store_if_untouched(|_| panic!("a voided preload is not stored")));
    let truncated = ino("truncated.jpg").await;
    let first = fs.open(truncated, read_mode, 1).await.unwrap();
    fs.setattr(truncated, Some(0), None, Default::default())
        .await
        .unwrap();
    let voided = first.preload.as_ref().expect("the first open's");
    assert!(!voided.store_if_untouched(|_| panic!("a voided preload is not stored")));
}

/// The kernel was told a file's size, then the daemon saw the object grow (a HEAD at open, or a listing): the
/// open tells the kernel to drop the size it holds, or a read through the page cache would stop at the old
/// size and return the new version cut short. An open that changed nothing tells it nothing.
#[tokio::test]
async fn an_open_after_the_file_changed_size_has_the_kernel_drop_the_old_size() {
    let mut config = config();
    config.metadata_ttl = Duration::ZERO;
    let (fake, fs) = fs_with(&[("f", b"one")], config, true).await;
    let told = Arc::new(Mutex::new(Vec::new()));
    fs.on_kernel_notice({
        let told = Arc::clone(&told);
        move |notice| told.lock().unwrap().push(notice)
    });
    let ino = fs.sb.lookup(ROOT_INO, "f").await.unwrap().ino;
    let h = fs.open(ino, RO, 1).await.unwrap();
    fs.release(h.fh).await.unwrap();
    assert!(told.lock().unwrap().is_empty(), "nothing changed");
    fake.put_object(
        "f",
        Bytes::from_static(b"one, and more"),
        WriteCondition::None,
    )
    .await
    .unwrap();
    let h = fs.open(ino, RO, 1).await.unwrap();
    assert_eq!(*told.lock().unwrap(), vec![KernelNotice::Attributes(ino)]);
    assert_eq!(&fs.read(h.fh, 0, 100).await.unwrap()[..], b"one, and more");
    fs.release(h.fh).await.unwrap();
    let h = fs.open(ino, RO, 1).await.unwrap();
    fs.release(h.fh).await.unwrap();
    assert_eq!(told.lock().unwrap().len(), 1, "told once");
}
