//! `--preserve-metadata` on a writer: the attributes its upload carries, and the metadata copy for those
//! set after the upload left.

use super::{Mode, Writer};
use crate::fs::attrs::StoredAttrs;
use crate::fs::error::{FsError, FsResult};
use crate::s3::{PutResult, UserMetadata, WriteCondition};

impl Writer {
    /// chmod/chown/utimens while open: kept for the upload (no-op without `--preserve-metadata`).
    pub fn set_attrs(&mut self, change: StoredAttrs) {
        // Unlinked or replaced: nothing of this writer goes to the bucket any more.
        if self.discarded {
            return;
        }
        if let Some(attrs) = &mut self.attrs {
            **attrs = attrs.overlay(change);
            // Only an upload still to start carries them; otherwise a metadata copy follows.
            let carried =
                self.dirty && self.multipart.is_none() && !matches!(self.mode, Mode::Append { .. });
            self.attrs_late |= !carried;
        }
    }

    /// What the object is uploaded with: the attributes, and now as its mtime unless one was set.
    pub(super) fn upload_metadata(&self) -> UserMetadata {
        StoredAttrs::for_upload(self.attrs.as_deref().copied())
    }

    /// The metadata copy after upload `r` (conditional on its ETag), for attributes it did not carry.
    pub(super) async fn send_late_attrs(&mut self, r: PutResult) -> FsResult<PutResult> {
        let copied = self
            .client
            .replace_metadata(&self.key, &self.upload_metadata(), &r.etag)
            .await
            .map_err(|e| FsError::client(&self.key, e))?;
        // Sent: a commit with nothing new to upload sends no copy (an append with new bytes does again).
        self.attrs_late = false;
        if self.condition == WriteCondition::IfMatch(r.etag.clone()) {
            self.condition = WriteCondition::IfMatch(copied.etag.clone());
        }
        let r = PutResult {
            etag: copied.etag,
            size: r.size,
        };
        self.uploaded = Some(Box::new(r.clone()));
        Ok(r)
    }
}
