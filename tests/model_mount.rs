//! The property test of `src/fs/model_test.rs`, shorter, through a real mount and the emulator: random
//! sequences of creates, writes, edits of existing files, writes the bucket refuses, truncates, several
//! descriptors on one file, reads, unlinks, renames of files and of the directory, symlinks and listings,
//! compared with the model of `expressfs::fs::model_ops`. One mount per bucket kind; each case works in a fresh
//! directory.

mod common;

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::fd::IntoRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{Mount, own_emulator, refuse_every_upload, set_faults};
use expressfs::fs::model_ops::{DIR_NAMES, FILES, LINKS, Model, Op, op};
use expressfs_emulator::Emulator;
use proptest::prelude::*;

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// close(2), checked (an upload's failure shows there).
fn close(f: File) {
    // SAFETY: the descriptor was just taken out of the File: open, and owned by nobody else.
    let rc = unsafe { libc::close(f.into_raw_fd()) };
    assert_eq!(rc, 0, "close: {}", std::io::Error::last_os_error());
}

fn open_rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

fn read_all(f: &File) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read_at(&mut buf, out.len() as u64).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// What the mount holds under `path`: its bytes, or None if there is no such file.
fn held(path: &Path) -> Option<Vec<u8>> {
    match std::fs::read(path) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => panic!("read {}: {e}", path.display()),
    }
}

/// `settle`: longer than the daemon holds a release back.
fn run(emu: &Emulator, root: &Path, ops: Vec<Op>, settle: std::time::Duration) {
    let mut model = Model::default();
    std::fs::create_dir(root).unwrap();
    std::fs::create_dir(root.join(model.dir_name())).unwrap();
    for op in ops {
        match op {
            Op::Write { file, data, chunk } => {
                let mut f = File::create(root.join(model.path(FILES[file]))).unwrap();
                for piece in data.chunks(chunk) {
                    f.write_all(piece).unwrap();
                }
                close(f);
                model.files.insert(FILES[file], data);
            }
            Op::Refused {
                file,
                data,
                edit_at,
                then,
            } => {
                let path = root.join(model.path(FILES[file]));
                let must_fail = model.refused_must_fail(file, &data, edit_at);
                refuse_every_upload(emu);
                let f = match edit_at {
                    None => File::create(&path).unwrap(),
                    Some(_) => open_rw(&path),
                };
                let wrote = f.write_all_at(&data, edit_at.unwrap_or(0));
                let synced = f.sync_all();
                assert!(
                    !must_fail || wrote.is_err() || synced.is_err(),
                    "{}: an upload went through",
                    FILES[file]
                );
                if let Some(then) = then {
                    set_faults(emu, 0.0, 0, &[], &[]);
                    let mut again = File::create(&path).expect("a new open past the failed one");
                    again.write_all(&then).unwrap();
                    close(again);
                    model.files.insert(FILES[file], then);
                }
                // Its close may say the error again. A staged file's release (after close, asynchronous)
                // tries the upload once more: the refusals last until the file is what the model says.
                // Each look opens the file, and an open handle keeps a staged file alive: looks come no
                // faster than releases are let through, or they would keep it alive for ever.
                drop(f);
                let want = model.files.get(FILES[file]).cloned();
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while held(&path) != want && std::time::Instant::now() < deadline {
                    std::thread::sleep(settle);
                }
                set_faults(emu, 0.0, 0, &[], &[]);
                let got = held(&path);
                assert!(
                    got == want,
                    "{} after a refused write: {:?} bytes, the model {:?}",
                    FILES[file],
                    got.as_ref().map(Vec::len),
                    want.as_ref().map(Vec::len)
                );
            }
            Op::Edit { file, offset, data } => {
                let f = open_rw(&root.join(model.path(FILES[file])));
                f.write_all_at(&data, offset).unwrap();
                close(f);
                model.edit(file, offset, &data);
            }
            Op::Truncate { file, size } => {
                let result =
                    nix::unistd::truncate(&root.join(model.path(FILES[file])), size as i64);
                if model.truncate(file, size) {
                    result.unwrap();
                } else {
                    assert_eq!(result, Err(nix::errno::Errno::ENOENT));
                }
            }
            Op::Shared { file, steps } => {
                let path = root.join(model.path(FILES[file]));
                let fds: Vec<File> = (0..3).map(|_| open_rw(&path)).collect();
                model.files.entry(FILES[file]).or_default();
                for (i, offset, data) in steps {
                    fds[i].write_all_at(&data, offset).unwrap();
                    model.edit(file, offset, &data);
                    let got = read_all(&fds[(i + 1) % 3]);
                    assert!(
                        got == model.files[FILES[file]],
                        "{}: {} bytes read through another descriptor, {} expected",
                        FILES[file],
                        got.len(),
                        model.files[FILES[file]].len()
                    );
                }
                for f in fds {
                    close(f);
                }
            }
            Op::Read { file } => match (
                std::fs::read(root.join(model.path(FILES[file]))),
                model.files.get(FILES[file]),
            ) {
                (Ok(got), Some(want)) => assert!(got == *want, "bytes of {}", FILES[file]),
                (Err(e), None) if e.kind() == ErrorKind::NotFound => {}
                (got, want) => panic!("{}: mount says {got:?}, model says {want:?}", FILES[file]),
            },
            Op::Unlink { file } => {
                let result = std::fs::remove_file(root.join(model.path(FILES[file])));
                match model.files.remove(FILES[file]) {
                    Some(_) => result.unwrap(),
                    None => assert_eq!(result.unwrap_err().kind(), ErrorKind::NotFound),
                }
            }
            Op::Rename { from, to } => {
                let result = std::fs::rename(
                    root.join(model.path(FILES[from])),
                    root.join(model.path(FILES[to])),
                );
                match model.files.get(FILES[from]).cloned() {
                    Some(data) => {
                        result.unwrap();
                        model.files.remove(FILES[from]);
                        model.files.insert(FILES[to], data);
                    }
                    None => assert_eq!(result.unwrap_err().kind(), ErrorKind::NotFound),
                }
            }
            Op::RenameDir => {
                let to = DIR_NAMES[1 - model.dir];
                std::fs::rename(root.join(model.dir_name()), root.join(to)).unwrap();
                model.dir = 1 - model.dir;
            }
            Op::Symlink { link, target } => {
                let text = Model::link_text(link, target);
                let result = std::os::unix::fs::symlink(&text, root.join(model.path(LINKS[link])));
                if model.links.contains_key(LINKS[link]) {
                    assert_eq!(result.unwrap_err().kind(), ErrorKind::AlreadyExists);
                } else {
                    result.unwrap();
                    model.links.insert(LINKS[link], target);
                }
            }
            Op::ReadLink { link } => {
                let path = root.join(model.path(LINKS[link]));
                match (std::fs::read_link(&path), model.links.get(LINKS[link])) {
                    (Ok(got), Some(target)) => {
                        assert_eq!(got, Path::new(&Model::link_text(link, *target)));
                        match (std::fs::read(&path), model.through_link(link)) {
                            (Ok(got), Some(want)) => {
                                assert!(got == *want, "bytes through {}", LINKS[link])
                            }
                            (Err(e), None) if e.kind() == ErrorKind::NotFound => {}
                            (got, want) => panic!(
                                "through {}: mount says {got:?}, model says {want:?}",
                                LINKS[link]
                            ),
                        }
                    }
                    (Err(e), None) if e.kind() == ErrorKind::NotFound => {}
                    (got, want) => {
                        panic!("{}: mount says {got:?}, model says {want:?}", LINKS[link])
                    }
                }
            }
            Op::RemoveLink { link } => {
                let result = std::fs::remove_file(root.join(model.path(LINKS[link])));
                match model.links.remove(LINKS[link]) {
                    Some(_) => result.unwrap(),
                    None => assert_eq!(result.unwrap_err().kind(), ErrorKind::NotFound),
                }
            }
            Op::List { in_d } => {
                let dir = if in_d {
                    root.join(model.dir_name())
                } else {
                    root.to_path_buf()
                };
                assert_eq!(
                    listing(&dir),
                    model.listing(in_d),
                    "in the directory: {in_d}"
                );
            }
        }
    }
}

/// `release_delay_ms`: how long the daemon holds every release (a test build's
/// `EXPRESSFS_TEST_RELEASE_DELAY_MS`), to open the window a loaded kernel leaves between close(2) and the
/// release, in which the file may be opened, renamed or unlinked again.
fn random_operations_on(directory: bool, cases: u32, release_delay_ms: Option<u32>) {
    // The mount lives in this test (not in a static) so it is unmounted when the test ends.
    // An emulator of its own: its refusals of uploads (`Op::Refused`) must reach no other test.
    let (bucket, emu) = own_emulator(directory, "model");
    let delay = release_delay_ms.map(|ms| ms.to_string());
    let env: Vec<(&str, &str)> = delay
        .iter()
        .map(|ms| ("EXPRESSFS_TEST_RELEASE_DELAY_MS", ms.as_str()))
        .collect();
    let mount = Mount::on_with_env(
        &emu,
        &bucket,
        &["--allow-overwrite", "--allow-delete"],
        &env,
    );
    if release_delay_ms.is_some() {
        assert!(
            mount.log().contains("every release is held back"),
            "the daemon did not take the delay (a release build?):\n{}",
            mount.log()
        );
    }
    let settle =
        std::time::Duration::from_millis(2 * u64::from(release_delay_ms.unwrap_or(0)) + 50);
    let case = AtomicUsize::new(0);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        ..ProptestConfig::default()
    });
    let result = runner.run(&proptest::collection::vec(op(), 1..25), |ops| {
        let n = case.fetch_add(1, Ordering::Relaxed);
        run(&emu, &mount.path().join(format!("case-{n}")), ops, settle);
        Ok(())
    });
    if let Err(e) = result {
        // The daemon's log first: CI keeps the tail of the output, and the failing sequence belongs there.
        eprintln!("--- expressfs log ---\n{}", mount.log());
        drop(mount);
        panic!("{e}");
    }
}

/// Cases per run: the default, or `EXPRESSFS_MODEL_CASES` (to hunt a rare failure with many more).
fn cases(default: u32) -> u32 {
    std::env::var("EXPRESSFS_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn random_operations_through_a_mount_match_the_model() {
    random_operations_on(true, cases(32), None);
}

#[test]
fn random_operations_through_a_general_purpose_mount_match_the_model() {
    random_operations_on(false, cases(16), None);
}

#[test]
fn random_operations_with_late_releases_match_the_model() {
    random_operations_on(true, cases(200), Some(30));
}

#[test]
fn random_operations_on_a_general_purpose_mount_with_late_releases_match_the_model() {
    random_operations_on(false, cases(100), Some(30));
}
