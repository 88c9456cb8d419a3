//! An idle mount gives back the memory its last burst of traffic left behind.
//!
//! After 8 readers streamed 1.6 GB of shards, the daemon stayed at 340-390 MiB resident for as long as it was
//! left idle, and now drops to about 100 MiB (docs/BENCHMARKS.md, "Idle memory"). That memory is the buffer pool's spare buffers (up to 96 MiB) and,
//! mostly, buffers freed into glibc's heaps, which glibc keeps for the next allocation. Keeping them is right
//! while traffic goes on (a fresh page costs a fault and a zeroing); on a host where the mount then sits idle
//! beside a training job it is memory taken for nothing. So once no buffer has been asked for during
//! [`QUIET_TICKS`] ticks in a row, the pool is emptied and glibc returns its free pages (`malloc_trim`), once per
//! quiet spell: the next burst pays for fresh pages again, as a new mount's first one does.

use std::time::Duration;

use tracing::debug;

/// How often the traffic is looked at.
const TICK: Duration = Duration::from_secs(5);

/// Ticks in a row with no buffer asked for before the memory goes back: 15-20 s of quiet.
const QUIET_TICKS: u32 = 3;

/// Tells, from readings of a clock that moves with the traffic ([`crate::buffers::taken`]), when the memory
/// should go back: after [`QUIET_TICKS`] readings without a move, and only once until the clock moves again.
#[derive(Debug)]
pub struct IdleWatch {
    last_reading: u64,
    quiet_ticks: u32,
    given_back: bool,
}

impl IdleWatch {
    /// Starts from the clock's reading now. A mount that has carried no traffic has nothing to give back.
    pub fn new(reading: u64) -> IdleWatch {
        IdleWatch {
            last_reading: reading,
            quiet_ticks: 0,
            given_back: true,
        }
    }

    /// One tick: true when the memory should go back now.
    pub fn tick(&mut self, reading: u64) -> bool {
        if reading != self.last_reading {
            self.last_reading = reading;
            self.quiet_ticks = 0;
            self.given_back = false;
            return false;
        }
        if self.given_back {
            return false;
        }
        self.quiet_ticks += 1;
        self.given_back = self.quiet_ticks >= QUIET_TICKS;
        self.given_back
    }
}

/// Drops the spare buffers and has glibc return its free pages to the system; the bytes of buffers dropped.
fn give_back() -> usize {
    let dropped = crate::buffers::drain();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas, under their locks.
    unsafe {
        libc::malloc_trim(0);
    }
    dropped
}

/// The tick: [`TICK`], or in debug builds `EXPRESSFS_TEST_IDLE_TICK_MS`, so a test need not wait 20 s.
pub fn tick() -> Duration {
    if cfg!(debug_assertions)
        && let Some(ms) = std::env::var("EXPRESSFS_TEST_IDLE_TICK_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
    {
        // At least a millisecond: a zero tick would spin.
        return Duration::from_millis(ms.max(1));
    }
    TICK
}

/// Runs for the life of the daemon: gives the memory back each time the traffic has gone quiet.
pub async fn give_back_when_idle(tick: Duration) {
    let mut watch = IdleWatch::new(crate::buffers::taken());
    loop {
        tokio::time::sleep(tick).await;
        if watch.tick(crate::buffers::taken()) {
            // malloc_trim walks every free chunk: off the runtime's threads.
            let dropped = tokio::task::spawn_blocking(give_back)
                .await
                .unwrap_or_default();
            crate::metrics::idle_memory_given_back();
            debug!(
                spare_buffers_mib = dropped >> 20,
                "idle: spare buffers dropped, free heap pages returned"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_goes_back_once_per_quiet_spell() {
        let mut watch = IdleWatch::new(7);
        for _ in 0..10 {
            assert!(!watch.tick(7), "no traffic yet: nothing to give back");
        }
        assert!(!watch.tick(9), "traffic");
        for _ in 1..QUIET_TICKS {
            assert!(!watch.tick(9), "not quiet long enough");
        }
        assert!(watch.tick(9), "quiet for QUIET_TICKS ticks");
        for _ in 0..10 {
            assert!(!watch.tick(9), "given back already");
        }
        assert!(!watch.tick(10), "traffic again");
        for _ in 1..QUIET_TICKS {
            assert!(!watch.tick(10));
        }
        assert!(watch.tick(10), "the next quiet spell gives back again");
    }

    #[test]
    fn traffic_in_the_middle_of_a_quiet_spell_starts_it_over() {
        let mut watch = IdleWatch::new(0);
        assert!(!watch.tick(1));
        for _ in 1..QUIET_TICKS {
            assert!(!watch.tick(1));
        }
        assert!(!watch.tick(2), "traffic on the last tick");
        for _ in 1..QUIET_TICKS {
            assert!(!watch.tick(2), "counted again from the traffic");
        }
        assert!(watch.tick(2));
    }
}
