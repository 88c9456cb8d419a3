//! The daemon's allocator: mimalloc for small blocks, the system's (glibc) for big ones.
//!
//! Per file read, the daemon makes many small allocations (the SDK's request, headers, futures, the FUSE
//! reply): glibc's malloc, then held to two arenas by `main.rs`, was about 16% of the daemon's CPU
//! in the small-file probe, and mimalloc's per-thread heaps cut the daemon's CPU per file by about a tenth
//! (docs/BENCHMARKS.md). Big buffers (read-ahead windows, upload parts) stay with glibc: `memory.rs` tunes
//! how glibc gives them back, and under mimalloc alone freed multi-MiB buffers stayed resident (a 64 MiB
//! `--memory-target` peaked at 268 MiB against about 105 MiB; with this split, 127-131 MiB).

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks of this size or more come from the system allocator.
pub const BIG_BLOCK: usize = 32 * 1024;

/// Routes each block by its size; a block's size at free and at realloc is the size it was given, so each
/// block goes back to the allocator it came from.
pub struct SplitAllocator;

fn is_big(size: usize) -> bool {
    size >= BIG_BLOCK
}

// SAFETY: every method hands a block to the allocator its size selects, and `dealloc`/`realloc` receive the
// layout the block was allocated with (GlobalAlloc's contract), so they select the same allocator again.
unsafe impl GlobalAlloc for SplitAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees (non-zero size).
        unsafe {
            if is_big(layout.size()) {
                System.alloc(layout)
            } else {
                mimalloc::MiMalloc.alloc(layout)
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe {
            if is_big(layout.size()) {
                System.alloc_zeroed(layout)
            } else {
                mimalloc::MiMalloc.alloc_zeroed(layout)
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `layout` is the one `ptr` was allocated with, so its size picks the same allocator.
        unsafe {
            if is_big(layout.size()) {
                System.dealloc(ptr, layout)
            } else {
                mimalloc::MiMalloc.dealloc(ptr, layout)
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: within one allocator this is its own realloc; across the boundary, a new block from the
        // other one, the bytes both sizes cover copied, and the old block freed where it came from.
        unsafe {
            match (is_big(layout.size()), is_big(new_size)) {
                (true, true) => System.realloc(ptr, layout, new_size),
                (false, false) => mimalloc::MiMalloc.realloc(ptr, layout, new_size),
                _ => {
                    let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
                    let new = self.alloc(new_layout);
                    if !new.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    new
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grows a block across the boundary and back, checking its bytes each way.
    #[test]
    fn realloc_keeps_bytes_across_the_boundary() {
        let a = SplitAllocator;
        for align in [1, 8, 64, 4096] {
            let small = Layout::from_size_align(1000, align).unwrap();
            // SAFETY: layouts of non-zero size; each pointer is used within its size and freed once.
            unsafe {
                let p = a.alloc(small);
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0);
                for i in 0..1000 {
                    *p.add(i) = (i % 251) as u8;
                }
                let big = a.realloc(p, small, BIG_BLOCK + 10);
                assert!(!big.is_null());
                assert_eq!(big as usize % align, 0);
                assert!((0..1000).all(|i| *big.add(i) == (i % 251) as u8));
                let big_layout = Layout::from_size_align(BIG_BLOCK + 10, align).unwrap();
                let back = a.realloc(big, big_layout, 500);
                assert!(!back.is_null());
                assert_eq!(back as usize % align, 0);
                assert!((0..500).all(|i| *back.add(i) == (i % 251) as u8));
                a.dealloc(back, Layout::from_size_align(500, align).unwrap());
            }
        }
    }

    #[test]
    fn zeroed_blocks_are_zero_on_both_sides() {
        let a = SplitAllocator;
        for size in [64, BIG_BLOCK - 1, BIG_BLOCK, 4 * BIG_BLOCK] {
            let layout = Layout::from_size_align(size, 16).unwrap();
            // SAFETY: non-zero size; read within it; freed once with its layout.
            unsafe {
                let p = a.alloc_zeroed(layout);
                assert!(!p.is_null());
                assert!((0..size).step_by(4093).all(|i| *p.add(i) == 0));
                a.dealloc(p, layout);
            }
        }
    }
}
