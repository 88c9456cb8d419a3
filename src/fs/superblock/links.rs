//! Symbolic links, stored as rclone `--links` stores them: the link `name` is the object `name.rclonelink`
//! whose body is the target. A listing tells links apart by their names alone, so readdir and storm
//! listings need no request per link (see [`super::listing::list_all`]).

use std::time::Instant;

use bytes::Bytes;
use tracing::debug;

use super::{Superblock, check_key, check_name};
use crate::fs::inode::{Kind, Node, Stat};
use crate::fs::{Attr, FsError, FsResult, names};
use crate::s3::WriteCondition;

/// Longest target a link may have (PATH_MAX less its NUL, as the kernel allows).
const MAX_TARGET: u64 = 4095;

impl Superblock {
    /// The link `parent/name`, asked for once a lookup found neither the object nor the prefix of that
    /// name: one more request per missing name. On the SDK client it is one ranged GET that brings the
    /// target along, so the readlink that follows needs no request.
    pub(super) async fn resolve_link(
        &self,
        parent: &Node,
        name: &str,
    ) -> FsResult<Option<(Kind, Stat, Option<String>)>> {
        let key = names::link_key(parent.key(), name);
        match self.client.head_with_first_bytes(&key, MAX_TARGET).await {
            Ok((info, body)) => {
                let target = (body.len() as u64 == info.size)
                    .then(|| String::from_utf8(body.to_vec()).ok())
                    .flatten();
                Ok(Some((Kind::Symlink, Stat::of(&info), target)))
            }
            Err(e) => match FsError::client(&key, e) {
                FsError::NotFound => Ok(None),
                other => Err(other),
            },
        }
    }

    /// symlink(2): writes `parent/name.rclonelink` with `target` as its body, refusing to replace anything.
    pub async fn symlink(&self, parent: u64, name: &str, target: &[u8]) -> FsResult<Attr> {
        let _changing = self.changing(parent);
        if self.config.read_only {
            return Err(FsError::ReadOnly);
        }
        check_name(name)?;
        if target.len() as u64 > MAX_TARGET {
            return Err(FsError::NameTooLong);
        }
        // Keys are UTF-8, and so is the body rclone reads back as a path.
        let target = std::str::from_utf8(target).map_err(|_| FsError::NameNotUtf8)?;
        let parent_node = self.dir_node(parent)?;
        let key = names::link_key(parent_node.key(), name);
        check_key(&key)?;
        if self
            .table()
            .child(parent, name)
            .is_some_and(|n| n.is_pending())
            || self.resolve(&parent_node, name, false).await?.is_some()
        {
            return Err(FsError::Exists);
        }
        let put = self
            .client
            .put_object(
                &key,
                Bytes::copy_from_slice(target.as_bytes()),
                WriteCondition::IfNoneMatch,
            )
            .await
            .map_err(|e| {
                // A PUT whose answer was lost may have made the link all the same.
                self.table().doubt_names(parent);
                match FsError::client(&key, e) {
                    // Another client made the link first.
                    FsError::ObjectChanged { .. } => FsError::Exists,
                    other => other,
                }
            })?;
        debug!(key, target, "link written");
        let stat = Stat {
            size: target.len() as u64,
            mtime: crate::fs::inode::last_modified_now(),
            etag: Some(put.etag.clone()),
            attrs: None,
        };
        let mut table = self.table();
        let ino = table.upsert(
            parent,
            name,
            Kind::Symlink,
            stat,
            self.expiry(),
            Instant::now(),
        );
        table.add_lookup(ino);
        let node = table.get_mut(ino).expect("just inserted");
        node.remember_link_target(&put.etag, target.to_string());
        let attr = self.attr_of(node);
        drop(table);
        self.negative.forget(parent, name);
        Ok(attr)
    }

    /// readlink(2): the target kept from the lookup or the symlink call, else the object's body.
    pub async fn readlink(&self, ino: u64) -> FsResult<Bytes> {
        let node = self.node(ino)?;
        if node.kind() != Kind::Symlink {
            return Err(FsError::InvalidArgument("not a symbolic link".into()));
        }
        if let Some(target) = node.link_target() {
            return Ok(Bytes::copy_from_slice(target.as_bytes()));
        }
        // The body is fetched whole with its ETag, so the target kept is the one of the version read.
        let asked = Instant::now();
        let (info, body) = self
            .client
            .head_with_first_bytes(node.key(), MAX_TARGET)
            .await
            .map_err(|e| FsError::client(node.key(), e))?;
        if body.len() as u64 != info.size {
            return Err(FsError::InvalidArgument(format!(
                "{}: not a link target ({} bytes)",
                node.key(),
                info.size
            )));
        }
        let target = String::from_utf8(body.to_vec())
            .map_err(|_| FsError::InvalidArgument(format!("{}: target not UTF-8", node.key())))?;
        let mut table = self.table();
        if let Some(n) = table.get_mut(ino) {
            n.observe(Stat::of(&info), asked);
            n.remember_link_target(&info.etag, target);
        }
        Ok(body)
    }
}
