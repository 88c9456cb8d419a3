//! Errors of the file system core. The FUSE adapter maps each to one errno (in `fuse::errno`), so every
//! distinction that decides an errno is a variant here: the edge never looks inside a client error.
//!
//! Variants that wrap a cause keep it as their `source` and show only their own context, so a log line
//! built with [`FsError::chain`] reads "context: cause: cause of the cause" without repeats.

use std::sync::Arc;

use crate::s3::ClientError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotADirectory,
    #[error("is a directory")]
    IsADirectory,
    #[error("file name too long (over 255 bytes)")]
    NameTooLong,
    /// Keys are UTF-8; a name that is not cannot exist in the bucket.
    #[error("file name is not UTF-8")]
    NameNotUtf8,
    #[error("already exists")]
    Exists,
    #[error("directory not empty")]
    NotEmpty,
    #[error("read-only file system")]
    ReadOnly,
    #[error("not permitted: {0}")]
    NotPermitted(&'static str),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("busy: {0}")]
    Busy(&'static str),
    #[error("too many files open for writing (limit {0})")]
    TooManyWriters(usize),
    #[error("not supported here: {0}")]
    CrossDevice(&'static str),
    /// O_NOFOLLOW open of a symbolic link.
    #[error("too many levels of symbolic links")]
    SymlinkLoop,
    #[error("bad file handle")]
    BadHandle,
    /// The node was looked up by a name that no longer stands for it (unlinked or replaced since), or its
    /// object is gone: the kernel walks the path again.
    #[error("the name no longer stands for this file")]
    Stale,
    #[error("{key}: the object changed since it was opened")]
    ObjectChanged { key: String },
    /// The service refused us (403), or there are no credentials at all.
    #[error("{key}")]
    AccessDenied {
        key: String,
        #[source]
        source: ClientError,
    },
    /// The bucket or server does not offer the operation.
    #[error("{key}")]
    Unsupported {
        key: String,
        #[source]
        source: ClientError,
    },
    /// Any other failure of a request about `key`.
    #[error("{key}")]
    Client {
        key: String,
        #[source]
        source: ClientError,
    },
    /// A staged file would pass `--max-staged-file-size`.
    #[error("{0}: the staged file would exceed --max-staged-file-size")]
    TooBig(String),
    #[error("operation not supported: {0}")]
    OperationNotSupported(&'static str),
    /// A warm-up asked to keep a file that no cache of this mount can hold (over `--cache-xz`'s size limit
    /// with no `--cache`, or opened with O_DIRECT).
    #[error("no cache of this mount keeps this file")]
    NotCacheable,
    #[error("{0}: no space left in the staging directory")]
    NoSpace(String),
    /// A local file (staging, local copy) could not be used.
    #[error("{what}")]
    Local {
        what: String,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A background task (a part upload, a fetch) panicked or was cancelled.
    #[error("{what}")]
    Task {
        what: String,
        #[source]
        source: Arc<tokio::task::JoinError>,
    },
    /// An inconsistency with no underlying error (a body shorter than its range).
    #[error("{0}")]
    Io(String),
}

impl FsError {
    /// A local file could not be written; a full disk is told apart.
    pub fn local(what: &str, e: std::io::Error) -> FsError {
        if e.raw_os_error() == Some(libc::ENOSPC) {
            FsError::NoSpace(what.to_string())
        } else {
            FsError::io(what, e)
        }
    }

    /// A local file operation failed (EIO whatever the cause).
    pub fn io(what: &str, e: std::io::Error) -> FsError {
        FsError::Local {
            what: what.to_string(),
            source: Arc::new(e),
        }
    }

    /// A background task ended without its answer.
    pub fn task(what: &str, e: tokio::task::JoinError) -> FsError {
        FsError::Task {
            what: what.to_string(),
            source: Arc::new(e),
        }
    }

    /// Wraps a client error with the key it concerned, sorted by what the caller of the file system can do
    /// about it: a missing object, a changed one, a refusal, an unsupported operation, anything else.
    pub fn client(key: &str, source: ClientError) -> FsError {
        // No key string for a missing object: every negative lookup comes through here.
        let key = || key.to_string();
        match source {
            ClientError::NotFound { .. } => FsError::NotFound,
            ClientError::PreconditionFailed { .. } => FsError::ObjectChanged { key: key() },
            ClientError::AccessDenied { .. } | ClientError::NoCredentials(_) => {
                FsError::AccessDenied { key: key(), source }
            }
            ClientError::NotSupported(_) => FsError::Unsupported { key: key(), source },
            source => FsError::Client { key: key(), source },
        }
    }

    /// The error and every cause under it, for logs.
    pub fn chain(&self) -> Chain<'_> {
        Chain(self)
    }
}

/// Displays an error followed by its sources, separated by ": ".
pub struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            write!(f, ": {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

pub type FsResult<T> = Result<T, FsError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_are_sorted_by_what_they_mean() {
        let denied = ClientError::AccessDenied {
            code: "AccessDenied".into(),
            message: "no".into(),
        };
        assert!(matches!(
            FsError::client("k", denied),
            FsError::AccessDenied { ref key, .. } if key == "k"
        ));
        assert!(matches!(
            FsError::client("k", ClientError::NoCredentials("none".into())),
            FsError::AccessDenied { .. }
        ));
        assert!(matches!(
            FsError::client("k", ClientError::NotSupported("rename".into())),
            FsError::Unsupported { .. }
        ));
        assert!(matches!(
            FsError::client("k", ClientError::NotFound { key: "k".into() }),
            FsError::NotFound
        ));
        assert!(matches!(
            FsError::client("k", ClientError::PreconditionFailed { key: "k".into() }),
            FsError::ObjectChanged { .. }
        ));
        assert!(matches!(
            FsError::client("k", ClientError::Malformed("xml".into())),
            FsError::Client { .. }
        ));
    }

    #[test]
    fn the_chain_keeps_every_cause_once() {
        let e = FsError::client(
            "data/a",
            ClientError::Transient {
                code: "SlowDown".into(),
                message: "reduce your rate".into(),
            },
        );
        assert_eq!(e.to_string(), "data/a");
        assert_eq!(
            e.chain().to_string(),
            "data/a: transient failure after retries (SlowDown): reduce your rate"
        );
        let io = FsError::io(
            "data/a: staging file",
            std::io::Error::other("disk on fire"),
        );
        assert_eq!(io.chain().to_string(), "data/a: staging file: disk on fire");
        assert!(std::error::Error::source(&io).is_some());
        let full = FsError::local(
            "data/a: staging file",
            std::io::Error::from_raw_os_error(libc::ENOSPC),
        );
        assert!(matches!(full, FsError::NoSpace(_)));
    }
}
