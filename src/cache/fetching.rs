//! The objects whose blocks are on their way into the block cache: fetched from below and not yet written.
//!
//! A warm-up ([`crate::source::ReadSource::keep`]) asks for blocks a read may have just started to fetch
//! (a small file's GET starts at open, and `expressfs warm` opens every file it fills). It waits for those to
//! land instead of sending the same GET again, and it returns only once its own blocks are written, so a
//! file reported warm is on disk.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

type Version = (String, String);

/// Fetches and writes under way, counted per version of an object.
#[derive(Default)]
pub struct Fetching {
    under_way: Mutex<HashMap<Version, usize>>,
    landed: Notify,
}

/// One fetch-and-write under way; dropping it (written, failed or cancelled) ends it.
pub struct Underway {
    fetching: Arc<Fetching>,
    version: Version,
}

impl Fetching {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<Version, usize>> {
        self.under_way.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks a fetch of some of `key`'s blocks (this `etag`) as under way until the guard is dropped.
    pub fn begin(self: &Arc<Self>, key: &str, etag: &str) -> Underway {
        let version = (key.to_string(), etag.to_string());
        *self.table().entry(version.clone()).or_default() += 1;
        Underway {
            fetching: Arc::clone(self),
            version,
        }
    }

    fn is_under_way(&self, key: &str, etag: &str) -> bool {
        // Looked up by borrowed parts: no allocation on every check.
        self.table().iter().any(|((k, e), _)| k == key && e == etag)
    }

    /// Returns once no fetch of this version is under way (at once if none is).
    pub async fn settled(&self, key: &str, etag: &str) {
        loop {
            let landed = self.landed.notified();
            tokio::pin!(landed);
            // Registered before the check: a fetch that ends between the check and the wait still wakes us.
            landed.as_mut().enable();
            if !self.is_under_way(key, etag) {
                return;
            }
            landed.await;
        }
    }
}

impl Drop for Underway {
    fn drop(&mut self) {
        let mut table = self.fetching.table();
        if let Some(n) = table.get_mut(&self.version) {
            *n -= 1;
            if *n == 0 {
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
    use std::time::Duration;

    #[tokio::test]
    async fn settled_waits_for_every_fetch_of_that_version_only() {
        let fetching = Arc::new(Fetching::default());
        let first = fetching.begin("k", "e1");
        let second = fetching.begin("k", "e1");
        let other = fetching.begin("k", "e2");
        // Another version's fetch never holds this one up.
        tokio::time::timeout(Duration::from_secs(1), fetching.settled("j", "e1"))
            .await
            .expect("nothing of j is under way");
        let waiter = tokio::spawn({
            let fetching = Arc::clone(&fetching);
            async move { fetching.settled("k", "e1").await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiter.is_finished(),
            "one fetch of k/e1 is still under way"
        );
        drop(second);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("woken when the last fetch ended")
            .unwrap();
        assert!(fetching.is_under_way("k", "e2"));
        drop(other);
        assert!(fetching.table().is_empty());
    }
}
