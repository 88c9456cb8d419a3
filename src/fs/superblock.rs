//! The superblock: what the mount knows about names, apart from open files.
//!
//! It owns the inode table, the names known to be missing, cached directory listings, lookup storms,
//! lookups in flight and the first bytes fetched by lookups, and answers lookup, getattr, readdir, mkdir,
//! rmdir, unlink and rename. Open handles live in [`super::handles`], which reaches the table only through
//! [`Superblock::table`] and the methods of [`Node`].

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;
use tracing::debug;

use super::first_bytes::FirstBytes;
use super::in_flight::{self, Answer, Asking, InFlight, Joined};
use super::inode::{InodeTable, Kind, Node, ROOT_INO, Stat};
use super::listing::{self, Storms};
use super::negative::NegativeCache;
use super::{Attr, DirEntry, FileKind, FsConfig, FsError, FsResult, names};
use crate::memory::Reservation;
use crate::s3::{ListPage, ObjectClient};
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

/// Listings of one readdir, when our own changes in the directory keep overtaking them.
const LIST_ATTEMPTS: u32 = 3;

/// Longest a lookup waits for its directory's listing under way before it sends its LIST of `name/` after all: a
/// listing of a few pages lands well within it, and a directory too big to list does not hold lookups up longer.
const LANDING_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// Longest a background listing overtaken by our changes waits for the one under way to end before it is
/// judged: a change is a request or two, and lookups may be waiting for the listing (`LANDING_WAIT`).
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// A directory's entries and until when they may be served without listing again.
type CachedListing = (Instant, Arc<Vec<DirEntry>>);

/// What a lookup that must ask the bucket already knows, so that it asks less.
#[derive(Default)]
struct Hint {
    /// The name was a directory when last asked: its prefix is asked for first, and the object of that name only
    /// if the prefix is gone (a GET that can only 404 is not sent alongside).
    was_dir: bool,
    /// A listing of the parent under way: it says whether the name is a directory (no LIST of `name/`).
    landing: Option<listing::Landing>,
    /// Ask for the prefix with a page of keys rather than one: a lookup of a name not known as a directory,
    /// so that a directory found this way comes with its entries when one page holds them all (the lookups
    /// in it then ask nothing, its subdirectories included). A page costs what one key costs when the name
    /// is a file; a name known as a directory keeps its one-key LIST every TTL.
    page: bool,
}

/// What a name stands for in the bucket, as [`Superblock::resolve_with_target`] found it.
struct Resolved {
    kind: Kind,
    stat: Stat,
    /// A link's target, when its object held one.
    target: Option<String>,
    /// What the page of keys that found a directory said of it, if one was asked for.
    page: Page,
}

impl Resolved {
    fn found(kind: Kind, stat: Stat, target: Option<String>) -> Resolved {
        Resolved {
            kind,
            stat,
            target,
            page: Page::NotAsked,
        }
    }
}

/// What the bucket holds under a name's prefix (`name/`).
enum Prefix {
    Empty,
    Directory(Page),
}

/// What a LIST of a directory's prefix said of the directory, asked for with a page of keys ([`Hint::page`]).
enum Page {
    /// One key, or no LIST (a listing of the parent answered).
    NotAsked,
    /// The page held all of it.
    Whole(listing::Whole),
    /// More pages follow.
    Partial,
}

/// Why a lookup found no fresh entry in the table, and what the stale one (if any) was.
#[derive(Default)]
struct Stale {
    /// The page cache may hold the bytes of the entry: a HEAD checks it (its next open keeps those bytes).
    page_cached: bool,
    was_dir: bool,
    /// No entry, in a directory whose every name is in the table ([`InodeTable::know_every_name`]): missing.
    known_missing: bool,
}

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

    /// Asks the bucket what `parent/name` is: the object `key` and the prefix `key/` are checked at once;
    /// when both exist the directory wins. Only when neither exists is the link `key.rclonelink` asked
    /// for (see [`Self::resolve_link`]). With `first_bytes` the object is asked for with its first bytes
    /// (see [`FirstBytes`]), unless `lookup_prefetch` is 0.
    pub async fn resolve(
        &self,
        parent: &Node,
        name: &str,
        first_bytes: bool,
    ) -> FsResult<Option<(Kind, Stat)>> {
        Ok(self
            .resolve_with_target(parent, name, first_bytes, true, Hint::default())
            .await?
            .map(|r| (r.kind, r.stat)))
    }

    /// [`Self::resolve`] without asking for a link: for a create or a mkdir, which the kernel sends only
    /// after its lookup (links included) found nothing, so that a new file or directory costs no more
    /// requests than it did. A link made meanwhile by another client is then shadowed (the file or the
    /// directory wins). See [`Self::resolve_new_name`] for a name a lookup just found missing.
    pub async fn resolve_file_or_dir(
        &self,
        parent: &Node,
        name: &str,
        made: New,
    ) -> FsResult<Option<(Kind, Stat)>> {
        if let Some(found) = self.resolve_new_name(parent, name, made).await? {
            return Ok(found);
        }
        Ok(self
            .resolve_with_target(parent, name, false, false, Hint::default())
            .await?
            .map(|r| (r.kind, r.stat)))
    }

    /// What a new file's name needs asked when a lookup found it missing within the negative TTL (nothing
    /// made or listed under it since; rsync looks each name up just before it creates or renames onto it):
    /// only whether a directory appeared there meanwhile, which would hide the file. An object that appeared
    /// meanwhile is left to the upload's or the move's own condition (If-None-Match, unless
    /// `--allow-overwrite` lets it replace what it would replace a moment later anyway). For a file, in a
    /// directory that knows every name it holds ([`InodeTable::known_missing`]), nothing is asked: its
    /// listing (or its mkdir) vouches for directories too, as it does for its lookups. Not for a new
    /// directory: it would know every name it holds from that one LIST's answer, which a listing up to a TTL
    /// old must not stand in for. `None`: no such lookup, ask everything.
    pub async fn resolve_new_name(
        &self,
        parent: &Node,
        name: &str,
        made: New,
    ) -> FsResult<Option<Option<(Kind, Stat)>>> {
        let now = Instant::now();
        let (every_name_known, known_missing) = {
            let table = self.table();
            let every_name_known = table.known_missing(parent.ino(), name, now);
            let looked_up = table.child(parent.ino(), name).is_none()
                && self.negative.is_missing(parent.ino(), name, now);
            (every_name_known, every_name_known || looked_up)
        };
        if every_name_known && made == New::File {
            return Ok(Some(None));
        }
        if !known_missing {
            return Ok(None);
        }
        let key = names::file_key(parent.key(), name);
        let prefix = self
            .is_prefix(parent, name, &format!("{key}/"), None, false)
            .await?;
        Ok(Some(
            matches!(prefix, Prefix::Directory(_)).then(|| (Kind::Directory, Stat::directory())),
        ))
    }

    /// [`Self::resolve`], with a link's target when the name is a link; `links`: ask for the link at all.
    async fn resolve_with_target(
        &self,
        parent: &Node,
        name: &str,
        first_bytes: bool,
        links: bool,
        hint: Hint,
    ) -> FsResult<Option<Resolved>> {
        let key = names::file_key(parent.key(), name);
        let dir_prefix = format!("{key}/");
        let object = async {
            match self.config.lookup_prefetch {
                n if n > 0 && first_bytes => self.first_bytes_source.first_bytes(&key, n).await,
                _ => self
                    .client
                    .head_object(&key)
                    .await
                    .map(|i| (i, Bytes::new())),
            }
        };
        let directory = |page| Resolved {
            page,
            ..Resolved::found(Kind::Directory, Stat::directory(), None)
        };
        let prefix = self.is_prefix(parent, name, &dir_prefix, hint.landing, hint.page);
        let object = if hint.was_dir {
            if let Prefix::Directory(page) = prefix.await? {
                return Ok(Some(directory(page)));
            }
            object.await
        } else {
            let (object, prefix) = tokio::join!(object, prefix);
            if let Prefix::Directory(page) = prefix? {
                return Ok(Some(directory(page)));
            }
            object
        };
        match object {
            Ok((info, first)) => {
                self.first_bytes
                    .keep(&key, &info.etag, first, &self.config.memory);
                Ok(Some(Resolved::found(Kind::File, Stat::of(&info), None)))
            }
            Err(e) => match FsError::client(&key, e) {
                FsError::NotFound if links => Ok(self
                    .resolve_link(parent, name)
                    .await?
                    .map(|(kind, stat, target)| Resolved::found(kind, stat, target))),
                FsError::NotFound => Ok(None),
                other => Err(other),
            },
        }
    }

    /// Whether the prefix `dir_prefix` (`name/` in `parent`) holds any key: from the parent's listing under way
    /// (`landing`) if it lands, else from a LIST of one key, or of a page with `page` (see [`Hint::page`]).
    async fn is_prefix(
        &self,
        parent: &Node,
        name: &str,
        dir_prefix: &str,
        landing: Option<listing::Landing>,
        page: bool,
    ) -> FsResult<Prefix> {
        let landed = match landing {
            Some(landing) => tokio::time::timeout(LANDING_WAIT, listing::landed(landing))
                .await
                .ok()
                .flatten(),
            None => None,
        };
        if let Some(listing::Listed::Applied { .. }) = landed {
            // The listing put every name it found in the table, fresh; a name it did not find has no keys under it.
            let now = Instant::now();
            let is_dir = self
                .table()
                .child(parent.ino(), name)
                .is_some_and(|n| n.kind() == Kind::Directory && n.is_fresh(now));
            return Ok(if is_dir {
                Prefix::Directory(Page::NotAsked)
            } else {
                Prefix::Empty
            });
        }
        let list = self
            .client
            .list_objects(dir_prefix, Some("/"), None, if page { 1000 } else { 1 })
            .await
            .map_err(|e| FsError::client(dir_prefix, e))?;
        if list.objects.is_empty() && list.common_prefixes.is_empty() {
            return Ok(Prefix::Empty);
        }
        if !page {
            return Ok(Prefix::Directory(Page::NotAsked));
        }
        Ok(Prefix::Directory(
            listing::whole_from_one_page(dir_prefix, list).map_or(Page::Partial, Page::Whole),
        ))
    }

    /// Looks `name` up in `parent`, taking the cheapest answer there is:
    /// 1. a fresh entry in the table ([`Self::fresh_child`]);
    /// 2. the name known to be missing ([`NegativeCache`]);
    /// 3. the answer of another lookup of the same name already asking the bucket ([`InFlight`]);
    /// 4. the bucket itself ([`Self::ask_bucket`]), after counting the miss towards a storm listing of the
    ///    directory ([`Storms`]).
    ///
    /// Each step takes its own lock and lets it go before the next; where a check and a change must not
    /// be split (a file made here meanwhile), they happen under one table lock.
    pub async fn lookup(&self, parent: u64, name: &str) -> FsResult<Attr> {
        check_name(name)?;
        let parent_node = self.dir_node(parent)?;
        let now = Instant::now();
        let stale = match self.fresh_child(&parent_node, name, now) {
            Ok(attr) => return Ok(attr),
            Err(stale) => stale,
        };
        if stale.known_missing {
            // Counted as a lookup answered from the listing, so that a directory still being read (or
            // written) is listed again before what it knows expires.
            if self.storms.note_hit(parent, now) {
                self.list_in_background(parent_node, listing::STORM_MAX_PAGES);
            }
            return Err(FsError::NotFound);
        }
        if self.negative.is_missing(parent, name, now) {
            return Err(FsError::NotFound);
        }
        let asking = match self.lookups_in_flight.join(parent, name) {
            Joined::Asking(asking) => Some(asking),
            Joined::Waiting(answer) => {
                if let Some(found) = self.answer_of_other(&parent_node, name, answer).await {
                    return found;
                }
                None
            }
        };
        if let Some(max_pages) = self.storms.note_miss(parent, now) {
            self.list_in_background(parent_node.clone(), max_pages);
        }
        let landing = match self.storms.first_page_landing(parent) {
            Some(first_page) => {
                let _ = tokio::time::timeout(LANDING_WAIT, listing::landed(first_page)).await;
                // Landed whole, the table answers below. Else the lookups that waited may call for a storm.
                if let Some(max_pages) = self
                    .storms
                    .first_page_did_not_answer(parent, Instant::now())
                {
                    self.list_in_background(parent_node.clone(), max_pages);
                }
                // A first page still under way after that wait is not waited for again: this lookup asks.
                self.storms
                    .landing(parent)
                    .filter(|_| self.storms.first_page_landing(parent).is_none())
            }
            None => self.storms.landing(parent),
        };
        // A listing of the directory that landed since this lookup found its entry stale answers it now. A
        // lookup that lost that race (more often on a loaded machine) sent the one-key LIST the listing was
        // there to save.
        if landing.is_none() {
            match self.fresh_child(&parent_node, name, Instant::now()) {
                Ok(attr) => {
                    if let Some(asking) = asking {
                        asking.answer(Answer::Found);
                    }
                    return Ok(attr);
                }
                Err(again) if again.known_missing => {
                    if let Some(asking) = asking {
                        asking.answer(Answer::Missing);
                    }
                    return Err(FsError::NotFound);
                }
                Err(_) => {}
            }
        }
        let hint = Hint {
            was_dir: stale.was_dir,
            landing,
            page: !stale.was_dir,
        };
        self.ask_bucket(&parent_node, name, now, !stale.page_cached, asking, hint)
            .await
    }

    /// Waits for the lookup of the same name that asks the bucket. None: ask for ourselves (it failed, or
    /// the entry it made is already gone).
    async fn answer_of_other(
        &self,
        parent_node: &Node,
        name: &str,
        answer: watch::Receiver<Option<Answer>>,
    ) -> Option<FsResult<Attr>> {
        match in_flight::wait(answer).await {
            // A file we made since the answer (not in the bucket yet) is still ours to find.
            Some(Answer::Missing) => Some(
                self.local_child(&mut self.table(), parent_node.ino(), name)
                    .ok_or(FsError::NotFound),
            ),
            Some(Answer::Found) => self
                .fresh_child(parent_node, name, Instant::now())
                .ok()
                .map(Ok),
            None => None,
        }
    }

    /// The lookup that asks the bucket (with its first bytes if `first_bytes`), records the answer in the
    /// table or the negative cache, then tells the lookups waiting on it (`asking`). `now` is when the
    /// lookup started.
    async fn ask_bucket(
        &self,
        parent_node: &Node,
        name: &str,
        now: Instant,
        first_bytes: bool,
        asking: Option<Asking<'_>>,
        hint: Hint,
    ) -> FsResult<Attr> {
        let parent = parent_node.ino();
        let asked = Instant::now();
        let answered = |answer| {
            if let Some(asking) = asking {
                asking.answer(answer);
            }
        };
        match self
            .resolve_with_target(parent_node, name, first_bytes, true, hint)
            .await?
        {
            Some(Resolved {
                kind,
                stat,
                target,
                page,
            }) => {
                let attr = {
                    let mut table = self.table();
                    let etag = stat.etag.clone();
                    let ino = table.upsert(parent, name, kind, stat, self.expiry(), asked);
                    table.add_lookup(ino);
                    match page {
                        Page::Whole(whole) if self.storms.unchanged_since(ino, asked) => {
                            self.take_listing(&mut table, ino, whole, asked);
                        }
                        Page::Partial => self.storms.first_page_seen(ino),
                        _ => {}
                    }
                    let node = table.get_mut(ino).expect("just inserted");
                    if let (Some(target), Some(etag)) = (target, etag) {
                        node.remember_link_target(&etag, target);
                    }
                    self.attr_of(node)
                };
                answered(Answer::Found);
                Ok(attr)
            }
            None => {
                // Checked and detached under one lock, so a file made in between is not detached.
                let mut table = self.table();
                if let Some(attr) = self.local_child(&mut table, parent, name) {
                    return Ok(attr);
                }
                table.detach(parent, name);
                drop(table);
                self.negative.record(parent, name, now);
                answered(Answer::Missing);
                Err(FsError::NotFound)
            }
        }
    }

    /// A file of ours the bucket does not show (made here, or being written), counted as a lookup by the kernel.
    fn local_child(&self, table: &mut InodeTable, parent: u64, name: &str) -> Option<Attr> {
        let ino = table.child(parent, name).filter(|n| n.is_pending())?.ino();
        table.add_lookup(ino);
        table.get(ino).map(|n| self.attr_of(n))
    }

    /// The attributes of `name` in `dir` if the table holds a fresh entry (counted as a lookup by the kernel);
    /// otherwise what the stale entry was, if there is one.
    fn fresh_child(&self, dir: &Node, name: &str, now: Instant) -> Result<Attr, Stale> {
        let mut table = self.table();
        let node = table.child(dir.ino(), name);
        // With --preserve-metadata, a file known only from a listing is looked up for its metadata.
        if let Some(node) = node
            && node.is_fresh(now)
            && !self.attr_of(node).provisional
        {
            let ino = node.ino();
            let attr = self.attr_of(node);
            table.add_lookup(ino);
            drop(table);
            // A directory still being read through lists again before its listed entries expire together.
            if self.storms.note_hit(dir.ino(), now) {
                self.list_in_background(dir.clone(), listing::STORM_MAX_PAGES);
            }
            return Ok(attr);
        }
        Err(node.map_or_else(
            || Stale {
                known_missing: table.known_missing(dir.ino(), name, now),
                ..Stale::default()
            },
            |n| Stale {
                page_cached: n.may_be_in_page_cache(),
                was_dir: n.kind() == Kind::Directory,
                known_missing: false,
            },
        ))
    }

    /// An open found `node` fresh, maybe with no lookup of ours before it (the kernel had the entry from a
    /// readdirplus): counted as a lookup that found its entry, so that a directory read after its listing is
    /// listed again before the entries expire.
    pub fn note_fresh_open(&self, node: &Node) {
        if !self.storms.note_hit(node.parent(), Instant::now()) {
            return;
        }
        match self.dir_node(node.parent()) {
            Ok(dir) => self.list_in_background(dir, listing::STORM_MAX_PAGES),
            Err(_) => self
                .storms
                .listing_done(node.parent(), listing::Listed::NotApplied),
        }
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

    /// The entries of directory `ino`: its cached listing while that is still true, else a new listing.
    pub async fn entries(&self, ino: u64) -> FsResult<Arc<Vec<DirEntry>>> {
        let dir = self.dir_node(ino)?;
        match self.cached_listing(ino) {
            Some(cached) => Ok(cached),
            None => self.list_dir(&dir).await,
        }
    }

    /// Lists the whole directory (all pages) once per handle; entries are merged without assuming any order,
    /// duplicates dropped, a directory shadowing a file of the same name, invalid names hidden.
    ///
    /// A listing sent before one of our own changes in the directory finished answers from before it: it
    /// would bring back a file we just deleted, for a whole TTL. Such a listing is sent again (twice at
    /// most); if the directory is still changing after that, only names the table already has are kept,
    /// and the result serves this handle only. A trusted result is cached for the TTL, decided under the
    /// same table lock as the check, so no change can slip in between.
    async fn list_dir(&self, dir: &Node) -> FsResult<Arc<Vec<DirEntry>>> {
        let mut attempt = 0;
        let (whole, asked, mut table, trusted) = loop {
            attempt += 1;
            let asked = Instant::now();
            // A listing without its pages limit always comes back whole.
            let Some(whole) = listing::list_all(self.client.as_ref(), dir.key(), None).await?
            else {
                return Err(FsError::Io(format!("{}: listing cut short", dir.key())));
            };
            let table = self.table();
            let trusted = self.storms.unchanged_since(dir.ino(), asked);
            if trusted || attempt == LIST_ATTEMPTS {
                break (whole, asked, table, trusted);
            }
            debug!(
                key = dir.key(),
                "the directory changed while it was listed: listing again"
            );
        };
        let listing::Whole { found, shadowed } = whole;
        let expires = self.expiry();
        if trusted {
            self.storms
                .listed(dir.ino(), pages_of(&found), asked.elapsed());
            trust_listed_dir(&mut table, dir.ino(), &found, expires);
        }
        let mut entries = Vec::with_capacity(found.len() + 2);
        entries.push(DirEntry {
            ino: dir.ino(),
            kind: FileKind::Directory,
            name: ".".into(),
        });
        entries.push(DirEntry {
            ino: dir.parent(),
            kind: FileKind::Directory,
            name: "..".into(),
        });
        for (name, (kind, stat)) in found {
            if !trusted && table.child(dir.ino(), &name).is_none() {
                continue;
            }
            let ino = table.upsert(dir.ino(), &name, kind, stat, expires, asked);
            entries.push(DirEntry {
                ino,
                kind: file_kind(kind),
                name,
            });
        }
        if trusted
            && !shadowed
            && let Some(until) = self.every_name_known_until(asked)
        {
            table.know_every_name(dir.ino(), asked, until);
        }
        let listed: HashSet<String> = entries.iter().map(|e| e.name.clone()).collect();
        for (name, ino, kind) in table.local_children(dir.ino()) {
            if !listed.contains(&name) {
                entries.push(DirEntry {
                    ino,
                    kind: file_kind(kind),
                    name,
                });
            }
        }
        let entries = Arc::new(entries);
        if trusted && !self.config.metadata_ttl.is_zero() {
            let until = Instant::now() + self.config.metadata_ttl;
            let mut listings = self.listings.lock().unwrap_or_else(|e| e.into_inner());
            listings.insert(dir.ino(), (until, Arc::clone(&entries)));
        }
        drop(table);
        Ok(entries)
    }

    /// Lists `dir` whole while its lookups go on, so that the next ones find their entries in the table (at its
    /// first lookup that must ask, when it fits in one page; after a storm of lookups that asked the bucket; and
    /// again before those entries expire while lookups go on). Gives up on a directory of more than `max_pages`.
    fn list_in_background(&self, dir: Node, max_pages: usize) {
        let client = Arc::clone(&self.client);
        let inodes = Arc::clone(&self.inodes);
        let storms = Arc::clone(&self.storms);
        let ttl = self.config.metadata_ttl;
        let known_for = self.every_name_known_for();
        tokio::spawn(async move {
            let asked = Instant::now();
            let listed = listing::list_all(client.as_ref(), dir.key(), Some(max_pages)).await;
            if matches!(listed, Ok(Some(_))) && !storms.unchanged_since(dir.ino(), asked) {
                // Overtaken by our changes: judged below against the table, which must first catch up with
                // a change half done when the listing landed (rsync's renames, one after the other).
                storms.until_settled(dir.ino(), SETTLE_WAIT).await;
            }
            let outcome = match listed {
                Ok(Some(listing::Whole { found, shadowed })) => {
                    let mut table = inodes.lock().unwrap_or_else(|e| e.into_inner());
                    // Still the same directory, and none of our changes there since the request.
                    if table.get(dir.ino()).is_some_and(|d| d.key() == dir.key())
                        && storms.unchanged_since(dir.ino(), asked)
                    {
                        let pages = pages_of(&found);
                        take_whole_listing(
                            &mut table,
                            dir.ino(),
                            listing::Whole { found, shadowed },
                            asked,
                            (Instant::now() + ttl, known_for),
                        );
                        debug!(key = dir.key(), pages, "listed for its lookups");
                        listing::Listed::Applied { pages }
                    } else if !known_for.is_zero()
                        && !shadowed
                        && table.get(dir.ino()).is_some_and(|d| d.key() == dir.key())
                        && table.accounts_for(
                            dir.ino(),
                            found.iter().map(|(name, (kind, _))| (name.as_str(), *kind)),
                            asked,
                        )
                    {
                        // Overtaken by our own changes (rsync's, one after the other): the entries are not
                        // taken, but the directory knows every name it holds again.
                        table.know_every_name(dir.ino(), asked, asked + known_for);
                        let pages = pages_of(&found);
                        debug!(
                            key = dir.key(),
                            pages, "listed for its lookups, overtaken by our changes"
                        );
                        listing::Listed::Renewed { pages }
                    } else {
                        listing::Listed::NotApplied
                    }
                }
                Ok(None) => {
                    debug!(
                        key = dir.key(),
                        max_pages, "too big to list for its lookups"
                    );
                    listing::Listed::TooBig
                }
                Err(e) => {
                    debug!(key = dir.key(), error = %e.chain(), "listing for its lookups failed");
                    listing::Listed::NotApplied
                }
            };
            storms.listing_done(dir.ino(), outcome);
        });
    }

    /// Takes the mount's first LIST of its root, sent at `asked` before any change could be made, as a whole
    /// listing of the root when it is one page: the first lookups of the names there (a dataset's
    /// directories) then ask nothing, where each cost a GET that 404s beside its one-key LIST.
    pub fn take_root_page(&self, page: ListPage, asked: Instant) {
        let root = self.config.prefix.as_str();
        let Some(whole) = listing::whole_from_one_page(root, page) else {
            // A bigger root: its first lookup that must ask need not ask for this page again.
            self.storms.first_page_seen(ROOT_INO);
            return;
        };
        self.take_listing(&mut self.table(), ROOT_INO, whole, asked);
    }

    /// Takes `whole`, one page that held all of `dir`, sent at `asked`, as the directory's listing for one TTL,
    /// as a readdir's would be.
    fn take_listing(
        &self,
        table: &mut InodeTable,
        dir: u64,
        whole: listing::Whole,
        asked: Instant,
    ) {
        let pages = pages_of(&whole.found);
        let trusted = (self.expiry(), self.every_name_known_for());
        take_whole_listing(table, dir, whole, asked, trusted);
        self.storms.listed(dir, pages, asked.elapsed());
    }

    /// Lookups in `dir` ask for their own names from the first, as in a directory bigger than one page.
    #[cfg(test)]
    pub fn as_if_bigger_than_a_page(&self, dir: u64) {
        self.storms.first_page_seen(dir);
    }

    /// A listing of `dir` made within the TTL whose entries are all still known.
    fn cached_listing(&self, dir: u64) -> Option<Arc<Vec<DirEntry>>> {
        let cached = {
            let listings = self.listings.lock().unwrap_or_else(|e| e.into_inner());
            let (until, entries) = listings.get(&dir)?;
            (*until > Instant::now()).then(|| Arc::clone(entries))?
        };
        let table = self.table();
        cached
            .iter()
            .all(|e| table.get(e.ino).is_some())
            .then_some(cached)
    }

    /// We are changing `dir` (mkdir, unlink, rmdir, rename): its cached listing is no longer true, and a
    /// background listing sent before the change ends must not be applied.
    fn changing(&self, dir: u64) -> listing::DirChange<'_> {
        self.invalidate_listing(dir);
        self.storms.changing(dir)
    }

    /// We changed `dir` (create, mkdir, unlink, rmdir, rename): its cached listing is no longer true.
    pub fn invalidate_listing(&self, dir: u64) {
        self.listings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&dir);
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

/// Puts every entry of a whole listing of `dir`, sent at `asked`, in the table, fresh until `expires`; the
/// directory then knows every name it holds for `known_for` from `asked` (unless a name stood for two things).
fn take_whole_listing(
    table: &mut InodeTable,
    dir: u64,
    whole: listing::Whole,
    asked: Instant,
    (expires, known_for): (Instant, Duration),
) {
    let listing::Whole { found, shadowed } = whole;
    trust_listed_dir(table, dir, &found, expires);
    for (name, (kind, stat)) in found {
        table.upsert(dir, &name, kind, stat, expires, asked);
    }
    if !known_for.is_zero() && !shadowed {
        table.know_every_name(dir, asked, asked + known_for);
    }
}

/// About what listing `found` cost: a page holds 1,000 keys and prefixes.
fn pages_of(found: &listing::Found) -> u32 {
    u32::try_from(found.len() / 1000 + 1).unwrap_or(u32::MAX)
}

/// A listing of `dir` that found keys under it says the directory itself exists: its entry is trusted as long as
/// the listed ones, so the kernel's next lookup of its name (every TTL while it is read) needs no request.
fn trust_listed_dir(table: &mut InodeTable, dir: u64, found: &listing::Found, expires: Instant) {
    if let Some(node) = table.get_mut(dir).filter(|_| !found.is_empty()) {
        node.trust_until(expires);
    }
}

fn file_kind(kind: Kind) -> FileKind {
    match kind {
        Kind::File => FileKind::File,
        Kind::Directory => FileKind::Directory,
        Kind::Symlink => FileKind::Symlink,
    }
}
