//! The inode table: numbers for keys and prefixes, their last-known stat, and how long it is trusted.
//!
//! A node is identified by (parent, name, kind). Looking the same name up again reuses its number while
//! the kind stays the same; when a name changes kind (a file replaced by a directory), it gets a new number.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

mod child_names;

use child_names::ChildNames;

use super::attrs::StoredAttrs;
use super::names;
use crate::s3::UserMetadata;

pub const ROOT_INO: u64 = 1;

/// Names a directory remembers letting go of (for [`InodeTable::accounts_for`]): enough for the changes a
/// listing of a busy directory overlaps (rsync makes and renames a file every few milliseconds).
const LET_GO_KEPT: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Directory,
    /// A symbolic link, stored as the object `name.rclonelink` (see [`names::LINK_SUFFIX`]).
    Symlink,
}

impl Kind {
    /// The key of `name` of this kind in the directory whose prefix is `dir_prefix`.
    pub fn key(self, dir_prefix: &str, name: &str) -> String {
        match self {
            Kind::File => names::file_key(dir_prefix, name),
            Kind::Directory => names::dir_prefix(dir_prefix, name),
            Kind::Symlink => names::link_key(dir_prefix, name),
        }
    }
}

/// What the bucket's Last-Modified would say now: whole seconds, as S3 keeps it. A file written here shows
/// this until a HEAD or a listing brings the bucket's own; with the sub-second part, its mtime would move then.
pub(crate) fn last_modified_now() -> SystemTime {
    crate::s3::whole_seconds(SystemTime::now())
}

/// What the bucket (or our own write) says about a node.
#[derive(Debug, Clone)]
pub struct Stat {
    pub size: u64,
    pub mtime: SystemTime,
    /// ETag of the object a file node stands for (None for directories and files not yet uploaded).
    pub etag: Option<String>,
    /// Attributes from the object's user metadata; None when not known (a listing carries no metadata).
    pub attrs: Option<StoredAttrs>,
}

impl Stat {
    /// What a HEAD (or a listing entry) says about an object.
    pub fn of(info: &crate::s3::ObjectInfo) -> Stat {
        Stat {
            size: info.size,
            mtime: info.last_modified,
            etag: Some(info.etag.clone()),
            attrs: Some(StoredAttrs::from_metadata(&info.metadata)),
        }
    }

    /// A file of ours that the bucket does not date yet (being written, or just uploaded: a PUT's answer
    /// carries no Last-Modified).
    pub fn new_file(attrs: Option<StoredAttrs>) -> Stat {
        Stat {
            size: 0,
            mtime: last_modified_now(),
            etag: None,
            attrs,
        }
    }

    /// A bucket keeps no times for a directory: every directory shows the time the mount started (as with
    /// Mountpoint), so its mtime does not move each time a listing or a lookup sees it again (`rsync -a`
    /// from the mount would set every directory's time on each run).
    pub fn directory() -> Stat {
        static MOUNTED_AT: std::sync::OnceLock<SystemTime> = std::sync::OnceLock::new();
        Stat {
            size: 0,
            mtime: *MOUNTED_AT.get_or_init(last_modified_now),
            etag: None,
            attrs: None,
        }
    }
}

/// How a read handle uses the page cache ([`Node::open_read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOpening {
    /// The kernel may keep what it holds (FOPEN_KEEP_CACHE).
    pub keep_cache: bool,
    /// The handle reads around the page cache (FOPEN_DIRECT_IO).
    pub bypass: bool,
}

/// One name in the table. Its fields are private: the methods below hold the rules for the writer count,
/// the page-cache keep/drop decision and when its stat may be replaced.
#[derive(Debug, Clone)]
pub struct Node {
    ino: u64,
    parent: u64,
    name: String,
    kind: Kind,
    /// Object key for files; key prefix ending in `/` for directories (the mount prefix for the root).
    key: String,
    stat: Stat,
    /// When the bucket was asked for `stat` (or when our own upload set it). An answer to a request sent
    /// earlier than this is older than what we know and must not replace it.
    stat_at: Instant,
    /// Until when `stat` (and this name's existence) may be served without asking the bucket.
    expires: Instant,
    /// Kernel references (lookup count); the node is dropped when it reaches zero.
    lookups: u64,
    /// A listing or HEAD changed the size after the kernel was told the node's attributes: the kernel still
    /// has the old size, which would cut a page-cache read of the new version short.
    kernel_size_stale: bool,
    /// Exists only here so far: a directory made by mkdir, or a file being written.
    local: bool,
    /// Write handles holding bytes the bucket does not have yet.
    writers: u32,
    /// While `writers` is above zero: what the bucket holds (the stat before the first of them wrote, or of
    /// our last upload since). The file goes back to it if their bytes never reach the bucket.
    bucket_stat: Option<Stat>,
    /// The version (ETag) whose bytes the kernel's page cache may hold for this inode: a read open of the
    /// same version keeps them, any other version has them dropped.
    cached_etag: Option<String>,
    /// Versions (ETags) of the read handles open on this inode, one entry per handle: a handle pinned to an
    /// older version can still put that version's bytes into the shared page cache.
    open_versions: Vec<String>,
    /// Nothing has opened or truncated this inode (`claim_page_cache`, which every open and truncation calls
    /// first) and it was not made here: its page cache holds nothing.
    page_cache_unused: bool,
    /// A link's target, with the ETag of the object it was read from (the target is the object's body).
    link_target: Option<(String, String)>,
    /// Directories: until when every name the bucket holds under this one is in the table (a whole listing,
    /// or a mkdir that found the prefix empty): a name with no node here does not exist. See
    /// [`InodeTable::know_every_name`].
    every_name_known_until: Option<Instant>,
    /// When the table last let go of a name under this directory that the bucket may still hold: a listing
    /// sent before then cannot vouch for every name.
    names_doubted_at: Option<Instant>,
    /// Directories: the names the table let go of lately, and when (see [`InodeTable::accounts_for`]); the
    /// time of the newest one no longer kept.
    let_go: VecDeque<(String, Kind, Instant)>,
    let_go_forgotten_at: Option<Instant>,
    /// The whole user metadata of our own last metadata copy, with the ETag it got and the `stat_at` it set:
    /// while nothing newer was learnt or uploaded since, the next chmod/utimens needs no HEAD to learn it.
    /// (An ETag alone does not tell: a general-purpose bucket gives the same bytes the same ETag.)
    own_metadata: Option<Box<(String, Instant, UserMetadata)>>,
}

impl Node {
    fn new(ino: u64, parent: u64, name: &str, kind: Kind, key: String, stat: Stat) -> Node {
        Node {
            ino,
            parent,
            name: name.to_string(),
            kind,
            key,
            stat,
            stat_at: Instant::now(),
            expires: Instant::now(),
            lookups: 0,
            kernel_size_stale: false,
            local: false,
            writers: 0,
            bucket_stat: None,
            cached_etag: None,
            open_versions: Vec::new(),
            page_cache_unused: true,
            link_target: None,
            every_name_known_until: None,
            names_doubted_at: None,
            let_go: VecDeque::new(),
            let_go_forgotten_at: None,
            own_metadata: None,
        }
    }

    pub fn ino(&self) -> u64 {
        self.ino
    }

    pub fn parent(&self) -> u64 {
        self.parent
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn stat(&self) -> &Stat {
        &self.stat
    }

    pub fn is_fresh(&self, now: Instant) -> bool {
        self.is_pending() || self.expires > now
    }

    /// How much longer than `now` what the bucket last said of it is trusted (zero once expired).
    pub fn trusted_after(&self, now: Instant) -> Duration {
        self.expires.saturating_duration_since(now)
    }

    /// Trusted without asking the bucket until `expires`.
    pub fn trust_until(&mut self, expires: Instant) {
        self.expires = expires;
    }

    /// Asked about again on the next lookup.
    pub fn expire(&mut self) {
        self.expires = Instant::now();
    }

    /// Exists only here so far (a directory made by mkdir, a file being written and never uploaded).
    pub fn is_local(&self) -> bool {
        self.local
    }

    /// Made here: the bucket does not know it until it is uploaded.
    pub fn mark_local(&mut self) {
        self.local = true;
        self.page_cache_unused = false;
    }

    /// What the bucket says about this name is not the whole truth: it was made here, or is being written.
    pub fn is_pending(&self) -> bool {
        self.local || self.is_being_written()
    }

    /// A write handle now holds bytes of this file that the bucket does not have.
    pub fn start_write(&mut self) {
        if self.writers == 0 {
            self.bucket_stat = Some(self.stat.clone());
        }
        self.writers += 1;
    }

    /// A write handle's bytes are all uploaded (or it wrote none).
    pub fn finish_write(&mut self) {
        self.writers = self.writers.saturating_sub(1);
        if self.writers == 0 {
            self.bucket_stat = None;
        }
    }

    /// A write handle's bytes will never be uploaded (the upload failed, or its handle went without one).
    /// When it was the last writer, the file is again what the bucket holds, asked about anew at the next
    /// lookup, and this returns true: whoever cached the writer's size must forget it.
    pub fn abandon_write(&mut self) -> bool {
        self.writers = self.writers.saturating_sub(1);
        if self.writers > 0 {
            return false;
        }
        let Some(stat) = self.bucket_stat.take() else {
            return false;
        };
        self.stat = stat;
        self.expire();
        true
    }

    pub fn is_being_written(&self) -> bool {
        self.writers > 0
    }

    /// Writers counted on it: handles and staged files with bytes the bucket lacks, and writers released
    /// with their last upload under way.
    pub fn writer_count(&self) -> u32 {
        self.writers
    }

    /// The size the writer now has (the bucket still has the old one).
    pub fn set_size(&mut self, size: u64) {
        self.stat.size = size;
    }

    /// Bytes were written: size and mtime as the writer has them. `dated`: with `--preserve-metadata`, the
    /// mtime the writer's upload is to carry, which stat shows in place of the one stored with the old bytes
    /// (none yet: now, until the upload dates it).
    pub fn record_write(&mut self, size: u64, dated: Option<SystemTime>) {
        self.stat.size = size;
        self.stat.mtime = dated.unwrap_or_else(last_modified_now);
        if let Some(attrs) = &mut self.stat.attrs {
            attrs.mtime = dated;
        }
    }

    /// Takes `stat` from the bucket's answer to a request sent at `asked`, unless it is stale: the file is
    /// being written here (the bucket does not know its size yet), or what we hold is newer than the request
    /// (a listing or HEAD sent before our own upload finished would bring back the old size).
    pub fn observe(&mut self, stat: Stat, asked: Instant) -> bool {
        if self.is_being_written() {
            return false;
        }
        if asked < self.stat_at {
            // A listing sent after this answer (one a lookup waited for) carries no metadata; what this answer
            // says of the same version still holds, as below. Same ETag and same date to the second: a copy that
            // replaced only the metadata keeps the ETag of a single-part object but not its date.
            let same_version = stat.etag.is_some()
                && stat.etag == self.stat.etag
                && same_second(stat.mtime, self.stat.mtime);
            if self.stat.attrs.is_none() && same_version {
                self.stat.attrs = stat.attrs;
            }
            return false;
        }
        // A listing says nothing of the metadata: what a HEAD said of the same version still holds.
        let attrs = match (stat.attrs, &self.stat.attrs) {
            (None, Some(known)) if stat.etag == self.stat.etag => Some(*known),
            (attrs, _) => attrs,
        };
        if self.lookups > 0 && stat.size != self.stat.size {
            self.kernel_size_stale = true;
        }
        self.stat = Stat { attrs, ..stat };
        self.stat_at = asked;
        true
    }

    /// Our metadata copy wrote `metadata` as the whole user metadata of version `etag`, and the node took that
    /// version's stat from it (`observe` just accepted it).
    pub fn remember_own_metadata(&mut self, etag: &str, metadata: UserMetadata) {
        self.own_metadata = Some(Box::new((etag.to_string(), self.stat_at, metadata)));
    }

    /// The user metadata of the version the node shows, if our own copy wrote it and nothing was observed or
    /// uploaded since.
    pub fn own_metadata(&self) -> Option<&UserMetadata> {
        let (etag, at, metadata) = self.own_metadata.as_deref()?;
        (self.stat.etag.as_deref() == Some(etag.as_str()) && *at == self.stat_at)
            .then_some(metadata)
    }

    /// Attributes set on a file open for writing (they go with its upload): stat shows them meanwhile.
    pub fn overlay_attrs(&mut self, change: StoredAttrs) {
        let known = self.stat.attrs.unwrap_or_default();
        self.stat.attrs = Some(known.overlay(change));
    }

    /// Records an upload of ours that just completed, with the attributes it carried (stat keeps showing
    /// them, as chmod/utimens set them while the file was open) and, when the writer wrote all of it, the
    /// object's whole user metadata (a chmod right after then needs no HEAD).
    pub fn record_own_upload(
        &mut self,
        size: u64,
        etag: &str,
        attrs: Option<StoredAttrs>,
        metadata: Option<UserMetadata>,
    ) {
        self.record_upload(size, etag.to_string());
        if let Some(attrs) = attrs {
            self.overlay_attrs(attrs);
        }
        if let Some(metadata) = metadata {
            self.remember_own_metadata(etag, metadata);
        }
    }

    /// Records an upload of ours that just completed.
    pub fn record_upload(&mut self, size: u64, etag: String) {
        self.stat = Stat {
            size,
            mtime: last_modified_now(),
            etag: Some(etag),
            // Not known here: the next stat with --preserve-metadata asks the bucket.
            attrs: None,
        };
        self.stat_at = Instant::now();
        self.local = false;
        if self.writers > 0 {
            self.bucket_stat = Some(self.stat.clone());
        }
    }

    /// Whether the kernel's page cache may hold bytes of some version of this file.
    pub fn may_be_in_page_cache(&self) -> bool {
        self.cached_etag.is_some()
    }

    /// An open or a truncation is about to touch this inode's page cache: returns whether it was known to be
    /// empty until now (nothing had ever been opened on it, or written to it through the mount).
    pub fn claim_page_cache(&mut self) -> bool {
        std::mem::replace(&mut self.page_cache_unused, false)
    }

    /// Whether the kernel may still hold a size from before the last change seen; it is told now, so no
    /// longer.
    pub fn take_stale_kernel_size(&mut self) -> bool {
        std::mem::take(&mut self.kernel_size_stale)
    }

    /// A read handle on version `etag` opens (`bypass`: it is to read around the page cache). The page cache
    /// is one per inode, so while a handle pinned to another version is open (and may be adding that
    /// version's bytes to it), this one reads around it too: else one descriptor could read two versions.
    /// The kernel may keep the page cache only if it holds this version and no other version is open.
    pub fn open_read(&mut self, etag: &str, bypass: bool) -> ReadOpening {
        let other_open = self.open_versions.iter().any(|v| v != etag);
        let bypass = bypass || other_open;
        let same = self.cached_etag.as_deref() == Some(etag) && !other_open;
        // What the kernel will hold after this open: this version's bytes, or nothing.
        self.cached_etag = (!bypass).then(|| etag.to_string());
        self.open_versions.push(etag.to_string());
        ReadOpening {
            keep_cache: same && !bypass,
            bypass,
        }
    }

    /// A read handle on version `etag` closed.
    pub fn close_read(&mut self, etag: &str) {
        if let Some(at) = self.open_versions.iter().position(|v| v == etag) {
            self.open_versions.swap_remove(at);
        }
        // This handle may have put its (older) version into the page cache.
        if self.cached_etag.as_deref() != Some(etag) {
            self.cached_etag = None;
        }
    }

    /// The target of this link, if it was read from the version the node now stands for.
    pub fn link_target(&self) -> Option<&str> {
        let (etag, target) = self.link_target.as_ref()?;
        (self.stat.etag.as_ref() == Some(etag)).then_some(target.as_str())
    }

    /// `target` is the body of version `etag` of this link's object.
    pub fn remember_link_target(&mut self, etag: &str, target: String) {
        self.link_target = Some((etag.to_string(), target));
    }

    /// A write open: what the page cache holds is about to be outdated, so the next read open drops it.
    pub fn drop_page_cache(&mut self) {
        self.cached_etag = None;
    }
}

pub struct InodeTable {
    nodes: HashMap<u64, Node>,
    children: ChildNames,
    next: u64,
}

impl InodeTable {
    pub fn new(root_prefix: &str) -> InodeTable {
        let mut root = Node::new(
            ROOT_INO,
            ROOT_INO,
            "",
            Kind::Directory,
            root_prefix.to_string(),
            Stat::directory(),
        );
        root.lookups = 1;
        InodeTable {
            nodes: HashMap::from([(ROOT_INO, root)]),
            children: ChildNames::default(),
            next: ROOT_INO + 1,
        }
    }

    pub fn get(&self, ino: u64) -> Option<&Node> {
        self.nodes.get(&ino)
    }

    pub fn get_mut(&mut self, ino: u64) -> Option<&mut Node> {
        self.nodes.get_mut(&ino)
    }

    pub fn child(&self, parent: u64, name: &str) -> Option<&Node> {
        self.children
            .get(parent, name)
            .and_then(|ino| self.nodes.get(&ino))
    }

    /// Records that `parent/name` exists with `kind` and `stat`, as the bucket said in answer to a request
    /// sent at `observed`; returns its inode number.
    pub fn upsert(
        &mut self,
        parent: u64,
        name: &str,
        kind: Kind,
        stat: Stat,
        expires: Instant,
        observed: Instant,
    ) -> u64 {
        if let Some(ino) = self.children.get(parent, name) {
            if let Some(node) = self.nodes.get_mut(&ino)
                && node.kind == kind
            {
                // A directory made by mkdir stays (locally) even when the bucket no longer has keys under it.
                if node.observe(stat, observed) && kind == Kind::File {
                    node.local = false;
                }
                node.expires = expires;
                return ino;
            }
            self.detach(parent, name);
        }
        let parent_key = self
            .nodes
            .get(&parent)
            .map(|p| p.key.clone())
            .unwrap_or_default();
        let key = kind.key(&parent_key, name);
        let ino = self.next;
        self.next += 1;
        let mut node = Node::new(ino, parent, name, kind, key, stat);
        node.stat_at = observed;
        node.expires = expires;
        self.nodes.insert(ino, node);
        self.children.insert(parent, name, ino);
        ino
    }

    /// [`InodeTable::detach`], only if `name` still stands for `ino`; whether it did. For a file whose upload
    /// failed: an upload whose answer was lost may have landed all the same, so `parent` is listed anew
    /// ([`Self::doubt_names`]) rather than trusted to lack the name.
    pub fn detach_if(&mut self, parent: u64, name: &str, ino: u64) -> bool {
        let stands = self.children.get(parent, name) == Some(ino);
        if stands {
            self.detach(parent, name);
            self.doubt_names(parent);
        }
        stands
    }

    /// Forgets the name `parent/name` (the node lives on while the kernel still references it), because the
    /// bucket no longer has it (deleted, moved away, found missing) or another node takes it. A caller that
    /// cannot say so calls [`Self::doubt_names`] too.
    pub fn detach(&mut self, parent: u64, name: &str) -> Option<u64> {
        let ino = self.children.remove(parent, name)?;
        self.let_go(parent, name, ino);
        if self
            .nodes
            .get(&ino)
            .is_some_and(|n| n.lookups == 0 && !n.is_being_written())
        {
            self.nodes.remove(&ino);
        }
        Some(ino)
    }

    pub fn add_lookup(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.lookups += 1;
        }
    }

    /// The kernel dropped `n` references to `ino`.
    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let Some(node) = self.nodes.get_mut(&ino) else {
            return;
        };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0 && !node.is_being_written() {
            let parent = node.parent;
            // Only drop the name if it still points at this node, so cached listings keep other nodes. A
            // directory made here and still empty exists nowhere else: its name stays while it does.
            let named = self.children.get(parent, &node.name) == Some(ino);
            let only_here =
                node.kind == Kind::Directory && node.local && !self.children.any_in(ino);
            if !named || (node.expires <= Instant::now() && !only_here) {
                if named {
                    self.children.remove(parent, &node.name);
                    // The name may still exist in the bucket: its directory no longer has every name.
                    self.doubt_names(parent);
                }
                self.nodes.remove(&ino);
            }
        }
    }

    /// Every name the bucket holds under directory `dir` has a node in the table, and will until `until`
    /// unless the table drops one it cannot vouch for ([`Self::doubt_names`]): from then to `until`, a name
    /// with no node there is missing without asking. The caller puts the names in first (a whole listing sent
    /// no earlier than `until` minus the TTLs, or a mkdir that found the prefix empty). Our own changes keep
    /// the table true as they go: a name made here gets its node before its object exists, and one removed
    /// loses it only once the bucket no longer has it.
    ///
    /// `asked`: when the request that found the names was sent. If the table let go of a name there since
    /// (see [`Self::doubt_names`]), the request cannot vouch for it, and nothing is known.
    pub fn know_every_name(&mut self, dir: u64, asked: Instant, until: Instant) {
        if let Some(n) = self
            .nodes
            .get_mut(&dir)
            .filter(|n| n.kind == Kind::Directory)
            && n.names_doubted_at.is_none_or(|doubted| doubted < asked)
        {
            n.every_name_known_until = Some(until);
        }
    }

    /// Whether `name` under `dir` is missing by [`Self::know_every_name`]: no node, and every name known. A
    /// link's own object name (`x.rclonelink`) is not a name listings show, so it is always asked about.
    pub fn known_missing(&self, dir: u64, name: &str, now: Instant) -> bool {
        !name.ends_with(names::LINK_SUFFIX)
            && self.child(dir, name).is_none()
            && self
                .nodes
                .get(&dir)
                .and_then(|d| d.every_name_known_until)
                .is_some_and(|until| until > now)
    }

    /// The name `dir/name`, standing for `ino`, left the table now (deleted, moved away, found missing,
    /// replaced).
    fn let_go(&mut self, dir: u64, name: &str, ino: u64) {
        let Some(kind) = self.nodes.get(&ino).map(|n| n.kind) else {
            return;
        };
        let Some(d) = self.nodes.get_mut(&dir) else {
            return;
        };
        if d.let_go.len() >= LET_GO_KEPT
            && let Some((_, _, at)) = d.let_go.pop_front()
        {
            d.let_go_forgotten_at = Some(at);
        }
        d.let_go.push_back((name.to_string(), kind, Instant::now()));
    }

    /// Whether a listing of `dir` sent at `asked`, overtaken by our own changes there, still shows nothing
    /// the table does not account for: each name it found is in the table as what it found (a file, a
    /// directory, a link), or left the table as that after `asked`. Then every name the directory holds is
    /// in the table (ours made since are there already), as an applied listing would say, although its
    /// entries are not taken. A name let go of as a file says nothing of a directory listed under it.
    pub fn accounts_for<'a>(
        &self,
        dir: u64,
        mut listed: impl Iterator<Item = (&'a str, Kind)>,
        asked: Instant,
    ) -> bool {
        let Some(d) = self.nodes.get(&dir) else {
            return false;
        };
        // A name let go after `asked` may have been dropped from what is kept: then nothing can be said.
        if d.let_go_forgotten_at.is_some_and(|at| at > asked) {
            return false;
        }
        listed.all(|(name, kind)| {
            let in_table = self
                .children
                .get(dir, name)
                .and_then(|ino| self.nodes.get(&ino))
                .is_some_and(|n| n.kind == kind);
            in_table
                || d.let_go
                    .iter()
                    .any(|(n, k, at)| n == name && *k == kind && *at > asked)
        })
    }

    /// A name under `dir` left the table while the bucket may still hold it.
    pub fn doubt_names(&mut self, dir: u64) {
        if let Some(n) = self.nodes.get_mut(&dir) {
            n.every_name_known_until = None;
            n.names_doubted_at = Some(Instant::now());
        }
    }

    /// Children known locally (made by mkdir or being written) that a listing of the bucket will not show.
    pub fn local_children(&self, parent: u64) -> Vec<(String, u64, Kind)> {
        self.children
            .of(parent)
            .filter_map(|(name, ino)| {
                let n = self.nodes.get(&ino)?;
                n.is_pending().then(|| (name.to_string(), ino, n.kind))
            })
            .collect()
    }

    /// Names cached under `parent` (for emptiness checks of local directories).
    pub fn has_children(&self, parent: u64) -> bool {
        self.children.any_in(parent)
    }

    /// Moves the name `parent/name` to `new_parent/new_name`, replacing what was there.
    pub fn rename(&mut self, parent: u64, name: &str, new_parent: u64, new_name: &str) {
        let Some(ino) = self.children.remove(parent, name) else {
            // The bucket has the new name, and no node here stands for it.
            self.doubt_names(new_parent);
            return;
        };
        self.let_go(parent, name, ino);
        self.detach(new_parent, new_name);
        let parent_key = self
            .nodes
            .get(&new_parent)
            .map(|p| p.key.clone())
            .unwrap_or_default();
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.parent = new_parent;
            n.name = new_name.to_string();
            n.key = n.kind.key(&parent_key, new_name);
            // What stands under the new name is known as of now: a listing sent before the move (which saw
            // the object the move replaced) must not take its place.
            n.stat_at = n.stat_at.max(Instant::now());
        }
        self.children.insert(new_parent, new_name, ino);
    }

    /// A file under the key prefix `prefix` is being written (its bytes are not all in the bucket).
    pub fn writing_under(&self, prefix: &str) -> bool {
        self.written_under(prefix).next().is_some()
    }

    /// The files under the key prefix `prefix` being written. Not one whose name went (unlinked while open):
    /// it uploads nothing more, so a move of its directory has nothing to wait for.
    pub fn written_under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = u64> + 'a {
        self.nodes
            .values()
            .filter(move |n| {
                n.key.starts_with(prefix)
                    && n.is_being_written()
                    && self.children.get(n.parent, &n.name) == Some(n.ino)
            })
            .map(|n| n.ino)
    }

    /// After a directory moved from `old_prefix` to `new_prefix`: the nodes below it (numbers and names
    /// unchanged) take keys under the new prefix, and are asked about again on their next lookup.
    pub fn move_keys_under(&mut self, old_prefix: &str, new_prefix: &str) {
        for n in self.nodes.values_mut() {
            if let Some(rest) = n.key.strip_prefix(old_prefix) {
                n.key = format!("{new_prefix}{rest}");
                n.expire();
            }
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// Whether two dates fall in the same second (a HEAD's Last-Modified has whole seconds, a listing's more).
fn same_second(a: SystemTime, b: SystemTime) -> bool {
    let secs = |t: SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .ok()
    };
    secs(a) == secs(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_older_answer_gives_its_metadata_only_to_the_version_it_saw() {
        let date = std::time::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
        let stat = |etag: &str, mtime: SystemTime, mode: Option<u32>| Stat {
            size: 3,
            mtime,
            etag: Some(etag.into()),
            attrs: mode.map(|m| StoredAttrs {
                mode: Some(m),
                ..Default::default()
            }),
        };
        let head_asked = Instant::now();
        let listed = head_asked + Duration::from_millis(5);
        for (etag, mtime, kept) in [
            ("\"a\"", date, true),
            // The listing's date has milliseconds, the HEAD's whole seconds.
            (
                "\"a\"",
                std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
                true,
            ),
            // A copy that replaced the metadata: same ETag, a later date.
            ("\"a\"", date + Duration::from_secs(2), false),
            ("\"b\"", date, false),
        ] {
            let mut t = InodeTable::new("");
            let ino = t.upsert(
                ROOT_INO,
                "f",
                Kind::File,
                stat("\"a\"", date, None),
                listed,
                listed,
            );
            let node = t.get_mut(ino).unwrap();
            assert!(!node.observe(stat(etag, mtime, Some(0o600)), head_asked));
            assert_eq!(node.stat().attrs.is_some(), kept, "{etag} {mtime:?}");
            assert_eq!(
                node.stat().etag.as_deref(),
                Some("\"a\""),
                "the newer answer stands"
            );
        }
    }

    impl InodeTable {
        /// A name the bucket just told us about (tests only).
        fn add(&mut self, parent: u64, name: &str, kind: Kind, expires: Instant) -> u64 {
            self.upsert(
                parent,
                name,
                kind,
                Stat::directory(),
                expires,
                Instant::now(),
            )
        }
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    /// The stat of a version of `size` bytes, its ETag named after its size.
    fn version_of_size(size: u64) -> Stat {
        Stat {
            size,
            mtime: SystemTime::UNIX_EPOCH,
            etag: Some(format!("e{size}")),
            attrs: None,
        }
    }

    #[test]
    fn same_name_same_kind_keeps_its_number() {
        let mut t = InodeTable::new("pre/");
        let a = t.add(ROOT_INO, "a", Kind::File, later());
        assert_eq!(t.get(a).unwrap().key, "pre/a");
        assert_eq!(t.add(ROOT_INO, "a", Kind::File, later()), a);
        let d = t.add(ROOT_INO, "a", Kind::Directory, later());
        assert_ne!(d, a);
        assert_eq!(t.get(d).unwrap().key, "pre/a/");
        let f = t.add(d, "x", Kind::File, later());
        assert_eq!(t.get(f).unwrap().key, "pre/a/x");
        let l = t.add(d, "y", Kind::Symlink, later());
        assert_eq!(t.get(l).unwrap().key, "pre/a/y.rclonelink");
        t.rename(d, "y", ROOT_INO, "z");
        assert_eq!(t.get(l).unwrap().key, "pre/z.rclonelink");
    }

    /// A listing overtaken by our own changes vouches for every name when each name it shows is in the table
    /// as what it shows, or was let go of as that after it was sent; never for a name another client made,
    /// a name let go of as something else (a file unlinked, a directory listed under its name), nor past
    /// what is kept.
    #[test]
    fn a_listing_overtaken_by_our_changes_accounts_for_the_names_we_let_go_of() {
        let (file, dir) = (Kind::File, Kind::Directory);
        let mut t = InodeTable::new("");
        let d = t.add(ROOT_INO, "d", dir, later());
        t.add(d, "kept", file, later());
        t.add(d, "old", file, later());
        t.add(d, "x", file, later());
        t.detach(d, "old");
        let asked = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        t.add(d, ".tmp", file, later());
        t.rename(d, ".tmp", d, "new");
        t.detach(d, "x");
        assert!(t.accounts_for(d, [("kept", file), (".tmp", file)].into_iter(), asked));
        assert!(t.accounts_for(
            d,
            [("kept", file), ("new", file), ("x", file)].into_iter(),
            asked
        ));
        assert!(!t.accounts_for(d, [("kept", file), ("theirs", file)].into_iter(), asked));
        assert!(
            !t.accounts_for(d, [("kept", dir)].into_iter(), asked),
            "not what the table holds"
        );
        assert!(
            !t.accounts_for(d, [("x", dir)].into_iter(), asked),
            "let go of as a file"
        );
        assert!(
            !t.accounts_for(d, [("old", file)].into_iter(), asked),
            "let go of before the listing"
        );
        for i in 0..LET_GO_KEPT {
            let name = format!("f{i}");
            t.add(d, &name, file, later());
            t.detach(d, &name);
        }
        assert!(
            !t.accounts_for(d, [("kept", file)].into_iter(), asked),
            "names let go of since were dropped"
        );
    }

    #[test]
    fn a_link_target_holds_only_for_the_version_it_was_read_from() {
        let mut t = InodeTable::new("");
        let stat = |etag: &str| Stat {
            size: 3,
            mtime: SystemTime::UNIX_EPOCH,
            etag: Some(etag.into()),
            attrs: None,
        };
        let ino = t.upsert(
            ROOT_INO,
            "l",
            Kind::Symlink,
            stat("e1"),
            later(),
            Instant::now(),
        );
        let n = t.get_mut(ino).unwrap();
        assert_eq!(n.link_target(), None);
        n.remember_link_target("e1", "../a".into());
        assert_eq!(n.link_target(), Some("../a"));
        assert!(n.observe(stat("e2"), Instant::now() + Duration::from_millis(1)));
        assert_eq!(n.link_target(), None, "the link was replaced");
    }

    #[test]
    fn a_listing_sent_before_a_doubt_vouches_for_nothing() {
        let mut t = InodeTable::new("");
        let d = t.add(ROOT_INO, "d", Kind::Directory, later());
        let asked = Instant::now();
        t.know_every_name(d, asked, later());
        assert!(t.known_missing(d, "x", Instant::now()));
        assert!(
            !t.known_missing(d, "x.rclonelink", Instant::now()),
            "a link's object name"
        );
        t.doubt_names(d);
        assert!(!t.known_missing(d, "x", Instant::now()));
        // Applied after the doubt, but asked before it.
        t.know_every_name(d, asked, later());
        assert!(!t.known_missing(d, "x", Instant::now()));
        std::thread::sleep(Duration::from_millis(2));
        t.know_every_name(d, Instant::now(), later());
        assert!(t.known_missing(d, "x", Instant::now()));
    }

    /// A general-purpose bucket gives the same bytes the same ETag: our metadata copy's metadata holds only
    /// until something newer is learnt or uploaded, whatever the ETag says.
    #[test]
    fn our_own_metadata_holds_until_anything_newer() {
        let mut t = InodeTable::new("");
        let f = t.add(ROOT_INO, "f", Kind::File, later());
        let n = t.get_mut(f).unwrap();
        let stat = Stat {
            size: 1,
            mtime: SystemTime::UNIX_EPOCH,
            etag: Some("e".into()),
            attrs: None,
        };
        assert!(n.observe(stat.clone(), Instant::now()));
        n.remember_own_metadata("e", UserMetadata::from([("mode".into(), "33188".into())]));
        assert!(n.own_metadata().is_some());
        std::thread::sleep(Duration::from_millis(2));
        n.record_upload(1, "e".into());
        assert!(n.own_metadata().is_none(), "an upload of the same bytes");
        n.remember_own_metadata("e", UserMetadata::new());
        std::thread::sleep(Duration::from_millis(2));
        assert!(n.observe(stat, Instant::now()));
        assert!(n.own_metadata().is_none(), "a HEAD since");
    }

    #[test]
    fn forget_drops_unreferenced_expired_nodes() {
        let mut t = InodeTable::new("");
        let a = t.add(ROOT_INO, "a", Kind::File, Instant::now());
        t.add_lookup(a);
        t.add_lookup(a);
        t.forget(a, 1);
        assert!(t.get(a).is_some());
        t.forget(a, 1);
        assert!(t.get(a).is_none());
        assert!(t.child(ROOT_INO, "a").is_none());
    }

    #[test]
    fn moving_a_directory_rekeys_what_lies_below_it() {
        let mut t = InodeTable::new("");
        let d = t.add(ROOT_INO, "d", Kind::Directory, later());
        let sub = t.add(d, "s", Kind::Directory, later());
        let f = t.add(sub, "f", Kind::File, later());
        let other = t.add(ROOT_INO, "dx", Kind::File, later());
        assert!(!t.writing_under("d/"));
        t.get_mut(f).unwrap().start_write();
        assert!(t.writing_under("d/") && !t.writing_under("e/"));
        t.rename(ROOT_INO, "d", ROOT_INO, "e");
        t.move_keys_under("d/", "e/");
        assert_eq!(t.get(d).unwrap().key, "e/");
        assert_eq!(t.get(sub).unwrap().key, "e/s/");
        assert_eq!(t.get(f).unwrap().key, "e/s/f");
        assert!(!t.get(sub).unwrap().is_fresh(Instant::now()));
        // A sibling sharing the name's first letters is not below it.
        assert_eq!(t.get(other).unwrap().key, "dx");
        assert_eq!(t.child(sub, "f").unwrap().ino, f);
    }

    #[test]
    fn rename_moves_names_and_keys() {
        let mut t = InodeTable::new("");
        let d = t.add(ROOT_INO, "d", Kind::Directory, later());
        let a = t.add(ROOT_INO, "a", Kind::File, later());
        t.rename(ROOT_INO, "a", d, "b");
        assert!(t.child(ROOT_INO, "a").is_none());
        assert_eq!(t.child(d, "b").unwrap().ino, a);
        assert_eq!(t.get(a).unwrap().key, "d/b");
    }

    #[test]
    fn an_answer_to_an_older_request_does_not_replace_a_newer_stat() {
        let mut t = InodeTable::new("");
        let stat = version_of_size;
        let listing_sent = Instant::now();
        let ino = t.upsert(ROOT_INO, "f", Kind::File, stat(599), later(), listing_sent);
        // Our own upload finished after the listing was sent ...
        let n = t.get_mut(ino).unwrap();
        n.stat = stat(4096);
        n.stat_at = Instant::now() + std::time::Duration::from_millis(1);
        // ... and the listing's (older) answer arrives afterwards.
        t.upsert(ROOT_INO, "f", Kind::File, stat(599), later(), listing_sent);
        assert_eq!(t.get(ino).unwrap().stat.size, 4096);
        let newer = Instant::now() + std::time::Duration::from_millis(5);
        t.upsert(ROOT_INO, "f", Kind::File, stat(7), later(), newer);
        assert_eq!(t.get(ino).unwrap().stat.size, 7);
    }

    #[test]
    fn a_listing_sent_before_a_rename_does_not_replace_what_moved() {
        let mut t = InodeTable::new("");
        let stat = version_of_size;
        let uploaded = Instant::now();
        let tmp = t.upsert(ROOT_INO, "tmp", Kind::File, stat(5), later(), uploaded);
        t.upsert(ROOT_INO, "x", Kind::File, stat(1), later(), uploaded);
        // A listing is sent, sees the old x; then tmp is moved onto x; then the listing's answer lands.
        let listing_sent = Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        t.rename(ROOT_INO, "tmp", ROOT_INO, "x");
        let x = t.upsert(ROOT_INO, "x", Kind::File, stat(1), later(), listing_sent);
        assert_eq!(x, tmp);
        assert_eq!(t.get(x).unwrap().stat.size, 5);
    }

    #[test]
    fn a_read_open_keeps_the_page_cache_only_for_the_version_it_holds() {
        let mut t = InodeTable::new("");
        let ino = t.add(ROOT_INO, "f", Kind::File, later());
        let n = t.get_mut(ino).unwrap();
        let cached = |keep_cache| ReadOpening {
            keep_cache,
            bypass: false,
        };
        let around = ReadOpening {
            keep_cache: false,
            bypass: true,
        };
        assert_eq!(
            n.open_read("v1", false),
            cached(false),
            "nothing cached yet"
        );
        assert_eq!(n.open_read("v1", false), cached(true), "same version");
        assert_eq!(n.open_read("v2", false), around, "v1 is open");
        assert_eq!(n.open_read("v2", false), around, "v1 is still open");
        n.close_read("v1");
        n.close_read("v1");
        assert_eq!(
            n.open_read("v2", false),
            cached(false),
            "what the v1 handles read may be cached"
        );
        assert_eq!(n.open_read("v2", false), cached(true));
        assert_eq!(
            n.open_read("v2", true),
            around,
            "a bypassing open keeps nothing"
        );
        assert_eq!(
            n.open_read("v2", false),
            cached(false),
            "and leaves nothing to keep"
        );
        n.drop_page_cache();
        assert!(!n.may_be_in_page_cache());
        assert_eq!(
            n.open_read("v2", false),
            cached(false),
            "a write open dropped it"
        );
    }

    #[test]
    fn a_file_being_written_stays_fresh_and_keeps_its_stat() {
        let mut t = InodeTable::new("");
        let ino = t.add(ROOT_INO, "f", Kind::File, Instant::now());
        let n = t.get_mut(ino).unwrap();
        let stat = |size| Stat {
            size,
            mtime: SystemTime::UNIX_EPOCH,
            etag: None,
            attrs: None,
        };
        let later_request = Instant::now() + Duration::from_secs(1);
        n.start_write();
        assert!(n.is_being_written() && n.is_pending());
        assert!(
            n.is_fresh(later()),
            "a file being written is never asked about"
        );
        assert!(
            !n.observe(stat(5), later_request),
            "the bucket has the old size"
        );
        n.finish_write();
        n.finish_write();
        assert!(!n.is_being_written(), "the count does not go below zero");
        assert!(!n.is_fresh(later()));
        assert!(n.observe(stat(5), later_request));
        assert_eq!(n.stat().size, 5);
    }

    #[test]
    fn writes_that_never_reach_the_bucket_leave_what_it_holds() {
        let mut t = InodeTable::new("");
        let ino = t.add(ROOT_INO, "f", Kind::File, later());
        let n = t.get_mut(ino).unwrap();
        n.observe(
            Stat {
                size: 100,
                mtime: SystemTime::UNIX_EPOCH,
                etag: Some("v1".into()),
                attrs: None,
            },
            Instant::now(),
        );
        // Two writers; the first uploads, the second fails: the file is the first one's upload.
        n.start_write();
        n.start_write();
        n.record_write(7, None);
        assert!(!n.abandon_write(), "another writer still holds bytes");
        assert_eq!(n.stat().size, 7, "the other writer's size meanwhile");
        n.record_upload(9, "v2".into());
        n.record_write(3, None);
        assert!(n.abandon_write(), "the last writer gave up");
        assert_eq!(n.stat().size, 9, "what our last upload left in the bucket");
        assert_eq!(n.stat().etag.as_deref(), Some("v2"));
        assert!(!n.is_being_written());
        assert!(!n.is_fresh(Instant::now()), "asked about again");
        // A writer whose bytes all got there leaves its upload; one after it that fails goes back to it.
        n.start_write();
        n.record_upload(11, "v3".into());
        n.finish_write();
        assert!(!n.abandon_write(), "no writer left to give up");
        assert_eq!(n.stat().size, 11);
        n.start_write();
        n.record_write(50, None);
        assert!(n.abandon_write());
        assert_eq!(n.stat().size, 11, "the failed writer's size is gone");
        assert_eq!(n.stat().etag.as_deref(), Some("v3"));
    }
}
