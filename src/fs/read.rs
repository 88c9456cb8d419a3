//! Read handles: ranged GETs pinned to the ETag seen at open, with a sequential prefetch window.
//!
//! A reader that continues where it stopped gets chunks fetched ahead: the window starts at
//! [`INITIAL_WINDOW`] (a small file or the first bytes of a big one come back fast) and doubles with every
//! sequential read that had to wait for its bytes, up to `max_window`: one GET per window below a part, two
//! of half a window from there (at most `part_size` each), so that one lands while the other is read. It
//! settles where the bytes arrive just in time, which on a fast link is far below the maximum. The windows of
//! all readers of a mount count against one share (`read_ahead`), past a floor of one part each. A read that
//! jumps elsewhere drops the window and fetches just what it asks for (at least [`MIN_RANDOM_FETCH`]):
//! random access wastes no read-ahead. Prefetched chunks are held against the global [`MemoryBudget`]; when
//! it is spent the window stops growing. Every GET carries If-Match, so a replaced object yields an error,
//! never a mix of bytes.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::task::JoinHandle;

use super::error::{FsError, FsResult};
use super::read_ahead::{ReadAheadShare, WindowGrant};
use crate::memory::{MemoryBudget, Reservation};
use crate::s3::ClientError;
use crate::source::ReadSource;

/// Smallest GET a random read makes: the kernel asks in whole pages, and one 64 KiB GET costs the same
/// round trip as one 4 KiB GET.
const MIN_RANDOM_FETCH: u64 = 64 * 1024;

/// What a random fetch takes past the end of its read. `read(2)` into a buffer that is not page-aligned spans
/// one page more than its length; when that is past the kernel's request limit (1 MiB reads into a buffer
/// from malloc), the kernel splits it into a request of the limit less a few bytes and a remainder of under a
/// page. Fetching that page with the first piece serves the remainder without a second round trip.
const RANDOM_TAIL: u64 = 4096;

/// First prefetch window of a sequential reader.
const INITIAL_WINDOW: u64 = 1024 * 1024;

/// How far past the fetched range a read may land and still count as the same stream: the kernel's
/// readahead sends several requests (up to 1 MiB each) at once and they can arrive out of order.
const REORDER_SLACK: u64 = 2 * 1024 * 1024;

enum ChunkData {
    Pending(JoinHandle<Result<Bytes, ClientError>>),
    Ready(Bytes),
}

struct Chunk {
    start: u64,
    end: u64,
    data: ChunkData,
    _memory: Reservation,
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // Fetched bytes need nothing: their buffer goes back to the pool once every slice of it is gone
        // (`buffers::pooled`).
        if let ChunkData::Pending(task) = &self.data {
            task.abort();
        }
    }
}

/// The bytes all warm-ups of a mount fetch at once ([`Reader::keep`]): one file alone gets a whole read-ahead
/// window of parts in flight, many files share it (with a window each, a warm-up of many big files held
/// hundreds of MiB at once, and went slower for it on two cores: more fresh memory, more contention).
#[derive(Clone)]
pub struct KeepBudget {
    kib: Arc<tokio::sync::Semaphore>,
    total_kib: u32,
}

impl KeepBudget {
    pub fn new(bytes: u64) -> KeepBudget {
        let total_kib = u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX >> 4);
        KeepBudget {
            kib: Arc::new(tokio::sync::Semaphore::new(total_kib as usize)),
            total_kib,
        }
    }

    /// Waits (first come, first served) until `bytes` more may be fetched; held until dropped.
    async fn take(&self, bytes: u64) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let kib = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .clamp(1, self.total_kib);
        Arc::clone(&self.kib).acquire_many_owned(kib).await.ok()
    }
}

pub struct Reader {
    /// Chosen at open: through the caches, or straight from the bucket for O_DIRECT.
    source: Arc<dyn ReadSource>,
    key: String,
    etag: String,
    size: u64,
    part_size: u64,
    max_window: u64,
    window: u64,
    /// Where `window` starts again after a jump: [`INITIAL_WINDOW`], or one part if parts are smaller.
    initial_window: u64,
    /// What of `window` comes from the mount's read-ahead share.
    grant: WindowGrant,
    memory: Arc<MemoryBudget>,
    chunks: VecDeque<Chunk>,
    /// Where the next prefetch starts.
    next_fetch: u64,
    /// End of the previous read, to tell sequential from random access.
    last_end: u64,
    /// The chunks come from sequential prefetching (not from one random read).
    streaming: bool,
    pub bytes_fetched: u64,
}

impl Reader {
    pub fn new(
        source: Arc<dyn ReadSource>,
        key: String,
        etag: String,
        size: u64,
        part_size: u64,
        max_window: u64,
        memory: Arc<MemoryBudget>,
    ) -> Reader {
        let part_size = part_size.max(64 * 1024);
        Reader {
            source,
            key,
            etag,
            size,
            part_size,
            max_window: max_window.max(part_size),
            window: INITIAL_WINDOW.min(part_size),
            initial_window: INITIAL_WINDOW.min(part_size),
            grant: WindowGrant::unshared(),
            memory,
            chunks: VecDeque::new(),
            next_fetch: 0,
            last_end: 0,
            streaming: false,
            bytes_fetched: 0,
        }
    }

    /// Counts its window in `share`, which all readers of the mount draw on: past one part, it grows only as
    /// far as the share allows.
    pub fn sharing_read_ahead(mut self, share: Arc<ReadAheadShare>) -> Reader {
        debug_assert!(
            self.window <= self.part_size,
            "a window already past the floor would not be counted"
        );
        self.grant = WindowGrant::from_share(share, self.part_size);
        self
    }

    /// Reads `etag` of `key` (`size` bytes) from now on: a version made through this mount (an edit this
    /// handle saw while it was staged, now uploaded). What it holds of the version before goes.
    pub fn follow_version(&mut self, key: &str, etag: &str, size: u64) {
        if self.key == key && self.etag == etag {
            return;
        }
        self.key = key.to_string();
        self.etag = etag.to_string();
        self.size = size;
        self.chunks.clear();
        self.streaming = false;
        self.next_fetch = 0;
        self.last_end = 0;
        self.set_window(self.initial_window);
    }

    /// Sets the window to `wanted`, or keeps it when the mount's share has no room for that growth.
    fn set_window(&mut self, wanted: u64) {
        self.window = self.grant.resize(self.window, wanted);
    }

    /// Starts from the first bytes of the object, fetched by the lookup: the first read continues from them.
    pub fn with_first_bytes(mut self, first: Option<(Bytes, Reservation)>) -> Reader {
        if let Some((bytes, memory)) = first.filter(|(b, _)| !b.is_empty())
            && self.chunks.is_empty()
        {
            let end = (bytes.len() as u64).min(self.size);
            self.bytes_fetched += end;
            self.next_fetch = end;
            self.chunks.push_back(Chunk {
                start: 0,
                end,
                data: ChunkData::Ready(bytes.slice(..end as usize)),
                _memory: memory,
            });
        }
        self
    }

    /// At open, for a small file whose bytes the kernel does not hold: starts the GET that the first read
    /// at offset 0 would send (the whole file, one window at most), so it runs while the opener is still
    /// between open(2) and read(2) (Python's open() alone sends an ioctl round trip in that gap). Nothing is
    /// fetched for a file over one window, where a first read elsewhere (a footer, a random read) is
    /// common, or when the memory budget is spent. Returns whether a GET started.
    pub fn fetch_small_file_at_open(&mut self) -> bool {
        if self.size == 0 || self.size > self.initial_window || !self.chunks.is_empty() {
            return false;
        }
        let Some(memory) = self.memory.try_reserve(self.size) else {
            return false;
        };
        self.spawn_fetch(0, self.size, memory);
        true
    }

    /// A small file's whole content (one window at most), read now for the opener to push into the page
    /// cache; `None` for a bigger or empty file, or when the bytes could not be had (reads then fetch them
    /// as usual and report what went wrong).
    pub async fn whole_small_file(&mut self) -> Option<Bytes> {
        // One window is at most INITIAL_WINDOW (1 MiB), so the length fits a read's u32.
        if self.size == 0 || self.size > self.initial_window {
            return None;
        }
        let bytes = self.read(0, self.size as u32).await.ok()?;
        (bytes.len() as u64 == self.size).then_some(bytes)
    }

    /// For `expressfs warm`: makes the caches under this reader hold `start..start + len` of the file
    /// (clamped to its size) and returns where that ends, or `None` when nothing below keeps bytes (no cache,
    /// or O_DIRECT: nothing is fetched then). GETs of one part each, up to a window's worth for this file
    /// and as many bytes as `in_flight` (shared by every warm-up of the mount) lets through; no byte comes
    /// back up, and parts already cached are not read at all.
    pub async fn keep(
        &mut self,
        start: u64,
        len: u64,
        in_flight: &KeepBudget,
    ) -> FsResult<Option<u64>> {
        self.land_fetches().await;
        let stop = start.saturating_add(len).min(self.size);
        let at_once = (self.max_window / self.part_size).max(1) as usize;
        let mut parts = tokio::task::JoinSet::new();
        let (mut next, mut kept) = (start.min(stop), true);
        loop {
            while next < stop && parts.len() < at_once {
                let end = (next + self.part_size).min(stop);
                let (source, key, etag) = (
                    Arc::clone(&self.source),
                    self.key.clone(),
                    self.etag.clone(),
                );
                let (in_flight, memory) = (in_flight.clone(), Arc::clone(&self.memory));
                parts.spawn(async move {
                    let _bytes = in_flight.take(end - next).await;
                    let _memory = memory.reserve(end - next);
                    source.keep(&key, next..end, &etag).await
                });
                next = end;
            }
            match parts.join_next().await {
                None => break,
                Some(Ok(Ok(part_kept))) => kept &= part_kept,
                // Dropping the set cancels the other parts.
                Some(Ok(Err(e))) => return Err(FsError::client(&self.key, e)),
                Some(Err(e)) => return Err(FsError::task(&self.key, e)),
            }
        }
        Ok(kept.then_some(stop))
    }

    /// Size of the file as this reader sees it (the version it is pinned to).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Waits for the GETs this reader has started (a small file's, at open) so that the caches have seen
    /// them: a warm-up then finds those bytes on their way in and does not fetch them again. A failed one
    /// drops the chunks, as a failed read does; the warm-up fetches those bytes itself.
    async fn land_fetches(&mut self) {
        let mut failed = false;
        for chunk in self.chunks.iter_mut() {
            if let ChunkData::Pending(task) = &mut chunk.data {
                match task.await {
                    Ok(Ok(bytes)) => chunk.data = ChunkData::Ready(bytes),
                    _ => {
                        failed = true;
                        break;
                    }
                }
            }
        }
        if failed {
            self.chunks.clear();
            self.streaming = false;
            self.next_fetch = 0;
        }
    }

    /// Starts a GET of `start..end`; `memory` is what it holds against the budget.
    fn spawn_fetch(&mut self, start: u64, end: u64, memory: Reservation) {
        let source = Arc::clone(&self.source);
        let key = self.key.clone();
        let etag = self.etag.clone();
        let task = tokio::spawn(async move { source.read(&key, start..end, &etag).await });
        self.bytes_fetched += end - start;
        self.chunks.push_back(Chunk {
            start,
            end,
            data: ChunkData::Pending(task),
            _memory: memory,
        });
        self.next_fetch = end;
    }

    /// Fetches ahead up to `target`: chunks the current read needs (below `needed`) are always fetched,
    /// the rest only while the memory budget allows; a refusal shrinks the window.
    fn prefetch(&mut self, needed: u64, target: u64) {
        while self.next_fetch < target {
            // From a window of one part (a reader's floor) up, half a window per GET: two GETs in flight in
            // parts of half the size hold half the memory of whole parts for the same overlap. Below that, one
            // GET per window, so a file of a few MiB costs no more GETs than its ramp needs.
            let chunk_len = if self.window >= self.part_size {
                (self.window / 2).clamp(self.initial_window, self.part_size)
            } else {
                self.window
            };
            let chunk_end = (self.next_fetch + chunk_len).min(self.size);
            let bytes = chunk_end - self.next_fetch;
            let memory = if self.next_fetch < needed {
                self.memory.reserve(bytes)
            } else if let Some(m) = self.memory.try_reserve(bytes) {
                m
            } else {
                self.set_window(
                    self.next_fetch
                        .saturating_sub(needed)
                        .max(self.initial_window),
                );
                return;
            };
            self.spawn_fetch(self.next_fetch, chunk_end, memory);
        }
    }

    pub async fn read(&mut self, offset: u64, len: u32) -> FsResult<Bytes> {
        if offset >= self.size || len == 0 {
            return Ok(Bytes::new());
        }
        let end = (offset + len as u64).min(self.size);
        let front_start = self.chunks.front().map(|c| c.start);
        if let Some(s) = front_start
            && self.streaming
            && offset < s
            && s - offset <= 2 * self.part_size
        {
            // A request from just before a stream's chunks (the kernel's readahead requests arrive out of
            // order): served on the side with exactly its bytes, the stream left as it is. Without a
            // stream, a jump back is a random read like any other.
            self.bytes_fetched += end - offset;
            return self
                .source
                .read(&self.key, offset..end, &self.etag)
                .await
                .map_err(|e| FsError::client(&self.key, e));
        }
        let continues = offset == self.last_end && self.last_end > 0 || offset == 0;
        let near_stream = self.streaming
            && front_start.is_some_and(|s| s <= offset)
            && offset <= self.next_fetch + REORDER_SLACK;
        let covered = front_start.is_some_and(|s| s <= offset) && end <= self.next_fetch;
        // The rest of a split request (RANDOM_TAIL): served from the random fetch, no read-ahead started.
        let remainder_of_random = continues && covered && !self.streaming && offset > 0;
        let sequential = (continues || near_stream) && !remainder_of_random;
        if sequential {
            // Keep what lies within the reorder slack behind the reader, for reads that arrive late (a late
            // read further back is served on the side, above).
            while self
                .chunks
                .front()
                .is_some_and(|c| c.end + REORDER_SLACK <= offset)
            {
                self.chunks.pop_front();
            }
            if self.chunks.front().is_none_or(|c| c.start > offset) || self.next_fetch < offset {
                self.chunks.clear();
                self.next_fetch = offset;
            }
            self.streaming = true;
            let target = end.max(offset + self.window).min(self.size);
            self.prefetch(end, target);
        } else if !covered {
            self.chunks.clear();
            self.streaming = false;
            self.set_window(self.initial_window);
            self.next_fetch = offset;
            let fetch_end = (end + RANDOM_TAIL)
                .max(offset + MIN_RANDOM_FETCH)
                .min(self.size);
            let memory = self.memory.reserve(fetch_end - offset);
            self.spawn_fetch(offset, fetch_end, memory);
        }

        let mut out: Option<BytesMut> = None;
        let mut single: Option<Bytes> = None;
        let mut failed = None;
        let mut waited = false;
        for chunk in self.chunks.iter_mut() {
            if chunk.start >= end {
                break;
            }
            if chunk.end <= offset {
                continue;
            }
            if let ChunkData::Pending(task) = &mut chunk.data {
                waited |= !task.is_finished();
                // On failure the loop stops and every chunk is dropped below: a finished task must not be
                // awaited again, so the next read starts afresh.
                match task.await {
                    Ok(Ok(bytes)) => chunk.data = ChunkData::Ready(bytes),
                    Ok(Err(e)) => {
                        failed = Some(FsError::client(&self.key, e));
                        break;
                    }
                    Err(e) => {
                        failed = Some(FsError::Io(format!("{}: fetch task failed: {e}", self.key)));
                        break;
                    }
                }
            }
            let ChunkData::Ready(data) = &chunk.data else {
                unreachable!()
            };
            if data.len() as u64 != chunk.end - chunk.start {
                // The client never returns short bodies; if it did, wrong bytes would follow.
                return Err(FsError::Io(format!(
                    "{}: short read from the bucket",
                    self.key
                )));
            }
            let from = (offset.max(chunk.start) - chunk.start) as usize;
            let to = (end.min(chunk.end) - chunk.start) as usize;
            let piece = data.slice(from..to);
            match (&mut out, &single) {
                (None, None) => single = Some(piece),
                (None, Some(first)) => {
                    let mut buf = BytesMut::with_capacity((end - offset) as usize);
                    buf.extend_from_slice(first);
                    buf.extend_from_slice(&piece);
                    out = Some(buf);
                }
                (Some(buf), _) => buf.extend_from_slice(&piece),
            }
        }
        if let Some(e) = failed {
            self.chunks.clear();
            self.streaming = false;
            self.next_fetch = offset;
            return Err(e);
        }
        let data = match out {
            Some(buf) => buf.freeze(),
            None => single.unwrap_or_default(),
        };
        if data.len() as u64 != end - offset {
            return Err(FsError::Io(format!(
                "{}: read of {offset}..{end} assembled {} bytes",
                self.key,
                data.len()
            )));
        }
        // A reader at the end of its file needs no window: what it took from the mount's share goes back to
        // readers that still fetch, even if the handle stays open. Otherwise the window grows only when the
        // reader had to wait, and never past what is left of the file: once the bytes are there before they
        // are asked for, a larger window would only hold more memory, and bytes fetched long before they are
        // copied out have gone cold in the CPU caches (on a fast link that costs more than it saves).
        if end >= self.size {
            self.set_window(self.initial_window);
        } else if sequential && waited && self.size - end > self.window {
            self.set_window((self.window * 2).min(self.max_window));
        }
        self.last_end = end;
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::read_ahead::ReadAheadShare;
    use crate::s3::fake::{FakeClient, Op, transient};
    use crate::s3::{ObjectClient, WriteCondition};
    use crate::source::BucketSource;

    /// A fake bucket holding `data` as "k", and a reader of it.
    async fn reader(
        data: impl Into<Bytes>,
        part_size: u64,
        max_window: u64,
        memory: Arc<MemoryBudget>,
    ) -> (Arc<FakeClient>, Reader) {
        let data = data.into();
        let fake = Arc::new(FakeClient::new("b", true));
        let size = data.len() as u64;
        let put = fake
            .put_object("k", data, WriteCondition::None)
            .await
            .unwrap();
        let r = Reader::new(
            BucketSource::shared(fake.clone()),
            "k".into(),
            put.etag,
            size,
            part_size,
            max_window,
            memory,
        );
        (fake, r)
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// Reads `from..to` in sequential reads of 1 MiB, checking each against `data`.
    async fn read_through(r: &mut Reader, data: &[u8], from: usize, to: usize) {
        let mib = 1024 * 1024;
        for pos in (from..to).step_by(mib) {
            let got = r.read(pos as u64, mib as u32).await.unwrap();
            assert_eq!(&got[..], &data[pos..pos + mib]);
        }
    }

    #[tokio::test]
    async fn sequential_and_random_reads_return_the_right_bytes() {
        let data = pattern(3 * 1024 * 1024 + 17);
        let (_, mut r) = reader(
            data.clone(),
            256 * 1024,
            1024 * 1024,
            MemoryBudget::unlimited(),
        )
        .await;
        let mut pos = 0u64;
        while pos < data.len() as u64 {
            let got = r.read(pos, 128 * 1024).await.unwrap();
            assert_eq!(&got[..], &data[pos as usize..(pos as usize + got.len())]);
            assert!(!got.is_empty());
            pos += got.len() as u64;
        }
        for (off, len) in [
            (5u64, 10u32),
            (3_000_000, 200_000),
            (17, 1),
            (3 * 1024 * 1024, 100),
        ] {
            let got = r.read(off, len).await.unwrap();
            let end = (off as usize + len as usize).min(data.len());
            assert_eq!(&got[..], &data[off as usize..end]);
        }
        assert!(r.read(data.len() as u64 + 5, 10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_replaced_object_is_an_error_not_new_bytes() {
        let fake = Arc::new(FakeClient::new("b", true));
        let put = fake
            .put_object("k", Bytes::from(pattern(1000)), WriteCondition::None)
            .await
            .unwrap();
        fake.put_object("k", Bytes::from(vec![1u8; 1000]), WriteCondition::None)
            .await
            .unwrap();
        let mut r = Reader::new(
            BucketSource::shared(fake),
            "k".into(),
            put.etag,
            1000,
            256 * 1024,
            1024 * 1024,
            MemoryBudget::unlimited(),
        );
        assert!(matches!(
            r.read(0, 100).await,
            Err(FsError::ObjectChanged { .. })
        ));
    }

    #[tokio::test]
    async fn random_reads_fetch_little_more_than_they_read() {
        let size = 64 * 1024 * 1024;
        let data = pattern(size);
        let (_, mut r) = reader(
            data.clone(),
            8 * 1024 * 1024,
            64 * 1024 * 1024,
            MemoryBudget::unlimited(),
        )
        .await;
        let mut x = 0x2545F4914F6CDD1Du64;
        let mut read = 0u64;
        for _ in 0..300 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let off = (x % (size as u64 - 65536)) & !4095;
            let got = r.read(off, 65536).await.unwrap();
            assert_eq!(&got[..], &data[off as usize..off as usize + 65536]);
            read += got.len() as u64;
        }
        assert!(
            r.bytes_fetched <= 2 * read,
            "fetched {} for {read} read",
            r.bytes_fetched
        );
    }

    /// A 1 MiB read(2) into a buffer 16 bytes past a page boundary, as the kernel sends it: 1 MiB - 16 bytes,
    /// then 16. One GET serves both, and nothing is read ahead.
    #[tokio::test]
    async fn a_split_random_read_costs_one_get() {
        let mib = 1024 * 1024;
        let data = pattern(32 * mib);
        let (fake, mut r) = reader(
            data.clone(),
            8 * mib as u64,
            64 * mib as u64,
            MemoryBudget::unlimited(),
        )
        .await;
        for off in [9 * mib + 123, 3 * mib + 77, 20 * mib] {
            let before = fake.counts();
            let fetched = r.bytes_fetched;
            let head = r.read(off as u64, (mib - 16) as u32).await.unwrap();
            let tail = r.read((off + mib - 16) as u64, 16).await.unwrap();
            assert_eq!(&head[..], &data[off..off + mib - 16]);
            assert_eq!(&tail[..], &data[off + mib - 16..off + mib]);
            let sent = fake.counts().since(&before);
            assert_eq!(
                (sent.get(Op::Get), sent.total()),
                (1, 1),
                "one GET at {off}"
            );
            assert_eq!(r.bytes_fetched - fetched, (mib - 16) as u64 + RANDOM_TAIL);
        }
        // A reader that goes on past the random fetch is sequential again: read-ahead starts.
        let off = 20 * mib + mib;
        let next = r.read(off as u64, mib as u32).await.unwrap();
        assert_eq!(&next[..], &data[off..off + mib]);
        assert!(r.streaming);
    }

    #[tokio::test]
    async fn a_spent_budget_stops_read_ahead_but_not_reads() {
        let size = 48 * 1024 * 1024;
        let data = pattern(size);
        let budget = MemoryBudget::new(4 * 1024 * 1024);
        let (_, mut r) = reader(
            data.clone(),
            8 * 1024 * 1024,
            64 * 1024 * 1024,
            Arc::clone(&budget),
        )
        .await;
        let mut pos = 0;
        while pos < size as u64 {
            let got = r.read(pos, 1024 * 1024).await.unwrap();
            assert_eq!(&got[..], &data[pos as usize..pos as usize + got.len()]);
            pos += got.len() as u64;
            assert!(
                budget.used() <= 4 * 1024 * 1024 + 8 * 1024 * 1024,
                "held {} bytes with a 4 MiB target",
                budget.used()
            );
        }
        assert!(budget.refused() > 0, "the window should have been cut");
        drop(r);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn readers_of_one_mount_grow_past_one_part_only_within_its_share() {
        let mib = 1024 * 1024;
        let data = pattern(24 * mib);
        let share = ReadAheadShare::new(6 * mib as u64);
        let mut readers = Vec::new();
        for _ in 0..3 {
            let (_, r) = reader(
                data.clone(),
                2 * mib as u64,
                16 * mib as u64,
                MemoryBudget::unlimited(),
            )
            .await;
            readers.push(r.sharing_read_ahead(Arc::clone(&share)));
        }
        // On this current-thread runtime reads find their GETs not run yet and wait: without the share, twelve
        // reads double the window to its 16 MiB maximum.
        read_through(&mut readers[0], &data, 0, 12 * mib).await;
        assert_eq!(readers[0].window, 4 * mib as u64, "8 MiB would not fit");
        assert_eq!(share.granted(), 4 * mib as u64);
        read_through(&mut readers[1], &data, 0, 12 * mib).await;
        assert_eq!(readers[1].window, 2 * mib as u64, "its floor, one part");
        assert_eq!(share.granted(), 6 * mib as u64);
        read_through(&mut readers[2], &data, 0, 12 * mib).await;
        assert_eq!(
            readers[2].window,
            2 * mib as u64,
            "the share is spent: the floor all the same"
        );
        assert_eq!(share.granted(), 8 * mib as u64, "floors may pass the limit");
        // The first reader reads to the end of its file: its window goes back while the handle is open.
        read_through(&mut readers[0], &data, 12 * mib, 24 * mib).await;
        assert_eq!(share.granted(), 5 * mib as u64);
        read_through(&mut readers[2], &data, 12 * mib, 16 * mib).await;
        assert_eq!(readers[2].window, 2 * mib as u64, "5 + 2 MiB would pass 6");
        drop(readers.remove(1));
        assert_eq!(
            share.granted(),
            3 * mib as u64,
            "a reader that closes gives back"
        );
        // The third grows into what came back.
        read_through(&mut readers[1], &data, 16 * mib, 20 * mib).await;
        assert_eq!(readers[1].window, 4 * mib as u64);
        assert_eq!(share.granted(), 5 * mib as u64);
        drop(readers);
        assert_eq!(share.granted(), 0);
    }

    /// From a window of one part up, a reader's GETs are half its window: at the floor, two GETs of half a part
    /// each are in flight. Below that a window is one GET: a 3 MiB file costs two (1 MiB, then 2 MiB).
    #[tokio::test]
    async fn at_its_floor_a_reader_has_two_gets_of_half_a_part_in_flight() {
        let mib = 1024 * 1024;
        let small = pattern(3 * mib);
        let (fake, mut r) = reader(
            small.clone(),
            8 * mib as u64,
            64 * mib as u64,
            MemoryBudget::unlimited(),
        )
        .await;
        read_through(&mut r, &small, 0, 3 * mib).await;
        assert_eq!(fake.count(Op::Get), 2, "one GET per window below a part");

        let data = pattern(64 * mib);
        let (fake, r) = reader(
            data.clone(),
            8 * mib as u64,
            64 * mib as u64,
            MemoryBudget::unlimited(),
        )
        .await;
        let mut r = r.sharing_read_ahead(ReadAheadShare::new(8 * mib as u64));
        read_through(&mut r, &data, 0, 40 * mib).await;
        assert_eq!(r.window, 8 * mib as u64, "the floor fills the share");
        let held: Vec<(u64, u64)> = r.chunks.iter().map(|c| (c.start, c.end)).collect();
        assert!(
            held.iter()
                .all(|(start, end)| end - start == 4 * mib as u64),
            "{held:?}"
        );
        assert!(
            held[0].1 + REORDER_SLACK > 40 * mib as u64,
            "nothing kept further back than the reorder slack: {held:?}"
        );
        assert!(held.len() <= 4, "{held:?}");
        let gets = fake.count(Op::Get);
        assert!(gets >= 10, "ramp and 4 MiB GETs, not 8 MiB ones: {gets}");
    }

    #[tokio::test]
    async fn readahead_requests_out_of_order_get_the_right_bytes() {
        let data = pattern(6 * 1024 * 1024);
        let (_, mut r) = reader(
            data.clone(),
            8 * 1024 * 1024,
            64 * 1024 * 1024,
            MemoryBudget::unlimited(),
        )
        .await;
        let mib = 1024 * 1024;
        for off in [mib, 0, 3 * mib, 2 * mib, 5 * mib, 4 * mib] {
            let got = r.read(off as u64, mib as u32).await.unwrap();
            assert_eq!(&got[..], &data[off..off + mib], "at {off}");
        }
    }

    #[tokio::test]
    async fn a_small_file_fetched_at_open_costs_its_one_get_and_a_big_one_waits_for_a_read() {
        let budget = MemoryBudget::new(64 << 20);
        let small = pattern(100_000);
        let (fake, mut r) = reader(small.clone(), 8 << 20, 64 << 20, Arc::clone(&budget)).await;
        let before = fake.counts();
        assert!(r.fetch_small_file_at_open());
        assert_eq!(r.bytes_fetched, 100_000, "the GET starts before any read");
        // The kernel asks in pieces (or for a page more than the file): the one GET answers them all.
        assert_eq!(&r.read(0, 65_536).await.unwrap()[..], &small[..65_536]);
        assert_eq!(&r.read(65_536, 65_536).await.unwrap()[..], &small[65_536..]);
        let sent = fake.counts().since(&before);
        assert_eq!((sent.get(Op::Get), sent.total()), (1, 1));
        assert_eq!(r.bytes_fetched, 100_000);
        assert!(!r.fetch_small_file_at_open(), "only before any other fetch");
        drop(r);
        assert_eq!(budget.used(), 0);

        let big = pattern((1 << 20) + 1);
        let (fake, mut r) = reader(big, 8 << 20, 64 << 20, Arc::clone(&budget)).await;
        let before = fake.counts();
        assert!(
            !r.fetch_small_file_at_open(),
            "over one window: a first read may be anywhere"
        );
        assert_eq!(fake.counts().since(&before).total(), 0);
        drop(r);

        let (fake, mut r) = reader(small, 8 << 20, 64 << 20, MemoryBudget::new(50_000)).await;
        let before = fake.counts();
        assert!(!r.fetch_small_file_at_open(), "the budget cannot hold it");
        assert_eq!(fake.counts().since(&before).total(), 0);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn keep_fills_the_cache_once_and_says_when_there_is_none() {
        use crate::cache::{BlockCache, disk::DiskCache};
        use crate::source::Cached;
        let dir = tempfile::tempdir().unwrap();
        let disk = Arc::new(DiskCache::open_with(dir.path(), 1 << 30, false).unwrap());
        let budget = MemoryBudget::new(64 << 20);
        let fake = Arc::new(FakeClient::new("b", true));
        let cached: Arc<dyn ReadSource> = Arc::new(Cached::new(
            BlockCache::new(disk, 256 << 10),
            BucketSource::shared(fake.clone()),
        ));
        let reader_of = |key: &str, etag: &str, size: usize, source: &Arc<dyn ReadSource>| {
            Reader::new(
                Arc::clone(source),
                key.into(),
                etag.into(),
                size as u64,
                1 << 20,
                2 << 20,
                Arc::clone(&budget),
            )
        };
        let (big, small) = (pattern((3 << 20) + 5), pattern(70_000));
        let big_etag = fake
            .put_object("big", Bytes::from(big.clone()), WriteCondition::None)
            .await
            .unwrap()
            .etag;
        let small_etag = fake
            .put_object("small", Bytes::from(small.clone()), WriteCondition::None)
            .await
            .unwrap()
            .etag;

        // Four parts of at most 1 MiB, two at once, over two requests of 2 MiB: four GETs.
        let before = fake.counts();
        let mut r = reader_of("big", &big_etag, big.len(), &cached);
        assert_eq!(
            r.keep(0, 2 << 20, &KeepBudget::new(2 << 20)).await.unwrap(),
            Some(2 << 20)
        );
        assert_eq!(
            r.keep(2 << 20, 2 << 20, &KeepBudget::new(2 << 20))
                .await
                .unwrap(),
            Some(big.len() as u64)
        );
        assert_eq!(fake.counts().since(&before).get(Op::Get), 4);
        // A small file's GET started at open is the only one: the warm-up waits for it.
        let before = fake.counts();
        let mut r = reader_of("small", &small_etag, small.len(), &cached);
        assert!(r.fetch_small_file_at_open());
        assert_eq!(
            r.keep(0, u64::MAX, &KeepBudget::new(2 << 20))
                .await
                .unwrap(),
            Some(70_000)
        );
        assert_eq!(fake.counts().since(&before).total(), 1);
        // The handle still reads, and what it reads, like any later reader, costs no request.
        assert_eq!(&r.read(0, 100_000).await.unwrap()[..], &small[..]);
        let mut again = reader_of("big", &big_etag, big.len(), &cached);
        assert_eq!(
            &again.read(1 << 20, 4096).await.unwrap()[..],
            &big[1 << 20..(1 << 20) + 4096]
        );
        assert_eq!(fake.counts().since(&before).total(), 1);
        drop((r, again));
        assert_eq!(budget.used(), 0);

        // Straight from the bucket (no cache, or O_DIRECT): nothing to keep, nothing fetched.
        let bucket = BucketSource::shared(fake.clone());
        let before = fake.counts();
        let mut r = reader_of("big", &big_etag, big.len(), &bucket);
        assert_eq!(
            r.keep(0, u64::MAX, &KeepBudget::new(2 << 20))
                .await
                .unwrap(),
            None
        );
        assert_eq!(fake.counts(), before);
    }

    /// Waits until `n` GETs are held at the gate at once (fails after 10 s).
    async fn until_held(gate: &crate::s3::fake::Gate, n: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while gate.held() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "{} of {n} GETs under way at once",
                gate.held()
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// The parts of one warm-up claim different blocks: all of them are fetched at once, none waits for another.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_parts_of_a_keep_are_fetched_side_by_side() {
        use crate::cache::{BlockCache, disk::DiskCache};
        use crate::source::Cached;
        let dir = tempfile::tempdir().unwrap();
        let disk = Arc::new(DiskCache::open_with(dir.path(), 1 << 30, false).unwrap());
        let data = pattern(4 << 20);
        let (fake, _) = reader(data.clone(), 1 << 20, 4 << 20, MemoryBudget::unlimited()).await;
        let etag = fake.head_object("k").await.unwrap().etag;
        let cached: Arc<dyn ReadSource> = Arc::new(Cached::new(
            BlockCache::new(Arc::clone(&disk), 256 << 10),
            BucketSource::shared(fake.clone()),
        ));
        let mut r = Reader::new(
            Arc::clone(&cached),
            "k".into(),
            etag.clone(),
            data.len() as u64,
            1 << 20,
            4 << 20,
            MemoryBudget::unlimited(),
        );
        let gate = fake.faults().hold(Op::Get);
        let keep =
            tokio::spawn(async move { r.keep(0, u64::MAX, &KeepBudget::new(4 << 20)).await });
        until_held(&gate, 4).await;
        gate.open();
        assert_eq!(keep.await.unwrap().unwrap(), Some(4 << 20));
        assert_eq!(
            &cached.read("k", 0..4 << 20, &etag).await.unwrap()[..],
            &data[..]
        );
    }

    /// Two files' warm-ups under one budget of 2 MiB: two parts of 1 MiB under way at once between them.
    #[tokio::test(flavor = "multi_thread")]
    async fn warm_ups_share_one_budget_of_bytes_in_flight() {
        use crate::cache::{BlockCache, disk::DiskCache};
        use crate::source::Cached;
        let dir = tempfile::tempdir().unwrap();
        let disk = Arc::new(DiskCache::open_with(dir.path(), 1 << 30, false).unwrap());
        let data = pattern(4 << 20);
        let fake = Arc::new(FakeClient::new("b", true));
        let cached: Arc<dyn ReadSource> = Arc::new(Cached::new(
            BlockCache::new(disk, 256 << 10),
            BucketSource::shared(fake.clone()),
        ));
        let budget = KeepBudget::new(2 << 20);
        let gate = fake.faults().hold(Op::Get);
        let mut keeps = Vec::new();
        for key in ["k2", "k3"] {
            let etag = fake
                .put_object(
                    key,
                    Bytes::from(data.clone()),
                    crate::s3::WriteCondition::None,
                )
                .await
                .unwrap()
                .etag;
            let mut r = Reader::new(
                Arc::clone(&cached),
                key.into(),
                etag,
                data.len() as u64,
                1 << 20,
                4 << 20,
                MemoryBudget::unlimited(),
            );
            let budget = budget.clone();
            keeps.push(tokio::spawn(
                async move { r.keep(0, u64::MAX, &budget).await },
            ));
        }
        until_held(&gate, 2).await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(gate.held(), 2, "the budget holds two parts of 1 MiB");
        gate.open();
        for keep in keeps {
            assert_eq!(keep.await.unwrap().unwrap(), Some(4 << 20));
        }
    }

    #[tokio::test]
    async fn first_bytes_from_the_lookup_serve_small_files_and_start_big_ones() {
        let budget = MemoryBudget::new(64 << 20);
        let small = pattern(100_000);
        let (fake, _) = reader(small.clone(), 1 << 20, 4 << 20, Arc::clone(&budget)).await;
        let etag = fake.head_object("k").await.unwrap().etag;
        let first = Some((Bytes::from(small.clone()), budget.reserve(100_000)));
        let mut r = Reader::new(
            BucketSource::shared(fake.clone()),
            "k".into(),
            etag,
            100_000,
            1 << 20,
            4 << 20,
            Arc::clone(&budget),
        )
        .with_first_bytes(first);
        let before = fake.counts();
        assert_eq!(&r.read(0, 131_072).await.unwrap()[..], &small[..]);
        assert_eq!(fake.counts(), before, "no GET needed");
        drop(r);

        let big = pattern((3 << 20) + 17);
        let (fake, _) = reader(big.clone(), 1 << 20, 4 << 20, Arc::clone(&budget)).await;
        let etag = fake.head_object("k").await.unwrap().etag;
        let first = Some((
            Bytes::copy_from_slice(&big[..256 << 10]),
            budget.reserve(256 << 10),
        ));
        let mut r = Reader::new(
            BucketSource::shared(fake),
            "k".into(),
            etag,
            big.len() as u64,
            1 << 20,
            4 << 20,
            Arc::clone(&budget),
        )
        .with_first_bytes(first);
        let mut pos = 0;
        while pos < big.len() {
            let got = r.read(pos as u64, 200_000).await.unwrap();
            assert_eq!(&got[..], &big[pos..pos + got.len()], "at {pos}");
            pos += got.len();
        }
        drop(r);
        assert_eq!(budget.used(), 0, "the first bytes' reservation is released");
    }

    #[tokio::test]
    async fn a_failed_fetch_is_an_error_and_the_next_read_starts_afresh() {
        let (fake, mut r) = reader(
            pattern(3 << 20),
            1 << 20,
            4 << 20,
            MemoryBudget::unlimited(),
        )
        .await;
        fake.faults().fail_next(Op::Get, 1, transient());
        assert!(r.read(0, 4096).await.is_err());
        // Same handle again: no panic from re-polling a finished fetch, and the right bytes.
        let got = r.read(0, 4096).await.unwrap();
        assert_eq!(&got[..], &pattern(3 << 20)[..4096]);
    }
}
