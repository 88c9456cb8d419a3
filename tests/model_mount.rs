//! The property test of `src/fs/model_test.rs`, shorter, through a real mount and the emulator: random
//! create/write/close/read/unlink/rename/mkdir/readdir sequences compared with an in-memory model of what the
//! file system must hold. One mount; each case works in a fresh directory.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{Mount, fresh_bucket};
use expressfs::fs::model_ops::{FILES, Op, expected_listing, op};
use proptest::prelude::*;

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn run(root: &Path, ops: Vec<Op>) {
    std::fs::create_dir(root).unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    let mut model: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Write { file, data, chunk } => {
                let mut f = std::fs::File::create(root.join(FILES[file])).unwrap();
                for piece in data.chunks(chunk) {
                    f.write_all(piece).unwrap();
                }
                drop(f);
                model.insert(FILES[file], data);
            }
            Op::Read { file } => match (
                std::fs::read(root.join(FILES[file])),
                model.get(FILES[file]),
            ) {
                (Ok(got), Some(want)) => assert!(got == *want, "bytes of {}", FILES[file]),
                (Err(e), None) if e.kind() == std::io::ErrorKind::NotFound => {}
                (got, want) => panic!("{}: mount says {got:?}, model says {want:?}", FILES[file]),
            },
            Op::Unlink { file } => {
                let result = std::fs::remove_file(root.join(FILES[file]));
                match model.remove(FILES[file]) {
                    Some(_) => result.unwrap(),
                    None => assert_eq!(result.unwrap_err().kind(), std::io::ErrorKind::NotFound),
                }
            }
            Op::Rename { from, to } => {
                let result = std::fs::rename(root.join(FILES[from]), root.join(FILES[to]));
                match model.get(FILES[from]).cloned() {
                    Some(data) => {
                        result.unwrap();
                        model.remove(FILES[from]);
                        model.insert(FILES[to], data);
                    }
                    None => assert_eq!(result.unwrap_err().kind(), std::io::ErrorKind::NotFound),
                }
            }
            Op::List { in_d } => {
                let dir = if in_d {
                    root.join("d")
                } else {
                    root.to_path_buf()
                };
                let want = expected_listing(&model, in_d);
                assert_eq!(listing(&dir), want);
            }
        }
    }
}

#[test]
fn random_operations_through_a_mount_match_the_model() {
    // The mount lives in this test (not in a static) so it is unmounted when the test ends.
    let bucket = fresh_bucket(true, "model");
    let mount = Mount::new(&bucket, &["--allow-overwrite", "--allow-delete"]);
    let case = AtomicUsize::new(0);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    });
    let result = runner.run(&proptest::collection::vec(op(), 1..25), |ops| {
        let n = case.fetch_add(1, Ordering::Relaxed);
        run(&mount.path().join(format!("case-{n}")), ops);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}\n{}", mount.log());
    }
}
