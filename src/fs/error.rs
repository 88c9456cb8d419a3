//! Errors of the file system core. The FUSE adapter maps each to one errno (in `fuse::errno`).

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
    #[error("bad file handle")]
    BadHandle,
    #[error("{key}: the object changed since it was opened")]
    ObjectChanged { key: String },
    #[error("{key}: {source}")]
    Client {
        key: String,
        #[source]
        source: ClientError,
    },
    #[error("{0}: no space left in the staging directory")]
    NoSpace(String),
    #[error("{0}")]
    Io(String),
}

impl FsError {
    /// A local file (staging, local copy) could not be written; a full disk is told apart.
    pub fn local(what: &str, e: std::io::Error) -> FsError {
        if e.raw_os_error() == Some(libc::ENOSPC) {
            FsError::NoSpace(what.to_string())
        } else {
            FsError::Io(format!("{what}: {e}"))
        }
    }

    /// Wraps a client error with the key it concerned; NotFound and a changed object get their own kinds.
    pub fn client(key: &str, source: ClientError) -> FsError {
        match source {
            ClientError::NotFound { .. } => FsError::NotFound,
            ClientError::PreconditionFailed { .. } => FsError::ObjectChanged {
                key: key.to_string(),
            },
            source => FsError::Client {
                key: key.to_string(),
                source,
            },
        }
    }
}

pub type FsResult<T> = Result<T, FsError>;
