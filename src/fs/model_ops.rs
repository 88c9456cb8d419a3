//! The random file operations both property tests draw from: `model_test.rs` (through the core, fake
//! client) and `tests/model_mount.rs` (through a real mount). Built only for tests (`cfg(test)` or the
//! `testing` feature).

use std::collections::BTreeMap;

use proptest::prelude::*;

pub const FILES: [&str; 5] = ["a", "b", "c", "d/e", "d/f"];

#[derive(Debug, Clone)]
pub enum Op {
    Write {
        file: usize,
        data: Vec<u8>,
        chunk: usize,
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
    List {
        in_d: bool,
    },
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            0..5usize,
            proptest::collection::vec(any::<u8>(), 0..3000),
            1..1500usize
        )
            .prop_map(|(file, data, chunk)| Op::Write { file, data, chunk }),
        (0..5usize).prop_map(|file| Op::Read { file }),
        (0..5usize).prop_map(|file| Op::Unlink { file }),
        (0..5usize, 0..5usize).prop_map(|(from, to)| Op::Rename { from, to }),
        any::<bool>().prop_map(|in_d| Op::List { in_d }),
    ]
}

/// The names a listing of the root (`in_d` false: the files there and `d`) or of `d` must show, sorted.
pub fn expected_listing(model: &BTreeMap<&str, Vec<u8>>, in_d: bool) -> Vec<String> {
    let mut want: Vec<String> = model
        .keys()
        .filter_map(|k| match (in_d, k.split_once('/')) {
            (true, Some((_, n))) => Some(n.to_string()),
            (false, None) => Some(k.to_string()),
            _ => None,
        })
        .collect();
    if !in_d {
        want.push("d".into());
    }
    want.sort();
    want
}
