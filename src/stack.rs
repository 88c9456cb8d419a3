//! The client stack under the file system: the S3 client of the mounted bucket (checked before mounting),
//! the read sources stacked on it (the optional shared `--cache-xz` and disk `--cache` caches), and the
//! uncached source O_DIRECT reads use. The one place that knows which layers exist; each registers its
//! counters with the metrics probes here.

use std::sync::Arc;

use crate::bucket::BucketName;
use crate::cache::BlockCache;
use crate::cache::shared::SharedCache;
use crate::cli::Args;
use crate::fs::{FsConfig, S3Filesystem};
use crate::metrics::{CacheSample, Probes};
use crate::s3::sdk::SdkClient;
use crate::s3::{ClientError, ObjectClient};
use crate::source::{BucketSource, Cached, ReadSource, ReadSources};

/// Connects to the bucket, stacks the caches the flags ask for and builds the file system on top. Errors
/// are sentences for the user.
pub async fn build_stack(
    args: &Args,
    name: &BucketName,
    region: &str,
    config: FsConfig,
    probes: &Probes,
) -> Result<S3Filesystem, String> {
    if args.debug_crt {
        tracing::info!(
            "--debug-crt has no effect: there is no CRT here; the SDK's own logs follow RUST_LOG (e.g. aws_smithy_runtime=debug)"
        );
    }
    let caches = args.cache_config()?;
    let prefix = config.prefix.clone();
    let client = async {
        let client = SdkClient::new(args.client_config(name, region)).await?;
        // A listing proves the session (CreateSession) and read access, not just that the bucket exists. Both
        // checks run at once (one round trip less before the mount appears); the bucket's error is the
        // clearer one, so it is reported first. The listing asks for a whole page: when the root fits in one,
        // it answers the first lookups there.
        let asked = std::time::Instant::now();
        let (bucket, listing) = tokio::join!(
            client.head_bucket(),
            client.list_objects(&prefix, Some("/"), None, 1000)
        );
        bucket?;
        Ok::<_, ClientError>((client, (listing?, asked)))
    };
    let (sdk_client, root_page) = match client.await {
        Ok((c, root_page)) => (Arc::new(c), root_page),
        Err(e) => return Err(explain(&e, &name.name, region, name.is_directory())),
    };
    {
        let sdk = Arc::clone(&sdk_client);
        probes.add(move |s| {
            let recovered = sdk.counters();
            s.body_resumes = recovered.body_resumes;
            s.session_renewals = recovered.session_renewals;
        });
    }
    let bucket_source = BucketSource::shared(sdk_client.clone());
    let mut source = Arc::clone(&bucket_source);
    if let Some(shared) = &caches.shared {
        let xz_name = &shared.bucket;
        let xz_client = async {
            let c = SdkClient::new(args.cache_client_config(xz_name, region)).await?;
            c.head_bucket().await?;
            Ok::<_, ClientError>(c)
        };
        let xz_client: Arc<dyn ObjectClient> = match xz_client.await {
            Ok(c) => Arc::new(c),
            Err(e) => {
                return Err(format!(
                    "--cache-xz: {}",
                    explain(&e, &xz_name.name, region, xz_name.is_directory())
                ));
            }
        };
        let shared = SharedCache::new(xz_client, shared.max_object_size);
        let counters = Arc::clone(&shared.counters);
        probes.add(move |s| s.shared_cache = Some(counters.summary()));
        source = Arc::new(Cached::new(shared, source));
    }
    let source: Arc<dyn ReadSource> = match &caches.disk {
        None => source,
        Some(disk) => match crate::cache::disk::DiskCache::open(&disk.dir, disk.max_bytes) {
            Ok(cache) => {
                let cache = Arc::new(cache);
                let sampled = Arc::clone(&cache);
                probes.add(move |s| {
                    use std::sync::atomic::Ordering::Relaxed;
                    let counters = &sampled.counters;
                    s.cache = Some(CacheSample {
                        hits: counters.hits.load(Relaxed),
                        misses: counters.misses.load(Relaxed),
                        evictions: counters.evictions.load(Relaxed),
                        corrupt: counters.corrupt.load(Relaxed),
                        bytes: sampled.used_bytes(),
                        summary: counters.summary(),
                    });
                });
                Arc::new(Cached::new(BlockCache::new(cache, disk.block_size), source))
            }
            Err(e) => {
                // The directory the user named, not its `blocks` subdirectory.
                let dir = disk.dir.parent().unwrap_or(&disk.dir);
                return Err(format!("cache directory {}: {e}", dir.display()));
            }
        },
    };
    let sources = ReadSources {
        cached: source,
        direct: bucket_source,
    };
    let (page, asked) = root_page;
    Ok(S3Filesystem::new(sdk_client, config)
        .with_read_sources(sources)
        .with_root_page(page, asked))
}

/// Registers the file system's own tables and buffers with the probes.
pub fn probe_filesystem(fs: &Arc<S3Filesystem>, probes: &Probes) {
    let fs = Arc::clone(fs);
    probes.add(move |s| {
        let (handles, writers, inodes) = fs.usage();
        let memory = &fs.config().memory;
        s.open_handles = handles;
        s.open_writers = writers;
        s.inodes = inodes;
        s.buffer_bytes = memory.used();
        s.buffer_peak = memory.peak();
        s.budget_refusals = memory.refused();
        s.read_ahead_shared = fs.read_ahead_shared();
        s.ioctls_refused = crate::metrics::ioctls_refused();
    });
}

/// Explains a failure of the startup checks in terms a user can act on.
fn explain(e: &ClientError, bucket: &str, region: &str, directory: bool) -> String {
    match e {
        ClientError::NoSuchBucket { .. } => {
            format!("bucket {bucket} does not exist (region {region})")
        }
        ClientError::NotFound { .. } => format!("bucket {bucket} does not exist (region {region})"),
        ClientError::AccessDenied { code, message } => {
            let hint = if directory {
                "; directory buckets need the s3express:CreateSession permission on the bucket"
            } else {
                "; check s3:ListBucket and s3:GetObject permissions"
            };
            format!("access denied to bucket {bucket} ({code}: {message}){hint}")
        }
        // A flag combination the endpoint rules or the HTTP client setup refused, before any request.
        ClientError::Service {
            status: 0,
            code,
            message,
        } if code == "InvalidConfiguration" => {
            format!("{message} (bucket {bucket}, region {region})")
        }
        ClientError::NoCredentials(m) => format!(
            "no AWS credentials found ({m}): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, use --profile, or run with an instance role"
        ),
        other => {
            let text = other.to_string();
            // rustls names what it rejected ("invalid peer certificate: UnknownIssuer", "...: Expired");
            // what to do about it is ours to say.
            let hint = if text.contains("invalid peer certificate") {
                "; the endpoint's TLS certificate is not trusted: if it comes from a private CA, give that \
                 CA with --ca-bundle PEM (or AWS_CA_BUNDLE)"
            } else {
                ""
            };
            format!("cannot use bucket {bucket} (region {region}): {text}{hint}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_failures_are_explained_in_user_terms() {
        let missing = ClientError::NoSuchBucket { bucket: "b".into() };
        assert_eq!(
            explain(&missing, "b", "us-east-1", false),
            "bucket b does not exist (region us-east-1)"
        );
        let denied = ClientError::AccessDenied {
            code: "AccessDenied".into(),
            message: "no".into(),
        };
        assert!(
            explain(&denied, "b--use1-az4--x-s3", "us-east-1", true)
                .contains("s3express:CreateSession")
        );
        assert!(explain(&denied, "b", "us-east-1", false).contains("s3:ListBucket"));
        let none = ClientError::NoCredentials("empty chain".into());
        assert!(explain(&none, "b", "us-east-1", false).contains("--profile"));
        let refused = ClientError::Service {
            status: 0,
            code: "InvalidConfiguration".into(),
            message: "A custom endpoint cannot be combined with S3 Accelerate".into(),
        };
        assert_eq!(
            explain(&refused, "b", "us-east-1", false),
            "A custom endpoint cannot be combined with S3 Accelerate (bucket b, region us-east-1)"
        );
        let untrusted = ClientError::Transient {
            code: "ConnectionError".into(),
            message: "dispatch failure: io error: client error (Connect): TLS handshake failed: \
                      invalid peer certificate: UnknownIssuer"
                .into(),
        };
        let said = explain(&untrusted, "b", "us-east-1", false);
        assert!(
            said.contains("UnknownIssuer") && said.contains("--ca-bundle"),
            "{said}"
        );
        let other = ClientError::Malformed("xml".into());
        assert_eq!(
            explain(&other, "b", "eu-west-1", false),
            "cannot use bucket b (region eu-west-1): malformed response: xml"
        );
    }
}
