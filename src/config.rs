//! From flags to the configuration of each layer. The daemon only runs the process; what each flag means for
//! the file system, the S3 clients and the caches is decided here, where unit tests can check it without a
//! mount.

use std::path::PathBuf;

use crate::bucket::{self, BucketName};
use crate::cli::Args;
use crate::fs::FsConfig;
use crate::mountpoint::MountTarget;
use crate::s3::sdk::SdkClientConfig;

/// The local block cache (`--cache`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskCacheConfig {
    /// `DIR/blocks`.
    pub dir: PathBuf,
    /// `--max-cache-size` in bytes; u64::MAX when unset (the cache still keeps 5% of the disk free).
    pub max_bytes: u64,
    /// `--cache-block-size` in bytes.
    pub block_size: u64,
}

/// The bucket a fleet shares as a cache of small objects (`--cache-xz`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedCacheConfig {
    pub bucket: BucketName,
    pub max_object_size: u64,
}

/// Which caches stand between the file system and the bucket.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CacheConfig {
    pub disk: Option<DiskCacheConfig>,
    pub shared: Option<SharedCacheConfig>,
}

/// `--maximum-throughput-gbps`: the default 64 MiB window is what 10 Gbit/s needs; it scales linearly.
const PREFETCH_AT_10_GBPS: u64 = 64 << 20;
/// mount-s3's cap on one reader's window.
const MAX_PREFETCH_WINDOW: u64 = 2 << 30;
/// Attempts per request to the `--cache-xz` bucket: a miss there costs a read of the mounted bucket.
const CACHE_CLIENT_ATTEMPTS: u32 = 2;

impl Args {
    /// The mounted bucket (name, access point ARN or alias, or the bucket of an `s3://` URI), checked against
    /// `--bucket-type` and against the flags a bucket of its kind cannot take, with the service's reasons.
    pub fn bucket_name(&self) -> Result<BucketName, String> {
        let (name, _) = bucket::parse_source(&self.bucket)?;
        let shown = &name.name;
        match self.bucket_type.as_deref() {
            Some("directory") if !name.is_directory() => {
                return Err(format!(
                    "--bucket-type directory: {shown:?} is not a directory bucket name (base--azid--x-s3)"
                ));
            }
            Some("general-purpose") if name.is_directory() => {
                return Err(format!(
                    "--bucket-type general-purpose: {shown:?} is a directory bucket name (it ends in --x-s3)"
                ));
            }
            _ => {}
        }
        let storage_class = self.storage_class.as_deref();
        if name.is_directory() {
            let refusal = if self.transfer_acceleration {
                Some(
                    "--transfer-acceleration: S3 Express One Zone does not support Transfer Acceleration",
                )
            } else if storage_class.is_some_and(|c| c != "EXPRESS_ONEZONE") {
                Some("--storage-class: directory buckets store objects only in EXPRESS_ONEZONE")
            } else if self.requester_pays {
                Some("--requester-pays: directory buckets do not support Requester Pays")
            } else if self.sse.as_deref() == Some("aws:kms:dsse") {
                Some("--sse aws:kms:dsse: directory buckets support only AES256 and aws:kms")
            } else if self.no_sign_request {
                Some(
                    "--no-sign-request: directory buckets take no anonymous requests (each one is signed with a CreateSession session)",
                )
            } else {
                None
            };
            if let Some(reason) = refusal {
                return Err(format!("{reason} (bucket {shown})"));
            }
        } else if storage_class == Some("EXPRESS_ONEZONE") {
            return Err(format!(
                "--storage-class EXPRESS_ONEZONE is only for directory buckets ({shown} is a general purpose bucket)"
            ));
        }
        if name.is_arn() && self.force_path_style {
            return Err(format!(
                "--force-path-style: an access point ARN is always addressed by its own host name ({shown})"
            ));
        }
        Ok(name)
    }

    /// `--prefix`, or the prefix of an `s3://bucket/prefix/` argument (`validate` refuses both at once).
    pub fn mount_prefix(&self) -> String {
        self.prefix
            .clone()
            .or_else(|| bucket::parse_source(&self.bucket).ok().and_then(|(_, p)| p))
            .unwrap_or_default()
    }

    /// `--max-prefetch`, else what `--maximum-throughput-gbps` needs, else 64 MiB.
    pub fn max_prefetch(&self) -> u64 {
        if let Some(bytes) = self.max_prefetch {
            return bytes;
        }
        match self.maximum_throughput_gbps {
            None => 64 << 20,
            Some(gbps) => (gbps.saturating_mul(PREFETCH_AT_10_GBPS) / 10)
                .clamp(2 * self.read_part_size(), MAX_PREFETCH_WINDOW),
        }
    }

    /// Parts one file uploads at once: 4 (what 10 Gbit/s needs), scaled by `--maximum-throughput-gbps`; the
    /// memory target still bounds them.
    pub fn upload_parts_in_flight(&self) -> usize {
        self.maximum_throughput_gbps.map_or(4, |gbps| {
            gbps.saturating_mul(4).div_ceil(10).clamp(4, 64) as usize
        })
    }

    /// `--region`, else the region of an access point ARN or a directory bucket's zone, else
    /// `AWS_REGION`/`AWS_DEFAULT_REGION`, else us-east-1.
    pub fn region(&self, name: &BucketName) -> Result<String, String> {
        if let Some(r) = &self.region {
            return Ok(r.clone());
        }
        if let Some(r) = name.arn_region() {
            return Ok(r.to_string());
        }
        if let Some(zone) = &name.zone {
            return bucket::region_of_zone(zone).map(str::to_string).ok_or_else(|| {
                format!("cannot tell the region of availability zone {zone:?} (bucket {}): pass --region", name.name)
            });
        }
        Ok(std::env::var("AWS_REGION")
            .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|_| "us-east-1".into()))
    }

    /// The SDK client of one bucket: the mounted one, or the `--cache-xz` one (same endpoint, profile and
    /// checksum, so both are reached the same way).
    pub fn client_config(&self, bucket: &BucketName, region: &str) -> SdkClientConfig {
        let mut config = SdkClientConfig::new(bucket.name.clone(), region);
        config.endpoint_url = self.endpoint_url.clone();
        // An ARN names its own host: the endpoint rules refuse path style for it.
        config.force_path_style =
            self.force_path_style || (self.endpoint_url.is_some() && !bucket.is_arn());
        config.profile = self.profile.clone();
        config.is_directory_bucket = bucket.is_directory();
        config.upload_checksum = self.upload_checksum();
        config.sse = self.sse.clone();
        config.sse_kms_key_id = self.sse_kms_key_id.clone();
        config.storage_class = self.storage_class.clone();
        config.infer_content_type = self.infer_content_type;
        config.requester_pays = self.requester_pays;
        config.expected_bucket_owner = self.expected_bucket_owner.clone();
        config.no_sign_request = self.no_sign_request;
        config.dual_stack = self.dual_stack;
        config.transfer_acceleration = self.transfer_acceleration;
        config.ca_bundle = self.ca_bundle.clone();
        config.user_agent_prefix = self.user_agent_prefix.clone();
        config.bind = self.bind.clone();
        // `validate` refused a value that is not a count.
        if let Ok(Some(attempts)) = max_attempts(std::env::var("AWS_MAX_ATTEMPTS").ok().as_deref())
        {
            config.max_attempts = attempts;
        }
        config
    }

    /// The client of the `--cache-xz` bucket: reached as the mounted one, with the same encryption and
    /// expected owner (as in mount-s3), but the object settings meant for the mounted bucket's files (storage
    /// class, content type, requester pays) stay off: a directory bucket would refuse the first two.
    pub fn cache_client_config(&self, bucket: &BucketName, region: &str) -> SdkClientConfig {
        let mut config = self.client_config(bucket, region);
        config.storage_class = None;
        config.infer_content_type = false;
        config.requester_pays = false;
        // A cache that does not answer is a miss, and the mounted bucket has the bytes: two attempts, not a
        // read held up by a whole retry budget for a cache bucket that is down.
        config.max_attempts = config.max_attempts.min(CACHE_CLIENT_ATTEMPTS);
        config
    }

    /// The caches asked for; fails only on a `--cache-xz` that is not a bucket name.
    pub fn cache_config(&self) -> Result<CacheConfig, String> {
        let disk = self.cache.as_ref().map(|dir| DiskCacheConfig {
            dir: dir.join("blocks"),
            max_bytes: self
                .max_cache_size
                .map_or(u64::MAX, |mib| mib.saturating_mul(1024 * 1024)),
            block_size: self.cache_block_size * 1024,
        });
        let shared = match &self.cache_xz {
            None => None,
            Some(xz) => Some(SharedCacheConfig {
                bucket: bucket::parse(xz).map_err(|e| format!("--cache-xz: {e}"))?,
                max_object_size: self.cache_xz_max_object_size,
            }),
        };
        Ok(CacheConfig { disk, shared })
    }

    /// The file system core's settings. Pure: the staging directory is named, not created (see
    /// [`prepare_host`]), and the memory target is resolved but not yet applied to the buffer pool.
    pub fn fs_config(&self) -> FsConfig {
        let mut config = FsConfig::new(
            self.uid.unwrap_or_else(|| nix::unistd::getuid().as_raw()),
            self.gid.unwrap_or_else(|| nix::unistd::getgid().as_raw()),
        );
        config.prefix = self.mount_prefix();
        config.dir_mode = self.dir_mode;
        config.file_mode = self.file_mode;
        config.read_only = self.read_only;
        config.allow_overwrite = self.allow_overwrite;
        config.allow_delete = self.allow_delete;
        config.directory_markers = self.directory_markers;
        config.incremental_upload = self.incremental_upload;
        config.preserve_metadata = self.preserve_metadata;
        config.max_rename_objects = self.max_rename_objects;
        config.read_part_size = self.read_part_size();
        config.write_part_size = self.write_part_size();
        config.upload_parts_in_flight = self.upload_parts_in_flight();
        config.max_prefetch = self.max_prefetch();
        config.lookup_prefetch = self.lookup_prefetch;
        config.direct_io_threshold = self.direct_io_threshold;
        config.max_writers = self.max_open_writers;
        config.memory = crate::memory::MemoryBudget::new(self.memory_target());
        config.metadata_ttl = self.metadata_ttl();
        config.negative_metadata_ttl = self.negative_metadata_ttl.unwrap_or(config.metadata_ttl);
        config.staging_limit = self.max_staged_file_size;
        config.staging_dir = if self.max_staged_file_size == 0 {
            None
        } else {
            Some(
                self.cache
                    .as_ref()
                    .map_or_else(std::env::temp_dir, |c| c.join("staging")),
            )
        };
        config
    }

    /// `--memory-target`, else a quarter of the RAM or cgroup limit.
    pub fn memory_target(&self) -> u64 {
        self.memory_target
            .unwrap_or_else(crate::memory::default_target)
    }

    /// The source shown by `mount` and `df`. The root mount path ignores the subtype (the type is plain
    /// "fuse"), so the source names us and the bucket.
    pub fn fs_name(&self, bucket: &BucketName) -> String {
        match self.mount_prefix().as_str() {
            "" => format!("expressfs:{}", bucket.name),
            prefix => format!("expressfs:{}/{}", bucket.name, prefix.trim_end_matches('/')),
        }
    }

    pub fn fuse_options(&self, bucket: &BucketName) -> crate::fuse::FuseOptions {
        crate::fuse::FuseOptions {
            // `validate` refused a /dev/fd/ path that names no descriptor.
            target: self
                .mount_target()
                .unwrap_or_else(|_| MountTarget::Directory(self.mountpoint.clone())),
            fs_name: self.fs_name(bucket),
            read_only: self.read_only,
            allow_other: self.allow_other,
            allow_root: self.allow_root,
            auto_unmount: self.auto_unmount,
            threads: self.max_threads,
        }
    }
}

/// `AWS_MAX_ATTEMPTS`, as the AWS CLI and mount-s3 read it: attempts per request, the first included (the
/// default, 10, is the SDK client's). Empty or unset: None.
pub fn max_attempts(env: Option<&str>) -> Result<Option<u32>, String> {
    match env.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => match v.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(Some(n)),
            _ => Err(format!(
                "AWS_MAX_ATTEMPTS={v:?}: must be a whole number of attempts, at least 1"
            )),
        },
    }
}

/// The process-wide effects of a configuration: the buffer pool follows the memory target, glibc returns
/// freed buffers at once under a tight one, and the staging directory exists. Returns whether the prompt
/// release is on (for the startup log).
pub fn prepare_host(config: &FsConfig) -> Result<bool, String> {
    let target = config.memory.limit();
    crate::buffers::limit_to(target);
    let prompt_release = crate::memory::return_freed_buffers_promptly_if_tight(target);
    if let Some(dir) = &config.staging_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("staging directory {}: {e}", dir.display()))?;
    }
    Ok(prompt_release)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::*;
    use crate::cli::expand_mount_options;
    use crate::s3::UploadChecksum;

    fn args(flags: &[&str]) -> Args {
        let argv: Vec<String> = ["expressfs", "b--use1-az4--x-s3", "/mnt"]
            .into_iter()
            .chain(flags.iter().copied())
            .map(String::from)
            .collect();
        let a = Args::try_parse_from(expand_mount_options(argv).unwrap()).unwrap();
        a.validate().unwrap();
        a
    }

    fn args_for(bucket: &str, flags: &[&str]) -> Args {
        let argv: Vec<String> = ["expressfs", bucket, "/mnt"]
            .into_iter()
            .chain(flags.iter().copied())
            .map(String::from)
            .collect();
        let a = Args::try_parse_from(expand_mount_options(argv).unwrap()).unwrap();
        a.validate().unwrap();
        a
    }

    fn directory_bucket() -> BucketName {
        bucket::parse("b--use1-az4--x-s3").unwrap()
    }

    #[test]
    fn fs_defaults_are_the_documented_ones() {
        let c = args(&[]).fs_config();
        assert_eq!(c.uid, nix::unistd::getuid().as_raw());
        assert_eq!(c.gid, nix::unistd::getgid().as_raw());
        assert_eq!(c.prefix, "");
        assert_eq!((c.dir_mode, c.file_mode), (0o755, 0o644));
        assert!(!c.read_only && !c.allow_overwrite && !c.allow_delete && !c.incremental_upload);
        assert_eq!((c.read_part_size, c.write_part_size), (8 << 20, 8 << 20));
        assert_eq!(c.max_prefetch, 64 << 20);
        assert_eq!(c.lookup_prefetch, 256 << 10);
        assert_eq!(c.direct_io_threshold, 32 << 20);
        assert_eq!(c.max_writers, 64);
        assert_eq!(c.upload_parts_in_flight, 4);
        assert_eq!(c.memory.limit(), crate::memory::default_target());
        assert!(c.memory.limit() >= 256 << 20);
        assert_eq!(c.metadata_ttl, Duration::from_secs(1));
        assert_eq!(c.negative_metadata_ttl, Duration::from_secs(1));
        assert_eq!(c.staging_limit, 256 << 20);
        assert_eq!(c.staging_dir, Some(std::env::temp_dir()));
        assert_eq!(c.max_rename_objects, 1000);
    }

    #[test]
    fn every_fs_flag_lands_in_the_fs_config() {
        let c = args(&[
            "--uid=7",
            "--gid=8",
            "--prefix=data/",
            "--dir-mode=0700",
            "--file-mode=0600",
            "--allow-overwrite",
            "--allow-delete",
            "--incremental-upload",
            "--read-part-size=1M",
            "--write-part-size=6M",
            "--max-prefetch=2M",
            "--lookup-prefetch=0",
            "--direct-io-threshold=never",
            "--max-open-writers=3",
            "--memory-target=512",
            "--metadata-ttl=5",
            "--negative-metadata-ttl=minimal",
            "--cache=/var/cache/x",
            "--max-staged-file-size=1G",
            "--max-rename-objects=7",
        ])
        .fs_config();
        assert_eq!((c.uid, c.gid), (7, 8));
        assert_eq!(c.prefix, "data/");
        assert_eq!((c.dir_mode, c.file_mode), (0o700, 0o600));
        assert!(!c.read_only && c.allow_overwrite && c.allow_delete && c.incremental_upload);
        assert_eq!((c.read_part_size, c.write_part_size), (1 << 20, 6 << 20));
        assert_eq!(c.max_prefetch, 2 << 20);
        assert_eq!(c.lookup_prefetch, 0);
        assert_eq!(c.direct_io_threshold, u64::MAX);
        assert_eq!(c.max_writers, 3);
        assert_eq!(c.memory.limit(), 512 << 20);
        assert_eq!(c.metadata_ttl, Duration::from_secs(5));
        assert_eq!(c.negative_metadata_ttl, Duration::ZERO);
        assert_eq!(c.staging_limit, 1 << 30);
        assert_eq!(c.staging_dir, Some(PathBuf::from("/var/cache/x/staging")));
        assert_eq!(c.max_rename_objects, 7);

        // fstab spelling.
        let o = args(&["-o", "max-rename-objects=20,allow_delete"]).fs_config();
        assert_eq!(o.max_rename_objects, 20);
        assert!(o.allow_delete);
        assert!(!o.preserve_metadata);
        assert!(!o.directory_markers);
        assert!(
            args(&["-o", "directory-markers"])
                .fs_config()
                .directory_markers
        );
        assert!(
            args(&["-o", "preserve-metadata"])
                .fs_config()
                .preserve_metadata
        );
        assert!(args(&["--preserve-metadata"]).fs_config().preserve_metadata);

        let ro = args(&["-o", "ro", "--part-size=16M"]).fs_config();
        assert!(ro.read_only);
        assert_eq!(
            (ro.read_part_size, ro.write_part_size),
            (16 << 20, 16 << 20)
        );
    }

    #[test]
    fn ttls_follow_the_cache_and_zero_staging_disables_it() {
        let cached = args(&["--cache=/c"]).fs_config();
        assert_eq!(cached.metadata_ttl, Duration::from_secs(60));
        // The negative TTL follows the metadata TTL unless given.
        assert_eq!(cached.negative_metadata_ttl, Duration::from_secs(60));
        let indefinite = args(&["--metadata-ttl=indefinite"]).fs_config();
        assert!(indefinite.metadata_ttl > Duration::from_secs(3600 * 24 * 365));
        assert_eq!(indefinite.negative_metadata_ttl, indefinite.metadata_ttl);
        assert_eq!(
            args(&["--max-staged-file-size=0"]).fs_config().staging_dir,
            None
        );
    }

    #[test]
    fn client_config_defaults_and_flags() {
        let b = directory_bucket();
        let c = args(&[]).client_config(&b, "us-east-1");
        assert_eq!(c.bucket, "b--use1-az4--x-s3");
        assert_eq!(c.region, "us-east-1");
        assert!(c.is_directory_bucket);
        assert_eq!(
            (c.endpoint_url, c.profile, c.force_path_style),
            (None, None, false)
        );
        assert_eq!(c.upload_checksum, UploadChecksum::Crc32c);

        let a = args(&[
            "--endpoint-url=http://127.0.0.1:9000",
            "--profile=p",
            "--upload-checksums=crc64nvme",
        ]);
        let c = a.client_config(&b, "eu-west-1");
        assert_eq!(c.endpoint_url.as_deref(), Some("http://127.0.0.1:9000"));
        assert!(c.force_path_style, "an endpoint implies path style");
        assert_eq!(c.profile.as_deref(), Some("p"));
        assert_eq!(c.region, "eu-west-1");
        assert_eq!(c.upload_checksum, UploadChecksum::Crc64Nvme);

        let general = bucket::parse("plain-bucket").unwrap();
        let c = args(&["--force-path-style", "--upload-checksums=off"])
            .client_config(&general, "us-east-1");
        assert!(c.force_path_style && !c.is_directory_bucket);
        assert_eq!(c.upload_checksum, UploadChecksum::Off);
    }

    #[test]
    fn mount_s3_request_flags_land_in_the_client_config() {
        let general = bucket::parse("plain-bucket").unwrap();
        let c = args(&[]).client_config(&general, "us-east-1");
        assert_eq!(
            (c.sse, c.sse_kms_key_id, c.storage_class),
            (None, None, None)
        );
        assert!(!c.infer_content_type && !c.requester_pays && !c.no_sign_request);
        assert!(!c.dual_stack && !c.transfer_acceleration);
        assert_eq!((c.expected_bucket_owner, c.user_agent_prefix), (None, None));
        assert!(c.bind.is_empty());
        // --ca-bundle falls back to AWS_CA_BUNDLE, as in mount-s3 and the AWS CLI.
        assert_eq!(
            c.ca_bundle,
            std::env::var_os("AWS_CA_BUNDLE").map(PathBuf::from)
        );

        let key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab";
        let c = args(&[
            "--sse=aws:kms",
            &format!("--sse-kms-key-id={key}"),
            "--storage-class=STANDARD_IA",
            "--infer-content-type",
            "--requester-pays",
            "--expected-bucket-owner=123456789012",
            "--no-sign-request",
            "--dual-stack",
            "--ca-bundle=/etc/ssl/certs/ca-certificates.crt",
            "--user-agent-prefix=team-a/1.0",
            "--bind=lo",
            "--bind=lo",
        ])
        .client_config(&general, "us-east-1");
        assert_eq!(c.sse.as_deref(), Some("aws:kms"));
        assert_eq!(c.sse_kms_key_id.as_deref(), Some(key));
        assert_eq!(c.storage_class.as_deref(), Some("STANDARD_IA"));
        assert!(c.infer_content_type && c.requester_pays && c.no_sign_request && c.dual_stack);
        assert_eq!(c.expected_bucket_owner.as_deref(), Some("123456789012"));
        assert_eq!(
            c.ca_bundle,
            Some(PathBuf::from("/etc/ssl/certs/ca-certificates.crt"))
        );
        assert_eq!(c.user_agent_prefix.as_deref(), Some("team-a/1.0"));
        assert_eq!(c.bind, vec!["lo".to_string(), "lo".to_string()]);
        let cache = args(&[
            "--sse=aws:kms",
            "--storage-class=STANDARD_IA",
            "--infer-content-type",
            "--requester-pays",
            "--expected-bucket-owner=123456789012",
        ])
        .cache_client_config(&directory_bucket(), "us-east-1");
        assert_eq!(cache.sse.as_deref(), Some("aws:kms"));
        assert_eq!(cache.expected_bucket_owner.as_deref(), Some("123456789012"));
        assert_eq!(cache.storage_class, None);
        assert!(!cache.infer_content_type && !cache.requester_pays);
        assert_eq!(
            cache.max_attempts, CACHE_CLIENT_ATTEMPTS,
            "a cache gives up early"
        );
        let c = args(&["--transfer-acceleration"]).client_config(&general, "us-east-1");
        assert!(c.transfer_acceleration);

        // fstab spelling of the same flags.
        let c = args(&[
            "-o",
            "sse=AES256,storage_class=GLACIER_IR,infer_content_type,requester_pays,expected_bucket_owner=111122223333,user_agent_prefix=fstab,bind=lo",
        ])
        .client_config(&general, "us-east-1");
        assert_eq!(c.sse.as_deref(), Some("AES256"));
        assert_eq!(c.storage_class.as_deref(), Some("GLACIER_IR"));
        assert!(c.infer_content_type && c.requester_pays);
        assert_eq!(c.expected_bucket_owner.as_deref(), Some("111122223333"));
        assert_eq!(c.user_agent_prefix.as_deref(), Some("fstab"));
        assert_eq!(c.bind, vec!["lo".to_string()]);
    }

    #[test]
    fn uris_arns_and_bucket_types() {
        let a = args_for("s3://data--use1-az4--x-s3/train/", &[]);
        let name = a.bucket_name().unwrap();
        assert_eq!(name.name, "data--use1-az4--x-s3");
        assert_eq!(a.fs_config().prefix, "train/");
        assert_eq!(a.fs_name(&name), "expressfs:data--use1-az4--x-s3/train");
        let arn = "arn:aws:s3:eu-west-1:123456789012:accesspoint/my-ap";
        let a = args_for(arn, &["--endpoint-url=http://127.0.0.1:9000"]);
        let name = a.bucket_name().unwrap();
        assert!(name.is_arn());
        assert_eq!(a.region(&name).unwrap(), "eu-west-1");
        let c = a.client_config(&name, "eu-west-1");
        assert!(!c.force_path_style, "an ARN is never path style");
        assert_eq!(c.bucket, arn);
        assert!(
            args_for(arn, &["--force-path-style"])
                .bucket_name()
                .unwrap_err()
                .contains("ARN")
        );
        assert!(
            args_for("plain-bucket", &["--bucket-type=directory"])
                .bucket_name()
                .unwrap_err()
                .contains("not a directory bucket")
        );
        assert!(
            args(&["--bucket-type=general-purpose"])
                .bucket_name()
                .unwrap_err()
                .contains("is a directory bucket")
        );
        assert!(args(&["--bucket-type=directory"]).bucket_name().is_ok());
        assert!(
            args_for("plain-bucket", &["--bucket-type=general-purpose"])
                .bucket_name()
                .is_ok()
        );
    }

    #[test]
    fn flags_a_bucket_kind_cannot_take_are_refused_with_the_reason() {
        for (flags, says) in [
            (&["--transfer-acceleration"][..], "Transfer Acceleration"),
            (&["--storage-class=STANDARD"][..], "EXPRESS_ONEZONE"),
            (&["--requester-pays"][..], "Requester Pays"),
            (&["--sse=aws:kms:dsse"][..], "AES256 and aws:kms"),
            (&["--no-sign-request"][..], "anonymous"),
        ] {
            let e = args(flags).bucket_name().unwrap_err();
            assert!(
                e.contains(says) && e.contains("b--use1-az4--x-s3"),
                "{flags:?}: {e}"
            );
        }
        assert!(
            args(&["--storage-class=EXPRESS_ONEZONE", "--sse=aws:kms"])
                .bucket_name()
                .is_ok()
        );
        let e = args_for("plain-bucket", &["--storage-class=EXPRESS_ONEZONE"])
            .bucket_name()
            .unwrap_err();
        assert!(e.contains("only for directory buckets"), "{e}");
        assert!(
            args_for("plain-bucket", &["--requester-pays", "--sse=aws:kms:dsse"])
                .bucket_name()
                .is_ok()
        );
    }

    #[test]
    fn throughput_sizes_the_read_ahead_unless_given() {
        assert_eq!(args(&[]).fs_config().max_prefetch, 64 << 20);
        let at = |gbps: &str| {
            args(&[&format!("--maximum-throughput-gbps={gbps}")])
                .fs_config()
                .max_prefetch
        };
        assert_eq!(at("10"), 64 << 20);
        assert_eq!(at("100"), 640 << 20);
        assert_eq!(at("1"), 16 << 20, "at least two read parts");
        assert_eq!(at("25"), 160 << 20);
        assert_eq!(at("1000"), 2 << 30, "mount-s3's window cap");
        let parts = |flags: &[&str]| args(flags).fs_config().upload_parts_in_flight;
        assert_eq!(parts(&[]), 4);
        assert_eq!(
            parts(&["--maximum-throughput-gbps=5"]),
            4,
            "never below the default"
        );
        assert_eq!(parts(&["--maximum-throughput-gbps=25"]), 10);
        assert_eq!(parts(&["--maximum-throughput-gbps=100"]), 40);
        assert_eq!(parts(&["--maximum-throughput-gbps=400"]), 64);
        let explicit = args(&["--maximum-throughput-gbps=100", "--max-prefetch=8M"]);
        assert_eq!(explicit.fs_config().max_prefetch, 8 << 20);
    }

    #[test]
    fn region_comes_from_the_flag_then_the_zone() {
        let b = directory_bucket();
        assert_eq!(args(&[]).region(&b).unwrap(), "us-east-1");
        assert_eq!(
            args(&["--region=us-west-2"]).region(&b).unwrap(),
            "us-west-2"
        );
        let unknown = BucketName {
            name: "b--zz9-az1--x-s3".into(),
            zone: Some("zz9-az1".into()),
        };
        assert!(args(&[]).region(&unknown).unwrap_err().contains("--region"));
    }

    #[test]
    fn cache_config_defaults_and_flags() {
        assert_eq!(args(&[]).cache_config().unwrap(), CacheConfig::default());
        let c = args(&["--cache=/c"]).cache_config().unwrap();
        assert_eq!(
            c.disk,
            Some(DiskCacheConfig {
                dir: PathBuf::from("/c/blocks"),
                max_bytes: u64::MAX,
                block_size: 1024 * 1024,
            })
        );
        assert_eq!(c.shared, None);
        let c = args(&[
            "--cache=/c",
            "--max-cache-size=100",
            "--cache-block-size=128",
            "--cache-xz=s3://shared--use1-az4--x-s3",
            "--cache-xz-max-object-size=64K",
        ])
        .cache_config()
        .unwrap();
        let disk = c.disk.unwrap();
        assert_eq!((disk.max_bytes, disk.block_size), (100 << 20, 128 << 10));
        let shared = c.shared.unwrap();
        assert_eq!(shared.bucket.name, "shared--use1-az4--x-s3");
        assert!(shared.bucket.is_directory());
        assert_eq!(shared.max_object_size, 64 << 10);
        assert_eq!(
            args(&["--cache-xz=cache-bucket"])
                .cache_config()
                .unwrap()
                .shared
                .unwrap()
                .max_object_size,
            1 << 20
        );
        assert!(
            args(&["--cache-xz=Bad_Name"])
                .cache_config()
                .unwrap_err()
                .starts_with("--cache-xz: ")
        );
    }

    #[test]
    fn process_flags_default_as_documented() {
        let a = args(&[]);
        assert_eq!(a.read_ahead_kb, 4096);
        assert!(!a.foreground && !a.debug && !a.no_log);
        assert_eq!((a.log_directory.as_ref(), a.metrics_addr), (None, None));
        let a = args(&[
            "-f",
            "--debug",
            "--log-directory=/var/log/x",
            "--metrics-addr=127.0.0.1:9464",
            "--read-ahead-kb=1024",
        ]);
        assert!(a.foreground && a.debug);
        assert_eq!(a.log_directory, Some(PathBuf::from("/var/log/x")));
        assert_eq!(a.metrics_addr, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(a.read_ahead_kb, 1024);
    }

    #[test]
    fn aws_max_attempts_counts_attempts_or_is_refused() {
        assert_eq!(max_attempts(None), Ok(None));
        assert_eq!(max_attempts(Some("")), Ok(None));
        assert_eq!(max_attempts(Some("3")), Ok(Some(3)));
        assert_eq!(max_attempts(Some(" 1 ")), Ok(Some(1)));
        for bad in ["0", "-2", "ten", "2.5"] {
            let e = max_attempts(Some(bad)).unwrap_err();
            assert!(e.contains("AWS_MAX_ATTEMPTS"), "{bad}: {e}");
        }
    }

    #[test]
    fn fuse_options_name_the_bucket_and_prefix() {
        let b = directory_bucket();
        let o = args(&[]).fuse_options(&b);
        assert_eq!(o.fs_name, "expressfs:b--use1-az4--x-s3");
        assert_eq!(o.target, MountTarget::Directory(PathBuf::from("/mnt")));
        assert_eq!(o.threads, 16);
        assert!(!o.read_only && !o.allow_other && !o.allow_root && !o.auto_unmount);
        let o = args(&[
            "--prefix=a/b/",
            "--read-only",
            "--allow-other",
            "--allow-root",
            "--auto-unmount",
            "--max-threads=2",
        ])
        .fuse_options(&b);
        assert_eq!(o.fs_name, "expressfs:b--use1-az4--x-s3/a/b");
        assert!(o.read_only && o.allow_other && o.allow_root && o.auto_unmount);
        assert_eq!(o.threads, 2);
    }
}
