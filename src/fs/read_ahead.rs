//! The read-ahead that all sequential readers of a mount share.
//!
//! `--max-prefetch` is what one reader needs in flight to reach the throughput target, and the target is the
//! mount's, not each file's: what fills a link is the bytes in flight of all readers together. So the windows
//! of all readers of a mount count against one share of [`WINDOWS_PER_MOUNT`] such windows. A window may
//! always grow to its floor (one part: two GETs in flight, one landing while the other is read) even when the
//! share is spent, and grows past that only while the share has room. One reader alone grows to the full
//! window, a few share the rest, and eight hold their floors and a little more. Before, each reader had two
//! parts of its own beside a share of one window: 8 shard readers held about 320 MiB of windows at the
//! defaults, fresh memory that a new daemon faults in, for no more throughput (docs/BENCHMARKS.md, "One
//! read-ahead share per mount" and "Floors inside the share").
//! Warm-ups (`expressfs warm`) have their own budget of bytes in flight (`read::KeepBudget`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// How many of one reader's largest windows all readers of a mount may hold together. One would do where the
/// link's latency is low; at a 20 ms first byte four readers sharing one 64 MiB window read 15% slower than
/// with two (docs/BENCHMARKS.md, "Floors inside the share"), and on a real link one GET streams slower than
/// here, so a mount keeps room for more GETs in flight than one stream needs.
pub const WINDOWS_PER_MOUNT: u64 = 2;

/// The read-ahead windows of all readers of a mount, counted against one limit.
pub struct ReadAheadShare {
    limit: u64,
    granted: AtomicU64,
}

impl ReadAheadShare {
    /// The share of a mount whose readers may each grow a window of `max_window`.
    pub fn for_mount(max_window: u64) -> Arc<ReadAheadShare> {
        ReadAheadShare::new(max_window.saturating_mul(WINDOWS_PER_MOUNT))
    }

    pub fn new(limit: u64) -> Arc<ReadAheadShare> {
        Arc::new(ReadAheadShare {
            limit,
            granted: AtomicU64::new(0),
        })
    }

    /// Bytes of windows counted now, floors included (may pass the limit when many readers hold floors).
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

    /// Takes `bytes` whether or not there is room: a window growing to its floor.
    fn take(&self, bytes: u64) {
        self.granted.fetch_add(bytes, Ordering::AcqRel);
    }

    fn give_back(&self, bytes: u64) {
        self.granted.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// One reader's window, as far as the share is concerned: counted from its first growth, given back when it
/// shrinks or the reader goes away.
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

    /// A window counted in `share`, that may grow to `floor` whatever the share holds.
    pub fn from_share(share: Arc<ReadAheadShare>, floor: u64) -> WindowGrant {
        WindowGrant {
            share: Some(share),
            floor,
            held: 0,
        }
    }

    /// The window to use when the reader wants `wanted` instead of `current`: `wanted` if it is a shrink,
    /// within the floor, or the share has room for the growth; otherwise `current` (a refused growth is not
    /// granted in part, so windows stay whole multiples of what they were).
    pub fn resize(&mut self, current: u64, wanted: u64) -> u64 {
        let Some(share) = &self.share else {
            return wanted;
        };
        if wanted <= self.held {
            share.give_back(self.held - wanted);
            self.held = wanted;
            return wanted;
        }
        let growth = wanted - self.held;
        if wanted <= self.floor {
            share.take(growth);
        } else if !share.try_take(growth) {
            return current;
        }
        self.held = wanted;
        wanted
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
    fn a_lone_reader_grows_to_the_whole_share() {
        let share = ReadAheadShare::new(64 * MIB);
        let mut grant = WindowGrant::from_share(Arc::clone(&share), 8 * MIB);
        let mut window = MIB;
        for _ in 0..6 {
            window = grant.resize(window, (window * 2).min(64 * MIB));
        }
        assert_eq!(window, 64 * MIB);
        assert_eq!(share.granted(), 64 * MIB, "the whole window is counted");
        let refused = grant.resize(64 * MIB, 128 * MIB);
        assert_eq!(refused, 64 * MIB, "128 MiB does not fit a 64 MiB share");
        assert_eq!(share.granted(), 64 * MIB, "a refusal takes nothing");
    }

    #[test]
    fn floors_count_in_the_share_and_are_never_refused() {
        let share = ReadAheadShare::new(32 * MIB);
        let mut a = WindowGrant::from_share(Arc::clone(&share), 8 * MIB);
        let mut b = WindowGrant::from_share(Arc::clone(&share), 8 * MIB);
        assert_eq!(a.resize(MIB, 16 * MIB), 16 * MIB);
        assert_eq!(b.resize(MIB, 16 * MIB), 16 * MIB);
        assert_eq!(share.granted(), 32 * MIB);
        // The share is spent: no growth past a floor...
        assert_eq!(a.resize(16 * MIB, 32 * MIB), 16 * MIB);
        let mut c = WindowGrant::from_share(Arc::clone(&share), 8 * MIB);
        // ...but a third reader still gets its floor, past the limit.
        assert_eq!(
            c.resize(MIB, 8 * MIB),
            8 * MIB,
            "the floor is never refused"
        );
        assert_eq!(share.granted(), 40 * MIB);
        assert_eq!(c.resize(8 * MIB, 16 * MIB), 8 * MIB);
        // A jump drops a's window to 1 MiB: what it held past that is free again, not yet enough for c.
        assert_eq!(a.resize(16 * MIB, MIB), MIB);
        assert_eq!(share.granted(), 25 * MIB);
        assert_eq!(
            c.resize(8 * MIB, 16 * MIB),
            8 * MIB,
            "25 + 8 MiB would pass 32"
        );
        drop(b);
        assert_eq!(
            share.granted(),
            9 * MIB,
            "a reader that goes gives back what it held"
        );
        assert_eq!(c.resize(8 * MIB, 16 * MIB), 16 * MIB);
        drop(c);
        drop(a);
        assert_eq!(share.granted(), 0);
    }

    #[test]
    fn a_mount_holds_two_full_windows_then_floors() {
        let share = ReadAheadShare::for_mount(64 * MIB);
        let grow = |grant: &mut WindowGrant| {
            let mut window = MIB;
            while window < 64 * MIB {
                let next = grant.resize(window, window * 2);
                if next == window {
                    break;
                }
                window = next;
            }
            window
        };
        let mut a = WindowGrant::from_share(Arc::clone(&share), 8 * MIB);
        let mut b = WindowGrant::from_share(Arc::clone(&share), 8 * MIB);
        let mut c = WindowGrant::from_share(Arc::clone(&share), 8 * MIB);
        assert_eq!(grow(&mut a), 64 * MIB);
        assert_eq!(grow(&mut b), 64 * MIB);
        assert_eq!(grow(&mut c), 8 * MIB, "two windows spent the share");
        assert_eq!(share.granted(), 136 * MIB);
    }

    #[test]
    fn an_unshared_window_grows_freely() {
        let mut grant = WindowGrant::unshared();
        assert_eq!(grant.resize(MIB, 1 << 40), 1 << 40);
    }
}
