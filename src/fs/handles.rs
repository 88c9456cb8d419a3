//! Open handles: read and write dispatch (open, create, read, write, flush, fsync, release, truncate
//! through a handle) and directory handles' snapshots.
//!
//! These are methods of [`S3Filesystem`] because a handle op touches both halves: the handle table here
//! and the node in the [`Superblock`](super::superblock::Superblock), which it changes only through
//! [`Node`]'s methods. Three counts of writers exist, each with one owner:
//! - [`WriterSlots`]: write handles open, against `--max-open-writers` (taken at open, given back at release);
//! - [`WriterMark`]: whether one write handle counts among its node's writers (until its bytes are
//!   uploaded, and again from its next write);
//! - [`Node::start_write`] / [`Node::finish_write`]: how many handles (a staged file counting as one) hold
//!   bytes of a file the bucket lacks, which keeps the file busy for rename and unlink, and its stat from
//!   being replaced.
//!
//! A write handle is either a streaming [`Writer`] or attached to the inode's [`StagedFile`], which every
//! handle of the inode then shares (`staging.rs`; the registry is [`StagedFiles`]). Open and create, which
//! decide which kind a handle is, are in `open.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::Mutex as AsyncMutex;
use tracing::{debug, warn};

use super::attrs::StoredAttrs;
use super::inode::{Kind, Node};
use super::read::Reader;
use super::write::Writer;
use super::{Attr, DirEntry, FsError, FsResult, KernelNotice, S3Filesystem};
use crate::s3::UserMetadata;
use open::Patience;
use staging::SharedStaged;
pub use staging::StagedFiles;

mod follow;
#[cfg(test)]
mod follow_tests;
mod open;
#[cfg(test)]
mod staged_tests;
mod staging;
#[cfg(test)]
mod tests;

/// Most bytes one warm-up request fetches ([`S3Filesystem::keep_in_cache`]). The kernel cannot cancel a request
/// the daemon has taken: a warm-up stopped by a signal waits for the one under way, a fraction of a second, not
/// for the rest of a huge file.
const KEEP_PER_REQUEST: u64 = 256 << 20;

pub enum Handle {
    Read {
        ino: u64,
        /// The version the handle opened (its page cache is that version's).
        etag: String,
        reader: AsyncMutex<Reader>,
        /// It has read a staged edit of its file: once that edit is uploaded, it reads the version the edit
        /// made, not the one it opened.
        saw_edit: AtomicBool,
    },
    Write {
        ino: u64,
        state: AsyncMutex<WriteState>,
        /// Process (thread group) that opened the file: flushes from other processes are not closes of
        /// this descriptor (a fork+exec elsewhere closes inherited copies) and must not end the upload.
        opener: Option<u32>,
        /// Whether this handle still counts as a writer of its node (a streaming writer, until its upload
        /// is done; a staged file counts for all its handles).
        counted: WriterMark,
        /// Opened for writing (holds a `--max-open-writers` slot); false for a read-only open of a file
        /// that is staged.
        writable: bool,
        /// Wrote to its staged file since its last flush: its close uploads.
        wrote: AtomicBool,
    },
    Dir {
        entries: Mutex<Option<Arc<Vec<DirEntry>>>>,
        ino: u64,
    },
}

/// What a write handle writes to.
pub enum WriteState {
    Stream(Box<Writer>),
    Staged(Arc<SharedStaged>),
}

impl WriteState {
    /// A streaming writer's upload failure: its bytes never reach the bucket, and it keeps the error to itself.
    fn failure(&self) -> Option<&FsError> {
        match self {
            WriteState::Stream(w) => w.failure(),
            WriteState::Staged(_) => None,
        }
    }

    /// Its changes can never reach the bucket: a failed stream, or a staged file that failed for good. Not
    /// waited for: a staged file whose lock is held is being uploaded, not failed yet.
    fn has_failed(&self) -> bool {
        match self {
            WriteState::Stream(w) => w.failure().is_some(),
            WriteState::Staged(shared) => shared.file.try_lock().is_ok_and(|f| f.has_failed()),
        }
    }
}

impl Handle {
    /// A write handle's node, state and writer mark.
    fn as_writer(&self) -> Option<(u64, &AsyncMutex<WriteState>, &WriterMark)> {
        match self {
            Handle::Write {
                ino,
                state,
                counted,
                ..
            } => Some((*ino, state, counted)),
            _ => None,
        }
    }

    fn write_handle(ino: u64, state: WriteState, pid: u32, counted: WriterMark) -> Handle {
        Handle::Write {
            ino,
            state: AsyncMutex::new(state),
            opener: tgid_of(pid),
            counted,
            writable: true,
            wrote: AtomicBool::new(false),
        }
    }
}

/// Whether one write handle counts among its node's writers. The node's count moves only through here,
/// so each handle adds at most one to it and takes away only what it added.
pub struct WriterMark(AtomicBool);

impl WriterMark {
    /// Counts for nothing yet.
    fn idle() -> WriterMark {
        WriterMark(AtomicBool::new(false))
    }

    /// A new write handle counts as a writer of `node` (if the table still has it).
    fn start(node: Option<&mut Node>) -> WriterMark {
        if let Some(node) = node {
            node.start_write();
        }
        WriterMark(AtomicBool::new(true))
    }

    /// Bytes were written: dirty again after an upload, the file is busy until its next upload.
    fn wrote(&self, node: &mut Node) {
        if !self.0.swap(true, Ordering::SeqCst) {
            node.start_write();
        }
    }

    /// Whether it counts among its node's writers now.
    fn counts(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Everything this handle wrote is uploaded: one writer fewer.
    fn settled(&self, node: &mut Node) {
        if self.0.swap(false, Ordering::SeqCst) {
            node.finish_write();
        }
    }

    /// What this handle wrote will never be uploaded: one writer fewer, and if it was the last, the node
    /// is again what the bucket holds (true: the kernel must forget the writer's size).
    fn abandoned(&self, node: &mut Node) -> bool {
        self.0.swap(false, Ordering::SeqCst) && node.abandon_write()
    }
}

/// Write handles open at once, against `--max-open-writers` (each holds up to a few parts in memory).
pub struct WriterSlots {
    max: usize,
    open: AtomicU64,
}

impl WriterSlots {
    pub fn new(max: usize) -> WriterSlots {
        WriterSlots {
            max,
            open: AtomicU64::new(0),
        }
    }

    /// Takes a slot for a new write handle.
    fn reserve(&self) -> FsResult<()> {
        let n = self.open.fetch_add(1, Ordering::SeqCst);
        if n as usize >= self.max {
            self.open.fetch_sub(1, Ordering::SeqCst);
            return Err(FsError::TooManyWriters(self.max));
        }
        Ok(())
    }

    /// A write handle is released.
    fn give_back(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }

    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }
}

/// Open handles by number (files and directories share one numbering).
pub struct HandleTable {
    open: Mutex<HashMap<u64, Arc<Handle>>>,
    next: AtomicU64,
    /// Staged files by inode, shared by their handles.
    staged: StagedFiles,
    /// Woken when a file's writer stops counting (its upload landed, or never will): see
    /// `S3Filesystem::until_released_writer_lands`.
    writer_landed: tokio::sync::Notify,
}

impl HandleTable {
    pub fn new() -> HandleTable {
        HandleTable {
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            staged: StagedFiles::default(),
            writer_landed: tokio::sync::Notify::new(),
        }
    }

    fn open(&self) -> MutexGuard<'_, HashMap<u64, Arc<Handle>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, fh: u64) -> FsResult<Arc<Handle>> {
        self.open().get(&fh).cloned().ok_or(FsError::BadHandle)
    }

    fn add(&self, handle: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.open().insert(fh, Arc::new(handle));
        fh
    }

    fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        self.open().remove(&fh)
    }

    /// Still in the table (not released).
    fn is_open(&self, handle: &Handle) -> bool {
        self.open()
            .values()
            .any(|h| std::ptr::eq(h.as_ref(), handle))
    }

    /// Every write handle open on `ino`.
    fn writers_of(&self, ino: u64) -> Vec<Arc<Handle>> {
        self.open()
            .values()
            .filter(|h| matches!(h.as_ref(), Handle::Write { ino: i, .. } if *i == ino))
            .cloned()
            .collect()
    }

    /// Every write handle, with its inode.
    fn write_handles(&self) -> Vec<(u64, Arc<Handle>)> {
        self.open()
            .values()
            .filter_map(|h| match h.as_ref() {
                Handle::Write { ino, .. } => Some((*ino, Arc::clone(h))),
                _ => None,
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.open().len()
    }
}

impl S3Filesystem {
    /// Size changes (truncate, ftruncate) and, with `--preserve-metadata`, chmod/chown/utimens (`change`):
    /// kept in the object's metadata on a closed file, carried by the upload of an open one. Without the flag
    /// (or on a directory) attribute changes are accepted and not kept.
    pub async fn setattr(
        &self,
        ino: u64,
        size: Option<u64>,
        fh: Option<u64>,
        change: StoredAttrs,
    ) -> FsResult<Attr> {
        self.setattr_within(ino, size, fh, change, Patience::new())
            .await
    }

    /// A truncation by name made again from the top, on what is there now (the attributes of the call
    /// were done already).
    async fn cut_again(&self, ino: u64, size: u64, patience: Patience) -> FsResult<Attr> {
        let cut = self.setattr_within(ino, Some(size), None, StoredAttrs::default(), patience);
        Box::pin(cut).await
    }

    /// [`Self::setattr`], its retries after a wait for a released writer bounded by the first call's
    /// `patience`.
    async fn setattr_within(
        &self,
        ino: u64,
        size: Option<u64>,
        fh: Option<u64>,
        change: StoredAttrs,
        patience: Patience,
    ) -> FsResult<Attr> {
        if (size.is_some() || (self.config.preserve_metadata && !change.is_empty()))
            && self.config.read_only
        {
            return Err(FsError::ReadOnly);
        }
        let handle = match fh {
            Some(fh) => Some(self.handles.get(fh)?),
            None => self.live_writer_for(ino).await,
        };
        // A descriptor whose upload failed keeps its error for every call, and changes nothing: not its own
        // file, and not a staged file that later opens share.
        if let Some(Handle::Write { state, .. }) = handle.as_deref()
            && let Some(e) = state.lock().await.failure()
        {
            return Err(e.clone());
        }
        // A writer found by name may be released while we wait for its lock: then the file is a closed
        // one, and the change is made again as for a closed file.
        let released = |owner: &Handle| fh.is_none() && !self.handles.is_open(owner);
        if self.config.preserve_metadata && !change.is_empty() {
            let change = change.of_regular_file();
            let node = self.sb.node(ino)?;
            let staged = self
                .change_staged(ino, handle.as_deref(), |f| {
                    f.set_attrs(change);
                    Ok(())
                })
                .await;
            // Open for writing: the attributes ride on its upload, and stat shows them meanwhile.
            let open = match (staged, handle.as_deref()) {
                (Some(result), _) => result.map(|()| true)?,
                (None, Some(owner @ Handle::Write { state, .. })) => {
                    let mut state = state.lock().await;
                    if released(owner) {
                        drop(state);
                        return Box::pin(self.setattr_within(ino, size, None, change, patience))
                            .await;
                    }
                    if let WriteState::Stream(w) = &mut *state {
                        w.set_attrs(change);
                        // Everything written is uploaded already (closed, its release not in yet, or
                        // fsynced): the metadata copy goes now, as for a closed file. Left to the release,
                        // a stat or a rename meanwhile would see the object without the attributes.
                        // (A failed writer keeps its error for its fsync and close.)
                        if !w.is_dirty() && !w.is_discarded() && !w.is_failed() {
                            let put = w.commit().await?;
                            let expires = self.sb.expiry();
                            if let (Some(put), Some(n)) = (put, self.sb.table().get_mut(ino)) {
                                n.record_own_upload(
                                    w.size(),
                                    &put.etag,
                                    w.attrs(),
                                    w.stored_metadata(),
                                );
                                n.trust_until(expires);
                            }
                        }
                    }
                    true
                }
                _ if node.kind() == Kind::File => {
                    let now = self.sb.node(ino)?;
                    if now.is_being_written() {
                        // A writer took the file since we looked, or a released one is finishing its upload:
                        // a copy of the metadata now would be replaced by that upload, the change lost.
                        self.until_released_writer_lands(ino, patience).await?;
                        return Box::pin(self.setattr_within(ino, size, None, change, patience))
                            .await;
                    }
                    if !now.is_local() {
                        self.sb.store_attributes(ino, change).await?;
                    }
                    false
                }
                _ => false,
            };
            if open && let Some(n) = self.sb.table().get_mut(ino) {
                n.overlay_attrs(change);
            }
        }
        if let Some(size) = size {
            self.claim_page_cache(ino, false);
            let staged = self
                .change_staged(ino, handle.as_deref(), |f| f.truncate(size))
                .await;
            match (staged, handle.as_deref()) {
                (Some(result), _) => result?,
                (None, Some(owner @ Handle::Write { state, counted, .. })) => {
                    let mut state = state.lock().await;
                    if released(owner) {
                        drop(state);
                        return self.cut_again(ino, size, patience).await;
                    }
                    if let WriteState::Stream(w) = &mut *state
                        && w.truncate(size)
                    {
                        // A writer fsynced before is busy again: counted before its size changes.
                        self.note_written(ino, counted, w);
                    } else {
                        let shared = self
                            .stage_writer(ino, owner, &mut state, counted, false)
                            .await?;
                        let mut file = shared.file.lock().await;
                        file.truncate(size)?;
                        self.note_staged(ino, &shared, &file);
                    }
                }
                _ => {
                    if self.sb.node(ino)?.is_being_written() {
                        // As above: cut what the writer uploads, not the version it replaces.
                        self.until_released_writer_lands(ino, patience).await?;
                        return self.cut_again(ino, size, patience).await;
                    }
                    let current = self.sb.getattr(ino).await?;
                    if current.size != size {
                        self.truncate_closed(ino, size).await?;
                    }
                }
            }
            // ftruncate(2) is a change of the descriptor's own: its close uploads it, as a write's would.
            if fh.is_some()
                && let Some(handle) = handle.as_deref()
            {
                handle_wrote(handle);
            }
            // truncate(2) by name of a staged file (handles open, or closed with their release not in yet):
            // uploaded now with whatever its handles wrote so far, as an fsync would, not at a later close
            // that may never come. A streaming writer cut in place uploads at its own close.
            if fh.is_none()
                && let Some(shared) = self.handles.staged.peek(ino)
            {
                self.upload_staged(ino, &shared).await?;
            }
        }
        self.sb.getattr(ino).await
    }

    /// fallocate(2) through a write handle (the file is staged for it, unless it only reserves space).
    pub async fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> FsResult<()> {
        let handle = self.handles.get(fh)?;
        let Some((ino, state, counted)) = handle.as_writer() else {
            return Err(FsError::BadHandle);
        };
        if mode == libc::FALLOC_FL_KEEP_SIZE {
            // Reserving space changes nothing anyone can see.
            return Ok(());
        }
        let mut state = state.lock().await;
        let shared = self
            .stage_writer(ino, &handle, &mut state, counted, false)
            .await?;
        let mut file = shared.file.lock().await;
        file.fallocate(offset, len, mode)?;
        self.note_staged(ino, &shared, &file);
        handle_wrote(&handle);
        Ok(())
    }

    /// unlink(2). The name of a file open for writing goes at once, as on a local disk (lock files are
    /// deleted while held): its handles keep reading and writing, and upload nothing from then on.
    pub async fn unlink(&self, parent: u64, name: &str) -> FsResult<()> {
        self.unlink_within(parent, name, Patience::new()).await
    }

    /// [`Self::unlink`], its retry after a wait for a released writer bounded by the first call's
    /// `patience`.
    async fn unlink_within(&self, parent: u64, name: &str, patience: Patience) -> FsResult<()> {
        let file = self
            .sb
            .table()
            .child(parent, name)
            .filter(|n| n.kind() == Kind::File)
            .map(|n| (n.ino(), n.is_pending()));
        let Some((ino, pending)) = file else {
            return self.sb.unlink(parent, name).await;
        };
        if self.config.read_only {
            return Err(FsError::ReadOnly);
        }
        if !self.config.allow_delete {
            return Err(FsError::NotPermitted(
                "deleting objects needs --allow-delete",
            ));
        }
        if pending && self.until_released_writer_lands(ino, patience).await? {
            // Its last upload landed meanwhile: the object it made goes as any other.
            return Box::pin(self.unlink_within(parent, name, patience)).await;
        }
        // Handles still open (or closed, their release not in yet) must not bring the name back: held while
        // the object goes, as a rename holds them (`follow.rs`), and discarded once it is gone. A failed
        // delete leaves them as they were.
        let writers: Vec<(u64, Arc<Handle>)> = self
            .handles
            .writers_of(ino)
            .into_iter()
            .map(|h| (ino, h))
            .collect();
        let staged: Vec<(u64, Arc<SharedStaged>)>;
        let mut held = follow::Held::default();
        held.lock_writers(&writers).await;
        staged = self
            .handles
            .staged
            .peek(ino)
            .map(|s| (ino, s))
            .into_iter()
            .collect();
        held.lock_staged(&staged).await;
        if pending {
            self.sb.unlink_open(parent, name).await?;
        } else {
            self.sb.unlink(parent, name).await?;
        }
        held.discard(ino).await;
        Ok(())
    }

    pub fn opendir(&self, ino: u64) -> FsResult<u64> {
        self.sb.dir_node(ino)?;
        Ok(self.handles.add(Handle::Dir {
            entries: Mutex::new(None),
            ino,
        }))
    }

    /// Entries from index `offset` on (offsets are positions in this handle's snapshot).
    pub async fn readdir(&self, fh: u64, offset: u64) -> FsResult<Arc<Vec<DirEntry>>> {
        let handle = self.handles.get(fh)?;
        let Handle::Dir { entries, ino } = handle.as_ref() else {
            return Err(FsError::BadHandle);
        };
        if offset == 0 || entries.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
            let listed = self.sb.entries(*ino).await?;
            *entries.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&listed));
            return Ok(listed);
        }
        Ok(entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_default())
    }

    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Bytes> {
        let handle = self.handles.get(fh)?;
        match handle.as_ref() {
            Handle::Read {
                ino,
                reader,
                saw_edit,
                ..
            } => {
                let followed = saw_edit.load(Ordering::SeqCst);
                if followed
                    && self.handles.staged.peek(*ino).is_none()
                    && self.sb.node(*ino)?.is_being_written()
                {
                    // The edit's last upload is under way: what follows is the version it makes.
                    self.until_released_writer_lands(*ino, Patience::new())
                        .await?;
                }
                // Staged since this handle opened: it sees what was written through the mount (unless
                // those changes failed for good: then the file is what the bucket holds).
                if let Some(shared) = self.handles.staged.peek(*ino) {
                    let mut file = shared.file.lock().await;
                    if !file.has_failed() {
                        saw_edit.store(true, Ordering::SeqCst);
                        return file.read(offset, size as u64).await;
                    }
                }
                let mut reader = reader.lock().await;
                if followed {
                    // Not while another writer holds the file: its stat is that writer's size, not the
                    // uploaded version's (the reader follows once that writer's bytes have landed).
                    let node = self.sb.node(*ino)?;
                    if let (Some(etag), false) = (&node.stat().etag, node.is_being_written()) {
                        reader.follow_version(node.key(), etag, node.stat().size);
                    }
                }
                reader.read(offset, size).await
            }
            Handle::Write {
                ino,
                state,
                counted,
                ..
            } => {
                let shared = {
                    let mut state = state.lock().await;
                    self.stage_writer(*ino, &handle, &mut state, counted, false)
                        .await?
                };
                shared.file.lock().await.read(offset, size as u64).await
            }
            Handle::Dir { .. } => Err(FsError::IsADirectory),
        }
    }

    /// `expressfs warm` on an open file: its content from `start` on into the caches, none of it back
    /// through FUSE, [`KEEP_PER_REQUEST`] at most. Returns where the kept bytes end and whether the file goes
    /// on past that. Refused, and read by the warm-up instead: on a mount with no cache (unsupported), a file
    /// no cache here can hold (over `--cache-xz`'s limit without `--cache`) and a file being written through
    /// the mount (busy: it is not in the bucket yet).
    pub async fn keep_in_cache(&self, fh: u64, start: u64) -> FsResult<(u64, bool)> {
        let handle = self.handles.get(fh)?;
        match handle.as_ref() {
            _ if !self.sources.has_caches() => Err(FsError::OperationNotSupported(
                "no cache to fill: the mount has no --cache or --cache-xz",
            )),
            Handle::Read { ino, reader, .. } if self.handles.staged.peek(*ino).is_none() => {
                let mut reader = reader.lock().await;
                let kept = reader
                    .keep(start, KEEP_PER_REQUEST, &self.keep_budget)
                    .await
                    .map_err(|e| match e {
                        // A request the bucket does not offer is this file's failure (EIO), not the mount
                        // refusing warm-ups (its ENOTSUP would read as EOPNOTSUPP, which ends them all).
                        FsError::Unsupported { key, source } => FsError::Client { key, source },
                        e => e,
                    })?;
                let size = reader.size();
                kept.map(|end| (end, end < size))
                    .ok_or(FsError::NotCacheable)
            }
            Handle::Dir { .. } => Err(FsError::IsADirectory),
            _ => Err(FsError::Busy(
                "the file is being written through the mount: it is not in the bucket yet",
            )),
        }
    }

    pub async fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let handle = self.handles.get(fh)?;
        let (ino, state, counted) = handle.as_writer().ok_or(FsError::BadHandle)?;
        if matches!(
            handle.as_ref(),
            Handle::Write {
                writable: false,
                ..
            }
        ) {
            return Err(FsError::BadHandle);
        }
        let mut state = state.lock().await;
        let shared = match &mut *state {
            WriteState::Stream(w) if !w.needs_staging(Some(offset)) => {
                let written = w.write(offset, data).await;
                if w.is_failed() {
                    self.writer_failed(ino, counted);
                }
                let n = written?;
                self.note_written(ino, counted, w);
                return Ok(n);
            }
            _ => {
                let staged = self
                    .stage_writer(ino, &handle, &mut state, counted, true)
                    .await;
                if let (Err(_), WriteState::Stream(w)) = (&staged, &*state)
                    && w.is_failed()
                {
                    self.writer_failed(ino, counted);
                }
                staged?
            }
        };
        drop(state);
        let mut file = shared.file.lock().await;
        let n = file.write(offset, data)?;
        self.note_staged(ino, &shared, &file);
        handle_wrote(&handle);
        Ok(n)
    }

    /// A write that needs no waiting (the bytes only join the part being filled), done on the caller's
    /// thread with the caller's buffer: the FUSE adapter then need not copy the bytes to hand them to the
    /// runtime. `None` when the write must go through [`S3Filesystem::write`].
    pub fn write_now(&self, fh: u64, offset: u64, data: &[u8]) -> Option<u32> {
        let handle = self.handles.get(fh).ok()?;
        let (ino, state, counted) = handle.as_writer()?;
        let mut state = state.try_lock().ok()?;
        let WriteState::Stream(w) = &mut *state else {
            return None;
        };
        let n = w.write_in_memory(offset, data)?;
        self.note_written(ino, counted, w);
        Some(n)
    }

    /// The streaming writer `w` took bytes (or a cut): stat shows its size and mtime.
    fn note_written(&self, ino: u64, counted: &WriterMark, w: &Writer) {
        if let Some(node) = self.sb.table().get_mut(ino) {
            // Counted first: a writer that starts again keeps aside what the bucket holds.
            counted.wrote(node);
            node.record_write(w.size(), w.mtime());
        }
    }

    /// fsync: everything written is durable in the bucket when this returns Ok.
    pub async fn fsync(&self, fh: u64) -> FsResult<()> {
        let handle = self.handles.get(fh)?;
        self.commit_handle(&handle, false).await
    }

    /// A write through a descriptor opened with O_SYNC or O_DSYNC: it returns once the bytes are in the
    /// bucket, as if each write were followed by fsync. The kernel asks for that fsync itself only for files it
    /// caches; our write handles bypass the page cache, so without this such a write would return with its
    /// bytes in memory only. Each one is an upload (an append with `--incremental-upload` on a directory
    /// bucket; otherwise the whole file so far).
    pub async fn write_durably(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let written = self.write(fh, offset, data).await?;
        self.fsync(fh).await?;
        Ok(written)
    }

    /// Uploads what was written through `handle` and is not in the bucket yet (fsync, and a rename of its
    /// file). `unless_failed`: a handle whose upload failed is left with its error instead of returning it.
    pub(super) async fn commit_handle(&self, handle: &Handle, unless_failed: bool) -> FsResult<()> {
        let Some((ino, state, counted)) = handle.as_writer() else {
            return Ok(());
        };
        let mut state = state.lock().await;
        if unless_failed && state.failure().is_some() {
            return Ok(());
        }
        let w = match &mut *state {
            WriteState::Staged(shared) => {
                let shared = Arc::clone(shared);
                drop(state);
                return self.upload_staged(ino, &shared).await;
            }
            WriteState::Stream(w) => w,
        };
        let committed = w.commit().await;
        if w.is_failed() {
            self.writer_failed(ino, counted);
        }
        let result = committed?;
        let mut table = self.sb.table();
        let expires = self.sb.expiry();
        if let Some(node) = table.get_mut(ino) {
            if let Some(put) = result {
                node.record_own_upload(w.size(), &put.etag, w.attrs(), w.stored_metadata());
                node.trust_until(expires);
            }
            // Once everything written is uploaded, the file is no longer busy for readers, rename or unlink.
            if !w.is_dirty() {
                counted.settled(node);
                self.handles.writer_landed.notify_waiters();
            }
        }
        Ok(())
    }

    /// close(2) of a descriptor. Uploads here (not at release) so close() reports the outcome; flushes
    /// from another process (an inherited copy closed after fork) are ignored.
    pub async fn flush(&self, fh: u64, pid: u32) -> FsResult<()> {
        let handle = self.handles.get(fh)?;
        let Handle::Write {
            opener,
            state,
            wrote,
            ino,
            writable,
            ..
        } = handle.as_ref()
        else {
            return Ok(());
        };
        if let Some(opener) = opener
            && tgid_of(pid).is_some_and(|t| t != *opener)
        {
            debug!(
                fh,
                pid, "flush from another process: not a close of the writer"
            );
            return Ok(());
        }
        let staged = match &*state.lock().await {
            WriteState::Staged(shared) => Some(Arc::clone(shared)),
            WriteState::Stream(_) => None,
        };
        // A file made here and never uploaded exists once a descriptor that may write it is closed.
        let never_uploaded = *writable && self.sb.table().get(*ino).is_some_and(|n| n.is_local());
        match staged {
            // Only a handle that changed the file uploads at its close; the others leave that to the writers.
            Some(shared) if wrote.swap(false, Ordering::SeqCst) || never_uploaded => {
                self.upload_staged(*ino, &shared).await
            }
            Some(_) => Ok(()),
            None => self.fsync(fh).await,
        }
    }

    /// Releases every handle still open; returns how many there were. Only after the kernel session ended
    /// (see `fuse::Closing::finish`): a release that fails is logged, as one the kernel sent would be.
    pub async fn release_all_left(&self) -> usize {
        let left: Vec<u64> = self.handles.open().keys().copied().collect();
        for &fh in &left {
            if let Err(e) = self.release(fh).await {
                warn!(fh, error = %e.chain(), "release at unmount failed");
            }
        }
        left.len()
    }

    /// HEADs `node`'s object and records what the bucket holds now in the node (as of when it was asked): an
    /// open or a staging that must know the version it works on.
    async fn head_observed(&self, node: &Node) -> FsResult<crate::s3::ObjectInfo> {
        let asked = std::time::Instant::now();
        let info = self
            .client
            .head_object(node.key())
            .await
            .map_err(|e| FsError::client(node.key(), e))?;
        if let Some(n) = self.sb.table().get_mut(node.ino()) {
            n.observe(super::inode::Stat::of(&info), asked);
        }
        Ok(info)
    }

    /// Drops every handle still open without uploading anything more of it: a streamed file's multipart
    /// upload is aborted, a staged file's local copy goes with its last handle. For a daemon that stops
    /// while its files are open and will not be asked again (see `fuse::MountedFs::unmount`). Returns how
    /// many of those files held bytes the bucket does not have.
    pub async fn abandon_all_left(&self) -> usize {
        let left: Vec<u64> = self.handles.open().keys().copied().collect();
        let mut abandoned = 0;
        // A staged file is counted once, whatever the number of its handles.
        let mut staged_seen = std::collections::HashSet::new();
        for fh in left {
            let Some(handle) = self.handles.remove(fh) else {
                continue;
            };
            let Some((_, state, _)) = handle.as_writer() else {
                continue;
            };
            let mut state = state.lock().await;
            match &mut *state {
                WriteState::Stream(w) => {
                    if w.is_dirty() {
                        abandoned += 1;
                    }
                    w.abort().await;
                }
                WriteState::Staged(shared) => {
                    if staged_seen.insert(Arc::as_ptr(shared))
                        && shared.file.lock().await.is_changed()
                    {
                        abandoned += 1;
                    }
                }
            }
        }
        abandoned
    }

    pub async fn release(&self, fh: u64) -> FsResult<()> {
        let Some(handle) = self.handles.remove(fh) else {
            return Ok(());
        };
        if let Handle::Read { ino, etag, .. } = handle.as_ref() {
            if let Some(node) = self.sb.table().get_mut(*ino) {
                node.close_read(etag);
            }
            return Ok(());
        }
        let Some((ino, state, counted)) = handle.as_writer() else {
            return Ok(());
        };
        if matches!(handle.as_ref(), Handle::Write { writable: true, .. }) {
            // The handle is gone: it no longer counts against --max-open-writers.
            self.writer_slots.give_back();
        }
        let mut state = state.lock().await;
        let w = match &mut *state {
            WriteState::Staged(shared) => {
                let shared = Arc::clone(shared);
                drop(state);
                return self.release_staged(ino, shared).await;
            }
            WriteState::Stream(w) => w,
        };
        let result = w.commit().await;
        if result.is_err() {
            w.abort().await;
        }
        let uploaded = result.as_ref().ok().and_then(Option::as_ref);
        let carried = (w.attrs(), w.stored_metadata());
        self.writer_gone(ino, counted, uploaded, w.size(), carried);
        result.map(|_| ())
    }

    /// The last of a file's writers (a streaming handle, or a staged file's last handle) is gone, after its
    /// final upload (`uploaded`, of `size` bytes carrying `attrs`, and the object's whole user metadata when
    /// known) or without one: the node stops counting it, and a name that was never uploaded goes away again.
    fn writer_gone(
        &self,
        ino: u64,
        counted: &WriterMark,
        uploaded: Option<&crate::s3::PutResult>,
        size: u64,
        (attrs, metadata): (Option<StoredAttrs>, Option<UserMetadata>),
    ) {
        let mut table = self.sb.table();
        let Some(node) = table.get_mut(ino) else {
            return;
        };
        let restored = match uploaded {
            Some(put) => {
                node.record_own_upload(size, &put.etag, attrs, metadata);
                counted.settled(node);
                false
            }
            None => counted.abandoned(node),
        };
        let parent = node.parent();
        let mut gone = None;
        if node.is_local() && !node.is_being_written() {
            let name = node.name().to_string();
            // Unless its writer's failure took the name away already and a new file has it now.
            if table.detach_if(parent, &name, ino) {
                gone = Some(name);
            }
        }
        drop(table);
        self.sb.invalidate_listing(parent);
        if restored {
            self.tell_kernel(KernelNotice::Attributes(ino));
        }
        if let Some(name) = gone {
            self.tell_kernel(KernelNotice::NameGone { parent, name });
        }
        self.handles.writer_landed.notify_waiters();
    }

    /// A writer failed (a stream, or a staged file for good): its bytes will never reach the bucket (its error stays for its fsync and
    /// close), so the file is at once what the bucket holds again, for stat and for the next open; a file
    /// made here that never got there has no name any more.
    fn writer_failed(&self, ino: u64, counted: &WriterMark) {
        let mut table = self.sb.table();
        let Some(node) = table.get_mut(ino) else {
            return;
        };
        let restored = counted.abandoned(node);
        self.handles.writer_landed.notify_waiters();
        if !restored {
            return;
        }
        let gone = (node.is_local() && !node.is_being_written())
            .then(|| (node.parent(), node.name().to_string()));
        let gone = gone.filter(|(parent, name)| table.detach_if(*parent, name, ino));
        drop(table);
        self.tell_kernel(KernelNotice::Attributes(ino));
        if let Some((parent, name)) = gone {
            self.sb.invalidate_listing(parent);
            self.tell_kernel(KernelNotice::NameGone { parent, name });
        }
    }
}

/// A handle wrote to its staged file: its close uploads.
fn handle_wrote(handle: &Handle) {
    if let Handle::Write { wrote, .. } = handle {
        wrote.store(true, Ordering::SeqCst);
    }
}

/// Thread group (process) id of a thread id, as FUSE reports the calling thread.
fn tgid_of(pid: u32) -> Option<u32> {
    if pid == 0 {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}
