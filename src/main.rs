//! `expressfs`: mount an S3 Express One Zone directory bucket (or a general purpose bucket) with FUSE.

fn main() {
    tune_malloc();
    std::process::exit(expressfs::daemon::main());
}

/// glibc gives each thread that allocates its own arena, up to 8 per core. The FUSE threads and the runtime
/// threads all pass part and body buffers of several MiB around, and every arena keeps what was freed in
/// it: a 2 GiB checkpoint grew the daemon to 360 MiB resident with the default, against 140 MiB with two
/// arenas at the same speed (docs/BENCHMARKS.md).
///
/// A fixed mmap threshold also stops glibc from raising it after the first multi-MiB buffer is freed; raised,
/// later buffers of that size come from the heap, whose freed holes stay resident: four readers under a
/// 64 MiB `--memory-target` peaked at 150-210 MiB that way, 100 MiB with the threshold fixed at 1 MiB, at the
/// same throughput (the hot buffers are pooled, src/buffers.rs). Either variable in the environment wins.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: called first thing in main, before any thread exists; mallopt only sets a tunable.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        // SAFETY: as above.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1024 * 1024) };
    }
}
