//! The random file operations both property tests draw from: `model_test.rs` (through the core, fake
//! client) and `tests/model_mount.rs` (through a real mount), and the model of what the file system must
//! then hold. Built only for tests (`cfg(test)` or the `testing` feature).

use std::collections::BTreeMap;

use proptest::prelude::*;

/// Files, by logical name: `d/` is the one directory, under whichever name it has now ([`Model::path`]).
pub const FILES: [&str; 5] = ["a", "b", "c", "d/e", "d/f"];
/// Symbolic links, by logical name; each points at one of [`TARGETS`].
pub const LINKS: [&str; 2] = ["l1", "d/l2"];
pub const TARGETS: [&str; 3] = ["a", "b", "c"];
/// The two names the directory takes in turn (`RenameDir`).
pub const DIR_NAMES: [&str; 2] = ["d", "g"];

#[derive(Debug, Clone)]
pub enum Op {
    /// Create or replace (O_TRUNC), written sequentially in `chunk`-byte writes.
    Write {
        file: usize,
        data: Vec<u8>,
        chunk: usize,
    },
    /// Open without O_TRUNC (creating if missing), write `data` at `offset`, close.
    Edit {
        file: usize,
        offset: u64,
        data: Vec<u8>,
    },
    /// A Write (`edit_at` None) or an Edit at `edit_at`, in one piece, while the bucket refuses every
    /// upload: its fsync or close fails, and the file stays what it was (a new file leaves no name). With
    /// `then`, once the refusals stop and while the failed descriptor is still open, a new O_TRUNC open
    /// writes `then` and closes; the failed descriptor is closed last.
    Refused {
        file: usize,
        data: Vec<u8>,
        edit_at: Option<u64>,
        then: Option<Vec<u8>>,
    },
    /// truncate(2) of a closed file.
    Truncate {
        file: usize,
        size: u64,
    },
    /// Three descriptors of one file (the first creates it if missing): each step writes through one and
    /// reads the whole file through the next.
    Shared {
        file: usize,
        steps: Vec<(usize, u64, Vec<u8>)>,
    },
    Read {
        file: usize,
    },
    Unlink {
        file: usize,
    },
    Rename {
        from: usize,
        to: usize,
    },
    /// The directory moves to its other name, with everything in it.
    RenameDir,
    Symlink {
        link: usize,
        target: usize,
    },
    /// readlink, and (on a mount) a read through the link.
    ReadLink {
        link: usize,
    },
    RemoveLink {
        link: usize,
    },
    List {
        in_d: bool,
    },
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..5usize, bytes(3000), 1..1500usize)
            .prop_map(|(file, data, chunk)| Op::Write { file, data, chunk }),
        2 => (0..5usize, 0..4000u64, bytes(2000))
            .prop_map(|(file, offset, data)| Op::Edit { file, offset, data }),
        1 => (
            0..5usize,
            bytes(3000),
            proptest::option::of(0..4000u64),
            proptest::option::of(bytes(2000))
        )
            .prop_map(|(file, data, edit_at, then)| Op::Refused { file, data, edit_at, then }),
        1 => (0..5usize, 0..5000u64).prop_map(|(file, size)| Op::Truncate { file, size }),
        1 => (
            0..5usize,
            proptest::collection::vec((0..3usize, 0..3000u64, bytes(600)), 1..5)
        )
            .prop_map(|(file, steps)| Op::Shared { file, steps }),
        3 => (0..5usize).prop_map(|file| Op::Read { file }),
        1 => (0..5usize).prop_map(|file| Op::Unlink { file }),
        1 => (0..5usize, 0..5usize).prop_map(|(from, to)| Op::Rename { from, to }),
        1 => Just(Op::RenameDir),
        1 => (0..2usize, 0..3usize).prop_map(|(link, target)| Op::Symlink { link, target }),
        1 => (0..2usize).prop_map(|link| Op::ReadLink { link }),
        1 => (0..2usize).prop_map(|link| Op::RemoveLink { link }),
        1 => any::<bool>().prop_map(|in_d| Op::List { in_d }),
    ]
}

/// What the file system must hold.
#[derive(Debug, Clone, Default)]
pub struct Model {
    pub files: BTreeMap<&'static str, Vec<u8>>,
    /// Link name -> index into [`TARGETS`].
    pub links: BTreeMap<&'static str, usize>,
    /// Which of [`DIR_NAMES`] the directory has now.
    pub dir: usize,
}

impl Model {
    /// Whether a [`Op::Refused`] has anything to upload, and so must fail: it creates the file, replaces
    /// it, or writes bytes into it (a write of nothing into an existing file changes nothing).
    pub fn refused_must_fail(&self, file: usize, data: &[u8], edit_at: Option<u64>) -> bool {
        !self.files.contains_key(FILES[file]) || edit_at.is_none() || !data.is_empty()
    }

    /// The path (relative to the test's root) of a logical name.
    pub fn path(&self, logical: &str) -> String {
        match logical.strip_prefix("d/") {
            Some(name) => format!("{}/{name}", DIR_NAMES[self.dir]),
            None => logical.to_string(),
        }
    }

    pub fn dir_name(&self) -> &'static str {
        DIR_NAMES[self.dir]
    }

    /// The text of a link: relative, so it still points at its target after the directory moves.
    pub fn link_text(link: usize, target: usize) -> String {
        if LINKS[link].starts_with("d/") {
            format!("../{}", TARGETS[target])
        } else {
            TARGETS[target].to_string()
        }
    }

    /// `data` written at `offset` (a file that did not exist starts empty; a gap reads as zeros; a write of
    /// nothing changes nothing, as pwrite(2) of zero bytes does).
    pub fn edit(&mut self, file: usize, offset: u64, data: &[u8]) {
        let bytes = self.files.entry(FILES[file]).or_default();
        if data.is_empty() {
            return;
        }
        let end = offset as usize + data.len();
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[offset as usize..end].copy_from_slice(data);
    }

    /// Cut or grown with zeros; false if the file does not exist.
    pub fn truncate(&mut self, file: usize, size: u64) -> bool {
        match self.files.get_mut(FILES[file]) {
            Some(bytes) => {
                bytes.resize(size as usize, 0);
                true
            }
            None => false,
        }
    }

    /// What a read through a link gives: its target's bytes, if the target exists.
    pub fn through_link(&self, link: usize) -> Option<&Vec<u8>> {
        let target = self.links.get(LINKS[link])?;
        self.files.get(TARGETS[*target])
    }

    /// The names a listing of the root (`in_d` false: its files, links and the directory) or of the
    /// directory must show, sorted.
    pub fn listing(&self, in_d: bool) -> Vec<String> {
        let mut want: Vec<String> = self
            .files
            .keys()
            .chain(self.links.keys())
            .filter_map(|k| match (in_d, k.split_once('/')) {
                (true, Some((_, n))) => Some(n.to_string()),
                (false, None) => Some(k.to_string()),
                _ => None,
            })
            .collect();
        if !in_d {
            want.push(self.dir_name().into());
        }
        want.sort();
        want
    }
}
