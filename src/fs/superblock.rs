//! The superblock: what the mount knows about names, apart from open files.
//!
//! It owns the inode table, the names known to be missing, cached directory listings, lookup storms,
//! lookups in flight and the first bytes fetched by lookups, and answers lookup, getattr, readdir, mkdir,
//! rmdir, unlink and rename. Open handles live in [`super::handles`], which reaches the table only through
//! [`Superblock::table`] and the methods of [`Node`].
//!
//! The work is split by request: lookups in `lookup`, listings (readdir's and the background ones that
//! serve lookups) in `listings`, mkdir and rmdir in `dirs`, rename in `rename`, links in `links`, kept
//! attributes in `attributes`. This file holds the state they share and the smaller requests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::debug;

use super::first_bytes::FirstBytes;
use super::in_flight::InFlight;
use super::inode::{InodeTable, Kind, Node, ROOT_INO, Stat};
use super::listing::Storms;
use super::negative::NegativeCache;
use super::{Attr, FileKind, FsConfig, FsError, FsResult, names};
use crate::memory::Reservation;
use crate::s3::ObjectClient;
use crate::source::ReadSource;

#[cfg(test)]
mod attr_tests;
mod attributes;
mod dirs;
#[cfg(test)]
mod link_tests;
mod links;
mod rename;
pub use rename::{Pins, Repinned};
#[cfg(test)]
mod tests;

mod listings;
use listings::CachedListing;
mod lookup;

/// A key a new object would get: one past S3's limit is refused before anything is written (the upload would
/// fail only at close), as a local file system refuses a path too long.
pub fn check_key(key: &str) -> FsResult<()> {
    if key.len() > names::KEY_MAX {
        return Err(FsError::NameTooLong);
    }
    Ok(())
}

pub fn check_name(name: &str) -> FsResult<()> {
    if name.len() > names::NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if !names::is_valid_name(name) {
        return Err(FsError::NotFound);
    }
    Ok(())
}

/// What a create, a mkdir or a rename is about to make under a name ([`Superblock::resolve_new_name`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum New {
    File,
    Directory,
}

pub struct Superblock {
    client: Arc<dyn ObjectClient>,
    /// Where a lookup's first bytes come from: the cached read source, so the caches see them.
    first_bytes_source: Arc<dyn ReadSource>,
    config: Arc<FsConfig>,
    /// Shared with background listings (see [`listing`]).
    inodes: Arc<Mutex<InodeTable>>,
    /// Names known not to exist, for the negative metadata TTL.
    negative: NegativeCache,
    /// Directory listings, trusted for the metadata TTL; dropped when we change the directory ourselves.
    listings: Mutex<HashMap<u64, CachedListing>>,
    /// Lookups per directory, to list a directory whole when they come in a storm.
    storms: Arc<Storms>,
    /// Names being asked about, so that lookups of one name at once send one pair of requests.
    lookups_in_flight: InFlight,
    /// Starts of files fetched by lookups, waiting for their open.
    first_bytes: FirstBytes,
}

impl Superblock {
    pub fn new(
        client: Arc<dyn ObjectClient>,
        first_bytes_source: Arc<dyn ReadSource>,
        config: Arc<FsConfig>,
    ) -> Superblock {
        Superblock {
            first_bytes_source,
            inodes: Arc::new(Mutex::new(InodeTable::new(&config.prefix))),
            storms: Arc::new(Storms::new(config.metadata_ttl)),
            lookups_in_flight: InFlight::default(),
            negative: NegativeCache::new(config.negative_metadata_ttl),
            listings: Mutex::new(HashMap::new()),
            first_bytes: FirstBytes::new(config.metadata_ttl),
            client,
            config,
        }
    }

    /// Lookups fetch first bytes from `source` from now on (set once, before the mount serves).
    pub fn set_first_bytes_source(&mut self, source: Arc<dyn ReadSource>) {
        self.first_bytes_source = source;
    }

    pub fn table(&self) -> MutexGuard<'_, InodeTable> {
        self.inodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `ino` is in the table and still the node its name stands for (the root always is).
    pub fn stands_for_its_name(&self, ino: u64) -> bool {
        let table = self.table();
        table.get(ino).is_some_and(|node| {
            ino == ROOT_INO || table.child(node.parent(), node.name()).map(Node::ino) == Some(ino)
        })
    }

    /// The bucket no longer has the object of `ino` (an open found it missing): its name no longer stands for
    /// it, so the next lookup of the name asks again.
    pub fn forget_vanished(&self, ino: u64) {
        let mut table = self.table();
        if let Some((parent, name)) = table.get(ino).map(|n| (n.parent(), n.name().to_string())) {
            table.detach_if(parent, &name, ino);
        }
    }

    /// A copy of the node `ino`, to use without holding the table.
    pub fn node(&self, ino: u64) -> FsResult<Node> {
        self.table().get(ino).cloned().ok_or(FsError::NotFound)
    }

    pub fn attr_of(&self, node: &Node) -> Attr {
        let (kind, perm) = match node.kind() {
            Kind::File => (FileKind::File, self.config.file_mode),
            Kind::Directory => (FileKind::Directory, self.config.dir_mode),
            // As on Linux file systems: a link's own mode is never checked.
            Kind::Symlink => (FileKind::Symlink, 0o777),
        };
        let mut attr = Attr {
            ino: node.ino(),
            kind,
            size: node.stat().size,
            mtime: node.stat().mtime,
            atime: node.stat().mtime,
            perm,
            uid: self.config.uid,
            gid: self.config.gid,
            provisional: false,
            trusted_for: self.config.metadata_ttl,
        };
        if self.config.preserve_metadata && node.kind() == Kind::File {
            match node.stat().attrs {
                Some(stored) => {
                    // Only permission bits: the kind is the object's, whatever a foreign mode says.
                    attr.perm = stored.mode.map_or(perm, |m| (m & 0o7777) as u16);
                    attr.uid = stored.uid.unwrap_or(attr.uid);
                    attr.gid = stored.gid.unwrap_or(attr.gid);
                    attr.mtime = stored.mtime.unwrap_or(attr.mtime);
                    attr.atime = stored.atime.unwrap_or(attr.mtime);
                }
                None => attr.provisional = !node.is_pending(),
            }
        }
        // A directory's attributes are the mount's own and the kernel walks through it on every path: it keeps
        // them the whole TTL. An object's are what the bucket said, for as long as the mount trusts that.
        if attr.provisional {
            attr.trusted_for = Duration::ZERO;
        } else if node.kind() != Kind::Directory && !node.is_pending() {
            attr.trusted_for = node.trusted_after(Instant::now()).min(attr.trusted_for);
        }
        attr
    }

    /// Until when what the bucket says now may be trusted.
    pub fn expiry(&self) -> Instant {
        Instant::now() + self.config.metadata_ttl
    }

    /// Until when a directory found whole by a request sent at `asked` may answer for names it does not hold:
    /// as long as both its entries and a name found missing would be trusted. None when either TTL is zero.
    fn every_name_known_until(&self, asked: Instant) -> Option<Instant> {
        let trusted = self.every_name_known_for();
        (!trusted.is_zero()).then(|| asked + trusted)
    }

    /// How long a whole listing vouches for the names it does not show (see above).
    fn every_name_known_for(&self) -> Duration {
        self.config
            .metadata_ttl
            .min(self.config.negative_metadata_ttl)
    }

    pub fn dir_node(&self, ino: u64) -> FsResult<Node> {
        let node = self.node(ino)?;
        if node.kind() != Kind::Directory {
            return Err(FsError::NotADirectory);
        }
        Ok(node)
    }

    /// The start of `key` at `etag` kept by a lookup, for the open that follows it.
    pub fn take_first_bytes(&self, key: &str, etag: &str) -> Option<(Bytes, Reservation)> {
        self.first_bytes.take(key, etag)
    }

    /// `parent/name` exists now (we made it): it is no longer known to be missing.
    pub fn forget_missing(&self, parent: u64, name: &str) {
        self.negative.forget(parent, name);
    }

    pub async fn getattr(&self, ino: u64) -> FsResult<Attr> {
        let node = self.node(ino)?;
        let fresh = node.is_fresh(Instant::now()) && !self.attr_of(&node).provisional;
        if node.kind() == Kind::Directory || fresh {
            return Ok(self.attr_of(&node));
        }
        let asked = Instant::now();
        match self.client.head_object(node.key()).await {
            Ok(info) => {
                let mut table = self.table();
                let expires = self.expiry();
                let n = table.get_mut(ino).ok_or(FsError::NotFound)?;
                n.observe(Stat::of(&info), asked);
                n.trust_until(expires);
                Ok(self.attr_of(n))
            }
            Err(e) => Err(FsError::client(node.key(), e)),
        }
    }

    pub async fn unlink(&self, parent: u64, name: &str) -> FsResult<()> {
        self.remove_name(parent, name, false).await
    }

    /// unlink of a name whose file is open for writing, after its handles were told to upload nothing more
    /// (`S3Filesystem::unlink`): the object goes if it was ever uploaded, and the name goes at once.
    pub(super) async fn unlink_open(&self, parent: u64, name: &str) -> FsResult<()> {
        self.remove_name(parent, name, true).await
    }

    async fn remove_name(&self, parent: u64, name: &str, open_ok: bool) -> FsResult<()> {
        let _changing = self.changing(parent);
        if self.config.read_only {
            return Err(FsError::ReadOnly);
        }
        if !self.config.allow_delete {
            return Err(FsError::NotPermitted(
                "deleting objects needs --allow-delete",
            ));
        }
        self.dir_node(parent)?;
        let existing = self.table().child(parent, name).cloned();
        let node = match existing {
            Some(n) => n,
            None => {
                self.lookup(parent, name).await?;
                let n = self
                    .table()
                    .child(parent, name)
                    .cloned()
                    .ok_or(FsError::NotFound)?;
                self.table().forget(n.ino(), 1);
                n
            }
        };
        if node.kind() == Kind::Directory {
            return Err(FsError::IsADirectory);
        }
        if node.is_pending() && !open_ok {
            return Err(FsError::Busy("the file is being written"));
        }
        // A link's object is `name.rclonelink`: the node's key says which object the name stands for.
        let key = node.key().to_string();
        if !node.is_local() {
            self.client
                .delete_object(&key)
                .await
                .map_err(|e| FsError::client(&key, e))?;
        }
        debug!(key, "deleted");
        self.table().detach(parent, name);
        Ok(())
    }
}
