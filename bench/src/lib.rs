//! The pieces shared by `expressfs-bench` (the benchmark table) and `expressfs-soak` (the long fault run):
//! the raw S3 client and data patterns, mounting expressfs and the peers, workloads, report and chart.

pub mod chart;
pub mod mounts;
pub mod peers;
pub mod pytorch;
pub mod report;
pub mod s3;
pub mod shards;
pub mod workloads;
