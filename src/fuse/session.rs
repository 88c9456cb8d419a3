//! The mount's life: mounting (on a path, or on a descriptor handed over), serving on fuser's threads, and
//! unmounting, with the releases still under way finished before the runtime goes.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fuser::{Config, MountOption, SessionACL};
use tracing::{info, warn};

use super::{Adapter, FuseOptions, late_releases, lost_releases, tell_kernel};
use crate::fs::S3Filesystem;
use crate::mountpoint::MountTarget;

/// A live mount. Dropping it unmounts (a mount of ours; a descriptor's mount is its caller's).
pub struct MountedFs {
    session: fuser::BackgroundSession,
    closing: Closing,
    /// Served on a descriptor the caller mounted (`/dev/fd/N`): we have no mount to take down.
    by_descriptor: bool,
    /// Our mount: its path, and the device number its root had once mounted (which tells our mount from
    /// one made at the same path after someone else unmounted ours).
    ours: Option<(std::path::PathBuf, u64)>,
    /// Shared with the adapter: refuse every request from now on.
    stopping: Arc<std::sync::atomic::AtomicBool>,
}

/// What is left to do once the kernel session has ended ([`Closing::finish`]).
struct Closing {
    outstanding: Arc<Outstanding>,
    fs: Arc<S3Filesystem>,
    runtime: tokio::runtime::Handle,
}

/// Releases handed to the runtime and not finished yet. The kernel does not wait for a RELEASE before an
/// unmount completes, and a release may be uploading a file (the last handle of a staged file): the daemon
/// waits for these before its runtime shuts down, which would cancel them. (Other requests are not waited
/// for: after the unmount nobody reads their answers, and a lock request may wait forever.)
#[derive(Default)]
pub(super) struct Outstanding {
    count: std::sync::atomic::AtomicUsize,
}

/// One outstanding request; dropped when it is answered (or its task is cancelled).
pub(super) struct Counted(Arc<Outstanding>);

impl Outstanding {
    pub(super) fn begin(self: &Arc<Self>) -> Counted {
        self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Counted(Arc::clone(self))
    }

    fn now(&self) -> usize {
        self.count.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0
            .count
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Outstanding {
    /// Waits (at most `limit`) until none is left. Returns how many were left unfinished.
    fn finish(&self, limit: Duration) -> usize {
        let deadline = std::time::Instant::now() + limit;
        let mut said = false;
        loop {
            let left = self.now();
            if left == 0 || std::time::Instant::now() >= deadline {
                return left;
            }
            if !said {
                info!(
                    left,
                    "unmounted; finishing releases still in progress (uploads)"
                );
                said = true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl MountedFs {
    /// After the session ended: waits (at most `limit`) for releases still being worked on. Returns how many
    /// were left unfinished.
    pub fn finish_outstanding(&self, limit: Duration) -> usize {
        self.closing.finish(limit)
    }

    /// True once the kernel session has ended (e.g. after `umount`).
    pub fn is_finished(&self) -> bool {
        self.session.guard.is_finished()
    }

    /// Waits for the session to end after someone else's `umount`. fuser's session would unmount its path
    /// again when dropped, and by then that path may hold a new mount (`umount; mount` at once, as a
    /// remount does): the old daemon took the new one down. So the session is not dropped: the kernel side
    /// is gone already and the process exits next.
    pub fn join(mut self) -> std::io::Result<()> {
        let guard = std::mem::replace(&mut self.session.guard, std::thread::spawn(|| Ok(())));
        std::mem::forget(self.session);
        guard
            .join()
            .map_err(|_| std::io::Error::other("the file system's session thread panicked"))?
    }

    /// Unmounts, waits for the session to end, then (at most `limit`) for releases still being worked on.
    /// Returns how many were left unfinished.
    ///
    /// On a descriptor's mount there is nothing of ours to unmount, and its session ends only when the caller
    /// unmounts. So the session is shut first: every request from now on is refused (ENOTCONN), as the kernel
    /// will refuse them once the process has exited and closed the descriptor. Then the releases under way
    /// (files closed before, uploading) are finished, and files still open are abandoned, their multipart
    /// uploads aborted: uploading what a writer had written so far would leave a torn file that looks whole.
    /// Returns the releases left unfinished.
    pub fn unmount(self, limit: Duration) -> std::io::Result<usize> {
        let MountedFs {
            session,
            closing,
            by_descriptor,
            ours,
            stopping,
        } = self;
        let detached = match &ours {
            Some((path, dev)) if !session.guard.is_finished() => {
                take_down(path, *dev)? == TakenDown::Detached
            }
            _ => false,
        };
        if ours.is_some() && !by_descriptor && !detached {
            // Unmounted above, or by someone else already: the session ends by itself. Not through fuser's
            // own unmount, which (0.18) takes a mount that is gone for a live one and fails with EINVAL, and
            // which could take down a mount made at the same path since.
            join_ended(session)?;
            return Ok(closing.finish(limit));
        }
        if by_descriptor || detached {
            if detached {
                warn!(
                    "the mount was busy (files open, or a working directory in it): detached; its open files \
                     are abandoned"
                );
            }
            stopping.store(true, std::sync::atomic::Ordering::SeqCst);
            let left = closing.abandon(limit);
            std::mem::forget(session);
            return Ok(left);
        }
        // A mount whose path we could not tell apart at mount time: fuser unmounts it.
        session.umount_and_join()?;
        Ok(closing.finish(limit))
    }
}

/// Waits for the thread of a session whose kernel side is gone, without letting fuser unmount anything.
fn join_ended(mut session: fuser::BackgroundSession) -> std::io::Result<()> {
    let guard = std::mem::replace(&mut session.guard, std::thread::spawn(|| Ok(())));
    std::mem::forget(session);
    guard
        .join()
        .map_err(|_| std::io::Error::other("the file system's session thread panicked"))?
}

#[derive(Debug, PartialEq, Eq)]
enum TakenDown {
    /// Unmounted (or no longer ours to unmount): the session ends.
    Unmounted,
    /// Busy, so detached lazily: the path is free, and the connection lives while files on it are open.
    Detached,
}

/// Unmounts our mount at `path` (its root on device `dev`). With `--auto-unmount` fuser leaves that to
/// fusermount3, which (before libfuse 3.17) may not do it, and its plain unmount fails when the mount is
/// busy; so it is done here: as root with umount(2), lazily when busy, otherwise with `fusermount3 -u`.
fn take_down(path: &std::path::Path, dev: u64) -> std::io::Result<TakenDown> {
    use nix::errno::Errno;
    use nix::mount::{MntFlags, umount2};
    // A mount made at the same path after ours went is not ours to take down. (Asked of the mount table,
    // not of the mount's root: a stat there is a request to this very session, which may be stuck.)
    if mounted_device(path) != Some(dev) {
        return Ok(TakenDown::Unmounted);
    }
    // The kernel may call a mount busy for a moment while a last access drains: asked a few times before
    // it is detached.
    let mut busy = 0;
    loop {
        match umount2(path, MntFlags::empty()) {
            Ok(()) | Err(Errno::EINVAL) => return Ok(TakenDown::Unmounted),
            Err(Errno::EBUSY) if busy < 5 => {
                busy += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(Errno::EBUSY) => {
                crate::mountpoint::detach(path).map_err(std::io::Error::other)?;
                return Ok(TakenDown::Detached);
            }
            Err(Errno::EPERM) => break,
            Err(e) => return Err(e.into()),
        }
    }
    // Not root: the setuid helper unmounts for the user who mounted, lazily if it must.
    let unmounted = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg("-q")
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if unmounted {
        return Ok(TakenDown::Unmounted);
    }
    crate::mountpoint::detach(path)
        .map_err(|e| std::io::Error::other(format!("could not unmount {}: {e}", path.display())))?;
    Ok(TakenDown::Detached)
}

/// The device number of the topmost mount at `path`, if something is mounted there.
fn mounted_device(path: &std::path::Path) -> Option<u64> {
    crate::mountpoint::mounted_at(&crate::mountpoint::mountinfo()?, path).map(|entry| entry.device)
}

impl Closing {
    /// Waits for the releases under way, then runs `last` on the runtime, both within `limit`. Returns how
    /// many releases were left unfinished, and what `last` gave if it ended in time.
    fn after_outstanding<T, F>(
        &self,
        limit: Duration,
        last: impl FnOnce(Arc<S3Filesystem>) -> F,
    ) -> (usize, Option<T>)
    where
        F: Future<Output = T>,
    {
        let deadline = std::time::Instant::now() + limit;
        let left = self.outstanding.finish(limit);
        let rest = deadline.saturating_duration_since(std::time::Instant::now());
        let work = last(Arc::clone(&self.fs));
        // The timer is made inside the runtime: this thread is not one of its own.
        let done = self
            .runtime
            .block_on(async move { tokio::time::timeout(rest, work).await })
            .ok();
        (left, done)
    }

    /// The releases under way (at most `limit` in all), then every handle still open abandoned: nothing more
    /// of it is uploaded (logged with how many files had bytes the bucket lacks). For a session we stop
    /// serving while it is live. Returns how many releases were left unfinished.
    fn abandon(&self, limit: Duration) -> usize {
        let (left, abandoned) =
            self.after_outstanding(limit, |fs| async move { fs.abandon_all_left().await });
        match abandoned {
            Some(0) => {}
            Some(files) => warn!(
                files,
                "stopped while files were being written: what was written to them is not uploaded"
            ),
            None => warn!("stopped before every open file was abandoned"),
        }
        left
    }

    /// The releases under way first (at most `limit` in all), then every handle still open. The kernel tears
    /// a connection down at unmount with the requests it has not handed over yet, so the RELEASE of a file
    /// closed just before `umount` may never come; for a staged file that is the request that uploads it. No
    /// request can come any more, so those handles are released here, as the kernel would have. Returns how
    /// many releases were left unfinished.
    fn finish(&self, limit: Duration) -> usize {
        let (left, released) =
            self.after_outstanding(limit, |fs| async move { fs.release_all_left().await });
        match released {
            Some(0) => left,
            Some(released) => {
                info!(
                    released,
                    "released at unmount the handles whose release the kernel never sent"
                );
                left
            }
            None => left + 1,
        }
    }
}

/// How long a descriptor handed over may take to show its INIT: the kernel queues it at mount time, so a
/// descriptor mounted for us has it at once.
const INIT_WAIT: Duration = Duration::from_secs(5);

/// Waits (at most [`INIT_WAIT`]) until descriptor `fd` has something to read. One whose INIT another daemon
/// answered has nothing while its mount is idle, and the handshake would wait for an INIT that never comes.
/// (A descriptor not mounted yet is ready at once, with an error the handshake reports.)
fn wait_for_init(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    let mut waiting = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(INIT_WAIT.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: poll on one pollfd that lives for the call.
    match unsafe { libc::poll(&mut waiting, 1, ms) } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => Err(served_before(
            fd,
            &format!("no FUSE INIT within {INIT_WAIT:?}"),
        )),
        _ => Ok(()),
    }
}

fn served_before(fd: std::os::fd::RawFd, what: &str) -> std::io::Error {
    std::io::Error::other(format!(
        "{what}: descriptor {fd} was served by a daemon before (a FUSE descriptor is served once); \
         unmount it and mount a new one"
    ))
}

/// Mounts `fs` and starts serving it. Returns once the kernel has the mount.
pub fn mount(
    fs: Arc<S3Filesystem>,
    runtime: tokio::runtime::Handle,
    options: &FuseOptions,
) -> std::io::Result<MountedFs> {
    let release_delay = late_releases();
    if let Some(delay) = release_delay {
        warn!(
            ?delay,
            "test build: every release is held back (EXPRESSFS_TEST_RELEASE_DELAY_MS)"
        );
    }
    let drop_releases = lost_releases();
    if drop_releases {
        warn!("test build: every release is dropped (EXPRESSFS_TEST_DROP_RELEASES)");
    }
    let outstanding = Arc::new(Outstanding::default());
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let notifier = Arc::new(OnceLock::new());
    {
        let notifier = Arc::clone(&notifier);
        fs.on_kernel_notice(move |notice| tell_kernel(&notifier, notice));
    }
    let adapter = Adapter {
        fs: Arc::clone(&fs),
        runtime: runtime.clone(),
        outstanding: Arc::clone(&outstanding),
        block_size: 128 * 1024,
        release_delay,
        drop_releases,
        notifier: Arc::clone(&notifier),
        stopping: Arc::clone(&stopping),
    };
    let mut mount_options = vec![
        MountOption::FSName(options.fs_name.clone()),
        MountOption::Subtype("expressfs".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
    ];
    mount_options.push(if options.read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    if options.auto_unmount {
        mount_options.push(MountOption::AutoUnmount);
    }
    let acl = if options.allow_other {
        SessionACL::All
    } else if options.allow_root {
        SessionACL::RootAndOwner
    } else {
        SessionACL::Owner
    };
    let mut config = Config::default();
    config.mount_options = mount_options;
    config.acl = acl;
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = options.threads > 1;
    let session = match &options.target {
        MountTarget::Directory(path) => fuser::spawn_mount(adapter, path, &config)?,
        MountTarget::Descriptor(fd) => {
            // Not handed on to what the daemon runs (a credential_process, say).
            // SAFETY: fcntl on a descriptor number; it changes no memory.
            if unsafe { libc::fcntl(*fd, libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
                return Err(std::io::Error::last_os_error());
            }
            wait_for_init(*fd)?;
            // SAFETY: the descriptor was checked to be an open /dev/fuse (`check_fuse_descriptor`) and is
            // owned by the session from here on; nothing else in this process uses it.
            let owned = unsafe { OwnedFd::from_raw_fd(*fd) };
            // The caller's mount options decide who may enter, and the daemon's user need not be the mount's
            // owner (a CSI driver mounts as root for an unprivileged daemon). Every thread reads the one
            // descriptor: cloning it opens /dev/fuse, which such a daemon may not be able to.
            config.clone_fd = false;
            match fuser::Session::from_fd(adapter, owned, SessionACL::All, config) {
                Ok(session) => session.spawn()?,
                // The first request was not INIT: another daemon served this descriptor already.
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    return Err(served_before(*fd, &e.to_string()));
                }
                Err(e) => return Err(e),
            }
        }
    };
    let _ = notifier.set(session.notifier());
    // Its path as the mount table has it, and its device there.
    let ours = match &options.target {
        MountTarget::Directory(path) => {
            let path = crate::mountpoint::resolved(path);
            mounted_device(&path).map(|dev| (path, dev))
        }
        MountTarget::Descriptor(_) => None,
    };
    Ok(MountedFs {
        session,
        closing: Closing {
            outstanding,
            fs,
            runtime,
        },
        by_descriptor: matches!(options.target, MountTarget::Descriptor(_)),
        ours,
        stopping,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_is_known_by_its_device_in_the_mount_table() {
        // The root is always mounted; a directory that is no mount point has no device of its own there.
        assert!(mounted_device(std::path::Path::new("/")).is_some());
        let dir = tempfile::tempdir().unwrap();
        let path = std::fs::canonicalize(dir.path()).unwrap();
        assert!(mounted_device(&path).is_none());
    }
}
