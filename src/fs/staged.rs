//! Staged files: a local, sparse copy of a file that every open handle of its inode shares, for everything the
//! streaming writer cannot do (writes at any offset, reads of what was written, truncate, fallocate, several
//! descriptors and processes at once).
//!
//! A staged file starts from an object version (its *base*) or from a writer's local bytes. Bytes of the base
//! are fetched on demand, through the caches, into the sparse file; nothing is fetched up front. The upload is
//! the whole new object: a PutObject for a small file, otherwise a multipart upload whose parts that hold only
//! unchanged bytes of the base are copied server-side (UploadPartCopy), so patching a few KiB of a big file
//! moves a part or two. Every upload is conditional on the version we started from (If-Match on its ETag; an
//! upload of a file that never existed is If-None-Match, or unconditional with `--allow-overwrite`): when the
//! object was replaced meanwhile, the upload fails, the staged file is kept on local disk for the user, and
//! every handle sees EIO from then on.

mod local;
mod ranges;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::ops::Range;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::attrs::StoredAttrs;
use super::error::{FsError, FsResult};
use crate::s3::{
    ClientError, ObjectClient, ObjectInfo, PutResult, UploadedPart, UserMetadata, WriteCondition,
};
use crate::source::ReadSource;
pub use local::LocalCopy;
pub use ranges::RangeSet;

/// Bytes of the base fetched at once around a read that misses: a database's page reads then cost one
/// request per MiB, not one per page.
const FETCH_BLOCK: u64 = 1024 * 1024;

/// Largest server-side copy in one UploadPartCopy: big enough that an untouched GiB costs a couple of
/// requests, small enough that the copies of a huge file run side by side (the service allows 5 GiB).
const COPY_PART: u64 = 512 * 1024 * 1024;

/// Requests of one upload in flight at once when most are copies.
const COPIES_IN_FLIGHT: usize = 16;

/// What every staged file of a mount shares.
#[derive(Clone)]
pub struct StagingContext {
    pub client: Arc<dyn ObjectClient>,
    /// Where base bytes are read from (the caches, then the bucket).
    pub source: Arc<dyn ReadSource>,
    pub dir: PathBuf,
    /// Most bytes one staged file may hold locally or add to its base (`--max-staged-file-size`).
    pub limit: u64,
    pub part_size: u64,
    /// Parts of an upload in flight at once (each holds at most one part in memory).
    pub parts_in_flight: usize,
}

/// The object version whose bytes fill what was neither written nor cut away.
#[derive(Debug, Clone)]
struct Base {
    etag: String,
}

/// How a staged file begins when it takes over a streaming writer's bytes.
pub struct Adopted {
    /// The writer's local copy, holding bytes `0..size` if `complete`.
    pub local: LocalCopy,
    pub size: u64,
    pub complete: bool,
    /// The object the writer uploaded, if it did, and nothing was written since.
    pub uploaded: Option<String>,
    /// The condition the next upload needs.
    pub expect: WriteCondition,
    /// The file was unlinked while open: the staged file goes on locally and never uploads.
    pub discarded: bool,
}

pub struct StagedFile {
    ctx: StagingContext,
    key: String,
    local: LocalCopy,
    size: u64,
    base: Option<Base>,
    /// Bytes `0..base_len` of the base still stand where not written (a truncation below them cuts it).
    base_len: u64,
    /// Bytes held in the local file: fetched from the base, or written.
    present: RangeSet,
    /// Bytes written since the base: parts touching them cannot be copied from it.
    written: RangeSet,
    /// Differs from the bucket: the next fsync or close uploads.
    changed: bool,
    /// The condition of the next upload.
    expect: WriteCondition,
    /// Someone else replaced the object: this file can no longer be uploaded.
    conflict: Option<FsError>,
    /// Unlinked while open: reads and writes go on locally, nothing is uploaded any more.
    discarded: bool,
    /// With `--preserve-metadata`: what the object carries (or will at the next upload). The mtime is the
    /// base's until a write, then the last write's, or one set after it.
    attrs: Option<StoredAttrs>,
}

impl StagedFile {
    /// An existing object opened for writing without O_TRUNC: a sparse file of its size, nothing fetched.
    pub fn of_object(
        ctx: StagingContext,
        key: &str,
        info: &ObjectInfo,
        attrs: Option<StoredAttrs>,
    ) -> FsResult<StagedFile> {
        let local = LocalCopy::create(&ctx.dir, key)?;
        local
            .as_file()
            .set_len(info.size)
            .map_err(|e| FsError::local(&format!("{key}: staging file"), e))?;
        Ok(StagedFile {
            key: key.to_string(),
            local,
            size: info.size,
            base: Some(Base {
                etag: info.etag.clone(),
            }),
            base_len: info.size,
            present: RangeSet::new(),
            written: RangeSet::new(),
            changed: false,
            expect: WriteCondition::IfMatch(info.etag.clone()),
            conflict: None,
            discarded: false,
            attrs,
            ctx,
        })
    }

    /// Takes over a streaming writer's bytes (a second open, a seek back, a truncate, a read).
    pub fn adopt(
        ctx: StagingContext,
        key: &str,
        from: Adopted,
        attrs: Option<StoredAttrs>,
    ) -> StagedFile {
        let held = if from.complete {
            RangeSet::of(0..from.size)
        } else {
            RangeSet::new()
        };
        let (base, base_len, written, changed) = match from.uploaded {
            Some(etag) => (Some(Base { etag }), from.size, RangeSet::new(), false),
            None => (None, 0, held.clone(), !from.discarded),
        };
        StagedFile {
            key: key.to_string(),
            local: from.local,
            size: from.size,
            base,
            base_len,
            present: held,
            written,
            changed,
            expect: from.expect,
            conflict: None,
            discarded: from.discarded,
            attrs,
            ctx,
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Its name was unlinked: from now on nothing is uploaded.
    pub fn discard(&mut self) {
        self.discarded = true;
        self.changed = false;
    }

    /// Holds changes the bucket lacks.
    pub fn is_changed(&self) -> bool {
        self.changed
    }

    /// Unlinked (or replaced) while open: nothing is uploaded any more.
    pub fn is_discarded(&self) -> bool {
        self.discarded
    }

    /// The object version this file was last in sync with, when it holds no changes: a rename copies only
    /// that version, so the file can carry on from the copy ([`Self::moved`]).
    pub fn pinned_version(&self) -> Option<&str> {
        match (
            &self.expect,
            self.changed || self.discarded || self.conflict.is_some(),
        ) {
            (WriteCondition::IfMatch(etag), false) => Some(etag),
            _ => None,
        }
    }

    /// The file was renamed to `key` (an object copy of our version now has ETag `etag`, where the move
    /// changed it): later uploads go there, and base bytes come from there.
    pub fn moved(&mut self, key: &str, etag: Option<&str>) {
        self.key = key.to_string();
        if let Some(etag) = etag {
            if let Some(base) = &mut self.base {
                base.etag = etag.to_string();
            }
            self.expect = WriteCondition::IfMatch(etag.to_string());
        }
    }

    /// Bytes this file holds that its base does not give: what `--max-staged-file-size` bounds.
    fn held(&self) -> u64 {
        self.present.len_below(self.base_len) + (self.size - self.base_len)
    }

    /// Its changes can never reach the bucket (another client replaced the object): it keeps the error for
    /// its own handles, and new opens read what the bucket holds.
    pub fn has_failed(&self) -> bool {
        self.conflict.is_some()
    }

    fn check(&self) -> FsResult<()> {
        match &self.conflict {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn over_limit(&self, adding: u64) -> FsResult<()> {
        if self.held() + adding <= self.ctx.limit {
            return Ok(());
        }
        warn!(
            key = %self.key,
            limit = self.ctx.limit,
            "staged file would exceed --max-staged-file-size: write refused (EFBIG)"
        );
        Err(FsError::TooBig(self.key.clone()))
    }

    /// Gives back the disk held by base bytes fetched for reads (they can be fetched again), so reads never
    /// use up the room that writes need under `--max-staged-file-size`.
    fn drop_fetched(&mut self) {
        // Unlinked: the base may be gone from the bucket, and these bytes are what the descriptors still read.
        if self.discarded {
            return;
        }
        let fd = self.local.as_file().as_fd();
        let punch = nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
            | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
        for g in self.written.gaps(0..self.base_len) {
            // Where punching fails the bytes only stay on disk; they are fetched again either way.
            let _ = nix::fcntl::fallocate(fd, punch, g.start as i64, (g.end - g.start) as i64);
        }
        self.present = self.written.clone();
    }

    /// Bytes a write of `range` adds to what the file holds: base bytes not held yet, and growth. Bytes
    /// already held (fetched or written) cost nothing again.
    fn adds(&self, range: Range<u64>) -> u64 {
        let below: u64 = self
            .present
            .gaps(range.start.min(self.base_len)..range.end.min(self.base_len))
            .iter()
            .map(|g| g.end - g.start)
            .sum();
        below + range.end.saturating_sub(self.size.max(self.base_len))
    }

    fn local_error(&self, e: std::io::Error) -> FsError {
        FsError::local(&format!("{}: staging file", self.key), e)
    }

    /// Exactly the bytes at `offset..` (up to `len`, stopping at the end of the file).
    pub async fn read(&mut self, offset: u64, len: u64) -> FsResult<Bytes> {
        self.check()?;
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return Ok(Bytes::new());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        self.local
            .as_file()
            .read_exact_at(&mut out, offset)
            .map_err(|e| self.local_error(e))?;
        self.fill_from_base(offset, &mut out).await?;
        Ok(Bytes::from(out))
    }

    /// Fills the parts of `out` (the file's bytes at `offset`) that are not held locally from the base,
    /// fetching whole blocks and keeping them while the limit allows.
    async fn fill_from_base(&mut self, offset: u64, out: &mut [u8]) -> FsResult<()> {
        let end = (offset + out.len() as u64).min(self.base_len);
        if offset >= end {
            return Ok(());
        }
        let mut block: Option<(Range<u64>, Bytes)> = None;
        for gap in self.present.gaps(offset..end) {
            let mut at = gap.start;
            while at < gap.end {
                let fetched = match &block {
                    Some((r, b)) if r.contains(&at) => (r.clone(), b.clone()),
                    _ => {
                        // Whole blocks, as many as the gap spans, in one request: an upload's part
                        // missing a few KiB costs one or two GETs, a page read one block.
                        let start = at - at % FETCH_BLOCK;
                        let end = gap.end.div_ceil(FETCH_BLOCK) * FETCH_BLOCK;
                        let r = start..end.max(start + FETCH_BLOCK).min(self.base_len);
                        let b = self.fetch(r.clone()).await?;
                        self.keep_fetched(&r, &b)?;
                        block = Some((r.clone(), b.clone()));
                        (r, b)
                    }
                };
                let (r, b) = fetched;
                let upto = gap.end.min(r.end);
                out[(at - offset) as usize..(upto - offset) as usize]
                    .copy_from_slice(&b[(at - r.start) as usize..(upto - r.start) as usize]);
                at = upto;
            }
        }
        Ok(())
    }

    async fn fetch(&mut self, range: Range<u64>) -> FsResult<Bytes> {
        let etag = self
            .base
            .as_ref()
            .map(|b| b.etag.clone())
            .unwrap_or_default();
        let want = range.end - range.start;
        match self.ctx.source.read(&self.key, range, &etag).await {
            Ok(b) if b.len() as u64 == want => Ok(b),
            Ok(b) => Err(FsError::Io(format!(
                "{}: {} bytes of the base where {want} were asked",
                self.key,
                b.len()
            ))),
            Err(e @ ClientError::PreconditionFailed { .. }) => {
                Err(self.conflicted(FsError::client(&self.key, e)))
            }
            // The base was deleted by someone else: as much a conflict as a replacement.
            Err(ClientError::NotFound { .. }) => Err(self.conflicted(self.gone())),
            Err(e) => Err(FsError::client(&self.key, e)),
        }
    }

    /// What an upload or a fetch pinned to the base finds when another client deleted the object.
    fn gone(&self) -> FsError {
        FsError::ObjectChanged {
            key: self.key.clone(),
        }
    }

    /// Keeps fetched base bytes `b` of `range` where nothing was written, if the limit has room.
    fn keep_fetched(&mut self, range: &Range<u64>, b: &[u8]) -> FsResult<()> {
        let gaps = self.present.gaps(range.clone());
        let adding: u64 = gaps.iter().map(|g| g.end - g.start).sum();
        if self.held() + adding > self.ctx.limit {
            return Ok(());
        }
        for g in gaps {
            let slice = &b[(g.start - range.start) as usize..(g.end - range.start) as usize];
            // A full disk only means the bytes are fetched again next time.
            if self.local.as_file().write_all_at(slice, g.start).is_err() {
                return Ok(());
            }
            self.present.insert(g);
        }
        Ok(())
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> FsResult<u32> {
        self.check()?;
        // A write of nothing changes nothing, wherever it is (pwrite(2) of zero bytes does not extend).
        if data.is_empty() {
            return Ok(0);
        }
        let len = data.len() as u64;
        let end = offset
            .checked_add(len)
            .ok_or_else(|| FsError::TooBig(self.key.clone()))?;
        if self.held() + self.adds(offset..end) > self.ctx.limit {
            self.drop_fetched();
        }
        self.over_limit(self.adds(offset..end))?;
        // Blocks are reserved first: a full staging disk then refuses the write before any byte of it lands,
        // so no acknowledged byte is ever lost to ENOSPC.
        self.reserve(offset, len)?;
        self.local
            .as_file()
            .write_all_at(data, offset)
            .map_err(|e| self.local_error(e))?;
        self.size = self.size.max(end);
        self.present.insert(offset..end);
        self.written.insert(offset..end);
        self.changed = !self.discarded;
        self.date_write();
        Ok(data.len() as u32)
    }

    fn reserve(&self, offset: u64, len: u64) -> FsResult<()> {
        if len == 0 {
            return Ok(());
        }
        let fd = self.local.as_file().as_fd();
        let flags = nix::fcntl::FallocateFlags::empty();
        match nix::fcntl::fallocate(fd, flags, offset as i64, len as i64) {
            Ok(()) => Ok(()),
            Err(nix::errno::Errno::EOPNOTSUPP) => Ok(()),
            Err(e) => Err(self.local_error(std::io::Error::from(e))),
        }
    }

    /// Sets the size: bytes past it are gone (and read as zeros if the file grows again).
    pub fn truncate(&mut self, size: u64) -> FsResult<()> {
        self.check()?;
        if size == self.size {
            return Ok(());
        }
        if size > self.size {
            if self.held() + (size - self.size) > self.ctx.limit {
                self.drop_fetched();
            }
            self.over_limit(size - self.size)?;
        }
        self.local
            .as_file()
            .set_len(size)
            .map_err(|e| self.local_error(e))?;
        if size < self.size {
            self.base_len = self.base_len.min(size);
            self.present.clip(size);
            self.written.clip(size);
        }
        self.size = size;
        self.changed = !self.discarded;
        self.date_write();
        Ok(())
    }

    /// fallocate(2): allocation (growing the file unless `keep_size`), and zeroing a range (punch hole,
    /// zero range). The flags are Linux's `FALLOC_FL_*`.
    pub fn fallocate(&mut self, offset: u64, len: u64, mode: i32) -> FsResult<()> {
        self.check()?;
        let end = offset
            .checked_add(len)
            .ok_or_else(|| FsError::TooBig(self.key.clone()))?;
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let zero = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0;
        let known =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 || (mode & libc::FALLOC_FL_PUNCH_HOLE != 0 && !keep_size) {
            return Err(FsError::OperationNotSupported(
                "fallocate mode other than allocate, punch hole or zero range",
            ));
        }
        if zero {
            let zeros = vec![0u8; FETCH_BLOCK as usize];
            let stop = if keep_size { end.min(self.size) } else { end };
            let mut at = offset;
            while at < stop {
                let n = (stop - at).min(FETCH_BLOCK);
                self.write(at, &zeros[..n as usize])?;
                at += n;
            }
            return Ok(());
        }
        if !keep_size && end > self.size {
            self.truncate(end)?;
        }
        Ok(())
    }

    /// chmod/chown/utimens while open: carried by the next upload.
    pub fn set_attrs(&mut self, change: StoredAttrs) {
        if let Some(attrs) = &mut self.attrs {
            *attrs = attrs.overlay(change);
            self.changed = !self.discarded;
        }
    }

    /// With `--preserve-metadata`, what the object carries (or will at the next upload).
    pub fn attrs(&self) -> Option<StoredAttrs> {
        self.attrs
    }

    /// With `--preserve-metadata`, the mtime the object is to carry, once known: stat shows it meanwhile.
    pub fn mtime(&self) -> Option<SystemTime> {
        self.attrs.and_then(|a| a.mtime)
    }

    /// The bytes changed now: so does the mtime the next upload carries (see [`StoredAttrs::written_at`]).
    fn date_write(&mut self) {
        if let Some(attrs) = &mut self.attrs {
            *attrs = attrs.written_at(SystemTime::now());
        }
    }

    fn upload_metadata(&mut self) -> UserMetadata {
        StoredAttrs::for_upload(self.attrs.as_mut())
    }

    /// Uploads the file if it changed: `Ok(None)` when there was nothing to do.
    pub async fn upload(&mut self) -> FsResult<Option<PutResult>> {
        self.check()?;
        if !self.changed || self.discarded {
            return Ok(None);
        }
        let result = if self.size <= self.ctx.part_size {
            self.put_whole().await
        } else {
            self.put_in_parts().await
        };
        match result {
            Ok(r) => {
                debug!(key = %self.key, size = self.size, "staged file uploaded");
                self.base = Some(Base {
                    etag: r.etag.clone(),
                });
                self.base_len = self.size;
                self.written.clear();
                self.changed = false;
                self.expect = WriteCondition::IfMatch(r.etag.clone());
                Ok(Some(PutResult {
                    etag: r.etag,
                    size: Some(self.size),
                }))
            }
            Err(e @ FsError::ObjectChanged { .. }) => Err(self.conflicted(e)),
            // An upload pinned to a version (If-Match, or a part copied from it) that another client deleted.
            Err(FsError::NotFound) if matches!(self.expect, WriteCondition::IfMatch(_)) => {
                Err(self.conflicted(self.gone()))
            }
            Err(e) => Err(e),
        }
    }

    async fn put_whole(&mut self) -> FsResult<PutResult> {
        let body = self.read(0, self.size).await?;
        let metadata = self.upload_metadata();
        self.ctx
            .client
            .put_object_with_metadata(&self.key, body, self.expect.clone(), &metadata)
            .await
            .map_err(|e| FsError::client(&self.key, e))
    }

    async fn put_in_parts(&mut self) -> FsResult<PutResult> {
        let client = Arc::clone(&self.ctx.client);
        let metadata = self.upload_metadata();
        let id = client
            .create_multipart_upload_with_metadata(&self.key, &metadata)
            .await
            .map_err(|e| FsError::client(&self.key, e))?;
        match self.send_parts(&id).await {
            Ok(parts) => {
                let done = client
                    .complete_multipart_upload(&self.key, &id, parts, self.expect.clone())
                    .await
                    .map_err(|e| FsError::client(&self.key, e));
                if done.is_err() {
                    self.abort(&id).await;
                }
                done
            }
            Err(e) => {
                self.abort(&id).await;
                Err(e)
            }
        }
    }

    async fn abort(&self, id: &str) {
        if let Err(e) = self.ctx.client.abort_multipart_upload(&self.key, id).await {
            warn!(key = %self.key, error = %e, "could not abort multipart upload");
        }
    }

    /// The parts of the upload, in order: `(range, copy)`. The file is cut on the part-size grid; a piece
    /// that holds only unchanged bytes of the base is copied, and neighbouring copied pieces merge into one
    /// copy of up to [`COPY_PART`], so patching one part of a big file costs a handful of requests.
    fn plan_parts(&self) -> Vec<(Range<u64>, bool)> {
        let part_size = self.ctx.part_size;
        let mut plan: Vec<(Range<u64>, bool)> = Vec::new();
        for i in 0..self.size.div_ceil(part_size) {
            let range = i * part_size..((i + 1) * part_size).min(self.size);
            let copy = self.copy_source(&range).is_some();
            match plan.last_mut() {
                Some((last, true))
                    if copy && last.end == range.start && range.end - last.start <= COPY_PART =>
                {
                    last.end = range.end;
                }
                _ => plan.push((range, copy)),
            }
        }
        plan
    }

    /// Every part, in order: copied from the base when it holds only its unchanged bytes, sent otherwise.
    /// Sent parts hold memory, so at most `parts_in_flight` of them are in flight; copies hold none, and up to
    /// [`COPIES_IN_FLIGHT`] requests go at once.
    async fn send_parts(&mut self, id: &str) -> FsResult<Vec<UploadedPart>> {
        type Task = (JoinHandle<Result<UploadedPart, ClientError>>, bool);
        let mut in_flight: VecDeque<Task> = VecDeque::new();
        let mut done = Vec::new();
        let etag = self
            .base
            .as_ref()
            .map(|b| b.etag.clone())
            .unwrap_or_default();
        let sends_max = self.ctx.parts_in_flight.max(1);
        let result: FsResult<()> = async {
            for (i, (range, copy)) in self.plan_parts().into_iter().enumerate() {
                let number = i as i32 + 1;
                let (client, key, id) = (
                    Arc::clone(&self.ctx.client),
                    self.key.clone(),
                    id.to_string(),
                );
                let task = if copy {
                    let etag = etag.clone();
                    tokio::spawn(async move {
                        client
                            .upload_part_copy(&key, &id, number, &key, range, &etag)
                            .await
                    })
                } else {
                    let body = self.read(range.start, range.end - range.start).await?;
                    tokio::spawn(async move { client.upload_part(&key, &id, number, body).await })
                };
                in_flight.push_back((task, !copy));
                loop {
                    let sends = in_flight.iter().filter(|(_, send)| *send).count();
                    if in_flight.len() < COPIES_IN_FLIGHT.max(sends_max) && sends < sends_max {
                        break;
                    }
                    let (task, _) = in_flight.pop_front().expect("non-empty");
                    done.push(self.finish(task).await?);
                }
            }
            while let Some((task, _)) = in_flight.pop_front() {
                done.push(self.finish(task).await?);
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            for (task, _) in in_flight {
                task.abort();
            }
            return Err(e);
        }
        Ok(done)
    }

    async fn finish(
        &self,
        task: JoinHandle<Result<UploadedPart, ClientError>>,
    ) -> FsResult<UploadedPart> {
        task.await
            .map_err(|e| FsError::task(&format!("{}: part upload", self.key), e))?
            .map_err(|e| FsError::client(&self.key, e))
    }

    /// The base's ETag if part `range` may be copied from it: all of it lies in the base's standing bytes
    /// and none was written.
    fn copy_source(&self, range: &Range<u64>) -> Option<String> {
        let base = self.base.as_ref()?;
        (range.end <= self.base_len && !self.written.intersects(range)).then(|| base.etag.clone())
    }

    /// The object was replaced by someone else: this file can never be uploaded. It is kept on local disk
    /// (where the log line says) and every handle fails from now on.
    fn conflicted(&mut self, e: FsError) -> FsError {
        // A fetch of the base found the conflict first and the upload reports it again: keep one copy.
        if let Some(first) = &self.conflict {
            return first.clone();
        }
        let kept = self.keep_copy();
        warn!(
            key = %self.key,
            kept = %kept.as_deref().map(|p| p.display().to_string()).unwrap_or_else(|| "nowhere".into()),
            "the object was replaced by someone else while open here: not uploaded (EIO), staged copy kept"
        );
        self.conflict = Some(e.clone());
        e
    }

    /// Links the local file under `<staging dir>/expressfs-kept/`, so it survives the handles' close. Ranges
    /// of the base never read or written are holes (zeros) in it.
    pub fn keep_copy(&self) -> Option<PathBuf> {
        let dir = self.ctx.dir.join("expressfs-kept");
        std::fs::create_dir_all(&dir).ok()?;
        let stamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let path = dir.join(kept_name(&self.key, stamp));
        self.local.keep_as(&path).ok()?;
        Some(path)
    }
}

/// The name a kept copy of `key` gets: the key with `/` escaped, then the time. A key whose escaped form would
/// pass the 255 bytes a file name may have keeps its last 160 bytes (the file's own name is at the end) and a
/// hash of the whole key, which the log line names in full.
fn kept_name(key: &str, stamp: u128) -> String {
    use std::hash::{Hash, Hasher};
    const MOST: usize = 200;
    const TAIL: usize = 160;
    let escaped = key.replace('%', "%25").replace('/', "%2F");
    if escaped.len() <= MOST {
        return format!("{escaped}.{stamp}");
    }
    let mut start = escaped.len() - TAIL;
    while !escaped.is_char_boundary(start) {
        start += 1;
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    format!("{:016x}.{}.{stamp}", hasher.finish(), &escaped[start..])
}
