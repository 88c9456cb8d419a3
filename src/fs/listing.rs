//! Whole-directory listings, and the lookup storms that call for one.
//!
//! A cold lookup costs two requests: the object (with its first bytes) and a LIST of `name/`, because a
//! directory of the same name must win and listings come back in no order. The first such lookup in a
//! directory never listed lists one page of it instead ([`FIRST_PAGE`]), and a directory that fits in it asks
//! nothing more. In a bigger one, a data loader that opens thousands of files without listing it first pays that
//! pair per file, until a storm: once a directory has seen
//! [`STORM_THRESHOLD`] such lookups within one metadata TTL (fewer for a directory listed whole before and not
//! being changed here: as many as that listing's pages, at least two), one listing of the whole directory (in
//! the background, at most [`STORM_MAX_PAGES`] pages) puts every entry in the inode table, fresh for the TTL:
//! the next lookups there need no request, and a file costs only the GET of its bytes. It is the same
//! knowledge, with the same TTL, that `ls` would have given.
//!
//! A loader goes on for longer than one TTL. Left alone, the listed entries would all expire together and every
//! lookup would pay the pair again until the next storm listing landed. So shortly before the entries of a
//! listing expire (a tenth of the TTL, or three times what the listing took), the next lookup that finds its entry
//! fresh lists the directory again in the background, provided enough lookups found entries there since (a
//! listing of many pages is not worth it for a few lookups): one listing per TTL while the directory is read. A
//! readdir's listing counts as one too, and so does one page that held a whole directory (the mount's first LIST
//! of its root, a lookup's page of `name/`). Lookups that must ask while a listing is under way take the answer
//! to "is it a directory" from that listing instead of a LIST of their own. No entry is ever trusted for longer
//! than one TTL after the bucket was asked.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::inode::{Kind, Stat};
use super::names;
use super::{FsError, FsResult};
use crate::s3::{ListPage, ObjectClient};

/// Lookups that must ask the bucket, in one directory within one window, before it is listed whole.
pub const STORM_THRESHOLD: u32 = 16;
/// The fewest misses that list again a directory listed whole before: one name looked up alone now and then
/// keeps its one-key LIST, cheaper to answer than a page of up to 1,000 keys.
const RELIST_THRESHOLD_MIN: u32 = 2;
/// Largest directory (in pages of 1,000 keys) a storm lists; a bigger one keeps per-name lookups.
pub const STORM_MAX_PAGES: usize = 100;
/// What the first lookup that must ask in a directory never listed lists of it, in the background, with the
/// lookups of the moment waiting for it instead of sending the LIST of their name's prefix: one page. It costs
/// that first lookup no more requests than it would have sent, and a directory that fits in it (most do) is then
/// listed whole, so no lookup there asks again: no LIST per name up to a storm, no GET that 404s for a
/// subdirectory. A bigger directory costs one page more, once, and goes on to storms as before.
pub const FIRST_PAGE: usize = 1;
/// How long a directory too big to list is left alone before a storm may try again.
const TOO_BIG_BACKOFF: Duration = Duration::from_secs(60);
/// Directories tracked at once; older quiet ones are dropped beyond this.
const TRACKED_DIRS: usize = 4096;

/// What one listing found: name → kind and attributes. A directory shadows a file of the same name.
pub type Found = HashMap<String, (Kind, Stat)>;

/// A whole listing: what it found, and whether a name stood for two things there (a directory and a file, a
/// file and a link), of which `found` holds only the one shown. The other is in the bucket with no entry,
/// so such a directory cannot vouch that a name it does not show is missing.
pub struct Whole {
    pub found: Found,
    pub shadowed: bool,
}

/// Lists every page under `dir_key` (a prefix ending in `/`, or empty for the root), merging entries
/// without assuming any order. With `max_pages`, gives up (None) on a directory with more pages.
pub async fn list_all(
    client: &dyn ObjectClient,
    dir_key: &str,
    max_pages: Option<usize>,
) -> FsResult<Option<Whole>> {
    let mut merged = Merged::default();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        if max_pages.is_some_and(|max| pages >= max) {
            return Ok(None);
        }
        let page = client
            .list_objects(dir_key, Some("/"), token.as_deref(), 1000)
            .await
            .map_err(|e| FsError::client(dir_key, e))?;
        pages += 1;
        match merged.add(dir_key, page) {
            Some(t) => token = Some(t),
            None => return Ok(Some(merged.finish())),
        }
    }
}

/// The whole directory `dir_key` from a page asked for with delimiter `/`, if that page is all there is (it
/// has no continuation token): the mount's first LIST of its root, which checks access, and a lookup's LIST of
/// `name/` then answer the lookups there too.
pub fn whole_from_one_page(dir_key: &str, page: ListPage) -> Option<Whole> {
    let mut merged = Merged::default();
    merged.add(dir_key, page).is_none().then(|| merged.finish())
}

/// The entries of a listing's pages so far.
#[derive(Default)]
struct Merged {
    found: Found,
    shadowed: bool,
    /// Links are merged last: a file or directory of the same name wins whatever page it came on.
    links: Found,
}

impl Merged {
    /// Takes in one page of `dir_key`; returns the token of the next page, if there is one.
    fn add(&mut self, dir_key: &str, page: ListPage) -> Option<String> {
        for prefix in &page.common_prefixes {
            if let Some(name) = names::name_of_common_prefix(dir_key, prefix) {
                // Directory buckets may repeat a common prefix; only a file under it is shadowed.
                let before = self
                    .found
                    .insert(name.to_string(), (Kind::Directory, Stat::directory()));
                self.shadowed |= before.is_some_and(|(kind, _)| kind != Kind::Directory);
            }
        }
        for object in page.objects {
            // A link's object name is 11 bytes longer than the link's own: judged by the link's name, so a
            // link with a name of up to 255 bytes shows although its object's name is longer.
            let link = object.key.strip_prefix(dir_key).and_then(names::link_name);
            let Some(name) = link.or_else(|| names::name_of_object(dir_key, &object.key)) else {
                continue;
            };
            let stat = Stat {
                size: object.size,
                mtime: object.last_modified,
                etag: Some(object.etag),
                attrs: None,
            };
            match link {
                Some(link) => {
                    self.links.insert(link.to_string(), (Kind::Symlink, stat));
                }
                None => {
                    self.shadowed |=
                        !add_unless_shown(&mut self.found, name.to_string(), (Kind::File, stat))
                }
            }
        }
        page.next_continuation_token.filter(|t| !t.is_empty())
    }

    fn finish(mut self) -> Whole {
        for (name, link) in self.links {
            self.shadowed |= !add_unless_shown(&mut self.found, name, link);
        }
        Whole {
            found: self.found,
            shadowed: self.shadowed,
        }
    }
}

/// Adds `name` unless the listing already shows something under it (which then shadows it); whether added.
fn add_unless_shown(found: &mut Found, name: String, entry: (Kind, Stat)) -> bool {
    match found.entry(name) {
        std::collections::hash_map::Entry::Occupied(_) => false,
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert(entry);
            true
        }
    }
}

/// Where a lookup waits for the outcome of a background listing under way (see [`Storms::landing`]).
pub type Landing = watch::Receiver<Option<Listed>>;

/// Waits for the listing behind `landing` to end; None if it ended without saying how.
pub async fn landed(mut landing: Landing) -> Option<Listed> {
    // Err: the sender is gone; whatever it sent before is still there to read.
    let _ = landing.changed().await;
    *landing.borrow()
}

/// How a directory's background listing ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// Its entries went into the table; `pages` is about what the listing cost.
    Applied { pages: u32 },
    /// More pages than it was to list ([`STORM_MAX_PAGES`], or [`FIRST_PAGE`]).
    TooBig,
    /// Our own changes overtook it, but it showed nothing the table does not account for
    /// ([`crate::fs::inode::InodeTable::accounts_for`]): the directory knows every name it holds again. Its
    /// entries were not taken, so it says nothing of the names it found.
    Renewed { pages: u32 },
    /// It failed, or one of our changes overtook it.
    NotApplied,
}

#[derive(Debug)]
struct DirState {
    window_start: Instant,
    misses: u32,
    listing: bool,
    /// No storm listing before this instant (one was just made, or the directory is too big).
    quiet_until: Instant,
    /// After an applied listing: when a lookup that finds a fresh entry may list again, and how many lookups
    /// must have found one since for that to pay (the listing's pages, and at least a storm's worth).
    refresh_after: Option<Instant>,
    hits_needed: u32,
    hits: u32,
    /// While a listing is under way: when it started, and where its outcome goes to the lookups that wait for it.
    started: Instant,
    landing: Option<watch::Sender<Option<Listed>>>,
    /// Our own changes (unlink, rename, ...) under way in this directory, and when the last one ended.
    changing: u32,
    last_change: Option<Instant>,
    /// Pages of the last listing of the whole directory, if one was applied: what listing it again costs.
    listed_pages: Option<u32>,
    /// Its first page was asked for ([`FIRST_PAGE`]), and whether that is the listing under way.
    first_page_asked: bool,
    first_page_landing: bool,
}

/// Per-directory counts of lookups that asked the bucket, and our own changes that a background listing must
/// not undo (a listing sent before an unlink finished would bring the file back).
#[derive(Debug)]
pub struct Storms {
    window: Duration,
    dirs: Mutex<HashMap<u64, DirState>>,
    /// Woken whenever a directory's last change under way ends (see [`Self::until_settled`]).
    settling: tokio::sync::Notify,
}

impl Storms {
    /// `window` is the metadata TTL: the span over which lookups are counted, and how long a listing is
    /// trusted. Zero turns storms off (nothing may be trusted without asking).
    pub fn new(window: Duration) -> Storms {
        Storms {
            window,
            dirs: Mutex::new(HashMap::new()),
            settling: tokio::sync::Notify::new(),
        }
    }

    fn dirs(&self) -> std::sync::MutexGuard<'_, HashMap<u64, DirState>> {
        self.dirs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn state(dirs: &mut HashMap<u64, DirState>, dir: u64, now: Instant) -> &mut DirState {
        if dirs.len() >= TRACKED_DIRS && !dirs.contains_key(&dir) {
            Self::make_room(dirs, now);
        }
        dirs.entry(dir).or_insert(DirState {
            window_start: now,
            misses: 0,
            listing: false,
            quiet_until: now,
            refresh_after: None,
            hits_needed: 0,
            hits: 0,
            started: now,
            landing: None,
            changing: 0,
            last_change: None,
            listed_pages: None,
            first_page_asked: false,
            first_page_landing: false,
        })
    }

    /// Forgets the directories with nothing worth keeping. Kept: a listing or a change of ours under way, a
    /// listing within its TTL, a directory too big for its first page (forgotten, it would be asked for that
    /// page again). When that frees less than a quarter, the longest quiet of those kept go too, but never one
    /// with a listing or a change of ours under way or behind it: a listing sent before that change must not be
    /// applied. So the scan runs once per quarter of new directories, not once per directory.
    fn make_room(dirs: &mut HashMap<u64, DirState>, now: Instant) {
        dirs.retain(|_, s| {
            s.listing
                || s.changing > 0
                || s.quiet_until > now
                || (s.first_page_asked && s.listed_pages.is_none())
        });
        let target = TRACKED_DIRS * 3 / 4;
        if dirs.len() <= target {
            return;
        }
        let mut quiet: Vec<(Instant, u64)> = dirs
            .iter()
            .filter(|(_, s)| !s.listing && s.changing == 0 && s.last_change.is_none())
            .map(|(dir, s)| (s.window_start, *dir))
            .collect();
        quiet.sort_unstable();
        let excess = dirs.len() - target;
        for (_, dir) in quiet.into_iter().take(excess) {
            dirs.remove(&dir);
        }
    }

    /// Marks a background listing of the directory under way.
    fn start_listing(s: &mut DirState, now: Instant) {
        s.listing = true;
        s.started = now;
        s.landing = Some(watch::channel(None).0);
    }

    /// An applied listing that took `took`: no storm for a window, and a refresh by a later hit shortly before
    /// what it vouches for expires (early enough for a listing as slow as this one to land in time). That is
    /// counted from when it was sent, as the directory's knowledge of every name is.
    fn applied(&self, s: &mut DirState, now: Instant, pages: u32, took: Duration) {
        s.misses = 0;
        s.window_start = now;
        s.quiet_until = now + self.window;
        s.hits = 0;
        let lead = (took * 3).clamp(self.window / 10, self.window / 2);
        let sent = now.checked_sub(took).unwrap_or(now);
        s.refresh_after = Some(sent + self.window - lead);
        s.hits_needed = pages.max(STORM_THRESHOLD);
        s.listed_pages = Some(pages);
    }

    /// Misses within one window that start a storm listing of `s`: [`STORM_THRESHOLD`] for a directory of
    /// unknown size; for one listed whole before, as many as that listing's pages (at least
    /// [`RELIST_THRESHOLD_MIN`]), since that is all a listing costs. Readers that reopen files of a directory
    /// they listed (the kernel answers their lookups from its own cache for a TTL, so no hit is counted here)
    /// would otherwise pay a one-key LIST per name each time the entries expire. Not while we change the
    /// directory ourselves (within the last window): a listing sent then is likely overtaken by our changes,
    /// and worth it only for a whole storm, as before.
    fn storm_threshold(&self, s: &DirState, now: Instant) -> u32 {
        let changing = self.changed_lately(s, now);
        match s.listed_pages {
            Some(pages) if !changing => pages.clamp(RELIST_THRESHOLD_MIN, STORM_THRESHOLD),
            _ => STORM_THRESHOLD,
        }
    }

    /// Counts a lookup in `dir` that must ask the bucket. Some when this one should start a listing: of at most
    /// that many pages ([`FIRST_PAGE`] for the first miss in a directory never listed, else a storm's).
    pub fn note_miss(&self, dir: u64, now: Instant) -> Option<usize> {
        self.count_misses(dir, now, 1)
    }

    /// A lookup that waited for the first page of `dir`, which did not answer it (more pages follow): the same
    /// as [`Self::note_miss`] without counting it again, so that a storm the misses counted meanwhile call for
    /// starts now, and the lookups go on to wait for it rather than each send the LIST of its name.
    pub fn first_page_did_not_answer(&self, dir: u64, now: Instant) -> Option<usize> {
        self.count_misses(dir, now, 0)
    }

    fn count_misses(&self, dir: u64, now: Instant, misses: u32) -> Option<usize> {
        if self.window.is_zero() {
            return None;
        }
        let mut dirs = self.dirs();
        let s = Self::state(&mut dirs, dir, now);
        if now.duration_since(s.window_start) > self.window {
            s.window_start = now;
            s.misses = 0;
        }
        s.misses += misses;
        if s.listing || s.quiet_until > now {
            return None;
        }
        if !s.first_page_asked && s.listed_pages.is_none() && !self.changed_lately(s, now) {
            s.first_page_asked = true;
            s.first_page_landing = true;
            Self::start_listing(s, now);
            return Some(FIRST_PAGE);
        }
        if s.misses < self.storm_threshold(s, now) {
            return None;
        }
        Self::start_listing(s, now);
        Some(STORM_MAX_PAGES)
    }

    /// The first page of `dir` was seen some other way and did not hold all of it (the mount's first LIST of its
    /// root, or the page of `name/` that the lookup which found the directory asked for): its first miss need not
    /// ask for that page again.
    pub fn first_page_seen(&self, dir: u64) {
        if self.window.is_zero() {
            return;
        }
        Self::state(&mut self.dirs(), dir, Instant::now()).first_page_asked = true;
    }

    /// One of our changes to the directory is under way or ended within the last window.
    fn changed_lately(&self, s: &DirState, now: Instant) -> bool {
        s.changing > 0
            || s.last_change
                .is_some_and(|t| now.saturating_duration_since(t) < self.window)
    }

    /// Counts a lookup in `dir` that found its entry fresh. True when this one should list the directory again,
    /// before the entries of its last listing expire together.
    pub fn note_hit(&self, dir: u64, now: Instant) -> bool {
        let mut dirs = self.dirs();
        let Some(s) = dirs.get_mut(&dir) else {
            return false;
        };
        let Some(after) = s.refresh_after else {
            return false;
        };
        s.hits = s.hits.saturating_add(1);
        if now < after || s.listing || s.hits < s.hits_needed {
            return false;
        }
        Self::start_listing(s, now);
        s.refresh_after = None;
        true
    }

    /// The background listing of `dir` under way, if any: a lookup that must ask the bucket meanwhile learns
    /// from it whether its name is a directory, instead of sending a one-key LIST of its own.
    pub fn landing(&self, dir: u64) -> Option<Landing> {
        let dirs = self.dirs();
        let s = dirs.get(&dir).filter(|s| s.listing)?;
        s.landing.as_ref().map(watch::Sender::subscribe)
    }

    /// The listing of `dir` under way, if it is its first page ([`FIRST_PAGE`]): a lookup waits for it before
    /// asking the bucket at all, since it most likely answers, and a GET sent beside it would 404 for the name
    /// of a subdirectory.
    pub fn first_page_landing(&self, dir: u64) -> Option<Landing> {
        let dirs = self.dirs();
        let s = dirs
            .get(&dir)
            .filter(|s| s.listing && s.first_page_landing)?;
        s.landing.as_ref().map(watch::Sender::subscribe)
    }

    /// `dir` was listed whole for a reader (readdir) in `took`: the same as a background listing that landed,
    /// so a directory read after its listing is refreshed before the entries expire, not name by name.
    pub fn listed(&self, dir: u64, pages: u32, took: Duration) {
        if self.window.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut dirs = self.dirs();
        let s = Self::state(&mut dirs, dir, now);
        self.applied(s, now, pages, took);
    }

    /// The background listing of `dir` ended.
    pub fn listing_done(&self, dir: u64, outcome: Listed) {
        let now = Instant::now();
        let mut dirs = self.dirs();
        let s = Self::state(&mut dirs, dir, now);
        s.listing = false;
        let first_page = std::mem::take(&mut s.first_page_landing);
        if let Some(landing) = s.landing.take() {
            landing.send_replace(Some(outcome));
        }
        if let Listed::Applied { pages } | Listed::Renewed { pages } = outcome {
            let took = now.duration_since(s.started);
            self.applied(s, now, pages, took);
            return;
        }
        if first_page {
            // A first page that did not list the directory (more pages follow): the misses go on counting
            // towards a storm, as if it had not been asked.
            return;
        }
        s.misses = 0;
        s.window_start = now;
        s.quiet_until = now
            + if outcome == Listed::TooBig {
                TOO_BIG_BACKOFF
            } else {
                self.window
            };
        s.hits = 0;
        s.refresh_after = None;
    }

    /// Whether a listing of `dir` sent at `asked` may be applied: none of our changes there is under way or
    /// ended after it was sent. Call with the inode table locked, so no change lands in between.
    pub fn unchanged_since(&self, dir: u64, asked: Instant) -> bool {
        self.dirs()
            .get(&dir)
            .is_none_or(|s| s.changing == 0 && s.last_change.is_none_or(|t| t < asked))
    }

    /// Waits until none of our changes to `dir` is under way, or `at_most` has passed. A listing that lands
    /// in the middle of one (a rename whose request is answered but whose names the table has not moved yet)
    /// shows a name the table lacks; once the change ends, the table has it.
    pub async fn until_settled(&self, dir: u64, at_most: Duration) {
        let deadline = tokio::time::Instant::now() + at_most;
        loop {
            let woken = self.settling.notified();
            tokio::pin!(woken);
            // Registered before the check, so an end that comes between the two is not missed.
            woken.as_mut().enable();
            if !self.is_changing(dir) || tokio::time::timeout_at(deadline, woken).await.is_err() {
                return;
            }
        }
    }

    fn is_changing(&self, dir: u64) -> bool {
        self.dirs().get(&dir).is_some_and(|s| s.changing > 0)
    }

    /// Marks a change of `dir` under way until the returned guard is dropped.
    pub fn changing(&self, dir: u64) -> DirChange<'_> {
        Self::state(&mut self.dirs(), dir, Instant::now()).changing += 1;
        DirChange { storms: self, dir }
    }
}

/// One of our changes to a directory, under way while this lives.
pub struct DirChange<'a> {
    storms: &'a Storms,
    dir: u64,
}

impl Drop for DirChange<'_> {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut dirs = self.storms.dirs();
        let s = Storms::state(&mut dirs, self.dir, now);
        s.changing = s.changing.saturating_sub(1);
        s.last_change = Some(now);
        if s.changing == 0 {
            drop(dirs);
            self.storms.settling.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(key: &str) -> crate::s3::ObjectInfo {
        crate::s3::ObjectInfo {
            key: key.into(),
            size: 3,
            etag: "\"e\"".into(),
            last_modified: std::time::SystemTime::UNIX_EPOCH,
            metadata: Default::default(),
        }
    }

    #[test]
    fn one_page_is_the_whole_directory_only_when_no_page_follows() {
        let page = |token: Option<&str>| ListPage {
            objects: vec![
                object("pre/a.jpg"),
                object("pre/b"),
                object("pre/b.rclonelink"),
            ],
            common_prefixes: vec!["pre/b/".into(), "pre/shards/".into()],
            next_continuation_token: token.map(Into::into),
        };
        let whole = whole_from_one_page("pre/", page(None)).expect("one page");
        let mut names: Vec<(&str, Kind)> = whole
            .found
            .iter()
            .map(|(n, (k, _))| (n.as_str(), *k))
            .collect();
        names.sort_by_key(|(n, _)| *n);
        assert_eq!(
            names,
            [
                ("a.jpg", Kind::File),
                ("b", Kind::Directory),
                ("shards", Kind::Directory)
            ]
        );
        assert!(
            whole.shadowed,
            "b stands for a directory, a file and a link"
        );
        assert!(whole_from_one_page("pre/", page(Some("next"))).is_none());
        assert!(
            whole_from_one_page("pre/", page(Some(""))).is_some(),
            "an empty token ends the listing"
        );
    }

    #[test]
    fn a_storm_starts_one_listing_per_window() {
        let storms = Storms::new(Duration::from_secs(1));
        let now = Instant::now();
        // A directory bigger than its first page (see the next test): the misses go on counting.
        assert_eq!(storms.note_miss(7, now), Some(FIRST_PAGE));
        storms.listing_done(7, Listed::TooBig);
        let started: Vec<Option<usize>> = (1..STORM_THRESHOLD * 3)
            .map(|_| storms.note_miss(7, now))
            .collect();
        assert_eq!(started.iter().flatten().count(), 1);
        assert_eq!(started[STORM_THRESHOLD as usize - 2], Some(STORM_MAX_PAGES));
        // Another directory counts on its own.
        assert_eq!(storms.note_miss(8, now), Some(FIRST_PAGE));
        storms.listing_done(7, Listed::Applied { pages: 1 });
        // Entries just listed are fresh for the window: no second listing yet.
        let later = Instant::now();
        assert!((0..STORM_THRESHOLD * 2).all(|_| storms.note_miss(7, later).is_none()));
        // After the window, a storm lists again.
        let next = later + Duration::from_millis(1500);
        let again = (0..STORM_THRESHOLD)
            .filter(|_| storms.note_miss(7, next).is_some())
            .count();
        assert_eq!(again, 1);
    }

    #[test]
    fn many_directories_are_forgotten_a_quarter_at_a_time_keeping_what_matters() {
        let storms = Storms::new(Duration::from_secs(60));
        let now = Instant::now();
        // The oldest, which we are changing, then directories listed within their TTL, up to the limit.
        let change = storms.changing(0);
        for dir in 1..TRACKED_DIRS as u64 {
            storms.listed(dir, 1, Duration::from_millis(1));
        }
        // One more: a quarter goes, the longest quiet first, not the one being changed.
        let big = 1_000_000;
        assert_eq!(storms.note_miss(big, now), Some(FIRST_PAGE));
        storms.listing_done(big, Listed::TooBig);
        assert_eq!(storms.dirs().len(), TRACKED_DIRS * 3 / 4 + 1);
        assert!(storms.dirs().contains_key(&0), "a change under way is kept");
        assert!(!storms.dirs().contains_key(&1), "the longest quiet went");
        // No scan again until that quarter is used up.
        for dir in 2_000_000..2_000_000 + (TRACKED_DIRS / 4 - 1) as u64 {
            storms.listed(dir, 1, Duration::from_millis(1));
        }
        assert_eq!(storms.dirs().len(), TRACKED_DIRS);
        // The directory too big for its first page is not asked for that page again.
        assert_eq!(storms.note_miss(big, now), None);
        drop(change);
    }

    #[test]
    fn the_first_miss_in_a_directory_never_listed_lists_its_first_page() {
        let storms = Storms::new(Duration::from_secs(1));
        let now = Instant::now();
        assert_eq!(storms.note_miss(1, now), Some(FIRST_PAGE));
        assert!(
            storms.first_page_landing(1).is_some(),
            "the next lookups wait for it"
        );
        assert_eq!(storms.note_miss(1, now), None, "one at a time");
        // It held the whole directory: listed, as by a storm.
        storms.listing_done(1, Listed::Applied { pages: 1 });
        assert!((0..STORM_THRESHOLD * 2).all(|_| storms.note_miss(1, now).is_none()));
        // A first page asked once is not asked again, whatever it found.
        assert_eq!(storms.note_miss(2, now), Some(FIRST_PAGE));
        storms.listing_done(2, Listed::NotApplied);
        let storm = (1..STORM_THRESHOLD).position(|_| storms.note_miss(2, now).is_some());
        assert_eq!(
            storm,
            Some(STORM_THRESHOLD as usize - 2),
            "a storm's worth in all"
        );
        // Misses counted while the first page was under way start the storm once it did not answer.
        assert_eq!(storms.note_miss(6, now), Some(FIRST_PAGE));
        assert!((1..STORM_THRESHOLD).all(|_| storms.note_miss(6, now).is_none()));
        assert_eq!(
            storms.first_page_did_not_answer(6, now),
            None,
            "still under way"
        );
        storms.listing_done(6, Listed::TooBig);
        assert_eq!(
            storms.first_page_did_not_answer(6, now),
            Some(STORM_MAX_PAGES)
        );
        assert_eq!(storms.first_page_did_not_answer(6, now), None, "one storm");
        assert!(storms.landing(2).is_some());
        assert!(
            storms.first_page_landing(2).is_none(),
            "a storm is not waited for"
        );
        // Seen already by the lookup that found the directory: not asked for.
        storms.first_page_seen(3);
        assert_eq!(storms.note_miss(3, now), None);
        // Nor while we change the directory (a listing then is likely overtaken), nor after a readdir.
        let change = storms.changing(4);
        assert_eq!(storms.note_miss(4, now), None);
        drop(change);
        storms.listed(5, 1, Duration::from_millis(5));
        assert_eq!(storms.note_miss(5, now + Duration::from_millis(1500)), None);
    }

    #[test]
    fn a_directory_still_read_lists_again_before_its_entries_expire() {
        let storms = Storms::new(Duration::from_secs(1));
        let now = Instant::now();
        // Fresh entries in a directory that no storm listed start nothing.
        assert!((0..100).all(|_| !storms.note_hit(5, now)));
        let started = (0..STORM_THRESHOLD)
            .filter(|_| storms.note_miss(5, now).is_some())
            .count();
        assert_eq!(started, 1);
        storms.listing_done(5, Listed::Applied { pages: 20 });
        let landed = Instant::now();
        // Well within the window the entries are young: hits are only counted (a full listing every half TTL
        // was twice what keeping the entries fresh needs).
        assert!((0..30).all(|_| !storms.note_hit(5, landed)));
        assert!((0..30).all(|_| !storms.note_hit(5, landed + Duration::from_millis(600))));
        // Shortly before they expire, with enough hits to pay for 20 pages: one refresh, not one per hit.
        let later = landed + Duration::from_millis(950);
        assert_eq!((0..10).filter(|_| storms.note_hit(5, later)).count(), 1);
        // A refresh that was not applied hands the directory back to storms: no more refreshes.
        storms.listing_done(5, Listed::NotApplied);
        let much_later = later + Duration::from_secs(2);
        assert!((0..100).all(|_| !storms.note_hit(5, much_later)));
        // A directory too big to list is never refreshed either.
        storms.listing_done(5, Listed::TooBig);
        assert!((0..100).all(|_| !storms.note_hit(5, much_later)));
    }

    #[test]
    fn a_directory_listed_before_lists_again_after_as_many_misses_as_it_has_pages() {
        let storms = Storms::new(Duration::from_secs(1));
        let expired = Instant::now() + Duration::from_millis(1500);
        // A one-page directory a reader listed: once its entries expired, the second miss lists it again (a
        // name looked up alone keeps its one-key LIST), and the misses after it wait for that listing.
        storms.listed(2, 1, Duration::from_millis(5));
        let starts: Vec<bool> = (0..8)
            .map(|_| storms.note_miss(2, expired).is_some())
            .collect();
        assert_eq!(
            starts,
            [false, true, false, false, false, false, false, false]
        );
        assert!(storms.landing(2).is_some());
        // Five pages: the fifth miss.
        storms.listed(3, 5, Duration::from_millis(5));
        let fifth = (0..8).position(|_| storms.note_miss(3, expired).is_some());
        assert_eq!(fifth, Some(4));
        // Never listed: its first page at once; when more pages follow, a storm's worth, however big it is.
        assert_eq!(storms.note_miss(4, expired), Some(FIRST_PAGE));
        storms.listing_done(4, Listed::TooBig);
        let first = (1..STORM_THRESHOLD).position(|_| storms.note_miss(4, expired).is_some());
        assert_eq!(first, Some(STORM_THRESHOLD as usize - 2));
        // Many pages: never more than a storm's worth either.
        storms.listed(5, 80, Duration::from_millis(5));
        let first = (0..STORM_THRESHOLD).position(|_| storms.note_miss(5, expired).is_some());
        assert_eq!(first, Some(STORM_THRESHOLD as usize - 1));
        // A directory we are changing keeps the storm's threshold: a listing would likely be overtaken.
        storms.listed(6, 1, Duration::from_millis(5));
        let change = storms.changing(6);
        let first = (0..STORM_THRESHOLD).position(|_| storms.note_miss(6, expired).is_some());
        assert_eq!(first, Some(STORM_THRESHOLD as usize - 1));
        drop(change);
    }

    #[test]
    fn a_listing_of_many_pages_is_not_refreshed_for_a_few_lookups() {
        let storms = Storms::new(Duration::from_secs(1));
        storms.listing_done(6, Listed::Applied { pages: 50 });
        let later = Instant::now() + Duration::from_millis(950);
        let fiftieth = (0..60)
            .position(|_| storms.note_hit(6, later))
            .expect("a refresh once the hits pay for the pages");
        assert_eq!(fiftieth, 49);
    }

    #[tokio::test]
    async fn lookups_during_a_listing_learn_its_outcome() {
        let storms = Storms::new(Duration::from_secs(1));
        let now = Instant::now();
        assert!(storms.landing(9).is_none(), "no listing under way");
        let starts = (0..STORM_THRESHOLD)
            .filter(|_| storms.note_miss(9, now).is_some())
            .count();
        assert_eq!(starts, 1);
        let waiting = tokio::spawn(landed(storms.landing(9).expect("under way")));
        storms.listing_done(9, Listed::Applied { pages: 2 });
        assert_eq!(waiting.await.unwrap(), Some(Listed::Applied { pages: 2 }));
        assert!(storms.landing(9).is_none(), "landed");
    }

    #[test]
    fn a_slow_listing_is_refreshed_earlier() {
        let storms = Storms::new(Duration::from_secs(1));
        // A readdir's listing that took 100 ms: refreshed 300 ms before what it vouches for expires, not 100,
        // counted from when it was sent (100 ms before it landed).
        storms.listed(4, 1, Duration::from_millis(100));
        let hits = |dir: u64, at: u64| {
            let at = Instant::now() + Duration::from_millis(at);
            (0..STORM_THRESHOLD)
                .filter(|_| storms.note_hit(dir, at))
                .count()
        };
        assert_eq!(hits(4, 550), 0);
        assert_eq!(hits(4, 650), 1);
        // A quick one waits until 100 ms before the end.
        storms.listed(14, 1, Duration::from_millis(5));
        assert_eq!(hits(14, 850), 0);
        assert_eq!(hits(14, 950), 1);
    }

    #[test]
    fn no_storms_without_a_ttl() {
        let storms = Storms::new(Duration::ZERO);
        let now = Instant::now();
        assert!((0..100).all(|_| storms.note_miss(1, now).is_none()));
    }

    #[test]
    fn a_change_under_way_or_after_the_request_voids_the_listing() {
        let storms = Storms::new(Duration::from_secs(1));
        let asked = Instant::now();
        assert!(storms.unchanged_since(3, asked));
        let change = storms.changing(3);
        assert!(!storms.unchanged_since(3, asked));
        drop(change);
        // Ended after the listing was sent: the listing may hold what the change removed.
        assert!(!storms.unchanged_since(3, asked));
        // A listing sent after the change ended sees its result.
        std::thread::sleep(Duration::from_millis(2));
        assert!(storms.unchanged_since(3, Instant::now()));
    }
}
