//! rename(2) with handles open on what moves. A staged file and a streaming writer each hold the key they
//! upload to; when their file, or a directory above it, is renamed, the key moves with it, as a descriptor
//! follows its file on a local disk. The handles open when the rename starts are held locked while the objects
//! move (reads and writes through them wait, for a directory rename as long as its copies take), so none of
//! them uploads under the old name after the move. A handle opened during the move is re-keyed right after it.
//! A file the rename replaces is treated as unlinked: its handles go on locally and upload nothing, so they
//! never overwrite what moved in. On a general-purpose bucket the move is a copy, made of the version the
//! handles hold when they all hold the same one, whose new ETag they then expect (see `rename.rs`).
//!
//! Without this, the handles of a file that was closed but whose release had not arrived yet (FUSE sends
//! release after close(2) returns) could be reopened after a rename and upload to the old key.

use std::sync::Arc;

use tokio::sync::MutexGuard as AsyncGuard;

use super::open::Patience;
use super::staging::SharedStaged;
use super::{Handle, WriteState};
use crate::fs::inode::Kind;
use crate::fs::staged::StagedFile;
use crate::fs::superblock::{Pins, Repinned};
use crate::fs::{FsResult, S3Filesystem};

/// What one rename (or unlink) holds: the handles open on what moves and on what it replaces (or removes).
#[derive(Default)]
pub(super) struct Held<'a> {
    staged: Vec<(u64, AsyncGuard<'a, StagedFile>)>,
    writers: Vec<(u64, AsyncGuard<'a, WriteState>)>,
}

impl S3Filesystem {
    /// rename(2): the objects move ([`crate::fs::superblock::Superblock::rename`]), and open handles follow.
    pub async fn rename(
        &self,
        parent: u64,
        name: &str,
        new_parent: u64,
        new_name: &str,
        no_replace: bool,
    ) -> FsResult<()> {
        let patience = Patience::new();
        self.rename_within(parent, name, new_parent, new_name, no_replace, patience)
            .await
    }

    /// [`Self::rename`], its retries after a wait for released writers bounded by the first call's
    /// `patience`.
    async fn rename_within(
        &self,
        parent: u64,
        name: &str,
        new_parent: u64,
        new_name: &str,
        no_replace: bool,
        patience: Patience,
    ) -> FsResult<()> {
        let (moving, replaced) = {
            let table = self.sb.table();
            let moving = table
                .child(parent, name)
                .map(|n| (n.ino(), n.kind(), n.key().to_string()));
            let replaced = table.child(new_parent, new_name).map(|n| n.ino());
            (moving, replaced)
        };
        // A name the table does not know has no handle open on it, nor anything below it.
        let Some((ino, kind, key)) = moving else {
            let no_pins = Pins::new();
            return self
                .sb
                .rename(parent, name, new_parent, new_name, no_replace, &no_pins)
                .await
                .map(drop);
        };
        // A file (or one below a directory) whose last upload is under way: what moves is what it uploads.
        // The file it replaces, too: that upload landing after the move would overwrite the moved file.
        let mut landing: Vec<u64> = match kind {
            Kind::File => vec![ino],
            Kind::Directory => self.sb.table().written_under(&key).collect(),
            Kind::Symlink => Vec::new(),
        };
        landing.extend(replaced.filter(|r| *r != ino));
        let mut waited = false;
        for ino in landing {
            waited |= self.until_released_writer_lands(ino, patience).await?;
        }
        if waited {
            let again =
                self.rename_within(parent, name, new_parent, new_name, no_replace, patience);
            return Box::pin(again).await;
        }
        // A file renamed while open with bytes not uploaded yet (Rust's tempfile `persist`, which safetensors
        // and others use, renames before it closes): they are uploaded first, as fsync would, and the
        // descriptors then follow the rename.
        // Not past what one CopyObject copies on a general-purpose bucket: that rename is refused (EXDEV) and
        // `mv` copies instead, so the writer is not sealed for nothing.
        let size = self.sb.table().get(ino).map_or(0, |n| n.stat().size);
        let copyable = self.sb.can_rename_file_of(size);
        if kind == Kind::File && copyable {
            for (_, handle) in self
                .handles
                .write_handles()
                .into_iter()
                .filter(|(i, _)| *i == ino)
            {
                self.commit_handle(&handle, true).await?;
            }
        }
        let replaced = replaced.filter(|r| *r != ino);
        let concerned = |candidate: u64| {
            candidate == ino
                || Some(candidate) == replaced
                || (kind == Kind::Directory
                    && self
                        .sb
                        .table()
                        .get(candidate)
                        .is_some_and(|n| n.key().starts_with(&key)))
        };
        let mut writers: Vec<(u64, Arc<Handle>)> = self.handles.write_handles();
        writers.retain(|(i, _)| concerned(*i));
        let staged: Vec<(u64, Arc<SharedStaged>)>;
        let mut held = Held::default();
        held.lock_writers(&writers).await;
        // The staged files only now: none of the held writers can stage its bytes any more meanwhile.
        staged = {
            let mut all = self.handles.staged.all();
            all.retain(|(i, _)| concerned(*i));
            all
        };
        held.lock_staged(&staged).await;
        // A writer released since the snapshot (while the moving file's bytes went up, say) is in no list
        // above, and its last upload would land after the move: under the old name, or on what moved onto
        // the replaced one. So the move waits for it, then starts again.
        let mut counted: Vec<u64> = match kind {
            Kind::Directory => self.sb.table().written_under(&key).collect(),
            _ => vec![ino],
        };
        counted.extend(replaced);
        if let Some(unheld) = self.unheld_writer(&counted, &writers, &staged) {
            drop(held);
            if !self.until_released_writer_lands(unheld, patience).await? {
                // A writer opened since the snapshot: the next one has it.
                patience.pause().await?;
            }
            let again =
                self.rename_within(parent, name, new_parent, new_name, no_replace, patience);
            return Box::pin(again).await;
        }
        let pins = held.pins(replaced);
        let repinned = self
            .sb
            .rename(parent, name, new_parent, new_name, no_replace, &pins)
            .await?;
        self.follow(&mut held, replaced, &repinned).await;
        drop(held);
        let moved_here = |candidate: u64| {
            let table = self.sb.table();
            let new_key = table.get(ino).map(|n| n.key().to_string());
            candidate == ino
                || (kind == Kind::Directory
                    && new_key.is_some_and(|k| {
                        table
                            .get(candidate)
                            .is_some_and(|n| n.key().starts_with(&k))
                    }))
        };
        self.rekey_late(&writers, &staged, moved_here).await;
        Ok(())
    }

    /// The first of `inodes` counting more writers than `writers` and `staged` (held by the caller) account
    /// for, if any.
    fn unheld_writer(
        &self,
        inodes: &[u64],
        writers: &[(u64, Arc<Handle>)],
        staged: &[(u64, Arc<SharedStaged>)],
    ) -> Option<u64> {
        let held = |ino: u64| {
            let handles = writers
                .iter()
                .filter(|(i, h)| *i == ino && h.as_writer().is_some_and(|(_, _, m)| m.counts()))
                .count();
            let files = staged
                .iter()
                .filter(|(i, s)| *i == ino && s.counted.counts())
                .count();
            handles + files
        };
        let table = self.sb.table();
        inodes.iter().copied().find(|&ino| {
            table
                .get(ino)
                .is_some_and(|n| n.writer_count() as usize > held(ino))
        })
    }

    /// Handles of what moved (`moved_here`) opened or staged while the objects moved, so not held, may carry
    /// a key from before the move: each takes its node's key now. Others are not touched (nor waited for).
    async fn rekey_late(
        &self,
        writers: &[(u64, Arc<Handle>)],
        staged: &[(u64, Arc<SharedStaged>)],
        moved_here: impl Fn(u64) -> bool,
    ) {
        let key_of = |ino: u64| self.sb.table().get(ino).map(|n| n.key().to_string());
        for (ino, handle) in self.handles.write_handles() {
            if !moved_here(ino) || writers.iter().any(|(_, h)| Arc::ptr_eq(h, &handle)) {
                continue;
            }
            let (Some((_, state, _)), Some(key)) = (handle.as_writer(), key_of(ino)) else {
                continue;
            };
            if let WriteState::Stream(w) = &mut *state.lock().await
                && w.key != key
                && !w.is_discarded()
            {
                w.moved(key, None);
            }
        }
        for (ino, shared) in self.handles.staged.all() {
            if !moved_here(ino) || staged.iter().any(|(_, s)| Arc::ptr_eq(s, &shared)) {
                continue;
            }
            let Some(key) = key_of(ino) else { continue };
            let mut file = shared.file.lock().await;
            if file.key() != key && !file.is_discarded() {
                file.moved(&key, None);
            }
        }
    }

    /// After the move: handles of what moved take its new keys (and the ETags of the copies, where the move
    /// copied); those of the replaced file upload nothing.
    async fn follow(&self, held: &mut Held<'_>, replaced: Option<u64>, repinned: &Repinned) {
        if let Some(replaced) = replaced {
            held.discard(replaced).await;
        }
        let key_of = |ino: u64| self.sb.table().get(ino).map(|n| n.key().to_string());
        for (ino, file) in &mut held.staged {
            if Some(*ino) != replaced
                && let Some(key) = key_of(*ino)
            {
                file.moved(&key, repinned.get(&key).map(String::as_str));
            }
        }
        for (ino, state) in &mut held.writers {
            if let WriteState::Stream(writer) = &mut **state
                && Some(*ino) != replaced
                && let Some(key) = key_of(*ino)
            {
                let etag = repinned.get(&key).cloned();
                writer.moved(key, etag.as_deref());
            }
        }
    }
}

impl Held<'_> {
    /// The versions the held handles of moving files are in sync with, by their keys.
    fn pins(&self, replaced: Option<u64>) -> Pins {
        let staged = self
            .staged
            .iter()
            .filter(|(ino, _)| Some(*ino) != replaced)
            .filter_map(|(_, f)| Some((f.key().to_string(), f.pinned_version()?.to_string())));
        let streamed = self
            .writers
            .iter()
            .filter(|(ino, _)| Some(*ino) != replaced)
            .filter_map(|(_, state)| match &**state {
                WriteState::Stream(w) => Some((w.key.clone(), w.pinned_version()?.to_string())),
                WriteState::Staged(_) => None,
            });
        // Two handles of one key holding different versions: pin neither (their uploads then fail on
        // the copy's new ETag instead of one of them replacing it).
        let mut pins: std::collections::HashMap<String, Option<String>> = Default::default();
        for (key, etag) in staged.chain(streamed) {
            pins.entry(key)
                .and_modify(|pin| {
                    if pin.as_deref() != Some(etag.as_str()) {
                        *pin = None;
                    }
                })
                .or_insert(Some(etag));
        }
        pins.into_iter()
            .filter_map(|(key, etag)| Some((key, etag?)))
            .collect()
    }
}

impl<'a> Held<'a> {
    /// The file `ino` has no name any more (unlinked, or replaced by a rename): its held handles go on
    /// locally and upload nothing (a streaming writer's bytes move to a staged file at its next write or read,
    /// [`crate::fs::write::Writer::discard`]).
    pub(super) async fn discard(&mut self, ino: u64) {
        for (_, file) in self.staged.iter_mut().filter(|(i, _)| *i == ino) {
            file.discard();
        }
        for (_, state) in self.writers.iter_mut().filter(|(i, _)| *i == ino) {
            if let WriteState::Stream(writer) = &mut **state {
                writer.discard().await;
            }
        }
    }

    /// Locks `writers` in inode order (two renames never wait on each other crosswise). Writers come before
    /// staged files, the order of the other paths that hold both (a writer, then its staged file).
    pub(super) async fn lock_writers(&mut self, writers: &'a [(u64, Arc<Handle>)]) {
        let mut writers: Vec<&(u64, Arc<Handle>)> = writers.iter().collect();
        writers.sort_by_key(|(ino, handle)| (*ino, Arc::as_ptr(handle) as usize));
        for (ino, handle) in writers {
            if let Some((_, state, _)) = handle.as_writer() {
                self.writers.push((*ino, state.lock().await));
            }
        }
    }

    /// Locks `staged` in inode order, after the writers.
    pub(super) async fn lock_staged(&mut self, staged: &'a [(u64, Arc<SharedStaged>)]) {
        let mut staged: Vec<&(u64, Arc<SharedStaged>)> = staged.iter().collect();
        staged.sort_by_key(|(ino, _)| *ino);
        for (ino, shared) in staged {
            self.staged.push((*ino, shared.file.lock().await));
        }
    }
}
