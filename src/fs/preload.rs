//! The first open of a small file pushes the file's bytes into the kernel's page cache (`Opened::preload`).
//! The kernel's store overwrites pages that are already there and can grow the file's size, so it is only
//! right while nothing else has touched the inode since that open began: no other open (whose reads would
//! lock pages the store then waits on, or bring another version's bytes) and no truncation. Every open and
//! every size change claims the inode first (`S3Filesystem::claim_page_cache`), which voids a preload still
//! waiting to be stored (from the moment the first open found the cache unused, not only once it has the
//! bytes). The store and the voiding exclude each other, so a claim goes on either before the store (which
//! is then skipped) or after it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

type Slots = Arc<Mutex<HashMap<u64, Arc<Mutex<bool>>>>>;

/// Preloads not stored yet, by inode: whether each may still be stored.
#[derive(Default)]
pub struct Preloads {
    pending: Slots,
}

impl Preloads {
    /// The first open of `ino` may fill its page cache: valid until the inode is claimed again. Called under
    /// the inode table's lock, as [`Preloads::take`] is, so that every claim is ordered against it.
    pub fn reserve(&self, ino: u64) -> Reservation {
        let valid = Arc::new(Mutex::new(true));
        lock(&self.pending).insert(ino, Arc::clone(&valid));
        Reservation {
            ino,
            valid,
            pending: Arc::clone(&self.pending),
        }
    }

    /// Another open or a truncation of `ino` goes on: takes the preload pending for it, to [`void`].
    pub fn take(&self, ino: u64) -> Option<Arc<Mutex<bool>>> {
        lock(&self.pending).remove(&ino)
    }
}

/// A taken preload will never be stored; returns once a store in progress is over.
pub fn void(slot: &Mutex<bool>) {
    *lock(slot) = false;
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A first open's right to fill the page cache, until another claim on the inode voids it.
pub struct Reservation {
    ino: u64,
    valid: Arc<Mutex<bool>>,
    pending: Slots,
}

impl Reservation {
    pub fn with_bytes(self, bytes: Bytes) -> Preload {
        Preload {
            bytes,
            reservation: self,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut pending = lock(&self.pending);
        if pending
            .get(&self.ino)
            .is_some_and(|v| Arc::ptr_eq(v, &self.valid))
        {
            pending.remove(&self.ino);
        }
    }
}

/// A small file's whole content, of the version its handle reads, for a page cache known to be empty. The
/// bytes are reachable only through [`Preload::store_if_untouched`].
pub struct Preload {
    bytes: Bytes,
    reservation: Reservation,
}

impl Preload {
    #[cfg(test)]
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Runs `store` on the bytes unless the inode was claimed since the open began, with further claims
    /// held off until it returns; gives what `store` returned, or false if it did not run.
    pub fn store_if_untouched(&self, store: impl FnOnce(&[u8]) -> bool) -> bool {
        let valid = lock(&self.reservation.valid);
        *valid && store(&self.bytes)
    }
}

impl std::fmt::Debug for Preload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Preload({} bytes)", self.bytes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_voids_a_preload_not_stored_yet_and_only_its_own() {
        let preloads = Preloads::default();
        let stored = preloads.reserve(7).with_bytes(Bytes::from_static(b"seven"));
        let voided = preloads.reserve(8);
        void(&preloads.take(8).expect("pending"));
        assert!(preloads.take(9).is_none());
        let voided = voided.with_bytes(Bytes::from_static(b"eight"));
        let mut seen = Vec::new();
        assert!(stored.store_if_untouched(|b| {
            seen.push(b.to_vec());
            true
        }));
        assert!(!voided.store_if_untouched(|_| panic!("a voided preload is not stored")));
        assert_eq!(seen, vec![b"seven".to_vec()]);
        // What the store returned is passed on.
        assert!(!stored.store_if_untouched(|_| false));
        drop(stored);
        assert!(
            lock(&preloads.pending).is_empty(),
            "dropped preloads leave nothing behind"
        );
    }

    #[test]
    fn a_claim_waits_for_a_store_in_progress() {
        let preloads = Arc::new(Preloads::default());
        let preload = preloads.reserve(1).with_bytes(Bytes::from_static(b"x"));
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (finish_tx, finish_rx) = std::sync::mpsc::channel::<()>();
        let storer = std::thread::spawn(move || {
            preload.store_if_untouched(|_| {
                started_tx.send(()).unwrap();
                finish_rx.recv().unwrap();
                true
            })
        });
        started_rx.recv().unwrap();
        let claimer = {
            let preloads = Arc::clone(&preloads);
            std::thread::spawn(move || void(&preloads.take(1).expect("pending")))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !claimer.is_finished(),
            "the claim waits while the store runs"
        );
        finish_tx.send(()).unwrap();
        assert!(
            storer.join().unwrap(),
            "the store began before the claim: it stands"
        );
        claimer.join().unwrap();
    }
}
