//! expressfs: a FUSE file system for S3 Express One Zone directory buckets (and general-purpose buckets).
//!
//! Layers, top to bottom:
//! - [`cli`], [`config`], [`bucket`], [`daemon`], [`logging`], [`metrics`]: command line, what each flag
//!   means for each layer, bucket-name rules, process lifecycle, logs and metric names.
//! - [`mountpoint`]: the mount point's checks, and the lazy unmount of a dead mount of ours.
//! - [`warm`]: `expressfs warm`, which reads trees through a running mount to fill its caches.
//! - [`stack`]: puts the object client and the caches together under the file system.
//! - [`fuse`]: thin adapter from fuser callbacks to the core; the only place errno is chosen.
//! - [`fs`]: the file system core (inodes, lookup, readdir, read and write handles). No fuser types.
//! - [`buffers`]: spare multi-MiB buffers for GET bodies and upload parts.
//! - [`source`]: where the read path gets file data: the bucket, or caches stacked on it.
//! - [`cache`]: the caches (local blocks on disk, small objects in a shared bucket), layers of [`source`].
//! - [`s3`]: the object client trait, its aws-sdk-s3 implementation and an in-memory fake for tests
//!   (the fake and `fs::model_ops` exist only under `cfg(test)` or the `testing` feature).

pub mod alloc;
pub mod bucket;
pub mod buffers;
pub mod cache;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod fs;
pub mod fuse;
pub mod idle;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod mountpoint;
pub mod s3;
pub mod source;
pub mod stack;
pub mod warm;
