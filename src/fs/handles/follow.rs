//! rename(2) with handles open on what moves. A staged file and a streaming writer each hold the key they
//! upload to; when their file, or a directory above it, is renamed, the key moves with it, as a descriptor
//! follows its file on a local disk. While the objects move, none of those handles uploads (each is held
//! locked), so no upload lands under the old name after the copy. A file the rename replaces is treated as
//! unlinked: its handles go on locally and upload nothing, so they never overwrite what moved in. On a
//! general-purpose bucket the move is a copy, made only of the version the handles hold, whose new ETag they
//! then expect.
//!
//! Without this, the handles of a file that was closed but whose release had not arrived yet (FUSE sends
//! release after close(2) returns) could be reopened after a rename and upload to the old key.

use std::sync::Arc;

use tokio::sync::MutexGuard as AsyncGuard;

use super::staging::SharedStaged;
use super::{Handle, WriteState};
use crate::fs::inode::Kind;
use crate::fs::staged::StagedFile;
use crate::fs::superblock::{Pins, Repinned};
use crate::fs::{FsResult, S3Filesystem};

/// What one rename holds: the handles open on what moves and on what it replaces.
struct Held<'a> {
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
        let mut staged: Vec<(u64, Arc<SharedStaged>)> = self.handles.staged.all();
        staged.retain(|(i, _)| concerned(*i));
        let mut writers: Vec<(u64, Arc<Handle>)> = self.handles.write_handles();
        writers.retain(|(i, _)| concerned(*i));
        let mut held = hold(&staged, &writers).await;
        let pins = held.pins(replaced);
        let repinned = self
            .sb
            .rename(parent, name, new_parent, new_name, no_replace, &pins)
            .await?;
        self.follow(&mut held, replaced, &repinned).await;
        Ok(())
    }

    /// After the move: handles of what moved take its new keys (and the ETags of the copies, where the move
    /// copied); those of the replaced file upload nothing.
    async fn follow(&self, held: &mut Held<'_>, replaced: Option<u64>, repinned: &Repinned) {
        let key_of = |ino: u64| self.sb.table().get(ino).map(|n| n.key().to_string());
        for (ino, file) in &mut held.staged {
            if Some(*ino) == replaced {
                file.discard();
            } else if let Some(key) = key_of(*ino) {
                file.moved(&key, repinned.get(&key).map(String::as_str));
            }
        }
        for (ino, state) in &mut held.writers {
            let WriteState::Stream(writer) = &mut **state else {
                continue;
            };
            if Some(*ino) == replaced {
                writer.discard().await;
            } else if let Some(key) = key_of(*ino) {
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

/// Locks every writer, then every staged file, each in inode order: two renames never wait on each other
/// crosswise, and the order is the one of the other paths that hold both (a writer, then its staged file).
async fn hold<'a>(
    staged: &'a [(u64, Arc<SharedStaged>)],
    writers: &'a [(u64, Arc<Handle>)],
) -> Held<'a> {
    let mut held = Held {
        staged: Vec::with_capacity(staged.len()),
        writers: Vec::with_capacity(writers.len()),
    };
    let mut writers: Vec<&(u64, Arc<Handle>)> = writers.iter().collect();
    writers.sort_by_key(|(ino, handle)| (*ino, Arc::as_ptr(handle) as usize));
    for (ino, handle) in writers {
        if let Some((_, state, _)) = handle.as_writer() {
            held.writers.push((*ino, state.lock().await));
        }
    }
    let mut staged: Vec<&(u64, Arc<SharedStaged>)> = staged.iter().collect();
    staged.sort_by_key(|(ino, _)| *ino);
    for (ino, shared) in staged {
        held.staged.push((*ino, shared.file.lock().await));
    }
    held
}
