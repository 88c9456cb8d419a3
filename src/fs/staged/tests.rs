//! Staged files against the fake client: exact bytes, what each upload sends, and what a conflict or a
//! failed request leaves behind.

use std::sync::Arc;

use bytes::Bytes;

use super::{StagedFile, StagingContext};
use crate::fs::FsError;
use crate::s3::fake::{FakeClient, Op, transient};
use crate::s3::{ObjectClient, WriteCondition};
use crate::source::BucketSource;

const MIB: u64 = 1024 * 1024;
/// Small parts, so a 24 MiB object has three of them (the fake's minimum part is 5 MiB).
const PART: u64 = 8 * MIB;

fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 31 + i / 4093) as u8).wrapping_add(seed))
        .collect()
}

struct Setup {
    fake: Arc<FakeClient>,
    dir: tempfile::TempDir,
    ctx: StagingContext,
}

fn setup(limit: u64) -> Setup {
    let fake = Arc::new(FakeClient::new("b", true));
    let client: Arc<dyn ObjectClient> = fake.clone();
    let dir = tempfile::tempdir().unwrap();
    let ctx = StagingContext {
        source: BucketSource::shared(Arc::clone(&client)),
        client,
        dir: dir.path().to_path_buf(),
        limit,
        part_size: PART,
        parts_in_flight: 2,
    };
    Setup { fake, dir, ctx }
}

impl Setup {
    async fn put(&self, key: &str, data: &[u8]) {
        self.fake
            .put_object(key, Bytes::copy_from_slice(data), WriteCondition::None)
            .await
            .unwrap();
    }

    async fn open(&self, key: &str) -> StagedFile {
        let info = self.fake.head_object(key).await.unwrap();
        StagedFile::of_object(self.ctx.clone(), key, &info, None).unwrap()
    }

    fn kept(&self) -> Vec<std::path::PathBuf> {
        match std::fs::read_dir(self.dir.path().join("expressfs-kept")) {
            Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
            Err(_) => Vec::new(),
        }
    }
}

#[tokio::test]
async fn patching_the_middle_sends_one_part_and_copies_the_rest() {
    let s = setup(64 * MIB);
    let mut want = pattern(24 * MIB, 0);
    s.put("big", &want).await;
    let mut f = s.open("big").await;
    let before = s.fake.counts();
    let at = 12 * MIB - 2048;
    let patch = vec![0xAB; 4096];
    assert_eq!(f.write(at, &patch).unwrap(), 4096);
    assert_eq!(s.fake.counts(), before, "a write fetches nothing");
    let put = f.upload().await.unwrap().expect("changed: uploaded");
    want[at as usize..at as usize + 4096].copy_from_slice(&patch);
    assert_eq!(s.fake.object("big").unwrap(), want);
    assert_eq!(put.size, Some(24 * MIB));
    let sent = s.fake.counts().since(&before);
    assert_eq!(sent.get(Op::UploadPartCopy), 2, "parts 1 and 3 copied");
    assert_eq!(sent.get(Op::UploadPart), 1, "only part 2 sent");
    assert_eq!(sent.get(Op::Put), 0);
    assert_eq!(sent.get(Op::CompleteUpload), 1);
    // Part 2's missing bytes come in one GET each side of the patch; nothing of parts 1 and 3 comes through
    // the host.
    assert_eq!(sent.get(Op::Get), 2);
    assert_eq!(s.fake.open_uploads(), 0);
    // Uploaded: nothing left to send, and the new version is the base of the next edit.
    let again = s.fake.counts();
    assert!(f.upload().await.unwrap().is_none());
    assert_eq!(s.fake.counts(), again);
    f.write(0, b"head").unwrap();
    f.upload().await.unwrap().unwrap();
    want[..4].copy_from_slice(b"head");
    assert_eq!(s.fake.object("big").unwrap(), want);
    let second = s.fake.counts().since(&again);
    // Parts 2 and 3 stand unchanged side by side: one copy.
    assert_eq!(second.get(Op::UploadPartCopy), 1);
    assert_eq!(second.get(Op::UploadPart), 1);
}

#[tokio::test]
async fn a_patch_across_a_part_boundary_sends_two_parts() {
    let s = setup(64 * MIB);
    let mut want = pattern(24 * MIB, 3);
    s.put("big", &want).await;
    let mut f = s.open("big").await;
    let before = s.fake.counts();
    let at = PART - 2048;
    f.write(at, &[1u8; 4096]).unwrap();
    f.upload().await.unwrap().unwrap();
    want[at as usize..at as usize + 4096].fill(1);
    assert_eq!(s.fake.object("big").unwrap(), want);
    let sent = s.fake.counts().since(&before);
    assert_eq!(sent.get(Op::UploadPart), 2);
    assert_eq!(sent.get(Op::UploadPartCopy), 1);
    assert_eq!(
        sent.get(Op::Get),
        2,
        "one GET for what each sent part lacks"
    );
}

#[tokio::test]
async fn reads_overlay_written_bytes_on_the_base() {
    let s = setup(64 * MIB);
    let mut want = pattern(3 * MIB, 7);
    s.put("f", &want).await;
    let mut f = s.open("f").await;
    // Across the first block boundary, and past the end of the base (the file grows).
    f.write(MIB - 10, &[9u8; 20]).unwrap();
    f.write(3 * MIB - 5, b"0123456789").unwrap();
    want[(MIB - 10) as usize..(MIB + 10) as usize].fill(9);
    want.truncate((3 * MIB - 5) as usize);
    want.extend_from_slice(b"0123456789");
    assert_eq!(f.size(), 3 * MIB + 5);
    assert_eq!(
        &f.read(MIB - 100, 200).await.unwrap()[..],
        &want[(MIB - 100) as usize..(MIB + 100) as usize]
    );
    assert_eq!(&f.read(0, 10 * MIB).await.unwrap()[..], &want[..]);
    // Fetched blocks are kept: reading everything again costs nothing.
    let before = s.fake.counts();
    assert_eq!(&f.read(0, 10 * MIB).await.unwrap()[..], &want[..]);
    assert_eq!(s.fake.counts(), before);
    assert!(
        f.read(4 * MIB, 10).await.unwrap().is_empty(),
        "past the end"
    );
    f.upload().await.unwrap().unwrap();
    assert_eq!(s.fake.object("f").unwrap(), want, "small: one PutObject");
    assert_eq!(s.fake.count(Op::Put), 2);
}

#[tokio::test]
async fn truncate_then_grow_reads_zeros_past_the_cut() {
    let s = setup(64 * MIB);
    let base = pattern(2 * MIB, 1);
    s.put("f", &base).await;
    let mut f = s.open("f").await;
    f.truncate(1000).unwrap();
    assert_eq!(f.size(), 1000);
    f.truncate(2 * MIB).unwrap();
    let mut want = base[..1000].to_vec();
    want.resize(2 * MIB as usize, 0);
    assert_eq!(&f.read(0, 2 * MIB).await.unwrap()[..], &want[..]);
    f.upload().await.unwrap().unwrap();
    assert_eq!(s.fake.object("f").unwrap(), want);
}

#[tokio::test]
async fn truncate_then_grow_of_a_big_file_copies_only_standing_parts() {
    let s = setup(64 * MIB);
    let base = pattern(24 * MIB, 2);
    s.put("big", &base).await;
    let mut f = s.open("big").await;
    let before = s.fake.counts();
    f.truncate(10 * MIB).unwrap();
    f.truncate(24 * MIB).unwrap();
    f.upload().await.unwrap().unwrap();
    let mut want = base[..(10 * MIB) as usize].to_vec();
    want.resize(24 * MIB as usize, 0);
    assert_eq!(s.fake.object("big").unwrap(), want);
    let sent = s.fake.counts().since(&before);
    assert_eq!(sent.get(Op::UploadPartCopy), 1, "only part 1 stands whole");
    assert_eq!(sent.get(Op::UploadPart), 2);
    assert_eq!(sent.get(Op::Get), 1, "8..10 MiB of the base, in one GET");
}

#[tokio::test]
async fn fallocate_modes() {
    let s = setup(64 * MIB);
    let base = pattern(MIB, 4);
    s.put("f", &base).await;
    let mut f = s.open("f").await;
    let mut want = base.clone();
    let keep = libc::FALLOC_FL_KEEP_SIZE;

    // Punch hole (always with keep-size): zeros, size unchanged, clipped at the end.
    f.fallocate(100, 50, libc::FALLOC_FL_PUNCH_HOLE | keep)
        .unwrap();
    want[100..150].fill(0);
    f.fallocate(MIB - 10, 100, libc::FALLOC_FL_PUNCH_HOLE | keep)
        .unwrap();
    want[(MIB - 10) as usize..].fill(0);
    assert_eq!(f.size(), MIB);
    // Punch hole without keep-size is EOPNOTSUPP in Linux too.
    assert!(matches!(
        f.fallocate(0, 10, libc::FALLOC_FL_PUNCH_HOLE),
        Err(FsError::OperationNotSupported(_))
    ));
    // Zero range: zeros, and it grows the file unless keep-size.
    f.fallocate(1000, 24, libc::FALLOC_FL_ZERO_RANGE).unwrap();
    want[1000..1024].fill(0);
    f.fallocate(MIB - 4, 8, libc::FALLOC_FL_ZERO_RANGE).unwrap();
    want.resize((MIB + 4) as usize, 0);
    assert_eq!(f.size(), MIB + 4);
    f.fallocate(MIB, 100, libc::FALLOC_FL_ZERO_RANGE | keep)
        .unwrap();
    assert_eq!(f.size(), MIB + 4);
    // Plain allocation: grows with zeros; keep-size changes nothing seen.
    f.fallocate(MIB, 1000, keep).unwrap();
    assert_eq!(f.size(), MIB + 4);
    f.fallocate(0, MIB + 10, 0).unwrap();
    want.resize((MIB + 10) as usize, 0);
    assert_eq!(f.size(), MIB + 10);
    f.fallocate(0, 10, 0).unwrap();
    assert_eq!(f.size(), MIB + 10, "allocation inside the file: no change");
    // Modes we do not offer.
    for mode in [
        libc::FALLOC_FL_COLLAPSE_RANGE,
        libc::FALLOC_FL_INSERT_RANGE,
        libc::FALLOC_FL_UNSHARE_RANGE,
    ] {
        assert!(matches!(
            f.fallocate(0, 4096, mode),
            Err(FsError::OperationNotSupported(_))
        ));
    }
    assert_eq!(f.size(), MIB + 10);
    assert_eq!(&f.read(0, 2 * MIB).await.unwrap()[..], &want[..]);
    f.upload().await.unwrap().unwrap();
    assert_eq!(s.fake.object("f").unwrap(), want);
}

#[tokio::test]
async fn past_the_limit_is_too_big_and_changes_nothing() {
    let s = setup(MIB);
    let base = pattern(24 * MIB, 5);
    s.put("big", &base).await;
    let mut f = s.open("big").await;
    assert!(matches!(
        f.write(4 * MIB, &vec![1u8; (MIB + 1) as usize]),
        Err(FsError::TooBig(_))
    ));
    assert!(!f.is_changed());
    f.write(4 * MIB, &[2u8; 1000]).unwrap();
    // Growing the file adds bytes the base lacks: bounded too.
    assert!(matches!(f.truncate(26 * MIB), Err(FsError::TooBig(_))));
    assert!(matches!(
        f.write(24 * MIB, &vec![3u8; MIB as usize]),
        Err(FsError::TooBig(_))
    ));
    assert!(matches!(
        f.fallocate(0, 25 * MIB, 0),
        Err(FsError::TooBig(_))
    ));
    assert!(matches!(
        f.write(u64::MAX - 10, &[1u8; 100]),
        Err(FsError::TooBig(_))
    ));
    assert_eq!(f.size(), 24 * MIB);
    let mut want = base.clone();
    want[(4 * MIB) as usize..(4 * MIB + 1000) as usize].fill(2);
    f.upload().await.unwrap().unwrap();
    assert_eq!(s.fake.object("big").unwrap(), want);
}

#[tokio::test]
async fn reads_past_the_limit_still_work_uncached() {
    let s = setup(MIB);
    let base = pattern(24 * MIB, 6);
    s.put("big", &base).await;
    let mut f = s.open("big").await;
    assert_eq!(&f.read(0, 24 * MIB).await.unwrap()[..], &base[..]);
    // Only what the limit allows was kept: the rest is fetched again.
    let before = s.fake.counts();
    assert_eq!(&f.read(0, 24 * MIB).await.unwrap()[..], &base[..]);
    assert_eq!(
        s.fake.counts().since(&before).get(Op::Get),
        1,
        "one GET for the gap"
    );
    // Writing over bytes already held adds nothing.
    f.write(0, b"x").unwrap();
    // Bytes kept from reads give way to writes: the limit bounds what was written, not what was read.
    f.write(5 * MIB, &[7u8; 4096]).unwrap();
    f.write(20 * MIB, &vec![8u8; (MIB - 8192) as usize])
        .unwrap();
    assert!(matches!(
        f.write(10 * MIB, &[9u8; 8192]),
        Err(FsError::TooBig(_))
    ));
    let mut want = base.clone();
    want[0] = b'x';
    want[(5 * MIB) as usize..(5 * MIB + 4096) as usize].fill(7);
    want[(20 * MIB) as usize..(21 * MIB - 8192) as usize].fill(8);
    assert_eq!(&f.read(0, 24 * MIB).await.unwrap()[..], &want[..]);
    f.upload().await.unwrap().unwrap();
    assert_eq!(s.fake.object("big").unwrap(), want);
}

async fn conflict_case(size: u64) {
    let s = setup(64 * MIB);
    s.put("f", &pattern(size, 8)).await;
    let mut f = s.open("f").await;
    let at = size / 2;
    f.write(at, b"ours").unwrap();
    let theirs = pattern(size, 9);
    s.put("f", &theirs).await;
    assert!(matches!(
        f.upload().await,
        Err(FsError::ObjectChanged { ref key }) if key == "f"
    ));
    assert_eq!(s.fake.object("f").unwrap(), theirs, "size {size}");
    assert_eq!(s.fake.open_uploads(), 0);
    let kept = s.kept();
    assert_eq!(kept.len(), 1, "one kept copy");
    let copy = std::fs::read(&kept[0]).unwrap();
    assert_eq!(copy.len() as u64, size);
    assert_eq!(&copy[at as usize..at as usize + 4], b"ours");
    assert!(
        kept[0]
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("f.")
    );
    // Forever after: nothing works, nothing is sent.
    let before = s.fake.counts();
    assert!(matches!(
        f.read(0, 10).await,
        Err(FsError::ObjectChanged { .. })
    ));
    assert!(matches!(
        f.write(0, b"x"),
        Err(FsError::ObjectChanged { .. })
    ));
    assert!(matches!(f.truncate(1), Err(FsError::ObjectChanged { .. })));
    assert!(matches!(
        f.upload().await,
        Err(FsError::ObjectChanged { .. })
    ));
    assert_eq!(s.fake.counts(), before);
    assert_eq!(s.fake.object("f").unwrap(), theirs);
    drop(f);
    assert!(kept[0].exists(), "the kept copy outlives the staged file");
}

#[tokio::test]
async fn a_replaced_small_object_is_a_conflict() {
    conflict_case(100_000).await;
}

#[tokio::test]
async fn a_replaced_big_object_is_a_conflict() {
    conflict_case(24 * MIB).await;
}

#[tokio::test]
async fn a_replaced_object_found_by_a_read_is_a_conflict() {
    let s = setup(64 * MIB);
    s.put("f", &pattern(MIB, 1)).await;
    let mut f = s.open("f").await;
    s.put("f", b"theirs").await;
    assert!(matches!(
        f.read(0, 10).await,
        Err(FsError::ObjectChanged { .. })
    ));
    assert_eq!(s.kept().len(), 1);
    assert!(matches!(
        f.write(0, b"x"),
        Err(FsError::ObjectChanged { .. })
    ));
    assert_eq!(s.fake.object("f").unwrap(), &b"theirs"[..]);
}

#[tokio::test]
async fn a_new_file_does_not_replace_one_created_meanwhile() {
    let s = setup(64 * MIB);
    let local = super::LocalCopy::create(s.dir.path(), "new").unwrap();
    let mut f = StagedFile::adopt(
        s.ctx.clone(),
        "new",
        super::Adopted {
            local,
            size: 0,
            complete: true,
            uploaded: None,
            expect: WriteCondition::IfNoneMatch,
            discarded: false,
        },
        None,
    );
    f.write(0, b"mine").unwrap();
    s.put("new", b"theirs").await;
    assert!(matches!(
        f.upload().await,
        Err(FsError::ObjectChanged { .. })
    ));
    assert_eq!(s.fake.object("new").unwrap(), &b"theirs"[..]);
    assert_eq!(s.kept().len(), 1);
}

/// A request that fails (after the client's retries) leaves the old object whole and no upload open; the
/// next upload sends the whole change again.
async fn fault_case(op: Op, size: u64, patch_at: u64) {
    let s = setup(64 * MIB);
    let old = pattern(size, 10);
    s.put("f", &old).await;
    let mut f = s.open("f").await;
    f.write(patch_at, &[0xEE; 4096]).unwrap();
    s.fake.faults().fail_next(op, 1, transient());
    let failed = f.upload().await;
    assert!(
        matches!(failed, Err(FsError::Client { .. })),
        "{op:?}: {failed:?}"
    );
    assert_eq!(s.fake.object("f").unwrap(), old, "{op:?}");
    assert_eq!(s.fake.open_uploads(), 0, "{op:?}");
    assert!(f.is_changed());
    assert!(s.kept().is_empty(), "not a conflict");
    f.upload().await.unwrap().unwrap();
    let mut want = old;
    want[patch_at as usize..patch_at as usize + 4096].fill(0xEE);
    assert_eq!(s.fake.object("f").unwrap(), want, "{op:?}");
    assert_eq!(s.fake.open_uploads(), 0);
}

#[tokio::test]
async fn a_failed_part_leaves_the_object_whole() {
    fault_case(Op::UploadPart, 24 * MIB, 12 * MIB).await;
}

#[tokio::test]
async fn a_failed_part_copy_leaves_the_object_whole() {
    fault_case(Op::UploadPartCopy, 24 * MIB, 12 * MIB).await;
}

#[tokio::test]
async fn a_failed_complete_leaves_the_object_whole() {
    fault_case(Op::CompleteUpload, 24 * MIB, 12 * MIB).await;
}

#[tokio::test]
async fn a_failed_create_leaves_the_object_whole() {
    fault_case(Op::CreateUpload, 24 * MIB, 0).await;
}

#[tokio::test]
async fn a_failed_fetch_of_the_part_to_send_leaves_the_object_whole() {
    fault_case(Op::Get, 24 * MIB, 20 * MIB).await;
}

#[tokio::test]
async fn a_failed_put_leaves_the_object_whole() {
    fault_case(Op::Put, MIB, 100).await;
}

#[tokio::test]
async fn a_late_part_failure_with_parts_in_flight_leaves_nothing_open() {
    let s = setup(64 * MIB);
    let old = pattern(40 * MIB, 11);
    s.put("f", &old).await;
    let mut f = s.open("f").await;
    // Touch parts 1 and 5, copy 2..4 (one merged copy); the second sent part fails with the copy in flight.
    f.write(0, b"a").unwrap();
    f.write(39 * MIB, b"b").unwrap();
    s.fake
        .faults()
        .fail_after(Op::UploadPart, 1, 1, transient());
    assert!(f.upload().await.is_err());
    assert_eq!(s.fake.object("f").unwrap(), old);
    // Aborted part tasks may still land after the abort; give them the chance, then look.
    tokio::task::yield_now().await;
    assert_eq!(s.fake.open_uploads(), 0);
    f.upload().await.unwrap().unwrap();
    let mut want = old;
    want[0] = b'a';
    want[(39 * MIB) as usize] = b'b';
    assert_eq!(s.fake.object("f").unwrap(), want);
}

#[tokio::test]
async fn the_limit_counts_each_byte_once() {
    let s = setup(MIB);
    let local = super::LocalCopy::create(s.dir.path(), "new").unwrap();
    let mut f = StagedFile::adopt(
        s.ctx.clone(),
        "new",
        super::Adopted {
            local,
            size: 0,
            complete: true,
            uploaded: None,
            expect: WriteCondition::None,
            discarded: false,
        },
        None,
    );
    // Appending counts its bytes once (not once as written and again as growth).
    f.write(0, &vec![1u8; 600 * 1024]).unwrap();
    f.write(600 * 1024, &vec![2u8; 424 * 1024]).unwrap();
    assert_eq!(f.size(), MIB);
    // Rewriting held bytes adds nothing; one byte more is too big.
    f.write(0, &vec![3u8; MIB as usize]).unwrap();
    assert!(matches!(f.write(MIB, b"x"), Err(FsError::TooBig(_))));
    assert_eq!(f.size(), MIB);
}

/// With `--preserve-metadata` an edit in place carries the last write's time, not the one stored with the
/// base (`touch -d` then `dd conv=notrunc`); a time set after the last write wins.
#[tokio::test]
async fn an_edit_carries_the_last_writes_time_unless_one_is_set_after_it() {
    use crate::fs::attrs::StoredAttrs;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    let s = setup(64 * MIB);
    s.put("f", b"AAAA").await;
    let old = StoredAttrs {
        mtime: Some(UNIX_EPOCH + Duration::from_secs(946_684_800)),
        ..StoredAttrs::default()
    };
    let open = || async {
        let info = s.fake.head_object("f").await.unwrap();
        StagedFile::of_object(s.ctx.clone(), "f", &info, Some(old)).unwrap()
    };
    let stored = || async {
        StoredAttrs::from_metadata(&s.fake.head_object("f").await.unwrap().metadata).mtime
    };

    let before = SystemTime::now();
    let mut f = open().await;
    f.write(1, b"B").unwrap();
    f.upload().await.unwrap();
    assert!(stored().await.is_some_and(|t| t >= before));
    assert_eq!(stored().await, f.mtime());

    let mut f = open().await;
    f.set_attrs(old);
    f.truncate(2).unwrap();
    f.upload().await.unwrap();
    assert!(
        stored().await.is_some_and(|t| t >= before),
        "a cut is a write"
    );

    let mut f = open().await;
    f.write(0, b"C").unwrap();
    f.set_attrs(old);
    f.upload().await.unwrap();
    assert_eq!(stored().await, old.mtime);
    assert_eq!(f.mtime(), old.mtime);
}

/// A kept copy's name stays a valid file name whatever the key's length, and two long keys that end alike
/// still get names of their own.
#[test]
fn a_long_key_gets_a_kept_name_that_fits() {
    let deep = |top: &str| {
        format!(
            "{top}/{}/{}/checkpoint_0/array.zarr/0.0.0",
            "d".repeat(120),
            "e".repeat(120)
        )
    };
    let (a, b) = (deep("run-a"), deep("run-b"));
    assert!(a.len() > 255);
    let (name_a, name_b) = (super::kept_name(&a, 7), super::kept_name(&b, 7));
    assert!(name_a.len() <= 255, "{}", name_a.len());
    assert!(!name_a.contains('/'));
    assert!(name_a.ends_with("array.zarr%2F0.0.0.7"), "{name_a}");
    assert_ne!(name_a, name_b);
    assert_eq!(super::kept_name("dir/f", 9), "dir%2Ff.9");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(&name_a), b"kept").unwrap();
}

/// An object deleted by another client while a staged edit of it is open is a conflict, as a replaced one is:
/// the upload fails with the conflict (EIO, not ENOENT), the copy is kept, later calls fail the same way and
/// nothing is made under the key.
#[tokio::test]
async fn a_deleted_object_is_a_conflict() {
    for size in [100_000, 24 * MIB] {
        let s = setup(64 * MIB);
        s.put("f", &pattern(size, 8)).await;
        let mut f = s.open("f").await;
        f.write(size / 2, b"ours").unwrap();
        s.fake.delete_object("f").await.unwrap();
        assert!(
            matches!(f.upload().await, Err(FsError::ObjectChanged { ref key }) if key == "f"),
            "size {size}"
        );
        assert!(s.fake.object("f").is_none());
        assert_eq!(s.fake.open_uploads(), 0);
        assert_eq!(s.kept().len(), 1);
        assert!(matches!(
            f.write(0, b"x"),
            Err(FsError::ObjectChanged { .. })
        ));
    }
    // Found by a read of the base first.
    let s = setup(64 * MIB);
    s.put("f", &pattern(MIB, 1)).await;
    let mut f = s.open("f").await;
    s.fake.delete_object("f").await.unwrap();
    assert!(matches!(
        f.read(0, 10).await,
        Err(FsError::ObjectChanged { .. })
    ));
    assert_eq!(s.kept().len(), 1);
}

/// An unlinked staged file keeps the base bytes it holds when a write reaches the limit: the object is gone,
/// so they could not be fetched again, and the descriptors still read them.
#[tokio::test]
async fn an_unlinked_file_keeps_its_bytes_at_the_limit() {
    let s = setup(2 * MIB);
    let data = pattern(MIB, 4);
    s.put("f", &data).await;
    let mut f = s.open("f").await;
    assert!(f.read(0, MIB).await.unwrap() == data);
    f.discard();
    s.fake.delete_object("f").await.unwrap();
    // Past the limit with what it holds: refused, and nothing it holds is given up.
    assert!(matches!(
        f.write(MIB, &pattern(2 * MIB, 5)),
        Err(FsError::TooBig(_))
    ));
    assert!(f.read(0, MIB).await.unwrap() == data);
}
