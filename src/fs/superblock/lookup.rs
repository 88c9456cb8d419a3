//! Lookups: what a name stands for, from the table, the names known missing, another lookup of the same
//! name, or the bucket (an object and the prefix `name/` asked at once), and the bookkeeping that lets the
//! next lookups in the directory ask less.

use std::time::Instant;

use bytes::Bytes;
use tokio::sync::watch;

use super::{New, Superblock, check_name};
use crate::fs::in_flight::{self, Answer, Asking, Joined};
use crate::fs::inode::{InodeTable, Kind, Node, Stat};
use crate::fs::listing;
use crate::fs::{Attr, FsError, FsResult, names};
use crate::s3::{ClientError, ListPage};

/// Empty pages with a token to go on that a listing follows before it gives up.
const MAX_EMPTY_PAGES: usize = 100;

/// Longest a lookup waits for its directory's listing under way before it sends its LIST of `name/` after all: a
/// listing of a few pages lands well within it, and a directory too big to list does not hold lookups up longer.
const LANDING_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// The outcome of a listing under way, if it lands within [`LANDING_WAIT`]. One that does not is logged (at
/// debug): a lookup then sends the LIST the listing was to save, which a count of requests should be able to tell
/// from a lookup that did not wait.
async fn wait_for_landing(landing: listing::Landing, key: &str) -> Option<listing::Listed> {
    match tokio::time::timeout(LANDING_WAIT, listing::landed(landing)).await {
        Ok(listed) => listed,
        Err(_) => {
            tracing::debug!(
                key,
                "listing under way did not land in time; the lookup asks itself"
            );
            None
        }
    }
}

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

impl Superblock {
    /// Asks the bucket what `parent/name` is: the object `key` and the prefix `key/` are checked at once;
    /// when both exist the directory wins. Only when neither exists is the link `key.rclonelink` asked
    /// for (see [`Self::resolve_link`]). With `first_bytes` the object is asked for with its first bytes
    /// (see [`FirstBytes`](crate::fs::first_bytes::FirstBytes)), unless `lookup_prefetch` is 0.
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
        let appeared = matches!(prefix, Prefix::Directory(_));
        if appeared {
            // The name is not missing after all: the next lookup asks the bucket instead of answering
            // ENOENT from what was known before.
            self.negative.forget(parent.ino(), name);
            self.table().doubt_names(parent.ino());
        }
        Ok(Some(appeared.then(|| (Kind::Directory, Stat::directory()))))
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
    /// The first page of what `dir_prefix` holds (delimited, at most `max_keys`) that says anything: a page
    /// may come back empty with a token to go on, and only an empty page without one means nothing is there.
    pub(super) async fn first_listed(&self, dir_prefix: &str, max_keys: i32) -> FsResult<ListPage> {
        let mut token: Option<String> = None;
        for _ in 0..MAX_EMPTY_PAGES {
            let list = self
                .client
                .list_objects(dir_prefix, Some("/"), token.as_deref(), max_keys)
                .await
                .map_err(|e| FsError::client(dir_prefix, e))?;
            let empty = list.objects.is_empty() && list.common_prefixes.is_empty();
            match list.next_continuation_token {
                // (A server that hands back the token it was given would never get anywhere.)
                Some(next) if empty && token.as_deref() != Some(next.as_str()) => {
                    token = Some(next)
                }
                _ => return Ok(list),
            }
        }
        Err(FsError::Client {
            key: dir_prefix.to_string(),
            source: ClientError::Malformed(format!(
                "{MAX_EMPTY_PAGES} empty listing pages in a row, each with a token to go on"
            )),
        })
    }

    async fn is_prefix(
        &self,
        parent: &Node,
        name: &str,
        dir_prefix: &str,
        landing: Option<listing::Landing>,
        page: bool,
    ) -> FsResult<Prefix> {
        let landed = match landing {
            Some(landing) => wait_for_landing(landing, dir_prefix).await,
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
            .first_listed(dir_prefix, if page { 1000 } else { 1 })
            .await?;
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
    /// 2. the name known to be missing ([`NegativeCache`](crate::fs::negative::NegativeCache));
    /// 3. the answer of another lookup of the same name already asking the bucket ([`InFlight`]);
    /// 4. the bucket itself ([`Self::ask_bucket`]), after counting the miss towards a storm listing of the
    ///    directory ([`Storms`](listing::Storms)).
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
            // Another lookup of the name may have answered between our look at the table and the join (a
            // loaded machine preempts there): asking again would send its LIST and count a miss towards a
            // storm listing of the directory.
            Joined::Asking(asking) => match self.fresh_child(&parent_node, name, Instant::now()) {
                Ok(attr) => {
                    asking.answer(Answer::Found);
                    return Ok(attr);
                }
                Err(_) if self.negative.is_missing(parent, name, Instant::now()) => {
                    asking.answer(Answer::Missing);
                    return Err(FsError::NotFound);
                }
                Err(_) => Some(asking),
            },
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
                let _ = wait_for_landing(first_page, parent_node.key()).await;
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
}
