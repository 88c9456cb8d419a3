//! Write handles. Three modes:
//! - Stream: sequential writes from offset 0 become a multipart upload (parts of `part_size`, a few in
//!   flight); a file smaller than one part becomes one PutObject. The object appears at fsync/close.
//!   Anything else (a write that is not at the end, a read, a truncate, a second open, any write after an
//!   unlink) hands the bytes over to a [`StagedFile`](super::staged::StagedFile) with
//!   [`Writer::take_for_staging`]: from memory, or from the local copy kept of a streamed file within the
//!   staging limit.
//! - Append (directory buckets, `--incremental-upload`): writes at the end of an existing object are sent
//!   as PutObject with a write offset whenever a part fills up or at fsync; the file stays writable.
//!
//! Any upload failure is kept and returned by every later write, fsync and close (as the errno for EIO),
//! and the multipart upload is aborted, so nothing is left behind in the bucket.

use std::collections::VecDeque;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::attrs::StoredAttrs;
use super::error::{FsError, FsResult};
use super::staged::{Adopted, LocalCopy};
use crate::memory::MemoryBudget;
use crate::s3::{ObjectClient, PutResult, UploadedPart, WriteCondition};

mod metadata;

/// Waits for the oldest parts until at most `keep` are in flight.
async fn wait_for_parts(mp: &mut Multipart, key: &str, keep: usize) -> FsResult<()> {
    while mp.in_flight.len() > keep {
        let task = mp.in_flight.pop_front().expect("non-empty");
        let part = task
            .await
            .map_err(|e| FsError::task(&format!("{key}: part upload"), e))?
            .map_err(|e| FsError::client(key, e))?;
        mp.done.push(part);
    }
    Ok(())
}

enum Mode {
    Stream,
    Append { offset: u64 },
}

struct Multipart {
    id: String,
    /// The mtime its CreateMultipartUpload carried: what the object keeps, unless a metadata copy follows.
    mtime: Option<SystemTime>,
    next_part: i32,
    done: Vec<UploadedPart>,
    in_flight: VecDeque<JoinHandle<Result<UploadedPart, crate::s3::ClientError>>>,
}

pub struct Writer {
    client: Arc<dyn ObjectClient>,
    pub key: String,
    part_size: usize,
    condition: WriteCondition,
    mode: Mode,
    buffer: BytesMut,
    /// Bytes accepted so far (the file's size as the writer sees it).
    size: u64,
    multipart: Option<Multipart>,
    staging_dir: Option<PathBuf>,
    staging_limit: u64,
    memory: Arc<MemoryBudget>,
    /// Parts uploading at once: enough to keep the link busy, few enough to bound memory.
    parts_in_flight: usize,
    failed: Option<FsError>,
    /// Local copy of a streamed file (within the staging limit), kept so that a later out-of-order write
    /// can still switch to staging after parts were uploaded. Started when the first part leaves.
    tee: Option<LocalCopy>,
    /// The file outgrew the staging limit (or the copy failed): no local copy any more.
    tee_off: bool,
    /// The object was uploaded and the handle takes no more writes (stream and staged modes).
    sealed: bool,
    /// Data not yet visible in the bucket.
    dirty: bool,
    /// With `--preserve-metadata`: the attributes the object is uploaded with. The mtime is the last write's,
    /// or one set after it; none yet, the upload's time.
    attrs: Option<Box<StoredAttrs>>,
    /// Attributes changed after the request carrying the metadata left (or the object is appended to, which
    /// keeps its old metadata): a metadata copy follows the upload.
    attrs_late: bool,
    /// Our last upload of this handle.
    uploaded: Option<Box<PutResult>>,
    /// Unlinked while open: nothing is uploaded any more. The bytes stay (in memory or the local copy) until
    /// the next write or read hands them to a staged file, where the descriptor goes on locally.
    discarded: bool,
    /// Unlinked after bytes had left for the bucket with no local copy of them (or with staging disabled):
    /// what was written can no longer be read back (EIO), and later writes are taken and dropped.
    lost: bool,
}

pub struct WriterOptions {
    pub part_size: usize,
    pub condition: WriteCondition,
    pub staging_dir: Option<PathBuf>,
    pub staging_limit: u64,
    pub memory: Arc<MemoryBudget>,
    /// `FsConfig::upload_parts_in_flight`.
    pub parts_in_flight: usize,
    /// Some with `--preserve-metadata`.
    pub attrs: Option<StoredAttrs>,
}

impl Writer {
    /// A new object (or a truncating overwrite): stream from offset 0.
    pub fn new(client: Arc<dyn ObjectClient>, key: String, options: WriterOptions) -> Writer {
        Writer {
            client,
            key,
            part_size: options.part_size.max(5 * 1024 * 1024),
            condition: options.condition,
            mode: Mode::Stream,
            buffer: BytesMut::new(),
            size: 0,
            multipart: None,
            staging_dir: options.staging_dir,
            staging_limit: options.staging_limit,
            memory: options.memory,
            parts_in_flight: options.parts_in_flight.max(1),
            failed: None,
            tee: None,
            tee_off: false,
            sealed: false,
            dirty: true,
            attrs: options.attrs.map(Box::new),
            attrs_late: false,
            uploaded: None,
            discarded: false,
            lost: false,
        }
    }

    /// Appends to the existing object `base` (directory buckets). An append leaves the object's metadata as
    /// it was: attributes changed while open follow by a metadata copy of the last version, `base` until
    /// something is appended.
    pub fn append(
        client: Arc<dyn ObjectClient>,
        key: String,
        base: PutResult,
        options: WriterOptions,
    ) -> Writer {
        let size = base.size.unwrap_or_default();
        let mut w = Writer::new(client, key, options);
        w.mode = Mode::Append { offset: size };
        w.size = size;
        w.dirty = false;
        w.uploaded = Some(Box::new(base));
        w
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// A write this writer could not take (its file could not be staged): the file fails as a whole, so it
    /// is never uploaded without those bytes.
    pub fn refuse(&mut self, e: FsError) -> FsError {
        self.fail(e)
    }

    fn fail(&mut self, e: FsError) -> FsError {
        warn!(key = %self.key, error = %e.chain(), "upload failed");
        self.failed = Some(e.clone());
        e
    }

    /// The common case of a sequential write, done at once: the bytes only join the part being filled.
    /// `None`, with nothing changed, when the write needs more (a part to send, staging, an error to report),
    /// which [`Writer::write`] then does.
    pub fn write_in_memory(&mut self, offset: u64, data: &[u8]) -> Option<u32> {
        if self.discarded {
            // Bytes still held go to a staged file first (`needs_staging`).
            return self.lost.then(|| self.drop_write(offset, data));
        }
        let plain = matches!(self.mode, Mode::Stream | Mode::Append { .. })
            && self.failed.is_none()
            && !self.sealed
            && offset == self.size
            && self.buffer.len() + data.len() < self.part_size;
        if !plain {
            return None;
        }
        self.reserve_part(data.len());
        self.buffer.extend_from_slice(data);
        self.size += data.len() as u64;
        self.dirty = true;
        self.date_write();
        self.keep_local_copy(offset, data);
        Some(data.len() as u32)
    }

    pub async fn write(&mut self, offset: u64, data: &[u8]) -> FsResult<u32> {
        if self.discarded {
            if self.lost {
                return Ok(self.drop_write(offset, data));
            }
            // The caller stages an unlinked file before writing (`needs_staging`): taken here, the bytes
            // would be in memory only, and never read back.
            return Err(FsError::Io(format!(
                "{}: a write to an unlinked file that was not staged",
                self.key
            )));
        }
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.sealed {
            return Err(FsError::InvalidArgument(format!(
                "{}: already uploaded at fsync; reopen to write again",
                self.key
            )));
        }
        if offset != self.size {
            // The caller hands such a file over to staging first (`needs_staging`); appends cannot be.
            let e = FsError::InvalidArgument(format!(
                "{}: write at {offset} but the file ends at {}: appends must be sequential",
                self.key, self.size
            ));
            return Err(self.fail(e));
        }
        self.reserve_part(data.len());
        self.buffer.extend_from_slice(data);
        self.size += data.len() as u64;
        self.dirty = true;
        self.date_write();
        self.keep_local_copy(offset, data);
        while self.buffer.len() >= self.part_size {
            let part = self.buffer.split_to(self.part_size).freeze();
            if let Err(e) = self.send_part(part).await {
                return Err(self.fail(e));
            }
        }
        Ok(data.len() as u32)
    }

    /// Once a file has sent a part, each next part gets one allocation of the whole part size: grown by
    /// doubling, every part would be copied several times and leave freed blocks of every size in the malloc
    /// heap. The first part grows as it fills, so a small file never holds a part.
    fn reserve_part(&mut self, incoming: usize) {
        let needed = self.buffer.len() + incoming;
        if self.multipart.is_none() || needed <= self.buffer.capacity() {
            return;
        }
        let mut next = crate::buffers::take(self.part_size.max(needed));
        next.extend_from_slice(&self.buffer);
        self.buffer = next;
    }

    /// Maintains the local copy of a streamed file: started (from the buffer, which still holds every byte)
    /// just before the first part is uploaded, extended by each later write, dropped past the staging limit.
    fn keep_local_copy(&mut self, offset: u64, data: &[u8]) {
        if self.tee_off || !matches!(self.mode, Mode::Stream) {
            return;
        }
        let Some(dir) = &self.staging_dir else { return };
        if self.size > self.staging_limit {
            self.tee = None;
            self.tee_off = true;
            return;
        }
        let result = match &self.tee {
            Some(file) => file.as_file().write_all_at(data, offset),
            None if self.multipart.is_none() && self.buffer.len() >= self.part_size => {
                LocalCopy::create(dir, &self.key)
                    .map_err(std::io::Error::other)
                    .and_then(|f| f.as_file().write_all_at(&self.buffer, 0).map(|_| f))
                    .map(|f| {
                        self.tee = Some(f);
                    })
            }
            None => Ok(()),
        };
        if let Err(e) = result {
            debug!(key = %self.key, error = %e, "no local copy for out-of-order writes");
            self.tee = None;
            self.tee_off = true;
        }
    }

    /// The file's name was unlinked while open: the upload in progress is abandoned and nothing more is sent.
    /// Its bytes are kept for the descriptor to read back (a staged file takes them at its next write or
    /// read) where they still can be: all in memory (nothing has left yet), all in the local copy, or, after
    /// an fsync of a streamed file, in that local copy or the object (whose bytes go with it, ENOENT). Parts
    /// that left with no local copy are gone with the upload: the writer is then `lost`.
    pub async fn discard(&mut self) {
        let kept = self.staging_dir.is_some()
            && matches!(self.mode, Mode::Stream)
            && (self.tee.is_some() || self.sealed || self.multipart.is_none());
        self.abort().await;
        self.discarded = true;
        self.lost = !kept;
        self.dirty = false;
        self.attrs_late = false;
        if self.lost || self.tee.is_some() {
            self.buffer = BytesMut::new();
        }
        if self.lost {
            self.tee = None;
        }
    }

    /// A write to a writer whose bytes are lost: nothing is kept, only the size moves (for fstat).
    fn drop_write(&mut self, offset: u64, data: &[u8]) -> u32 {
        if !data.is_empty() {
            self.size = self.size.max(offset.saturating_add(data.len() as u64));
        }
        data.len() as u32
    }

    /// Whether a write at `offset` (or a read, truncate or second open, `offset` None) needs the file
    /// staged: the stream can only take bytes at its end before it was uploaded, and an unlinked file goes on
    /// in a staged file that never uploads (so its bytes live on local disk, not in memory).
    pub fn needs_staging(&self, offset: Option<u64>) -> bool {
        if self.discarded {
            return !self.lost;
        }
        matches!(self.mode, Mode::Stream) && (self.sealed || offset != Some(self.size))
    }

    /// Hands the file's bytes over for staging: from memory, from the local copy of a streamed file (whose
    /// parts are then aborted), or, once uploaded, the object itself as the base. Fails when the bytes are
    /// nowhere (parts uploaded past the staging limit, staging disabled) or the file is appended to.
    pub async fn take_for_staging(&mut self) -> FsResult<Adopted> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.lost {
            return Err(FsError::Io(format!(
                "{}: unlinked while open, and its bytes were not kept (parts had left for the bucket \
                 with no local copy, or staging is off): they can no longer be read",
                self.key
            )));
        }
        let refuse = |why: &str| {
            FsError::InvalidArgument(format!(
                "{}: cannot stage the file being written: {why}",
                self.key
            ))
        };
        if matches!(self.mode, Mode::Append { .. }) {
            return Err(refuse("appends must be sequential"));
        }
        let Some(dir) = self.staging_dir.clone() else {
            return Err(refuse("staging is disabled"));
        };
        let staging = |e| FsError::local(&format!("{}: staging file", self.key), e);
        if self.sealed {
            let etag = self
                .uploaded
                .as_ref()
                .map(|r| r.etag.clone())
                .unwrap_or_default();
            let (local, complete) = match self.tee.take() {
                Some(tee) => (tee, true),
                None => {
                    let f = LocalCopy::create(&dir, &self.key)?;
                    f.as_file().set_len(self.size).map_err(staging)?;
                    (f, false)
                }
            };
            return Ok(Adopted {
                local,
                size: self.size,
                complete,
                uploaded: Some(etag.clone()),
                expect: WriteCondition::IfMatch(etag),
                discarded: self.discarded,
            });
        }
        let local = match (self.tee.take(), &self.multipart) {
            (Some(tee), _) => {
                // Everything written so far is in the local copy: the streamed parts are not needed.
                self.abort().await;
                tee
            }
            (None, None) => {
                let f = LocalCopy::create(&dir, &self.key)?;
                f.as_file().write_all_at(&self.buffer, 0).map_err(staging)?;
                f
            }
            (None, Some(_)) => {
                return Err(refuse(
                    "parts were already uploaded and the file is over the staging limit",
                ));
            }
        };
        self.buffer = BytesMut::new();
        let uploaded = match (&self.uploaded, self.dirty) {
            (Some(r), false) => Some(r.etag.clone()),
            _ => None,
        };
        Ok(Adopted {
            local,
            size: self.size,
            complete: true,
            uploaded,
            expect: self.condition.clone(),
            discarded: self.discarded,
        })
    }

    /// With `--preserve-metadata`, what the upload would carry.
    pub fn attrs(&self) -> Option<StoredAttrs> {
        self.attrs.as_deref().copied()
    }

    /// What an append may add to: the version the open found or the last append (or metadata copy) made,
    /// so that an object another client replaced meanwhile is not appended to.
    fn append_condition(&self) -> WriteCondition {
        match self.uploaded.as_deref() {
            Some(r) if !r.etag.is_empty() => WriteCondition::IfMatch(r.etag.clone()),
            _ => WriteCondition::None,
        }
    }

    async fn send_part(&mut self, part: Bytes) -> FsResult<()> {
        if let Mode::Append { offset } = self.mode {
            let len = part.len() as u64;
            let condition = self.append_condition();
            let r = self
                .client
                .append_object(&self.key, offset, part, condition)
                .await
                .map_err(|e| FsError::client(&self.key, e))?;
            self.mode = Mode::Append {
                offset: offset + len,
            };
            self.uploaded = Some(Box::new(PutResult {
                etag: r.etag,
                size: Some(offset + len),
            }));
            return Ok(());
        }
        if self.multipart.is_none() {
            let metadata = self.upload_metadata();
            let id = self
                .client
                .create_multipart_upload_with_metadata(&self.key, &metadata)
                .await
                .map_err(|e| FsError::client(&self.key, e))?;
            self.multipart = Some(Multipart {
                id,
                mtime: self.mtime(),
                next_part: 1,
                done: Vec::new(),
                in_flight: VecDeque::new(),
            });
        }
        let mp = self.multipart.as_mut().expect("just set");
        // A part in flight holds its bytes against the memory budget; when the budget is spent, the parts
        // already in flight finish first, so the upload goes on one part at a time instead of growing.
        let memory = match self.memory.try_reserve(part.len() as u64) {
            Some(m) => m,
            None => {
                wait_for_parts(mp, &self.key, 0).await?;
                self.memory.reserve(part.len() as u64)
            }
        };
        let number = mp.next_part;
        mp.next_part += 1;
        let (client, key, id) = (Arc::clone(&self.client), self.key.clone(), mp.id.clone());
        mp.in_flight.push_back(tokio::spawn(async move {
            let _memory = memory;
            let buffer = part.clone();
            let done = client.upload_part(&key, &id, number, part).await;
            crate::buffers::give_back(buffer);
            done
        }));
        wait_for_parts(mp, &self.key, self.parts_in_flight).await
    }

    /// Makes everything written so far durable in the bucket (fsync and close).
    pub async fn commit(&mut self) -> FsResult<Option<PutResult>> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        // Unlinked: not even a truncation since (which dirties the file) is uploaded.
        if self.discarded {
            return Ok(None);
        }
        if !self.dirty {
            return match (self.attrs_late, self.uploaded.as_deref().cloned()) {
                (true, Some(r)) => self.send_late_attrs(r).await.map(Some),
                _ => Ok(None),
            };
        }
        let r = match self.commit_inner().await {
            Ok(r) => r,
            Err(e) => {
                self.abort().await;
                return Err(self.fail(e));
            }
        };
        self.uploaded = Some(Box::new(r.clone()));
        self.dirty = false;
        // Data that was streamed away cannot be uploaded again: such a handle takes no more writes.
        // Small and staged files stay writable; their next upload may replace only our own version.
        let streamed = matches!(self.mode, Mode::Stream) && self.size > self.buffer.len() as u64;
        if streamed {
            // The local copy stays: a later write, read or open can still stage the file from it.
            self.sealed = true;
            self.condition = WriteCondition::IfMatch(r.etag.clone());
        } else if !matches!(self.mode, Mode::Append { .. }) {
            self.condition = WriteCondition::IfMatch(r.etag.clone());
        }
        // An append keeps the object's old metadata, so each one that sent bytes needs the copy again. The
        // data is durable by now: a failed copy is reported, but does not fail the handle.
        let appended = matches!(self.mode, Mode::Append { .. }) && self.attrs.is_some();
        if self.attrs_late || appended {
            return self.send_late_attrs(r).await.map(Some);
        }
        Ok(Some(r))
    }

    async fn commit_inner(&mut self) -> FsResult<PutResult> {
        let metadata = self.upload_metadata();
        let key = self.key.clone();
        let client = Arc::clone(&self.client);
        let err = |e| FsError::client(&key, e);
        let append_condition = self.append_condition();
        // Every byte already went out with the appends of full parts: S3 refuses an empty append, and there
        // is nothing to send anyway.
        if matches!(self.mode, Mode::Append { .. })
            && self.buffer.is_empty()
            && let Some(last) = self.uploaded.as_deref()
        {
            return Ok(last.clone());
        }
        match &mut self.mode {
            Mode::Append { offset } => {
                let body = self.buffer.split().freeze();
                let len = body.len() as u64;
                let r = client
                    .append_object(&key, *offset, body, append_condition)
                    .await
                    .map_err(err)?;
                *offset += len;
                Ok(r)
            }
            Mode::Stream => {
                let Some(mut mp) = self.multipart.take() else {
                    // Smaller than one part: the whole file is still in memory, so keep it. A later write
                    // (after `exec >file` style dup-and-close, or a second fsync) can upload the whole file again.
                    let body = Bytes::copy_from_slice(&self.buffer);
                    return client
                        .put_object_with_metadata(&key, body, self.condition.clone(), &metadata)
                        .await
                        .map_err(err);
                };
                let rest = self.buffer.split().freeze();
                if !rest.is_empty() {
                    let part = client.upload_part(&key, &mp.id, mp.next_part, rest).await;
                    mp.next_part += 1;
                    match part {
                        Ok(p) => mp.done.push(p),
                        Err(e) => {
                            self.multipart = Some(mp);
                            return Err(err(e));
                        }
                    }
                }
                while let Some(task) = mp.in_flight.pop_front() {
                    match task.await {
                        Ok(Ok(p)) => mp.done.push(p),
                        Ok(Err(e)) => {
                            self.multipart = Some(mp);
                            return Err(err(e));
                        }
                        Err(e) => {
                            self.multipart = Some(mp);
                            return Err(FsError::task(&format!("{key}: part upload"), e));
                        }
                    }
                }
                mp.done.sort_by_key(|p| p.part_number);
                let id = mp.id.clone();
                let result = client
                    .complete_multipart_upload(&key, &id, mp.done.clone(), self.condition.clone())
                    .await;
                match &result {
                    Err(_) => self.multipart = Some(mp),
                    Ok(_) => self.carried(mp.mtime),
                }
                result.map_err(err)
            }
        }
    }

    /// Abandons the upload in progress, if any (close without success, or after a failure).
    pub async fn abort(&mut self) {
        if let Some(mp) = self.multipart.take() {
            for task in &mp.in_flight {
                task.abort();
            }
            if let Err(e) = self.client.abort_multipart_upload(&self.key, &mp.id).await {
                warn!(key = %self.key, error = %e, "could not abort multipart upload");
            }
        }
    }

    /// Truncation in place: only to the current size, or to zero before anything was uploaded (O_TRUNC
    /// sent as setattr). Returns false when the file must be staged for it.
    pub fn truncate(&mut self, size: u64) -> bool {
        if size == self.size {
            return true;
        }
        if size == 0
            && self.multipart.is_none()
            && !self.sealed
            && matches!(self.mode, Mode::Stream)
        {
            self.buffer.clear();
            self.size = 0;
            self.tee = None;
            self.dirty = true;
            self.date_write();
            return true;
        }
        false
    }

    pub fn is_sealed(&self) -> bool {
        self.sealed
    }

    /// Written data not yet uploaded.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Unlinked (or replaced) while open: nothing is uploaded any more.
    pub fn is_discarded(&self) -> bool {
        self.discarded
    }

    /// The object version this writer last uploaded, when everything written is in it: a rename copies
    /// only that version, so the writer can carry on from the copy ([`Self::moved`]).
    pub fn pinned_version(&self) -> Option<&str> {
        // A failed writer uploads nothing more: it has no version to keep in sync with.
        match (
            &self.uploaded,
            self.dirty || self.discarded || self.failed.is_some(),
        ) {
            (Some(put), false) => Some(&put.etag),
            _ => None,
        }
    }

    /// The file was renamed to `key` (an object copy of our version now has ETag `etag`, where the move
    /// changed it): later uploads go there, conditional on that version as they were on ours.
    pub fn moved(&mut self, key: String, etag: Option<&str>) {
        self.key = key;
        if let Some(etag) = etag {
            if let Some(put) = &mut self.uploaded {
                put.etag = etag.to_string();
            }
            if matches!(self.condition, WriteCondition::IfMatch(_)) {
                self.condition = WriteCondition::IfMatch(etag.to_string());
            }
        }
    }

    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// The upload failure every later call on this handle returns.
    pub fn failure(&self) -> Option<&FsError> {
        self.failed.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::fake::{FakeClient, Op};

    fn opts(staging: Option<PathBuf>) -> WriterOptions {
        WriterOptions {
            part_size: 5 * 1024 * 1024,
            condition: WriteCondition::IfNoneMatch,
            staging_dir: staging,
            staging_limit: 64 << 20,
            memory: MemoryBudget::unlimited(),
            parts_in_flight: 4,
            attrs: None,
        }
    }

    #[tokio::test]
    async fn parts_in_flight_follow_the_option() {
        let fake = Arc::new(FakeClient::new("b", false));
        let gate = fake.faults().hold(crate::s3::fake::Op::UploadPart);
        let options = WriterOptions {
            parts_in_flight: 2,
            ..opts(None)
        };
        let mut w = Writer::new(fake.clone(), "big".into(), options);
        let data = vec![9u8; 6 * 5 * 1024 * 1024];
        let writing = tokio::spawn(async move {
            for chunk in data.chunks(1 << 20) {
                w.write(w.size(), chunk).await.unwrap();
            }
            w.commit().await.unwrap();
        });
        // The writer sends a part, then waits for the oldest while more than two others are out: three at
        // the most (five with the default of four), never more.
        while gate.held() < 3 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(gate.held(), 3);
        gate.open();
        writing.await.unwrap();
        assert_eq!(fake.object("big").unwrap().len(), 30 << 20);
    }

    #[tokio::test]
    async fn a_spent_budget_serialises_parts_and_still_completes() {
        let fake = Arc::new(FakeClient::new("b", true));
        let budget = MemoryBudget::new(1);
        let mut w = Writer::new(
            fake.clone(),
            "ckpt".into(),
            WriterOptions {
                memory: Arc::clone(&budget),
                ..opts(None)
            },
        );
        let data: Vec<u8> = (0..23 * 1024 * 1024).map(|i| (i % 253) as u8).collect();
        for chunk in data.chunks(1 << 20) {
            w.write(w.size(), chunk).await.unwrap();
            assert!(budget.used() <= 5 * 1024 * 1024, "one part at a time");
        }
        w.commit().await.unwrap();
        assert_eq!(fake.object("ckpt").unwrap(), data);
        assert!(budget.refused() >= 4);
        assert_eq!(budget.used(), 0);
    }

    /// After an fsync the writer is in sync with the version it uploaded (a rename pins that version);
    /// once a later upload fails it uploads nothing more, and pins nothing.
    #[tokio::test]
    async fn a_failed_writer_pins_no_version() {
        let fake = Arc::new(FakeClient::new("b", true));
        let mut w = Writer::new(fake.clone(), "k".into(), opts(None));
        w.write(0, b"first").await.unwrap();
        w.commit().await.unwrap();
        assert!(w.pinned_version().is_some());
        w.refuse(FsError::Io("staging refused".into()));
        assert!(w.failure().is_some());
        assert_eq!(w.pinned_version(), None);
    }

    #[tokio::test]
    async fn streams_parts_and_completes() {
        let fake = Arc::new(FakeClient::new("b", true));
        let mut w = Writer::new(fake.clone(), "k".into(), opts(None));
        let data: Vec<u8> = (0..12 * 1024 * 1024).map(|i| (i % 253) as u8).collect();
        for chunk in data.chunks(1 << 20) {
            let off = w.size();
            w.write(off, chunk).await.unwrap();
        }
        assert!(fake.object("k").is_none(), "visible before commit");
        w.commit().await.unwrap();
        assert_eq!(fake.object("k").unwrap(), data);
        assert_eq!(fake.open_uploads(), 0);
        assert!(
            w.write(w.size(), b"x").await.is_err(),
            "sealed after commit"
        );
    }

    /// Writes done at once (no part to send) and the ones handed to `write` make the same object.
    #[tokio::test]
    async fn writes_in_memory_stop_short_of_a_part_and_of_anything_unusual() {
        let fake = Arc::new(FakeClient::new("b", true));
        let mut w = Writer::new(fake.clone(), "k".into(), opts(None));
        let data: Vec<u8> = (0..11 * 1024 * 1024 + 7).map(|i| (i % 251) as u8).collect();
        let (mut at_once, mut waited) = (0, 0);
        for chunk in data.chunks(768 * 1024) {
            let off = w.size();
            match w.write_in_memory(off, chunk) {
                Some(n) => {
                    assert_eq!(n as usize, chunk.len());
                    at_once += 1;
                }
                None => {
                    assert_eq!(w.size(), off, "a refused write changes nothing");
                    w.write(off, chunk).await.unwrap();
                    waited += 1;
                }
            }
        }
        // Two 5 MiB parts fill up; every other write joins the part being filled.
        assert_eq!((at_once, waited), (13, 2));
        assert_eq!(w.write_in_memory(3, b"x"), None, "not at the end");
        w.commit().await.unwrap();
        assert_eq!(fake.object("k").unwrap(), data);
        assert_eq!(w.write_in_memory(w.size(), b"x"), None, "sealed");
    }

    fn local_bytes(adopted: &Adopted) -> Vec<u8> {
        let file = adopted.local.as_file();
        let mut bytes = vec![0; file.metadata().unwrap().len() as usize];
        file.read_exact_at(&mut bytes, 0).unwrap();
        bytes
    }

    #[tokio::test]
    async fn streamed_parts_hand_over_their_local_copy_and_are_aborted() {
        let fake = Arc::new(FakeClient::new("b", true));
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::new(fake.clone(), "zip".into(), opts(Some(dir.path().into())));
        let data: Vec<u8> = (0..12 * 1024 * 1024).map(|i| (i % 249) as u8).collect();
        for chunk in data.chunks(1 << 20) {
            let off = w.size();
            w.write(off, chunk).await.unwrap();
        }
        assert_eq!(fake.open_uploads(), 1, "parts should be streaming by now");
        assert!(w.needs_staging(Some(0)) && !w.needs_staging(Some(w.size())));
        let adopted = w.take_for_staging().await.unwrap();
        assert_eq!(
            fake.open_uploads(),
            0,
            "the streamed parts were not aborted"
        );
        assert!(adopted.complete && adopted.uploaded.is_none());
        assert_eq!(adopted.size, data.len() as u64);
        assert_eq!(adopted.expect, WriteCondition::IfNoneMatch);
        assert!(local_bytes(&adopted) == data);
    }

    #[tokio::test]
    async fn an_uploaded_stream_hands_over_the_object_as_its_base() {
        let fake = Arc::new(FakeClient::new("b", true));
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::new(fake.clone(), "ckpt".into(), opts(Some(dir.path().into())));
        let data = vec![3u8; 11 * 1024 * 1024];
        w.write(0, &data).await.unwrap();
        let put = w.commit().await.unwrap().unwrap();
        assert!(
            w.needs_staging(Some(w.size())),
            "sealed: even a write at the end"
        );
        let adopted = w.take_for_staging().await.unwrap();
        assert_eq!(adopted.uploaded.as_deref(), Some(put.etag.as_str()));
        assert_eq!(adopted.expect, WriteCondition::IfMatch(put.etag));
        assert!(adopted.complete, "the local copy was kept past the upload");
        assert!(local_bytes(&adopted) == data);
    }

    #[tokio::test]
    async fn small_files_stay_writable_after_a_flush() {
        // bash's `echo hi > f` dup2s the new descriptor and closes the original (a flush) before writing.
        let fake = Arc::new(FakeClient::new("b", true));
        let mut w = Writer::new(fake.clone(), "f".into(), opts(None));
        w.commit().await.unwrap();
        assert_eq!(&fake.object("f").unwrap()[..], b"");
        w.write(0, b"hi\n").await.unwrap();
        w.commit().await.unwrap();
        assert_eq!(&fake.object("f").unwrap()[..], b"hi\n");
        w.write(3, b"more").await.unwrap();
        w.commit().await.unwrap();
        assert_eq!(&fake.object("f").unwrap()[..], b"hi\nmore");
        // Someone else replaced it meanwhile: our next upload must not clobber theirs.
        fake.put_object("f", Bytes::from_static(b"theirs"), WriteCondition::None)
            .await
            .unwrap();
        w.write(7, b"!").await.unwrap();
        assert!(w.commit().await.is_err());
        assert_eq!(&fake.object("f").unwrap()[..], b"theirs");
    }

    /// Unlinked while open: what the writer still holds (in memory, or in the local copy of a streamed
    /// file) goes on in a staged file that never uploads; parts that left with no local copy are lost, and
    /// a read says so instead of answering what is left.
    #[tokio::test]
    async fn a_discarded_writer_hands_over_what_it_holds_and_refuses_what_it_lost() {
        let fake = Arc::new(FakeClient::new("b", true));
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::new(fake.clone(), "small".into(), opts(Some(dir.path().into())));
        w.write(0, b"secret").await.unwrap();
        w.discard().await;
        assert!(w.needs_staging(Some(6)), "even at the end: on to disk");
        assert_eq!(w.write_in_memory(6, b"x"), None);
        let adopted = w.take_for_staging().await.unwrap();
        assert!(adopted.discarded && adopted.complete);
        assert_eq!(local_bytes(&adopted), b"secret");

        let data: Vec<u8> = (0..6 * 1024 * 1024).map(|i| (i % 241) as u8).collect();
        let mut w = Writer::new(fake.clone(), "copied".into(), opts(Some(dir.path().into())));
        w.write(0, &data).await.unwrap();
        w.discard().await;
        let adopted = w.take_for_staging().await.unwrap();
        assert!(adopted.discarded && adopted.complete);
        assert!(local_bytes(&adopted) == data);

        let over_limit = WriterOptions {
            staging_limit: 1 << 20,
            ..opts(Some(dir.path().into()))
        };
        let mut w = Writer::new(fake.clone(), "lost".into(), over_limit);
        w.write(0, &data).await.unwrap();
        w.discard().await;
        assert!(matches!(w.take_for_staging().await, Err(FsError::Io(_))));
        assert!(!w.needs_staging(Some(0)));
        assert_eq!(w.write(w.size(), b"more").await.unwrap(), 4, "dropped");
        assert_eq!(w.size(), data.len() as u64 + 4);
        assert!(w.commit().await.unwrap().is_none());
        assert_eq!(fake.open_uploads(), 0);
        for key in ["small", "copied", "lost"] {
            assert!(fake.object(key).is_none(), "{key} uploaded");
        }
    }

    #[tokio::test]
    async fn a_small_file_hands_over_its_buffer() {
        let fake = Arc::new(FakeClient::new("b", true));
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::new(fake.clone(), "z".into(), opts(Some(dir.path().into())));
        w.write(0, b"hello world").await.unwrap();
        let adopted = w.take_for_staging().await.unwrap();
        assert_eq!(local_bytes(&adopted), b"hello world");
        assert!(adopted.complete && adopted.uploaded.is_none());
        assert_eq!(fake.counts().total(), 0, "nothing was sent");
    }

    #[tokio::test]
    async fn out_of_order_without_staging_fails_and_keeps_failing() {
        let fake = Arc::new(FakeClient::new("b", true));
        let mut w = Writer::new(fake.clone(), "z".into(), opts(None));
        w.write(0, b"abc").await.unwrap();
        assert!(matches!(
            w.write(10, b"x").await,
            Err(FsError::InvalidArgument(_))
        ));
        assert!(w.take_for_staging().await.is_err());
        assert!(w.commit().await.is_err());
        assert!(fake.object("z").is_none());
    }

    #[tokio::test]
    async fn conditional_create_refuses_existing_and_aborts() {
        let fake = Arc::new(FakeClient::new("b", true));
        fake.put_object("k", Bytes::from_static(b"old"), WriteCondition::None)
            .await
            .unwrap();
        let mut w = Writer::new(fake.clone(), "k".into(), opts(None));
        w.write(0, &vec![7u8; 6 * 1024 * 1024]).await.unwrap();
        assert!(w.commit().await.is_err());
        assert_eq!(&fake.object("k").unwrap()[..], b"old");
        assert_eq!(fake.open_uploads(), 0, "failed upload left behind");
    }

    #[tokio::test]
    async fn appends_stay_writable() {
        let fake = Arc::new(FakeClient::new("b", true));
        fake.put_object("log", Bytes::from_static(b"one "), WriteCondition::None)
            .await
            .unwrap();
        let mut w = Writer::append(
            fake.clone(),
            "log".into(),
            base(&fake, "log").await,
            opts(None),
        );
        w.write(4, b"two ").await.unwrap();
        w.commit().await.unwrap();
        assert_eq!(&fake.object("log").unwrap()[..], b"one two ");
        w.write(8, b"three").await.unwrap();
        w.commit().await.unwrap();
        assert_eq!(&fake.object("log").unwrap()[..], b"one two three");
    }

    /// Each append is conditional on the version the last one made (If-Match): an object another client
    /// replaced with one of the same size is never appended to as if it were ours.
    #[tokio::test]
    async fn an_append_to_an_object_replaced_meanwhile_fails() {
        for part_size in [4, 1 << 20] {
            let fake = Arc::new(FakeClient::new("b", true));
            fake.put_object("log", Bytes::from_static(b"one "), WriteCondition::None)
                .await
                .unwrap();
            let mut options = opts(None);
            options.part_size = part_size;
            let mut w = Writer::append(
                fake.clone(),
                "log".into(),
                base(&fake, "log").await,
                options,
            );
            w.write(4, b"two ").await.unwrap();
            w.commit().await.unwrap();
            fake.put_object("log", Bytes::from_static(b"XXXXXXXX"), WriteCondition::None)
                .await
                .unwrap();
            let appended = match w.write(8, b"three").await {
                Ok(_) => w.commit().await.map(drop),
                Err(e) => Err(e),
            };
            assert!(
                matches!(appended, Err(FsError::ObjectChanged { .. })),
                "{appended:?} with parts of {part_size}"
            );
            assert_eq!(&fake.object("log").unwrap()[..], b"XXXXXXXX");
        }
    }

    /// What an open for appending finds: the object as it is.
    async fn base(fake: &FakeClient, key: &str) -> PutResult {
        let info = fake.head_object(key).await.unwrap();
        PutResult {
            etag: info.etag,
            size: Some(info.size),
        }
    }

    async fn stored_attrs(fake: &FakeClient, key: &str) -> StoredAttrs {
        StoredAttrs::from_metadata(&fake.head_object(key).await.unwrap().metadata)
    }

    /// With `--preserve-metadata` the upload carries the last write's time, unless a time was set after
    /// it; stat (the writer's `mtime`) shows what the object carries.
    #[tokio::test]
    async fn the_upload_carries_the_last_writes_time_unless_one_is_set_after_it() {
        let fake = Arc::new(FakeClient::new("b", true));
        let old = StoredAttrs {
            mtime: Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(946_684_800)),
            ..StoredAttrs::default()
        };
        let dated = || WriterOptions {
            attrs: Some(StoredAttrs::default()),
            ..opts(None)
        };
        let before = SystemTime::now();
        let mut w = Writer::new(fake.clone(), "set-then-written".into(), dated());
        w.set_attrs(old);
        w.write(0, b"x").await.unwrap();
        w.commit().await.unwrap();
        let stored = stored_attrs(&fake, "set-then-written").await;
        assert!(stored.mtime.is_some_and(|t| t >= before), "{stored:?}");
        assert_eq!(stored.mtime, w.mtime());

        let mut w = Writer::new(fake.clone(), "written-then-set".into(), dated());
        w.write(0, b"x").await.unwrap();
        w.set_attrs(old);
        w.commit().await.unwrap();
        assert_eq!(
            stored_attrs(&fake, "written-then-set").await.mtime,
            old.mtime
        );
        assert_eq!(w.mtime(), old.mtime);

        // An append keeps the object's metadata: the copy after it carries the append's time.
        fake.put_object("log", Bytes::from_static(b"one "), WriteCondition::None)
            .await
            .unwrap();
        let mut w = Writer::append(
            fake.clone(),
            "log".into(),
            base(&fake, "log").await,
            dated(),
        );
        w.write(4, b"two").await.unwrap();
        w.commit().await.unwrap();
        let stored = stored_attrs(&fake, "log").await;
        assert!(stored.mtime.is_some_and(|t| t >= before), "{stored:?}");
        assert_eq!(stored.mtime, w.mtime());
    }

    /// Opened for appending (`--incremental-upload`) with `--preserve-metadata`: a chmod with nothing appended
    /// is kept by a metadata copy of the version opened (it was dropped); an open that changes nothing sends no
    /// copy; a version replaced meanwhile is not given our attributes.
    #[tokio::test]
    async fn an_append_handle_keeps_a_chmod_without_an_append() {
        let fake = Arc::new(FakeClient::new("b", true));
        let dated = || WriterOptions {
            attrs: Some(StoredAttrs::default()),
            ..opts(None)
        };
        fake.put_object("log", Bytes::from_static(b"one "), WriteCondition::None)
            .await
            .unwrap();
        let mut idle = Writer::append(
            fake.clone(),
            "log".into(),
            base(&fake, "log").await,
            dated(),
        );
        idle.commit().await.unwrap();
        assert_eq!(fake.count(Op::Copy), 0);

        let mut w = Writer::append(
            fake.clone(),
            "log".into(),
            base(&fake, "log").await,
            dated(),
        );
        w.set_attrs(StoredAttrs {
            mode: Some(libc::S_IFREG | 0o600),
            ..StoredAttrs::default()
        });
        w.commit().await.unwrap();
        assert_eq!(
            stored_attrs(&fake, "log").await.mode,
            Some(libc::S_IFREG | 0o600)
        );
        assert_eq!(&fake.object("log").unwrap()[..], b"one ");
        // Sent once: the close after it sends nothing more.
        w.commit().await.unwrap();
        assert_eq!(fake.count(Op::Copy), 1);

        let mut w = Writer::append(
            fake.clone(),
            "log".into(),
            base(&fake, "log").await,
            dated(),
        );
        fake.put_object("log", Bytes::from_static(b"theirs"), WriteCondition::None)
            .await
            .unwrap();
        w.set_attrs(StoredAttrs {
            mode: Some(libc::S_IFREG | 0o640),
            ..StoredAttrs::default()
        });
        assert!(w.commit().await.is_err());
        assert_eq!(stored_attrs(&fake, "log").await.mode, None);
    }

    /// A file streamed in parts carries the time its upload started (writes after that send no metadata
    /// copy of the whole object); the writer shows that time too, not its last write's.
    #[tokio::test]
    async fn a_streamed_file_shows_the_time_its_upload_carried() {
        let fake = Arc::new(FakeClient::new("b", true));
        let options = WriterOptions {
            attrs: Some(StoredAttrs::default()),
            ..opts(None)
        };
        let mut w = Writer::new(fake.clone(), "big".into(), options);
        for chunk in vec![1u8; 12 * 1024 * 1024].chunks(1 << 20) {
            w.write(w.size(), chunk).await.unwrap();
        }
        w.commit().await.unwrap();
        let stored = stored_attrs(&fake, "big").await;
        assert!(stored.mtime.is_some());
        assert_eq!(stored.mtime, w.mtime());
    }
}
