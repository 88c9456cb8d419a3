//! Directory listings: a readdir's (all pages, cached for the TTL), and those sent in the background so that
//! a directory's lookups find their names in the table (its first page, a storm's, a renewal's).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::debug;

use super::Superblock;
use crate::fs::inode::{InodeTable, Kind, Node, ROOT_INO};
use crate::fs::listing;
use crate::fs::{DirEntry, FileKind, FsError, FsResult};
use crate::s3::ListPage;

/// Listings of one readdir, when our own changes in the directory keep overtaking them.
pub(super) const LIST_ATTEMPTS: u32 = 3;

/// Longest a background listing overtaken by our changes waits for the one under way to end before it is
/// judged: a change is a request or two, and lookups may be waiting for the listing (`LANDING_WAIT`).
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// A directory's entries and until when they may be served without listing again.
pub(super) type CachedListing = (Instant, Arc<Vec<DirEntry>>);

impl Superblock {
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
    pub(super) fn list_in_background(&self, dir: Node, max_pages: usize) {
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
    pub(super) fn take_listing(
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
    pub(super) fn changing(&self, dir: u64) -> listing::DirChange<'_> {
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
