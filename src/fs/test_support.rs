//! What the core's unit tests share: a file system over the in-memory fake client.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinHandle;

use super::{FsConfig, FsResult, OpenMode, ROOT_INO, S3Filesystem};
use crate::s3::fake::{FakeClient, Gate, Op};
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

/// A file whose release uploads it (no flush of its own came first, as when its close came from another
/// process) while that upload is held, so no handle reaches the writer any more; and what a call made
/// meanwhile answers.
pub struct Landing {
    pub fake: Arc<FakeClient>,
    pub fs: Arc<S3Filesystem>,
    /// The file's inode.
    pub ino: u64,
    gate: Gate,
    release: JoinHandle<FsResult<()>>,
}

impl Landing {
    /// `f` created and written (in the new directory `under` if given, in a bucket holding `seed`, mounted
    /// with `cfg`), its release's PutObject held at the fake's gate.
    pub async fn held(
        directory: bool,
        cfg: FsConfig,
        under: Option<&str>,
        seed: &[(&str, &[u8])],
    ) -> Landing {
        Landing::held_after(directory, cfg, under, seed, |_| async {}).await
    }

    /// [`Landing::held`], with `meanwhile` done to the bucket (another client's request, say) after `f` is
    /// written and before its release.
    pub async fn held_after<F>(
        directory: bool,
        cfg: FsConfig,
        under: Option<&str>,
        seed: &[(&str, &[u8])],
        meanwhile: impl FnOnce(Arc<FakeClient>) -> F,
    ) -> Landing
    where
        F: Future<Output = ()>,
    {
        let (fake, fs) = fs_with(seed, cfg, directory).await;
        let fs = Arc::new(fs);
        let parent = match under {
            Some(name) => fs.sb.mkdir(ROOT_INO, name).await.unwrap().ino,
            None => ROOT_INO,
        };
        let (attr, fh) = fs.create(parent, "f", 1).await.unwrap();
        fs.write(fh, 0, b"written").await.unwrap();
        meanwhile(Arc::clone(&fake)).await;
        let gate = fake.faults().hold(Op::Put);
        let release = tokio::spawn({
            let fs = Arc::clone(&fs);
            async move { fs.release(fh).await }
        });
        while gate.held() == 0 {
            tokio::task::yield_now().await;
        }
        Landing {
            fake,
            fs,
            ino: attr.ino,
            gate,
            release,
        }
    }

    /// Runs `call` on the file system meanwhile: it must still be waiting 100 ms later, and is answered once
    /// the upload lands.
    pub async fn answer<T, F>(self, call: impl FnOnce(Arc<S3Filesystem>) -> F) -> T
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let (answer, released) = self.answer_and_release(call).await;
        released.unwrap();
        answer
    }

    /// [`Landing::answer`], with what the release said instead of expecting it to succeed.
    pub async fn answer_and_release<T, F>(
        self,
        call: impl FnOnce(Arc<S3Filesystem>) -> F,
    ) -> (T, FsResult<()>)
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let call = tokio::spawn(call(Arc::clone(&self.fs)));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!call.is_finished(), "answered before the upload landed");
        self.gate.open();
        let released = self.release.await.unwrap();
        (call.await.unwrap(), released)
    }
}
