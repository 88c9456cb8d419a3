//! Property test: random sequences of file operations through the core (with the in-memory fake client)
//! against a model of what the file system should hold. Metadata is cached for 60 s, so this also checks that
//! our own writes, deletes and renames are never seen stale.

use std::sync::Arc;

use proptest::prelude::*;

use super::attrs::StoredAttrs;
use super::model_ops::{DIR_NAMES, FILES, LINKS, Model, Op, op};
use super::test_support::RW;
use super::{FsConfig, FsError, OpenMode, ROOT_INO, S3Filesystem};
use crate::s3::ObjectClient;
use crate::s3::fake::{FakeClient, Op as FakeOp, transient};

async fn parent_of(fs: &S3Filesystem, path: &str) -> (u64, String) {
    match path.split_once('/') {
        Some((dir, name)) => (
            fs.sb
                .lookup(ROOT_INO, dir)
                .await
                .expect("the directory exists")
                .ino,
            name.to_string(),
        ),
        None => (ROOT_INO, path.to_string()),
    }
}

/// A handle of `path` open for reading and writing, without O_TRUNC; created if missing.
async fn open_rw(fs: &S3Filesystem, path: &str) -> u64 {
    let (parent, name) = parent_of(fs, path).await;
    match fs.sb.lookup(parent, &name).await {
        Ok(a) => fs.open(a.ino, RW, 0).await.unwrap().fh,
        Err(FsError::NotFound) => fs.create(parent, &name, 0).await.unwrap().1,
        Err(e) => panic!("lookup of {path}: {e}"),
    }
}

async fn close(fs: &S3Filesystem, fh: u64) {
    fs.flush(fh, 0).await.unwrap();
    fs.release(fh).await.unwrap();
}

/// An O_TRUNC open of `path`, created if missing.
async fn open_truncating(fs: &S3Filesystem, path: &str) -> u64 {
    let (parent, name) = parent_of(fs, path).await;
    match fs.sb.lookup(parent, &name).await {
        Ok(a) => {
            let mode = OpenMode {
                write: true,
                truncate: true,
                ..Default::default()
            };
            fs.open(a.ino, mode, 0).await.unwrap().fh
        }
        Err(FsError::NotFound) => fs.create(parent, &name, 0).await.unwrap().1,
        Err(e) => panic!("lookup of {path}: {e}"),
    }
}

/// Every kind of upload fails from now (`refuse`) or no more (`!refuse`).
fn refuse_uploads(fake: &FakeClient, refuse: bool) {
    for op in [
        FakeOp::Put,
        FakeOp::Append,
        FakeOp::CreateUpload,
        FakeOp::UploadPart,
        FakeOp::UploadPartCopy,
        FakeOp::CompleteUpload,
    ] {
        let n = if refuse { u64::MAX } else { 0 };
        fake.faults().fail_next(op, n, transient());
    }
}

/// What the file system holds under `path` now: its bytes, or None if it has no such file.
async fn held(fs: &S3Filesystem, path: &str) -> Option<Vec<u8>> {
    let (parent, name) = parent_of(fs, path).await;
    let a = match fs.sb.lookup(parent, &name).await {
        Ok(a) => a,
        Err(FsError::NotFound) => return None,
        Err(e) => panic!("lookup of {path}: {e}"),
    };
    let read = OpenMode {
        read: true,
        ..Default::default()
    };
    let fh = fs.open(a.ino, read, 0).await.unwrap().fh;
    let got = fs.read(fh, 0, 100_000).await.unwrap();
    fs.release(fh).await.unwrap();
    assert_eq!(a.size, got.len() as u64, "size of {path}");
    Some(got.to_vec())
}

async fn check_bytes(fs: &S3Filesystem, fh: u64, want: &[u8], what: &str) {
    let got = fs.read(fh, 0, 100_000).await.unwrap();
    assert!(
        got[..] == want[..],
        "bytes of {what}: {} read, {} expected",
        got.len(),
        want.len()
    );
}

async fn run(ops: Vec<Op>) {
    let fake = Arc::new(FakeClient::new("b", true));
    let client: Arc<dyn ObjectClient> = fake.clone();
    // Refused uploads keep their local copies under the staging directory: this run's own, removed after it.
    let staging = tempfile::tempdir().unwrap();
    let mut config = FsConfig::new(0, 0);
    config.staging_dir = Some(staging.path().to_path_buf());
    config.allow_overwrite = true;
    config.allow_delete = true;
    config.metadata_ttl = std::time::Duration::from_secs(60);
    config.negative_metadata_ttl = std::time::Duration::from_secs(60);
    let fs = S3Filesystem::new(client, config);
    let mut model = Model::default();
    fs.sb.mkdir(ROOT_INO, model.dir_name()).await.unwrap();
    for op in ops {
        match op {
            Op::Write { file, data, chunk } => {
                let (parent, name) = parent_of(&fs, &model.path(FILES[file])).await;
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
                close(&fs, fh).await;
                model.files.insert(FILES[file], data);
            }
            Op::Refused {
                file,
                data,
                edit_at,
                then,
            } => {
                let path = model.path(FILES[file]);
                let must_fail = model.refused_must_fail(file, &data, edit_at);
                refuse_uploads(&fake, true);
                let fh = match edit_at {
                    None => open_truncating(&fs, &path).await,
                    Some(_) => open_rw(&fs, &path).await,
                };
                let wrote = fs.write(fh, edit_at.unwrap_or(0), &data).await;
                let synced = fs.fsync(fh).await;
                assert!(
                    !must_fail || wrote.is_err() || synced.is_err(),
                    "{path}: an upload went through"
                );
                if let Some(then) = then {
                    refuse_uploads(&fake, false);
                    let again = open_truncating(&fs, &path).await;
                    fs.write(again, 0, &then).await.unwrap();
                    close(&fs, again).await;
                    model.files.insert(FILES[file], then);
                }
                // The failed descriptor's close may say its error again (a staged file's close tries its
                // upload once more: still refused without `then`); what the file holds is checked below.
                let _ = fs.flush(fh, 0).await;
                let _ = fs.release(fh).await;
                refuse_uploads(&fake, false);
                let want = model.files.get(FILES[file]).cloned();
                let got = held(&fs, &path).await;
                assert!(
                    got == want,
                    "{path} after a refused write: {:?} bytes, the model {:?}",
                    got.as_ref().map(Vec::len),
                    want.as_ref().map(Vec::len)
                );
            }
            Op::Edit { file, offset, data } => {
                let fh = open_rw(&fs, &model.path(FILES[file])).await;
                fs.write(fh, offset, &data).await.unwrap();
                close(&fs, fh).await;
                model.edit(file, offset, &data);
            }
            Op::Truncate { file, size } => {
                let (parent, name) = parent_of(&fs, &model.path(FILES[file])).await;
                let result = match fs.sb.lookup(parent, &name).await {
                    Ok(a) => fs
                        .setattr(a.ino, Some(size), None, StoredAttrs::default())
                        .await
                        .map(|a| a.size),
                    Err(e) => Err(e),
                };
                if model.truncate(file, size) {
                    assert_eq!(result.unwrap(), size);
                } else {
                    assert!(matches!(result, Err(FsError::NotFound)), "{result:?}");
                }
            }
            Op::Shared { file, steps } => {
                let path = model.path(FILES[file]);
                let mut fhs = Vec::new();
                for _ in 0..3 {
                    fhs.push(open_rw(&fs, &path).await);
                }
                model.files.entry(FILES[file]).or_default();
                for (i, offset, data) in steps {
                    fs.write(fhs[i], offset, &data).await.unwrap();
                    model.edit(file, offset, &data);
                    let want = model.files[FILES[file]].clone();
                    check_bytes(&fs, fhs[(i + 1) % 3], &want, &path).await;
                }
                for fh in fhs {
                    close(&fs, fh).await;
                }
            }
            Op::Read { file } => {
                let (parent, name) = parent_of(&fs, &model.path(FILES[file])).await;
                match (
                    fs.sb.lookup(parent, &name).await,
                    model.files.get(FILES[file]),
                ) {
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
                        check_bytes(&fs, fh, want, FILES[file]).await;
                        fs.release(fh).await.unwrap();
                    }
                    (Err(FsError::NotFound), None) => {}
                    (got, want) => panic!("{}: fs says {got:?}, model says {want:?}", FILES[file]),
                }
            }
            Op::Unlink { file } => {
                let (parent, name) = parent_of(&fs, &model.path(FILES[file])).await;
                let result = fs.sb.unlink(parent, &name).await;
                match model.files.remove(FILES[file]) {
                    Some(_) => result.unwrap(),
                    None => assert!(matches!(result, Err(FsError::NotFound)), "{result:?}"),
                }
            }
            Op::Rename { from, to } => {
                let (p1, n1) = parent_of(&fs, &model.path(FILES[from])).await;
                let (p2, n2) = parent_of(&fs, &model.path(FILES[to])).await;
                let result = fs.rename(p1, &n1, p2, &n2, false).await;
                match model.files.get(FILES[from]).cloned() {
                    Some(data) => {
                        result.unwrap();
                        model.files.remove(FILES[from]);
                        model.files.insert(FILES[to], data);
                    }
                    None => assert!(matches!(result, Err(FsError::NotFound)), "{result:?}"),
                }
            }
            Op::RenameDir => {
                let (from, to) = (model.dir_name(), DIR_NAMES[1 - model.dir]);
                fs.rename(ROOT_INO, from, ROOT_INO, to, false)
                    .await
                    .unwrap();
                model.dir = 1 - model.dir;
            }
            Op::Symlink { link, target } => {
                let (parent, name) = parent_of(&fs, &model.path(LINKS[link])).await;
                let text = Model::link_text(link, target);
                let result = fs.sb.symlink(parent, &name, text.as_bytes()).await;
                if model.links.contains_key(LINKS[link]) {
                    assert!(matches!(result, Err(FsError::Exists)), "{result:?}");
                } else {
                    result.unwrap();
                    model.links.insert(LINKS[link], target);
                }
            }
            Op::ReadLink { link } => {
                let (parent, name) = parent_of(&fs, &model.path(LINKS[link])).await;
                match (
                    fs.sb.lookup(parent, &name).await,
                    model.links.get(LINKS[link]),
                ) {
                    (Ok(a), Some(target)) => {
                        let got = fs.sb.readlink(a.ino).await.unwrap();
                        assert_eq!(&got[..], Model::link_text(link, *target).as_bytes());
                    }
                    (Err(FsError::NotFound), None) => {}
                    (got, want) => panic!("{}: fs says {got:?}, model says {want:?}", LINKS[link]),
                }
            }
            Op::RemoveLink { link } => {
                let (parent, name) = parent_of(&fs, &model.path(LINKS[link])).await;
                let result = fs.sb.unlink(parent, &name).await;
                match model.links.remove(LINKS[link]) {
                    Some(_) => result.unwrap(),
                    None => assert!(matches!(result, Err(FsError::NotFound)), "{result:?}"),
                }
            }
            Op::List { in_d } => {
                let dir = if in_d {
                    fs.sb.lookup(ROOT_INO, model.dir_name()).await.unwrap().ino
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
                assert_eq!(
                    names,
                    model.listing(in_d),
                    "listing (in the directory: {in_d})"
                );
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
