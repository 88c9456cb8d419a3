//! Conformance of the emulator as the real aws-sdk-s3 sees it: authentication and sessions, directory-bucket
//! listing rules, ranges, conditional requests, multipart rules, appends, rename, and streaming of large
//! objects without the server's memory growing. Everything on 127.0.0.1 with explicit credentials.

use std::time::Duration;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::{Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use expressfs_emulator::{Emulator, EmulatorConfig};

const KEY: &str = "AKIDCONFORMANCE";
const SECRET: &str = "conformance-secret";
const DIR: &str = "conf--use1-az4--x-s3";
const GP: &str = "conf-general";
const MIB: usize = 1024 * 1024;

struct Env {
    emu: Emulator,
    _data: tempfile::TempDir,
}

fn start(session_ttl: Duration) -> Env {
    // SAFETY: set before the SDK reads it; constant value.
    unsafe { std::env::set_var("AWS_EC2_METADATA_DISABLED", "true") };
    let data = tempfile::tempdir().unwrap();
    let emu = Emulator::start_background(EmulatorConfig {
        data_dir: data.path().into(),
        buckets: vec![DIR.into(), GP.into()],
        access_key: KEY.into(),
        secret_key: SECRET.into(),
        session_ttl,
        ..Default::default()
    })
    .unwrap();
    Env { emu, _data: data }
}

fn client_with(env: &Env, secret: &str, key: &str, sessions: bool) -> Client {
    let config = aws_sdk_s3::config::Builder::new()
        .behavior_version_latest()
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(key, secret, None, None, "conformance"))
        .endpoint_url(env.emu.endpoint_url())
        .force_path_style(true)
        .disable_s3_express_session_auth(!sessions)
        .build();
    Client::from_conf(config)
}

fn client(env: &Env) -> Client {
    client_with(env, SECRET, KEY, true)
}

/// HTTP status of the answer behind an SDK error (also when it is wrapped, as a failed CreateSession is).
fn status<E: std::fmt::Debug, R: std::fmt::Debug>(e: &aws_sdk_s3::error::SdkError<E, R>) -> u16 {
    let debug = format!("{e:?}");
    debug
        .split("StatusCode(")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn code<E: aws_sdk_s3::error::ProvideErrorMetadata, R>(
    e: &aws_sdk_s3::error::SdkError<E, R>,
) -> String {
    e.as_service_error()
        .and_then(|s| s.code())
        .unwrap_or("")
        .to_string()
}

async fn put(c: &Client, bucket: &str, key: &str, body: Vec<u8>) -> String {
    c.put_object()
        .bucket(bucket)
        .key(key)
        .body(ByteStream::from(body))
        .send()
        .await
        .unwrap()
        .e_tag
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_keys_and_missing_sessions_are_refused() {
    let env = start(Duration::from_secs(300));
    for bucket in [GP, DIR] {
        let wrong = client_with(&env, "not-the-secret", KEY, true);
        let e = wrong
            .list_objects_v2()
            .bucket(bucket)
            .send()
            .await
            .unwrap_err();
        assert_eq!(status(&e), 403, "{bucket}: {e:?}");
        let unknown = client_with(&env, SECRET, "AKIDUNKNOWN", true);
        let e = unknown
            .head_object()
            .bucket(bucket)
            .key("x")
            .send()
            .await
            .unwrap_err();
        assert_eq!(status(&e), 403, "{bucket}");
    }
    // Long-term keys without a session: directory-bucket data requests are refused.
    let no_session = client_with(&env, SECRET, KEY, false);
    let e = no_session
        .get_object()
        .bucket(DIR)
        .key("x")
        .send()
        .await
        .unwrap_err();
    assert_eq!((status(&e), code(&e).as_str()), (403, "AccessDenied"));
    let e = no_session
        .list_objects_v2()
        .bucket(DIR)
        .send()
        .await
        .unwrap_err();
    assert_eq!(status(&e), 403);
    // ... while bucket creation (regional, no session) works.
    no_session
        .create_bucket()
        .bucket("other--use1-az4--x-s3")
        .send()
        .await
        .unwrap();
    // General-purpose buckets take plain SigV4.
    put(&no_session, GP, "plain", b"ok".to_vec()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_refresh_across_short_ttls() {
    let env = start(Duration::from_secs(2));
    let c = client(&env);
    let started = std::time::Instant::now();
    let mut rounds = 0;
    while started.elapsed() < Duration::from_secs(7) {
        put(&c, DIR, &format!("r/{rounds}"), vec![1; 100]).await;
        c.get_object()
            .bucket(DIR)
            .key(format!("r/{rounds}"))
            .send()
            .await
            .unwrap();
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(rounds > 15);
    let stats = admin(&env, "/_emulator/stats");
    let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let sessions = v[DIR]["CreateSession"]["requests"].as_u64().unwrap();
    assert!(
        sessions >= 3,
        "only {sessions} sessions in 7 s with a 2 s TTL"
    );
}

fn admin(env: &Env, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(env.emu.addr()).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn listing_rules_and_pagination() {
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    let mut keys: Vec<String> = (0..40).map(|i| format!("p/k{i:02}")).collect();
    keys.extend(["p/d1/a", "p/d1/b", "p/d2/c"].map(String::from));
    for bucket in [DIR, GP] {
        for k in &keys {
            put(&c, bucket, k, vec![0; 3]).await;
        }
    }
    let e = c
        .list_objects_v2()
        .bucket(DIR)
        .delimiter("|")
        .send()
        .await
        .unwrap_err();
    assert_eq!((status(&e), code(&e).as_str()), (400, "InvalidArgument"));
    let e = c
        .list_objects_v2()
        .bucket(DIR)
        .prefix("p")
        .delimiter("/")
        .send()
        .await
        .unwrap_err();
    assert_eq!(status(&e), 400);
    let e = c
        .list_objects_v2()
        .bucket(DIR)
        .prefix("p/")
        .start_after("p/k01")
        .send()
        .await
        .unwrap_err();
    assert_eq!(status(&e), 400);

    for bucket in [DIR, GP] {
        let mut objects = Vec::new();
        let mut prefixes = Vec::new();
        let mut token = None;
        loop {
            let page = c
                .list_objects_v2()
                .bucket(bucket)
                .prefix("p/")
                .delimiter("/")
                .max_keys(7)
                .set_continuation_token(token)
                .send()
                .await
                .unwrap();
            assert!(page.key_count.unwrap() <= 7);
            objects.extend(page.contents().iter().map(|o| o.key().unwrap().to_string()));
            prefixes.extend(
                page.common_prefixes()
                    .iter()
                    .map(|p| p.prefix().unwrap().to_string()),
            );
            token = page.next_continuation_token;
            if token.is_none() {
                break;
            }
        }
        let mut sorted = objects.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            objects.len(),
            "{bucket}: an object listed twice"
        );
        assert_eq!(sorted, keys[..40].to_vec(), "{bucket}");
        if bucket == GP {
            assert_eq!(objects, sorted, "general purpose listings are in key order");
            assert_eq!(prefixes, vec!["p/d1/", "p/d2/"]);
        } else {
            assert_ne!(objects, sorted, "directory bucket listing came back sorted");
            prefixes.sort();
            prefixes.dedup();
            assert_eq!(prefixes, vec!["p/d1/", "p/d2/"]);
        }
    }
    // Prefixes of uploads in progress show up on directory buckets.
    c.create_multipart_upload()
        .bucket(DIR)
        .key("u/inprog/obj")
        .send()
        .await
        .unwrap();
    let page = c
        .list_objects_v2()
        .bucket(DIR)
        .prefix("u/")
        .delimiter("/")
        .send()
        .await
        .unwrap();
    assert_eq!(page.common_prefixes()[0].prefix(), Some("u/inprog/"));
}

#[tokio::test(flavor = "multi_thread")]
async fn ranges_and_conditions() {
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    for bucket in [DIR, GP] {
        let etag = put(&c, bucket, "r", data.clone()).await;
        for (range, from, to) in [
            ("bytes=0-9", 0, 10),
            ("bytes=990-999", 990, 1000),
            ("bytes=-10", 990, 1000),
            ("bytes=995-2000", 995, 1000),
        ] {
            let out = c
                .get_object()
                .bucket(bucket)
                .key("r")
                .range(range)
                .send()
                .await
                .unwrap();
            assert_eq!(
                out.content_range(),
                Some(format!("bytes {from}-{}/1000", to - 1).as_str())
            );
            assert_eq!(
                out.body.collect().await.unwrap().into_bytes().to_vec(),
                data[from..to].to_vec(),
                "{bucket} {range}"
            );
        }
        let e = c
            .get_object()
            .bucket(bucket)
            .key("r")
            .range("bytes=1000-1100")
            .send()
            .await
            .unwrap_err();
        assert_eq!((status(&e), code(&e).as_str()), (416, "InvalidRange"));
        c.get_object()
            .bucket(bucket)
            .key("r")
            .if_match(&etag)
            .send()
            .await
            .unwrap();
        let e = c
            .get_object()
            .bucket(bucket)
            .key("r")
            .if_match("\"nope\"")
            .send()
            .await
            .unwrap_err();
        assert_eq!(status(&e), 412);
        let e = c
            .get_object()
            .bucket(bucket)
            .key("r")
            .if_none_match(&etag)
            .send()
            .await
            .unwrap_err();
        assert_eq!(status(&e), 304);
        let e = c
            .put_object()
            .bucket(bucket)
            .key("r")
            .if_none_match("*")
            .body(ByteStream::from_static(b"x"))
            .send()
            .await
            .unwrap_err();
        assert_eq!(status(&e), 412);
        let e = c
            .put_object()
            .bucket(bucket)
            .key("r")
            .if_match("\"nope\"")
            .body(ByteStream::from_static(b"x"))
            .send()
            .await
            .unwrap_err();
        assert_eq!(status(&e), 412);
        let md5 = format!("\"{:x}\"", md5_of(&data));
        if bucket == GP {
            assert_eq!(etag, md5, "general purpose ETag is the MD5");
        } else {
            assert_ne!(etag, md5, "directory bucket ETags are not MD5");
        }
    }
}

fn md5_of(data: &[u8]) -> md5::digest::Output<md5::Md5> {
    use md5::Digest;
    md5::Md5::digest(data)
}

#[tokio::test(flavor = "multi_thread")]
async fn multipart_rules() {
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    for bucket in [DIR, GP] {
        let parts_data = [vec![1u8; 5 * MIB], vec![2u8; 5 * MIB], vec![3u8; 1024]];
        let id = c
            .create_multipart_upload()
            .bucket(bucket)
            .key("m")
            .send()
            .await
            .unwrap()
            .upload_id
            .unwrap();
        let mut etags = vec![String::new(); 3];
        for n in [3usize, 1, 2] {
            let out = c
                .upload_part()
                .bucket(bucket)
                .key("m")
                .upload_id(&id)
                .part_number(n as i32)
                .body(ByteStream::from(parts_data[n - 1].clone()))
                .send()
                .await
                .unwrap();
            etags[n - 1] = out.e_tag.unwrap();
        }
        let part = |n: usize| {
            CompletedPart::builder()
                .part_number(n as i32)
                .e_tag(&etags[n - 1])
                .build()
        };
        let e = c
            .complete_multipart_upload()
            .bucket(bucket)
            .key("m")
            .upload_id(&id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .parts(part(2))
                    .parts(part(1))
                    .build(),
            )
            .send()
            .await
            .unwrap_err();
        assert_eq!(code(&e), "InvalidPartOrder", "{bucket}");
        c.complete_multipart_upload()
            .bucket(bucket)
            .key("m")
            .upload_id(&id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .parts(part(1))
                    .parts(part(2))
                    .parts(part(3))
                    .build(),
            )
            .send()
            .await
            .unwrap();
        let back = c
            .get_object()
            .bucket(bucket)
            .key("m")
            .send()
            .await
            .unwrap()
            .body
            .collect()
            .await
            .unwrap()
            .into_bytes();
        assert_eq!(back.to_vec(), parts_data.concat(), "{bucket}");

        // A small part that is not the last one is refused; an aborted upload disappears.
        let id = c
            .create_multipart_upload()
            .bucket(bucket)
            .key("s")
            .send()
            .await
            .unwrap()
            .upload_id
            .unwrap();
        let mut small = Vec::new();
        for n in 1..=2 {
            let out = c
                .upload_part()
                .bucket(bucket)
                .key("s")
                .upload_id(&id)
                .part_number(n)
                .body(ByteStream::from(vec![0u8; 1024]))
                .send()
                .await
                .unwrap();
            small.push(
                CompletedPart::builder()
                    .part_number(n)
                    .e_tag(out.e_tag.unwrap())
                    .build(),
            );
        }
        let e = c
            .complete_multipart_upload()
            .bucket(bucket)
            .key("s")
            .upload_id(&id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(small))
                    .build(),
            )
            .send()
            .await
            .unwrap_err();
        assert_eq!(code(&e), "EntityTooSmall");
        c.abort_multipart_upload()
            .bucket(bucket)
            .key("s")
            .upload_id(&id)
            .send()
            .await
            .unwrap();
        assert!(!admin(&env, &format!("/_emulator/uploads?bucket={bucket}")).contains(&id));
        let e = c
            .abort_multipart_upload()
            .bucket(bucket)
            .key("s")
            .upload_id(&id)
            .send()
            .await
            .unwrap_err();
        assert_eq!(code(&e), "NoSuchUpload");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn append_and_rename() {
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    put(&c, DIR, "log", b"one ".to_vec()).await;
    c.put_object()
        .bucket(DIR)
        .key("log")
        .write_offset_bytes(4)
        .body(ByteStream::from_static(b"two"))
        .send()
        .await
        .unwrap();
    let e = c
        .put_object()
        .bucket(DIR)
        .key("log")
        .write_offset_bytes(4)
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!((status(&e), code(&e).as_str()), (400, "InvalidWriteOffset"));
    let back = c
        .get_object()
        .bucket(DIR)
        .key("log")
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .into_bytes();
    assert_eq!(&back[..], b"one two");
    put(&c, GP, "log", b"one ".to_vec()).await;
    let e = c
        .put_object()
        .bucket(GP)
        .key("log")
        .write_offset_bytes(4)
        .body(ByteStream::from_static(b"two"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(status(&e), 501);

    c.rename_object()
        .bucket(DIR)
        .key("moved")
        .rename_source("/log")
        .send()
        .await
        .unwrap();
    let e = c
        .head_object()
        .bucket(DIR)
        .key("log")
        .send()
        .await
        .unwrap_err();
    assert_eq!(status(&e), 404);
    put(&c, DIR, "src", b"s".to_vec()).await;
    let e = c
        .rename_object()
        .bucket(DIR)
        .key("moved")
        .rename_source("/src")
        .destination_if_none_match("*")
        .send()
        .await
        .unwrap_err();
    assert_eq!(status(&e), 412);
}

/// Streams a large object back and checks the server's memory does not grow with it. The emulator runs in
/// this process, so this process's RSS bounds the server's. EXPRESSFS_CONFORMANCE_LARGE=1 uses 2 GiB.
#[tokio::test(flavor = "multi_thread")]
async fn large_objects_stream_without_memory_growth() {
    use sha2::Digest;
    let env = start(Duration::from_secs(300));
    let c = client(&env);
    let parts = if std::env::var("EXPRESSFS_CONFORMANCE_LARGE").is_ok() {
        16
    } else {
        2
    };
    let part_len = 128 * MIB;
    let chunk: Vec<u8> = (0..part_len).map(|i| (i % 241) as u8).collect();
    let mut expected = sha2::Sha256::new();
    let id = c
        .create_multipart_upload()
        .bucket(DIR)
        .key("big")
        .send()
        .await
        .unwrap()
        .upload_id
        .unwrap();
    let mut done = Vec::new();
    for n in 1..=parts {
        expected.update(&chunk);
        let out = c
            .upload_part()
            .bucket(DIR)
            .key("big")
            .upload_id(&id)
            .part_number(n)
            .body(ByteStream::from(chunk.clone()))
            .send()
            .await
            .unwrap();
        done.push(
            CompletedPart::builder()
                .part_number(n)
                .e_tag(out.e_tag.unwrap())
                .build(),
        );
    }
    c.complete_multipart_upload()
        .bucket(DIR)
        .key("big")
        .upload_id(&id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(done))
                .build(),
        )
        .send()
        .await
        .unwrap();
    drop(chunk);
    let before = rss_mib();
    let mut body = c
        .get_object()
        .bucket(DIR)
        .key("big")
        .send()
        .await
        .unwrap()
        .body;
    let mut got = sha2::Sha256::new();
    let mut peak = before;
    let mut total = 0usize;
    while let Some(piece) = body.try_next().await.unwrap() {
        got.update(&piece);
        total += piece.len();
        if total % (64 * MIB) < piece.len() {
            peak = peak.max(rss_mib());
        }
    }
    assert_eq!(total, parts as usize * part_len);
    assert_eq!(got.finalize(), expected.finalize());
    assert!(
        peak - before < 300,
        "RSS grew by {} MiB while streaming",
        peak - before
    );
}

fn rss_mib() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: i64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb / 1024
}
