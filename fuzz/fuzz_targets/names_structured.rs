//! Structured input: a directory made of components plus one name. Raw bytes rarely produce a key that
//! really starts with the directory prefix; building the keys from the parts does, so the listing
//! direction (key -> name -> key) is exercised on keys and prefixes that belong to the directory.
#![no_main]

use arbitrary::Arbitrary;
use expressfs::fs::names::{check_round_trips, dir_prefix, file_key};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    dir: Vec<&'a str>,
    name: &'a str,
}

fuzz_target!(|input: Input<'_>| {
    // "" for the root, otherwise "a/b/" (components may themselves be empty, "." or contain '/').
    let dir: String = input.dir.iter().map(|c| format!("{c}/")).collect();
    check_round_trips(&dir, input.name);
    check_round_trips(&dir, &file_key(&dir, input.name));
    check_round_trips(&dir, &dir_prefix(&dir, input.name));
});
