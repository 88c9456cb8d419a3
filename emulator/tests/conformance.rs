//! Conformance of the emulator as the real aws-sdk-s3 client sees it: authentication and S3 Express
//! sessions, directory-bucket listing rules, ranges, conditional requests, multipart rules, appends,
//! RenameObject, and streaming of large objects without memory growth. Each test runs its own in-process
//! emulator on 127.0.0.1 with a throwaway data directory and explicit credentials.

use std::error::Error as _;
use std::time::{Duration, Instant};

use aws_sdk_s3::Client;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::{Credentials, Region};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::operation::complete_multipart_upload::CompleteMultipartUploadError as CompleteError;
use aws_sdk_s3::operation::complete_multipart_upload::CompleteMultipartUploadOutput as CompleteOutput;
use aws_sdk_s3::operation::create_session::CreateSessionError;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use expressfs_emulator::{Emulator, EmulatorConfig};

const AK: &str = "AKIDCONFORMANCE";
const SK: &str = "conformance-secret";
const DIR: &str = "base--use1-az4--x-s3";
const GP: &str = "conformance-general";
const MIB: usize = 1024 * 1024;

/// A running emulator plus the data directory it writes to (kept alive as long as the emulator).
struct Env {
    emu: Emulator,
    _data: tempfile::TempDir,
}

fn start(session_ttl: Duration) -> Env {
    // SAFETY: called first in every test; all tests write the same constant, so racing writers agree.
    // Without it the SDK could probe the EC2 metadata service for region/credentials.
    unsafe { std::env::set_var("AWS_EC2_METADATA_DISABLED", "true") };
    let data = tempfile::TempDir::new().unwrap();
    let emu = Emulator::start_background(EmulatorConfig {
        data_dir: data.path().to_path_buf(),
        buckets: vec![DIR.into(), GP.into()],
        access_key: AK.into(),
        secret_key: SK.into(),
        region: "us-east-1".into(),
        session_ttl,
        ..Default::default()
    })
    .unwrap();
    Env { emu, _data: data }
}

/// `express = false` disables S3 Express session auth: directory-bucket requests are then plain SigV4.
fn client_as(env: &Env, access_key: &str, secret: &str, express: bool) -> Client {
    let conf = aws_sdk_s3::config::Builder::new()
        .behavior_version_latest()
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            access_key,
            secret,
            None,
            None,
            "conformance",
        ))
        .endpoint_url(env.emu.endpoint_url())
        .force_path_style(true)
        .disable_s3_express_session_auth(!express)
        .build();
    Client::from_conf(conf)
}

fn client(env: &Env) -> Client {
    client_as(env, AK, SK, true)
}

/// HTTP status behind an SDK error. When the failure happened inside the S3 Express identity provider
/// (CreateSession refused), the outer error has no response, so the CreateSession error is dug out of the
/// source chain.
fn status<E: std::error::Error + 'static>(e: &SdkError<E, HttpResponse>) -> u16 {
    if let Some(r) = e.raw_response() {
        return r.status().as_u16();
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = e.source();
    while let Some(err) = cur {
        if let Some(inner) = err.downcast_ref::<SdkError<CreateSessionError, HttpResponse>>() {
            return status(inner);
        }
        cur = err.source();
    }
    panic!("no HTTP response behind error: {e:?}");
}

fn code<E: ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> String {
    let service = e.as_service_error();
    service.and_then(|s| s.code()).unwrap_or("").to_string()
}

/// Asserts HTTP status and (unless `want_code` is empty) the S3 error code of a failed request.
#[track_caller]
fn expect<T: std::fmt::Debug, E>(
    r: Result<T, SdkError<E, HttpResponse>>,
    want: (u16, &str),
    what: &str,
) where
    E: std::error::Error + ProvideErrorMetadata + 'static,
{
    let e = r.expect_err(what);
    assert_eq!(status(&e), want.0, "{what}: {e:?}");
    if !want.1.is_empty() {
        assert_eq!(code(&e), want.1, "{what}: {e:?}");
    }
}

async fn put(c: &Client, bucket: &str, key: &str, body: Vec<u8>) -> String {
    let req = c.put_object().bucket(bucket).key(key);
    let out = req.body(ByteStream::from(body)).send().await;
    out.unwrap_or_else(|e| panic!("put {bucket}/{key}: {e:?}"))
        .e_tag
        .unwrap()
}

async fn get(c: &Client, bucket: &str, key: &str) -> Vec<u8> {
    let out = c.get_object().bucket(bucket).key(key).send().await;
    let out = out.unwrap_or_else(|e| panic!("get {bucket}/{key}: {e:?}"));
    out.body.collect().await.unwrap().into_bytes().to_vec()
}

/// Admin endpoints are plain unauthenticated HTTP; HTTP/1.0 so the server closes after answering.
fn admin(env: &Env, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(env.emu.addr()).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", env.emu.addr()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    body.to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_credentials_are_refused() {
    let env = start(Duration::from_secs(300));
    let wrong_secret = client_as(&env, AK, "not-the-secret", true);
    let unknown_key = client_as(&env, "AKIDUNKNOWN", SK, true);

    // General bucket: plain SigV4, the error comes straight back.
    let r = wrong_secret.list_objects_v2().bucket(GP).send().await;
    expect(r, (403, "SignatureDoesNotMatch"), "wrong secret");
    let r = unknown_key.get_object().bucket(GP).key("x").send().await;
    expect(r, (403, "InvalidAccessKeyId"), "unknown key");

    // Directory bucket: the SDK first calls CreateSession, which is itself refused with 403.
    for (c, want) in [
        (&wrong_secret, "SignatureDoesNotMatch"),
        (&unknown_key, "InvalidAccessKeyId"),
    ] {
        expect(
            c.list_objects_v2().bucket(DIR).send().await,
            (403, ""),
            want,
        );
        expect(
            c.get_object().bucket(DIR).key("x").send().await,
            (403, ""),
            want,
        );
        // Calling CreateSession directly shows the error code.
        expect(
            c.create_session().bucket(DIR).send().await,
            (403, want),
            want,
        );
    }
    // Sanity: the right keys work against both.
    let good = client(&env);
    good.list_objects_v2().bucket(GP).send().await.unwrap();
    good.list_objects_v2().bucket(DIR).send().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn directory_bucket_needs_a_session() {
    let env = start(Duration::from_secs(300));
    let plain = client_as(&env, AK, SK, false);
    let r = plain.get_object().bucket(DIR).key("x").send().await;
    expect(r, (403, "AccessDenied"), "get without session");
    let r = plain.list_objects_v2().bucket(DIR).send().await;
    expect(r, (403, "AccessDenied"), "list without session");
    // CreateBucket is a regional (control plane) call signed with the long-term keys.
    let other = "other--use1-az4--x-s3";
    plain.create_bucket().bucket(other).send().await.unwrap();
    // ... and the new bucket is usable through sessions.
    put(&client(&env), other, "k", b"v".to_vec()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_refresh_with_short_ttl() {
    let env = start(Duration::from_secs(2));
    let c = client(&env);
    let started = Instant::now();
    let mut round = 0u32;
    while started.elapsed() < Duration::from_secs(10) {
        let key = format!("s/{round}");
        let body = format!("round {round}").into_bytes();
        put(&c, DIR, &key, body.clone()).await;
        assert_eq!(get(&c, DIR, &key).await, body);
        let listed = c.list_objects_v2().bucket(DIR).prefix("s/").send().await;
        let listed = listed.unwrap_or_else(|e| panic!("list at {:?}: {e:?}", started.elapsed()));
        assert_eq!(listed.key_count(), Some(round as i32 + 1));
        round += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(round >= 20, "only {round} rounds");
    let stats: serde_json::Value = serde_json::from_str(&admin(&env, "/_emulator/stats")).unwrap();
    let dir = &stats[DIR];
    let sessions = dir["CreateSession"]["requests"].as_u64().unwrap_or(0);
    assert!(sessions >= 3, "{sessions} sessions in 10 s: {stats}");
    assert_eq!(dir["GetObject"]["errors"].as_u64(), Some(0), "{stats}");
}

/// Pages through ListObjectsV2; returns (objects, common prefixes) in the order received.
async fn list_all(
    c: &Client,
    bucket: &str,
    prefix: &str,
    delimiter: Option<&str>,
    max_keys: i32,
) -> (Vec<String>, Vec<String>) {
    let (mut objects, mut prefixes, mut token) = (Vec::new(), Vec::new(), None);
    loop {
        let req = c.list_objects_v2().bucket(bucket).prefix(prefix);
        let req = req.set_delimiter(delimiter.map(str::to_string));
        let page = req.max_keys(max_keys).set_continuation_token(token);
        let page = page.send().await.unwrap();
        let n = page.contents().len() + page.common_prefixes().len();
        assert_eq!(page.key_count(), Some(n as i32), "{bucket}");
        assert!(n <= max_keys as usize, "{bucket}: {n} > {max_keys}");
        objects.extend(page.contents().iter().map(|o| o.key().unwrap().to_string()));
        prefixes.extend(
            page.common_prefixes()
                .iter()
                .map(|p| p.prefix().unwrap().into()),
        );
        let more = page.next_continuation_token.is_some();
        assert_eq!(page.is_truncated(), Some(more));
        token = page.next_continuation_token;
        if token.is_none() {
            return (objects, prefixes);
        }
    }
}

fn sorted(v: &[String]) -> Vec<String> {
    let mut s = v.to_vec();
    s.sort();
    s
}

#[tokio::test(flavor = "multi_thread")]
async fn listing_rules_and_pagination() {
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    // 50 keys under p/: 44 direct, 3 under p/d1/, 3 under p/d2/ (one two levels deep).
    let mut keys: Vec<String> = (0..44).map(|i| format!("p/k{i:02}")).collect();
    keys.extend(["p/d1/a", "p/d1/b", "p/d1/c", "p/d2/a", "p/d2/b", "p/d2/x/y"].map(String::from));
    let direct: Vec<String> = keys[..44].to_vec();
    for bucket in [DIR, GP] {
        for k in &keys {
            put(&c, bucket, k, k.as_bytes().to_vec()).await;
        }
    }

    // Directory-bucket restrictions.
    let list = || c.list_objects_v2().bucket(DIR);
    let r = list().delimiter("|").send().await;
    expect(r, (400, "InvalidArgument"), "delimiter |");
    expect(
        list().prefix("p").delimiter("/").send().await,
        (400, ""),
        "p",
    );
    let r = list().prefix("p/").start_after("p/k01").send().await;
    expect(r, (400, ""), "start-after");

    // Directory bucket, delimited pages: each object once; prefixes may repeat, but dedupe to the set.
    let (objects, prefixes) = list_all(&c, DIR, "p/", Some("/"), 7).await;
    assert_eq!(objects.len(), direct.len(), "{objects:?}");
    assert_eq!(sorted(&objects), direct);
    let mut uniq = sorted(&prefixes);
    uniq.dedup();
    assert_eq!(uniq, ["p/d1/", "p/d2/"]);
    // Without a delimiter: every key, in hash order rather than sorted.
    let (all, none) = list_all(&c, DIR, "p/", None, 1000).await;
    assert!(none.is_empty());
    assert_eq!(sorted(&all), sorted(&keys));
    assert_ne!(all, sorted(&keys), "directory bucket listing is sorted");
    let (paged, _) = list_all(&c, DIR, "p/", None, 7).await;
    assert_eq!(sorted(&paged), sorted(&keys));

    // General bucket: sorted, prefixes never repeat across pages.
    let (objects, prefixes) = list_all(&c, GP, "p/", Some("/"), 7).await;
    assert_eq!(objects, direct);
    assert_eq!(prefixes, ["p/d1/", "p/d2/"]);
    let (all, _) = list_all(&c, GP, "", None, 7).await;
    assert_eq!(all, sorted(&keys));
    let after = c.list_objects_v2().bucket(GP).start_after("p/k40");
    let after = after.send().await.unwrap();
    let after: Vec<_> = after.contents().iter().map(|o| o.key().unwrap()).collect();
    assert_eq!(after, ["p/k41", "p/k42", "p/k43"]);
    for k in ["q|a|1", "q|a|2", "q|b", "qz"] {
        put(&c, GP, k, vec![1]).await;
    }
    let (objects, prefixes) = list_all(&c, GP, "q", Some("|"), 1000).await;
    assert_eq!((objects, prefixes), (vec!["qz".into()], vec!["q|".into()]));
    let (objects, prefixes) = list_all(&c, GP, "q|", Some("|"), 1000).await;
    assert_eq!(
        (objects, prefixes),
        (vec!["q|b".into()], vec!["q|a|".into()])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn range_requests() {
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
    for bucket in [DIR, GP] {
        put(&c, bucket, "r", data.clone()).await;
        let get_r = || c.get_object().bucket(bucket).key("r");
        for (range, from, to) in [
            ("bytes=0-9", 0, 10),
            ("bytes=990-999", 990, 1000),
            ("bytes=-10", 990, 1000),
            ("bytes=995-2000", 995, 1000),
        ] {
            let out = get_r().range(range).send().await.unwrap();
            let want = format!("bytes {from}-{}/1000", to - 1);
            assert_eq!(out.content_range(), Some(want.as_str()), "{bucket}");
            assert_eq!(out.content_length(), Some((to - from) as i64), "{bucket}");
            let got = out.body.collect().await.unwrap().into_bytes();
            assert_eq!(got.as_ref(), &data[from..to], "{bucket} {range}");
        }
        let r = get_r().range("bytes=1000-1100").send().await;
        expect(r, (416, "InvalidRange"), bucket);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn conditional_requests_and_etags() {
    use md5::Digest;
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    let data = b"conditional request body".to_vec();
    let md5 = format!("\"{}\"", hex::encode(md5::Md5::digest(&data)));
    for bucket in [DIR, GP] {
        let etag = put(&c, bucket, "c", data.clone()).await;
        let get_c = || c.get_object().bucket(bucket).key("c");
        let ok = get_c().if_match(&etag).send().await.unwrap();
        let got = ok.body.collect().await.unwrap().into_bytes();
        assert_eq!(got.as_ref(), &data[..]);
        expect(get_c().if_match("\"0000\"").send().await, (412, ""), bucket);
        expect(get_c().if_none_match(&etag).send().await, (304, ""), bucket);
        let put_if = |none: Option<&str>, any: Option<&str>| {
            c.put_object()
                .bucket(bucket)
                .key("c")
                .set_if_none_match(none.map(str::to_string))
                .set_if_match(any.map(str::to_string))
                .body(ByteStream::from_static(b"replacement"))
                .send()
        };
        let r = put_if(Some("*"), None).await;
        expect(r, (412, "PreconditionFailed"), bucket);
        expect(put_if(None, Some("\"0000\"")).await, (412, ""), bucket);
        assert_eq!(
            get(&c, bucket, "c").await,
            data,
            "{bucket}: failed put wrote"
        );
        // The right ETag lets the write through.
        put_if(None, Some(&etag)).await.unwrap();
        assert_eq!(get(&c, bucket, "c").await, b"replacement");
        if bucket == GP {
            assert_eq!(etag, md5, "general-purpose ETag is the content MD5");
        } else {
            assert_ne!(etag, md5, "directory-bucket ETag is the content MD5");
        }
    }
}

async fn upload_part(
    c: &Client,
    b: &str,
    key: &str,
    id: &str,
    n: i32,
    body: Vec<u8>,
) -> CompletedPart {
    let req = c.upload_part().bucket(b).key(key).upload_id(id);
    let out = req.part_number(n).body(ByteStream::from(body)).send().await;
    let etag = out.unwrap_or_else(|e| panic!("part {n}: {e:?}")).e_tag;
    CompletedPart::builder()
        .part_number(n)
        .set_e_tag(etag)
        .build()
}

async fn create_upload(c: &Client, bucket: &str, key: &str) -> String {
    let req = c.create_multipart_upload().bucket(bucket).key(key);
    req.send().await.unwrap().upload_id.unwrap()
}

async fn complete(
    c: &Client,
    b: &str,
    key: &str,
    id: &str,
    parts: Vec<CompletedPart>,
) -> Result<CompleteOutput, SdkError<CompleteError, HttpResponse>> {
    let doc = CompletedMultipartUpload::builder().set_parts(Some(parts));
    let doc = doc.build();
    let req = c
        .complete_multipart_upload()
        .bucket(b)
        .key(key)
        .upload_id(id);
    req.multipart_upload(doc).send().await
}

#[tokio::test(flavor = "multi_thread")]
async fn multipart_rules() {
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    let bodies = [vec![1u8; 5 * MIB], vec![2u8; 5 * MIB], vec![3u8; 1024]];
    for bucket in [DIR, GP] {
        let id = create_upload(&c, bucket, "m").await;
        let mut parts = vec![None, None, None];
        for n in [3, 1, 2] {
            parts[n - 1] =
                Some(upload_part(&c, bucket, "m", &id, n as i32, bodies[n - 1].clone()).await);
        }
        let parts: Vec<CompletedPart> = parts.into_iter().map(Option::unwrap).collect();
        let swapped = vec![parts[1].clone(), parts[0].clone()];
        let r = complete(&c, bucket, "m", &id, swapped).await;
        expect(r, (400, "InvalidPartOrder"), bucket);
        let done = complete(&c, bucket, "m", &id, parts.clone()).await.unwrap();
        let back = get(&c, bucket, "m").await;
        assert!(back == bodies.concat(), "{bucket}: content differs");
        // Completed again with the same parts (a retry whose first answer was lost): the same result, as
        // the service answers; with other parts, the upload is gone.
        let again = complete(&c, bucket, "m", &id, parts.clone()).await.unwrap();
        assert_eq!(again.e_tag(), done.e_tag(), "{bucket}");
        let r = complete(&c, bucket, "m", &id, parts[..2].to_vec()).await;
        expect(r, (404, "NoSuchUpload"), bucket);

        // A 1 KiB part that is not the last one is too small.
        let id = create_upload(&c, bucket, "small").await;
        let p1 = upload_part(&c, bucket, "small", &id, 1, vec![4u8; 1024]).await;
        let p2 = upload_part(&c, bucket, "small", &id, 2, vec![5u8; 1024]).await;
        let r = complete(&c, bucket, "small", &id, vec![p1, p2]).await;
        expect(r, (400, "EntityTooSmall"), bucket);
        let uploads = || admin(&env, &format!("/_emulator/uploads?bucket={bucket}"));
        assert!(uploads().contains(&id), "{bucket}: upload missing");
        let abort = c.abort_multipart_upload().bucket(bucket).key("small");
        abort.upload_id(&id).send().await.unwrap();
        assert!(!uploads().contains(&id), "{bucket}: aborted upload listed");
    }

    // Directory buckets show the prefix of an upload in progress.
    let id = create_upload(&c, DIR, "u/inprog/obj").await;
    let (objects, prefixes) = list_all(&c, DIR, "u/", Some("/"), 1000).await;
    assert_eq!(prefixes, ["u/inprog/"]);
    assert!(objects.is_empty());
    let abort = c.abort_multipart_upload().bucket(DIR).key("u/inprog/obj");
    abort.upload_id(&id).send().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn appends() {
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    let append = |bucket: &'static str, offset: i64, body: &'static [u8]| {
        c.put_object()
            .bucket(bucket)
            .key("log")
            .write_offset_bytes(offset)
            .body(ByteStream::from_static(body))
            .send()
    };
    put(&c, DIR, "log", b"one ".to_vec()).await;
    append(DIR, 4, b"two ").await.unwrap();
    append(DIR, 8, b"three").await.unwrap();
    let bad_offset = (400, "InvalidWriteOffset");
    expect(append(DIR, 4, b"stale").await, bad_offset, "stale offset");
    expect(
        append(DIR, 100, b"gap").await,
        bad_offset,
        "offset past end",
    );
    expect(
        append(DIR, 13, b"").await,
        (400, "InvalidRequest"),
        "empty append",
    );
    assert_eq!(get(&c, DIR, "log").await, b"one two three");

    put(&c, GP, "log", b"one ".to_vec()).await;
    expect(append(GP, 4, b"two").await, (501, ""), "general bucket");
    assert_eq!(get(&c, GP, "log").await, b"one ");
}

/// Files under the emulator's data directory (object, part and append bodies).
fn stored_files(env: &Env) -> usize {
    fn count(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir).map_or(0, |entries| {
            entries
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => count(&e.path()),
                    _ => 1,
                })
                .sum()
        })
    }
    count(env._data.path())
}

/// Objects built from parts and appends are kept as the pieces they came in (no copy at completion): reads
/// across the seams, copies, overwrites under a running read and deletes must not show it.
#[tokio::test(flavor = "multi_thread")]
async fn objects_made_of_pieces_read_back_whole() {
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    let data: Vec<u8> = (0..(10 * MIB + 3000) as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let get_range = |bucket: &'static str, key: &'static str, from: usize, to: usize| {
        let req = c.get_object().bucket(bucket).key(key);
        async move {
            let out = req
                .range(format!("bytes={from}-{}", to - 1))
                .send()
                .await
                .unwrap();
            out.body.collect().await.unwrap().into_bytes().to_vec()
        }
    };
    let seams = [0, 5 * MIB - 1, 5 * MIB, 5 * MIB + 1, 10 * MIB - 7];
    for bucket in [DIR, GP] {
        let id = create_upload(&c, bucket, "m").await;
        let p1 = upload_part(&c, bucket, "m", &id, 1, data[..5 * MIB].to_vec()).await;
        let p2 = upload_part(&c, bucket, "m", &id, 2, data[5 * MIB..10 * MIB].to_vec()).await;
        let p3 = upload_part(&c, bucket, "m", &id, 3, data[10 * MIB..].to_vec()).await;
        complete(&c, bucket, "m", &id, vec![p1, p2, p3])
            .await
            .unwrap();
        for from in seams {
            for len in [1, 2, 3000, MIB + 5] {
                let to = (from + len).min(data.len());
                let got = get_range(bucket, "m", from, to).await;
                assert!(got == data[from..to], "{bucket}: bytes {from}..{to} differ");
            }
        }
        // A copy (general purpose; the SDK does not sign CopyObject for sessions) outlives its source.
        if bucket == GP {
            let copy = c.copy_object().bucket(bucket).key("copy");
            copy.copy_source(format!("{bucket}/m"))
                .send()
                .await
                .unwrap();
            c.delete_object()
                .bucket(bucket)
                .key("m")
                .send()
                .await
                .unwrap();
        } else {
            let rename = c.rename_object().bucket(bucket).key("copy");
            rename.rename_source("/m").send().await.unwrap();
        }
        assert!(
            get(&c, bucket, "copy").await == data,
            "{bucket}: copy differs"
        );

        // A read that started before an overwrite and a delete still gets the old bytes, whole.
        let running = c
            .get_object()
            .bucket(bucket)
            .key("copy")
            .send()
            .await
            .unwrap();
        put(&c, bucket, "copy", b"new".to_vec()).await;
        c.delete_object()
            .bucket(bucket)
            .key("copy")
            .send()
            .await
            .unwrap();
        let old = running.body.collect().await.unwrap().into_bytes();
        assert!(
            old.as_ref() == data.as_slice(),
            "{bucket}: running read changed"
        );
    }

    // Appends on a directory bucket: every seam reads back right.
    put(&c, DIR, "log", data[..1000].to_vec()).await;
    let mut end = 1000;
    for next in [1001, 5000, 5 * MIB, 5 * MIB + 77] {
        let req = c
            .put_object()
            .bucket(DIR)
            .key("log")
            .write_offset_bytes(end as i64);
        req.body(ByteStream::from(data[end..next].to_vec()))
            .send()
            .await
            .unwrap();
        end = next;
    }
    assert!(
        get(&c, DIR, "log").await == data[..end],
        "appended object differs"
    );
    assert!(
        get_range(DIR, "log", 990, 5010).await == data[990..5010],
        "append seams differ"
    );
    c.delete_object()
        .bucket(DIR)
        .key("log")
        .send()
        .await
        .unwrap();

    // Nothing is left on disk once every object is gone.
    assert_eq!(stored_files(&env), 0, "object files left behind");
}

#[tokio::test(flavor = "multi_thread")]
async fn rename_object() {
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    put(&c, DIR, "a/src", b"source bytes".to_vec()).await;
    let before = c
        .head_object()
        .bucket(DIR)
        .key("a/src")
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let rename = || c.rename_object().bucket(DIR).key("b/dst");
    rename().rename_source("/a/src").send().await.unwrap();
    assert_eq!(get(&c, DIR, "b/dst").await, b"source bytes");
    // The object moves as it is: its last-modified date and ETag stay.
    let after = c
        .head_object()
        .bucket(DIR)
        .key("b/dst")
        .send()
        .await
        .unwrap();
    assert_eq!(after.last_modified(), before.last_modified());
    assert_eq!(after.e_tag(), before.e_tag());
    let r = c.get_object().bucket(DIR).key("a/src").send().await;
    expect(r, (404, "NoSuchKey"), "renamed source");

    // The same idempotency token again: done already, so 200 again, and nothing moves.
    put(&c, DIR, "a/tok", b"token bytes".to_vec()).await;
    let once = || {
        c.rename_object()
            .bucket(DIR)
            .key("b/tok")
            .rename_source("/a/tok")
            .client_token("token-1")
            .send()
    };
    once().await.unwrap();
    once().await.unwrap();
    assert_eq!(get(&c, DIR, "b/tok").await, b"token bytes");
    let r = c.get_object().bucket(DIR).key("a/tok").send().await;
    expect(r, (404, "NoSuchKey"), "renamed source, token reused");

    // Refuse to overwrite an existing destination when asked.
    put(&c, DIR, "a/other", b"other".to_vec()).await;
    let r = rename()
        .rename_source("/a/other")
        .destination_if_none_match("*");
    let r = r.send().await;
    expect(r, (412, ""), "rename onto existing");
    assert_eq!(get(&c, DIR, "b/dst").await, b"source bytes");
    assert_eq!(get(&c, DIR, "a/other").await, b"other");

    // Not an object whose key ends in the delimiter (a directory marker), as the service documents.
    put(&c, DIR, "m/", Vec::new()).await;
    let r = c.rename_object().bucket(DIR).key("n/").rename_source("/m/");
    expect(
        r.send().await,
        (400, "InvalidRequest"),
        "rename of a marker",
    );
    assert_eq!(get(&c, DIR, "m/").await, b"");
}

/// Deterministic content: MiB number `m` of the object is a 1 MiB window into a fixed pseudo-random
/// block, shifted by `m`, so every MiB differs and generation is a memcpy (fast in debug builds).
fn pattern_block() -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..MIB + 4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn pattern_mib(block: &[u8], m: usize) -> &[u8] {
    let shift = (m * 61) % 4096;
    &block[shift..shift + MIB]
}

/// The memory this process allocated, in MiB (`RssAnon`): the pages of blobs the emulator maps are the files'
/// page cache, not memory it holds.
fn rss_mib() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix("RssAnon:"));
    let kib = line.unwrap().trim().trim_end_matches("kB").trim();
    kib.parse::<i64>().unwrap() / 1024
}

/// Uploads `parts` parts of `part_mib` MiB (one part in memory at a time), then streams the object back
/// chunk by chunk, checking SHA-256 and that this process's allocated memory (client + in-process emulator)
/// does not grow by more than `max_growth_mib` while downloading.
async fn stream_large(parts: usize, part_mib: usize, max_growth_mib: i64) {
    use sha2::Digest;
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    let block = pattern_block();
    let mut expected = sha2::Sha256::new();
    let id = create_upload(&c, DIR, "big").await;
    let mut done = Vec::new();
    for p in 0..parts {
        let mut body = Vec::with_capacity(part_mib * MIB);
        for m in p * part_mib..(p + 1) * part_mib {
            body.extend_from_slice(pattern_mib(&block, m));
        }
        expected.update(&body);
        done.push(upload_part(&c, DIR, "big", &id, p as i32 + 1, body).await);
    }
    complete(&c, DIR, "big", &id, done).await.unwrap();

    let before = rss_mib();
    let out = c.get_object().bucket(DIR).key("big").send().await.unwrap();
    let total_len = parts * part_mib * MIB;
    assert_eq!(out.content_length(), Some(total_len as i64));
    let mut body = out.body;
    let (mut got, mut total, mut peak, mut next_probe) =
        (sha2::Sha256::new(), 0usize, before, 0usize);
    while let Some(chunk) = body.try_next().await.unwrap() {
        got.update(&chunk);
        total += chunk.len();
        if total >= next_probe {
            peak = peak.max(rss_mib());
            next_probe += 16 * MIB;
        }
    }
    peak = peak.max(rss_mib());
    assert_eq!(total, total_len);
    assert!(got.finalize() == expected.finalize(), "SHA-256 differs");
    let growth = peak - before;
    eprintln!("streamed {total} bytes: RSS {before} MiB before, peak {peak}");
    assert!(growth < max_growth_mib, "RSS grew by {growth} MiB");
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_64_mib() {
    stream_large(4, 16, 600).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_2_gib() {
    stream_large(16, 128, 600).await;
}

// ---- Writers' groundwork: user metadata, server-side copies, conditional writes (issue 18) ----

/// Object bytes that differ at every offset modulo 251, so a misplaced range shows.
fn numbered(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ salt)
        .collect::<Vec<u8>>()
}

async fn head_meta(c: &Client, bucket: &str, key: &str) -> Vec<(String, String)> {
    let out = c.head_object().bucket(bucket).key(key).send().await;
    let out = out.unwrap_or_else(|e| panic!("head {bucket}/{key}: {e:?}"));
    let mut meta: Vec<_> = out.metadata.unwrap_or_default().into_iter().collect();
    meta.sort();
    meta
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn user_metadata_is_kept_returned_and_limited() {
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    let attrs = pairs(&[("mode", "33188"), ("mtime", "1700000000")]);
    for bucket in [DIR, GP] {
        // PutObject stores it; HEAD and GET return it.
        let req = c
            .put_object()
            .bucket(bucket)
            .key("m")
            .metadata("mtime", "1700000000");
        let req = req.metadata("mode", "33188").content_type("text/plain");
        req.body(ByteStream::from_static(b"data"))
            .send()
            .await
            .unwrap();
        assert_eq!(head_meta(&c, bucket, "m").await, attrs, "{bucket}: head");
        let got = c.get_object().bucket(bucket).key("m").send().await.unwrap();
        assert_eq!(got.metadata.unwrap().get("mode").unwrap(), "33188");
        assert_eq!(got.content_type.as_deref(), Some("text/plain"));

        // More than 2 KB of user metadata is refused, and nothing is written.
        let big = "x".repeat(2100);
        let req = c.put_object().bucket(bucket).key("big").metadata("k", &big);
        let r = req.body(ByteStream::from_static(b"data")).send().await;
        expect(r, (400, "MetadataTooLarge"), bucket);
        let r = c.head_object().bucket(bucket).key("big").send().await;
        expect(r, (404, ""), "refused put wrote");

        // CreateMultipartUpload's metadata and content type go to the completed object.
        let req = c.create_multipart_upload().bucket(bucket).key("mp");
        let req = req
            .metadata("mode", "33188")
            .metadata("mtime", "1700000000");
        let out = req.content_type("application/x-test").send().await.unwrap();
        let id = out.upload_id.unwrap();
        let p = upload_part(&c, bucket, "mp", &id, 1, b"part".to_vec()).await;
        complete(&c, bucket, "mp", &id, vec![p]).await.unwrap();
        assert_eq!(head_meta(&c, bucket, "mp").await, attrs, "{bucket}: mpu");
        let head = c
            .head_object()
            .bucket(bucket)
            .key("mp")
            .send()
            .await
            .unwrap();
        assert_eq!(head.content_type.as_deref(), Some("application/x-test"));

        // CopyObject copies the source's metadata by default, or takes the request's with REPLACE.
        let copy = || {
            c.copy_object()
                .bucket(bucket)
                .key("copy")
                .copy_source(format!("{bucket}/m"))
        };
        copy().metadata("ignored", "1").send().await.unwrap();
        assert_eq!(head_meta(&c, bucket, "copy").await, attrs, "{bucket}: COPY");
        let replace = aws_sdk_s3::types::MetadataDirective::Replace;
        let req = copy()
            .metadata_directive(replace.clone())
            .metadata("mode", "33261");
        req.send().await.unwrap();
        let want = pairs(&[("mode", "33261")]);
        assert_eq!(
            head_meta(&c, bucket, "copy").await,
            want,
            "{bucket}: REPLACE"
        );
        assert_eq!(get(&c, bucket, "copy").await, b"data");

        // Copying an object onto itself needs REPLACE; with it, the metadata changes and the bytes stay.
        let self_copy = || {
            let req = c.copy_object().bucket(bucket).key("m");
            req.copy_source(format!("{bucket}/m"))
        };
        expect(self_copy().send().await, (400, "InvalidRequest"), bucket);
        let r = self_copy()
            .metadata_directive(aws_sdk_s3::types::MetadataDirective::Copy)
            .send()
            .await;
        expect(r, (400, "InvalidRequest"), bucket);
        let req = self_copy().metadata_directive(replace.clone());
        req.metadata("mtime", "1800000000").send().await.unwrap();
        let want = pairs(&[("mtime", "1800000000")]);
        assert_eq!(head_meta(&c, bucket, "m").await, want, "{bucket}: self");
        assert_eq!(get(&c, bucket, "m").await, b"data");
        let r = self_copy()
            .metadata_directive(replace.clone())
            .metadata("k", &big)
            .send()
            .await;
        expect(r, (400, "MetadataTooLarge"), bucket);
    }

    // Appends and RenameObject (directory buckets) keep the object's metadata.
    let req = c
        .put_object()
        .bucket(DIR)
        .key("log")
        .metadata("mode", "33188");
    req.body(ByteStream::from_static(b"one "))
        .send()
        .await
        .unwrap();
    let append = c.put_object().bucket(DIR).key("log").write_offset_bytes(4);
    append
        .body(ByteStream::from_static(b"two"))
        .send()
        .await
        .unwrap();
    let mode = pairs(&[("mode", "33188")]);
    assert_eq!(head_meta(&c, DIR, "log").await, mode, "append");
    let rename = c
        .rename_object()
        .bucket(DIR)
        .key("log2")
        .rename_source("log");
    rename.send().await.unwrap();
    assert_eq!(head_meta(&c, DIR, "log2").await, mode, "rename");
    assert_eq!(get(&c, DIR, "log2").await, b"one two");
}

async fn upload_part_copy(
    c: &Client,
    bucket: &str,
    key: &str,
    id: &str,
    n: i32,
    source: &str,
    range: Option<String>,
) -> Result<
    aws_sdk_s3::operation::upload_part_copy::UploadPartCopyOutput,
    SdkError<aws_sdk_s3::operation::upload_part_copy::UploadPartCopyError, HttpResponse>,
> {
    let req = c.upload_part_copy().bucket(bucket).key(key).upload_id(id);
    let req = req
        .part_number(n)
        .copy_source(source)
        .set_copy_source_range(range);
    req.send().await
}

fn copied_part(
    n: i32,
    out: &aws_sdk_s3::operation::upload_part_copy::UploadPartCopyOutput,
) -> CompletedPart {
    let etag = out.copy_part_result.as_ref().unwrap().e_tag.clone();
    CompletedPart::builder()
        .part_number(n)
        .set_e_tag(etag)
        .build()
}

/// Patching the middle of a large object by UploadPartCopy of its unchanged ranges plus one uploaded part:
/// the result is byte-exact, the copies add no files to the store and bring (near) zero bytes in.
#[tokio::test(flavor = "multi_thread")]
async fn upload_part_copy_patches_without_sending_the_rest() {
    use md5::Digest;
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    let size = 24 * MIB;
    let original = numbered(size, 0);
    for bucket in [DIR, GP] {
        put(&c, bucket, "big", original.clone()).await;
        let src = format!("{bucket}/big");
        let files = stored_files(&env);
        admin_post(&env, "/_emulator/stats/reset");

        let id = create_upload(&c, bucket, "patched").await;
        let r1 = upload_part_copy(
            &c,
            bucket,
            "patched",
            &id,
            1,
            &src,
            Some(format!("bytes=0-{}", 8 * MIB - 1)),
        );
        let r1 = r1.await.unwrap();
        let patch = numbered(5 * MIB, 0x5a);
        let p2 = upload_part(&c, bucket, "patched", &id, 2, patch.clone()).await;
        let range = format!("bytes={}-{}", 13 * MIB, size - 1);
        let r3 = upload_part_copy(&c, bucket, "patched", &id, 3, &src, Some(range)).await;
        let r3 = r3.unwrap();
        assert_eq!(
            stored_files(&env),
            files + 1,
            "{bucket}: only the uploaded part is a new file"
        );
        // Changing the metadata of the 24 MiB source in place (a self-copy) sends no bytes either.
        let req = c.copy_object().bucket(bucket).key("big").copy_source(&src);
        let req = req.metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace);
        req.metadata("mode", "33261").send().await.unwrap();
        let parts = vec![copied_part(1, &r1), p2, copied_part(3, &r3)];
        complete(&c, bucket, "patched", &id, parts).await.unwrap();
        let want = [&original[..8 * MIB], &patch[..], &original[13 * MIB..]].concat();
        assert!(
            get(&c, bucket, "patched").await == want,
            "{bucket}: patched bytes differ"
        );

        let stats: serde_json::Value =
            serde_json::from_str(&admin(&env, "/_emulator/stats")).unwrap();
        let op = &stats[bucket]["UploadPartCopy"];
        assert_eq!(op["requests"], 2, "{bucket}: {stats}");
        assert!(op["bytes_in"].as_u64().unwrap() < 1024, "{bucket}: {stats}");
        let op = &stats[bucket]["CopyObject"];
        assert_eq!(op["requests"], 1, "{bucket}: {stats}");
        assert!(op["bytes_in"].as_u64().unwrap() < 1024, "{bucket}: {stats}");
        let sent: u64 = stats[bucket]
            .as_object()
            .unwrap()
            .values()
            .map(|o| o["bytes_in"].as_u64().unwrap())
            .sum();
        assert!(
            sent < 5 * MIB as u64 + 64 * 1024,
            "{bucket}: {sent} bytes in to patch {size}"
        );

        // A whole-object copy (no range) of a general-purpose object has the MD5 of its bytes as ETag.
        let id = create_upload(&c, bucket, "whole").await;
        let out = upload_part_copy(&c, bucket, "whole", &id, 1, &src, None)
            .await
            .unwrap();
        if bucket == GP {
            let md5 = format!("\"{}\"", hex::encode(md5::Md5::digest(&original)));
            assert_eq!(out.copy_part_result.unwrap().e_tag.unwrap(), md5);
        }

        // Errors: bad range, range past the end, a range of a small source, conditions, missing things.
        let r =
            upload_part_copy(&c, bucket, "whole", &id, 2, &src, Some("bytes=10-5".into())).await;
        expect(r, (400, "InvalidArgument"), "reversed range");
        let past = Some(format!("bytes=0-{size}"));
        let r = upload_part_copy(&c, bucket, "whole", &id, 2, &src, past).await;
        expect(r, (400, "InvalidArgument"), "range past the end");
        put(&c, bucket, "small", vec![7u8; MIB]).await;
        let small = format!("{bucket}/small");
        let r = upload_part_copy(
            &c,
            bucket,
            "whole",
            &id,
            2,
            &small,
            Some("bytes=0-9".into()),
        )
        .await;
        expect(r, (400, "InvalidRequest"), "range of a 1 MiB source");
        upload_part_copy(&c, bucket, "whole", &id, 2, &small, None)
            .await
            .unwrap();
        let req = c
            .upload_part_copy()
            .bucket(bucket)
            .key("whole")
            .upload_id(&id);
        let r = req
            .part_number(3)
            .copy_source(&src)
            .copy_source_if_match("\"nope\"")
            .send()
            .await;
        expect(r, (412, "PreconditionFailed"), "source if-match");
        let gone = format!("{bucket}/missing");
        let r = upload_part_copy(&c, bucket, "whole", &id, 3, &gone, None).await;
        expect(r, (404, "NoSuchKey"), "missing source");
        let r = upload_part_copy(&c, bucket, "whole", "bm9uZQ", 1, &src, None).await;
        expect(r, (404, "NoSuchUpload"), "missing upload");
        let abort = c.abort_multipart_upload().bucket(bucket).key("whole");
        abort.upload_id(&id).send().await.unwrap();
    }

    // A checksum asked for at CreateMultipartUpload comes back for a copied part, over the copied range.
    let req = c.create_multipart_upload().bucket(GP).key("sum");
    let req = req.checksum_algorithm(aws_sdk_s3::types::ChecksumAlgorithm::Crc32C);
    let id = req.send().await.unwrap().upload_id.unwrap();
    let range = Some(format!("bytes={}-{}", MIB, 3 * MIB - 1));
    let src = format!("{GP}/big");
    let out = upload_part_copy(&c, GP, "sum", &id, 1, &src, range)
        .await
        .unwrap();
    use base64::Engine;
    let want = base64::engine::general_purpose::STANDARD
        .encode(crc32c::crc32c(&original[MIB..3 * MIB]).to_be_bytes());
    let got = out.copy_part_result.unwrap().checksum_crc32_c;
    assert_eq!(got.as_deref(), Some(want.as_str()));
}

fn admin_post(env: &Env, path: &str) {
    admin_post_json(env, path, "");
}

fn admin_post_json(env: &Env, path: &str, body: &str) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(env.emu.addr()).unwrap();
    let (host, len) = (env.emu.addr(), body.len());
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: {host}\r\nContent-Length: {len}\r\n\r\n{body}"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.contains(" 200 "), "{out}");
}

/// A request body fed by the test through a channel, with its length declared up front: a PUT that stays
/// in flight while the test does something else.
struct FedBody {
    rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    len: u64,
}

impl http_body::Body for FedBody {
    type Data = bytes::Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(http_body::Frame::data(b))))
    }
    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.len)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn conditional_writes_on_complete_copy_and_conflicts() {
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    for bucket in [DIR, GP] {
        let etag = put(&c, bucket, "k", b"first".to_vec()).await;

        // CompleteMultipartUpload: If-None-Match * on an existing key and a stale If-Match fail with 412
        // (the upload stays, so the right condition can still complete it); If-Match on a missing key is 404.
        let id = create_upload(&c, bucket, "k").await;
        let p = upload_part(&c, bucket, "k", &id, 1, b"second".to_vec()).await;
        let doc = CompletedMultipartUpload::builder().parts(p).build();
        let done = |none: Option<&str>, any: Option<&str>, key: &str, id: &str| {
            let req = c
                .complete_multipart_upload()
                .bucket(bucket)
                .key(key)
                .upload_id(id);
            let req = req.set_if_none_match(none.map(str::to_string));
            req.set_if_match(any.map(str::to_string))
                .multipart_upload(doc.clone())
                .send()
        };
        expect(
            done(Some("*"), None, "k", &id).await,
            (412, "PreconditionFailed"),
            bucket,
        );
        expect(
            done(None, Some("\"0\""), "k", &id).await,
            (412, "PreconditionFailed"),
            bucket,
        );
        assert_eq!(get(&c, bucket, "k").await, b"first");
        done(None, Some(&etag), "k", &id).await.unwrap();
        assert_eq!(get(&c, bucket, "k").await, b"second");
        let id = create_upload(&c, bucket, "absent").await;
        let p = upload_part(&c, bucket, "absent", &id, 1, b"x".to_vec()).await;
        let doc2 = CompletedMultipartUpload::builder().parts(p).build();
        let req = c
            .complete_multipart_upload()
            .bucket(bucket)
            .key("absent")
            .upload_id(&id);
        let r = req
            .if_match("\"0\"")
            .multipart_upload(doc2.clone())
            .send()
            .await;
        expect(r, (404, "NoSuchKey"), "if-match on a missing key");
        let req = c
            .complete_multipart_upload()
            .bucket(bucket)
            .key("absent")
            .upload_id(&id);
        req.if_none_match("*")
            .multipart_upload(doc2)
            .send()
            .await
            .unwrap();

        // PutObject If-Match on a missing key: 404 NoSuchKey.
        let req = c
            .put_object()
            .bucket(bucket)
            .key("nothing")
            .if_match("\"0\"");
        let r = req.body(ByteStream::from_static(b"x")).send().await;
        expect(r, (404, "NoSuchKey"), "put if-match on a missing key");

        // CopyObject's destination conditions (If-Match / If-None-Match, as for PutObject).
        let current = c
            .head_object()
            .bucket(bucket)
            .key("k")
            .send()
            .await
            .unwrap()
            .e_tag
            .unwrap();
        let copy = |none: Option<&str>, any: Option<&str>, key: &str| {
            let req = c
                .copy_object()
                .bucket(bucket)
                .key(key)
                .copy_source(format!("{bucket}/absent"));
            req.set_if_none_match(none.map(str::to_string))
                .set_if_match(any.map(str::to_string))
                .send()
        };
        expect(
            copy(Some("*"), None, "k").await,
            (412, "PreconditionFailed"),
            bucket,
        );
        expect(
            copy(None, Some("\"0\""), "k").await,
            (412, "PreconditionFailed"),
            bucket,
        );
        expect(
            copy(None, Some("\"0\""), "none").await,
            (404, "NoSuchKey"),
            bucket,
        );
        assert_eq!(get(&c, bucket, "k").await, b"second");
        copy(None, Some(&current), "k").await.unwrap();
        assert_eq!(get(&c, bucket, "k").await, b"x");
        copy(Some("*"), None, "fresh").await.unwrap();

        // A conditional PutObject whose key is overwritten while its body is still arriving: 409
        // ConditionalRequestConflict, and the other writer's object stays.
        let etag = put(&c, bucket, "race", b"before".to_vec()).await;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let body = ByteStream::from_body_1_x(FedBody { rx, len: 8 });
        let req = c
            .put_object()
            .bucket(bucket)
            .key("race")
            .if_match(&etag)
            .body(body);
        let writer = tokio::spawn(req.send());
        tx.send(bytes::Bytes::from_static(b"slow")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        put(&c, bucket, "race", b"other writer".to_vec()).await;
        tx.send(bytes::Bytes::from_static(b"body")).await.unwrap();
        drop(tx);
        expect(
            writer.await.unwrap(),
            (409, "ConditionalRequestConflict"),
            bucket,
        );
        assert_eq!(get(&c, bucket, "race").await, b"other writer");
    }
}

/// The opt-in `conditional-conflict` fault: conditional writes get 409 (a Complete loses its upload), the
/// same requests without conditions pass.
#[tokio::test(flavor = "multi_thread")]
async fn conditional_conflict_fault_hits_only_conditional_writes() {
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    let faults = r#"{"rate":1.0,"seed":1,"kinds":["conditional-conflict"]}"#;
    admin_post_json(&env, "/_emulator/faults", faults);
    for bucket in [DIR, GP] {
        let etag = put(&c, bucket, "k", b"plain puts pass".to_vec()).await;
        let req = c.put_object().bucket(bucket).key("k").if_match(&etag);
        let r = req.body(ByteStream::from_static(b"x")).send().await;
        expect(r, (409, "ConditionalRequestConflict"), bucket);
        let id = create_upload(&c, bucket, "k").await;
        let p = upload_part(&c, bucket, "k", &id, 1, b"part".to_vec()).await;
        let doc = CompletedMultipartUpload::builder().parts(p).build();
        let req = c
            .complete_multipart_upload()
            .bucket(bucket)
            .key("k")
            .upload_id(&id);
        let r = req
            .if_match(&etag)
            .multipart_upload(doc.clone())
            .send()
            .await;
        expect(r, (409, "ConditionalRequestConflict"), bucket);
        let r = c
            .list_parts()
            .bucket(bucket)
            .key("k")
            .upload_id(&id)
            .send()
            .await;
        expect(r, (404, "NoSuchUpload"), "upload after a 409");
        assert_eq!(get(&c, bucket, "k").await, b"plain puts pass");
    }
    // Only the four conditional writes count as injected, not the requests the fault let through.
    let report: serde_json::Value =
        serde_json::from_str(&admin(&env, "/_emulator/faults")).unwrap();
    assert_eq!(report["injected_total"], 4, "{report}");
}
