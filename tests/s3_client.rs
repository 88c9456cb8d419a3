//! `SdkClient` (the aws-sdk-s3 implementation of `ObjectClient`) against the emulator, on a directory bucket
//! and a general-purpose bucket: every operation, the error mapping, session refresh across expiry, and GETs
//! that resume after the emulator breaks their bodies.

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use expressfs::s3::sdk::{SdkClient, SdkClientConfig};
use expressfs::s3::{ClientError, ObjectClient, UploadChecksum, WriteCondition};
use expressfs_emulator::{Emulator, EmulatorConfig, FaultConfig};

const MIB: usize = 1024 * 1024;

fn block<F: Future>(future: F) -> F::Output {
    common::runtime().block_on(future)
}

fn client_with(
    emu: &Emulator,
    bucket: &str,
    adjust: impl FnOnce(&mut SdkClientConfig),
) -> SdkClient {
    common::isolate_env();
    let mut config = SdkClientConfig::new(bucket, common::REGION);
    config.endpoint_url = Some(emu.endpoint_url());
    config.force_path_style = true;
    adjust(&mut config);
    block(SdkClient::new(config)).expect("client builds")
}

fn client(emu: &Emulator, bucket: &str) -> SdkClient {
    client_with(emu, bucket, |_| {})
}

use common::admin;

fn bucket_pair(tag: &str) -> [String; 2] {
    [
        common::fresh_bucket(true, tag),
        common::fresh_bucket(false, tag),
    ]
}

fn basic_ops(bucket: &str) {
    let emu = common::emulator();
    let c = client(emu, bucket);
    block(async {
        c.head_bucket().await.expect("head_bucket");
        let data = common::pattern(1, 1000);
        let put = c
            .put_object("a/one", Bytes::from(data.clone()), WriteCondition::None)
            .await
            .unwrap();
        assert!(!put.etag.is_empty());
        assert_eq!(put.size, Some(1000));

        let info = c.head_object("a/one").await.unwrap();
        assert_eq!(
            (info.key.as_str(), info.size, info.etag.as_str()),
            ("a/one", 1000, put.etag.as_str())
        );

        // Whole, ranged, clamped at the end, and past the end.
        assert_eq!(c.get_object("a/one", 0..1000, None).await.unwrap(), data);
        assert_eq!(
            c.get_object("a/one", 100..200, Some(&put.etag))
                .await
                .unwrap(),
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
        assert!(
            c.get_object("a/one", 1000..1100, None)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            c.get_object("a/one", 5000..6000, None)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(c.get_object("a/one", 7..7, None).await.unwrap().is_empty());

        // Conditional writes.
        let again = c
            .put_object(
                "a/one",
                Bytes::from_static(b"x"),
                WriteCondition::IfNoneMatch,
            )
            .await;
        assert_eq!(
            again,
            Err(ClientError::PreconditionFailed {
                key: "a/one".into()
            })
        );
        let wrong = c
            .put_object(
                "a/one",
                Bytes::from_static(b"x"),
                WriteCondition::IfMatch("\"nope\"".into()),
            )
            .await;
        assert_eq!(
            wrong,
            Err(ClientError::PreconditionFailed {
                key: "a/one".into()
            })
        );
        let fresh = c
            .put_object(
                "a/two",
                Bytes::from_static(b"two"),
                WriteCondition::IfNoneMatch,
            )
            .await
            .unwrap();
        assert!(!fresh.etag.is_empty());
        let replaced = c
            .put_object(
                "a/one",
                Bytes::from_static(b"replaced"),
                WriteCondition::IfMatch(put.etag.clone()),
            )
            .await
            .unwrap();
        assert_ne!(replaced.etag, put.etag);

        // A read pinned to the old version fails instead of returning new bytes.
        assert_eq!(
            c.get_object("a/one", 0..8, Some(&put.etag)).await,
            Err(ClientError::PreconditionFailed {
                key: "a/one".into()
            })
        );
        assert_eq!(
            c.get_object("a/one", 0..8, Some(&replaced.etag))
                .await
                .unwrap(),
            &b"replaced"[..]
        );

        // Keys with spaces, '+', '%', '=' and non-ASCII come back exactly as written.
        let odd = "odd dir/a b+c=ü%.txt";
        c.put_object(odd, Bytes::from_static(b"odd"), WriteCondition::None)
            .await
            .unwrap();
        assert_eq!(c.get_object(odd, 0..3, None).await.unwrap(), &b"odd"[..]);
        let page = c
            .list_objects("odd dir/", Some("/"), None, 100)
            .await
            .unwrap();
        assert_eq!(
            page.objects
                .iter()
                .map(|o| o.key.as_str())
                .collect::<Vec<_>>(),
            vec![odd]
        );

        // Delete, then every read says NotFound.
        c.delete_object("a/one").await.unwrap();
        assert_eq!(
            c.head_object("a/one").await,
            Err(ClientError::NotFound {
                key: "a/one".into()
            })
        );
        assert_eq!(
            c.get_object("a/one", 0..1, None).await,
            Err(ClientError::NotFound {
                key: "a/one".into()
            })
        );
        assert_eq!(
            c.get_object("never", 0..1, None).await,
            Err(ClientError::NotFound {
                key: "never".into()
            })
        );
        assert_eq!(
            c.head_object("never").await,
            Err(ClientError::NotFound {
                key: "never".into()
            })
        );
    });
}

#[test]
fn basic_ops_directory_bucket() {
    basic_ops(&common::fresh_bucket(true, "basic"));
}

#[test]
fn basic_ops_general_purpose_bucket() {
    basic_ops(&common::fresh_bucket(false, "basic"));
}

#[test]
fn list_pages_cover_everything_once() {
    for bucket in bucket_pair("list") {
        let c = client(common::emulator(), &bucket);
        block(async {
            let keys = [
                "l/a/1", "l/a/2", "l/b", "l/c", "l/d/x/y", "l/e", "l/f", "other",
            ];
            for (i, key) in keys.iter().enumerate() {
                c.put_object(key, Bytes::from(vec![b'k'; i + 1]), WriteCondition::None)
                    .await
                    .unwrap();
            }
            let mut objects = Vec::new();
            let mut prefixes = Vec::new();
            let mut token: Option<String> = None;
            let mut pages = 0;
            loop {
                let page = c
                    .list_objects("l/", Some("/"), token.as_deref(), 2)
                    .await
                    .unwrap();
                pages += 1;
                assert!(
                    page.objects.len() + page.common_prefixes.len() <= 2,
                    "{bucket}: page over max-keys"
                );
                objects.extend(page.objects.into_iter().map(|o| (o.key, o.size)));
                prefixes.extend(page.common_prefixes);
                match page.next_continuation_token {
                    Some(next) => token = Some(next),
                    None => break,
                }
                assert!(pages < 20, "{bucket}: listing does not end");
            }
            objects.sort();
            // Directory buckets may repeat a common prefix on a later page; callers must merge.
            prefixes.sort();
            prefixes.dedup();
            assert!(pages >= 3, "{bucket}: expected several pages, got {pages}");
            let expected: Vec<(String, u64)> = vec![
                ("l/b".into(), 3),
                ("l/c".into(), 4),
                ("l/e".into(), 6),
                ("l/f".into(), 7),
            ];
            assert_eq!(objects, expected, "{bucket}");
            assert_eq!(
                prefixes,
                vec!["l/a/".to_string(), "l/d/".to_string()],
                "{bucket}"
            );

            // Without a delimiter: every key under the prefix.
            let mut all: Vec<String> = Vec::new();
            let mut token: Option<String> = None;
            loop {
                let page = c
                    .list_objects("l/", None, token.as_deref(), 1000)
                    .await
                    .unwrap();
                all.extend(page.objects.into_iter().map(|o| o.key));
                token = page.next_continuation_token;
                if token.is_none() {
                    break;
                }
            }
            all.sort();
            assert_eq!(
                all,
                keys[..7].iter().map(|k| k.to_string()).collect::<Vec<_>>(),
                "{bucket}"
            );
        });
    }
}

fn multipart_roundtrip(bucket: &str, checksum: UploadChecksum) {
    let emu = common::emulator();
    let c = client_with(emu, bucket, |cfg| cfg.upload_checksum = checksum);
    block(async {
        let data = common::pattern(7, 6 * MIB + 123);
        let id = c.create_multipart_upload("mpu/obj").await.unwrap();
        let p1 = c
            .upload_part("mpu/obj", &id, 1, Bytes::from(data[..5 * MIB].to_vec()))
            .await
            .unwrap();
        let p2 = c
            .upload_part("mpu/obj", &id, 2, Bytes::from(data[5 * MIB..].to_vec()))
            .await
            .unwrap();
        assert_eq!((p1.part_number, p2.part_number), (1, 2));
        assert_eq!(
            p1.checksum.is_some(),
            checksum != UploadChecksum::Off,
            "{checksum:?}"
        );
        let done = c
            .complete_multipart_upload("mpu/obj", &id, vec![p1, p2], WriteCondition::IfNoneMatch)
            .await
            .unwrap();
        assert!(!done.etag.is_empty());
        let info = c.head_object("mpu/obj").await.unwrap();
        assert_eq!(info.size, data.len() as u64);
        let back = c
            .get_object("mpu/obj", 0..info.size, Some(&info.etag))
            .await
            .unwrap();
        assert_eq!(
            common::sha256_hex(&back),
            common::sha256_hex(&data),
            "{bucket} {checksum:?}"
        );

        // A second upload to the same key with If-None-Match must not replace it.
        let id2 = c.create_multipart_upload("mpu/obj").await.unwrap();
        let part = c
            .upload_part("mpu/obj", &id2, 1, Bytes::from_static(b"small"))
            .await
            .unwrap();
        let refused = c
            .complete_multipart_upload("mpu/obj", &id2, vec![part], WriteCondition::IfNoneMatch)
            .await;
        assert_eq!(
            refused,
            Err(ClientError::PreconditionFailed {
                key: "mpu/obj".into()
            })
        );
        c.abort_multipart_upload("mpu/obj", &id2).await.unwrap();
        assert_eq!(c.head_object("mpu/obj").await.unwrap().etag, info.etag);
        let (status, uploads) = admin(
            emu,
            "GET",
            &format!("/_emulator/uploads?bucket={bucket}"),
            "",
        );
        assert_eq!(status, 200, "{uploads}");
        assert!(
            !uploads.contains(&id2) && !uploads.contains(&id),
            "uploads left open: {uploads}"
        );

        // Single PUT with the same checksum setting.
        let small = common::pattern(8, 4096);
        c.put_object("small", Bytes::from(small.clone()), WriteCondition::None)
            .await
            .unwrap();
        assert_eq!(c.get_object("small", 0..4096, None).await.unwrap(), small);
    });
}

#[test]
fn multipart_and_checksums_directory_bucket() {
    for checksum in [
        UploadChecksum::Crc32c,
        UploadChecksum::Crc64Nvme,
        UploadChecksum::Off,
    ] {
        multipart_roundtrip(&common::fresh_bucket(true, "mpu"), checksum);
    }
}

#[test]
fn multipart_and_checksums_general_purpose_bucket() {
    for checksum in [
        UploadChecksum::Crc32c,
        UploadChecksum::Crc64Nvme,
        UploadChecksum::Off,
    ] {
        multipart_roundtrip(&common::fresh_bucket(false, "mpu"), checksum);
    }
}

#[test]
fn append_on_directory_bucket() {
    let [directory, general] = bucket_pair("append");
    let c = client(common::emulator(), &directory);
    block(async {
        let first = c
            .put_object("log", Bytes::from_static(b"hello "), WriteCondition::None)
            .await
            .unwrap();
        let appended = c
            .append_object(
                "log",
                6,
                Bytes::from_static(b"world"),
                WriteCondition::IfMatch(first.etag.clone()),
            )
            .await
            .unwrap();
        assert_eq!(appended.size, Some(11));
        assert_eq!(
            c.get_object("log", 0..100, None).await.unwrap(),
            &b"hello world"[..]
        );
        assert_eq!(c.head_object("log").await.unwrap().size, 11);

        // A writer that lost track of the size gets InvalidWriteOffset and nothing changes.
        let wrong = c
            .append_object("log", 3, Bytes::from_static(b"!"), WriteCondition::None)
            .await;
        assert!(
            matches!(wrong, Err(ClientError::InvalidWriteOffset { ref key, .. }) if key == "log"),
            "{wrong:?}"
        );
        // A stale ETag is a failed precondition.
        let stale = c
            .append_object(
                "log",
                11,
                Bytes::from_static(b"!"),
                WriteCondition::IfMatch(first.etag),
            )
            .await;
        assert_eq!(
            stale,
            Err(ClientError::PreconditionFailed { key: "log".into() })
        );
        assert_eq!(
            c.get_object("log", 0..100, None).await.unwrap(),
            &b"hello world"[..]
        );

        // Appending at offset 0 creates the object.
        let created = c
            .append_object("new", 0, Bytes::from_static(b"abc"), WriteCondition::None)
            .await
            .unwrap();
        assert_eq!(created.size, Some(3));
        assert_eq!(c.get_object("new", 0..3, None).await.unwrap(), &b"abc"[..]);
    });
    let gp = client(common::emulator(), &general);
    let refused = block(gp.append_object("x", 0, Bytes::from_static(b"a"), WriteCondition::None));
    assert!(
        matches!(refused, Err(ClientError::NotSupported(_))),
        "{refused:?}"
    );
}

#[test]
fn rename_on_directory_bucket() {
    let [directory, general] = bucket_pair("rename");
    let c = client(common::emulator(), &directory);
    block(async {
        let data = common::pattern(3, 70_000);
        c.put_object("src/a", Bytes::from(data.clone()), WriteCondition::None)
            .await
            .unwrap();
        c.rename_object("src/a", "dst/b", WriteCondition::IfNoneMatch)
            .await
            .unwrap();
        assert_eq!(c.get_object("dst/b", 0..70_000, None).await.unwrap(), data);
        assert_eq!(
            c.head_object("src/a").await,
            Err(ClientError::NotFound {
                key: "src/a".into()
            })
        );

        // Refused onto an existing destination with If-None-Match; both objects stay as they were.
        c.put_object("dst/c", Bytes::from_static(b"keep"), WriteCondition::None)
            .await
            .unwrap();
        let refused = c
            .rename_object("dst/b", "dst/c", WriteCondition::IfNoneMatch)
            .await;
        assert_eq!(
            refused,
            Err(ClientError::PreconditionFailed {
                key: "dst/c".into()
            })
        );
        assert_eq!(
            c.get_object("dst/c", 0..10, None).await.unwrap(),
            &b"keep"[..]
        );
        assert_eq!(c.head_object("dst/b").await.unwrap().size, 70_000);

        // Replacing with a matching destination ETag works.
        let target = c.head_object("dst/c").await.unwrap();
        c.rename_object("dst/b", "dst/c", WriteCondition::IfMatch(target.etag))
            .await
            .unwrap();
        assert_eq!(c.get_object("dst/c", 0..70_000, None).await.unwrap(), data);

        // Keys that need URL encoding in x-amz-rename-source.
        let odd = "odd dir/ü b+c%.bin";
        c.put_object(odd, Bytes::from_static(b"odd"), WriteCondition::None)
            .await
            .unwrap();
        c.rename_object(odd, "odd dir/renamed", WriteCondition::None)
            .await
            .unwrap();
        assert_eq!(
            c.get_object("odd dir/renamed", 0..3, None).await.unwrap(),
            &b"odd"[..]
        );

        let missing = c
            .rename_object("nothing/here", "dst/z", WriteCondition::None)
            .await;
        assert_eq!(
            missing,
            Err(ClientError::NotFound {
                key: "nothing/here".into()
            })
        );
    });
    let gp = client(common::emulator(), &general);
    let refused = block(gp.rename_object("a", "b", WriteCondition::None));
    assert!(
        matches!(refused, Err(ClientError::NotSupported(_))),
        "{refused:?}"
    );
}

#[test]
fn missing_buckets_and_keys_map_to_their_errors() {
    let emu = common::emulator();
    for bucket in [
        common::directory_bucket("absent"),
        common::general_bucket("absent"),
    ] {
        let c = client(emu, &bucket);
        let expected = ClientError::NoSuchBucket {
            bucket: bucket.clone(),
        };
        assert_eq!(
            block(c.head_bucket()),
            Err(expected.clone()),
            "head_bucket {bucket}"
        );
        assert_eq!(
            block(c.list_objects("", Some("/"), None, 10)).map(|_| ()),
            Err(expected.clone()),
            "{bucket}"
        );
        let got = block(c.get_object("k", 0..1, None));
        assert!(
            matches!(
                got,
                Err(ClientError::NoSuchBucket { .. }) | Err(ClientError::NotFound { .. })
            ),
            "{bucket}: {got:?}"
        );
    }
}

#[test]
fn sessions_are_refreshed_across_expiry() {
    let bucket = common::directory_bucket("session");
    let emu = common::start_emulator(EmulatorConfig {
        buckets: vec![bucket.clone()],
        session_ttl: Duration::from_secs(2),
        ..Default::default()
    });
    let c = client(&emu, &bucket);
    let started = Instant::now();
    let mut rounds = 0;
    block(async {
        while started.elapsed() < Duration::from_secs(10) {
            let key = format!("s/{rounds}");
            let data = common::pattern(rounds, 2000);
            c.put_object(&key, Bytes::from(data.clone()), WriteCondition::None)
                .await
                .unwrap_or_else(|e| panic!("put after {:?}: {e}", started.elapsed()));
            let back = c
                .get_object(&key, 0..2000, None)
                .await
                .unwrap_or_else(|e| panic!("get after {:?}: {e}", started.elapsed()));
            assert_eq!(back, data);
            c.list_objects("s/", Some("/"), None, 1000).await.unwrap();
            rounds += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    assert!(rounds >= 20, "only {rounds} rounds in 10 s");
}

/// Reads random ranges of `data` stored under `key` and checks every byte.
async fn check_random_reads(
    c: &SdkClient,
    key: &str,
    data: &[u8],
    etag: &str,
    reads: usize,
    seed: u64,
) {
    let mut state = seed | 1;
    for i in 0..reads {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let start = state % (data.len() as u64 + 1000);
        let len = (state >> 24) % (2 * MIB as u64) + 1;
        let pinned = (i % 2 == 0).then_some(etag);
        let got = c
            .get_object(key, start..start + len, pinned)
            .await
            .unwrap_or_else(|e| panic!("read {i} ({start}+{len}): {e}"));
        let s = (start as usize).min(data.len());
        let e = ((start + len) as usize).min(data.len());
        assert_eq!(got.len(), e - s, "read {i}: length");
        assert!(
            got[..] == data[s..e],
            "read {i} ({start}+{len}): wrong bytes"
        );
    }
    let whole = c
        .get_object(key, 0..data.len() as u64, Some(etag))
        .await
        .unwrap();
    assert_eq!(common::sha256_hex(&whole), common::sha256_hex(data));
}

/// Faults of `kinds` on a `rate` of the emulator's GetObject answers from now on.
fn set_get_faults(emu: &Emulator, rate: f64, seed: u64, kinds: &[&str]) {
    let faults = FaultConfig {
        rate,
        seed,
        operations: vec!["GetObject".into()],
        kinds: kinds.iter().map(|k| k.to_string()).collect(),
    };
    let (status, answer) = admin(
        emu,
        "POST",
        "/_emulator/faults",
        &serde_json_string(&faults),
    );
    assert!(
        (200..300).contains(&status),
        "setting faults: {status} {answer}"
    );
}

#[test]
fn get_resumes_after_broken_bodies() {
    let buckets = [
        common::directory_bucket("faults"),
        common::general_bucket("faults"),
    ];
    let emu = common::start_emulator(EmulatorConfig {
        buckets: buckets.to_vec(),
        ..Default::default()
    });
    let data = common::pattern(11, 6 * MIB + 777);
    for bucket in &buckets {
        let c = client(&emu, bucket);
        let etag = block(c.put_object("big", Bytes::from(data.clone()), WriteCondition::None))
            .unwrap()
            .etag;
        for seed in [1u64, 2, 3] {
            set_get_faults(&emu, 0.3, seed, &["reset-mid-body", "truncated-body"]);
            block(check_random_reads(&c, "big", &data, &etag, 30, seed));
        }
        admin(
            &emu,
            "POST",
            "/_emulator/faults",
            &serde_json_string(&FaultConfig::default()),
        );
        let counters = c.counters();
        assert!(
            counters.body_resumes > 0,
            "{bucket}: no body was ever broken, the test tested nothing"
        );
        eprintln!("{bucket}: {counters:?}");
    }
}

/// An emulator of its own for `bucket` that answers 30% of the `operations` with ExpiredToken.
fn emulator_expiring_tokens(bucket: &str, seed: u64, operations: &[&str]) -> Emulator {
    common::start_emulator(EmulatorConfig {
        buckets: vec![bucket.to_string()],
        faults: FaultConfig {
            rate: 0.3,
            seed,
            operations: operations.iter().map(|o| o.to_string()).collect(),
            kinds: vec!["expired-token".into()],
        },
        ..Default::default()
    })
}

/// Puts 300,000 bytes (seed `seed`) at "obj" and checks `reads` random ranged reads of them.
fn put_and_read_back(c: &SdkClient, seed: u64, reads: usize) {
    let data = common::pattern(seed, 300_000);
    block(async {
        let etag = c
            .put_object("obj", Bytes::from(data.clone()), WriteCondition::None)
            .await
            .unwrap()
            .etag;
        check_random_reads(c, "obj", &data, &etag, reads, seed).await;
    });
}

/// How many faults the emulator injected, by operation.
fn injected_by_operation(emu: &Emulator) -> std::collections::BTreeMap<String, u64> {
    let (status, body) = common::admin_get(emu, "/_emulator/faults");
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut by_op = std::collections::BTreeMap::new();
    for item in report["injected"].as_array().unwrap() {
        *by_op
            .entry(item["operation"].as_str().unwrap().to_string())
            .or_default() += item["count"].as_u64().unwrap();
    }
    by_op
}

#[test]
fn expired_sessions_are_replaced() {
    let bucket = common::directory_bucket("expired");
    let emu = emulator_expiring_tokens(&bucket, 5, &["GetObject"]);
    let c = client(&emu, &bucket);
    put_and_read_back(&c, 12, 40);
    assert!(
        c.counters().session_renewals > 0,
        "no session was ever rejected, the test tested nothing"
    );
}

/// On a general-purpose bucket an ExpiredToken answer (credentials that expired under the request) is retried
/// within the attempt budget with the credentials asked for again, for GETs and for the SDK's own requests:
/// a soak on a general-purpose bucket failed reads, uploads and lookups with EACCES at the first one.
#[test]
fn expired_credentials_on_a_general_purpose_bucket_are_retried() {
    let bucket = common::general_bucket("expiredgp");
    let operations = ["GetObject", "HeadObject", "ListObjectsV2", "PutObject"];
    let emu = emulator_expiring_tokens(&bucket, 17, &operations);
    let c = client(&emu, &bucket);
    let data = common::pattern(14, 300_000);
    block(async {
        let mut etag = String::new();
        for i in 0..10 {
            etag = c
                .put_object(
                    &format!("obj{i}"),
                    Bytes::from(data.clone()),
                    WriteCondition::None,
                )
                .await
                .unwrap_or_else(|e| panic!("put {i}: {e}"))
                .etag;
        }
        for i in 0..10 {
            let info = c
                .head_object(&format!("obj{i}"))
                .await
                .unwrap_or_else(|e| panic!("head {i}: {e}"));
            assert_eq!(info.size, data.len() as u64);
            let page = c
                .list_objects("", Some("/"), None, 1000)
                .await
                .unwrap_or_else(|e| panic!("list {i}: {e}"));
            assert_eq!(page.objects.len(), 10);
        }
        check_random_reads(&c, "obj9", &data, &etag, 40, 5).await;
    });
    let injected = injected_by_operation(&emu);
    assert!(
        operations.iter().all(|op| injected.contains_key(*op)),
        "every operation met an expired token at least once: {injected:?}"
    );
}

/// A CreateSession answered ExpiredToken is retried within the request's attempt budget, as the SDK's own
/// requests retry it (`SdkClient::run`): in a soak, a GET whose session renewal got that answer failed with
/// EACCES at once.
#[test]
fn an_expired_token_answer_to_create_session_is_retried() {
    let bucket = common::directory_bucket("expiredcs");
    let emu = emulator_expiring_tokens(&bucket, 11, &["GetObject", "CreateSession"]);
    let c = client(&emu, &bucket);
    put_and_read_back(&c, 13, 60);
    let injected = injected_by_operation(&emu);
    assert!(
        injected.contains_key("CreateSession"),
        "no CreateSession was refused, the test tested nothing: {injected:?}"
    );
}

/// FaultConfig as the body of `POST /_emulator/faults`.
fn serde_json_string(f: &FaultConfig) -> String {
    fn strs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    common::faults_json(f.rate, f.seed, &strs(&f.operations), &strs(&f.kinds))
}

/// The GetObject requests the emulator recorded for `bucket`.
fn recorded_gets(emu: &Emulator, bucket: &str) -> Vec<serde_json::Value> {
    let (status, body) = common::admin_get(
        emu,
        &format!("/_emulator/requests?bucket={bucket}&op=GetObject"),
    );
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn header<'a>(request: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    request["headers"][name].as_str()
}

/// The read path's GETs leave the SDK's orchestrator out (src/s3/sdk/direct.rs): we sign them, with the S3
/// Express session token on a directory bucket, and the bytes are the same. A configuration that path does not
/// cover (here SSE flags) reads through the SDK.
#[test]
fn gets_are_signed_by_us_unless_the_configuration_needs_the_sdk() {
    let [directory, general] = bucket_pair("direct");
    let emu = common::start_emulator(EmulatorConfig {
        buckets: vec![directory.clone(), general.clone()],
        record_requests: true,
        ..Default::default()
    });
    let data = common::pattern(31, 70_000);
    for bucket in [&directory, &general] {
        let c = client(&emu, bucket);
        block(async {
            c.put_object("d/k v", Bytes::from(data.clone()), WriteCondition::None)
                .await
                .unwrap();
            assert_eq!(
                c.get_object("d/k v", 10..40_000, None).await.unwrap(),
                &data[10..40_000]
            );
        });
        let gets = recorded_gets(&emu, bucket);
        assert_eq!(gets.len(), 1, "{bucket}: {gets:?}");
        let get = &gets[0];
        assert!(
            header(get, "user-agent").is_some_and(|a| a.starts_with("expressfs/")),
            "{bucket}: {get}"
        );
        assert_eq!(header(get, "range"), Some("bytes=10-39999"));
        // The emulator checks every signature, and on a directory bucket refuses a GET not signed with a
        // session's keys and token: the right bytes came back, so ours were right.
        assert_eq!(get["signed"], serde_json::Value::Bool(true), "{get}");
    }
    let c = client_with(&emu, &general, |config| config.sse = Some("AES256".into()));
    block(async {
        assert_eq!(c.get_object("d/k v", 0..5, None).await.unwrap(), &data[..5]);
    });
    let gets = recorded_gets(&emu, &general);
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert!(
        gets.iter()
            .any(|g| header(g, "user-agent").is_some_and(|a| !a.starts_with("expressfs/"))),
        "{gets:?}"
    );
}

/// A body that stops sending halfway is cut after `stall_timeout` and resumed, on GETs sent with and without
/// the SDK's orchestrator (which has its own stalled-stream protection): the bytes are right and no read waits
/// for the server's 20 s.
#[test]
fn a_body_that_stalls_midway_is_cut_and_resumed() {
    let buckets = bucket_pair("stall");
    let emu = common::start_emulator(EmulatorConfig {
        buckets: buckets.to_vec(),
        ..Default::default()
    });
    let data = common::pattern(17, MIB + 5);
    for bucket in &buckets {
        for sse in [None, Some("AES256")] {
            let c = client_with(&emu, bucket, |config| {
                config.stall_timeout = Duration::from_secs(1);
                config.sse = sse.map(str::to_string);
            });
            let etag = block(c.put_object("s", Bytes::from(data.clone()), WriteCondition::None))
                .unwrap()
                .etag;
            set_get_faults(&emu, 0.5, 3, &["stall-mid-body"]);
            let started = Instant::now();
            // Half the GETs stall after half their bytes; each resume asks for the rest.
            let got = block(c.get_object("s", 0..data.len() as u64, Some(&etag))).unwrap();
            admin(
                &emu,
                "POST",
                "/_emulator/faults",
                &serde_json_string(&FaultConfig::default()),
            );
            assert!(got[..] == data[..], "{bucket} sse={sse:?}: wrong bytes");
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "{bucket} sse={sse:?}: took {:?}",
                started.elapsed()
            );
            assert!(
                c.counters().body_resumes > 0,
                "{bucket} sse={sse:?}: nothing stalled"
            );
        }
    }
}

/// A session the bucket rejects is renewed once even when the attempt budget is one (AWS_MAX_ATTEMPTS=1): new
/// credentials are not a retry of a failed request. With every GET answered ExpiredToken, a GET costs one
/// request per attempt, plus the one renewal when the budget is a single attempt.
#[test]
fn a_rejected_session_is_renewed_once_whatever_the_attempt_budget() {
    for (attempts, gets) in [(1u32, 2u64), (3, 3)] {
        let bucket = common::directory_bucket("renewonce");
        let emu = common::start_emulator(EmulatorConfig {
            buckets: vec![bucket.clone()],
            ..Default::default()
        });
        let c = client_with(&emu, &bucket, |config| config.max_attempts = attempts);
        block(async {
            c.put_object("obj", Bytes::from_static(b"x"), WriteCondition::None)
                .await
                .unwrap();
        });
        admin(
            &emu,
            "POST",
            "/_emulator/faults",
            r#"{"rate":1.0,"seed":1,"operations":["GetObject"],"kinds":["expired-token"]}"#,
        );
        let result = block(c.get_object("obj", 0..1, None));
        assert!(result.is_err(), "every GET was refused: {result:?}");
        let sent = common::emulator_stat(&emu, Some(&bucket), Some("GetObject"), "requests");
        assert_eq!(sent, gets, "max_attempts {attempts}");
        assert!(
            c.counters().session_renewals >= 1,
            "max_attempts {attempts}"
        );
    }
}
