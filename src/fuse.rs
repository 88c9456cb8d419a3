//! FUSE adapter: decodes fuser callbacks, calls the core on the tokio runtime, maps errors to errno. (Being written.)

use std::path::PathBuf;

use crate::fs::S3Filesystem;

/// Mount-level options decided by the CLI.
#[derive(Debug, Clone)]
pub struct FuseOptions {
    pub mountpoint: PathBuf,
    /// Shown by `mount`/`df`, e.g. `expressfs#bucket` style source name.
    pub fs_name: String,
    pub read_only: bool,
    pub allow_other: bool,
    pub allow_root: bool,
    pub auto_unmount: bool,
    /// FUSE worker threads.
    pub threads: usize,
}

/// A live mount. Dropping it unmounts.
pub struct MountedFs {}

impl MountedFs {
    /// Blocks until the file system is unmounted (by `umount` or [`MountedFs::unmount`]).
    pub fn join(self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Mounts `fs` and starts serving it. Returns once the kernel has the mount (so the caller can report
/// readiness). FUSE callbacks hand their work to `runtime` and reply from there.
pub fn mount(
    _fs: S3Filesystem,
    _runtime: tokio::runtime::Handle,
    _options: &FuseOptions,
) -> std::io::Result<MountedFs> {
    Err(std::io::Error::other("not yet implemented"))
}
