//! Spare buffers for GET bodies and upload parts.
//!
//! A buffer of several MiB comes from `mmap`, and every page of a fresh one is faulted in and zeroed by the
//! kernel before the first byte lands: in a sequential read that was a quarter of the daemon's CPU (perf,
//! `clear_page_erms` and the page-fault path; docs/BENCHMARKS.md). Buffers that nobody else holds any more are
//! kept here and handed out again, their pages already mapped. The pool is small and bounded
//! ([`MAX_POOLED_BYTES`], less under a small `--memory-target`: [`limit_to`]); a buffer that finds it full is
//! freed as before. Reuse is safe because only a buffer with no other reference comes back, and it comes back
//! empty: the bytes of its last use can never be read.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};

/// Smaller buffers come from malloc's own free lists without page faults; only big ones are worth keeping.
const MIN_POOLED: usize = 1024 * 1024;

/// The most the pool holds, in bytes of capacity. Enough for the parts in flight of a few streams; memory
/// outside the budget, so kept small.
const MAX_POOLED_BYTES: usize = 96 * 1024 * 1024;

static POOL: Pool = Pool::new(MAX_POOLED_BYTES);

/// Caps the pool at a quarter of the memory target (never above [`MAX_POOLED_BYTES`]): idle buffers are
/// memory outside the budget, and under a 64 MiB target 96 MiB of them would be most of the process.
pub fn limit_to(memory_target: u64) {
    POOL.limit_to(memory_target)
}

/// An empty buffer that can hold `capacity` bytes without growing: a pooled one if one fits, else a new one.
pub fn take(capacity: usize) -> BytesMut {
    POOL.take(capacity)
}

/// How many buffers have been asked for since the process started, answers that needed none included
/// ([`count_unpooled`]): a clock of the read and write paths' traffic, which [`crate::idle`] watches to tell
/// an idle mount.
pub fn taken() -> u64 {
    POOL.taken.load(Ordering::Relaxed)
}

/// Counts, on the traffic clock, an answer handed on without a buffer of ours (a small GET body kept as the
/// HTTP client's chunk): a mount reading only small files is busy, not idle.
pub fn count_unpooled() {
    POOL.taken.fetch_add(1, Ordering::Relaxed);
}

/// Frees every spare buffer; returns how many bytes of capacity that was. For an idle mount, whose pool would
/// otherwise hold its last burst's buffers for good.
pub fn drain() -> usize {
    POOL.drain()
}

/// `buf`'s bytes, shared; the buffer goes back to the pool when the last of its slices is dropped, wherever
/// that happens. A GET's part is sliced for FUSE replies answered on other threads: handed back when the reader
/// was done with it, a buffer still held by a reply in flight was freed instead, and the next GET faulted in a
/// fresh one (about a tenth of the daemon's CPU with 8 shard readers, BENCHMARKS "Buffers back to the pool").
pub fn pooled(buf: BytesMut) -> Bytes {
    POOL.lend(buf)
}

/// A buffer lent out as [`Bytes`]; comes back to its pool when dropped.
struct Pooled {
    buf: BytesMut,
    pool: &'static Pool,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back_mut(std::mem::take(&mut self.buf));
    }
}

/// Returns the buffer behind `bytes` to the pool if this was its last reference, else just drops this
/// reference: for buffers not lent with [`pooled`] (an upload's parts, split from the writer's buffer).
pub fn give_back(bytes: Bytes) {
    POOL.give_back(bytes)
}

/// Returns a buffer we own to the pool, emptied.
pub fn give_back_mut(buf: BytesMut) {
    POOL.give_back_mut(buf)
}

/// Transparent huge pages: one page fault maps 2 MiB.
const HUGE_PAGE: usize = 2 * 1024 * 1024;

/// A new buffer, its whole 2 MiB stretches marked for transparent huge pages (`MADV_HUGEPAGE`; malloc puts a
/// big block just past a page boundary, so a 4 MiB buffer has one such stretch and 8 MiB three). Every page of
/// a fresh buffer is faulted in as its first bytes land, and with 4 KiB pages that was the largest cost of a
/// fresh daemon reading tar shards (a fifth to a third of its CPU, `perf`: `exc_page_fault` under the body
/// copy); with huge pages it is one fault per 2 MiB (docs/BENCHMARKS.md, "Huge pages for fresh buffers").
/// Advice only: the machine's THP setting decides (`never` turns it off, and `defrag` says whether a fault
/// may compact memory to find a huge page), and a failure changes nothing but the cost.
fn fresh(capacity: usize) -> BytesMut {
    let buf = BytesMut::with_capacity(capacity);
    advise_huge_pages(buf.as_ptr() as usize, buf.capacity());
    buf
}

/// Asks for huge pages on the whole 2 MiB stretches of `start..start + len`, if it has any.
fn advise_huge_pages(start: usize, len: usize) {
    let Some(stretches) = whole_huge_pages(start, len) else {
        return;
    };
    #[cfg(target_os = "linux")]
    // SAFETY: the range lies within the buffer just allocated, which this process owns; MADV_HUGEPAGE
    // changes how its pages are backed, never their contents.
    unsafe {
        libc::madvise(
            stretches.start as *mut libc::c_void,
            stretches.len(),
            libc::MADV_HUGEPAGE,
        );
    }
}

/// The 2 MiB-aligned part of `start..start + len`: the kernel maps a huge page only where one fits whole, so
/// the ragged ends are left out. None when no whole huge page fits.
fn whole_huge_pages(start: usize, len: usize) -> Option<std::ops::Range<usize>> {
    let first = start.checked_next_multiple_of(HUGE_PAGE)?;
    let end = start.checked_add(len)? / HUGE_PAGE * HUGE_PAGE;
    (end > first).then_some(first..end)
}

struct Pool {
    spare: Mutex<Vec<BytesMut>>,
    max_bytes: AtomicUsize,
    taken: AtomicU64,
}

impl Pool {
    const fn new(max_bytes: usize) -> Pool {
        Pool {
            spare: Mutex::new(Vec::new()),
            max_bytes: AtomicUsize::new(max_bytes),
            taken: AtomicU64::new(0),
        }
    }

    fn limit_to(&self, memory_target: u64) {
        let cap = usize::try_from(memory_target / 4).unwrap_or(usize::MAX);
        self.max_bytes
            .store(cap.min(MAX_POOLED_BYTES), Ordering::Relaxed);
    }

    /// A pooled buffer no more than twice `capacity` (a big one is not spent on a small request).
    fn take(&self, capacity: usize) -> BytesMut {
        self.taken.fetch_add(1, Ordering::Relaxed);
        if capacity >= MIN_POOLED {
            let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = spare
                .iter()
                .position(|b| b.capacity() >= capacity && b.capacity() / 2 <= capacity)
            {
                return spare.swap_remove(i);
            }
        }
        fresh(capacity)
    }

    fn lend(&'static self, buf: BytesMut) -> Bytes {
        if buf.capacity() < MIN_POOLED {
            return buf.freeze();
        }
        Bytes::from_owner(Pooled { buf, pool: self })
    }

    fn give_back(&self, bytes: Bytes) {
        if bytes.len() < MIN_POOLED / 2 {
            return;
        }
        if let Ok(buf) = bytes.try_into_mut() {
            self.give_back_mut(buf);
        }
    }

    fn give_back_mut(&self, mut buf: BytesMut) {
        if buf.capacity() < MIN_POOLED {
            return;
        }
        buf.clear();
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        let held: usize = spare.iter().map(BytesMut::capacity).sum();
        if held + buf.capacity() <= self.max_bytes.load(Ordering::Relaxed) {
            spare.push(buf);
        }
    }

    fn drain(&self) -> usize {
        let spare = std::mem::take(&mut *self.spare.lock().unwrap_or_else(|e| e.into_inner()));
        spare.iter().map(BytesMut::capacity).sum()
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        let spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        spare.iter().map(BytesMut::capacity).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1024 * 1024;

    /// The VmFlags of the mapping that holds `addr`, from /proc/self/smaps.
    fn vm_flags_at(addr: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((lo, hi)) = range.split_once('-')
                && let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
            } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return Some(flags.trim().to_string());
            }
        }
        None
    }

    #[test]
    fn a_fresh_big_buffer_asks_for_huge_pages() {
        // Kernels built without THP have no such file, and refuse the advice.
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            return;
        }
        let big = fresh(8 * MIB);
        let inside = (big.as_ptr() as usize).next_multiple_of(HUGE_PAGE);
        // A sandbox without /proc/self/smaps cannot tell.
        let Some(flags) = vm_flags_at(inside) else {
            return;
        };
        assert!(flags.split(' ').any(|f| f == "hg"), "VmFlags: {flags}");
        assert_eq!(big.capacity(), 8 * MIB);
        assert!(big.is_empty());
    }

    #[test]
    fn huge_page_advice_covers_only_whole_stretches() {
        const H: usize = HUGE_PAGE;
        assert_eq!(whole_huge_pages(H, 4 * H), Some(H..5 * H));
        // 8 MiB from an address just past a boundary: three whole huge pages, the ends left out.
        assert_eq!(whole_huge_pages(H + 16, 4 * H), Some(2 * H..5 * H));
        assert_eq!(whole_huge_pages(H + 1, H), None);
        assert_eq!(whole_huge_pages(H + 1, 10), None);
        assert_eq!(whole_huge_pages(usize::MAX - 10, H), None, "no overflow");
    }

    #[test]
    fn a_buffer_given_back_comes_out_again_empty() {
        let pool = Pool::new(64 * MIB);
        let size = 3 * MIB + 11;
        let mut buf = pool.take(size);
        buf.extend_from_slice(&vec![7u8; size]);
        let ptr = buf.as_ptr();
        pool.give_back(buf.freeze());
        assert!(pool.held() >= size);
        let again = pool.take(size);
        assert_eq!(again.as_ptr(), ptr, "the same allocation is reused");
        assert!(again.is_empty(), "nothing of its last use is visible");
        assert!(again.capacity() >= size);
        assert_eq!(pool.held(), 0);
    }

    #[test]
    fn a_pooled_buffer_comes_back_when_its_last_slice_goes() {
        static LENDER: Pool = Pool::new(64 * MIB);
        let size = 2 * MIB;
        let mut buf = LENDER.take(size);
        buf.extend_from_slice(&vec![3u8; size]);
        let ptr = buf.as_ptr();
        let bytes = LENDER.lend(buf);
        let reply = bytes.slice(100..200);
        // The reader lets go first (and hands its bytes back as before: a no-op for lent ones).
        LENDER.give_back(bytes);
        assert_eq!(LENDER.held(), 0, "a slice still points into it");
        assert_eq!(&reply[..], &[3u8; 100]);
        drop(reply);
        assert!(LENDER.held() >= size, "back once the last slice is gone");
        let again = LENDER.take(size);
        assert_eq!(
            again.as_ptr(),
            ptr,
            "the same allocation is handed out again"
        );
        assert!(again.is_empty());
        // Small buffers are not worth pooling: plain shared bytes.
        let small = LENDER.lend(BytesMut::from(&b"abc"[..]));
        assert_eq!(&small[..], b"abc");
        drop(small);
        assert_eq!(LENDER.held(), 0);
    }

    #[test]
    fn a_buffer_still_referenced_is_not_reused() {
        let pool = Pool::new(64 * MIB);
        let size = 5 * MIB;
        let mut buf = pool.take(size);
        buf.extend_from_slice(&vec![9u8; size]);
        let bytes = buf.freeze();
        let reply = bytes.slice(10..20);
        pool.give_back(bytes);
        assert_eq!(pool.held(), 0, "a slice still points into it");
        assert_eq!(&reply[..], &[9u8; 10]);
    }

    #[test]
    fn small_buffers_and_buffers_past_the_limit_are_left_to_malloc() {
        let pool = Pool::new(20 * MIB);
        pool.give_back_mut(BytesMut::with_capacity(4096));
        assert_eq!(pool.held(), 0);
        for _ in 0..5 {
            pool.give_back_mut(BytesMut::with_capacity(8 * MIB));
        }
        assert_eq!(pool.held(), 16 * MIB, "two of five fit under 20 MiB");
        // A 1 MiB request does not take an 8 MiB buffer.
        assert_eq!(pool.take(MIB).capacity(), MIB);
        assert_eq!(pool.held(), 16 * MIB);
        assert!(pool.take(5 * MIB).capacity() >= 8 * MIB);
    }

    #[test]
    fn drained_buffers_are_gone_and_takes_are_counted() {
        let pool = Pool::new(64 * MIB);
        let before = pool.taken.load(Ordering::Relaxed);
        let a = pool.take(2 * MIB);
        let b = pool.take(100);
        assert_eq!(
            pool.taken.load(Ordering::Relaxed),
            before + 2,
            "small takes count too"
        );
        pool.give_back_mut(a);
        drop(b);
        assert!(pool.held() >= 2 * MIB);
        assert!(pool.drain() >= 2 * MIB);
        assert_eq!(pool.held(), 0);
        assert_eq!(pool.drain(), 0, "nothing left the second time");
    }

    #[test]
    fn a_small_memory_target_shrinks_the_pool() {
        let pool = Pool::new(MAX_POOLED_BYTES);
        pool.limit_to(64 * MIB as u64);
        for _ in 0..4 {
            pool.give_back_mut(BytesMut::with_capacity(8 * MIB));
        }
        assert_eq!(pool.held(), 16 * MIB, "a quarter of a 64 MiB target");
        pool.limit_to(64 << 30);
        for _ in 0..20 {
            pool.give_back_mut(BytesMut::with_capacity(8 * MIB));
        }
        assert_eq!(pool.held(), MAX_POOLED_BYTES, "never above the fixed cap");
    }
}
