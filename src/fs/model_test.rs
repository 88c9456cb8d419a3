//! Property test: random sequences of file operations through the core (with the in-memory fake client)
//! against a model of what the file system should hold. Metadata is cached for 60 s, so this also checks that
//! our own writes, deletes and renames are never seen stale.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::model_ops::{FILES, Op, expected_listing, op};
use super::{FsConfig, FsError, OpenMode, ROOT_INO, S3Filesystem};
use crate::s3::ObjectClient;
use crate::s3::fake::FakeClient;

async fn parent_of(fs: &S3Filesystem, path: &str) -> (u64, String) {
    match path.split_once('/') {
        Some((dir, name)) => (
            fs.sb.lookup(ROOT_INO, dir).await.expect("d exists").ino,
            name.to_string(),
        ),
        None => (ROOT_INO, path.to_string()),
    }
}

async fn run(ops: Vec<Op>) {
    let fake = Arc::new(FakeClient::new("b", true));
    let client: Arc<dyn ObjectClient> = fake.clone();
    let mut config = FsConfig::new(0, 0);
    config.allow_overwrite = true;
    config.allow_delete = true;
    config.metadata_ttl = std::time::Duration::from_secs(60);
    config.negative_metadata_ttl = std::time::Duration::from_secs(60);
    let fs = S3Filesystem::new(client, config);
    fs.sb.mkdir(ROOT_INO, "d").await.unwrap();
    let mut model: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Write { file, data, chunk } => {
                let (parent, name) = parent_of(&fs, FILES[file]).await;
                let fh = match fs.sb.lookup(parent, &name).await {
                    Ok(a) => {
                        fs.open(
                            a.ino,
                            OpenMode {
                                write: true,
                                truncate: true,
                                ..Default::default()
                            },
                            0,
                        )
                        .await
                        .unwrap()
                        .fh
                    }
                    Err(FsError::NotFound) => fs.create(parent, &name, 0).await.unwrap().1,
                    Err(e) => panic!("lookup before write: {e}"),
                };
                let mut off = 0;
                for piece in data.chunks(chunk) {
                    fs.write(fh, off, piece).await.unwrap();
                    off += piece.len() as u64;
                }
                fs.flush(fh, 0).await.unwrap();
                fs.release(fh).await.unwrap();
                model.insert(FILES[file], data);
            }
            Op::Read { file } => {
                let (parent, name) = parent_of(&fs, FILES[file]).await;
                match (fs.sb.lookup(parent, &name).await, model.get(FILES[file])) {
                    (Ok(a), Some(want)) => {
                        assert_eq!(a.size, want.len() as u64, "size of {}", FILES[file]);
                        let fh = fs
                            .open(
                                a.ino,
                                OpenMode {
                                    read: true,
                                    ..Default::default()
                                },
                                0,
                            )
                            .await
                            .unwrap()
                            .fh;
                        let got = fs.read(fh, 0, 10_000).await.unwrap();
                        fs.release(fh).await.unwrap();
                        assert_eq!(&got[..], &want[..], "bytes of {}", FILES[file]);
                    }
                    (Err(FsError::NotFound), None) => {}
                    (got, want) => panic!("{}: fs says {got:?}, model says {want:?}", FILES[file]),
                }
            }
            Op::Unlink { file } => {
                let (parent, name) = parent_of(&fs, FILES[file]).await;
                let result = fs.sb.unlink(parent, &name).await;
                match model.remove(FILES[file]) {
                    Some(_) => result.unwrap(),
                    None => assert!(matches!(result, Err(FsError::NotFound)), "{result:?}"),
                }
            }
            Op::Rename { from, to } => {
                let (p1, n1) = parent_of(&fs, FILES[from]).await;
                let (p2, n2) = parent_of(&fs, FILES[to]).await;
                let result = fs.sb.rename(p1, &n1, p2, &n2, false).await;
                match model.get(FILES[from]).cloned() {
                    Some(data) => {
                        result.unwrap();
                        model.remove(FILES[from]);
                        model.insert(FILES[to], data);
                    }
                    None => assert!(matches!(result, Err(FsError::NotFound)), "{result:?}"),
                }
            }
            Op::List { in_d } => {
                let dir = if in_d {
                    fs.sb.lookup(ROOT_INO, "d").await.unwrap().ino
                } else {
                    ROOT_INO
                };
                let fh = fs.opendir(dir).unwrap();
                let mut names: Vec<String> = fs
                    .readdir(fh, 0)
                    .await
                    .unwrap()
                    .iter()
                    .map(|e| e.name.clone())
                    .filter(|n| n != "." && n != "..")
                    .collect();
                names.sort();
                let want = expected_listing(&model, in_d);
                assert_eq!(names, want, "listing of {}", if in_d { "d" } else { "/" });
            }
        }
    }
    assert_eq!(fake.open_uploads(), 0, "uploads left open");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn random_operations_match_the_model(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(run(ops));
    }
}
