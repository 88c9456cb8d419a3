//! rename(2) on both bucket kinds.
//!
//! A file on a directory bucket moves with one RenameObject (atomic); on a general-purpose bucket with
//! CopyObject then DeleteObject (not atomic: for a moment both names exist). A directory moves object by
//! object, each the same way, after a listing has counted them against `--max-rename-objects`. Each object
//! is deleted under its old name only once it exists under the new one, so a crash leaves every object
//! under one name or both, never neither (docs/SEMANTICS.md says how to finish by hand).
//!
//! Open handles that go on writing a moved file hold the version they last uploaded ([`Pins`]). On a
//! general-purpose bucket the copy of such an object names that version as its source condition; when the
//! source is that version, the copy's ETag is handed back ([`Repinned`]) so the handles go on from it, and
//! when another client replaced it, the object moves all the same and the handles' next upload fails on
//! their own version. A directory bucket's RenameObject keeps the ETag.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use super::{New, Superblock, check_key, check_name};
use crate::fs::inode::{Kind, Node};
use crate::fs::{FsError, FsResult, names};
use crate::s3::{ClientError, MAX_COPY_OBJECT_SIZE, ObjectClient, ObjectInfo, WriteCondition};

#[cfg(test)]
mod tests;

/// Objects of one directory rename moved at once.
const MOVES_AT_ONCE: usize = 16;

/// ETags that open handles of moving files hold, by the key before the move.
pub type Pins = HashMap<String, String>;

/// The ETags of the copies of pinned objects (general-purpose buckets), by the key after the move.
pub type Repinned = HashMap<String, String>;

impl Superblock {
    /// rename(2) of a file or a directory, on either bucket kind (see the module comment).
    pub async fn rename(
        &self,
        parent: u64,
        name: &str,
        new_parent: u64,
        new_name: &str,
        no_replace: bool,
        pins: &Pins,
    ) -> FsResult<Repinned> {
        let _changing_from = self.changing(parent);
        let _changing_to = self.changing(new_parent);
        if self.config.read_only {
            return Err(FsError::ReadOnly);
        }
        check_name(new_name)?;
        let from_dir = self.dir_node(parent)?;
        let to_dir = self.dir_node(new_parent)?;
        // The node renamed (None: a name the table does not know), its kind, and its size when the bucket
        // was just asked for it.
        let existing = self.table().child(parent, name).cloned();
        let (node, kind, asked_size) = match existing {
            Some(n) => {
                let kind = n.kind();
                (Some(n), kind, None)
            }
            None => match self.resolve(&from_dir, name, false).await? {
                Some((kind, stat)) => (None, kind, Some(stat.size)),
                None => return Err(FsError::NotFound),
            },
        };
        if parent == new_parent && name == new_name {
            return Ok(Repinned::new());
        }
        let moved = match kind {
            Kind::File | Kind::Symlink => {
                let renamed = (node, kind, asked_size);
                let to = (to_dir, new_name);
                self.rename_object(&from_dir, name, to, renamed, no_replace, pins)
                    .await
            }
            Kind::Directory => {
                let to = (to_dir, new_name);
                self.rename_dir(&from_dir, name, to, node, no_replace, pins)
                    .await
            }
        };
        // Whatever the outcome: a move that failed midway may have left objects under the new name.
        self.negative.forget(new_parent, new_name);
        if moved.is_err() {
            // Objects may have moved in under the new name, and into a directory that stood there.
            let mut table = self.table();
            table.doubt_names(new_parent);
            if let Some(there) = table.child(new_parent, new_name).map(Node::ino) {
                table.doubt_names(there);
            }
        }
        moved
    }

    /// A file or a link: one object (a link is its object `name.rclonelink`, see `links.rs`).
    async fn rename_object(
        &self,
        from_dir: &Node,
        name: &str,
        (to_dir, new_name): (Node, &str),
        (node, kind, asked_size): (Option<Node>, Kind, Option<u64>),
        no_replace: bool,
        pins: &Pins,
    ) -> FsResult<Repinned> {
        let to_dir = &to_dir;
        if node.as_ref().is_some_and(|n| n.is_pending()) {
            return Err(FsError::Busy("the file is being written"));
        }
        let key = kind.key(from_dir.key(), name);
        let destination = kind.key(to_dir.key(), new_name);
        check_key(&destination)?;
        let found = match self.resolve_new_name(to_dir, new_name, New::File).await? {
            Some(found) => found,
            None => self.resolve(to_dir, new_name, false).await?,
        };
        let condition = match found {
            Some((Kind::Directory, _)) => return Err(FsError::IsADirectory),
            // Two objects under different names: replacing one by the other is not one request.
            Some((found, _)) if found != kind => {
                return Err(FsError::CrossDevice(
                    "a link and a file cannot replace each other in one rename",
                ));
            }
            Some(_) if no_replace => return Err(FsError::Exists),
            Some(_) if !self.config.allow_overwrite => {
                return Err(FsError::NotPermitted(
                    "replacing an object needs --allow-overwrite",
                ));
            }
            _ if no_replace || !self.config.allow_overwrite => WriteCondition::IfNoneMatch,
            _ => WriteCondition::None,
        };
        if !self.client.is_directory_bucket() {
            // The size the table knows may be stale: ask, unless the bucket was just asked, since a copy
            // past the limit would fail anyway.
            let size = match (&node, asked_size) {
                (_, Some(size)) => size,
                (Some(n), None) if n.stat().size <= MAX_COPY_OBJECT_SIZE => n.stat().size,
                _ => {
                    self.client
                        .head_object(&key)
                        .await
                        .map_err(|e| FsError::client(&key, e))?
                        .size
                }
            };
            refuse_past_copy_limit(&key, size)?;
        }
        let pin = pins.get(&key).map(String::as_str);
        let copied = move_object(self.client.as_ref(), &key, pin, &destination, condition)
            .await
            .map_err(|e| match e {
                FsError::ObjectChanged { .. } => FsError::Exists,
                other => other,
            })?;
        debug!(key, destination, "renamed");
        let repinned: Repinned = copied.map(|etag| (destination, etag)).into_iter().collect();
        let mut table = self.table();
        match node {
            Some(n) => {
                table.rename(from_dir.ino(), name, to_dir.ino(), new_name);
                if let Some(n) = table.get_mut(n.ino()) {
                    n.expire();
                }
            }
            None => {
                // The new name stands for an object the table has no node for.
                table.detach(to_dir.ino(), new_name);
                table.doubt_names(to_dir.ino());
            }
        }
        Ok(repinned)
    }

    async fn rename_dir(
        &self,
        from_dir: &Node,
        name: &str,
        (to_dir, new_name): (Node, &str),
        node: Option<Node>,
        no_replace: bool,
        pins: &Pins,
    ) -> FsResult<Repinned> {
        let to_dir = &to_dir;
        let prefix = names::dir_prefix(from_dir.key(), name);
        let new_prefix = names::dir_prefix(to_dir.key(), new_name);
        if to_dir.key().starts_with(&prefix) {
            return Err(FsError::InvalidArgument(
                "cannot move a directory into itself".into(),
            ));
        }
        if self.table().writing_under(&prefix) {
            return Err(FsError::Busy("a file in the directory is being written"));
        }
        match self.resolve(to_dir, new_name, false).await? {
            Some((Kind::File | Kind::Symlink, _)) => return Err(FsError::NotADirectory),
            Some((Kind::Directory, _)) if no_replace => return Err(FsError::Exists),
            Some((Kind::Directory, _)) => {
                // An empty directory may be replaced; its marker object (if any) does not count.
                let below = self.objects_under(&new_prefix, 1).await?;
                if below.iter().any(|o| o.key != new_prefix) {
                    return Err(FsError::NotEmpty);
                }
            }
            None => {}
        }
        let target = self.table().child(to_dir.ino(), new_name).map(Node::ino);
        if let Some(target) = target
            && !self.table().local_children(target).is_empty()
        {
            return Err(FsError::NotEmpty);
        }
        let limit = self.config.max_rename_objects;
        let objects = self.objects_under(&prefix, limit).await?;
        // Checked before anything moves: a key that would be too long under the new name.
        for o in &objects {
            check_key(&format!("{new_prefix}{}", &o.key[prefix.len()..]))?;
        }
        if objects.len() as u64 > limit {
            warn!(
                prefix,
                limit, "directory rename refused: more objects than --max-rename-objects"
            );
            return Err(FsError::CrossDevice(
                "the directory holds more objects than --max-rename-objects",
            ));
        }
        if !self.client.is_directory_bucket() {
            for o in &objects {
                refuse_past_copy_limit(&o.key, o.size)?;
            }
        } else if objects.iter().any(|o| o.key.ends_with('/') && o.size > 0) {
            // Markers move by being made anew (`make_markers_anew`), which only an empty one can be.
            return Err(FsError::CrossDevice(
                "an object whose key ends in '/' holds bytes: RenameObject cannot move it",
            ));
        }
        let (markers, objects): (Vec<_>, Vec<_>) = objects
            .into_iter()
            .partition(|o| o.key.ends_with('/') && o.size == 0);
        let repinned = self.move_all(&objects, &prefix, &new_prefix, pins).await?;
        make_markers_anew(self.client.as_ref(), &markers, &prefix, &new_prefix).await?;
        debug!(
            prefix,
            new_prefix,
            objects = objects.len(),
            markers = markers.len(),
            "directory renamed"
        );
        {
            let mut table = self.table();
            if let Some(moved) = &node {
                table.rename(from_dir.ino(), name, to_dir.ino(), new_name);
                table.move_keys_under(&prefix, &new_prefix);
                // Listed before the move, under the old prefix: asked about again.
                table.doubt_names(moved.ino());
            } else {
                table.detach(to_dir.ino(), new_name);
                table.doubt_names(to_dir.ino());
            }
        }
        // Everything moved: a marker left behind only brings back an empty directory under the old name.
        if !delete_old_markers(self.client.as_ref(), &markers).await {
            self.table().doubt_names(from_dir.ino());
        }
        Ok(repinned)
    }

    /// The objects under `prefix` (no delimiter), listing no further than `limit + 1` of them.
    async fn objects_under(&self, prefix: &str, limit: u64) -> FsResult<Vec<ObjectInfo>> {
        let mut found = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .client
                .list_objects(prefix, None, token.as_deref(), 1000)
                .await
                .map_err(|e| FsError::client(prefix, e))?;
            found.extend(page.objects);
            token = page.next_continuation_token;
            if token.is_none() || found.len() as u64 > limit {
                return Ok(found);
            }
        }
    }

    /// Moves every object from `prefix` to `new_prefix`, [`MOVES_AT_ONCE`] at a time. Stops sending new
    /// moves at the first failure and reports it once those under way have ended.
    async fn move_all(
        &self,
        objects: &[ObjectInfo],
        prefix: &str,
        new_prefix: &str,
        pins: &Pins,
    ) -> FsResult<Repinned> {
        let mut pending = objects.iter().map(|o| {
            let destination = format!("{new_prefix}{}", &o.key[prefix.len()..]);
            (o.key.clone(), pins.get(&o.key).cloned(), destination)
        });
        let mut repinned = Repinned::new();
        let mut moving = JoinSet::new();
        let mut failure = None;
        loop {
            while failure.is_none() && moving.len() < MOVES_AT_ONCE {
                let Some((key, pin, destination)) = pending.next() else {
                    break;
                };
                let client = Arc::clone(&self.client);
                moving.spawn(async move {
                    // The destination was checked empty: never replace what someone put there since.
                    let copied = move_object(
                        client.as_ref(),
                        &key,
                        pin.as_deref(),
                        &destination,
                        WriteCondition::IfNoneMatch,
                    )
                    .await?;
                    Ok(copied.map(|etag| (destination, etag)))
                });
            }
            let Some(done) = moving.join_next().await else {
                break;
            };
            let result = done.unwrap_or_else(|_| Err(FsError::Busy("a move task ended early")));
            match result {
                Ok(copied) => repinned.extend(copied),
                Err(e) if failure.is_none() => {
                    warn!(prefix, new_prefix, error = %e, "directory rename stopped midway: objects are under both prefixes");
                    failure = Some(e);
                }
                Err(_) => {}
            }
        }
        failure.map_or(Ok(repinned), Err)
    }
}

/// Moves one object: RenameObject on directory buckets, else CopyObject then DeleteObject (the source is
/// deleted only once the copy exists). With a `pin`, the copy's ETag is returned when the source was that
/// version; when it was not (another client replaced it), it moves all the same and None is returned, so the
/// handles that pinned it keep expecting their own version and their next upload fails instead of following.
async fn move_object(
    client: &dyn ObjectClient,
    key: &str,
    pin: Option<&str>,
    destination: &str,
    condition: WriteCondition,
) -> FsResult<Option<String>> {
    let to_fs = |e: ClientError| FsError::client(destination, e);
    if client.is_directory_bucket() {
        return client
            .rename_object(key, destination, condition)
            .await
            .map(|()| None)
            .map_err(to_fs);
    }
    let pinned = client
        .copy_object(key, pin, destination, condition.clone())
        .await;
    let copied = match pinned {
        // Either side refused: without the pin, a refusal is the destination's.
        Err(ClientError::PreconditionFailed { .. }) if pin.is_some() => {
            client
                .copy_object(key, None, destination, condition)
                .await
                .map_err(to_fs)?;
            None
        }
        other => pin.and(Some(other.map_err(to_fs)?.etag)),
    };
    client.delete_object(key).await.map_err(|e| {
        warn!(key, destination, error = %e, "copied but not deleted: the object is under both names");
        FsError::client(key, e)
    })?;
    Ok(copied)
}

/// The directory markers (`dir/`, empty objects) of a directory renamed, made anew under the new name once
/// every other object under it has moved, shallowest first; [`delete_old_markers`] deletes the old ones. Not
/// by RenameObject or CopyObject: a directory bucket's RenameObject does not take keys that end in the
/// delimiter, and servers that keep directories as such (SeaweedFS) refuse to copy them. A marker that exists
/// already under the new name is left as it is: the empty directory replaced had one, or such a server made
/// the directory when something landed under it.
async fn make_markers_anew(
    client: &dyn ObjectClient,
    markers: &[ObjectInfo],
    prefix: &str,
    new_prefix: &str,
) -> FsResult<()> {
    let mut keys: Vec<&str> = markers.iter().map(|m| m.key.as_str()).collect();
    keys.sort_by_key(|k| k.len());
    for key in keys {
        let destination = format!("{new_prefix}{}", &key[prefix.len()..]);
        match client
            .put_object(&destination, Bytes::new(), WriteCondition::IfNoneMatch)
            .await
        {
            Ok(_) | Err(ClientError::PreconditionFailed { .. }) => {}
            Err(e) => return Err(FsError::client(&destination, e)),
        }
    }
    Ok(())
}

/// Deletes the old markers of a directory renamed, deepest first, so no directory is deleted while
/// something is still in it. False when one could not be: it stays, an empty directory under its old name.
async fn delete_old_markers(client: &dyn ObjectClient, markers: &[ObjectInfo]) -> bool {
    let mut keys: Vec<&str> = markers.iter().map(|m| m.key.as_str()).collect();
    keys.sort_by_key(|k| std::cmp::Reverse(k.len()));
    let mut all = true;
    for key in keys {
        if let Err(e) = client.delete_object(key).await {
            warn!(key, error = %e, "directory renamed, but an old marker object was not deleted");
            all = false;
        }
    }
    all
}

impl Superblock {
    /// Whether a file of `size` can be renamed here at all: a general-purpose bucket copies it, and one
    /// CopyObject copies at most 5 GB ([`refuse_past_copy_limit`]).
    pub fn can_rename_file_of(&self, size: u64) -> bool {
        self.client.is_directory_bucket() || size <= MAX_COPY_OBJECT_SIZE
    }
}

/// A single CopyObject copies at most 5 GB; bigger files are refused so `mv` copies them itself.
fn refuse_past_copy_limit(key: &str, size: u64) -> FsResult<()> {
    if size > MAX_COPY_OBJECT_SIZE {
        warn!(
            key,
            size, "rename refused: CopyObject copies at most 5 GB (mv falls back to copying)"
        );
        return Err(FsError::CrossDevice(
            "objects over 5 GB cannot be renamed on general-purpose buckets",
        ));
    }
    Ok(())
}
