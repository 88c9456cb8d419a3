//! One byte budget for the buffers that scale with traffic: prefetched read chunks and upload parts.
//!
//! The budget is a target, not an allocator: the bytes a request cannot do without (the chunk the reader is
//! waiting for, the part being filled) are always granted, while optional ones (read-ahead beyond the current
//! read, a second upload part in flight) are granted only while the total stays under the target. So under
//! pressure prefetch windows shrink and uploads go one part at a time, instead of the process growing.
//! No crate does this (semaphores block instead of degrading; memory allocators cap everything), hence ours.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
pub struct MemoryBudget {
    limit: u64,
    used: AtomicU64,
    peak: AtomicU64,
    refused: AtomicU64,
}

/// Bytes held against the budget; given back when dropped.
pub struct Reservation {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl MemoryBudget {
    pub fn new(limit: u64) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            limit,
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// A budget nothing will exhaust (unit tests, tools).
    pub fn unlimited() -> Arc<MemoryBudget> {
        MemoryBudget::new(u64::MAX)
    }

    /// Bytes that must be had: granted even beyond the target.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Reservation {
        let now = self.used.fetch_add(bytes, Ordering::AcqRel) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Reservation {
            budget: Arc::clone(self),
            bytes,
        }
    }

    /// Optional bytes: granted only if the total stays within the target.
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Option<Reservation> {
        let granted = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            });
        match granted {
            Ok(before) => {
                self.peak.fetch_max(before + bytes, Ordering::Relaxed);
                Some(Reservation {
                    budget: Arc::clone(self),
                    bytes,
                })
            }
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// How many optional reservations were refused (each one a shrunken window or a serialised part).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Below this target, memory matters more than the cost of faulting in fresh buffers.
const TIGHT_TARGET: u64 = 1 << 30;

/// Under a tight target, has glibc give freed multi-MiB buffers back to the system at once. Left alone, glibc
/// raises its mmap threshold to the size of the first big buffer freed; later buffers of that size come from
/// the heap, whose freed holes stay resident. Four readers under `--memory-target 64` peaked at 150-210 MiB that
/// way and at 100 MiB with the threshold fixed at 1 MiB. Under the default target the fixed threshold cost
/// 10-20% in sequential and tar-shard reads (every window refilled with fresh pages; A/B runs in
/// docs/ARCHITECTURE.md), so it is reserved for targets under 1 GiB. `MALLOC_MMAP_THRESHOLD_` still wins.
pub fn return_freed_buffers_promptly_if_tight(target: u64) -> bool {
    if target >= TIGHT_TARGET || std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some() {
        return false;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets a tunable; glibc takes its own lock.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

/// The default target: a quarter of the memory this process may use (the cgroup limit when one is set, else
/// the machine's RAM), at least 256 MiB. A quarter, because the budget covers only traffic buffers; the
/// kernel page cache and the rest of the training job need the remainder.
pub fn default_target() -> u64 {
    let ram = total_memory().unwrap_or(4 << 30);
    let available = cgroup_limit().map_or(ram, |c| c.min(ram));
    (available / 4).max(256 << 20)
}

fn total_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// cgroup v2 `memory.max` of this process's group ("max" means no limit).
fn cgroup_limit() -> Option<u64> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = membership.lines().find_map(|l| l.strip_prefix("0::"))?;
    let max = std::fs::read_to_string(format!("/sys/fs/cgroup{}/memory.max", path.trim())).ok()?;
    max.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optional_bytes_stop_at_the_target_required_ones_do_not() {
        let budget = MemoryBudget::new(100);
        let a = budget.try_reserve(60).expect("fits");
        assert!(budget.try_reserve(50).is_none(), "would exceed 100");
        assert_eq!(budget.refused(), 1);
        let b = budget.reserve(50);
        assert_eq!(budget.used(), 110, "required bytes are granted anyway");
        assert!(budget.try_reserve(1).is_none());
        drop(a);
        drop(b);
        assert_eq!(budget.used(), 0, "reservations are given back");
        assert_eq!(budget.peak(), 110);
        assert!(budget.try_reserve(100).is_some());
    }

    #[test]
    fn only_a_tight_target_fixes_the_mmap_threshold() {
        assert!(!return_freed_buffers_promptly_if_tight(2 << 30));
        if cfg!(all(target_os = "linux", target_env = "gnu"))
            && std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none()
        {
            assert!(return_freed_buffers_promptly_if_tight(64 << 20));
        }
    }

    #[test]
    fn default_target_is_sane() {
        let t = default_target();
        assert!(t >= 256 << 20);
        assert!(t <= total_memory().unwrap_or(u64::MAX).max(256 << 20));
    }
}
