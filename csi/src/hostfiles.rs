//! Files the driver keeps on the host for its daemons: the expressfs binary (by content hash) and copies
//! of the driver's own credential tokens. Written through /proc/HOST/root, so the driver needs no hostPath
//! volume for them and the paths it hands the daemons are the host's.

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// IRSA and EKS Pod Identity give the driver a token file inside its container, which a daemon in the
/// host's mount namespace cannot open. The driver keeps a copy on the host (kubelet rotates the original)
/// and points the daemons' variable at it.
#[derive(Clone)]
pub struct TokenCopy {
    /// AWS_WEB_IDENTITY_TOKEN_FILE or AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE.
    pub variable: &'static str,
    pub source: PathBuf,
    /// Host path of the copy.
    pub copy: PathBuf,
    /// The copy as the driver reaches it.
    pub reachable: PathBuf,
}

/// Replaces `path` with `content` (mode 0600) in one rename, so a reader never sees half a token.
pub fn write_private(path: &Path, content: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let temporary = path.with_extension(format!("tmp.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        write_new_private(&temporary, content)?;
        std::fs::rename(&temporary, path)
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(&temporary);
    })
}

/// Writes `content` to a file of its own at `path`, mode 0600 whatever was there: a leftover file (of any
/// mode) or a symbolic link is removed first, never written through. A failed write leaves no file.
pub fn write_new_private(path: &Path, content: &[u8]) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.write_all(content)
        .and_then(|()| file.sync_all())
        .inspect_err(|_| {
            let _ = std::fs::remove_file(path);
        })
}

impl TokenCopy {
    pub fn refresh(&self) -> Result<(), String> {
        let token = std::fs::read(&self.source)
            .map_err(|e| format!("reading {}: {e}", self.source.display()))?;
        write_private(&self.reachable, &token)
            .map_err(|e| format!("writing {}: {e}", self.reachable.display()))
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `path` (absolute, in the host's mount namespace) as the driver reaches it: /proc/HOST/root/path.
pub fn through_root(host_proc: &Path, path: &Path) -> PathBuf {
    host_proc
        .join("root")
        .join(path.strip_prefix("/").unwrap_or(path))
}

/// Copies `source` to HOST_DIR/bin/SHA256-PREFIX/expressfs unless that file is there with the same
/// content. A temporary name and a rename make it atomic: a half-written binary is never executable
/// under the final name. Returns the host path.
pub fn install(source: &Path, host_proc: &Path, host_dir: &Path) -> Result<PathBuf, String> {
    let digest = file_digest(source)?;
    let dir = host_dir.join("bin").join(&digest[..16]);
    let binary = dir.join("expressfs");
    let reachable = through_root(host_proc, &binary);
    if file_digest(&reachable).ok().as_deref() == Some(digest.as_str()) {
        return Ok(binary);
    }
    let reachable_dir = through_root(host_proc, &dir);
    std::fs::create_dir_all(&reachable_dir)
        .map_err(|e| format!("creating {}: {e}", reachable_dir.display()))?;
    let temporary = reachable_dir.join(format!(".expressfs.{}", std::process::id()));
    let copy = || -> std::io::Result<()> {
        let mut input = std::fs::File::open(source)?;
        let mut output = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o755)
            .open(&temporary)?;
        std::io::copy(&mut input, &mut output)?;
        output.set_permissions(std::fs::Permissions::from_mode(0o755))?;
        output.sync_all()?;
        std::fs::rename(&temporary, &reachable)
    };
    copy().map_err(|e| {
        let _ = std::fs::remove_file(&temporary);
        format!(
            "installing {} as {}: {e}",
            source.display(),
            reachable.display()
        )
    })?;
    Ok(binary)
}

/// Removes the binaries under HOST_DIR/bin that are neither `keep` nor run by a live process (a daemon
/// mounted by an older driver keeps its binary until it exits; the next driver start collects it).
pub fn collect_old_binaries(host_proc: &Path, host_dir: &Path, keep: &Path) {
    let bin = host_dir.join("bin");
    let Ok(entries) = std::fs::read_dir(through_root(host_proc, &bin)) else {
        return;
    };
    let running: Vec<PathBuf> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|p| std::fs::read_link(p.path().join("exe")).ok())
        .collect();
    for entry in entries.flatten() {
        let binary = bin.join(entry.file_name()).join("expressfs");
        let in_use = running.iter().any(|exe| {
            exe.as_os_str()
                .as_encoded_bytes()
                .starts_with(binary.as_os_str().as_encoded_bytes())
        });
        if binary != keep && !in_use && entry.path().is_dir() {
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => tracing::info!(binary = %binary.display(), "removed an unused expressfs"),
                Err(e) => {
                    tracing::warn!(binary = %binary.display(), "removing an unused expressfs: {e}")
                }
            }
        }
    }
}

fn file_digest(path: &Path) -> Result<String, String> {
    let mut file =
        std::fs::File::open(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buffer)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_files_replace_what_was_there_and_follow_no_link() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"public").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path = dir.path().join("run/unit.env");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        write_new_private(&path, b"AWS_SECRET_ACCESS_KEY=\"s\"\n").unwrap();
        assert_eq!(
            std::fs::read(&victim).unwrap(),
            b"public",
            "written through a link"
        );
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.mode() & 0o777, 0o600);
        // A leftover readable by others is replaced, not reused with its mode.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_new_private(&path, b"x").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read(&path).unwrap(), b"x");
        // The same for the tokens' temporary file.
        let token = dir.path().join("credentials/t/web-identity-token");
        std::fs::create_dir_all(token.parent().unwrap()).unwrap();
        let temporary = token.with_extension(format!("tmp.{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &temporary).unwrap();
        write_private(&token, b"a.b.c").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"public");
        assert_eq!(std::fs::read(&token).unwrap(), b"a.b.c");
        assert_eq!(std::fs::metadata(&token).unwrap().mode() & 0o777, 0o600);
    }

    #[test]
    fn installs_by_content_once() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("expressfs");
        std::fs::write(&source, b"#!/bin/sh\n").unwrap();
        let me = PathBuf::from(format!("/proc/{}", std::process::id()));
        let host_dir = dir.path().join("host");
        let first = install(&source, &me, &host_dir).unwrap();
        assert!(first.starts_with(host_dir.join("bin")) && first.ends_with("expressfs"));
        assert_eq!(std::fs::read(&first).unwrap(), b"#!/bin/sh\n");
        let mode = std::fs::metadata(&first).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        // A damaged copy is replaced; another content gets another directory.
        std::fs::write(&first, b"garbage").unwrap();
        assert_eq!(install(&source, &me, &host_dir).unwrap(), first);
        assert_eq!(std::fs::read(&first).unwrap(), b"#!/bin/sh\n");
        std::fs::write(&source, b"#!/bin/sh\nexit 0\n").unwrap();
        let second = install(&source, &me, &host_dir).unwrap();
        assert_ne!(second, first);
        assert!(first.is_file(), "the binary of running daemons stays");
        let leftovers = std::fs::read_dir(first.parent().unwrap()).unwrap().count();
        assert_eq!(leftovers, 1, "no temporary file left");
        // One that a process runs stays (a daemon of an older driver); one nothing runs goes.
        let running = host_dir.join("bin/00000000feedface/expressfs");
        std::fs::create_dir_all(running.parent().unwrap()).unwrap();
        std::fs::copy("/bin/sleep", &running).unwrap();
        let mut child = std::process::Command::new(&running)
            .arg("30")
            .spawn()
            .unwrap();
        collect_old_binaries(&me, &host_dir, &second);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!first.parent().unwrap().exists());
        assert!(second.is_file());
        assert!(running.is_file());
    }
}
