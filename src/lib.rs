//! expressfs: a FUSE file system for S3 Express One Zone directory buckets (and general-purpose buckets).
//!
//! Layers, top to bottom:
//! - [`cli`], [`bucket`], [`daemon`], [`logging`]: command line, bucket-name rules, process lifecycle.
//! - [`fuse`]: thin adapter from fuser callbacks to the core; the only place errno is chosen.
//! - [`fs`]: the file system core (inodes, lookup, readdir, read and write handles). No fuser types.
//! - [`buffers`]: spare multi-MiB buffers for GET bodies and upload parts.
//! - [`source`]: where the read path gets file data: the bucket, or caches stacked on it.
//! - [`cache`]: the caches (local blocks on disk, small objects in a shared bucket), layers of [`source`].
//! - [`s3`]: the object client trait, its aws-sdk-s3 implementation and an in-memory fake for unit tests.

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
pub mod source;
