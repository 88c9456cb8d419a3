//! Directories: mkdir, rmdir, and the marker objects (`dir/`) that make an empty one last.

use std::time::Instant;

use bytes::Bytes;
use tracing::debug;

use super::{New, Superblock, check_key, check_name};
use crate::fs::inode::{Kind, Stat};
use crate::fs::{Attr, FsError, FsResult, names};
use crate::s3::WriteCondition;

impl Superblock {
    pub async fn mkdir(&self, parent: u64, name: &str) -> FsResult<Attr> {
        let _changing = self.changing(parent);
        if self.config.read_only {
            return Err(FsError::ReadOnly);
        }
        check_name(name)?;
        let parent_node = self.dir_node(parent)?;
        let prefix = names::dir_prefix(parent_node.key(), name);
        check_key(&prefix)?;
        let asked = Instant::now();
        if self
            .table()
            .child(parent, name)
            .is_some_and(|n| n.is_pending())
            || self
                .resolve_file_or_dir(&parent_node, name, New::Directory)
                .await?
                .is_some()
        {
            return Err(FsError::Exists);
        }
        if self.config.directory_markers
            && let Err(e) = self.write_marker(parent, &prefix).await
        {
            // Made or not, the name is no longer known to be missing.
            self.negative.forget(parent, name);
            return Err(e);
        }
        let mut table = self.table();
        let ino = table.upsert(
            parent,
            name,
            Kind::Directory,
            Stat::directory(),
            self.expiry(),
            Instant::now(),
        );
        table.add_lookup(ino);
        let node = table.get_mut(ino).expect("just inserted");
        if !self.config.directory_markers {
            node.mark_local();
        }
        let attr = self.attr_of(node);
        // Nothing was under the name when it was checked: a new directory holds no names but ours.
        if let Some(until) = self.every_name_known_until(asked) {
            table.know_every_name(ino, asked, until);
        }
        drop(table);
        // As if listed: lookups of missing names there count towards listing it again before that expires.
        self.storms.listed(ino, 1, asked.elapsed());
        self.negative.forget(parent, name);
        Ok(attr)
    }

    /// `--directory-markers`: the new directory is an empty object named like its prefix (`dir/`), the way
    /// the S3 console, s3fs and rclone make one, so it outlives this mount while nothing is in it.
    async fn write_marker(&self, parent: u64, prefix: &str) -> FsResult<()> {
        let put = self
            .client
            .put_object(prefix, Bytes::new(), WriteCondition::IfNoneMatch)
            .await;
        put.map_err(|e| {
            // A PUT whose answer was lost may have made the marker all the same.
            self.table().doubt_names(parent);
            match FsError::client(prefix, e) {
                // Another client made the directory first.
                FsError::ObjectChanged { .. } => FsError::Exists,
                other => other,
            }
        })?;
        debug!(key = prefix, "directory marker written");
        Ok(())
    }

    pub async fn rmdir(&self, parent: u64, name: &str) -> FsResult<()> {
        let _changing = self.changing(parent);
        if self.config.read_only {
            return Err(FsError::ReadOnly);
        }
        let node = self.table().child(parent, name).cloned();
        let parent_node = self.dir_node(parent)?;
        let prefix = match &node {
            Some(n) if n.kind() != Kind::Directory => return Err(FsError::NotADirectory),
            Some(n) => n.key().to_string(),
            None => names::dir_prefix(parent_node.key(), name),
        };
        if let Some(n) = &node
            && self.table().local_children(n.ino()).iter().any(|_| true)
        {
            return Err(FsError::NotEmpty);
        }
        // Two keys: a directory made by another tool (the console, s3fs, rclone) has a marker object named
        // like the prefix itself, which is the directory, not something in it.
        let page = self.first_listed(&prefix, 2).await?;
        let marker = page.objects.iter().any(|o| o.key == prefix);
        if page.objects.len() > usize::from(marker) || !page.common_prefixes.is_empty() {
            return Err(FsError::NotEmpty);
        }
        if node.is_none() && !marker {
            return Err(FsError::NotFound);
        }
        if marker {
            if !self.config.allow_delete {
                return Err(FsError::NotPermitted(
                    "deleting a directory's marker object needs --allow-delete",
                ));
            }
            self.client
                .delete_object(&prefix)
                .await
                .map_err(|e| FsError::client(&prefix, e))?;
            debug!(key = prefix, "directory marker deleted");
        }
        self.table().detach(parent, name);
        Ok(())
    }
}
