//! `expressfs`: mount an S3 Express One Zone directory bucket (or a general purpose bucket) with FUSE.

#[global_allocator]
static ALLOCATOR: expressfs::alloc::SplitAllocator = expressfs::alloc::SplitAllocator;

fn main() {
    limit_malloc_arenas();
    std::process::exit(expressfs::daemon::main());
}

/// glibc gives each thread that allocates its own arena, up to 8 per core, and every arena keeps what was
/// freed in it. Since blocks under 32 KiB go to mimalloc (`alloc.rs`), glibc serves only big ones (part and
/// body buffers, several per MiB moved), so one arena costs no lock contention worth measuring, and a buffer
/// freed on one thread is there for the next allocation on any other. A 1 GiB checkpoint write peaked at
/// 101-103 MiB resident with one arena against 131-141 MiB with two, at the same speed (docs/BENCHMARKS.md,
/// "One malloc arena"); with glibc's default, before small blocks left it, a 2 GiB one reached 360 MiB.
/// `MALLOC_ARENA_MAX` in the environment still wins.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: called first thing in main, before any thread exists; mallopt only sets a tunable.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    }
}
