//! The file-system side of the workloads: the same steps run through any mount (expressfs or a peer) with
//! plain std::fs calls, each on its own thread under a deadline so a stuck mount becomes "timeout".

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, ensure};

use crate::mounts::Mount;
use crate::s3::{BigObject, MIB, emulator_gets, pattern, random_offsets};
use crate::shards::{self, ShardSet};

/// What was uploaded, and what readers should find.
pub struct Dataset {
    pub big: u64,
    pub quarter: u64,
    pub small_files: usize,
    pub list_entries: usize,
    pub random_reads: usize,
    /// Reads of the 1 MiB random-read workload ([`RANDOM_1M`]).
    pub random_big_reads: usize,
    pub shards: ShardSet,
    /// Workloads to run (`--only`); the others are reported as "not run".
    pub selected: std::collections::BTreeSet<u8>,
}

/// One client's result for one workload.
#[derive(Clone, Debug)]
pub enum Outcome {
    Value(f64),
    /// Why there is no number: "not installed", "timeout", "failed", "n/a".
    Missing(String),
}

#[derive(Clone, Debug)]
pub struct Cell {
    pub outcome: Outcome,
    /// A remark for the notes column (CPU, memory, latency percentiles).
    pub note: Option<String>,
}

impl Cell {
    pub fn value(value: f64, note: Option<String>) -> Cell {
        Cell {
            outcome: Outcome::Value(value),
            note,
        }
    }

    pub fn missing(why: &str) -> Cell {
        Cell {
            outcome: Outcome::Missing(why.into()),
            note: None,
        }
    }
}

/// A client's results by workload number.
pub type Results = BTreeMap<u8, Cell>;

struct Measured {
    value: f64,
    note: Option<String>,
}

impl From<f64> for Measured {
    fn from(value: f64) -> Self {
        Measured { value, note: None }
    }
}

type Step = fn(&Path, &Dataset) -> Result<Measured>;

/// Workload 3's second half, random 1 MiB reads: its own row ("3b") under an id past the numbered ones, so
/// the numbers 1-8 keep their meaning; `--only 3` selects it too.
pub const RANDOM_1M: u8 = 9;

/// The read workloads every client runs, by number. Workload 7 (writing) needs a writable mount and
/// runs for expressfs only; 8 (first byte) is measured when mounting.
const READ_STEPS: [(u8, Step); 7] = [
    (1, seq_read),
    (2, parallel_read),
    (3, random_reads),
    (RANDOM_1M, random_big_reads),
    (4, small_files),
    (5, list_stat),
    (6, tar_shards),
];

pub enum StepError {
    Timeout,
    Failed(anyhow::Error),
}

/// Runs `f` on its own thread and gives up waiting after `limit` (the thread is left behind; the caller
/// kills the mount so that it ends).
pub fn with_timeout<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> std::result::Result<T, StepError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("bench-step".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| StepError::Failed(e.into()))?;
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(StepError::Failed(e)),
        Err(RecvTimeoutError::Timeout) => Err(StepError::Timeout),
        Err(RecvTimeoutError::Disconnected) => Err(StepError::Failed(anyhow!("step panicked"))),
    }
}

/// Turns a failed or timed-out step into a cell (and says why on stderr).
fn failed_cell(client: &str, id: u8, err: StepError, timeout: Duration) -> Cell {
    match err {
        StepError::Timeout => {
            eprintln!("{client}: workload {id} timed out after {timeout:?}");
            Cell::missing("timeout")
        }
        StepError::Failed(e) => {
            eprintln!("{client}: workload {id} failed: {e:#}");
            Cell::missing("failed")
        }
    }
}

/// Runs the read workloads through `mount`. After a timeout the server is killed and the remaining
/// workloads are skipped for this client.
pub fn run_reads(
    mount: &mut Mount,
    data: &Arc<Dataset>,
    endpoint: &str,
    timeout: Duration,
) -> Results {
    let mut out = Results::new();
    let mut broken = false;
    for (id, step) in READ_STEPS {
        if !data.selected.contains(&id) {
            out.insert(id, Cell::missing("not run"));
            continue;
        }
        if broken {
            out.insert(id, Cell::missing("skipped"));
            continue;
        }
        eprintln!("{}: workload {id} ...", mount.name);
        settle();
        let (root, d) = (mount.root().to_path_buf(), Arc::clone(data));
        let cpu0 = mount.cpu_secs();
        let gets0 = emulator_gets(endpoint);
        let cell = match with_timeout(timeout, move || step(&root, &d)) {
            Ok(m) => {
                let note = match id {
                    1 => Some(format!(
                        "CPU {:.2} s/GiB",
                        (mount.cpu_secs() - cpu0) / (data.big as f64 / (1024 * MIB) as f64)
                    )),
                    2 => Some(format!("peak RSS {:.0} MiB", mount.peak_rss_mib())),
                    // How the client fetched: one that prefetches big regions serves later random
                    // reads locally, which the read rate alone would hide.
                    3 | RANDOM_1M => match (gets0, emulator_gets(endpoint)) {
                        (Some((g0, b0)), Some((g1, b1))) => Some(format!(
                            "{}, {} GETs for {:.0} MiB",
                            m.note.unwrap_or_default(),
                            g1.saturating_sub(g0),
                            b1.saturating_sub(b0) as f64 / MIB as f64
                        )),
                        _ => m.note,
                    },
                    _ => m.note,
                };
                Cell::value(m.value, note)
            }
            Err(e) => {
                if matches!(e, StepError::Timeout) {
                    mount.abort();
                    broken = true;
                }
                failed_cell(mount.name, id, e, timeout)
            }
        };
        out.insert(id, cell);
    }
    out
}

/// Writes everything dirty to disk before a measurement. The emulator keeps objects in files: without
/// this, the kernel flushes what the data set or the previous workload wrote (the checkpoints are 1 GiB)
/// whenever its 30 s expiry comes, in the middle of some later workload, and that workload pays for it.
pub fn settle() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Workload 8: the time to mount plus opening a file and reading its first byte. Returns ms.
pub fn first_byte(mount: &mut Mount, mount_time: Duration, timeout: Duration) -> Cell {
    let path = mount.root().join("small/000000.jpg");
    let read = with_timeout(timeout, move || {
        let started = Instant::now();
        let mut f = std::fs::File::open(path)?;
        f.read_exact(&mut [0u8; 1])?;
        Ok(started.elapsed())
    });
    match read {
        Ok(elapsed) => Cell::value((mount_time + elapsed).as_secs_f64() * 1000.0, None),
        Err(e) => {
            if matches!(e, StepError::Timeout) {
                mount.abort();
            }
            failed_cell(mount.name, 8, e, timeout)
        }
    }
}

/// Reads a whole file with 4 MiB `read(2)`s. Returns the bytes read.
fn read_whole(path: &Path) -> Result<u64> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 4 * MIB as usize];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}

fn mbps(bytes: u64, started: Instant) -> f64 {
    bytes as f64 / MIB as f64 / started.elapsed().as_secs_f64()
}

/// 1. One big file, sequential. MB/s.
fn seq_read(root: &Path, d: &Dataset) -> Result<Measured> {
    let started = Instant::now();
    let n = read_whole(&root.join("big/seq.bin"))?;
    ensure!(n == d.big, "read {n} of {} bytes", d.big);
    Ok(mbps(n, started).into())
}

/// 2. Four files at once, one thread each. MB/s.
fn parallel_read(root: &Path, d: &Dataset) -> Result<Measured> {
    let started = Instant::now();
    let readers: Vec<_> = (0..4)
        .map(|i| {
            let p = root.join(format!("par/{i}.bin"));
            std::thread::spawn(move || read_whole(&p))
        })
        .collect();
    for r in readers {
        let n = r.join().map_err(|_| anyhow!("reader panicked"))??;
        ensure!(n == d.quarter, "read {n} of {} bytes", d.quarter);
    }
    Ok(mbps(4 * d.quarter, started).into())
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p) as usize]
}

/// 3. Random 64 KiB reads of the big file, one thread. reads/s, with latency percentiles.
fn random_reads(root: &Path, d: &Dataset) -> Result<Measured> {
    random_reads_of(root, d.big, d.random_reads, 65536)
}

/// 3b. The same with 1 MiB reads.
fn random_big_reads(root: &Path, d: &Dataset) -> Result<Measured> {
    random_reads_of(root, d.big, d.random_big_reads, MIB)
}

/// `count` reads of `len` bytes at the shared random offsets, each checked against the object's bytes (a
/// client that returns wrong bytes fails the workload instead of scoring). The rate counts the time spent in
/// `read(2)` only, not the checks.
fn random_reads_of(root: &Path, big: u64, count: usize, len: u64) -> Result<Measured> {
    let f = std::fs::File::open(root.join("big/seq.bin"))?;
    let object = BigObject::default();
    let offsets = random_offsets(7, count, big, len);
    let mut buf = vec![0u8; len as usize];
    let mut lat = Vec::with_capacity(offsets.len());
    for &off in &offsets {
        let t = Instant::now();
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, off)?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        ensure!(
            object.matches(off, &buf),
            "random read of {len} bytes at {off}: wrong bytes"
        );
    }
    let value = count as f64 / (lat.iter().sum::<f64>() / 1000.0);
    let note = format!(
        "p50 {:.1} ms, p99 {:.1} ms",
        percentile(&mut lat, 0.5),
        percentile(&mut lat, 0.99)
    );
    Ok(Measured {
        value,
        note: Some(note),
    })
}

/// 4. Whole small files, 64 threads. files/s.
fn small_files(root: &Path, d: &Dataset) -> Result<Measured> {
    let n = d.small_files;
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..64)
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok(());
                        }
                        let data = std::fs::read(root.join(format!("small/{i:06}.jpg")))?;
                        ensure!(
                            data.len() == 100_000,
                            "small/{i:06}.jpg: {} bytes",
                            data.len()
                        );
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().map_err(|_| anyhow!("reader panicked"))??;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    Ok((n as f64 / started.elapsed().as_secs_f64()).into())
}

/// 5. `ls -l` of one large directory: readdir plus a stat per entry. entries/s.
fn list_stat(root: &Path, d: &Dataset) -> Result<Measured> {
    let started = Instant::now();
    let mut seen = 0;
    for e in std::fs::read_dir(root.join("list"))? {
        e?.metadata()?;
        seen += 1;
    }
    ensure!(
        seen == d.list_entries,
        "listed {seen}, expected {}",
        d.list_entries
    );
    Ok((seen as f64 / started.elapsed().as_secs_f64()).into())
}

/// 6. WebDataset shards, 8 workers. samples/s.
fn tar_shards(root: &Path, d: &Dataset) -> Result<Measured> {
    let started = Instant::now();
    let samples = shards::fs_samples(root, &d.shards)?;
    ensure!(
        samples == d.shards.samples,
        "counted {samples} samples, expected {}",
        d.shards.samples
    );
    Ok((samples as f64 / started.elapsed().as_secs_f64()).into())
}

/// 7. A checkpoint: `mib` MiB written to `name` in 1 MiB `write(2)`s, then fsync. MB/s.
pub fn checkpoint(root: PathBuf, name: &str, mib: u64) -> Result<f64> {
    let chunk = pattern(5, MIB as usize);
    let started = Instant::now();
    let mut f = std::fs::File::create(root.join(name))?;
    for _ in 0..mib {
        f.write_all(&chunk)?;
    }
    f.sync_all()?;
    Ok(mib as f64 / started.elapsed().as_secs_f64())
}

/// Runs workload 7 through `mount` (a writable expressfs mount).
pub fn run_checkpoint(mount: &mut Mount, name: &str, mib: u64, timeout: Duration) -> Cell {
    eprintln!("{}: workload 7 ...", mount.name);
    settle();
    let root = mount.root().to_path_buf();
    let name = name.to_string();
    match with_timeout(timeout, move || checkpoint(root, &name, mib)) {
        Ok(v) => Cell::value(v, Some(format!("peak RSS {:.0} MiB", mount.peak_rss_mib()))),
        Err(e) => {
            if matches!(e, StepError::Timeout) {
                mount.abort();
            }
            failed_cell(mount.name, 7, e, timeout)
        }
    }
}

/// The median of one client's cells for one workload over several rounds (the lower one of the middle two
/// for an even count). A round that failed or timed out makes the whole cell that failure.
pub fn median(cells: Vec<Cell>) -> Cell {
    let mut values = Vec::with_capacity(cells.len());
    for cell in cells {
        match cell.outcome {
            Outcome::Value(v) => values.push((v, cell)),
            Outcome::Missing(_) => return cell,
        }
    }
    lower_median(values).unwrap_or_else(|| Cell::missing("not run"))
}

/// The item with the lower-middle value (the middle one for an odd count).
pub fn lower_median<T>(mut items: Vec<(f64, T)>) -> Option<T> {
    items.sort_by(|a, b| a.0.total_cmp(&b.0));
    let middle = items.len().checked_sub(1)? / 2;
    items.into_iter().nth(middle).map(|(_, item)| item)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_takes_the_middle_and_keeps_its_note() {
        let cell = |v: f64| Cell::value(v, Some(format!("note {v}")));
        let m = median(vec![cell(3.0), cell(1.0), cell(2.0)]);
        assert!(matches!(m.outcome, Outcome::Value(v) if v == 2.0));
        assert_eq!(m.note.as_deref(), Some("note 2"));
        let m = median(vec![cell(4.0), cell(1.0)]);
        assert!(matches!(m.outcome, Outcome::Value(v) if v == 1.0));
        let m = median(vec![cell(4.0), Cell::missing("timeout"), cell(1.0)]);
        assert!(matches!(m.outcome, Outcome::Missing(ref why) if why == "timeout"));
    }
}
