//! Opening files: what an open or a create makes of a node (a reader, a streaming writer, a staged file or
//! a handle on one already staged), and a small file's first open bringing its bytes to the page cache.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Mutex as AsyncMutex;

use super::{Handle, SharedStaged, WriteState, WriterMark};
use crate::fs::attrs::StoredAttrs;
use crate::fs::inode::{Kind, Node, ReadOpening, Stat};
use crate::fs::read::Reader;
use crate::fs::superblock::{New, check_key, check_name};
use crate::fs::write::{Writer, WriterOptions};
use crate::fs::{
    Attr, FsError, FsResult, KernelNotice, OpenMode, Opened, S3Filesystem, names, preload,
};
use crate::s3::{PutResult, WriteCondition};

/// How long a change by name waits for closed writers' final uploads (one part and the completion at most,
/// as a streaming writer's release sends), over all its retries, before it fails with EBUSY.
const LANDING_WAIT: Duration = Duration::from_secs(60);
/// How often that wait looks again without a notice.
const LANDING_RECHECK: Duration = Duration::from_millis(50);

/// When one call by name stops waiting for released writers ([`LANDING_WAIT`] from its start). The call
/// carries it through its retries, so writers that keep closing under a renamed directory cannot keep it
/// waiting for ever.
#[derive(Debug, Clone, Copy)]
pub(super) struct Patience {
    until: Instant,
}

impl Patience {
    pub(super) fn new() -> Self {
        Self::for_at_most(LANDING_WAIT)
    }

    pub(super) fn for_at_most(wait: Duration) -> Self {
        Self {
            until: Instant::now() + wait,
        }
    }

    fn ran_out(self) -> bool {
        Instant::now() >= self.until
    }

    /// A short pause before a call looks again at what it found in flux, or EBUSY once it ran out.
    pub(super) async fn pause(self) -> FsResult<()> {
        if self.ran_out() {
            return Err(FsError::Busy("the file is being written"));
        }
        tokio::time::sleep(LANDING_RECHECK).await;
        Ok(())
    }
}

impl S3Filesystem {
    /// Before an open or a truncation of `ino` touches its page cache: voids a first open's preload not
    /// stored yet (or waits for its store to end; [`super::preload`]) and marks the cache used. With
    /// `may_fill`, if the cache had never been used, returns the right to fill it.
    pub(super) fn claim_page_cache(
        &self,
        ino: u64,
        may_fill: bool,
    ) -> Option<preload::Reservation> {
        let (taken, reservation) = {
            // Under the table's lock, claims of one inode are ordered: the first finds it unused, any later
            // one takes the first's reservation.
            let mut table = self.sb.table();
            let unused = table.get_mut(ino).is_some_and(|n| n.claim_page_cache());
            let taken = self.preloads.take(ino);
            (
                taken,
                (unused && may_fill).then(|| self.preloads.reserve(ino)),
            )
        };
        if let Some(slot) = taken {
            preload::void(&slot);
        }
        reservation
    }

    pub async fn open(&self, ino: u64, mode: OpenMode, pid: u32) -> FsResult<Opened> {
        // The kernel found the node by a name before another process (or client) removed or replaced it. A
        // local file system would open the old inode; here its object is gone or is someone else's now. The
        // answer is ESTALE, which makes the kernel walk the path again once and open what the name is now:
        // the new file, a file O_CREAT makes anew, or ENOENT. Before, `open(name, "ab")` racing an unlink
        // failed with ENOENT although it creates. A file whose bytes live here (open for writing, or staged)
        // opens whatever its name: /proc/self/fd/N reopens a temporary file unlinked while open.
        if !self.sb.stands_for_its_name(ino) && !self.holds_bytes_of(ino) {
            return Err(FsError::Stale);
        }
        match self.open_node(ino, mode, pid).await {
            Err(FsError::NotFound) => {
                self.sb.forget_vanished(ino);
                Err(FsError::Stale)
            }
            opened => opened,
        }
    }

    /// Whether the bytes of `ino` are here rather than in the bucket: staged, or a writer's.
    fn holds_bytes_of(&self, ino: u64) -> bool {
        self.handles.staged.peek(ino).is_some()
            || self.sb.node(ino).is_ok_and(|n| n.is_being_written())
    }

    async fn open_node(&self, ino: u64, mode: OpenMode, pid: u32) -> FsResult<Opened> {
        let mut node = self.sb.node(ino)?;
        match node.kind() {
            Kind::Directory => return Err(FsError::IsADirectory),
            // The kernel follows links itself; it opens one only when asked not to follow it.
            Kind::Symlink => return Err(FsError::SymlinkLoop),
            Kind::File => {}
        }
        if mode.write && self.config.read_only {
            return Err(FsError::ReadOnly);
        }
        // A plain read open of a file never opened before may fill its page cache.
        let plain_read = !mode.write && !mode.direct && !mode.truncate && !mode.not_for_reading;
        let first_open = self.claim_page_cache(ino, plain_read);
        let patience = Patience::new();
        // The node's stat is a failed writer's, not the bucket's: this open asks the bucket.
        let mut stat_is_a_failed_writers = false;
        for attempt in 1.. {
            if attempt > 3 {
                return Err(FsError::Busy("the file is being written"));
            }
            // A writer released with its final upload under way: what this opens is what it uploads
            // (close-to-open), not the version before it; and once uploaded, a file made here is an object
            // like any other for the check below.
            if node.is_being_written() && self.until_released_writer_lands(ino, patience).await? {
                // An upload that failed (another client made the object first, say) leaves the name to
                // whatever the bucket holds: what this open would write over is no longer ours.
                if !self.sb.stands_for_its_name(ino) && !self.holds_bytes_of(ino) {
                    return Err(FsError::Stale);
                }
                node = self.sb.node(ino)?;
            }
            if mode.write && mode.truncate && !self.config.allow_overwrite && !node.is_local() {
                return Err(FsError::NotPermitted(
                    "overwriting an object needs --allow-overwrite",
                ));
            }
            // Open already, staged: every handle shares the one staged file. One whose changes failed for
            // good (its close said EIO, its release has not come yet) is shared with no new open: it leaves
            // the table to its own handles, and the file is again what the bucket holds.
            if let Some(shared) = self.handles.staged.attach(ino) {
                // Not waited for: a file whose lock is held is being uploaded, not failed yet.
                let failed = shared.file.try_lock().is_ok_and(|file| file.has_failed());
                if !failed {
                    return self.open_staged(ino, shared, mode, pid).await;
                }
                self.unlist_failed(ino, &shared);
                let _ = self.release_staged(ino, shared).await;
                node = self.sb.node(ino)?;
                stat_is_a_failed_writers = true;
                break;
            }
            // Being written by a streaming writer: its bytes move to a staged file both handles share. A
            // reader of a file whose writer has uploaded everything reads the bucket, as any other reader.
            let writers = if mode.write || node.is_being_written() {
                self.handles.writers_of(ino)
            } else {
                Vec::new()
            };
            if !self.stage_a_live_writer(ino, writers).await? {
                break;
            }
            // Joined at the top of the next round. FUSE sends release after close(2) has returned: the
            // writer, or the staged file made from it, may go with its last release meanwhile, and then what
            // is there now is another question.
            node = self.sb.node(ino)?;
        }
        if mode.write {
            let fh = self.open_existing_for_write(&node, mode, pid).await?;
            if let Some(n) = self.sb.table().get_mut(ino) {
                n.drop_page_cache();
            }
            return Ok(fh);
        }
        // Refresh the ETag if our view is stale, so reads are pinned to what exists now.
        let attr_fresh = !mode.direct
            && !stat_is_a_failed_writers
            && node.is_fresh(Instant::now())
            && node.stat().etag.is_some();
        let (size, etag) = if attr_fresh {
            self.sb.note_fresh_open(&node);
            (
                node.stat().size,
                node.stat().etag.clone().unwrap_or_default(),
            )
        } else {
            let info = self.head_observed(&node).await?;
            let expires = self.sb.expiry();
            if let Some(n) = self.sb.table().get_mut(ino) {
                n.trust_until(expires);
            }
            (info.size, info.etag)
        };
        let first = (!mode.direct)
            .then(|| self.sb.take_first_bytes(node.key(), &etag))
            .flatten();
        let mut reader = Reader::new(
            Arc::clone(self.sources.for_open(mode.direct)),
            node.key().to_string(),
            etag.clone(),
            size,
            self.config.read_part_size,
            self.config.max_prefetch,
            Arc::clone(&self.config.memory),
        )
        .sharing_read_ahead(Arc::clone(&self.read_ahead))
        .with_first_bytes(first);
        let bypass_page_cache = mode.direct
            || (size >= self.config.direct_io_threshold
                && self.direct_io_for_big_files.load(Ordering::Relaxed));
        let (opening, stale_size) = match self.sb.table().get_mut(ino) {
            Some(n) => (
                n.open_read(&etag, bypass_page_cache),
                n.take_stale_kernel_size(),
            ),
            None => (
                ReadOpening {
                    keep_cache: false,
                    bypass: bypass_page_cache,
                },
                false,
            ),
        };
        let ReadOpening {
            keep_cache,
            bypass: bypass_page_cache,
        } = opening;
        if stale_size {
            // Told before the open is answered: a read through the page cache past the old size asks for
            // the attributes again instead of stopping there.
            self.tell_kernel(KernelNotice::Attributes(ino));
        }
        // A small file the kernel has never cached: its bytes go into the page cache with the answer to
        // this open, which saves the READ round trip of the first read. Otherwise its GET starts now, to run
        // while the opener is between open(2) and read(2), unless the opener said it will not read (rsync
        // opens its temporary file O_NONBLOCK to fchmod it, `expressfs warm` to fetch it in the daemon).
        let mut preload = None;
        if let Some(reservation) = first_open.filter(|_| !bypass_page_cache) {
            preload = reader
                .whole_small_file()
                .await
                .map(|bytes| reservation.with_bytes(bytes));
        } else if !keep_cache && !mode.direct && !mode.not_for_reading {
            reader.fetch_small_file_at_open();
        }
        let fh = self.handles.add(Handle::Read {
            ino,
            etag,
            reader: AsyncMutex::new(reader),
            saw_edit: AtomicBool::new(false),
        });
        Ok(Opened {
            fh,
            keep_cache,
            bypass_page_cache,
            no_flush: true,
            preload,
        })
    }

    /// `attrs`: what the object is to carry with `--preserve-metadata` (times but atime are the upload's).
    fn writer_options(&self, condition: WriteCondition, attrs: StoredAttrs) -> WriterOptions {
        WriterOptions {
            attrs: self.config.preserve_metadata.then_some(StoredAttrs {
                mtime: None,
                ..attrs
            }),
            part_size: self.config.write_part_size as usize,
            condition,
            staging_dir: self.config.staging_dir.clone(),
            staging_limit: self.config.staging_limit,
            memory: Arc::clone(&self.config.memory),
            parts_in_flight: self.config.upload_parts_in_flight,
        }
    }

    /// A new handle on the staged file `shared` (attached already); O_TRUNC empties it. The writer's slot is
    /// taken first: an open refused changes nothing the other descriptors share.
    async fn open_staged(
        &self,
        ino: u64,
        shared: Arc<SharedStaged>,
        mode: OpenMode,
        pid: u32,
    ) -> FsResult<Opened> {
        if mode.write
            && let Err(e) = self.writer_slots.reserve()
        {
            let _ = self.release_staged(ino, shared).await;
            return Err(e);
        }
        if mode.write && mode.truncate {
            let mut file = shared.file.lock().await;
            if let Err(e) = file.truncate(0) {
                drop(file);
                self.writer_slots.give_back();
                let _ = self.release_staged(ino, shared).await;
                return Err(e);
            }
            self.note_staged(ino, &shared, &file);
        }
        Ok(self.staged_handle(ino, shared, mode, pid))
    }

    /// A write handle open on `ino` whose bytes may still reach the bucket, if any: one whose upload failed
    /// keeps its error to itself, and one released while we waited for its lock is gone.
    pub(super) async fn live_writer_for(&self, ino: u64) -> Option<Arc<Handle>> {
        for writer in self.handles.writers_of(ino) {
            let (_, state, _) = writer.as_writer().expect("a write handle");
            let failed = state.lock().await.has_failed();
            if !failed && self.handles.is_open(&writer) {
                return Some(writer);
            }
        }
        None
    }

    /// Waits while `ino` is being written by a writer no handle reaches any more: released (or a staged
    /// file's last handle closed) with its final upload under way. Meanwhile a change by name has nothing to
    /// ride on (stored on the old version, that upload would replace it), a rename would find the file busy,
    /// and an unlink would see the upload bring the object back; so the caller waits here, then starts again
    /// from what landed. True if it waited. Gives up with EBUSY once the call's `patience` runs out rather
    /// than lose a change.
    pub(super) async fn until_released_writer_lands(
        &self,
        ino: u64,
        patience: Patience,
    ) -> FsResult<bool> {
        let mut waited = false;
        loop {
            let landed = self.handles.writer_landed.notified();
            tokio::pin!(landed);
            // Registered before the look, so a writer landing right after it still wakes us.
            landed.as_mut().enable();
            let busy = self
                .sb
                .table()
                .get(ino)
                .is_some_and(|n| n.is_being_written());
            if !busy
                || self.handles.staged.peek(ino).is_some()
                || self.live_writer_for(ino).await.is_some()
            {
                return Ok(waited);
            }
            if patience.ran_out() {
                return Err(FsError::Busy(
                    "a closed writer of the file is still uploading",
                ));
            }
            waited = true;
            // Looked at again now and then as well: the notice is a shortcut, not the rule.
            let _ = tokio::time::timeout(LANDING_RECHECK, landed).await;
        }
    }

    /// Stages the first of `writers` (write handles of `ino`) whose bytes may still reach the bucket, for a
    /// new open to share. True when the file changed meanwhile (staged, or a writer released while we waited
    /// for its lock), so the caller looks at it again. A writer whose upload failed is passed over: it keeps
    /// its error to itself, and as its bytes never get there, the new open starts from what the bucket holds.
    async fn stage_a_live_writer(&self, ino: u64, writers: Vec<Arc<Handle>>) -> FsResult<bool> {
        for writer in writers {
            let (_, state, counted) = writer.as_writer().expect("a write handle");
            let mut state = state.lock().await;
            if !self.handles.is_open(&writer) {
                return Ok(true);
            }
            if state.failure().is_some() {
                continue;
            }
            self.stage_writer(ino, &writer, &mut state, counted, false)
                .await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// For an O_APPEND open: the kernel writes at the end it knows, so it must know the object's size. When a
    /// listing or a HEAD found the size changed (another client appended) after the kernel was told, the open
    /// answers ESTALE: the kernel looks the name up again, learns the size, and opens again.
    fn kernel_knows_the_size(&self, ino: u64) -> FsResult<()> {
        let stale = self
            .sb
            .table()
            .get_mut(ino)
            .is_some_and(|n| n.take_stale_kernel_size());
        if stale { Err(FsError::Stale) } else { Ok(()) }
    }

    /// An existing object opened for writing: O_TRUNC streams a new version; O_APPEND with
    /// `--incremental-upload` on a directory bucket appends natively; anything else edits a staged copy.
    async fn open_existing_for_write(
        &self,
        node: &Node,
        mode: OpenMode,
        pid: u32,
    ) -> FsResult<Opened> {
        let writer = if mode.truncate {
            // A rewritten file keeps its mode and owner. A file made here that never became an object
            // stays new: if an object appeared under its name meanwhile, it is not ours to replace.
            let kept = node.stat().attrs.unwrap_or_default();
            let condition = if node.is_local() && !self.config.allow_overwrite {
                WriteCondition::IfNoneMatch
            } else {
                WriteCondition::None
            };
            Writer::new(
                Arc::clone(&self.client),
                node.key().to_string(),
                self.writer_options(condition, kept),
            )
        } else if self.config.incremental_upload
            && self.client.is_directory_bucket()
            && (mode.append || !self.config.allow_overwrite)
        {
            let info = self.head_observed(node).await?;
            if mode.append {
                self.kernel_knows_the_size(node.ino())?;
            }
            Writer::append(
                Arc::clone(&self.client),
                node.key().to_string(),
                PutResult {
                    etag: info.etag,
                    size: Some(info.size),
                },
                self.writer_options(
                    WriteCondition::None,
                    StoredAttrs::from_metadata(&info.metadata),
                ),
            )
        } else if self.config.allow_overwrite {
            // An append checks the kernel's size first; the staged file starts from what that HEAD found.
            let seen = if mode.append {
                let info = self.head_observed(node).await?;
                self.kernel_knows_the_size(node.ino())?;
                Some(info)
            } else {
                None
            };
            self.writer_slots.reserve()?;
            let shared = match self.stage_object(node, seen).await {
                Ok(shared) => shared,
                Err(e) => {
                    self.writer_slots.give_back();
                    return Err(e);
                }
            };
            return Ok(self.staged_handle(node.ino(), shared, mode, pid));
        } else {
            return Err(FsError::NotPermitted(
                "changing an existing object needs --allow-overwrite (or, to append on a directory bucket, --incremental-upload)",
            ));
        };
        self.writer_slots.reserve()?;
        let size = writer.size();
        let counted = {
            let mut table = self.sb.table();
            let mut node = table.get_mut(node.ino());
            // Counted first: the node keeps what the bucket holds, should this writer's bytes never get there.
            let counted = WriterMark::start(node.as_deref_mut());
            if let Some(n) = node {
                n.set_size(size);
            }
            counted
        };
        let fh = self.handles.add(Handle::write_handle(
            node.ino(),
            WriteState::Stream(Box::new(writer)),
            pid,
            counted,
        ));
        Ok(Opened {
            fh,
            keep_cache: false,
            bypass_page_cache: self.writes_bypass_page_cache(),
            no_flush: false,
            preload: None,
        })
    }

    /// Creates a new file, open for writing. Fails if the name exists (unless overwriting is allowed).
    pub async fn create(&self, parent: u64, name: &str, pid: u32) -> FsResult<(Attr, u64)> {
        self.create_as(parent, name, pid, StoredAttrs::default())
            .await
    }

    /// mknod(2) of a regular file: an empty object, uploaded at once, since no handle is left open to
    /// upload it later.
    pub async fn mknod_file(
        &self,
        parent: u64,
        name: &str,
        pid: u32,
        owner: StoredAttrs,
    ) -> FsResult<Attr> {
        let (created, fh) = self.create_as(parent, name, pid, owner).await?;
        let flushed = self.flush(fh, pid).await;
        let released = self.release(fh).await;
        flushed.and(released)?;
        self.sb.getattr(created.ino).await
    }

    /// [`Self::create`] by `owner` (the creator's mode, uid and gid, kept with `--preserve-metadata`).
    pub async fn create_as(
        &self,
        parent: u64,
        name: &str,
        pid: u32,
        owner: StoredAttrs,
    ) -> FsResult<(Attr, u64)> {
        if self.config.read_only {
            return Err(FsError::ReadOnly);
        }
        check_name(name)?;
        let parent_node = self.sb.dir_node(parent)?;
        let key = names::file_key(parent_node.key(), name);
        check_key(&key)?;
        if self
            .sb
            .table()
            .child(parent, name)
            .is_some_and(|n| n.is_pending())
        {
            return Err(FsError::Exists);
        }
        let condition = match self
            .sb
            .resolve_file_or_dir(&parent_node, name, New::File)
            .await?
        {
            Some((Kind::Directory | Kind::Symlink, _)) => return Err(FsError::Exists),
            Some((Kind::File, _)) if !self.config.allow_overwrite => return Err(FsError::Exists),
            Some((Kind::File, _)) => WriteCondition::None,
            None if self.config.allow_overwrite => WriteCondition::None,
            None => WriteCondition::IfNoneMatch,
        };
        self.writer_slots.reserve()?;
        // Dated when made, as on a local disk: with --preserve-metadata, stat shows from the start the time
        // the upload carries if nothing is written (a write dates it again).
        let owner = StoredAttrs {
            mtime: Some(SystemTime::now()),
            ..owner
        };
        let mut options = self.writer_options(condition, owner);
        options.attrs = options.attrs.map(|_| owner);
        let writer = Writer::new(Arc::clone(&self.client), key, options);
        let (attr, counted) = {
            let mut table = self.sb.table();
            let stat = Stat::new_file(self.config.preserve_metadata.then_some(owner));
            let ino = table.upsert(
                parent,
                name,
                Kind::File,
                stat,
                self.sb.expiry(),
                Instant::now(),
            );
            table.add_lookup(ino);
            let node = table.get_mut(ino).expect("just inserted");
            node.mark_local();
            let counted = WriterMark::start(Some(&mut *node));
            node.set_size(0);
            (self.sb.attr_of(node), counted)
        };
        self.sb.forget_missing(parent, name);
        self.sb.invalidate_listing(parent);
        let fh = self.handles.add(Handle::write_handle(
            attr.ino,
            WriteState::Stream(Box::new(writer)),
            pid,
            counted,
        ));
        Ok((attr, fh))
    }
}
