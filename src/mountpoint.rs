//! The mount point before mounting: an empty directory, or a dead mount of ours that a daemon left when it
//! died (detached lazily, then mounted over, which is what a `Restart=on-failure` unit needs). A live FUSE
//! mount, or a dead mount of another file system, is refused: it is not ours to take down.
//!
//! Or `/dev/fd/N`: a FUSE device descriptor that the caller opened and mounted itself, as mount-s3 takes it,
//! so that a daemon without the right to mount (a container, a CSI driver's unprivileged pod) can serve it.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

/// Where the file system is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountTarget {
    /// A directory the daemon mounts on (and unmounts at SIGTERM).
    Directory(PathBuf),
    /// `/dev/fd/N`: an open `/dev/fuse` descriptor already mounted by the caller, which also unmounts it.
    Descriptor(RawFd),
}

impl MountTarget {
    /// `/dev/fd/N` names a descriptor; any other path is a directory. A `/dev/fd/` path whose rest is not
    /// a descriptor number is refused rather than taken for a directory.
    pub fn parse(path: &Path) -> Result<MountTarget, String> {
        let Some(rest) = path.to_str().and_then(|p| p.strip_prefix("/dev/fd/")) else {
            return Ok(MountTarget::Directory(path.to_path_buf()));
        };
        // Digits only: `parse` alone would take "+3".
        let number = rest
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| rest.parse::<RawFd>().ok())
            .flatten();
        match number {
            // The daemon's standard streams: it points them at /dev/null when it detaches.
            Some(0..=2) => Err(format!(
                "mount point {}: descriptors 0-2 are standard input, output and error; pass the FUSE descriptor as 3 or above",
                path.display()
            )),
            Some(fd) => Ok(MountTarget::Descriptor(fd)),
            None => Err(format!(
                "mount point {}: a /dev/fd/ mount point must be /dev/fd/N, N the number of an open /dev/fuse descriptor",
                path.display()
            )),
        }
    }
}

/// `/dev/fuse` is character device 10:229.
const FUSE_DEVICE: (u32, u32) = (10, 229);

/// Checks that descriptor `fd` is open and is `/dev/fuse` (what the caller mounted with `fd=N`).
pub fn check_fuse_descriptor(fd: RawFd) -> Result<(), String> {
    use std::os::fd::BorrowedFd;
    // SAFETY: only fstat'ed here; the descriptor is not closed or kept.
    let stat = nix::sys::stat::fstat(unsafe { BorrowedFd::borrow_raw(fd) }).map_err(|e| {
        if e == nix::errno::Errno::EBADF {
            format!(
                "mount point /dev/fd/{fd}: descriptor {fd} is not open in this process \
                 (pass the mounted /dev/fuse descriptor without close-on-exec)"
            )
        } else {
            format!("mount point /dev/fd/{fd}: {e}")
        }
    })?;
    let is_char = stat.st_mode & libc::S_IFMT == libc::S_IFCHR;
    let rdev = stat.st_rdev;
    if !is_char || (libc::major(rdev), libc::minor(rdev)) != FUSE_DEVICE {
        return Err(format!(
            "mount point /dev/fd/{fd}: descriptor {fd} is not /dev/fuse \
             (open /dev/fuse, mount it with fd={fd}, then start expressfs with it)"
        ));
    }
    Ok(())
}

/// One line of /proc/self/mountinfo, the fields we judge by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub fstype: String,
    pub source: String,
    /// The device number of the mount (`st_dev` of its root), which tells two mounts at one path apart.
    pub device: u64,
}

impl MountEntry {
    /// Ours: `fuse.expressfs` (through fusermount3), or plain `fuse` (mount(2) as root ignores the subtype)
    /// with our `expressfs:BUCKET` source.
    pub fn is_ours(&self) -> bool {
        self.fstype == "fuse.expressfs"
            || (self.fstype.starts_with("fuse") && self.source.starts_with("expressfs:"))
    }

    fn describe(&self) -> String {
        format!("type {}, source {}", self.fstype, self.source)
    }
}

/// Checks `path` and clears a dead mount of ours from it. Returns what was done, for the log, once the
/// logs are set up.
pub fn prepare(path: &Path) -> Result<Option<String>, String> {
    let mut note = None;
    // Several crashes in a row stack dead mounts; each pass detaches the top one.
    for _ in 0..8 {
        match std::fs::metadata(path) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                let at = resolved(path);
                let entry = mountinfo()
                    .and_then(|info| mounted_at(&info, &at))
                    .ok_or_else(|| format!("mount point {}: {e}", path.display()))?;
                if !entry.is_ours() {
                    return Err(format!(
                        "mount point {} is a dead mount of another file system ({}); \
                         unmount it first (umount -l {})",
                        path.display(),
                        entry.describe(),
                        path.display()
                    ));
                }
                detach(&at).map_err(|e| {
                    format!(
                        "mount point {} is a dead expressfs mount that could not be detached ({e})",
                        path.display()
                    )
                })?;
                note = Some(format!(
                    "mount point {} was a dead expressfs mount ({}) left by a daemon that exited; \
                     detached it lazily",
                    path.display(),
                    entry.describe()
                ));
            }
            Err(e) => return Err(format!("mount point {}: {e}", path.display())),
            Ok(meta) => {
                if !meta.is_dir() {
                    return Err(format!("mount point {} is not a directory", path.display()));
                }
                if let Some(entry) = mountinfo()
                    .and_then(|info| mounted_at(&info, &resolved(path)))
                    .filter(|e| e.fstype.starts_with("fuse"))
                {
                    return Err(format!(
                        "mount point {} is already a live FUSE mount ({}); unmount it first",
                        path.display(),
                        entry.describe()
                    ));
                }
                let mut entries = std::fs::read_dir(path)
                    .map_err(|e| format!("mount point {}: {e}", path.display()))?;
                if entries.next().is_some() {
                    return Err(format!("mount point {} is not empty", path.display()));
                }
                return Ok(note);
            }
        }
    }
    Err(format!(
        "mount point {}: dead mounts are stacked deeper than expected; unmount them (umount -l)",
        path.display()
    ))
}

/// The path as mountinfo writes it: absolute, with the parent's symlinks resolved (the path itself cannot
/// be resolved while its mount is dead).
pub fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match (absolute.parent(), absolute.file_name()) {
        (Some(parent), Some(name)) => parent
            .canonicalize()
            .map_or_else(|_| absolute.clone(), |p| p.join(name)),
        _ => absolute,
    }
}

pub fn mountinfo() -> Option<String> {
    std::fs::read_to_string("/proc/self/mountinfo").ok()
}

/// The topmost mount at `at` (later lines are mounted over earlier ones).
pub fn mounted_at(info: &str, at: &Path) -> Option<MountEntry> {
    let at = at.to_string_lossy();
    info.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        if unescape(fields.get(4)?) != at {
            return None;
        }
        // Optional fields end at "-"; then come the type and the source.
        let dash = fields.iter().position(|f| *f == "-")?;
        let (major, minor) = fields.get(2)?.split_once(':')?;
        Some(MountEntry {
            fstype: unescape(fields.get(dash + 1)?),
            source: unescape(fields.get(dash + 2)?),
            device: libc::makedev(major.parse().ok()?, minor.parse().ok()?),
        })
    })
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Lazy unmount: umount2(MNT_DETACH) as root, else fusermount3 -u -z (a user's own FUSE mount). The error
/// says why neither worked.
pub fn detach(at: &Path) -> Result<(), String> {
    let direct = nix::mount::umount2(at, nix::mount::MntFlags::MNT_DETACH);
    if direct.is_ok() {
        return Ok(());
    }
    let helper = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(at)
        .stdin(std::process::Stdio::null())
        .output();
    let because = match helper {
        Ok(out) if out.status.success() => return Ok(()),
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
        Err(e) => e.to_string(),
    };
    Err(format!("{:?}; fusermount3: {because}", direct.unwrap_err()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_fd_paths_name_descriptors_and_nothing_else_does() {
        assert_eq!(
            MountTarget::parse(Path::new("/dev/fd/5")),
            Ok(MountTarget::Descriptor(5))
        );
        assert_eq!(
            MountTarget::parse(Path::new("/mnt/data")),
            Ok(MountTarget::Directory(PathBuf::from("/mnt/data")))
        );
        assert_eq!(
            MountTarget::parse(Path::new("/dev/fdx/5")),
            Ok(MountTarget::Directory(PathBuf::from("/dev/fdx/5")))
        );
        for bad in [
            "/dev/fd/",
            "/dev/fd/x",
            "/dev/fd/-1",
            "/dev/fd/+3",
            "/dev/fd/3/",
        ] {
            let e = MountTarget::parse(Path::new(bad)).unwrap_err();
            assert!(e.contains("/dev/fd/N"), "{bad}: {e}");
        }
        for standard in ["/dev/fd/0", "/dev/fd/1", "/dev/fd/2"] {
            let e = MountTarget::parse(Path::new(standard)).unwrap_err();
            assert!(e.contains("3 or above"), "{standard}: {e}");
        }
    }

    #[test]
    fn only_an_open_fuse_device_is_taken_as_a_descriptor() {
        let null = std::fs::File::open("/dev/null").unwrap();
        use std::os::fd::AsRawFd;
        let e = check_fuse_descriptor(null.as_raw_fd()).unwrap_err();
        assert!(e.contains("is not /dev/fuse"), "{e}");
        // A number no descriptor of this process has (tests run in parallel threads: a freed one is reused).
        let e = check_fuse_descriptor(999_999).unwrap_err();
        assert!(e.contains("is not open"), "{e}");
        if let Ok(fuse) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
        {
            check_fuse_descriptor(fuse.as_raw_fd()).unwrap();
        }
    }

    const INFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
90 22 0:50 / /mnt/data rw,nosuid,nodev,relatime shared:40 - fuse expressfs:train--use1-az4--x-s3 rw,user_id=0
91 22 0:51 / /mnt/other rw,relatime - fuse.sshfs host:/srv rw
92 22 0:52 / /mnt/with\\040space rw - fuse.expressfs expressfs:b rw
93 90 0:53 / /mnt/data rw - tmpfs tmpfs rw
";

    #[test]
    fn mountinfo_lines_are_read_by_mount_point_topmost_last() {
        let ours = mounted_at(INFO, Path::new("/mnt/with space")).unwrap();
        assert_eq!(ours.fstype, "fuse.expressfs");
        assert!(ours.is_ours());
        let sshfs = mounted_at(INFO, Path::new("/mnt/other")).unwrap();
        assert_eq!(sshfs.source, "host:/srv");
        assert_eq!(sshfs.device, libc::makedev(0, 51));
        assert!(!sshfs.is_ours());
        // A tmpfs mounted over our mount at the same place is what a stat there meets.
        let top = mounted_at(INFO, Path::new("/mnt/data")).unwrap();
        assert_eq!(top.fstype, "tmpfs");
        assert!(mounted_at(INFO, Path::new("/mnt")).is_none());
        assert!(
            MountEntry {
                fstype: "fuse".into(),
                source: "expressfs:b/p".into(),
                device: 0,
            }
            .is_ours()
        );
        assert!(
            !MountEntry {
                fstype: "fuse".into(),
                source: "s3fs".into(),
                device: 0,
            }
            .is_ours()
        );
    }

    #[test]
    fn plain_directories_pass_and_files_or_full_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(prepare(dir.path()), Ok(None));
        std::fs::write(dir.path().join("x"), b"x").unwrap();
        assert!(prepare(dir.path()).unwrap_err().contains("not empty"));
        assert!(
            prepare(&dir.path().join("x"))
                .unwrap_err()
                .contains("not a directory")
        );
        assert!(
            prepare(&dir.path().join("missing"))
                .unwrap_err()
                .contains("No such file")
        );
    }
}
