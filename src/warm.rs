//! `expressfs warm PATH... [--jobs N] [--listing-only]`: fills a running mount's caches before a job needs
//! them. It walks the given files and trees through the mount (every directory listed, every entry
//! stat'ed: the metadata cache), then has every file fetched whole into the mount's data caches (`--cache`,
//! and `--cache-xz` for small objects) with N at once. An expressfs mount fetches a file when asked by an ioctl on it ([`crate::fuse::KEEP_IN_CACHE`]),
//! so the bytes go from the bucket to the cache without crossing FUSE twice; any other file system, or a
//! mount without a cache, has its files read to the end instead (the page cache is all there is to fill).
//! Nothing passes between it and the daemon but file system calls.
//!
//! mount-s3 has no subcommands, so `expressfs warm DIR` could also mean "mount the bucket named warm at
//! DIR". It means the mount when its one argument is a mount point in the making (an empty directory
//! outside any FUSE mount, or a dead mount), or when flags other than warm's own are given; anything on a
//! FUSE mount, a file, or several paths is a warm-up. `s3://warm` always names the bucket.

use std::collections::VecDeque;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "expressfs warm",
    bin_name = "expressfs warm",
    about = "Fill a running mount's caches: list the given files and trees through the mount and fetch every file into its cache",
    after_help = "Exits 1 and lists the files that could not be fetched, if any. On a mount without --cache (or another file system), files are read to the end instead."
)]
pub struct WarmArgs {
    /// Files or directories on an expressfs mount (directories are walked; symlinks inside them are not followed)
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Files fetched at once (at most a quarter of them, and 8, big files while small ones wait)
    #[arg(short, long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub jobs: u16,
    /// Only list directories and stat files (fills the metadata cache; reads no data)
    #[arg(long)]
    pub listing_only: bool,
}

/// True when `args` (the command line after the program name) asks for a warm-up; see the module's rule.
pub fn is_warm_invocation(args: &[String]) -> bool {
    let Some((first, rest)) = args.split_first() else {
        return false;
    };
    if first != "warm" {
        return false;
    }
    let mut positional = Vec::new();
    let mut i = 0;
    while i < rest.len() {
        let arg = rest[i].as_str();
        if arg == "--" {
            positional.extend(rest[i + 1..].iter());
            break;
        }
        if arg.starts_with('-') && arg.len() > 1 {
            let takes_value = matches!(arg, "-j" | "--jobs");
            let own = takes_value
                || matches!(arg, "-h" | "--help" | "--listing-only")
                || arg.starts_with("--jobs=")
                || (arg.starts_with("-j") && arg[2..].parse::<u16>().is_ok());
            if !own {
                return false;
            }
            i += usize::from(takes_value);
        } else {
            positional.push(&rest[i]);
        }
        i += 1;
    }
    match positional.as_slice() {
        [only] => !is_mount_point_to_be(Path::new(only.as_str())),
        _ => true,
    }
}

/// An empty directory outside any FUSE mount (nothing there to warm), or a dead mount.
fn is_mount_point_to_be(path: &Path) -> bool {
    match std::fs::metadata(path) {
        Err(e) => e.raw_os_error() == Some(libc::ENOTCONN),
        Ok(meta) => {
            meta.is_dir()
                && !on_fuse(path)
                && std::fs::read_dir(path).is_ok_and(|mut d| d.next().is_none())
        }
    }
}

fn on_fuse(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::FUSE_SUPER_MAGIC)
}

/// Runs `expressfs warm`; `argv` starts with the program name and `warm`. Returns the exit code.
pub fn main(argv: &[String]) -> i32 {
    let args = match WarmArgs::try_parse_from(argv.iter().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    for path in &args.paths {
        if path.exists() && !on_fuse(path) {
            eprintln!(
                "expressfs warm: note: {} is not on a FUSE mount; reading it warms no expressfs cache",
                path.display()
            );
        }
    }
    let outcome = run(&args, std::io::stderr().is_terminal());
    println!("{}", outcome.summary(args.listing_only));
    if outcome.failed.is_empty() {
        return 0;
    }
    eprintln!("expressfs warm: {} path(s) failed:", outcome.failed.len());
    for (path, error) in &outcome.failed {
        eprintln!("  {}: {error}", path.display());
    }
    1
}

/// What a warm-up did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub files: u64,
    pub directories: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    /// Paths that could not be listed, stat'ed or read, with the error, in path order.
    pub failed: Vec<(PathBuf, String)>,
}

impl Outcome {
    pub fn summary(&self, listing_only: bool) -> String {
        let secs = self.elapsed.as_secs_f64();
        let verb = if listing_only { "listed" } else { "warmed" };
        let mut line = format!(
            "expressfs warm: {verb} {} files in {} directories",
            self.files, self.directories
        );
        if !listing_only {
            line.push_str(&format!(
                ", {:.1} MiB at {:.1} MiB/s",
                self.bytes as f64 / (1 << 20) as f64,
                self.bytes as f64 / (1 << 20) as f64 / secs.max(1e-3)
            ));
        }
        line.push_str(&format!(" in {secs:.1} s; {} failed", self.failed.len()));
        line
    }
}

/// Walks and reads (unless `--listing-only`) with `jobs` threads; `progress` draws a bar. Files are read as
/// soon as a listing finds them: the walk and the reads overlap, and a tree of many directories starts
/// sending GETs with its first listing.
pub fn run(args: &WarmArgs, progress: bool) -> Outcome {
    let started = Instant::now();
    let bar = if progress && args.listing_only {
        indicatif::ProgressBar::new_spinner()
    } else if progress {
        // The total grows as listings find files.
        indicatif::ProgressBar::new(0)
    } else {
        indicatif::ProgressBar::hidden()
    };
    if !args.listing_only {
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:30} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    let work = Work::new(!args.listing_only, args.jobs, bar);
    for path in &args.paths {
        // The paths given are followed if they are symlinks, as a user who names one means its target.
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => work.push_dir(path.clone()),
            Ok(meta) => work.found_file(path.clone(), meta.len()),
            Err(e) => work.failed(path.clone(), e),
        }
    }
    std::thread::scope(|s| {
        for _ in 0..args.jobs {
            s.spawn(|| work.work());
        }
    });
    work.bar.finish_and_clear();
    let mut failed = work
        .failures
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    failed.sort();
    Outcome {
        files: work.files.load(Ordering::Relaxed),
        directories: work.directories.load(Ordering::Relaxed),
        bytes: work.bytes.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
        failed,
    }
}

/// Asks the mount to fetch the file from `start` on into its cache ([`crate::fuse::KEEP_IN_CACHE`]): where
/// the kept bytes end, and whether the file goes on past them.
fn keep_in_cache(file: &std::fs::File, start: u64) -> std::io::Result<(u64, bool)> {
    use std::os::fd::AsRawFd;
    loop {
        let mut offset = start;
        // SAFETY: the command's encoding has the kernel copy 8 bytes from and back into `offset`, 8 bytes.
        let rc = unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                crate::fuse::KEEP_IN_CACHE as _,
                &mut offset as *mut u64,
            )
        };
        if rc >= 0 {
            return Ok((offset, rc > 0));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Size of each read(2): what the kernel passes to the daemon in one request at most (`max_read`, 1 MiB),
/// so a file read around the page cache needs no more requests than that.
const READ_BUFFER: usize = 1 << 20;

/// A file at least this big is read ahead by the daemon with several GETs at once, so one reader keeps
/// several requests in flight; a smaller one is a single GET, and its reader mostly waits for the first byte.
const BIG_FILE: u64 = 4 << 20;

/// Big files read at once while small ones wait: a few readers of big files already keep every request in
/// flight the daemon's read-ahead allows (on the emulator, 4 shard readers reach 1 GB/s and 8 no more),
/// and more only hold more read-ahead memory, every page of it faulted in.
const MAX_BIG_READING: usize = 8;

/// What a thread does next.
enum Task {
    List(PathBuf),
    Read { path: PathBuf, big: bool },
    Done,
}

/// Directories to list and files to read, shared by all threads; the work is over when the queues are
/// empty and no listing is under way (a listing may add more).
///
/// Big files and small ones are read side by side: a quarter of the threads at most on big files while
/// small ones wait. Big files alone keep the network and the CPU busy with few readers (the daemon reads
/// ahead), small files alone leave both idle between round trips; one after the other, a warm-up pays
/// both in full (measured: 24 shards of 32 MiB and 4,096 files of 64 KiB took the sum of their separate
/// times).
struct Queues {
    dirs: VecDeque<PathBuf>,
    small: VecDeque<PathBuf>,
    big: VecDeque<PathBuf>,
    big_reading: usize,
    max_big_reading: usize,
    listing: usize,
}

struct Work {
    read: bool,
    queues: Mutex<Queues>,
    wake: Condvar,
    bar: indicatif::ProgressBar,
    failures: Mutex<Vec<(PathBuf, String)>>,
    files: AtomicU64,
    directories: AtomicU64,
    bytes: AtomicU64,
    files_read: AtomicU64,
    /// Whether files are still asked to be kept (an ioctl) rather than read: until a file system says it
    /// cannot.
    ask_to_keep: AtomicBool,
}

impl Work {
    fn new(read: bool, jobs: u16, bar: indicatif::ProgressBar) -> Work {
        Work {
            read,
            queues: Mutex::new(Queues {
                dirs: VecDeque::new(),
                small: VecDeque::new(),
                big: VecDeque::new(),
                big_reading: 0,
                max_big_reading: usize::from(jobs / 4).clamp(1, MAX_BIG_READING),
                listing: 0,
            }),
            wake: Condvar::new(),
            bar,
            failures: Mutex::default(),
            files: AtomicU64::new(0),
            directories: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            files_read: AtomicU64::new(0),
            ask_to_keep: AtomicBool::new(true),
        }
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push_dir(&self, dir: PathBuf) {
        self.queues().dirs.push_back(dir);
        self.wake.notify_one();
    }

    fn found_file(&self, path: PathBuf, len: u64) {
        self.files.fetch_add(1, Ordering::Relaxed);
        if self.read {
            self.bar.inc_length(len);
            let mut queues = self.queues();
            if len >= BIG_FILE {
                queues.big.push_back(path);
            } else {
                queues.small.push_back(path);
            }
            drop(queues);
            self.wake.notify_one();
        }
    }

    fn failed(&self, path: PathBuf, error: std::io::Error) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((path, error.to_string()));
    }

    /// Directories come first: a listing is quick and finds the work for every thread. Then big files up to
    /// their share of the threads (started early, they do not end the warm-up alone), then small ones, then
    /// big ones beyond their share when no small file is left.
    fn next(&self) -> Task {
        let mut queues = self.queues();
        loop {
            if let Some(dir) = queues.dirs.pop_front() {
                queues.listing += 1;
                return Task::List(dir);
            }
            let big_turn = queues.big_reading < queues.max_big_reading || queues.small.is_empty();
            let (file, big) = match queues.big.front() {
                Some(_) if big_turn => (queues.big.pop_front(), true),
                _ => (queues.small.pop_front(), false),
            };
            if let Some(path) = file {
                queues.big_reading += usize::from(big);
                return Task::Read { path, big };
            }
            if queues.listing == 0 {
                self.wake.notify_all();
                return Task::Done;
            }
            queues = self.wake.wait(queues).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn work(&self) {
        let mut buf = Vec::new();
        loop {
            match self.next() {
                Task::List(dir) => {
                    self.list(&dir);
                    let listed = self.directories.fetch_add(1, Ordering::Relaxed) + 1;
                    if !self.read {
                        self.bar.set_message(format!("listed {listed} directories"));
                    }
                    self.queues().listing -= 1;
                    // The last listing may leave nothing to do: the threads waiting must learn it.
                    self.wake.notify_all();
                }
                Task::Read { path, big } => {
                    if let Err(e) = self.warm_file(&path, &mut buf) {
                        self.failed(path, e);
                    }
                    if big {
                        self.queues().big_reading -= 1;
                    }
                    let n = self.files_read.fetch_add(1, Ordering::Relaxed) + 1;
                    self.bar
                        .set_message(format!("{n}/{} files", self.files.load(Ordering::Relaxed)));
                }
                Task::Done => return,
            }
        }
    }

    /// Has the mount keep the file in its cache; reads it to the end where that cannot be done.
    fn warm_file(&self, path: &Path, buf: &mut Vec<u8>) -> std::io::Result<()> {
        // O_NONBLOCK (a no-op on a regular file) tells the mount this open is not for reading: a small
        // file's bytes are then not put into the kernel's page cache with the open.
        let mut file = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)?
        };
        let mut start = 0;
        if self.ask_to_keep.load(Ordering::Relaxed) {
            let refused = loop {
                match keep_in_cache(&file, start) {
                    Ok((end, more)) => {
                        let kept = end.saturating_sub(start);
                        self.bytes.fetch_add(kept, Ordering::Relaxed);
                        self.bar.inc(kept);
                        if !more || end <= start {
                            return Ok(());
                        }
                        start = end;
                    }
                    Err(e) => break e,
                }
            };
            match refused.raw_os_error() {
                // Not an expressfs mount (ENOTTY), or one with no cache to fill: read from now on.
                Some(libc::ENOTTY | libc::EOPNOTSUPP) => {
                    self.ask_to_keep.store(false, Ordering::Relaxed);
                }
                // This file is being written through the mount, or too big for the only cache: read it.
                Some(libc::EBUSY | libc::EFBIG) => {}
                _ => return Err(refused),
            }
        }
        if buf.is_empty() {
            *buf = vec![0u8; READ_BUFFER];
        }
        // What a refusal after earlier requests left is read from where they stopped (it is counted once).
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(start))?;
        self.read_to_end(&mut file, buf)
    }

    fn read_to_end(&self, file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<()> {
        loop {
            match file.read(buf) {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    self.bytes.fetch_add(n as u64, Ordering::Relaxed);
                    self.bar.inc(n as u64);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Lists one directory and stats every entry (a lookup each: the metadata cache).
    fn list(&self, dir: &Path) {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => return self.failed(dir.to_path_buf(), e),
        };
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => return self.failed(dir.to_path_buf(), e),
            };
            let path = entry.path();
            // fstatat on the entry (no symlink followed): the same lookup, without walking the path again.
            match entry.metadata() {
                Ok(meta) if meta.is_dir() => self.push_dir(path),
                Ok(meta) if meta.is_file() => self.found_file(path, meta.len()),
                Ok(_) => {}
                Err(e) => self.failed(path, e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn warm_is_a_subcommand_unless_it_reads_as_a_mount() {
        let empty = tempfile::tempdir().unwrap();
        let full = tempfile::tempdir().unwrap();
        std::fs::write(full.path().join("f"), b"x").unwrap();
        let e = empty.path().to_str().unwrap();
        let f = full.path().to_str().unwrap();
        // A bucket named warm, mounted at an empty directory (mount-s3's reading).
        assert!(!is_warm_invocation(&argv(&["warm", e])));
        assert!(!is_warm_invocation(&argv(&["warm", e, "--foreground"])));
        assert!(!is_warm_invocation(&argv(&["warm", f, "-o", "ro"])));
        assert!(!is_warm_invocation(&argv(&["bucket", e])));
        assert!(!is_warm_invocation(&argv(&[])));
        // Something to read: a warm-up.
        assert!(is_warm_invocation(&argv(&["warm", f])));
        assert!(is_warm_invocation(&argv(&["warm", e, f])));
        assert!(is_warm_invocation(&argv(&["warm", "--jobs", "4", f])));
        assert!(is_warm_invocation(&argv(&[
            "warm",
            "-j8",
            "--listing-only",
            f
        ])));
        assert!(is_warm_invocation(&argv(&[
            "warm",
            "--jobs=2",
            "/no/such/path"
        ])));
        assert!(is_warm_invocation(&argv(&["warm", "--help"])));
    }

    #[test]
    fn big_files_take_a_quarter_of_the_threads_while_small_ones_wait() {
        let work = Work::new(true, 16, indicatif::ProgressBar::hidden());
        for i in 0..6 {
            work.found_file(PathBuf::from(format!("big{i}")), BIG_FILE);
            work.found_file(PathBuf::from(format!("small{i}")), BIG_FILE - 1);
        }
        let mut picked = Vec::new();
        for _ in 0..8 {
            match work.next() {
                Task::Read { path, big } => {
                    assert_eq!(big, path.to_str().unwrap().starts_with("big"));
                    picked.push(path.to_str().unwrap().to_string());
                }
                _ => panic!("files are queued"),
            }
        }
        // Four big files (16 threads / 4) first, then small ones while those four are read ...
        assert_eq!(
            picked,
            [
                "big0", "big1", "big2", "big3", "small0", "small1", "small2", "small3"
            ]
        );
        // ... then, one big read done, the next big file; with no small file left, big ones past the share.
        work.queues().big_reading -= 1;
        let mut rest = Vec::new();
        while let Task::Read { path, .. } = work.next() {
            rest.push(path.to_str().unwrap().to_string());
        }
        assert_eq!(rest, ["big4", "small4", "small5", "big5"]);
    }

    #[test]
    fn a_local_tree_is_walked_and_read_and_failures_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/one"), vec![1u8; 3000]).unwrap();
        std::fs::write(dir.path().join("a/b/two"), vec![2u8; 5000]).unwrap();
        std::fs::write(dir.path().join("top"), b"xyz").unwrap();
        std::os::unix::fs::symlink("top", dir.path().join("link")).unwrap();
        let missing = dir.path().join("missing");
        let args = WarmArgs {
            paths: vec![dir.path().to_path_buf(), missing.clone()],
            jobs: 3,
            listing_only: false,
        };
        let out = run(&args, false);
        assert_eq!((out.files, out.directories, out.bytes), (3, 3, 8003));
        assert_eq!(out.failed.len(), 1);
        assert_eq!(out.failed[0].0, missing);
        assert!(
            out.summary(false)
                .contains("warmed 3 files in 3 directories")
        );
        let listed = run(
            &WarmArgs {
                listing_only: true,
                ..args
            },
            false,
        );
        assert_eq!((listed.files, listed.bytes), (3, 0));
    }
}
