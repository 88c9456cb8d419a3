//! POSIX attributes kept in an object's user metadata under `--preserve-metadata`, in the names s3fs and
//! rclone use: `mtime`, `atime` (unix seconds, optionally with a fraction), `mode` (the full `st_mode`),
//! `uid`, `gid`. See docs/SEMANTICS.md for what is written and what is read.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::s3::{ObjectInfo, UserMetadata};

pub const MTIME: &str = "mtime";
pub const ATIME: &str = "atime";
pub const MODE: &str = "mode";
pub const UID: &str = "uid";
pub const GID: &str = "gid";

/// Largest `st_mode` (type and permission bits). s3fs writes modes in decimal, so they never exceed it; a
/// larger number is read as rclone's octal form (`100644`).
const MAX_MODE: u32 = 0o177_777;

/// The attributes an object's metadata holds; each one absent when missing or unreadable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoredAttrs {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mtime: Option<SystemTime>,
    pub atime: Option<SystemTime>,
}

impl StoredAttrs {
    pub fn from_metadata(metadata: &UserMetadata) -> StoredAttrs {
        let get = |name: &str| metadata.get(name).map(|v| v.trim());
        StoredAttrs {
            mode: get(MODE).and_then(parse_mode),
            uid: get(UID).and_then(|v| v.parse().ok()),
            gid: get(GID).and_then(|v| v.parse().ok()),
            mtime: get(MTIME).and_then(parse_time),
            atime: get(ATIME).and_then(parse_time),
        }
    }

    /// `metadata` with these attributes written over it (other pairs, a content hash say, are kept).
    pub fn write_into(&self, metadata: &mut UserMetadata) {
        let mut set = |name: &str, value: Option<String>| {
            if let Some(v) = value {
                metadata.insert(name.to_string(), v);
            }
        };
        set(MODE, self.mode.map(|m| m.to_string()));
        set(UID, self.uid.map(|u| u.to_string()));
        set(GID, self.gid.map(|g| g.to_string()));
        set(MTIME, self.mtime.map(format_time));
        set(ATIME, self.atime.map(format_time));
    }

    /// A chmod's permission bits as the whole st_mode of a regular file, the form s3fs stores (only files
    /// keep attributes).
    pub fn of_regular_file(self) -> StoredAttrs {
        const S_IFREG: u32 = 0o100_000;
        StoredAttrs {
            mode: self.mode.map(|m| S_IFREG | (m & 0o7777)),
            ..self
        }
    }

    /// `other`'s attributes where it has them, ours elsewhere.
    pub fn overlay(self, other: StoredAttrs) -> StoredAttrs {
        StoredAttrs {
            mode: other.mode.or(self.mode),
            uid: other.uid.or(self.uid),
            gid: other.gid.or(self.gid),
            mtime: other.mtime.or(self.mtime),
            atime: other.atime.or(self.atime),
        }
    }

    /// What an object shows: the attributes its metadata holds, and its Last-Modified as the mtime when the
    /// metadata has none (a copy onto itself gives it a new Last-Modified; the date shown must not move).
    pub fn of_object(info: &ObjectInfo) -> StoredAttrs {
        let shown = StoredAttrs {
            mtime: Some(info.last_modified),
            ..StoredAttrs::default()
        };
        shown.overlay(StoredAttrs::from_metadata(&info.metadata))
    }

    /// Bytes changed at `when`. As on a local disk, a write marks the mtime for update, whatever was stored
    /// or set before it; a time set after the write (utimens, overlaid) wins in turn, as `cp -p`, `tar -x`
    /// and `rsync -a` need.
    pub fn written_at(self, when: SystemTime) -> StoredAttrs {
        StoredAttrs {
            mtime: Some(when),
            ..self
        }
    }

    /// The user metadata an upload carries for `attrs`. An mtime not known yet (a file rewritten with O_TRUNC,
    /// with nothing written) is the upload's time, and is kept in `attrs`: stat then shows the
    /// time the object carries, not one of its own.
    pub fn for_upload(attrs: Option<&mut StoredAttrs>) -> UserMetadata {
        let mut metadata = UserMetadata::new();
        if let Some(attrs) = attrs {
            attrs.mtime.get_or_insert_with(SystemTime::now);
            attrs.write_into(&mut metadata);
        }
        metadata
    }

    pub fn is_empty(&self) -> bool {
        *self == StoredAttrs::default()
    }
}

fn parse_mode(value: &str) -> Option<u32> {
    let decimal: u32 = value.parse().ok()?;
    if decimal <= MAX_MODE {
        return Some(decimal);
    }
    u32::from_str_radix(value, 8)
        .ok()
        .filter(|m| *m <= MAX_MODE)
}

/// Unix seconds, with an optional fraction (s3fs writes whole seconds, rclone a fraction); times before
/// 1970 are not read.
fn parse_time(value: &str) -> Option<SystemTime> {
    let (secs, fraction) = value.split_once('.').unwrap_or((value, ""));
    let secs: u64 = secs.parse().ok()?;
    if !fraction.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    // Nanoseconds: the first nine digits, padded.
    let digits: String = fraction
        .chars()
        .chain(std::iter::repeat('0'))
        .take(9)
        .collect();
    let nanos: u32 = digits.parse().ok()?;
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

/// Whole seconds when there is no fraction (what every s3fs reads), else `secs.nnnnnnnnn` (rclone's form).
fn format_time(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    match since.subsec_nanos() {
        0 => since.as_secs().to_string(),
        nanos => format!("{}.{nanos:09}", since.as_secs()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> UserMetadata {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn reads_s3fs_and_rclone_forms() {
        let s3fs = StoredAttrs::from_metadata(&meta(&[
            ("mode", "33261"),
            ("uid", "1000"),
            ("gid", "100"),
            ("mtime", "1700000000"),
        ]));
        assert_eq!(s3fs.mode, Some(0o100_755));
        assert_eq!((s3fs.uid, s3fs.gid), (Some(1000), Some(100)));
        assert_eq!(
            s3fs.mtime,
            Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert_eq!(s3fs.atime, None);

        let rclone = StoredAttrs::from_metadata(&meta(&[
            ("mtime", "1700000000.25"),
            ("mode", "100644"),
            ("atime", "1.000000001"),
        ]));
        assert_eq!(
            rclone.mtime,
            Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_250))
        );
        assert_eq!(rclone.mode, Some(0o100_644));
        assert_eq!(rclone.atime, Some(UNIX_EPOCH + Duration::new(1, 1)));

        let junk = StoredAttrs::from_metadata(&meta(&[
            ("mtime", "yesterday"),
            ("mode", "999999999"),
            ("uid", "-1"),
            ("atime", "5.x"),
        ]));
        assert!(junk.is_empty(), "{junk:?}");
    }

    #[test]
    fn writes_what_it_reads_and_keeps_other_pairs() {
        let attrs = StoredAttrs {
            mode: Some(0o100_600),
            uid: Some(7),
            gid: Some(8),
            mtime: Some(UNIX_EPOCH + Duration::new(1_600_000_000, 5)),
            atime: Some(UNIX_EPOCH + Duration::from_secs(1_600_000_001)),
        };
        let mut metadata = meta(&[("md5", "abc"), ("mode", "1")]);
        attrs.write_into(&mut metadata);
        assert_eq!(metadata["mode"], "33152");
        assert_eq!(metadata["mtime"], "1600000000.000000005");
        assert_eq!(metadata["atime"], "1600000001");
        assert_eq!(metadata["md5"], "abc");
        assert_eq!(StoredAttrs::from_metadata(&metadata), attrs);
    }

    #[test]
    fn overlay_prefers_the_newer_values() {
        let old = StoredAttrs {
            mode: Some(0o100_644),
            uid: Some(1),
            ..StoredAttrs::default()
        };
        let new = StoredAttrs {
            uid: Some(2),
            gid: Some(3),
            ..StoredAttrs::default()
        };
        let both = old.overlay(new);
        assert_eq!(
            (both.mode, both.uid, both.gid),
            (Some(0o100_644), Some(2), Some(3))
        );
    }

    /// POSIX's rule for the mtime of a file written through a descriptor: a write marks it for update, a
    /// time set after the last write wins, one set before it does not.
    #[test]
    fn a_write_dates_the_file_unless_a_time_is_set_after_it() {
        let at = |secs| Some(UNIX_EPOCH + Duration::from_secs(secs));
        let stored = StoredAttrs {
            mode: Some(0o100_644),
            mtime: at(946_684_800),
            ..StoredAttrs::default()
        };
        let set = StoredAttrs {
            mtime: at(1_000_000_000),
            ..StoredAttrs::default()
        };
        let chmod = StoredAttrs {
            mode: Some(0o100_600),
            ..StoredAttrs::default()
        };
        let write = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let edited = stored.written_at(write);
        assert_eq!((edited.mtime, edited.mode), (Some(write), stored.mode));
        assert_eq!(stored.overlay(set).written_at(write).mtime, Some(write));
        assert_eq!(edited.overlay(set).mtime, set.mtime);
        assert_eq!(edited.overlay(chmod).mtime, Some(write));
    }

    #[test]
    fn an_upload_dates_a_file_without_an_mtime_and_keeps_the_date() {
        let mut attrs = StoredAttrs {
            mode: Some(0o100_644),
            ..StoredAttrs::default()
        };
        let before = SystemTime::now();
        let metadata = StoredAttrs::for_upload(Some(&mut attrs));
        assert!(attrs.mtime.is_some_and(|t| t >= before));
        // What stat shows from now on is what the object carries, and the next upload carries it again.
        assert_eq!(StoredAttrs::from_metadata(&metadata), attrs);
        assert_eq!(StoredAttrs::for_upload(Some(&mut attrs)), metadata);
        assert!(StoredAttrs::for_upload(None).is_empty());
    }

    #[test]
    fn an_object_without_an_mtime_shows_its_last_modified() {
        let info = |pairs: &[(&str, &str)]| ObjectInfo {
            key: "k".into(),
            size: 1,
            etag: "\"e\"".into(),
            last_modified: UNIX_EPOCH + Duration::from_secs(1_600_000_000),
            metadata: meta(pairs),
        };
        let plain = StoredAttrs::of_object(&info(&[("mode", "33188")]));
        assert_eq!(
            plain.mtime,
            Some(UNIX_EPOCH + Duration::from_secs(1_600_000_000))
        );
        assert_eq!(plain.mode, Some(0o100_644));
        let dated = StoredAttrs::of_object(&info(&[("mtime", "5")]));
        assert_eq!(dated.mtime, Some(UNIX_EPOCH + Duration::from_secs(5)));
    }
}
