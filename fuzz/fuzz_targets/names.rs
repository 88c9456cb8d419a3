//! Raw bytes: "<directory prefix>\0<candidate key or name>" (no NUL: the candidate, in the root).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((dir, candidate)) = expressfs::fs::names::split_fuzz_input(data) {
        expressfs::fs::names::check_round_trips(dir, candidate);
    }
});
