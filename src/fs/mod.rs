//! File system core: inodes, lookup, readdir, read and write handles. No fuser types here. (Being written.)

use std::sync::Arc;
use std::time::Duration;

use crate::s3::ObjectClient;

/// Configuration of the core, built by the CLI layer from flags.
#[derive(Debug, Clone)]
pub struct FsConfig {
    /// Key prefix mounted at the root: empty or ending in `/`.
    pub prefix: String,
    pub uid: u32,
    pub gid: u32,
    pub dir_mode: u16,
    pub file_mode: u16,
    pub read_only: bool,
    pub allow_overwrite: bool,
    pub allow_delete: bool,
    pub incremental_upload: bool,
    pub read_part_size: u64,
    pub write_part_size: u64,
    /// How long lookups, attributes and listings are trusted.
    pub metadata_ttl: Duration,
    pub negative_metadata_ttl: Duration,
}

pub struct S3Filesystem {
    _client: Arc<dyn ObjectClient>,
    _config: FsConfig,
}

impl S3Filesystem {
    pub fn new(client: Arc<dyn ObjectClient>, config: FsConfig) -> S3Filesystem {
        S3Filesystem { _client: client, _config: config }
    }
}
