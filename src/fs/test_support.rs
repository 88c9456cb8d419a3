//! What the core's unit tests share: a file system over the in-memory fake client.

use std::sync::Arc;

use bytes::Bytes;

use super::{FsConfig, OpenMode, S3Filesystem};
use crate::s3::fake::FakeClient;
use crate::s3::{ObjectClient, WriteCondition};

pub async fn fs_with(
    keys: &[(&str, &[u8])],
    config: FsConfig,
    directory: bool,
) -> (Arc<FakeClient>, S3Filesystem) {
    let fake = Arc::new(FakeClient::new("b", directory));
    for (k, v) in keys {
        fake.put_object(k, Bytes::copy_from_slice(v), WriteCondition::None)
            .await
            .unwrap();
    }
    let client: Arc<dyn ObjectClient> = fake.clone();
    (fake, S3Filesystem::new(client, config))
}

pub fn config() -> FsConfig {
    FsConfig::new(1000, 1000)
}

/// open(2) with O_RDWR, without O_TRUNC.
pub const RW: OpenMode = OpenMode {
    direct: false,
    write: true,
    read: true,
    truncate: false,
    append: false,
    not_for_reading: false,
};

/// open(2) with O_RDONLY.
pub const RO: OpenMode = OpenMode { write: false, ..RW };

/// [`config`] with `--allow-overwrite` and staged files in `dir`.
pub fn overwriting(dir: &tempfile::TempDir) -> FsConfig {
    let mut c = config();
    c.allow_overwrite = true;
    c.staging_dir = Some(dir.path().to_path_buf());
    c
}
