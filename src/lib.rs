//! expressfs: a FUSE file system for S3 Express One Zone directory buckets (and general-purpose buckets).
//!
//! Layers, top to bottom:
//! - [`cli`], [`bucket`], [`daemon`], [`logging`]: command line, bucket-name rules, process lifecycle.
//! - [`fuse`]: thin adapter from fuser callbacks to the core; the only place errno is chosen.
//! - [`fs`]: the file system core (inodes, lookup, readdir, read and write handles). No fuser types.
//! - [`buffers`]: spare multi-MiB buffers for GET bodies and upload parts.
//! - [`cache`]: the local block cache, a layer around the object client for reads.
//! - [`s3`]: the object client trait, its aws-sdk-s3 implementation and an in-memory fake for tests
//!   (the fake and `fs::model_ops` exist only under `cfg(test)` or the `testing` feature).

pub mod bucket;
pub mod buffers;
pub mod cache;
pub mod cli;
pub mod daemon;
pub mod fs;
pub mod fuse;
pub mod logging;
pub mod memory;
pub mod s3;
