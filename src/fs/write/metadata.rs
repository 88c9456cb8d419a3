//! `--preserve-metadata` on a writer: the attributes its upload carries, and the metadata copy for those
//! set after the upload left.

use std::time::SystemTime;

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

    /// Bytes were written (or cut) now: the mtime the upload carries moves to now (see
    /// [`StoredAttrs::written_at`]).
    pub(super) fn date_write(&mut self) {
        if let Some(attrs) = self.attrs.as_deref_mut() {
            *attrs = attrs.written_at(SystemTime::now());
        }
    }

    /// The whole user metadata of the version this writer uploaded last, when the writer wrote all of it:
    /// a new file, or one rewritten with `O_TRUNC`, carries our attributes and nothing else, so a chmod or
    /// utimens right after it (rsync's, on its temporary file) needs no HEAD to learn them. None without
    /// `--preserve-metadata`, with bytes or attributes not sent yet, and for appends (the object keeps the
    /// metadata it had).
    pub fn stored_metadata(&self) -> Option<UserMetadata> {
        let sent = matches!(self.mode, Mode::Stream)
            && self.uploaded.is_some()
            && !self.dirty
            && !self.attrs_late
            && !self.discarded;
        let attrs = self.attrs.as_deref().filter(|_| sent)?;
        let mut metadata = UserMetadata::new();
        attrs.write_into(&mut metadata);
        Some(metadata)
    }

    /// With `--preserve-metadata`, the mtime the upload is to carry, once known: stat shows it meanwhile.
    pub fn mtime(&self) -> Option<SystemTime> {
        self.attrs.as_deref().and_then(|a| a.mtime)
    }

    /// A multipart upload completed, carrying `mtime` since its start. Writes after the start do not send
    /// a metadata copy (it would copy the whole object again): unless one is due anyway, the object keeps
    /// the start's time, and so does stat.
    pub(super) fn carried(&mut self, mtime: Option<SystemTime>) {
        if let Some(attrs) = self.attrs.as_deref_mut()
            && !self.attrs_late
        {
            attrs.mtime = mtime;
        }
    }

    /// What the object is uploaded with: the attributes, its mtime the upload's time unless it has one.
    pub(super) fn upload_metadata(&mut self) -> UserMetadata {
        StoredAttrs::for_upload(self.attrs.as_deref_mut())
    }

    /// The metadata copy after upload `r` (conditional on its ETag), for attributes it did not carry.
    pub(super) async fn send_late_attrs(&mut self, r: PutResult) -> FsResult<PutResult> {
        let metadata = self.upload_metadata();
        let copied = self
            .client
            .replace_metadata(&self.key, &metadata, &r.etag)
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
