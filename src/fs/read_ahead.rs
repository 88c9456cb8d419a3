//! The read-ahead that all sequential readers of a mount share.
//!
//! `--max-prefetch` is what one reader needs in flight to reach the throughput target, and the target is the
//! mount's, not each file's. Every reader may always run two parts ahead (one GET landing while the next is
//! read) without asking; what it grows past that comes from one share of `--max-prefetch` for the whole
//! mount, given back when its window drops (a jump, memory pressure, the end of the file reached) or the
//! reader closes. One reader alone grows to the full window; eight readers at once hold about two parts each
//! plus the share, where each used to grow to the full window: 8 shard readers on two cores could hold 512 MiB
//! of windows, most of it fresh memory that the daemon faulted in page by page, for no more throughput
//! (docs/BENCHMARKS.md, "One read-ahead share per mount"). Warm-ups (`expressfs warm`) have their own budget
//! of bytes in flight (`read::KeepBudget`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Read-ahead past each reader's floor, for all readers of a mount together.
pub struct ReadAheadShare {
    limit: u64,
    granted: AtomicU64,
}

impl ReadAheadShare {
    pub fn new(limit: u64) -> Arc<ReadAheadShare> {
        Arc::new(ReadAheadShare {
            limit,
            granted: AtomicU64::new(0),
        })
    }

    /// Bytes granted to readers now, past their floors.
    pub fn granted(&self) -> u64 {
        self.granted.load(Ordering::Relaxed)
    }

    /// Takes `bytes` more if the share has room for them all.
    fn try_take(&self, bytes: u64) -> bool {
        self.granted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: u64) {
        self.granted.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// One reader's window, as far as the share is concerned: what it holds past its floor is given back when
/// the window shrinks or the reader goes away.
pub struct WindowGrant {
    share: Option<Arc<ReadAheadShare>>,
    floor: u64,
    held: u64,
}

impl WindowGrant {
    /// A window that may grow to its maximum without asking anyone (a reader outside any mount's share).
    pub fn unshared() -> WindowGrant {
        WindowGrant {
            share: None,
            floor: 0,
            held: 0,
        }
    }

    /// A window that may be `floor` bytes on its own and grows past that from `share`.
    pub fn from_share(share: Arc<ReadAheadShare>, floor: u64) -> WindowGrant {
        WindowGrant {
            share: Some(share),
            floor,
            held: 0,
        }
    }

    /// The window to use when the reader wants `wanted` instead of `current`: `wanted` if it is within the
    /// floor, a shrink, or the share has room for the growth; otherwise `current` (a refused growth is not
    /// granted in part, so windows stay whole multiples of what they were).
    pub fn resize(&mut self, current: u64, wanted: u64) -> u64 {
        let Some(share) = &self.share else {
            return wanted;
        };
        let need = wanted.saturating_sub(self.floor);
        if need <= self.held {
            if need < self.held {
                share.give_back(self.held - need);
                self.held = need;
            }
            return wanted;
        }
        if share.try_take(need - self.held) {
            self.held = need;
            return wanted;
        }
        current
    }
}

impl Drop for WindowGrant {
    fn drop(&mut self) {
        if let Some(share) = &self.share {
            share.give_back(self.held);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_lone_reader_grows_to_the_whole_share_past_its_floor() {
        let share = ReadAheadShare::new(64 * MIB);
        let mut grant = WindowGrant::from_share(Arc::clone(&share), 16 * MIB);
        let mut window = MIB;
        for _ in 0..6 {
            window = grant.resize(window, (window * 2).min(64 * MIB));
        }
        assert_eq!(window, 64 * MIB);
        assert_eq!(share.granted(), 48 * MIB, "only what lies past the floor");
        let refused = grant.resize(64 * MIB, 128 * MIB);
        assert_eq!(
            refused,
            64 * MIB,
            "16 + 112 MiB does not fit a 64 MiB share"
        );
        assert_eq!(share.granted(), 48 * MIB, "a refusal takes nothing");
    }

    #[test]
    fn readers_past_their_floors_share_one_limit_and_get_it_back_when_one_shrinks_or_goes() {
        let share = ReadAheadShare::new(32 * MIB);
        let mut a = WindowGrant::from_share(Arc::clone(&share), 16 * MIB);
        let mut b = WindowGrant::from_share(Arc::clone(&share), 16 * MIB);
        assert_eq!(a.resize(16 * MIB, 32 * MIB), 32 * MIB);
        assert_eq!(b.resize(16 * MIB, 32 * MIB), 32 * MIB);
        assert_eq!(share.granted(), 32 * MIB);
        // Both at 32: a third doubling has no room, but the floor needs none.
        assert_eq!(a.resize(32 * MIB, 64 * MIB), 32 * MIB);
        let mut c = WindowGrant::from_share(Arc::clone(&share), 16 * MIB);
        assert_eq!(
            c.resize(MIB, 16 * MIB),
            16 * MIB,
            "the floor is never refused"
        );
        assert_eq!(c.resize(16 * MIB, 32 * MIB), 16 * MIB);
        // A jump drops a's window: what it held past its floor is free again.
        assert_eq!(a.resize(32 * MIB, MIB), MIB);
        assert_eq!(share.granted(), 16 * MIB);
        assert_eq!(c.resize(16 * MIB, 32 * MIB), 32 * MIB);
        drop(b);
        drop(c);
        assert_eq!(
            share.granted(),
            0,
            "a reader that goes gives back what it held"
        );
        drop(a);
        assert_eq!(share.granted(), 0);
    }

    #[test]
    fn an_unshared_window_grows_freely() {
        let mut grant = WindowGrant::unshared();
        assert_eq!(grant.resize(MIB, 1 << 40), 1 << 40);
    }
}
