//! Names the bucket said do not exist, trusted for the negative metadata TTL.
//!
//! A loader probing for files that are not there (or a shell completing names) would otherwise keep every
//! distinct missing name in memory for the life of the mount. The cache holds at most [`MAX_ENTRIES`]
//! names; beyond that the one recorded longest ago goes first. Forgetting a name early only costs one more
//! request, never a wrong answer.

use std::num::NonZeroUsize;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lru::LruCache;

/// Missing names remembered at once (each costs its name plus about 64 bytes).
pub const MAX_ENTRIES: usize = 32_768;

type Slot = (u64, String);

/// (parent inode, name) → until when the name is known to be missing.
pub struct NegativeCache {
    ttl: Duration,
    entries: Mutex<LruCache<Slot, Instant>>,
}

impl NegativeCache {
    /// `ttl` zero: nothing is remembered.
    pub fn new(ttl: Duration) -> NegativeCache {
        NegativeCache::with_capacity(ttl, MAX_ENTRIES)
    }

    fn with_capacity(ttl: Duration, capacity: usize) -> NegativeCache {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        NegativeCache {
            ttl,
            entries: Mutex::new(LruCache::new(capacity)),
        }
    }

    fn entries(&self) -> MutexGuard<'_, LruCache<Slot, Instant>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `parent/name` was found missing and that answer is still trusted at `now`.
    pub fn is_missing(&self, parent: u64, name: &str, now: Instant) -> bool {
        let slot = (parent, name.to_string());
        let mut entries = self.entries();
        match entries.peek(&slot) {
            Some(until) if *until > now => true,
            Some(_) => {
                // Expired: it is asked again, and the answer (if still missing) recorded anew.
                entries.pop(&slot);
                false
            }
            None => false,
        }
    }

    /// The bucket said `parent/name` does not exist, in answer to a lookup that started at `asked`.
    pub fn record(&self, parent: u64, name: &str, asked: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        // `put` moves the name to the young end, so the entry evicted is the one recorded longest ago.
        self.entries()
            .put((parent, name.to_string()), asked + self.ttl);
    }

    /// `parent/name` exists now (we made it): forget that it was missing.
    pub fn forget(&self, parent: u64, name: &str) {
        self.entries().pop(&(parent, name.to_string()));
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_expire_and_the_oldest_goes_first_beyond_the_bound() {
        let cache = NegativeCache::with_capacity(Duration::from_secs(60), 2);
        let now = Instant::now();
        cache.record(1, "a", now);
        cache.record(1, "b", now);
        assert!(cache.is_missing(1, "a", now) && cache.is_missing(1, "b", now));
        cache.record(1, "c", now);
        assert_eq!(cache.len(), 2);
        assert!(!cache.is_missing(1, "a", now), "the oldest was evicted");
        assert!(cache.is_missing(1, "c", now));
        assert!(!cache.is_missing(2, "c", now), "another directory");
        let later = now + Duration::from_secs(61);
        assert!(!cache.is_missing(1, "c", later), "expired");
        assert_eq!(cache.len(), 1, "the expired entry is dropped when found");
        cache.forget(1, "b");
        assert!(!cache.is_missing(1, "b", now));
    }

    #[test]
    fn a_zero_ttl_remembers_nothing() {
        let cache = NegativeCache::new(Duration::ZERO);
        cache.record(1, "a", Instant::now());
        assert_eq!(cache.len(), 0);
        assert!(!cache.is_missing(1, "a", Instant::now()));
    }
}
