//! Lookups, listings and changes of names through the core, with the fake client.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::listings::LIST_ATTEMPTS;
use crate::fs::negative::MAX_ENTRIES;
use crate::fs::test_support::{config, fs_with};
use crate::fs::{DirEntry, FileKind, FsError, ROOT_INO};
use crate::s3::fake::Op;
use crate::s3::{ObjectClient, WriteCondition};

#[tokio::test]
async fn lookup_prefers_directories_and_lists_without_duplicates() {
    let (_, fs) = fs_with(
        &[
            ("a", b"file"),
            ("a/x", b"1"),
            ("b", b"22"),
            ("c//d", b"bad"),
            ("dir/", b""),
        ],
        config(),
        true,
    )
    .await;
    let a = fs.sb.lookup(ROOT_INO, "a").await.unwrap();
    assert_eq!(a.kind, FileKind::Directory);
    let b = fs.sb.lookup(ROOT_INO, "b").await.unwrap();
    assert_eq!((b.kind, b.size), (FileKind::File, 2));
    assert!(matches!(
        fs.sb.lookup(ROOT_INO, "nope").await,
        Err(FsError::NotFound)
    ));
    let fh = fs.opendir(ROOT_INO).unwrap();
    let mut names: Vec<String> = fs
        .readdir(fh, 0)
        .await
        .unwrap()
        .iter()
        .map(|e| e.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, vec![".", "..", "a", "b", "c", "dir"]);
    let c = fs.sb.lookup(ROOT_INO, "c").await.unwrap();
    let fh = fs.opendir(c.ino).unwrap();
    let inside: Vec<String> = fs
        .readdir(fh, 0)
        .await
        .unwrap()
        .iter()
        .map(|e| e.name.clone())
        .collect();
    assert_eq!(inside, vec![".", ".."], "empty path component hidden");
}

/// A readdir whose listing was answered before our unlink finished must not bring the file back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_of_one_name_at_once_send_one_pair_of_requests() {
    let (fake, fs) = fs_with(&[("d/a.jpg", b"x")], config(), true).await;
    // As in a directory bigger than one page: each lookup asks for its own name.
    fs.sb.as_if_bigger_than_a_page(ROOT_INO);
    let fs = Arc::new(fs);
    let gate = fake.faults().hold(Op::List);
    let before = fake.counts();
    let lookup = |name: &'static str| {
        let fs = Arc::clone(&fs);
        tokio::spawn(async move { fs.sb.lookup(ROOT_INO, name).await })
    };
    let first = lookup("d");
    // The first has sent its GET and its LIST (held at the gate); the others join while it waits.
    while fake.counts().since(&before).total() < 2 {
        tokio::task::yield_now().await;
    }
    let others: Vec<_> = (0..7).map(|_| lookup("d")).collect();
    let missing: Vec<_> = (0..3).map(|_| lookup("nothing")).collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    gate.open();
    let ino = first.await.unwrap().unwrap().ino;
    for other in others {
        assert_eq!(other.await.unwrap().unwrap().ino, ino);
    }
    for m in missing {
        assert!(matches!(m.await.unwrap(), Err(FsError::NotFound)));
    }
    // One pair for "d" and one for "nothing" (plus the HEAD of "nothing.rclonelink" a miss asks for);
    // each lookup on its own would have sent a pair: 20.
    let sent = fake.counts().since(&before);
    assert_eq!(
        (sent.get(Op::Head), sent.get(Op::List), sent.total()),
        (3, 2, 5)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_from_before_an_unlink_does_not_bring_the_file_back() {
    let mut c = config();
    c.allow_delete = true;
    let files: [(&str, &[u8]); 2] = [("d/gone", b"1"), ("d/kept", b"2")];
    let (fake, fs) = fs_with(&files, c, true).await;
    let fs = Arc::new(fs);
    let dir = fs.sb.lookup(ROOT_INO, "d").await.unwrap().ino;
    fs.sb.lookup(dir, "gone").await.unwrap();
    let gate = fake.faults().hold(Op::List);
    let fh = fs.opendir(dir).unwrap();
    let listing = tokio::spawn({
        let fs = Arc::clone(&fs);
        async move { fs.readdir(fh, 0).await }
    });
    // The listing has read the bucket (both files) and waits; the unlink now completes.
    while gate.held() == 0 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    fs.sb.unlink(dir, "gone").await.unwrap();
    gate.open();
    let names: Vec<String> = listing
        .await
        .unwrap()
        .unwrap()
        .iter()
        .map(|e| e.name.clone())
        .collect();
    assert!(names.contains(&"kept".to_string()), "{names:?}");
    assert!(!names.contains(&"gone".to_string()), "{names:?}");
    assert!(matches!(
        fs.sb.lookup(dir, "gone").await,
        Err(FsError::NotFound)
    ));
}

/// While our change in a directory outlasts every listing of a readdir, the listing adds no names the
/// table does not have (they could be ones we just removed); once it ends, everything is listed.
#[tokio::test]
async fn a_directory_that_keeps_changing_lists_only_names_already_known() {
    let (fake, fs) = fs_with(&[("d/known", b"1")], config(), true).await;
    let dir = fs.sb.lookup(ROOT_INO, "d").await.unwrap().ino;
    fs.sb.lookup(dir, "known").await.unwrap();
    // Another client's file, made after the lookup of `d` listed it: the table has no entry for it.
    fake.put_object("d/unseen", Bytes::from_static(b"2"), WriteCondition::None)
        .await
        .unwrap();
    let names = |entries: Arc<Vec<DirEntry>>| -> Vec<String> {
        let mut v: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
        v.sort();
        v
    };
    let change = fs.sb.storms.changing(dir);
    let before = fake.counts();
    let fh = fs.opendir(dir).unwrap();
    let listed = names(fs.readdir(fh, 0).await.unwrap());
    assert_eq!(listed, [".", "..", "known"]);
    let sent = fake.counts().since(&before);
    assert_eq!(
        (sent.get(Op::List), sent.total()),
        (u64::from(LIST_ATTEMPTS), u64::from(LIST_ATTEMPTS)),
        "each attempt lists once"
    );
    drop(change);
    let fh = fs.opendir(dir).unwrap();
    let listed = names(fs.readdir(fh, 0).await.unwrap());
    assert_eq!(listed, [".", "..", "known", "unseen"]);
}

#[tokio::test]
async fn file_rename_is_one_rename_object_on_directory_buckets() {
    let (fake, fs) = fs_with(&[("a", b"1"), ("d/x", b"2")], config(), true).await;
    let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
    fs.rename(ROOT_INO, "a", d.ino, "b", false).await.unwrap();
    assert_eq!(&fake.object("d/b").unwrap()[..], b"1");
    assert!(fake.object("a").is_none());
    assert_eq!(
        (
            fake.count(Op::Rename),
            fake.count(Op::Copy),
            fake.count(Op::Delete)
        ),
        (1, 0, 0)
    );
    assert!(matches!(
        fs.rename(d.ino, "b", d.ino, "x", false).await,
        Err(FsError::NotPermitted(_))
    ));
}

#[tokio::test]
async fn mkdir_rmdir_and_read_only() {
    let (_, fs) = fs_with(&[("full/x", b"1")], config(), true).await;
    let m = fs.sb.mkdir(ROOT_INO, "m").await.unwrap();
    assert_eq!(fs.sb.lookup(ROOT_INO, "m").await.unwrap().ino, m.ino);
    fs.sb.rmdir(ROOT_INO, "m").await.unwrap();
    fs.sb.lookup(ROOT_INO, "full").await.unwrap();
    assert!(matches!(
        fs.sb.rmdir(ROOT_INO, "full").await,
        Err(FsError::NotEmpty)
    ));
    let mut c = config();
    c.read_only = true;
    let (_, ro) = fs_with(&[], c, true).await;
    assert!(matches!(
        ro.create(ROOT_INO, "x", 0).await,
        Err(FsError::ReadOnly)
    ));
    assert!(matches!(
        ro.sb.mkdir(ROOT_INO, "x").await,
        Err(FsError::ReadOnly)
    ));
}

/// Every distinct missing name used to stay in memory for the life of the mount.
#[tokio::test]
async fn a_hundred_thousand_missing_names_stay_within_the_negative_bound() {
    let mut c = config();
    c.negative_metadata_ttl = Duration::from_secs(600);
    // No listing may answer for the names instead (a storm would list the root and know them all missing).
    c.metadata_ttl = Duration::ZERO;
    let (fake, fs) = fs_with(&[], c, true).await;
    for i in 0..100_000 {
        let name = format!("missing-{i}");
        assert!(matches!(
            fs.sb.lookup(ROOT_INO, &name).await,
            Err(FsError::NotFound)
        ));
        assert!(fs.sb.negative.len() <= MAX_ENTRIES, "after {i} names");
    }
    assert_eq!(fs.sb.negative.len(), MAX_ENTRIES);
    // The newest names are still known to be missing; the oldest were evicted and are asked again.
    let before = fake.counts();
    assert!(matches!(
        fs.sb.lookup(ROOT_INO, "missing-99999").await,
        Err(FsError::NotFound)
    ));
    assert_eq!(fake.counts(), before);
    assert!(matches!(
        fs.sb.lookup(ROOT_INO, "missing-0").await,
        Err(FsError::NotFound)
    ));
    assert!(fake.counts().since(&before).get(Op::Head) > 0);
}

#[tokio::test]
async fn a_missing_name_is_asked_again_once_its_negative_entry_expires() {
    let mut c = config();
    c.negative_metadata_ttl = Duration::from_millis(300);
    let (fake, fs) = fs_with(&[], c, true).await;
    assert!(matches!(
        fs.sb.lookup(ROOT_INO, "late").await,
        Err(FsError::NotFound)
    ));
    fake.put_object("late", Bytes::from_static(b"here"), WriteCondition::None)
        .await
        .unwrap();
    let writes = fake.counts();
    assert!(
        matches!(fs.sb.lookup(ROOT_INO, "late").await, Err(FsError::NotFound)),
        "still trusted"
    );
    assert_eq!(fake.counts(), writes, "no request");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(fs.sb.lookup(ROOT_INO, "late").await.unwrap().size, 4);
    assert!(fake.counts().since(&writes).get(Op::Head) > 0);
}

#[tokio::test]
async fn a_name_that_was_a_directory_is_asked_again_by_its_prefix_only() {
    let mut c = config();
    c.metadata_ttl = Duration::from_millis(100);
    let (fake, fs) = fs_with(&[("d/a", b"x")], c, true).await;
    assert_eq!(
        fs.sb.lookup(ROOT_INO, "d").await.unwrap().kind,
        FileKind::Directory
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    let before = fake.counts();
    assert_eq!(
        fs.sb.lookup(ROOT_INO, "d").await.unwrap().kind,
        FileKind::Directory
    );
    let sent = fake.counts().since(&before);
    assert_eq!(
        (sent.get(Op::Head), sent.get(Op::Get), sent.get(Op::List)),
        (0, 0, 1),
        "no request for an object named d"
    );
    // No longer a directory but a file: the object is asked for once the prefix is found empty.
    fake.delete_object("d/a").await.unwrap();
    fake.put_object("d", Bytes::from_static(b"file"), WriteCondition::None)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
    assert_eq!((d.kind, d.size), (FileKind::File, 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_during_a_storm_listing_send_no_list_of_their_own() {
    // More than one page, so that the lookup of `d` cannot list it whole from the page it asks for.
    let names: Vec<String> = (0..1040).map(|i| format!("d/{i:04}.jpg")).collect();
    let keys: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b"x"[..])).collect();
    let (fake, fs) = fs_with(&keys, config(), true).await;
    let fs = Arc::new(fs);
    let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap().ino;
    // One short of a storm: each lookup asks for its object and its prefix.
    for i in 0..crate::fs::listing::STORM_THRESHOLD - 1 {
        fs.sb.lookup(d, &format!("{i:04}.jpg")).await.unwrap();
    }
    let before = fake.counts();
    let gate = fake.faults().hold(Op::List);
    let lookups: Vec<_> = (crate::fs::listing::STORM_THRESHOLD - 1..40)
        .map(|i| {
            let fs = Arc::clone(&fs);
            tokio::spawn(async move { fs.sb.lookup(d, &format!("{i:04}.jpg")).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    gate.open();
    for lookup in lookups {
        assert_eq!(lookup.await.unwrap().unwrap().kind, FileKind::File);
    }
    // The storm's listing (two pages) answers "is it a directory" for every lookup made while it was under way.
    let sent = fake.counts().since(&before);
    assert_eq!(sent.get(Op::List), 2, "{sent:?}");
}

/// The first lookup that must ask in a directory never listed waits for one page of it, sent instead of the
/// LIST of its name: a directory that fits is listed whole, so its names, subdirectories included, cost no
/// lookup request of their own (no HEAD or GET that 404s for a subdirectory's name).
#[tokio::test]
async fn the_first_lookup_in_a_directory_never_listed_waits_for_its_first_page() {
    let mut names: Vec<String> = (0..1001).map(|i| format!("big/{i:04}")).collect();
    names.extend(["d/a".to_string(), "d/s/x".to_string()]);
    let keys: Vec<(&str, &[u8])> = names
        .iter()
        .map(|n| {
            (
                n.as_str(),
                if n == "d/s/x" { &b"22"[..] } else { &b"1"[..] },
            )
        })
        .collect();
    let (fake, fs) = fs_with(&keys, config(), true).await;
    let before = fake.counts();
    let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
    assert_eq!(d.kind, FileKind::Directory);
    let s = fs.sb.lookup(d.ino, "s").await.unwrap();
    assert_eq!(s.kind, FileKind::Directory);
    let sent = fake.counts().since(&before);
    assert_eq!(
        (sent.get(Op::List), sent.total()),
        (2, 2),
        "the pages of the root and of d, nothing else: {sent:?}"
    );
    let listed = fake.counts();
    assert_eq!(fs.sb.lookup(d.ino, "a").await.unwrap().size, 1);
    assert!(matches!(
        fs.sb.lookup(d.ino, "b").await,
        Err(FsError::NotFound)
    ));
    assert_eq!(fake.counts(), listed, "answered from the page");
    // A directory bigger than its first page: after the page, the lookup asks for its name as before.
    let big = fs.sb.lookup(ROOT_INO, "big").await.unwrap();
    let before = fake.counts();
    assert_eq!(fs.sb.lookup(big.ino, "0007").await.unwrap().size, 1);
    let sent = fake.counts().since(&before);
    assert_eq!(
        (sent.get(Op::List), sent.get(Op::Head)),
        (2, 1),
        "the first page, then the name's object and prefix: {sent:?}"
    );
}

/// A root bigger than the page the mount listed at startup: its first lookup that must ask sends the name's
/// requests, not that page again.
#[tokio::test]
async fn a_root_bigger_than_the_mounts_first_page_is_not_asked_for_it_again() {
    let (fake, fs) = fs_with(&[("a", b"1")], config(), true).await;
    let page = crate::s3::ListPage {
        objects: Vec::new(),
        common_prefixes: Vec::new(),
        next_continuation_token: Some("more".into()),
    };
    fs.sb.take_root_page(page, std::time::Instant::now());
    let before = fake.counts();
    assert_eq!(fs.sb.lookup(ROOT_INO, "a").await.unwrap().size, 1);
    let sent = fake.counts().since(&before);
    assert_eq!(
        (sent.get(Op::List), sent.get(Op::Head)),
        (1, 1),
        "the name's object and prefix only: {sent:?}"
    );
}

/// A directory found by its lookup is listed by the page of its prefix that found it, when that page holds all
/// of it: the lookups in it (a file, a subdirectory, a missing name) then ask nothing. A lookup in the
/// subdirectory, which no page listed, asks.
#[tokio::test]
async fn a_directory_found_by_its_lookup_is_listed_by_the_page_that_found_it() {
    let (fake, fs) = fs_with(&[("d/a", b"1"), ("d/s/x", b"22")], config(), true).await;
    // The root bigger than one page: its lookups ask for their own names.
    fs.sb.as_if_bigger_than_a_page(ROOT_INO);
    let before = fake.counts();
    let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
    assert_eq!(d.kind, FileKind::Directory);
    let sent = fake.counts().since(&before);
    assert_eq!((sent.get(Op::List), sent.get(Op::Head)), (1, 1), "{sent:?}");
    let found = fake.counts();
    assert_eq!(fs.sb.lookup(d.ino, "a").await.unwrap().size, 1);
    let s = fs.sb.lookup(d.ino, "s").await.unwrap();
    assert_eq!(s.kind, FileKind::Directory);
    assert!(matches!(
        fs.sb.lookup(d.ino, "b").await,
        Err(FsError::NotFound)
    ));
    assert_eq!(fake.counts(), found, "answered from the page");
    assert_eq!(fs.sb.lookup(s.ino, "x").await.unwrap().size, 2);
    assert!(fake.counts().since(&found).get(Op::List) > 0);
}

/// A directory listed whole answers for the names it does not hold, for as long as both TTLs trust it.
#[tokio::test]
async fn a_listed_directory_answers_for_missing_names_without_asking() {
    let mut c = config();
    c.metadata_ttl = Duration::from_millis(400);
    c.negative_metadata_ttl = Duration::from_secs(60);
    let (fake, fs) = fs_with(&[("d/a", b"1"), ("d/s/x", b"2")], c, true).await;
    let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
    let fh = fs.opendir(d.ino).unwrap();
    assert_eq!(fs.readdir(fh, 0).await.unwrap().len(), 4);
    let listed = fake.counts();
    for name in ["b", "x"] {
        assert!(matches!(
            fs.sb.lookup(d.ino, name).await,
            Err(FsError::NotFound)
        ));
    }
    assert_eq!(fs.sb.lookup(d.ino, "a").await.unwrap().size, 1);
    assert_eq!(
        fs.sb.lookup(d.ino, "s").await.unwrap().kind,
        FileKind::Directory
    );
    assert_eq!(fake.counts(), listed, "answered from the listing");
    // Another client's file is not seen until the listing expires (the shorter TTL), then it is.
    fake.put_object("d/b", Bytes::from_static(b"late"), WriteCondition::None)
        .await
        .unwrap();
    assert!(matches!(
        fs.sb.lookup(d.ino, "b").await,
        Err(FsError::NotFound)
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fs.sb.lookup(d.ino, "b").await.unwrap().size, 4);
}

/// A directory we just made holds nothing but what we put in it: its lookups ask nothing.
#[tokio::test]
async fn a_new_directory_answers_for_missing_names_and_finds_our_own() {
    let (fake, fs) = fs_with(&[], config(), true).await;
    let d = fs.sb.mkdir(ROOT_INO, "new").await.unwrap();
    let made = fake.counts();
    assert!(matches!(
        fs.sb.lookup(d.ino, "f").await,
        Err(FsError::NotFound)
    ));
    assert_eq!(fake.counts(), made);
    let sub = fs.sb.mkdir(d.ino, "sub").await.unwrap();
    assert_eq!(fs.sb.lookup(d.ino, "sub").await.unwrap().ino, sub.ino);
    // Renamed within the directory: found under its new name, gone under the old.
    fs.sb
        .rename(d.ino, "sub", d.ino, "moved", false, &Default::default())
        .await
        .unwrap();
    assert_eq!(fs.sb.lookup(d.ino, "moved").await.unwrap().ino, sub.ino);
    assert!(matches!(
        fs.sb.lookup(d.ino, "sub").await,
        Err(FsError::NotFound)
    ));
    // Without a negative TTL nothing is answered from what we know.
    let mut c = config();
    c.negative_metadata_ttl = Duration::ZERO;
    let (fake, fs) = fs_with(&[], c, true).await;
    let d = fs.sb.mkdir(ROOT_INO, "new").await.unwrap();
    let made = fake.counts();
    assert!(matches!(
        fs.sb.lookup(d.ino, "f").await,
        Err(FsError::NotFound)
    ));
    assert!(fake.counts().since(&made).total() > 0);
}

/// A name the table drops while the bucket may still have it (a renamed file the kernel forgot) makes the
/// directory ask again: never a missing answer for a file that exists.
#[tokio::test]
async fn a_forgotten_name_makes_its_directory_ask_again() {
    let (fake, fs) = fs_with(&[("d/a", b"1")], config(), true).await;
    let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
    let fh = fs.opendir(d.ino).unwrap();
    fs.readdir(fh, 0).await.unwrap();
    let a = fs.sb.lookup(d.ino, "a").await.unwrap();
    fs.sb
        .rename(d.ino, "a", d.ino, "b", false, &Default::default())
        .await
        .unwrap();
    // The moved node is expired; the kernel's forget drops it with its name.
    fs.forget(a.ino, 1);
    assert!(fs.sb.table().child(d.ino, "b").is_none());
    assert_eq!(fs.sb.lookup(d.ino, "b").await.unwrap().size, 1);
    assert!(fake.head_object("d/b").await.is_ok());
}

/// A directory another tool made with a marker object (`dir/`) is empty when nothing else is under it: rmdir
/// deletes the marker (with --allow-delete), and refuses while something is inside.
#[tokio::test]
async fn rmdir_of_a_directory_with_a_marker_object_deletes_the_marker() {
    for directory in [true, false] {
        let keys: &[(&str, &[u8])] = &[("empty/", b""), ("full/", b""), ("full/x", b"1")];
        let mut c = config();
        c.allow_delete = true;
        let (fake, fs) = fs_with(keys, c, directory).await;
        fs.sb.lookup(ROOT_INO, "empty").await.unwrap();
        fs.sb.lookup(ROOT_INO, "full").await.unwrap();
        assert!(matches!(
            fs.sb.rmdir(ROOT_INO, "full").await,
            Err(FsError::NotEmpty)
        ));
        fs.sb.rmdir(ROOT_INO, "empty").await.unwrap();
        assert!(fake.object("empty/").is_none());
        assert!(fake.object("full/").is_some());
        assert!(matches!(
            fs.sb.lookup(ROOT_INO, "empty").await,
            Err(FsError::NotFound)
        ));
        // Without --allow-delete the marker stays, and so does the directory.
        let (fake, fs) = fs_with(keys, config(), directory).await;
        fs.sb.lookup(ROOT_INO, "empty").await.unwrap();
        assert!(matches!(
            fs.sb.rmdir(ROOT_INO, "empty").await,
            Err(FsError::NotPermitted(_))
        ));
        assert!(fake.object("empty/").is_some());
    }
}

/// A create in a directory that knows every name it holds asks nothing; a mkdir there still asks whether the
/// prefix holds keys (the new directory would otherwise know every name from a listing up to a TTL old), so a
/// directory another client made meanwhile is EEXIST, not an empty directory that hides its files. That
/// directory shows the listing was out of date: the directory no longer vouches for its names.
#[tokio::test]
async fn a_mkdir_in_a_directory_that_knows_every_name_still_asks() {
    for directory in [true, false] {
        let (fake, fs) = fs_with(&[("d/old", b"1")], config(), directory).await;
        let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
        let fh = fs.opendir(d.ino).unwrap();
        assert_eq!(fs.readdir(fh, 0).await.unwrap().len(), 3);
        fake.put_object("d/sub/x", Bytes::from_static(b"2"), WriteCondition::None)
            .await
            .unwrap();
        let lists = fake.count(Op::List);
        let (_, fh) = fs.create(d.ino, "new", 0).await.unwrap();
        fs.release(fh).await.unwrap();
        assert_eq!(fake.count(Op::List), lists, "the create asked nothing");
        assert!(matches!(
            fs.sb.mkdir(d.ino, "sub").await,
            Err(FsError::Exists)
        ));
        assert_eq!(fake.count(Op::List) - lists, 1);
        let (_, fh) = fs.create(d.ino, "newer", 0).await.unwrap();
        fs.release(fh).await.unwrap();
        assert!(fake.count(Op::List) - lists > 1, "the create asked again");
    }
}

/// `--directory-markers`: mkdir writes `dir/` before the directory shows; a failed PUT leaves no directory
/// behind, and a marker another client wrote first makes it EEXIST.
#[tokio::test]
async fn mkdir_with_markers_writes_the_marker_first() {
    for directory in [true, false] {
        let mut c = config();
        c.directory_markers = true;
        let (fake, fs) = fs_with(&[], c, directory).await;
        fs.sb.mkdir(ROOT_INO, "d").await.unwrap();
        assert_eq!(fake.object("d/").as_deref(), Some(&b""[..]));

        fake.faults()
            .fail_next(Op::Put, 1, crate::s3::fake::transient());
        assert!(fs.sb.mkdir(ROOT_INO, "failed").await.is_err());
        assert!(fake.object("failed/").is_none());
        assert!(matches!(
            fs.sb.lookup(ROOT_INO, "failed").await,
            Err(FsError::NotFound)
        ));

        // Made by another client between our lookup and our PUT.
        fake.faults().fail_next(
            Op::Put,
            1,
            crate::s3::ClientError::PreconditionFailed {
                key: "raced/".into(),
            },
        );
        assert!(matches!(
            fs.sb.mkdir(ROOT_INO, "raced").await,
            Err(FsError::Exists)
        ));
    }
}

/// A name whose key would pass S3's 1,024 bytes is refused when it is made (ENAMETOOLONG), not at close.
#[tokio::test]
async fn a_key_past_the_limit_is_refused_when_the_name_is_made() {
    let mut c = config();
    c.allow_overwrite = true;
    let (fake, fs) = fs_with(&[("short", b"s")], c, true).await;
    let mut dir = ROOT_INO;
    for i in 0..4 {
        dir = fs
            .sb
            .mkdir(dir, &format!("{i}{}", "d".repeat(249)))
            .await
            .unwrap()
            .ino;
    }
    // The directory's key is 4 x 251 = 1,004 bytes: 20 more fit, 21 do not.
    let fits = "f".repeat(20);
    let (attr, fh) = fs.create(dir, &fits, 0).await.unwrap();
    fs.release(fh).await.ok();
    assert_eq!(attr.size, 0);
    let long = "f".repeat(21);
    assert!(matches!(
        fs.create(dir, &long, 0).await,
        Err(FsError::NameTooLong)
    ));
    assert!(fs.sb.mkdir(dir, "ab").await.is_ok());
    assert!(matches!(
        fs.sb.mkdir(dir, &"m".repeat(20)).await,
        Err(FsError::NameTooLong)
    ));
    assert!(matches!(
        fs.sb.symlink(dir, &"l".repeat(10), b"short").await,
        Err(FsError::NameTooLong)
    ));
    assert!(matches!(
        fs.sb
            .rename(ROOT_INO, "short", dir, &long, false, &Default::default())
            .await,
        Err(FsError::NameTooLong)
    ));
    assert!(fake.object("short").is_some(), "nothing moved");
}

/// A name that stood for two things in the listing (a file and its link here) leaves the other in the bucket
/// when we remove the one shown: such a directory never answers for missing names.
#[tokio::test]
async fn a_directory_with_a_shadowed_name_asks_about_missing_names() {
    let mut c = config();
    c.allow_delete = true;
    let (_, fs) = fs_with(&[("d/x", b"1"), ("d/x.rclonelink", b"t")], c, true).await;
    let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
    let fh = fs.opendir(d.ino).unwrap();
    fs.readdir(fh, 0).await.unwrap();
    assert_eq!(fs.sb.lookup(d.ino, "x").await.unwrap().kind, FileKind::File);
    fs.unlink(d.ino, "x").await.unwrap();
    assert_eq!(
        fs.sb.lookup(d.ino, "x").await.unwrap().kind,
        FileKind::Symlink,
        "the link the file shadowed"
    );
}

/// A background listing that lands while one of our renames there is half done (the bucket renamed, the table
/// not yet) shows a name the table lacks; judged once the rename ends, it still renews what the directory
/// knows, so a name that is not there is missing without asking. (It used to count as not applied, and every
/// lookup asked the bucket for a TTL: rsync writing into a directory, on a loaded machine.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_landing_in_the_middle_of_a_rename_renews_the_directory_once_it_ends() {
    let (fake, fs) = fs_with(&[("d/a", b"1"), ("d/kept", b"2")], config(), true).await;
    let fs = Arc::new(fs);
    let dir = fs.sb.lookup(ROOT_INO, "d").await.unwrap().ino;
    fs.sb.lookup(dir, "a").await.unwrap();
    fs.sb.lookup(dir, "kept").await.unwrap();
    let gate = fake.faults().hold(Op::Rename);
    let rename = tokio::spawn({
        let fs = Arc::clone(&fs);
        async move { fs.rename(dir, "a", dir, "b", false).await }
    });
    while gate.held() == 0 {
        tokio::task::yield_now().await;
    }
    // The bucket has `b`, the table still `a`: a listing sent now shows a name the table does not have.
    let pages = loop {
        if let Some(pages) = fs.sb.storms.note_miss(dir, std::time::Instant::now()) {
            break pages;
        }
    };
    let landing = fs.sb.storms.landing(dir).expect("a listing under way");
    fs.sb
        .list_in_background(fs.sb.dir_node(dir).unwrap(), pages);
    tokio::time::sleep(Duration::from_millis(30)).await;
    gate.open();
    rename.await.unwrap().unwrap();
    assert_eq!(
        crate::fs::listing::landed(landing).await,
        Some(crate::fs::listing::Listed::Renewed { pages: 1 })
    );
    let before = fake.counts();
    assert!(matches!(
        fs.sb.lookup(dir, "nope").await,
        Err(FsError::NotFound)
    ));
    assert_eq!(fake.counts().since(&before).total(), 0, "known missing");
}

/// A directory made here and still empty exists only in the table: when the kernel forgets it past the
/// metadata TTL, it stays, and a lookup by name finds it (until it is removed, or the mount ends).
#[tokio::test]
async fn an_empty_directory_made_here_outlives_the_kernel_forgetting_it() {
    for directory in [true, false] {
        let mut c = config();
        c.metadata_ttl = Duration::from_millis(20);
        let (_, fs) = fs_with(&[], c, directory).await;
        let d = fs.sb.mkdir(ROOT_INO, "d").await.unwrap();
        tokio::time::sleep(Duration::from_millis(40)).await;
        fs.forget(d.ino, 1);
        let found = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
        assert_eq!((found.ino, found.kind), (d.ino, FileKind::Directory));
        let names: Vec<String> = fs
            .sb
            .entries(ROOT_INO)
            .await
            .unwrap()
            .iter()
            .map(|e| e.name.clone())
            .collect();
        assert!(names.contains(&"d".to_string()), "{names:?}");
        // One that holds a file is in the bucket: forgotten like any other, and found there again.
        let e = fs.sb.mkdir(ROOT_INO, "e").await.unwrap();
        let (_, fh) = fs.create(e.ino, "f", 1).await.unwrap();
        fs.release(fh).await.unwrap();
        tokio::time::sleep(Duration::from_millis(40)).await;
        fs.forget(e.ino, 1);
        assert!(fs.sb.table().get(e.ino).is_none(), "kept for ever");
        let found = fs.sb.lookup(ROOT_INO, "e").await.unwrap();
        assert_eq!(found.kind, FileKind::Directory);
    }
}

/// A name looked up missing, then made a directory by another client: mkdir and create here refuse it
/// (EEXIST), and a lookup then finds the directory instead of answering ENOENT from what it knew before.
#[tokio::test]
async fn a_name_refused_because_a_directory_appeared_is_then_found() {
    for directory in [true, false] {
        let (fake, fs) = fs_with(&[], config(), directory).await;
        for (n, make_dir) in [("x", true), ("y", false)] {
            assert!(matches!(
                fs.sb.lookup(ROOT_INO, n).await,
                Err(FsError::NotFound)
            ));
            fake.put_object(
                &format!("{n}/f"),
                Bytes::from_static(b"1"),
                WriteCondition::None,
            )
            .await
            .unwrap();
            let made = if make_dir {
                fs.sb.mkdir(ROOT_INO, n).await.map(drop)
            } else {
                fs.create(ROOT_INO, n, 1).await.map(drop)
            };
            assert!(matches!(made, Err(FsError::Exists)), "{n}: {made:?}");
            let found = fs.sb.lookup(ROOT_INO, n).await.unwrap();
            assert_eq!(found.kind, FileKind::Directory, "{n}");
        }
    }
}

/// A listing whose first page is empty but carries a continuation token has more to say: a directory
/// looked up is still found, and one that holds a file is not removed as empty.
#[tokio::test]
async fn an_empty_first_page_with_a_token_is_not_an_empty_directory() {
    for directory in [true, false] {
        let mut c = config();
        c.allow_delete = true;
        let (fake, fs) = fs_with(&[("d/x", b"1"), ("e/y", b"2")], c, directory).await;
        fake.faults().empty_first_pages(1);
        let d = fs.sb.lookup(ROOT_INO, "d").await.unwrap();
        assert_eq!(d.kind, FileKind::Directory);
        fs.sb.lookup(ROOT_INO, "e").await.unwrap();
        fake.faults().empty_first_pages(1);
        assert!(matches!(
            fs.sb.rmdir(ROOT_INO, "e").await,
            Err(FsError::NotEmpty)
        ));
        assert!(fake.object("e/y").is_some());
    }
}
