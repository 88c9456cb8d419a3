//! First bytes of objects, fetched by a lookup and handed to the open that usually follows it.
//!
//! A lookup asks for the first bytes of a file together with its metadata (one GET instead of a HEAD), so a
//! small file that is opened and read right after costs one request instead of two, and one round trip less.
//! What is kept here is bounded three ways: a few seconds, a fixed number of entries, and the global memory
//! budget (an entry the budget refuses is not kept). Entries are keyed by key and ETag, so an open pinned to
//! another version of the object never gets these bytes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use lru::LruCache;

use crate::memory::{MemoryBudget, Reservation};

/// Entries kept at most: enough for the lookups of many threads opening files at once.
const CAPACITY: usize = 1024;

/// Longest time an entry waits for its open.
const MAX_HOLD: Duration = Duration::from_secs(5);

/// Most bytes kept at once, so that a scan of many names never takes the read-ahead's share of the budget.
const MAX_BYTES: u64 = 64 * 1024 * 1024;

struct Held {
    bytes: Bytes,
    until: Instant,
    memory: Reservation,
}

struct Entries {
    lru: LruCache<(String, String), Held>,
    bytes: u64,
}

impl Entries {
    /// Drops what waited too long, then the oldest entries while `incoming` more bytes or one more entry
    /// would not fit.
    fn trim(&mut self, now: Instant, incoming: u64) {
        while self.lru.peek_lru().is_some_and(|(_, held)| {
            held.until <= now || self.bytes + incoming > MAX_BYTES || self.lru.len() >= CAPACITY
        }) {
            if let Some((_, held)) = self.lru.pop_lru() {
                self.bytes -= held.bytes.len() as u64;
            }
        }
    }
}

pub struct FirstBytes {
    entries: Mutex<Entries>,
    hold: Duration,
}

impl FirstBytes {
    /// Entries wait `hold` for their open (the metadata TTL: later, open asks the bucket again anyway),
    /// clamped to one to five seconds.
    pub fn new(hold: Duration) -> FirstBytes {
        FirstBytes {
            entries: Mutex::new(Entries {
                lru: LruCache::unbounded(),
                bytes: 0,
            }),
            hold: hold.clamp(Duration::from_secs(1), MAX_HOLD),
        }
    }

    /// Keeps `bytes` (the start of `key` at `etag`) if the memory budget allows.
    pub fn keep(&self, key: &str, etag: &str, bytes: Bytes, memory: &Arc<MemoryBudget>) {
        let size = bytes.len() as u64;
        if size == 0 || size > MAX_BYTES {
            return;
        }
        let Some(reservation) = memory.try_reserve(size) else {
            return;
        };
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let slot = (key.to_string(), etag.to_string());
        if let Some(old) = entries.lru.pop(&slot) {
            entries.bytes -= old.bytes.len() as u64;
        }
        entries.trim(now, size);
        entries.bytes += size;
        entries.lru.put(
            slot,
            Held {
                bytes,
                until: now + self.hold,
                memory: reservation,
            },
        );
    }

    /// Takes the bytes kept for `key` at `etag`, with what they hold of the budget.
    pub fn take(&self, key: &str, etag: &str) -> Option<(Bytes, Reservation)> {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.trim(now, 0);
        let held = entries.lru.pop(&(key.to_string(), etag.to_string()))?;
        entries.bytes -= held.bytes.len() as u64;
        Some((held.bytes, held.memory))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lru
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_bytes_go_to_the_matching_version_once() {
        let budget = MemoryBudget::new(1 << 20);
        let store = FirstBytes::new(Duration::from_secs(1));
        store.keep("a", "\"e1\"", Bytes::from_static(b"hello"), &budget);
        assert_eq!(budget.used(), 5);
        assert!(store.take("a", "\"e2\"").is_none(), "another version");
        let (bytes, memory) = store.take("a", "\"e1\"").unwrap();
        assert_eq!(&bytes[..], b"hello");
        assert!(store.take("a", "\"e1\"").is_none(), "taken once");
        drop(memory);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn the_budget_and_the_capacity_bound_what_is_kept() {
        let budget = MemoryBudget::new(8);
        let store = FirstBytes::new(Duration::from_secs(1));
        store.keep("a", "e", Bytes::from_static(b"123456"), &budget);
        store.keep("b", "e", Bytes::from_static(b"123456"), &budget);
        assert!(store.take("b", "e").is_none(), "refused by the budget");
        assert!(store.take("a", "e").is_some());

        let budget = MemoryBudget::unlimited();
        for i in 0..CAPACITY + 10 {
            store.keep(&i.to_string(), "e", Bytes::from_static(b"x"), &budget);
        }
        assert_eq!(store.len(), CAPACITY);
        assert!(store.take("0", "e").is_none(), "oldest evicted");
        assert!(store.take(&(CAPACITY + 9).to_string(), "e").is_some());

        // A byte bound too: 256 KiB entries stop at MAX_BYTES, the oldest going first.
        let store = FirstBytes::new(Duration::from_secs(1));
        let big = Bytes::from(vec![0u8; 256 << 10]);
        let count = (MAX_BYTES / (256 << 10)) as usize + 5;
        for i in 0..count {
            store.keep(&i.to_string(), "e", big.clone(), &budget);
        }
        assert_eq!(store.len(), count - 5);
        assert!(store.take("0", "e").is_none());
    }
}
