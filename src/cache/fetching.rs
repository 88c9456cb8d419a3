//! The blocks on their way into the block cache: fetched from below and not yet written.
//!
//! A read marks the blocks it fetches ([`Fetching::reading`]) and never waits. A warm-up
//! ([`crate::source::ReadSource::keep`]) claims the blocks it will fetch ([`Fetching::claim`]): those not
//! held, and not on their way already. It waits only for blocks another fetch has under way (a small file's
//! GET starts at open, and `expressfs warm` opens every file it fills), and it returns only once its own
//! blocks are written, so a file reported warm is on disk. Parts of one warm-up claim disjoint blocks and
//! never wait for each other.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

type Version = (String, String);

/// Blocks under way, counted per block of each version of an object.
#[derive(Default)]
pub struct Fetching {
    under_way: Mutex<HashMap<Version, HashMap<u64, usize>>>,
    /// Woken whenever blocks land (or a fetch fails); waiters check their own blocks again.
    landed: Notify,
}

/// Blocks `blocks` of one version under way; dropping it (written, failed or cancelled) ends that.
pub struct Underway {
    fetching: Arc<Fetching>,
    version: Version,
    blocks: Range<u64>,
}

/// What a warm-up got from [`Fetching::claim`].
pub struct Claim {
    /// Runs of blocks this warm-up is to fetch, each marked under way until its guard is dropped.
    pub runs: Vec<Underway>,
    /// Some blocks are under way by another fetch: wait for them ([`Fetching::landed`]) and claim again.
    pub others_under_way: bool,
}

impl Underway {
    pub fn blocks(&self) -> Range<u64> {
        self.blocks.clone()
    }
}

impl Fetching {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<Version, HashMap<u64, usize>>> {
        self.under_way.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mark(
        self: &Arc<Self>,
        table: &mut HashMap<Version, HashMap<u64, usize>>,
        version: &Version,
        blocks: Range<u64>,
    ) -> Underway {
        let counts = table.entry(version.clone()).or_default();
        for block in blocks.clone() {
            *counts.entry(block).or_default() += 1;
        }
        Underway {
            fetching: Arc::clone(self),
            version: version.clone(),
            blocks,
        }
    }

    /// A read fetches `blocks` of `key` (this `etag`): marked under way until the guard is dropped.
    pub fn reading(self: &Arc<Self>, key: &str, etag: &str, blocks: Range<u64>) -> Underway {
        let version = (key.to_string(), etag.to_string());
        self.mark(&mut self.table(), &version, blocks)
    }

    /// For a warm-up of `blocks`: claims, in runs, those that are neither `held` nor under way, and says
    /// whether any are under way elsewhere. Checked and claimed under one lock, so two warm-ups never claim
    /// the same block.
    pub fn claim(
        self: &Arc<Self>,
        key: &str,
        etag: &str,
        blocks: Range<u64>,
        held: impl Fn(u64) -> bool,
    ) -> Claim {
        let version = (key.to_string(), etag.to_string());
        let mut table = self.table();
        let busy = |table: &HashMap<Version, HashMap<u64, usize>>, block: u64| {
            table
                .get(&version)
                .is_some_and(|counts| counts.contains_key(&block))
        };
        let mut claim = Claim {
            runs: Vec::new(),
            others_under_way: false,
        };
        let mut block = blocks.start;
        while block < blocks.end {
            if busy(&table, block) {
                claim.others_under_way = true;
                block += 1;
                continue;
            }
            if held(block) {
                block += 1;
                continue;
            }
            let start = block;
            while block < blocks.end && !busy(&table, block) && !held(block) {
                block += 1;
            }
            let run = self.mark(&mut table, &version, start..block);
            claim.runs.push(run);
        }
        claim
    }

    /// Resolves once any blocks land after it is enabled (`tokio::pin!` it and call `enable` before
    /// [`Fetching::claim`], so that a landing in between is not missed).
    pub fn landed(&self) -> tokio::sync::futures::Notified<'_> {
        self.landed.notified()
    }
}

impl Drop for Underway {
    fn drop(&mut self) {
        let mut table = self.fetching.table();
        if let Some(counts) = table.get_mut(&self.version) {
            for block in self.blocks.clone() {
                if let Some(n) = counts.get_mut(&block) {
                    *n -= 1;
                    if *n == 0 {
                        counts.remove(&block);
                    }
                }
            }
            if counts.is_empty() {
                table.remove(&self.version);
            }
        }
        drop(table);
        self.fetching.landed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_takes_what_is_neither_held_nor_under_way_and_claims_are_disjoint() {
        let fetching = Arc::new(Fetching::default());
        let read = fetching.reading("k", "e1", 2..4);
        let held = |b: u64| b == 6;
        let first = fetching.claim("k", "e1", 0..10, held);
        let runs: Vec<_> = first.runs.iter().map(Underway::blocks).collect();
        assert_eq!(runs, [0..2, 4..6, 7..10]);
        assert!(first.others_under_way, "blocks 2 and 3 are being read");
        // A second warm-up of the same blocks finds them all taken; another version is free.
        let second = fetching.claim("k", "e1", 0..10, held);
        assert!(second.runs.is_empty() && second.others_under_way);
        let other = fetching.claim("k", "e2", 0..2, |_| false);
        assert_eq!(other.runs[0].blocks(), 0..2);
        drop((first, read, other));
        assert!(fetching.table().is_empty());
        let again = fetching.claim("k", "e1", 0..4, |_| false);
        assert!(!again.others_under_way);
        assert_eq!(again.runs[0].blocks(), 0..4);
    }

    #[tokio::test]
    async fn a_waiter_enabled_before_its_claim_is_woken_when_blocks_land() {
        let fetching = Arc::new(Fetching::default());
        let read = fetching.reading("k", "e", 0..1);
        let landed = fetching.landed();
        tokio::pin!(landed);
        landed.as_mut().enable();
        assert!(fetching.claim("k", "e", 0..1, |_| false).others_under_way);
        drop(read);
        tokio::time::timeout(std::time::Duration::from_secs(1), landed)
            .await
            .expect("woken by the read's landing");
        assert!(!fetching.claim("k", "e", 0..1, |_| true).others_under_way);
    }
}
