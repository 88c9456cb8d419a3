//! Turns a NodePublishVolume request into an expressfs command line. Everything a pod author can set
//! (volume attributes, PV mountOptions) goes through an allow-list here: an option we do not know, or a
//! value that could reach outside what the volume should do, is refused before anything is mounted.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

/// Volume attributes (PV `spec.csi.volumeAttributes`) we understand.
pub const ATTR_BUCKET: &str = "bucketName";
pub const ATTR_PREFIX: &str = "prefix";
pub const ATTR_CACHE_XZ: &str = "cacheXz";
/// Keys kubelet adds itself (pod info on mount, ephemeral flag); read by nobody, accepted.
const KUBELET_PREFIX: &str = "csi.storage.k8s.io/";

/// What kind of value a mount option takes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Flag,
    Text,
    Uint,
    Octal,
    AbsolutePath,
    Url,
    Ttl,
}

/// Mount options in Mountpoint CSI spelling and the expressfs flag each becomes. Left out on purpose:
/// anything naming a host file other than the cache (profiles, CA bundles, log directories), the network
/// interface, `foreground` (the driver decides how daemons run) and the FUSE `-o` passthrough.
const OPTIONS: &[(&str, Kind, &str)] = &[
    ("allow-delete", Kind::Flag, "--allow-delete"),
    ("allow-overwrite", Kind::Flag, "--allow-overwrite"),
    ("allow-other", Kind::Flag, "--allow-other"),
    // Kept for PVs written for Mountpoint's driver. Implied: every mount gets --allow-other, which lets root
    // in as well as the pod's users.
    ("allow-root", Kind::Flag, "--allow-root"),
    ("read-only", Kind::Flag, "--read-only"),
    ("ro", Kind::Flag, "--read-only"),
    ("incremental-upload", Kind::Flag, "--incremental-upload"),
    // expressfs's own, for writers that expect a local disk (SEMANTICS.md).
    ("directory-markers", Kind::Flag, "--directory-markers"),
    ("preserve-metadata", Kind::Flag, "--preserve-metadata"),
    ("infer-content-type", Kind::Flag, "--infer-content-type"),
    ("force-path-style", Kind::Flag, "--force-path-style"),
    ("region", Kind::Text, "--region"),
    ("prefix", Kind::Text, "--prefix"),
    ("storage-class", Kind::Text, "--storage-class"),
    ("sse", Kind::Text, "--sse"),
    ("sse-kms-key-id", Kind::Text, "--sse-kms-key-id"),
    ("upload-checksums", Kind::Text, "--upload-checksums"),
    ("cache-xz", Kind::Text, "--cache-xz"),
    ("uid", Kind::Uint, "--uid"),
    ("gid", Kind::Uint, "--gid"),
    ("max-threads", Kind::Uint, "--max-threads"),
    ("dir-mode", Kind::Octal, "--dir-mode"),
    ("file-mode", Kind::Octal, "--file-mode"),
    ("metadata-ttl", Kind::Ttl, "--metadata-ttl"),
    ("cache", Kind::AbsolutePath, "--cache"),
    ("endpoint-url", Kind::Url, "--endpoint-url"),
];

/// Options the daemon refuses next to `--read-only` (`Args::validate` in src/cli.rs): each one is about how
/// the mount writes.
const WRITE_ONLY: &[&str] = &[
    "allow-delete",
    "allow-overwrite",
    "incremental-upload",
    "directory-markers",
];

/// Modes that let the pod's fsGroup write, for a volume that names none: the daemon's own defaults (0755,
/// 0644) leave the group read-only, and it checks permissions in the kernel (default_permissions), while
/// kubelet, told that the driver applies the fsGroup (VOLUME_MOUNT_GROUP), changes no mode itself.
const GROUP_DIR_MODE: &str = "0775";
const GROUP_FILE_MODE: &str = "0664";

/// The request fields that decide the command line.
#[derive(Debug, Default, Clone)]
pub struct PublishInput {
    pub volume_context: HashMap<String, String>,
    pub mount_flags: Vec<String>,
    /// `volume_mount_group` (the pod's fsGroup when the CO passes it to us).
    pub mount_group: String,
    /// `readonly` of the request or a reader-only access mode.
    pub read_only: bool,
    pub allow_insecure_endpoints: bool,
    /// The driver's `--cache-root`s: a `cache` option must name a directory under one of them. The daemon
    /// writes (and evicts) there as root, and with the host launcher these are the host's paths.
    pub cache_roots: Vec<PathBuf>,
}

/// A checked mount: the bucket and the expressfs arguments before `BUCKET TARGET`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    pub bucket: String,
    pub args: Vec<String>,
}

impl MountPlan {
    /// The source our mount shows in mountinfo (`expressfs:BUCKET` or `expressfs:BUCKET/PREFIX`).
    pub fn source(&self) -> String {
        let prefix = self
            .args
            .iter()
            .position(|a| a == "--prefix")
            .and_then(|i| self.args.get(i + 1));
        match prefix {
            Some(p) => format!("expressfs:{}/{}", self.bucket, p.trim_end_matches('/')),
            None => format!("expressfs:{}", self.bucket),
        }
    }
}

/// Splits `region us-east-1`, `--region=us-east-1`, `allow-delete` into a name and an optional value.
fn split_option(raw: &str) -> (String, Option<String>) {
    let text = raw.trim().trim_start_matches('-');
    match text.find(|c: char| c == '=' || c.is_whitespace()) {
        Some(at) => {
            let value = text[at + 1..].trim();
            (text[..at].to_string(), Some(value.to_string()))
        }
        None => (text.to_string(), None),
    }
}

/// A value may not look like a flag and keeps to characters bucket names, regions, paths and URLs use.
fn plain(value: &str) -> bool {
    !value.is_empty()
        && !value.starts_with('-')
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=+@%,".contains(c))
}

fn check_value(name: &str, kind: Kind, value: &str, input: &PublishInput) -> Result<(), String> {
    let insecure_ok = input.allow_insecure_endpoints;
    let bad = |why: &str| Err(format!("mount option {name}: {why}: {value:?}"));
    if !plain(value) {
        return bad("value not allowed");
    }
    match kind {
        Kind::Flag => unreachable!("flags carry no value"),
        Kind::Text => Ok(()),
        Kind::Uint => value
            .parse::<u32>()
            .map(|_| ())
            .or_else(|_| bad("not a number")),
        Kind::Octal => {
            if value.len() <= 4 && value.chars().all(|c| ('0'..='7').contains(&c)) {
                Ok(())
            } else {
                bad("not an octal mode")
            }
        }
        Kind::Ttl => {
            if value == "minimal" || value == "indefinite" || value.parse::<u64>().is_ok() {
                Ok(())
            } else {
                bad("not seconds, minimal or indefinite")
            }
        }
        Kind::AbsolutePath => {
            let path = Path::new(value);
            let clean = path
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
            if !(path.is_absolute() && clean) {
                bad("needs an absolute path without '..'")
            } else if !input.cache_roots.iter().any(|root| path.starts_with(root)) {
                let roots: Vec<String> = input
                    .cache_roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect();
                bad(&format!(
                    "not under the driver's --cache-root ({})",
                    roots.join(", ")
                ))
            } else {
                Ok(())
            }
        }
        Kind::Url => {
            if value.starts_with("https://") || (insecure_ok && value.starts_with("http://")) {
                Ok(())
            } else if value.starts_with("http://") {
                bad("plain HTTP needs the driver's --allow-insecure-endpoints")
            } else {
                bad("not an https:// URL")
            }
        }
    }
}

/// The place of option `name` (one of ours) in `OPTIONS`.
fn index_of(name: &str) -> usize {
    OPTIONS.iter().position(|(n, _, _)| *n == name).unwrap()
}

/// Read-only by the PV's own options: its write options contradict them, and the daemon would refuse the
/// pair. Read-only by the request alone (a read-only claim, volume mount or access mode of a PV written for
/// writers): the PV's write options are right for its other claims, so this mount goes without them.
fn settle_read_only(
    chosen: &mut BTreeMap<usize, Option<String>>,
    forced: bool,
) -> Result<(), String> {
    let writes = write_only_options(chosen);
    if writes.is_empty() {
        return Ok(());
    }
    if chosen.contains_key(&index_of("read-only")) || chosen.contains_key(&index_of("ro")) {
        return Err(format!(
            "mount option {} cannot be combined with read-only",
            writes[0]
        ));
    }
    if forced {
        tracing::info!(dropped = ?writes, "read-only publish: leaving out the PV's write options");
        chosen.retain(|index, _| !writes.contains(&OPTIONS[*index].0));
    }
    Ok(())
}

/// The chosen options the daemon refuses on a read-only mount, by name.
fn write_only_options(chosen: &BTreeMap<usize, Option<String>>) -> Vec<&'static str> {
    chosen
        .keys()
        .map(|index| OPTIONS[*index].0)
        .filter(|name| WRITE_ONLY.contains(name))
        .collect()
}

/// `authenticationSource: pod`: the daemon runs on the pod's credentials (checked in full by podauth).
fn pod_authenticated(input: &PublishInput) -> bool {
    input
        .volume_context
        .get(crate::podauth::ATTR_AUTH_SOURCE)
        .is_some_and(|source| source == "pod")
}

fn check_prefix(prefix: &str) -> Result<(), String> {
    if !plain(prefix) || !prefix.ends_with('/') || prefix.split('/').any(|p| p == "..") {
        return Err(format!(
            "prefix {prefix:?} must end in '/' and use plain characters"
        ));
    }
    Ok(())
}

/// Checks the request and builds the command line. Errors are for the pod author (InvalidArgument).
pub fn plan(input: &PublishInput) -> Result<MountPlan, String> {
    let mut context_prefix = None;
    let mut cache_xz = None;
    let mut bucket = None;
    for (key, value) in &input.volume_context {
        match key.as_str() {
            ATTR_BUCKET => bucket = Some(value.clone()),
            ATTR_PREFIX => context_prefix = Some(value.clone()),
            ATTR_CACHE_XZ => cache_xz = Some(value.clone()),
            // Checked by podauth: they decide the daemon's credentials, not its command line.
            crate::podauth::ATTR_AUTH_SOURCE | crate::podauth::ATTR_ROLE_ARN => {}
            k if k.starts_with(KUBELET_PREFIX) => {}
            other => return Err(format!("unknown volume attribute {other:?}")),
        }
    }
    let bucket = bucket.ok_or_else(|| format!("volume attribute {ATTR_BUCKET} is required"))?;
    if !plain(&bucket) || bucket.contains('/') {
        return Err(format!("bucketName {bucket:?} is not a bucket name"));
    }

    // Name -> value, in option order of the table (stable command lines, one of each).
    let mut chosen: BTreeMap<usize, Option<String>> = BTreeMap::new();
    for raw in &input.mount_flags {
        if raw.trim().is_empty() {
            continue;
        }
        let (name, value) = split_option(raw);
        let index = OPTIONS
            .iter()
            .position(|(n, _, _)| *n == name)
            .ok_or_else(|| format!("unsupported mount option {raw:?}"))?;
        let (_, kind, _) = OPTIONS[index];
        match (kind, &value) {
            (Kind::Flag, Some(_)) => return Err(format!("mount option {name} takes no value")),
            (Kind::Flag, None) => {}
            (_, None) => return Err(format!("mount option {name} needs a value")),
            (_, Some(v)) => check_value(&name, kind, v, input)?,
        }
        if chosen.insert(index, value).is_some() && kind != Kind::Flag {
            return Err(format!("mount option {name} given twice"));
        }
    }
    if let Some(prefix) = context_prefix {
        if chosen.contains_key(&index_of("prefix")) {
            return Err("prefix given both as a volume attribute and a mount option".into());
        }
        chosen.insert(index_of("prefix"), Some(prefix));
    }
    if let Some(Some(prefix)) = chosen.get(&index_of("prefix")) {
        check_prefix(prefix)?;
    }
    if let Some(xz) = cache_xz {
        if chosen.contains_key(&index_of("cache-xz")) {
            return Err("cacheXz given both as a volume attribute and a mount option".into());
        }
        if !plain(&xz) || xz.contains('/') {
            return Err(format!("cacheXz {xz:?} is not a bucket name"));
        }
        chosen.insert(index_of("cache-xz"), Some(xz));
    }
    if chosen.contains_key(&index_of("cache")) && pod_authenticated(input) {
        // The cache keeps blocks by bucket, key and ETag: a daemon that learns an ETag (a listing is enough)
        // reads the block that another pod's credentials fetched, with no GET on its own.
        return Err(format!(
            "mount option cache cannot be used with {}: pod: the daemons of every pod that names the \
             directory would read what the others' credentials fetched",
            crate::podauth::ATTR_AUTH_SOURCE
        ));
    }
    // The pod's fsGroup owns the files unless the PV names a gid itself, and may write them.
    if !input.mount_group.is_empty() && !chosen.contains_key(&index_of("gid")) {
        check_value("gid", Kind::Uint, &input.mount_group, input)?;
        chosen.insert(index_of("gid"), Some(input.mount_group.clone()));
        for (name, mode) in [("dir-mode", GROUP_DIR_MODE), ("file-mode", GROUP_FILE_MODE)] {
            chosen
                .entry(index_of(name))
                .or_insert_with(|| Some(mode.to_string()));
        }
    }
    settle_read_only(&mut chosen, input.read_only)?;
    if input.read_only {
        chosen.insert(index_of("read-only"), None);
        chosen.remove(&index_of("ro"));
    }
    // Pods run as users other than the one mounting (root).
    chosen.insert(index_of("allow-other"), None);

    let mut args = Vec::new();
    let mut flags_seen = Vec::new();
    for (index, value) in chosen {
        let (_, _, flag) = OPTIONS[index];
        if flags_seen.contains(&flag) {
            continue;
        }
        flags_seen.push(flag);
        args.push(flag.to_string());
        if let Some(v) = value {
            args.push(v);
        }
    }
    Ok(MountPlan { bucket, args })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(bucket: &str, flags: &[&str]) -> PublishInput {
        PublishInput {
            volume_context: [(ATTR_BUCKET.to_string(), bucket.to_string())].into(),
            mount_flags: flags.iter().map(|s| s.to_string()).collect(),
            cache_roots: vec!["/var/cache".into()],
            ..Default::default()
        }
    }

    #[test]
    fn expressfs_own_flags_pass() {
        let plan = plan(&input("b", &["directory-markers", "--preserve-metadata"])).unwrap();
        assert!(plan.args.iter().any(|a| a == "--directory-markers"));
        assert!(plan.args.iter().any(|a| a == "--preserve-metadata"));
    }

    #[test]
    fn mountpoint_spellings_map_to_flags() {
        let plan = plan(&input(
            "data--use1-az4--x-s3",
            &[
                "region us-east-1",
                "allow-delete",
                "uid=1000",
                "--gid=2000",
                "cache /var/cache/x",
                "allow-overwrite",
                "endpoint-url https://s3.example.com",
            ],
        ))
        .unwrap();
        assert_eq!(plan.bucket, "data--use1-az4--x-s3");
        assert_eq!(
            plan.args,
            [
                "--allow-delete",
                "--allow-overwrite",
                "--allow-other",
                "--region",
                "us-east-1",
                "--uid",
                "1000",
                "--gid",
                "2000",
                "--cache",
                "/var/cache/x",
                "--endpoint-url",
                "https://s3.example.com",
            ]
        );
        assert_eq!(plan.source(), "expressfs:data--use1-az4--x-s3");
    }

    #[test]
    fn attributes_read_only_and_fs_group() {
        let mut i = input("b", &[]);
        i.volume_context.insert("prefix".into(), "train/".into());
        i.volume_context
            .insert("cacheXz".into(), "c--use1-az4--x-s3".into());
        i.volume_context
            .insert("csi.storage.k8s.io/pod.name".into(), "p".into());
        i.mount_group = "3000".into();
        i.read_only = true;
        let plan = plan(&i).unwrap();
        assert_eq!(
            plan.args,
            [
                "--allow-other",
                "--read-only",
                "--prefix",
                "train/",
                "--cache-xz",
                "c--use1-az4--x-s3",
                "--gid",
                "3000",
                "--dir-mode",
                "0775",
                "--file-mode",
                "0664"
            ]
        );
        assert_eq!(plan.source(), "expressfs:b/train");
    }

    /// The value `flag` gets on the command line, if it is there.
    fn value_of<'a>(plan: &'a MountPlan, flag: &str) -> Option<&'a str> {
        let at = plan.args.iter().position(|a| a == flag)?;
        plan.args.get(at + 1).map(String::as_str)
    }

    #[test]
    fn fs_group_may_write_unless_the_volume_sets_modes() {
        let mut i = input("b", &["allow-overwrite"]);
        i.mount_group = "3000".into();
        let group = plan(&i).unwrap();
        assert_eq!(value_of(&group, "--gid"), Some("3000"));
        assert_eq!(value_of(&group, "--dir-mode"), Some("0775"));
        assert_eq!(value_of(&group, "--file-mode"), Some("0664"));
        // The volume's own modes win, each on its own.
        let mut i = input("b", &["dir-mode 0750"]);
        i.mount_group = "3000".into();
        let own = plan(&i).unwrap();
        assert_eq!(value_of(&own, "--dir-mode"), Some("0750"));
        assert_eq!(value_of(&own, "--file-mode"), Some("0664"));
        // A PV that names the group itself, or a pod without fsGroup: the daemon's defaults.
        let mut i = input("b", &["gid=2000"]);
        i.mount_group = "3000".into();
        let pv_gid = plan(&i).unwrap();
        assert_eq!(value_of(&pv_gid, "--gid"), Some("2000"));
        assert_eq!(value_of(&pv_gid, "--dir-mode"), None);
        assert_eq!(
            value_of(&plan(&input("b", &[])).unwrap(), "--file-mode"),
            None
        );
    }

    #[test]
    fn read_only_publish_of_a_writers_volume_leaves_out_its_write_options() {
        let flags = [
            "allow-delete",
            "allow-overwrite",
            "incremental-upload",
            "directory-markers",
            "preserve-metadata",
            "region us-east-1",
        ];
        let mut i = input("b", &flags);
        i.read_only = true;
        assert_eq!(
            plan(&i).unwrap().args,
            [
                "--allow-other",
                "--read-only",
                "--preserve-metadata",
                "--region",
                "us-east-1"
            ]
        );
        // Read-write, they stay.
        i.read_only = false;
        let args = plan(&i).unwrap().args;
        for flag in [
            "--allow-delete",
            "--allow-overwrite",
            "--incremental-upload",
            "--directory-markers",
        ] {
            assert!(args.iter().any(|a| a == flag), "{flag} missing: {args:?}");
        }
        // A PV that asks for read-only and for writes contradicts itself: said before anything starts.
        for read_only in ["read-only", "ro"] {
            let err = plan(&input("b", &[read_only, "allow-delete"])).unwrap_err();
            assert!(
                err.contains("allow-delete cannot be combined with read-only"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_shared_cache_is_refused_with_pod_credentials() {
        let mut i = input("b", &["cache /var/cache/x"]);
        assert!(plan(&i).is_ok());
        i.volume_context
            .insert(crate::podauth::ATTR_AUTH_SOURCE.into(), "pod".into());
        let err = plan(&i).unwrap_err();
        assert!(
            err.contains("cache cannot be used with authenticationSource: pod"),
            "{err}"
        );
        assert!(plan(&input("b", &[])).is_ok());
        let mut i = input("b", &[]);
        i.volume_context
            .insert(crate::podauth::ATTR_AUTH_SOURCE.into(), "pod".into());
        assert!(plan(&i).is_ok(), "pod credentials without a cache");
    }

    #[test]
    fn refused_requests() {
        let refused = |i: PublishInput| plan(&i).unwrap_err();
        assert!(refused(PublishInput::default()).contains("bucketName"));
        assert!(refused(input("b", &["foreground"])).contains("unsupported"));
        assert!(refused(input("b", &["profile default"])).contains("unsupported"));
        assert!(refused(input("b", &["log-directory /tmp"])).contains("unsupported"));
        assert!(refused(input("b", &["region"])).contains("needs a value"));
        assert!(refused(input("b", &["allow-delete=yes"])).contains("no value"));
        assert!(refused(input("b", &["uid=-1"])).contains("uid"));
        assert!(refused(input("b", &["uid=root"])).contains("not a number"));
        assert!(refused(input("b", &["cache ../etc"])).contains("absolute"));
        assert!(refused(input("b", &["cache /var/../etc"])).contains("absolute"));
        // A host path outside the cache roots (the daemon writes there as root).
        assert!(refused(input("b", &["cache /etc/sudoers.d"])).contains("--cache-root"));
        assert!(refused(input("b", &["cache /var/cachex"])).contains("--cache-root"));
        assert!(plan(&input("b", &["cache /var/cache"])).is_ok());
        assert!(refused(input("b", &["region --foreground"])).contains("not allowed"));
        assert!(refused(input("b", &["region a;b"])).contains("not allowed"));
        assert!(refused(input("b", &["region a", "region b"])).contains("twice"));
        assert!(refused(input("b/x", &[])).contains("bucket name"));
        let mut i = input("b", &[]);
        i.volume_context.insert("prefix".into(), "train".into());
        assert!(refused(i).contains("must end in '/'"));
        let mut i = input("b", &[]);
        i.volume_context.insert("mounter".into(), "x".into());
        assert!(refused(i).contains("unknown volume attribute"));
    }

    #[test]
    fn plain_http_endpoints_need_the_driver_flag() {
        let mut i = input("b", &["endpoint-url http://127.0.0.1:9000"]);
        assert!(plan(&i).unwrap_err().contains("allow-insecure-endpoints"));
        i.allow_insecure_endpoints = true;
        assert!(
            plan(&i)
                .unwrap()
                .args
                .contains(&"http://127.0.0.1:9000".to_string())
        );
        let i = input("b", &["endpoint-url file:///etc/passwd"]);
        assert!(plan(&i).unwrap_err().contains("https"));
    }
}
