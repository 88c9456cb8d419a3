//! `expressfs`: mount an S3 Express One Zone directory bucket (or a general purpose bucket) with FUSE.

#[global_allocator]
static ALLOCATOR: expressfs::alloc::SplitAllocator = expressfs::alloc::SplitAllocator;

fn main() {
    limit_malloc_arenas();
    std::process::exit(expressfs::daemon::main());
}

/// glibc gives each thread that allocates its own arena, up to 8 per core. The FUSE threads and the runtime
/// threads all pass part and body buffers of several MiB around, and every arena keeps what was freed in
/// it: a 2 GiB checkpoint grew the daemon to 360 MiB resident with the default, against 140 MiB with two
/// arenas at the same speed (docs/BENCHMARKS.md). `MALLOC_ARENA_MAX` in the environment still wins.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: called first thing in main, before any thread exists; mallopt only sets a tunable.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
    }
}
