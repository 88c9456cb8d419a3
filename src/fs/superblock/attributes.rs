//! chmod/chown/utimens kept in the object's user metadata (`--preserve-metadata`): CopyObject of the object
//! onto itself with the metadata replaced, so no data passes through the host.

use std::time::Instant;

use tracing::{debug, warn};

use super::Superblock;
use crate::fs::attrs::StoredAttrs;
use crate::fs::inode::{Kind, Stat};
use crate::fs::{FsError, FsResult};
use crate::s3::{ClientError, ObjectInfo};

impl Superblock {
    /// Writes `change` over the attributes stored with the closed file `ino`. The current metadata (other
    /// pairs are kept) and ETag come from a HEAD, or, while the node is fresh and its version is our own last
    /// metadata copy (rsync's utimensat then fchmod), from what that copy wrote. The copy is conditional on
    /// that ETag, so a concurrent replacement fails it (EIO) instead of being overwritten with old bytes'
    /// metadata.
    pub async fn store_attributes(&self, ino: u64, change: StoredAttrs) -> FsResult<()> {
        let node = self.node(ino)?;
        if node.kind() != Kind::File || change.is_empty() {
            return Ok(());
        }
        let key = node.key().to_string();
        let change = change.of_regular_file();
        // What our own copy wrote, as a HEAD would say it (the date shown so far as Last-Modified).
        let mut ours = node
            .own_metadata()
            .filter(|_| node.is_fresh(Instant::now()))
            .zip(node.stat().etag.clone())
            .map(|(metadata, etag)| ObjectInfo {
                key: key.clone(),
                size: node.stat().size,
                etag,
                last_modified: node.stat().mtime,
                metadata: metadata.clone(),
            });
        let (asked, info, attrs, metadata, put) = loop {
            let asked = Instant::now();
            let known = ours.is_some();
            let info = match ours.take() {
                Some(info) => info,
                None => self
                    .client
                    .head_object(&key)
                    .await
                    .map_err(|e| FsError::client(&key, e))?,
            };
            // The date shown so far is kept: the copy gives the object a new Last-Modified.
            let attrs = StoredAttrs::of_object(&info).overlay(change);
            let mut metadata = info.metadata.clone();
            attrs.write_into(&mut metadata);
            match self
                .client
                .replace_metadata(&key, &metadata, &info.etag)
                .await
            {
                Ok(put) => break (asked, info, attrs, metadata, put),
                // Replaced since our own copy: what is there now is asked for, as for any other version.
                Err(ClientError::PreconditionFailed { .. }) if known => continue,
                Err(e @ ClientError::PreconditionFailed { .. }) => {
                    warn!(
                        key,
                        "attributes not stored: the object was replaced meanwhile"
                    );
                    return Err(FsError::client(&key, e));
                }
                Err(e) => return Err(FsError::client(&key, e)),
            }
        };
        debug!(key, "attributes stored in the object's metadata");
        let expires = self.expiry();
        if let Some(n) = self.table().get_mut(ino) {
            let stat = Stat {
                size: info.size,
                mtime: info.last_modified,
                etag: Some(put.etag.clone()),
                attrs: Some(attrs),
            };
            if n.observe(stat, asked) {
                n.trust_until(expires);
                n.remember_own_metadata(&put.etag, metadata);
            }
        }
        Ok(())
    }
}
