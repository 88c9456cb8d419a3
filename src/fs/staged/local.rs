//! The local bytes of a staged file, or of a streaming writer that may become one.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::fcntl::{AT_FDCWD, AtFlags};

use crate::fs::error::{FsError, FsResult};

/// A file in the staging directory with no name: the kernel frees its blocks when the daemon closes it, however
/// the daemon ends. A named file outlived a SIGKILL or a crash, one for every file being written, until someone
/// cleaned the directory by hand. It gets a name only to be kept ([`LocalCopy::keep_as`]); only the daemon's
/// user can read it (0600).
#[derive(Debug)]
pub struct LocalCopy(File);

impl LocalCopy {
    /// A new, empty local copy in `dir` for `key` (named in errors).
    pub fn create(dir: &Path, key: &str) -> FsResult<LocalCopy> {
        let unnamed = OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE)
            .open(dir);
        let file = match unnamed {
            Ok(file) => Ok(file),
            // A file system without O_TMPFILE: a named file, unlinked at once (then it cannot be kept as
            // itself, see `keep_as`).
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
                Self::unlinked_in(dir)
            }
            Err(e) => Err(e),
        };
        file.map(LocalCopy)
            .map_err(|e| FsError::local(&format!("{key}: staging file"), e))
    }

    /// Where the file system has no O_TMPFILE: a named file (0600), unlinked at once.
    fn unlinked_in(dir: &Path) -> std::io::Result<File> {
        tempfile::Builder::new()
            .prefix("expressfs-staged-")
            .tempfile_in(dir)
            .map(tempfile::NamedTempFile::into_file)
    }

    pub fn as_file(&self) -> &File {
        &self.0
    }

    /// Gives the bytes the name `path` (on the staging directory's file system), so that they outlive the
    /// daemon: the file itself, linked, where it was made with O_TMPFILE; otherwise a copy.
    pub fn keep_as(&self, path: &Path) -> std::io::Result<()> {
        let open = format!("/proc/self/fd/{}", self.0.as_raw_fd());
        match nix::unistd::linkat(
            AT_FDCWD,
            open.as_str(),
            AT_FDCWD,
            path,
            AtFlags::AT_SYMLINK_FOLLOW,
        ) {
            Ok(()) => Ok(()),
            // ENOENT: an unlinked named file, which cannot be linked again.
            Err(_) => std::fs::copy(&open, path).map(drop),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileExt, PermissionsExt};

    use super::*;

    /// Writes into `copy` (made in `dir`), checks that `dir` shows no name for it, keeps it as `kept` in `dir`
    /// and checks what `kept` holds and that it is private. Then writes once more over the first byte.
    fn written_kept_and_written_again(dir: &Path, copy: &LocalCopy) -> std::path::PathBuf {
        copy.as_file().write_all_at(b"staged bytes", 0).unwrap();
        assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0);
        let kept = dir.join("kept");
        copy.keep_as(&kept).unwrap();
        assert_eq!(std::fs::read(&kept).unwrap(), b"staged bytes");
        assert_eq!(
            std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777,
            0o600
        );
        copy.as_file().write_all_at(b"S", 0).unwrap();
        kept
    }

    #[test]
    fn a_local_copy_has_no_name_until_kept_and_is_private_once_kept() {
        let dir = tempfile::tempdir().unwrap();
        let copy = LocalCopy::create(dir.path(), "k").unwrap();
        let kept = written_kept_and_written_again(dir.path(), &copy);
        // The kept name is the same file: the later write shows through it, and it stays once the copy is dropped.
        assert_eq!(std::fs::read(&kept).unwrap(), b"Staged bytes");
        drop(copy);
        assert_eq!(std::fs::read(&kept).unwrap(), b"Staged bytes");
    }

    /// Without O_TMPFILE the file cannot be linked again once unlinked: its bytes are copied instead.
    #[test]
    fn an_unlinked_named_copy_is_kept_as_a_copy() {
        let dir = tempfile::tempdir().unwrap();
        let copy = LocalCopy(LocalCopy::unlinked_in(dir.path()).unwrap());
        let kept = written_kept_and_written_again(dir.path(), &copy);
        assert_eq!(std::fs::read(&kept).unwrap(), b"staged bytes", "a copy");
    }

    #[test]
    fn a_missing_directory_is_a_local_error_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let err = LocalCopy::create(&dir.path().join("gone"), "some/key").unwrap_err();
        assert!(err.to_string().contains("some/key"), "{err}");
    }
}
