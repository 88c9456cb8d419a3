//! Command line. Flag names follow Mountpoint's (`mount-s3`) wherever the same idea exists, so switching
//! is a matter of changing the binary name. `-o a,b=c` (fstab style) is expanded to the same flags.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::s3::UploadChecksum;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "expressfs",
    version,
    about = "Mount an S3 Express One Zone directory bucket (or a general purpose bucket) as a local file system",
    after_help = "Credentials come from the standard AWS chain (environment, profile, instance role).\n\
                  Directory buckets need the s3express:CreateSession permission."
)]
pub struct Args {
    /// Bucket to mount: base--azid--x-s3 (directory bucket), a general purpose bucket name, an access point
    /// ARN or alias, or s3://bucket/prefix/ (the same as --prefix prefix/)
    pub bucket: String,

    /// Directory to mount the bucket at (must exist and be empty), or /dev/fd/N: a /dev/fuse descriptor
    /// the caller opened and mounted (with fd=N), and unmounts
    pub mountpoint: PathBuf,

    // ---- Bucket options
    /// Mount only keys under this prefix (must end in '/')
    #[arg(long, help_heading = "Bucket options")]
    pub prefix: Option<String>,
    /// AWS region (default: from the directory bucket's zone, then AWS_REGION, then us-east-1)
    #[arg(long, help_heading = "Bucket options")]
    pub region: Option<String>,
    /// S3 endpoint URL (e.g. http://127.0.0.1:9000 for a local emulator)
    #[arg(long, help_heading = "Bucket options")]
    pub endpoint_url: Option<String>,
    /// Use path-style addressing (implied by --endpoint-url)
    #[arg(long, help_heading = "Bucket options")]
    pub force_path_style: bool,
    /// Named profile from the AWS config and credentials files
    #[arg(long, help_heading = "Bucket options")]
    pub profile: Option<String>,
    /// Additional checksum sent with every upload
    #[arg(long, value_parser = ["crc32c", "crc64nvme", "off"], default_value = "crc32c", help_heading = "Bucket options")]
    pub upload_checksums: String,
    /// Treat the bucket as this kind (default: a name ending in --x-s3 is a directory bucket); must agree with
    /// the name
    #[arg(long, value_parser = ["general-purpose", "directory"], help_heading = "Bucket options")]
    pub bucket_type: Option<String>,
    /// Server-side encryption of new objects: aws:kms, aws:kms:dsse or AES256 (default: the bucket's)
    #[arg(long, help_heading = "Bucket options")]
    pub sse: Option<String>,
    /// KMS key ARN for --sse aws:kms or aws:kms:dsse (default: the AWS managed key)
    #[arg(long, help_heading = "Bucket options")]
    pub sse_kms_key_id: Option<String>,
    /// Storage class of new objects, e.g. STANDARD_IA (default: the bucket's; directory buckets only take
    /// EXPRESS_ONEZONE)
    #[arg(long, help_heading = "Bucket options")]
    pub storage_class: Option<String>,
    /// Set Content-Type of new objects from the file name's extension (default: binary/octet-stream)
    #[arg(long, help_heading = "Bucket options")]
    pub infer_content_type: bool,
    /// Send x-amz-request-payer: requester on every request (general purpose buckets)
    #[arg(long, help_heading = "Bucket options")]
    pub requester_pays: bool,
    /// Account ID that must own the bucket (and the --cache-xz bucket); requests to another owner's fail
    #[arg(long, help_heading = "Bucket options")]
    pub expected_bucket_owner: Option<String>,
    /// Send anonymous requests (a public bucket); no credentials are loaded
    #[arg(long, help_heading = "Bucket options")]
    pub no_sign_request: bool,
    /// Use the dual-stack (IPv4 and IPv6) endpoint
    #[arg(long, help_heading = "Bucket options")]
    pub dual_stack: bool,
    /// Use the Transfer Acceleration endpoint (general purpose buckets with acceleration enabled)
    #[arg(long, help_heading = "Bucket options")]
    pub transfer_acceleration: bool,
    /// PEM file of the certificate authorities to trust instead of the system's
    #[arg(long, env = "AWS_CA_BUNDLE", help_heading = "Bucket options")]
    pub ca_bundle: Option<PathBuf>,
    /// Text put in front of the User-Agent of every request
    #[arg(long, help_heading = "Bucket options")]
    pub user_agent_prefix: Option<String>,
    /// Network interface to send requests through (SO_BINDTODEVICE; repeat to spread connections over
    /// several). Needs root or CAP_NET_RAW
    #[arg(long = "bind", value_name = "IFACE", help_heading = "Bucket options")]
    pub bind: Vec<String>,

    // ---- Mount options
    /// Refuse every write (EROFS)
    #[arg(long, help_heading = "Mount options")]
    pub read_only: bool,
    /// Allow replacing existing objects (open with O_TRUNC, rename over a file)
    #[arg(long, help_heading = "Mount options")]
    pub allow_overwrite: bool,
    /// Allow deleting objects (unlink)
    #[arg(long, help_heading = "Mount options")]
    pub allow_delete: bool,
    /// mkdir writes an empty object named `dir/` (as the S3 console, s3fs and rclone's --s3-directory-markers
    /// do), so a directory outlives the mount while empty; rmdir then deletes it, which needs --allow-delete
    #[arg(long, help_heading = "Mount options")]
    pub directory_markers: bool,
    /// Most objects a directory rename moves; bigger directories are refused (EXDEV) before anything moves
    #[arg(long, default_value_t = 1000, help_heading = "Mount options")]
    pub max_rename_objects: u64,
    /// Directory buckets: opening an existing file without O_TRUNC appends to it
    #[arg(long, help_heading = "Mount options")]
    pub incremental_upload: bool,
    /// Keep mode, uid, gid, mtime and atime in each object's user metadata (s3fs/rclone names); stat of a
    /// file known only from a listing then costs a HEAD
    #[arg(long, help_heading = "Mount options")]
    pub preserve_metadata: bool,
    /// Stay in the foreground (default: detach once the mount is live)
    #[arg(short, long, help_heading = "Mount options")]
    pub foreground: bool,
    /// Let other users access the mount (needs user_allow_other in /etc/fuse.conf for non-root)
    #[arg(long, help_heading = "Mount options")]
    pub allow_other: bool,
    /// Let root access the mount
    #[arg(long, help_heading = "Mount options")]
    pub allow_root: bool,
    /// Unmount automatically when the daemon exits (needs fusermount3)
    #[arg(long, help_heading = "Mount options")]
    pub auto_unmount: bool,
    /// FUSE worker threads
    #[arg(long, default_value_t = 16, help_heading = "Mount options")]
    pub max_threads: usize,
    /// Files open for writing at once; more fail with EMFILE
    #[arg(long, default_value_t = 64, help_heading = "Mount options")]
    pub max_open_writers: usize,

    // ---- File permissions
    /// Owner of every file and directory (default: the mounting user)
    #[arg(long, help_heading = "File permissions")]
    pub uid: Option<u32>,
    /// Group of every file and directory (default: the mounting user's group)
    #[arg(long, help_heading = "File permissions")]
    pub gid: Option<u32>,
    /// Permission bits of directories, in octal
    #[arg(long, default_value = "0755", value_parser = parse_mode, help_heading = "File permissions")]
    pub dir_mode: u16,
    /// Permission bits of files, in octal
    #[arg(long, default_value = "0644", value_parser = parse_mode, help_heading = "File permissions")]
    pub file_mode: u16,

    // ---- Performance and caching
    /// Size of each ranged GET, in bytes (suffixes K, M, G accepted)
    #[arg(long, default_value = "8M", value_parser = parse_size, help_heading = "Performance and caching")]
    pub read_part_size: u64,
    /// Size of each uploaded part, in bytes (at least 5M)
    #[arg(long, default_value = "8M", value_parser = parse_size, help_heading = "Performance and caching")]
    pub write_part_size: u64,
    /// Sets both --read-part-size and --write-part-size
    #[arg(long, value_parser = parse_size, help_heading = "Performance and caching",
          conflicts_with_all = ["read_part_size", "write_part_size"])]
    pub part_size: Option<u64>,
    /// Most bytes fetched ahead for one sequential reader (default 64M, or as --maximum-throughput-gbps sets).
    /// All readers of the mount together hold at most twice this, each one part at least
    #[arg(long, value_parser = parse_size, help_heading = "Performance and caching")]
    pub max_prefetch: Option<u64>,
    /// Network throughput to aim for, in Gbit/s: sizes each reader's read-ahead (how many part GETs run at
    /// once) and the parts each file uploads at once. Default: the 10 Gbit/s the other defaults are set for
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Performance and caching")]
    pub maximum_throughput_gbps: Option<u64>,
    /// Bytes a lookup reads from the start of a file along with its metadata (one GET instead of a HEAD), so
    /// that opening and reading a small file right after needs no request of its own. 0: lookups are HEADs
    #[arg(long, default_value = "256K", value_parser = parse_size, help_heading = "Performance and caching")]
    pub lookup_prefetch: u64,
    /// Files at least this big are read around the kernel's page cache (direct I/O: one copy less, and a
    /// shard streamed once per epoch does not evict what is worth keeping); smaller ones use the page cache,
    /// kept across opens while the object is unchanged. A size, or "never"
    #[arg(long, default_value = "32M", value_parser = parse_threshold, help_heading = "Performance and caching")]
    pub direct_io_threshold: u64,
    /// Memory for read-ahead and upload buffers across all files: MiB as in Mountpoint (`2048`) or a size
    /// (`2G`). Under pressure read-ahead windows shrink and uploads send one part at a time. Default: a quarter
    /// of the RAM or cgroup limit, at least 256 MiB
    #[arg(long, value_parser = parse_memory_target, help_heading = "Performance and caching")]
    pub memory_target: Option<u64>,
    /// Kernel readahead for the mount in KiB (set on the mount's bdi when running as root)
    #[arg(long, default_value_t = 4096, help_heading = "Performance and caching")]
    pub read_ahead_kb: u32,
    /// How long metadata is trusted: seconds, "minimal" or "indefinite" (default 1, or 60 with --cache)
    #[arg(long, value_parser = parse_ttl, help_heading = "Performance and caching")]
    pub metadata_ttl: Option<Duration>,
    /// How long a missing name is remembered: seconds, "minimal" or "indefinite"
    #[arg(long, value_parser = parse_ttl, help_heading = "Performance and caching")]
    pub negative_metadata_ttl: Option<Duration>,
    /// Local directory for the data cache (object blocks, reused across mounts) and write staging
    #[arg(long, help_heading = "Performance and caching")]
    pub cache: Option<PathBuf>,
    /// Most MiB the data cache may use (it also keeps 5% of the disk free)
    #[arg(long, help_heading = "Performance and caching", requires = "cache")]
    pub max_cache_size: Option<u64>,
    /// Second bucket shared by a fleet of hosts as a cache for small objects
    #[arg(long, help_heading = "Performance and caching")]
    pub cache_xz: Option<String>,
    /// Largest object kept in the --cache-xz bucket
    #[arg(long, default_value = "1M", value_parser = parse_size, help_heading = "Performance and caching",
          requires = "cache_xz")]
    pub cache_xz_max_object_size: u64,
    /// Size of a cached block in KiB
    #[arg(long, default_value_t = 1024, help_heading = "Performance and caching")]
    pub cache_block_size: u64,
    /// Largest file kept locally so that out-of-order writes can be staged (0 disables staging)
    #[arg(long, default_value = "256M", value_parser = parse_size, help_heading = "Performance and caching")]
    pub max_staged_file_size: u64,

    // ---- Logging
    /// Debug logging for expressfs (RUST_LOG overrides)
    #[arg(short, long, help_heading = "Logging")]
    pub debug: bool,
    /// Accepted for mount-s3 command lines: there is no CRT here; the SDK's own logs follow RUST_LOG
    #[arg(long, help_heading = "Logging")]
    pub debug_crt: bool,
    /// Write logs to files in this directory (default: stderr in the foreground, nothing in the background)
    #[arg(short, long, help_heading = "Logging")]
    pub log_directory: Option<PathBuf>,
    /// No logging at all
    #[arg(long, help_heading = "Logging")]
    pub no_log: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464)
    #[arg(long, help_heading = "Logging")]
    pub metrics_addr: Option<std::net::SocketAddr>,

    // ---- Logs and operations (issue 20): kept together so flag additions elsewhere merge cleanly.
    /// Log a metrics summary (requests, bytes, S3 calls, caches) every few seconds while the mount is busy
    #[arg(long, help_heading = "Logging")]
    pub log_metrics: bool,
    /// Seconds between --log-metrics summaries (tests use a short one)
    #[arg(long, hide = true, default_value_t = 5.0, value_parser = parse_seconds)]
    pub log_metrics_interval: f64,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.05)
        .ok_or_else(|| format!("{s:?} is not a number of seconds (at least 0.05)"))
}

impl Args {
    pub fn upload_checksum(&self) -> UploadChecksum {
        match self.upload_checksums.as_str() {
            "crc64nvme" => UploadChecksum::Crc64Nvme,
            "off" => UploadChecksum::Off,
            _ => UploadChecksum::Crc32c,
        }
    }

    /// Checks that the flags make sense together.
    pub fn validate(&self) -> Result<(), String> {
        let uri_prefix = crate::bucket::parse_source(&self.bucket)
            .ok()
            .and_then(|(_, p)| p);
        if self.prefix.is_some() && uri_prefix.is_some() {
            return Err(
                "--prefix cannot be combined with an s3://bucket/prefix/ argument: give the prefix once"
                    .into(),
            );
        }
        if let Some(prefix) = self.prefix.as_ref().or(uri_prefix.as_ref()) {
            if !prefix.is_empty() && !prefix.ends_with('/') {
                return Err(format!("--prefix {prefix:?} must end in '/'"));
            }
            if prefix.starts_with('/') || prefix.contains("//") {
                return Err(format!(
                    "--prefix {prefix:?} must not start with '/' or contain '//'"
                ));
            }
        }
        if self.write_part_size() < 5 * 1024 * 1024 {
            return Err("--write-part-size must be at least 5M (S3's minimum part size)".into());
        }
        if self.read_part_size() < 64 * 1024 {
            return Err("--read-part-size must be at least 64K".into());
        }
        if self.read_only
            && (self.allow_delete
                || self.allow_overwrite
                || self.incremental_upload
                || self.directory_markers)
        {
            return Err("--read-only cannot be combined with --allow-delete, --allow-overwrite, --incremental-upload or --directory-markers".into());
        }
        if self.cache_block_size < 64 || self.cache_block_size > 64 * 1024 {
            return Err("--cache-block-size must be between 64 and 65536 KiB".into());
        }
        if let Some(xz) = &self.cache_xz {
            let xz = xz.strip_prefix("s3://").unwrap_or(xz).trim_end_matches('/');
            let mounted = crate::bucket::parse_source(&self.bucket).map(|(b, _)| b.name);
            if mounted.is_ok_and(|m| m == xz) {
                return Err("--cache-xz must name a different bucket than the one mounted".into());
            }
        }
        if self.cache_xz_max_object_size == 0 || self.cache_xz_max_object_size > 64 * 1024 * 1024 {
            return Err("--cache-xz-max-object-size must be between 1 byte and 64M".into());
        }
        if self.max_threads == 0 {
            return Err("--max-threads must be at least 1".into());
        }
        crate::config::max_attempts(std::env::var("AWS_MAX_ATTEMPTS").ok().as_deref())?;
        let on_descriptor = matches!(
            self.mount_target()?,
            crate::mountpoint::MountTarget::Descriptor(_)
        );
        if self.auto_unmount && !on_descriptor && !(self.allow_other || self.allow_root) {
            // fusermount3 makes an auto_unmount mount, and the FUSE library we use allows it only for a mount
            // others may enter: said here rather than as its own error at mount time.
            return Err("--auto-unmount needs --allow-root (or --allow-other) as well".into());
        }
        if let crate::mountpoint::MountTarget::Descriptor(fd) = self.mount_target()? {
            if self.auto_unmount {
                return Err(format!(
                    "--auto-unmount cannot be used with /dev/fd/{fd}: the caller that mounted the descriptor unmounts it"
                ));
            }
            if self.allow_other || self.allow_root {
                return Err(format!(
                    "--allow-other and --allow-root cannot be used with /dev/fd/{fd}: who may enter is set by the \
                     caller's mount (its allow_other and user_id options)"
                ));
            }
        }
        self.validate_request_options()
    }

    /// The mount point: a directory, or the descriptor `/dev/fd/N` names.
    pub fn mount_target(&self) -> Result<crate::mountpoint::MountTarget, String> {
        crate::mountpoint::MountTarget::parse(&self.mountpoint)
    }

    /// The flags that change requests, checked as far as they can be without knowing the bucket (see
    /// `Args::bucket_name` for the rest). The reasons are the service's, so a command line that S3 would
    /// refuse at the first write is refused before mounting.
    fn validate_request_options(&self) -> Result<(), String> {
        match self.sse.as_deref() {
            None | Some("aws:kms" | "aws:kms:dsse" | "AES256") => {}
            Some(c) if c.eq_ignore_ascii_case("sse-c") || c.eq_ignore_ascii_case("customer") => {
                return Err("--sse: SSE-C (customer-provided keys) is not supported: every read would need the key; use aws:kms or AES256".into());
            }
            Some(other) => {
                return Err(format!(
                    "--sse {other:?}: must be aws:kms, aws:kms:dsse or AES256"
                ));
            }
        }
        if let Some(key) = &self.sse_kms_key_id {
            if !matches!(self.sse.as_deref(), Some("aws:kms" | "aws:kms:dsse")) {
                return Err("--sse-kms-key-id needs --sse aws:kms or --sse aws:kms:dsse".into());
            }
            let parts: Vec<&str> = key.splitn(6, ':').collect();
            let is_key_arn = parts.len() == 6
                && parts[0] == "arn"
                && parts[2] == "kms"
                && parts[5].starts_with("key/");
            if !is_key_arn {
                return Err(format!(
                    "--sse-kms-key-id {key:?}: give the key's full ARN (arn:aws:kms:REGION:ACCOUNT:key/ID)"
                ));
            }
        }
        if let Some(owner) = &self.expected_bucket_owner
            && (owner.len() != 12 || !owner.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(format!(
                "--expected-bucket-owner {owner:?}: an AWS account ID is 12 digits"
            ));
        }
        if let Some(class) = &self.storage_class
            && !aws_sdk_s3::types::StorageClass::values().contains(&class.as_str())
        {
            return Err(format!(
                "--storage-class {class:?}: not a storage class S3 knows ({})",
                aws_sdk_s3::types::StorageClass::values().join(", ")
            ));
        }
        if self.no_sign_request && self.profile.is_some() {
            return Err("--no-sign-request and --profile exclude each other".into());
        }
        if let Some(prefix) = &self.user_agent_prefix
            && (prefix.is_empty() || !prefix.bytes().all(|b| (0x20..0x7f).contains(&b)))
        {
            return Err("--user-agent-prefix must be printable ASCII".into());
        }
        for iface in &self.bind {
            crate::s3::sdk::check_interface(iface).map_err(|e| format!("--bind: {e}"))?;
        }
        if let Some(bundle) = &self.ca_bundle {
            crate::s3::sdk::load_ca_bundle(bundle).map_err(|e| format!("--ca-bundle: {e}"))?;
        }
        Ok(())
    }

    /// Mountpoint's rule: metadata is trusted 1 s, or 60 s when a data cache is configured.
    pub fn metadata_ttl(&self) -> Duration {
        self.metadata_ttl.unwrap_or(if self.cache.is_some() {
            Duration::from_secs(60)
        } else {
            Duration::from_secs(1)
        })
    }

    pub fn read_part_size(&self) -> u64 {
        self.part_size.unwrap_or(self.read_part_size)
    }

    pub fn write_part_size(&self) -> u64 {
        self.part_size.unwrap_or(self.write_part_size)
    }
}

fn parse_mode(s: &str) -> Result<u16, String> {
    let v = u16::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|_| format!("{s:?} is not an octal mode like 0644"))?;
    if v > 0o7777 {
        return Err(format!("{s:?} is not a permission mode"));
    }
    Ok(v)
}

/// Bytes with an optional K/M/G (binary) suffix.
/// `--memory-target`: a bare number is MiB (Mountpoint's unit), otherwise a size like `2G`; at least 64 MiB.
pub fn parse_memory_target(s: &str) -> Result<u64, String> {
    let bytes = match s.trim().parse::<u64>() {
        Ok(mib) => mib.checked_mul(1 << 20).ok_or("too large")?,
        Err(_) => parse_size(s)?,
    };
    if bytes < 64 << 20 {
        return Err(format!(
            "{s:?} is below the 64 MiB minimum (a bare number means MiB)"
        ));
    }
    Ok(bytes)
}

/// A size, or "never" (u64::MAX).
fn parse_threshold(s: &str) -> Result<u64, String> {
    if s.trim().eq_ignore_ascii_case("never") {
        Ok(u64::MAX)
    } else {
        parse_size(s)
    }
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mult = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("{s:?}: unknown size suffix (use K, M or G)")),
            };
            (&t[..i], mult)
        }
        _ => (t, 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 8388608 or 8M"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn parse_ttl(s: &str) -> Result<Duration, String> {
    // What "indefinite" means, and the most any number of seconds means: a deadline further out would
    // overflow the clock's arithmetic.
    const INDEFINITE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    match s {
        "minimal" => Ok(Duration::ZERO),
        "indefinite" => Ok(INDEFINITE),
        _ => s
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .map(|v| Duration::from_secs_f64(v.min(INDEFINITE.as_secs_f64())))
            .ok_or_else(|| {
                format!("{s:?} is not a number of seconds, \"minimal\" or \"indefinite\"")
            }),
    }
}

/// Options that mount(8)/fstab pass but that mean nothing to us.
const IGNORED_MOUNT_OPTIONS: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "nofail",
    "_netdev",
    "user",
    "users",
    "nouser",
    "nousers",
    "owner",
    "group",
    "rw",
    "dev",
    "suid",
    "exec",
    "noexec",
    "nodev",
    "nosuid",
    "atime",
    "noatime",
    "relatime",
    "strictatime",
    "lazytime",
    "nodiratime",
    "diratime",
    "async",
    "nosymfollow",
    "default_permissions",
    "comment",
];

/// Expands `-o a,b=c` into `--a --b c` (underscores become dashes), the form fstab and mount(8) use.
pub fn expand_mount_options(argv: Vec<String>) -> Result<Vec<String>, String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut iter = argv.into_iter();
    while let Some(arg) = iter.next() {
        let list = if arg == "-o" {
            iter.next()
                .ok_or("-o needs a comma-separated list of options")?
        } else if let Some(rest) = arg.strip_prefix("-o").filter(|r| !r.is_empty()) {
            rest.to_string()
        } else {
            out.push(arg);
            continue;
        };
        for opt in split_mount_options(&list) {
            let opt = opt.as_str();
            let (name, value) = opt
                .split_once('=')
                .map_or((opt, None), |(n, v)| (n, Some(v)));
            if IGNORED_MOUNT_OPTIONS.contains(&name) || name.starts_with("x-systemd.") {
                continue;
            }
            let flag = match name {
                "ro" => "read-only".to_string(),
                other => other.replace('_', "-"),
            };
            out.push(format!("--{flag}"));
            if let Some(v) = value {
                out.push(v.to_string());
            }
        }
    }
    Ok(out)
}

/// Splits an `-o` list at commas; a backslash makes the next character (`,`, `\` or `"`) literal, as in
/// mount-s3's fstab (`user-agent-prefix=foo\,bar`).
fn split_mount_options(list: &str) -> Vec<String> {
    let mut options = vec![String::new()];
    let mut chars = list.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => options.last_mut().unwrap().extend(chars.next()),
            ',' => options.push(String::new()),
            c => options.last_mut().unwrap().push(c),
        }
    }
    options.retain(|o| !o.is_empty());
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        let argv: Vec<String> = std::iter::once("expressfs")
            .chain(args.iter().copied())
            .map(String::from)
            .collect();
        let a = Args::try_parse_from(expand_mount_options(argv)?).map_err(|e| e.to_string())?;
        a.validate()?;
        Ok(a)
    }

    #[test]
    fn a_dev_fd_mount_point_is_a_descriptor_the_caller_mounted_and_unmounts() {
        use crate::mountpoint::MountTarget;
        let a = parse(&["b--use1-az4--x-s3", "/dev/fd/7", "--read-only"]).unwrap();
        assert_eq!(a.mount_target(), Ok(MountTarget::Descriptor(7)));
        for (flag, says) in [
            ("--auto-unmount", "the caller that mounted"),
            ("--allow-other", "caller's mount"),
            ("--allow-root", "caller's mount"),
        ] {
            let e = parse(&["b--use1-az4--x-s3", "/dev/fd/7", flag]).unwrap_err();
            assert!(e.contains(says), "{flag}: {e}");
        }
        let e = parse(&["b--use1-az4--x-s3", "/dev/fd/seven"]).unwrap_err();
        assert!(e.contains("/dev/fd/N"), "{e}");
        // Elsewhere those flags stand; --auto-unmount with one of the two.
        let e = parse(&["b--use1-az4--x-s3", "/mnt", "--auto-unmount"]).unwrap_err();
        assert!(e.contains("--allow-root"), "{e}");
        assert!(
            parse(&[
                "b--use1-az4--x-s3",
                "/mnt",
                "--allow-root",
                "--auto-unmount"
            ])
            .is_ok()
        );
        assert!(
            parse(&[
                "b--use1-az4--x-s3",
                "/mnt",
                "--allow-other",
                "--auto-unmount"
            ])
            .is_ok()
        );
    }

    #[test]
    fn sizes_modes_and_ttls() {
        assert_eq!(parse_size("8M").unwrap(), 8 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("8X").is_err());
        assert_eq!(parse_threshold("never").unwrap(), u64::MAX);
        assert_eq!(parse_threshold("32M").unwrap(), 32 << 20);
        assert_eq!(parse_mode("0640").unwrap(), 0o640);
        assert!(parse_mode("999").is_err());
        assert_eq!(parse_ttl("minimal").unwrap(), Duration::ZERO);
        assert_eq!(parse_ttl("2.5").unwrap(), Duration::from_millis(2500));
        // A number past "indefinite" means "indefinite", not an overflow later.
        assert_eq!(parse_ttl("1e19").unwrap(), parse_ttl("indefinite").unwrap());
        assert_eq!(parse_ttl("2e19").unwrap(), parse_ttl("indefinite").unwrap());
        assert!(parse_ttl("-1").is_err());
        assert_eq!(parse_memory_target("2048").unwrap(), 2048 << 20);
        assert_eq!(parse_memory_target("1G").unwrap(), 1 << 30);
        assert!(parse_memory_target("10").unwrap_err().contains("64 MiB"));
        assert!(parse_memory_target("lots").is_err());
    }

    #[test]
    fn flags_and_fstab_options() {
        let a = parse(&[
            "b--use1-az4--x-s3",
            "/mnt",
            "-o",
            "ro,allow_other,region=us-west-2,_netdev,x-systemd.automount",
        ])
        .unwrap();
        assert!(a.read_only && a.allow_other);
        // Flags that would be overridden or mean nothing without another are refused, not ignored.
        for args in [
            &["b", "/mnt", "--part-size", "4M", "--write-part-size", "16M"][..],
            &["b", "/mnt", "--part-size", "4M", "--read-part-size", "16M"][..],
            &["b", "/mnt", "--max-cache-size", "100"][..],
            &["b", "/mnt", "--cache-xz-max-object-size", "64K"][..],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
        let one = parse(&["b", "/mnt", "--part-size", "6M"]);
        assert!(one.is_ok(), "{:?}", one.err());
        // What mount(8) passes on from a common fstab line, with nothing for us to do.
        let common = parse(&[
            "b--use1-az4--x-s3",
            "/mnt",
            "-o",
            "rw,noatime,nodiratime,lazytime,owner,nosymfollow,default_permissions,comment=x,_netdev",
        ]);
        assert!(common.is_ok(), "{:?}", common.err());
        let escaped = parse(&[
            "bkt",
            "/mnt",
            "-o",
            r"rw,user-agent-prefix=foo\,bar\\baz,allow-other",
        ])
        .unwrap();
        assert_eq!(escaped.user_agent_prefix.as_deref(), Some(r"foo,bar\baz"));
        assert!(escaped.allow_other);
        assert_eq!(a.region.as_deref(), Some("us-west-2"));
        assert!(
            parse(&["b", "/mnt", "--prefix", "data"])
                .unwrap_err()
                .contains("end in '/'")
        );
        assert!(
            parse(&["b", "/mnt", "--write-part-size", "1M"])
                .unwrap_err()
                .contains("5M")
        );
        assert!(parse(&["b", "/mnt", "--read-only", "--allow-delete"]).is_err());
        // mount-s3's short flags and its `s3://` form.
        let d = parse(&[
            "s3://bkt/p/",
            "/mnt",
            "-d",
            "-l",
            "/var/log/x",
            "--debug-crt",
        ])
        .unwrap();
        assert!(d.debug && d.debug_crt);
        assert_eq!(d.log_directory, Some(PathBuf::from("/var/log/x")));
        assert!(
            parse(&["s3://bkt/p/", "/mnt", "--prefix", "q/"])
                .unwrap_err()
                .contains("give the prefix once")
        );
        let p = parse(&["b", "/mnt", "--part-size", "16M"]).unwrap();
        assert_eq!(
            (p.read_part_size(), p.write_part_size()),
            (16 << 20, 16 << 20)
        );
    }
}

#[cfg(test)]
mod request_option_tests {
    use super::*;

    fn check(flags: &[&str]) -> Result<Args, String> {
        let argv: Vec<String> = ["expressfs", "plain-bucket", "/mnt"]
            .into_iter()
            .chain(flags.iter().copied())
            .map(String::from)
            .collect();
        let a = Args::try_parse_from(expand_mount_options(argv)?).map_err(|e| e.to_string())?;
        a.validate()?;
        Ok(a)
    }

    #[test]
    fn request_options_are_checked_before_mounting() {
        let key = "arn:aws:kms:us-east-1:123456789012:key/k1";
        assert!(check(&["--sse", "aws:kms", "--sse-kms-key-id", key]).is_ok());
        assert!(check(&["--sse", "aws:kms:dsse", "--sse-kms-key-id", key]).is_ok());
        assert!(check(&["--sse", "AES256"]).is_ok());
        for (flags, says) in [
            (&["--sse", "SSE-C"][..], "SSE-C"),
            (&["--sse", "aws:kms:x"][..], "must be aws:kms"),
            (&["--sse-kms-key-id", key][..], "needs --sse aws:kms"),
            (
                &["--sse", "AES256", "--sse-kms-key-id", key][..],
                "needs --sse aws:kms",
            ),
            (
                &["--sse", "aws:kms", "--sse-kms-key-id", "alias/mine"][..],
                "full ARN",
            ),
            (&["--expected-bucket-owner", "12345"][..], "12 digits"),
            (&["--storage-class", "COLD"][..], "STANDARD_IA"),
            (
                &["--no-sign-request", "--profile", "p"][..],
                "exclude each other",
            ),
            (&["--user-agent-prefix", "tab\there"][..], "printable"),
            (
                &["--bind", "nosuchif0"][..],
                "no network interface named \"nosuchif0\"",
            ),
            (
                &["--ca-bundle", "/nonexistent/ca.pem"][..],
                "--ca-bundle: /nonexistent/ca.pem",
            ),
            (&["--maximum-throughput-gbps", "0"][..], "0"),
        ] {
            let e = check(flags).unwrap_err();
            assert!(e.contains(says), "{flags:?}: {e}");
        }
        let a = check(&[
            "--maximum-throughput-gbps",
            "25",
            "--bind",
            "lo",
            "-o",
            "bind=lo",
        ])
        .unwrap();
        assert_eq!(a.maximum_throughput_gbps, Some(25));
        assert_eq!(a.bind.len(), 2);
    }
}
