//! One suite of object-client behaviours, run against the in-memory `FakeClient` and against `SdkClient` on
//! the emulator, each on a directory bucket and a general-purpose bucket. The core's unit tests trust the
//! fake; this suite is what keeps the fake answering as the SDK client does (the emulator follows the real
//! service). Each behaviour is one `async fn` over `&dyn ObjectClient`; `conformance!` makes a module of four
//! tests for it (`fake_directory`, `fake_general`, `emulator_directory`, `emulator_general`).

mod common;

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use expressfs::s3::fake::FakeClient;
use expressfs::s3::sdk::{SdkClient, SdkClientConfig};
use expressfs::s3::{ClientError, ObjectClient, UploadedPart, UserMetadata, WriteCondition};

const MIB: usize = 1024 * 1024;

fn on_fake<F, Fut>(directory: bool, check: F)
where
    F: FnOnce(Arc<dyn ObjectClient>) -> Fut,
    Fut: Future<Output = ()>,
{
    let name = if directory { "fake--x-s3" } else { "fake" };
    let client: Arc<dyn ObjectClient> = Arc::new(FakeClient::new(name, directory));
    common::runtime().block_on(check(client));
}

fn on_emulator<F, Fut>(directory: bool, tag: &str, check: F)
where
    F: FnOnce(Arc<dyn ObjectClient>) -> Fut,
    Fut: Future<Output = ()>,
{
    let bucket = common::fresh_bucket(directory, tag);
    common::isolate_env();
    let mut config = SdkClientConfig::new(&bucket, common::REGION);
    config.endpoint_url = Some(common::emulator().endpoint_url());
    config.force_path_style = true;
    let client: Arc<dyn ObjectClient> = Arc::new(
        common::runtime()
            .block_on(SdkClient::new(config))
            .expect("client builds"),
    );
    common::runtime().block_on(check(client));
}

macro_rules! conformance {
    ($($check:ident),* $(,)?) => {
        $(
            mod $check {
                #[test]
                fn fake_directory() {
                    super::on_fake(true, super::$check);
                }
                #[test]
                fn fake_general() {
                    super::on_fake(false, super::$check);
                }
                #[test]
                fn emulator_directory() {
                    super::on_emulator(true, stringify!($check), super::$check);
                }
                #[test]
                fn emulator_general() {
                    super::on_emulator(false, stringify!($check), super::$check);
                }
            }
        )*
    };
}

conformance!(
    put_head_and_ranged_gets,
    reads_pinned_to_an_etag,
    conditional_puts,
    head_with_first_bytes,
    appends,
    listing_pages_and_delimiters,
    listing_prefix_rules,
    uploads_in_progress_in_listings,
    multipart_complete_and_abort,
    multipart_part_rules,
    delete_of_missing_keys,
    renames,
    copies,
    user_metadata,
);

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 * 31 + seed as u64) as u8)
        .collect()
}

/// NoSuchUpload: a failed write, not a missing object.
fn upload_gone(key: &str) -> ClientError {
    ClientError::UploadGone { key: key.into() }
}

fn not_found(key: &str) -> ClientError {
    ClientError::NotFound { key: key.into() }
}

fn precondition(key: &str) -> ClientError {
    ClientError::PreconditionFailed { key: key.into() }
}

/// A service error's status and code (its message is the server's prose, not part of the contract).
fn service_code<T: std::fmt::Debug>(result: Result<T, ClientError>) -> (u16, String) {
    match result {
        Err(ClientError::Service { status, code, .. }) => (status, code),
        other => panic!("expected a service error, got {other:?}"),
    }
}

async fn put(c: &dyn ObjectClient, key: &str, data: &[u8]) -> String {
    c.put_object(key, Bytes::copy_from_slice(data), WriteCondition::None)
        .await
        .unwrap()
        .etag
}

async fn put_head_and_ranged_gets(c: Arc<dyn ObjectClient>) {
    let c = &*c;
    c.head_bucket().await.unwrap();
    let data = pattern(1, 1000);
    let written = c
        .put_object("a/one", Bytes::from(data.clone()), WriteCondition::None)
        .await
        .unwrap();
    assert!(
        written.etag.starts_with('"') && written.etag.ends_with('"'),
        "{written:?}"
    );
    assert_eq!(written.size, Some(1000));
    let info = c.head_object("a/one").await.unwrap();
    assert_eq!(
        (info.key.as_str(), info.size, info.etag.as_str()),
        ("a/one", 1000, written.etag.as_str())
    );
    // Whole, ranged, clamped at the end; at or past the end and empty ranges give no bytes.
    assert_eq!(c.get_object("a/one", 0..1000, None).await.unwrap(), data);
    assert_eq!(
        c.get_object("a/one", 100..200, None).await.unwrap(),
        data[100..200]
    );
    assert_eq!(
        c.get_object("a/one", 900..5000, None).await.unwrap(),
        data[900..]
    );
    assert_eq!(
        c.get_object("a/one", 0..u64::MAX / 2, None).await.unwrap(),
        data
    );
    for empty in [1000..1100, 5000..6000, 7..7] {
        assert_eq!(
            c.get_object("a/one", empty.clone(), None).await,
            Ok(Bytes::new()),
            "{empty:?}"
        );
    }
    // A zero-byte object.
    put(c, "a/empty", b"").await;
    assert_eq!(c.head_object("a/empty").await.unwrap().size, 0);
    assert_eq!(c.get_object("a/empty", 0..10, None).await, Ok(Bytes::new()));
    // Missing keys.
    assert_eq!(c.head_object("never").await, Err(not_found("never")));
    assert_eq!(
        c.get_object("never", 0..1, None).await,
        Err(not_found("never"))
    );
}

async fn reads_pinned_to_an_etag(c: Arc<dyn ObjectClient>) {
    let c = &*c;
    let old = put(c, "k", b"first version").await;
    let new = put(c, "k", b"second").await;
    assert_ne!(old, new, "every write makes a new ETag");
    assert_eq!(
        c.get_object("k", 0..6, Some(&old)).await,
        Err(precondition("k"))
    );
    assert_eq!(
        c.get_object("k", 0..100, Some(&new)).await.unwrap(),
        &b"second"[..]
    );
    assert_eq!(
        c.get_object("gone", 0..1, Some(&new)).await,
        Err(not_found("gone"))
    );
}

async fn conditional_puts(c: Arc<dyn ObjectClient>) {
    let c = &*c;
    let first = put(c, "k", b"one").await;
    let body = || Bytes::from_static(b"two");
    assert_eq!(
        c.put_object("k", body(), WriteCondition::IfNoneMatch).await,
        Err(precondition("k"))
    );
    assert_eq!(
        c.put_object("k", body(), WriteCondition::IfMatch("\"nope\"".into()))
            .await,
        Err(precondition("k"))
    );
    assert_eq!(c.get_object("k", 0..10, None).await.unwrap(), &b"one"[..]);
    assert_eq!(
        c.put_object("new", body(), WriteCondition::IfMatch(first.clone()))
            .await,
        Err(not_found("new"))
    );
    assert_eq!(c.head_object("new").await, Err(not_found("new")));
    let created = c
        .put_object("new", body(), WriteCondition::IfNoneMatch)
        .await
        .unwrap();
    assert_eq!(created.size, Some(3));
    let replaced = c
        .put_object("k", body(), WriteCondition::IfMatch(first.clone()))
        .await
        .unwrap();
    assert_ne!(replaced.etag, first);
    assert_eq!(c.head_object("k").await.unwrap().etag, replaced.etag);
    assert_eq!(c.get_object("k", 0..10, None).await.unwrap(), &b"two"[..]);
}

async fn head_with_first_bytes(c: Arc<dyn ObjectClient>) {
    let c = &*c;
    let data = pattern(2, 5000);
    let etag = put(c, "f", &data).await;
    let (info, first) = c.head_with_first_bytes("f", 100).await.unwrap();
    assert_eq!((info.key.as_str(), info.size), ("f", 5000));
    assert_eq!(info.etag, etag);
    assert_eq!(first, data[..100]);
    let (info, all) = c.head_with_first_bytes("f", 10_000).await.unwrap();
    assert_eq!((info.size, all), (5000, Bytes::from(data)));
    put(c, "empty", b"").await;
    let (info, none) = c.head_with_first_bytes("empty", 100).await.unwrap();
    assert_eq!((info.size, none), (0, Bytes::new()));
    assert_eq!(
        c.head_with_first_bytes("missing", 100).await,
        Err(not_found("missing"))
    );
}

async fn appends(c: Arc<dyn ObjectClient>) {
    let c = &*c;
    let first = put(c, "log", b"hello ").await;
    let appended = c
        .append_object(
            "log",
            6,
            Bytes::from_static(b"world"),
            WriteCondition::IfMatch(first.clone()),
        )
        .await;
    if !c.is_directory_bucket() {
        assert!(
            matches!(appended, Err(ClientError::NotSupported(_))),
            "{appended:?}"
        );
        let fresh = c
            .append_object("new", 0, Bytes::from_static(b"a"), WriteCondition::None)
            .await;
        assert!(
            matches!(fresh, Err(ClientError::NotSupported(_))),
            "{fresh:?}"
        );
        assert_eq!(c.head_object("new").await, Err(not_found("new")));
        assert_eq!(
            c.get_object("log", 0..100, None).await.unwrap(),
            &b"hello "[..]
        );
        return;
    }
    let appended = appended.unwrap();
    assert_eq!(appended.size, Some(11));
    assert_ne!(appended.etag, first);
    assert_eq!(c.head_object("log").await.unwrap().etag, appended.etag);
    assert_eq!(
        c.get_object("log", 0..100, None).await.unwrap(),
        &b"hello world"[..]
    );
    // An empty append is refused, as S3 Express refuses it, and changes nothing.
    let empty = c
        .append_object("log", 11, Bytes::new(), WriteCondition::None)
        .await;
    assert!(
        matches!(empty, Err(ClientError::Service { status: 400, ref code, .. }) if code == "InvalidRequest"),
        "{empty:?}"
    );
    assert_eq!(c.head_object("log").await.unwrap().etag, appended.etag);
    // A wrong offset and a stale ETag change nothing.
    let wrong = c
        .append_object("log", 3, Bytes::from_static(b"!"), WriteCondition::None)
        .await;
    assert!(
        matches!(wrong, Err(ClientError::InvalidWriteOffset { ref key, .. }) if key == "log"),
        "{wrong:?}"
    );
    let stale = c
        .append_object(
            "log",
            11,
            Bytes::from_static(b"!"),
            WriteCondition::IfMatch(first),
        )
        .await;
    assert_eq!(stale, Err(precondition("log")));
    assert_eq!(
        c.get_object("log", 0..100, None).await.unwrap(),
        &b"hello world"[..]
    );
    // Offset 0 creates a missing object; any other offset does not.
    let missing = c
        .append_object("new", 5, Bytes::from_static(b"abc"), WriteCondition::None)
        .await;
    assert!(
        matches!(missing, Err(ClientError::InvalidWriteOffset { .. })),
        "{missing:?}"
    );
    let created = c
        .append_object("new", 0, Bytes::from_static(b"abc"), WriteCondition::None)
        .await
        .unwrap();
    assert_eq!(created.size, Some(3));
    assert_eq!(c.get_object("new", 0..3, None).await.unwrap(), &b"abc"[..]);
}

/// Every page of a listing, merged: objects (key, size) and common prefixes, each sorted. Checks the page
/// size on the way and, on general-purpose buckets, that no common prefix comes twice.
async fn list_all(
    c: &dyn ObjectClient,
    prefix: &str,
    delimiter: Option<&str>,
    max_keys: i32,
) -> (Vec<(String, u64)>, Vec<String>, usize) {
    let mut objects = Vec::new();
    let mut prefixes = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = c
            .list_objects(prefix, delimiter, token.as_deref(), max_keys)
            .await
            .unwrap();
        pages += 1;
        assert!(
            page.objects.len() + page.common_prefixes.len() <= max_keys as usize,
            "page over max-keys: {page:?}"
        );
        objects.extend(page.objects.into_iter().map(|o| (o.key, o.size)));
        prefixes.extend(page.common_prefixes);
        token = page.next_continuation_token;
        if token.is_none() {
            break;
        }
        assert!(pages < 50, "listing does not end");
    }
    objects.sort();
    prefixes.sort();
    let before = prefixes.len();
    prefixes.dedup();
    if !c.is_directory_bucket() {
        assert_eq!(prefixes.len(), before, "a common prefix came twice");
    }
    (objects, prefixes, pages)
}

async fn listing_pages_and_delimiters(c: Arc<dyn ObjectClient>) {
    let c = &*c;
    let empty = c.list_objects("", Some("/"), None, 1000).await.unwrap();
    assert!(
        empty.objects.is_empty()
            && empty.common_prefixes.is_empty()
            && empty.next_continuation_token.is_none(),
        "{empty:?}"
    );
    let keys = [
        "l/a/1", "l/a/2", "l/b", "l/c", "l/d/x/y", "l/e", "l/f", "other",
    ];
    for (i, key) in keys.iter().enumerate() {
        put(c, key, &vec![b'k'; i + 1]).await;
    }
    let files = |names: &[(&str, u64)]| -> Vec<(String, u64)> {
        names.iter().map(|(k, s)| (k.to_string(), *s)).collect()
    };
    let (objects, prefixes, pages) = list_all(c, "l/", Some("/"), 2).await;
    assert!(pages >= 3, "expected several pages, got {pages}");
    assert_eq!(
        objects,
        files(&[("l/b", 3), ("l/c", 4), ("l/e", 6), ("l/f", 7)])
    );
    assert_eq!(prefixes, ["l/a/", "l/d/"]);
    let one_by_one = list_all(c, "l/", Some("/"), 1).await;
    assert_eq!((one_by_one.0, one_by_one.1), (objects, prefixes));
    // From the root, and one level down.
    let (objects, prefixes, _) = list_all(c, "", Some("/"), 1000).await;
    assert_eq!(objects, files(&[("other", 8)]));
    assert_eq!(prefixes, ["l/"]);
    let (objects, prefixes, _) = list_all(c, "l/d/", Some("/"), 1000).await;
    assert!(objects.is_empty(), "{objects:?}");
    assert_eq!(prefixes, ["l/d/x/"]);
    // Without a delimiter: every key under the prefix, in pages of one too.
    let (all, none, _) = list_all(c, "l/", None, 1).await;
    assert!(none.is_empty(), "{none:?}");
    let want: Vec<(String, u64)> = keys[..7]
        .iter()
        .enumerate()
        .map(|(i, k)| (k.to_string(), i as u64 + 1))
        .collect();
    assert_eq!(all, want);
    // Listed entries carry what a HEAD says.
    let page = c.list_objects("l/", Some("/"), None, 1000).await.unwrap();
    let listed = page.objects.iter().find(|o| o.key == "l/b").unwrap();
    let head = c.head_object("l/b").await.unwrap();
    assert_eq!((listed.size, &listed.etag), (head.size, &head.etag));
}

async fn listing_prefix_rules(c: Arc<dyn ObjectClient>) {
    let c = &*c;
    put(c, "p/ab/1", b"1").await;
    put(c, "p/ac", b"2").await;
    let partial = c.list_objects("p/a", Some("/"), None, 1000).await;
    if c.is_directory_bucket() {
        // Directory buckets take only prefixes that end in the delimiter.
        assert_eq!(service_code(partial), (400, "InvalidArgument".into()));
        let undelimited = c.list_objects("p/a", None, None, 1000).await;
        assert_eq!(service_code(undelimited), (400, "InvalidArgument".into()));
    } else {
        let page = partial.unwrap();
        assert_eq!(page.common_prefixes, ["p/ab/"]);
        let keys: Vec<&str> = page.objects.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["p/ac"]);
    }
}

async fn uploads_in_progress_in_listings(c: Arc<dyn ObjectClient>) {
    let c = &*c;
    put(c, "up/file", b"1").await;
    let id = c.create_multipart_upload("up/x/obj").await.unwrap();
    let id2 = c.create_multipart_upload("up/top").await.unwrap();
    let (objects, prefixes, _) = list_all(c, "up/", Some("/"), 1000).await;
    assert_eq!(objects, [("up/file".to_string(), 1)]);
    // Directory buckets show the key of an upload in progress as a common prefix (never as an object).
    if c.is_directory_bucket() {
        assert_eq!(prefixes, ["up/x/"]);
    } else {
        assert!(prefixes.is_empty(), "{prefixes:?}");
    }
    let (objects, _, _) = list_all(c, "up/", None, 1000).await;
    assert_eq!(objects, [("up/file".to_string(), 1)]);
    c.abort_multipart_upload("up/x/obj", &id).await.unwrap();
    c.abort_multipart_upload("up/top", &id2).await.unwrap();
    let (_, prefixes, _) = list_all(c, "up/", Some("/"), 1000).await;
    assert!(prefixes.is_empty(), "{prefixes:?}");
}

async fn upload_parts(
    c: &dyn ObjectClient,
    key: &str,
    id: &str,
    parts: &[(i32, &[u8])],
) -> Vec<UploadedPart> {
    let mut out = Vec::new();
    for (n, body) in parts {
        let part = c
            .upload_part(key, id, *n, Bytes::copy_from_slice(body))
            .await
            .unwrap();
        assert_eq!(part.part_number, *n);
        assert!(!part.etag.is_empty());
        out.push(part);
    }
    out
}

async fn multipart_complete_and_abort(c: Arc<dyn ObjectClient>) {
    let c = &*c;
    let data = pattern(3, 5 * MIB + 123);
    let id = c.create_multipart_upload("m/obj").await.unwrap();
    let parts = upload_parts(
        c,
        "m/obj",
        &id,
        &[(1, &data[..5 * MIB]), (2, &data[5 * MIB..])],
    )
    .await;
    // Not visible until completed.
    assert_eq!(c.head_object("m/obj").await, Err(not_found("m/obj")));
    let done = c
        .complete_multipart_upload("m/obj", &id, parts.clone(), WriteCondition::IfNoneMatch)
        .await
        .unwrap();
    assert!(!done.etag.is_empty());
    assert!(done.size.is_none_or(|s| s == data.len() as u64), "{done:?}");
    let info = c.head_object("m/obj").await.unwrap();
    assert_eq!((info.size, &info.etag), (data.len() as u64, &done.etag));
    assert!(c.get_object("m/obj", 0..info.size, None).await.unwrap() == data);
    // Completed again with the same parts (a retry whose answer was lost), S3 gives the same answer; with
    // other parts, the upload is gone.
    let again = c
        .complete_multipart_upload("m/obj", &id, parts.clone(), WriteCondition::None)
        .await
        .unwrap();
    assert_eq!(again.etag, done.etag);
    assert_eq!(
        c.complete_multipart_upload("m/obj", &id, parts[..1].to_vec(), WriteCondition::None)
            .await,
        Err(upload_gone("m/obj"))
    );

    // A second upload with If-None-Match is refused and stays open until aborted.
    let id2 = c.create_multipart_upload("m/obj").await.unwrap();
    let small = upload_parts(c, "m/obj", &id2, &[(1, b"small")]).await;
    assert_eq!(
        c.complete_multipart_upload("m/obj", &id2, small.clone(), WriteCondition::IfNoneMatch)
            .await,
        Err(precondition("m/obj"))
    );
    assert_eq!(c.head_object("m/obj").await.unwrap().etag, info.etag);
    // An upload is bound to its key.
    assert_eq!(
        c.upload_part("m/other", &id2, 2, Bytes::from_static(b"x"))
            .await,
        Err(upload_gone("m/other"))
    );
    c.abort_multipart_upload("m/obj", &id2).await.unwrap();
    assert_eq!(
        c.abort_multipart_upload("m/obj", &id2).await,
        Err(upload_gone("m/obj"))
    );
    assert_eq!(
        c.upload_part("m/obj", &id2, 2, Bytes::from_static(b"x"))
            .await,
        Err(upload_gone("m/obj"))
    );
    assert_eq!(
        c.complete_multipart_upload("m/obj", &id2, small, WriteCondition::None)
            .await,
        Err(upload_gone("m/obj"))
    );
    assert_eq!(c.head_object("m/obj").await.unwrap().etag, info.etag);
}

async fn multipart_part_rules(c: Arc<dyn ObjectClient>) {
    let c = &*c;
    let big = pattern(4, 5 * MIB);
    let id = c.create_multipart_upload("r/obj").await.unwrap();
    assert_eq!(
        service_code(
            c.upload_part("r/obj", &id, 10_001, Bytes::from_static(b"x"))
                .await
        ),
        (400, "InvalidArgument".into())
    );
    let parts = upload_parts(c, "r/obj", &id, &[(1, &big), (2, b"end"), (4, b"four")]).await;
    let (p1, p2, p4) = (&parts[0], &parts[1], &parts[2]);
    let complete = |list: Vec<&UploadedPart>| {
        let list: Vec<UploadedPart> = list.into_iter().cloned().collect();
        c.complete_multipart_upload("r/obj", &id, list, WriteCondition::None)
    };
    // Only the last part may be under 5 MiB.
    assert_eq!(
        service_code(complete(vec![p1, p2, p4]).await),
        (400, "EntityTooSmall".into())
    );
    // Part numbers go up strictly (each part is checked in turn: order, then presence, then size).
    assert_eq!(
        service_code(complete(vec![p1, p1]).await),
        (400, "InvalidPartOrder".into())
    );
    // A part named with another part's ETag.
    let mut renumbered = p2.clone();
    renumbered.part_number = 1;
    assert_eq!(
        service_code(complete(vec![&renumbered]).await),
        (400, "InvalidPart".into())
    );
    // A part never uploaded (on directory buckets the numbering rule answers first).
    let mut ghost = p4.clone();
    ghost.part_number = 3;
    let never = service_code(complete(vec![&ghost]).await);
    // Directory buckets also need consecutive numbers from 1.
    let gap = complete(vec![p1, p4]).await;
    if c.is_directory_bucket() {
        assert_eq!(never, (400, "InvalidPartOrder".into()));
        assert_eq!(service_code(gap), (400, "InvalidPartOrder".into()));
        assert_eq!(c.head_object("r/obj").await, Err(not_found("r/obj")));
        c.abort_multipart_upload("r/obj", &id).await.unwrap();
    } else {
        assert_eq!(never, (400, "InvalidPart".into()));
        gap.unwrap();
        let mut want = big.clone();
        want.extend_from_slice(b"four");
        assert!(
            c.get_object("r/obj", 0..10 * MIB as u64, None)
                .await
                .unwrap()
                == want
        );
    }
}

async fn delete_of_missing_keys(c: Arc<dyn ObjectClient>) {
    let c = &*c;
    c.delete_object("never/was").await.unwrap();
    put(c, "d/k", b"v").await;
    c.delete_object("d/k").await.unwrap();
    assert_eq!(c.head_object("d/k").await, Err(not_found("d/k")));
    assert_eq!(c.get_object("d/k", 0..1, None).await, Err(not_found("d/k")));
    c.delete_object("d/k").await.unwrap();
    // Deleting a "directory" prefix deletes no object under it.
    put(c, "d/x/y", b"v").await;
    c.delete_object("d/x").await.unwrap();
    c.delete_object("d/x/").await.unwrap();
    assert_eq!(c.head_object("d/x/y").await.unwrap().size, 1);
}

async fn renames(c: Arc<dyn ObjectClient>) {
    let c = &*c;
    let data = pattern(5, 70_000);
    let etag = put(c, "src/a", &data).await;
    let written = c.head_object("src/a").await.unwrap().last_modified;
    // Past the second Last-Modified is given in, so that a rename that dated the object anew would show.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let moved = c
        .rename_object("src/a", "dst/b", WriteCondition::IfNoneMatch)
        .await;
    if !c.is_directory_bucket() {
        assert!(
            matches!(moved, Err(ClientError::NotSupported(_))),
            "{moved:?}"
        );
        assert_eq!(c.head_object("src/a").await.unwrap().etag, etag);
        assert_eq!(c.head_object("dst/b").await, Err(not_found("dst/b")));
        return;
    }
    moved.unwrap();
    assert_eq!(c.head_object("src/a").await, Err(not_found("src/a")));
    let info = c.head_object("dst/b").await.unwrap();
    assert_eq!(
        (info.size, &info.etag),
        (70_000, &etag),
        "renaming keeps the ETag"
    );
    assert_eq!(info.last_modified, written, "renaming keeps the date");
    assert!(c.get_object("dst/b", 0..70_000, None).await.unwrap() == data);

    // Refused onto an existing destination with If-None-Match: both stay as they were.
    let kept = put(c, "dst/c", b"keep").await;
    assert_eq!(
        c.rename_object("dst/b", "dst/c", WriteCondition::IfNoneMatch)
            .await,
        Err(precondition("dst/c"))
    );
    assert_eq!(
        c.rename_object("dst/b", "dst/c", WriteCondition::IfMatch("\"nope\"".into()))
            .await,
        Err(precondition("dst/c"))
    );
    assert_eq!(
        c.get_object("dst/c", 0..10, None).await.unwrap(),
        &b"keep"[..]
    );
    assert_eq!(c.head_object("dst/b").await.unwrap().etag, etag);
    // If-Match on a destination that does not exist: the service's NoSuchKey, reported on the source.
    assert_eq!(
        c.rename_object("dst/b", "dst/none", WriteCondition::IfMatch(kept.clone()))
            .await,
        Err(not_found("dst/b"))
    );
    // Replacing with the destination's ETag works.
    c.rename_object("dst/b", "dst/c", WriteCondition::IfMatch(kept))
        .await
        .unwrap();
    assert!(c.get_object("dst/c", 0..70_000, None).await.unwrap() == data);
    assert_eq!(c.head_object("dst/b").await, Err(not_found("dst/b")));
    // Onto itself: nothing changes.
    c.rename_object("dst/c", "dst/c", WriteCondition::None)
        .await
        .unwrap();
    assert_eq!(c.head_object("dst/c").await.unwrap().etag, etag);
    // A missing source, whatever the destination.
    for dest in ["dst/z", "dst/c"] {
        assert_eq!(
            c.rename_object("nothing/here", dest, WriteCondition::IfNoneMatch)
                .await,
            Err(not_found("nothing/here"))
        );
    }
}

async fn copies(c: Arc<dyn ObjectClient>) {
    let c = &*c;
    let data = pattern(7, 70_000);
    put(c, "src/a", &data).await;
    let copied = c
        .copy_object("src/a", None, "dst/b", WriteCondition::None)
        .await
        .unwrap();
    // The source stays; the copy has the same bytes and reports the ETag a HEAD then shows.
    assert_eq!(c.head_object("src/a").await.unwrap().size, 70_000);
    let info = c.head_object("dst/b").await.unwrap();
    assert_eq!((info.size, &info.etag), (70_000, &copied.etag));
    assert!(c.get_object("dst/b", 0..70_000, None).await.unwrap() == data);

    // Unconditional: replaces an existing destination.
    put(c, "dst/c", b"old").await;
    c.copy_object("src/a", None, "dst/c", WriteCondition::None)
        .await
        .unwrap();
    assert_eq!(c.head_object("dst/c").await.unwrap().size, 70_000);

    // If-None-Match refuses an existing destination and leaves it as it was; a free one is written.
    put(c, "dst/d", b"keep").await;
    assert_eq!(
        c.copy_object("src/a", None, "dst/d", WriteCondition::IfNoneMatch)
            .await,
        Err(precondition("dst/d"))
    );
    assert_eq!(
        c.get_object("dst/d", 0..10, None).await.unwrap(),
        &b"keep"[..]
    );
    c.copy_object("src/a", None, "dst/e", WriteCondition::IfNoneMatch)
        .await
        .unwrap();
    assert_eq!(c.head_object("dst/e").await.unwrap().size, 70_000);

    // If-Match on the destination: refused unless it is the version named.
    let current = c.head_object("dst/d").await.unwrap().etag;
    assert_eq!(
        c.copy_object(
            "src/a",
            None,
            "dst/d",
            WriteCondition::IfMatch("\"nope\"".into())
        )
        .await,
        Err(precondition("dst/d"))
    );
    c.copy_object("src/a", None, "dst/d", WriteCondition::IfMatch(current))
        .await
        .unwrap();
    assert_eq!(c.head_object("dst/d").await.unwrap().size, 70_000);

    // A missing source names the source key and writes nothing.
    assert_eq!(
        c.copy_object("src/none", None, "dst/f", WriteCondition::None)
            .await,
        Err(not_found("src/none"))
    );
    assert_eq!(c.head_object("dst/f").await, Err(not_found("dst/f")));

    // A pinned source: copied only while it is that version, else refused naming the source.
    let source = c.head_object("src/a").await.unwrap().etag;
    assert_eq!(
        c.copy_object("src/a", Some("\"nope\""), "dst/g", WriteCondition::None)
            .await,
        Err(precondition("src/a"))
    );
    assert_eq!(c.head_object("dst/g").await, Err(not_found("dst/g")));
    c.copy_object("src/a", Some(&source), "dst/g", WriteCondition::None)
        .await
        .unwrap();
    assert_eq!(c.head_object("dst/g").await.unwrap().size, 70_000);
}

fn meta(pairs: &[(&str, &str)]) -> UserMetadata {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

async fn user_metadata(c: Arc<dyn ObjectClient>) {
    let c = &*c;
    let first = meta(&[("mtime", "1700000000"), ("mode", "33188")]);
    let put = c
        .put_object_with_metadata(
            "m/a",
            Bytes::from_static(b"hello"),
            WriteCondition::None,
            &first,
        )
        .await
        .unwrap();
    // HEAD and the lookup's first-bytes GET both carry it; a listing carries none.
    let head = c.head_object("m/a").await.unwrap();
    assert_eq!((&head.metadata, &head.etag), (&first, &put.etag));
    let (info, bytes) = c.head_with_first_bytes("m/a", 3).await.unwrap();
    assert_eq!((&info.metadata, &bytes[..]), (&first, &b"hel"[..]));
    let page = c.list_objects("m/", Some("/"), None, 1000).await.unwrap();
    assert_eq!(page.objects.len(), 1);
    assert!(page.objects[0].metadata.is_empty());
    // A plain PutObject stores none.
    put_plain(c, "m/plain").await;
    assert!(c.head_object("m/plain").await.unwrap().metadata.is_empty());

    // Replaced server-side only while the ETag matches; the bytes stay and the ETag changes.
    let second = meta(&[("mtime", "1600000000.5"), ("uid", "1000")]);
    assert_eq!(
        c.replace_metadata("m/a", &second, "\"nope\"").await,
        Err(precondition("m/a"))
    );
    assert_eq!(c.head_object("m/a").await.unwrap().metadata, first);
    let replaced = c.replace_metadata("m/a", &second, &put.etag).await.unwrap();
    let head = c.head_object("m/a").await.unwrap();
    assert_eq!((&head.metadata, &head.etag), (&second, &replaced.etag));
    assert_eq!(
        c.get_object("m/a", 0..10, None).await.unwrap(),
        &b"hello"[..]
    );
    assert_eq!(
        c.replace_metadata("m/none", &second, &put.etag).await,
        Err(not_found("m/none"))
    );

    // A multipart upload's object carries the metadata it was created with.
    let id = c
        .create_multipart_upload_with_metadata("m/big", &first)
        .await
        .unwrap();
    let part = c
        .upload_part("m/big", &id, 1, Bytes::from_static(b"tail"))
        .await
        .unwrap();
    c.complete_multipart_upload("m/big", &id, vec![part], WriteCondition::None)
        .await
        .unwrap();
    assert_eq!(c.head_object("m/big").await.unwrap().metadata, first);

    // Appends (directory buckets) keep the object's metadata.
    if c.is_directory_bucket() {
        let etag = c.head_object("m/a").await.unwrap().etag;
        c.append_object(
            "m/a",
            5,
            Bytes::from_static(b"!"),
            WriteCondition::IfMatch(etag),
        )
        .await
        .unwrap();
        assert_eq!(c.head_object("m/a").await.unwrap().metadata, second);
    }
}

async fn put_plain(c: &dyn ObjectClient, key: &str) {
    put(c, key, b"x").await;
}
