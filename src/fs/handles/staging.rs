//! Staged files shared by the handles of an inode: the registry ([`StagedFiles`]) and the handle operations
//! that make, reach and close them. One rule lives here: a staged file exists while a handle is attached to
//! it, every handle of its inode opened meanwhile attaches to it, and the last one to go uploads it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Mutex as AsyncMutex;
use tracing::warn;

use super::{Handle, WriteState, WriterMark, tgid_of};
use crate::fs::attrs::StoredAttrs;
use crate::fs::inode::{Kind, Node};
use crate::fs::staged::{StagedFile, StagingContext};
use crate::fs::{FsError, FsResult, OpenMode, Opened, S3Filesystem};

/// A staged file and the handles attached to it.
pub struct SharedStaged {
    pub(super) file: AsyncMutex<StagedFile>,
    /// Handles attached; changed only under the registry's lock.
    handles: AtomicUsize,
    /// Counts as one writer of its node while it holds changes the bucket lacks.
    pub(super) counted: WriterMark,
}

/// The staged files of a mount, by inode.
#[derive(Default)]
pub struct StagedFiles {
    by_ino: Mutex<HashMap<u64, Arc<SharedStaged>>>,
    /// How many there are: a read through a plain read handle looks here first without the lock.
    len: AtomicUsize,
}

impl StagedFiles {
    fn map(&self) -> MutexGuard<'_, HashMap<u64, Arc<SharedStaged>>> {
        self.by_ino.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The staged file of `ino`, attached for one more handle.
    pub(super) fn attach(&self, ino: u64) -> Option<Arc<SharedStaged>> {
        let map = self.map();
        let shared = map.get(&ino)?;
        shared.handles.fetch_add(1, Ordering::SeqCst);
        Some(Arc::clone(shared))
    }

    /// The staged file of `ino`, not attached: reads through handles opened before it was staged see what
    /// was written since.
    pub(super) fn peek(&self, ino: u64) -> Option<Arc<SharedStaged>> {
        if self.len.load(Ordering::SeqCst) == 0 {
            return None;
        }
        self.map().get(&ino).cloned()
    }

    /// Whether `shared` is still the staged file of `ino` (its last release has not removed it).
    pub(super) fn holds(&self, ino: u64, shared: &Arc<SharedStaged>) -> bool {
        self.map().get(&ino).is_some_and(|s| Arc::ptr_eq(s, shared))
    }

    /// Every staged file, with its inode.
    pub(super) fn all(&self) -> Vec<(u64, Arc<SharedStaged>)> {
        self.map()
            .iter()
            .map(|(ino, shared)| (*ino, Arc::clone(shared)))
            .collect()
    }

    /// Registers `file` for `ino`, attached for one handle; None (and `file` dropped) if `ino` has one.
    fn insert(&self, ino: u64, file: StagedFile, counted: WriterMark) -> Option<Arc<SharedStaged>> {
        let mut map = self.map();
        if map.contains_key(&ino) {
            return None;
        }
        let shared = Arc::new(SharedStaged {
            file: AsyncMutex::new(file),
            handles: AtomicUsize::new(1),
            counted,
        });
        map.insert(ino, Arc::clone(&shared));
        self.len.store(map.len(), Ordering::SeqCst);
        Some(shared)
    }

    /// Takes `shared` (a staged file whose changes failed for good) out of the table: its own handles keep it,
    /// and their error, while new opens and changes by name start again from what the bucket holds.
    pub(super) fn unlist(&self, ino: u64, shared: &Arc<SharedStaged>) {
        let mut map = self.map();
        if map.get(&ino).is_some_and(|s| Arc::ptr_eq(s, shared)) {
            map.remove(&ino);
        }
        self.len.store(map.len(), Ordering::SeqCst);
    }

    /// One handle fewer; true if it was the last.
    fn detach(&self, shared: &SharedStaged) -> bool {
        let _map = self.map();
        shared.handles.fetch_sub(1, Ordering::SeqCst) == 1
    }

    /// Forgets `shared` unless a handle attached to it meanwhile; true if it is gone.
    fn remove_if_unused(&self, ino: u64, shared: &Arc<SharedStaged>) -> bool {
        let mut map = self.map();
        if shared.handles.load(Ordering::SeqCst) > 0 {
            return false;
        }
        if map.get(&ino).is_some_and(|s| Arc::ptr_eq(s, shared)) {
            map.remove(&ino);
        }
        self.len.store(map.len(), Ordering::SeqCst);
        true
    }
}

impl S3Filesystem {
    fn staging_context(&self) -> Option<StagingContext> {
        Some(StagingContext {
            client: Arc::clone(&self.client),
            source: Arc::clone(&self.sources.cached),
            dir: self.config.staging_dir.clone()?,
            limit: self.config.staging_limit,
            part_size: self.config.write_part_size,
            parts_in_flight: self.config.upload_parts_in_flight,
        })
    }

    /// An existing object opened for writing without O_TRUNC (or truncated while closed): a staged file of
    /// the version there now, nothing fetched yet. A second such open shares the first one's.
    /// `seen`: what a HEAD just asked for this open found (else this asks).
    pub(super) async fn stage_object(
        &self,
        node: &Node,
        seen: Option<crate::s3::ObjectInfo>,
    ) -> FsResult<Arc<SharedStaged>> {
        let ctx = self.staging_context().ok_or(FsError::NotPermitted(
            "changing an existing object needs a staging directory",
        ))?;
        let info = match seen {
            Some(info) => info,
            None => self.head_observed(node).await?,
        };
        let attrs = self
            .config
            .preserve_metadata
            .then(|| StoredAttrs::of_object(&info));
        let file = StagedFile::of_object(ctx, node.key(), &info, attrs)?;
        if let Some(n) = self.sb.table().get_mut(node.ino()) {
            n.drop_page_cache();
        }
        match self
            .handles
            .staged
            .insert(node.ino(), file, WriterMark::idle())
        {
            Some(shared) => Ok(shared),
            None => self
                .handles
                .staged
                .attach(node.ino())
                .ok_or(FsError::Busy("the file is being staged")),
        }
    }

    /// Moves the bytes of the streaming writer in `state` (locked by the caller) into a staged file, which
    /// the handle then writes to and is attached to. The node's writer count moves with the bytes. When this
    /// fails for a write (`for_write`), that write's bytes are lost: the writer fails as a whole, so the file
    /// is never uploaded without them.
    /// `owner` is the handle whose state this is: bytes it streamed and has not uploaded become a change of
    /// its own in the staged file, which its close uploads.
    pub(super) async fn stage_writer(
        &self,
        ino: u64,
        owner: &Handle,
        state: &mut WriteState,
        counted: &WriterMark,
        for_write: bool,
    ) -> FsResult<Arc<SharedStaged>> {
        let writer = match state {
            WriteState::Staged(shared) => return Ok(Arc::clone(shared)),
            WriteState::Stream(w) => w,
        };
        // Staged meanwhile by another handle (an open of the object racing this writer): the bytes stay
        // with the writer.
        if self.handles.staged.peek(ino).is_some() {
            return Err(FsError::Busy("the file is staged by another handle"));
        }
        let adopted = match self.staging_context() {
            None => Err(FsError::InvalidArgument(format!(
                "{}: this needs the file staged, and staging is disabled",
                writer.key
            ))),
            Some(ctx) => writer.take_for_staging().await.map(|a| (ctx, a)),
        };
        let (ctx, adopted) = match adopted {
            Ok(a) => a,
            Err(e) if for_write => return Err(writer.refuse(e)),
            Err(e) => return Err(e),
        };
        let attrs = writer.attrs();
        let file = StagedFile::adopt(ctx, &writer.key, adopted, attrs);
        let changed = file.is_changed();
        // Counted once registered: a staged file refused here must not leave the node busy for good.
        let Some(shared) = self.handles.staged.insert(ino, file, WriterMark::idle()) else {
            // Staged by another handle since the look above: the bytes taken cannot go back, so the
            // writer fails as a whole rather than upload without them.
            let e = writer.refuse(FsError::Busy("the file is staged by another handle"));
            self.writer_failed(ino, counted);
            return Err(e);
        };
        if changed {
            super::handle_wrote(owner);
        }
        if let Some(n) = self.sb.table().get_mut(ino) {
            if changed {
                shared.counted.wrote(n);
            }
            counted.settled(n);
        }
        *state = WriteState::Staged(Arc::clone(&shared));
        Ok(shared)
    }

    /// A new handle of `ino` attached to `shared` (already counted in it), its writer's slot already taken if
    /// it writes.
    pub(super) fn staged_handle(
        &self,
        ino: u64,
        shared: Arc<SharedStaged>,
        mode: OpenMode,
        pid: u32,
    ) -> Opened {
        let fh = self.handles.add(Handle::Write {
            ino,
            state: AsyncMutex::new(WriteState::Staged(shared)),
            opener: tgid_of(pid),
            counted: WriterMark::idle(),
            writable: mode.write,
            // O_TRUNC emptied the file (open_staged): that change is this handle's, uploaded at its close.
            wrote: AtomicBool::new(mode.write && mode.truncate),
        });
        // Every handle of a staged file reads around the page cache: what one writes, the others see.
        Opened {
            fh,
            keep_cache: false,
            bypass_page_cache: true,
            no_flush: !mode.write,
            preload: None,
        }
    }

    /// Runs `change` on the staged file of `ino`: through `handle` if it writes to it, else attached for the
    /// change and released after it (which uploads if no other handle is left). None if `ino` is not staged.
    pub(super) async fn change_staged(
        &self,
        ino: u64,
        handle: Option<&Handle>,
        change: impl FnOnce(&mut StagedFile) -> FsResult<()>,
    ) -> Option<FsResult<()>> {
        let own = match handle {
            Some(Handle::Write { state, .. }) => match &*state.lock().await {
                WriteState::Staged(shared) => Some(Arc::clone(shared)),
                WriteState::Stream(_) => None,
            },
            _ => None,
        };
        let (shared, attached) = match own {
            Some(shared) => (shared, false),
            None => (self.handles.staged.attach(ino)?, true),
        };
        let result = {
            let mut file = shared.file.lock().await;
            // A handle found by name may have been released meanwhile, its staged file uploaded and gone
            // (removed under this lock): a change now would be counted and never uploaded. The caller makes
            // it again as on a closed file.
            if !attached && !self.handles.staged.holds(ino, &shared) {
                return None;
            }
            // Found by name but failed for good: not this change's file any more (as for a new open).
            if attached && file.has_failed() {
                drop(file);
                self.unlist_failed(ino, &shared);
                let _ = self.release_staged(ino, shared).await;
                return None;
            }
            let result = change(&mut file);
            self.note_staged(ino, &shared, &file);
            result
        };
        if attached {
            let released = self.release_staged(ino, shared).await;
            return Some(result.and(released));
        }
        Some(result)
    }

    /// A staged file whose changes failed for good leaves the table to its own handles (which keep it, and
    /// its error) and stops counting as a writer: the node is again what the bucket holds, and new opens and
    /// changes by name start from that.
    pub(super) fn unlist_failed(&self, ino: u64, shared: &Arc<SharedStaged>) {
        self.handles.staged.unlist(ino, shared);
        self.writer_failed(ino, &shared.counted);
    }

    /// The staged `file` of `shared` changed (the caller holds its lock): stat shows its size and mtime, and
    /// the node counts the file as a writer until its upload. A file that failed for good changes nothing.
    pub(super) fn note_staged(&self, ino: u64, shared: &SharedStaged, file: &StagedFile) {
        if file.has_failed() {
            return;
        }
        if let Some(n) = self.sb.table().get_mut(ino) {
            // Counted first: the node keeps aside what the bucket holds before the size changes.
            shared.counted.wrote(n);
            n.record_write(file.size(), file.mtime());
        }
    }

    /// Uploads the staged file if it changed (fsync, and close of a handle that wrote).
    pub(super) async fn upload_staged(&self, ino: u64, shared: &SharedStaged) -> FsResult<()> {
        let mut file = shared.file.lock().await;
        let result = file.upload().await;
        if let Ok(put) = &result {
            let expires = self.sb.expiry();
            if let Some(n) = self.sb.table().get_mut(ino) {
                if let Some(put) = put {
                    // Whether a staged upload holds our attributes alone is not known here: a chmod after it asks.
                    n.record_own_upload(file.size(), &put.etag, file.attrs(), None);
                    n.trust_until(expires);
                }
                shared.counted.settled(n);
            }
            self.handles.writer_landed.notify_waiters();
        }
        result.map(|_| ())
    }

    /// A handle attached to `shared` closes: the last one uploads what changed and removes the staged file.
    /// If that upload fails, the local copy is kept and the log says where.
    pub(super) async fn release_staged(&self, ino: u64, shared: Arc<SharedStaged>) -> FsResult<()> {
        if !self.handles.staged.detach(&shared) {
            return Ok(());
        }
        let mut file = shared.file.lock().await;
        let result = file.upload().await;
        if let Err(e) = &result
            && !matches!(e, FsError::ObjectChanged { .. })
        {
            let kept = file.keep_copy();
            warn!(
                key = %file.key(),
                kept = %kept.map(|p| p.display().to_string()).unwrap_or_else(|| "nowhere".into()),
                error = %e.chain(),
                "last close of a staged file: upload failed, local copy kept"
            );
        }
        if !self.handles.staged.remove_if_unused(ino, &shared) {
            // Opened again meanwhile: the new handle carries on with it.
            return result.map(|_| ());
        }
        let uploaded = result.as_ref().ok().and_then(Option::as_ref);
        let carried = (file.attrs(), None);
        self.writer_gone(ino, &shared.counted, uploaded, file.size(), carried);
        result.map(|_| ())
    }

    /// truncate(2) of a file no handle has open: staged for the change and uploaded at once.
    pub(super) async fn truncate_closed(&self, ino: u64, size: u64) -> FsResult<()> {
        let node = self.sb.node(ino)?;
        if node.kind() != Kind::File {
            return Err(FsError::IsADirectory);
        }
        if !self.config.allow_overwrite {
            return Err(FsError::NotPermitted(
                "changing an existing object needs --allow-overwrite",
            ));
        }
        let shared = self.stage_object(&node, None).await?;
        let truncated = {
            let mut file = shared.file.lock().await;
            let r = file.truncate(size);
            self.note_staged(ino, &shared, &file);
            r
        };
        let uploaded = self.release_staged(ino, shared).await;
        truncated.and(uploaded)
    }
}
