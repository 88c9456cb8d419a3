//! chmod/chown/utimens kept in the object's user metadata (`--preserve-metadata`): CopyObject of the object
//! onto itself with the metadata replaced, so no data passes through the host.

use std::time::Instant;

use tracing::{debug, warn};

use super::Superblock;
use crate::fs::attrs::StoredAttrs;
use crate::fs::inode::{Kind, Stat};
use crate::fs::{FsError, FsResult};
use crate::s3::ClientError;

impl Superblock {
    /// Writes `change` over the attributes stored with the closed file `ino`. A HEAD reads the current
    /// metadata (other pairs are kept) and its ETag; the copy is conditional on that ETag, so a concurrent
    /// replacement fails it (EIO) instead of being overwritten with old bytes' metadata.
    pub async fn store_attributes(&self, ino: u64, change: StoredAttrs) -> FsResult<()> {
        let node = self.node(ino)?;
        if node.kind() != Kind::File || change.is_empty() {
            return Ok(());
        }
        let key = node.key().to_string();
        let asked = Instant::now();
        let info = self
            .client
            .head_object(&key)
            .await
            .map_err(|e| FsError::client(&key, e))?;
        let change = change.of_regular_file();
        let attrs = StoredAttrs::of_object(&info).overlay(change);
        let mut metadata = info.metadata.clone();
        attrs.write_into(&mut metadata);
        let put = match self
            .client
            .replace_metadata(&key, &metadata, &info.etag)
            .await
        {
            Ok(put) => put,
            Err(e @ ClientError::PreconditionFailed { .. }) => {
                warn!(
                    key,
                    "attributes not stored: the object was replaced meanwhile"
                );
                return Err(FsError::client(&key, e));
            }
            Err(e) => return Err(FsError::client(&key, e)),
        };
        debug!(key, "attributes stored in the object's metadata");
        let expires = self.expiry();
        if let Some(n) = self.table().get_mut(ino) {
            let stat = Stat {
                size: info.size,
                mtime: info.last_modified,
                etag: Some(put.etag),
                attrs: Some(attrs),
            };
            if n.observe(stat, asked) {
                n.trust_until(expires);
            }
        }
        Ok(())
    }
}
