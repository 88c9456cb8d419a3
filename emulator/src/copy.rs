//! Server-side copies: CopyObject and UploadPartCopy. Neither moves object bytes: the copy (or the part) is
//! made of slices of the source's blobs, which are never modified. UploadPartCopy reads the copied range
//! once, from disk in 1 MiB pieces, only to compute what the service returns for it (the part's MD5 ETag on
//! general-purpose buckets, a checksum when the upload asked for one).
//!
//! Service rules followed here, from the API reference:
//! - CopyObject (https://docs.aws.amazon.com/AmazonS3/latest/API/API_CopyObject.html):
//!   `x-amz-metadata-directive` COPY (default) or REPLACE; copies between both bucket kinds; on directory
//!   buckets the request is signed with IAM credentials, not CreateSession ones (the SDKs do so);
//!   destination `If-Match` / `If-None-Match` (412, 409 ConditionalRequestConflict); source
//!   `x-amz-copy-source-if-*`; a source of at most 5 GB. Copying an object onto itself without changing its
//!   metadata is refused (400 InvalidRequest).
//! - UploadPartCopy (https://docs.aws.amazon.com/AmazonS3/latest/API/API_UploadPartCopy.html):
//!   `x-amz-copy-source-range: bytes=first-last`, "You can copy a range only if the source object is greater
//!   than 5 MB" (else 400 InvalidRequest "The specified copy source is not supported as a byte-range copy
//!   source"); it takes no write conditions (the User Guide's "Enforce conditional writes" page: the
//!   multipart APIs other than CompleteMultipartUpload "don't accept conditional headers").

use std::sync::Arc;
use std::time::SystemTime;

use percent_encoding::percent_decode_str;

use crate::body::{DigestPlan, Received};
use crate::error::S3Error;
use crate::multipart::{MIN_PART_SIZE, check_upload, part_number, store_part, upload_id};
use crate::objects::{MAX_PUT_SIZE, commit, etag_matches, new_etag, truncate_secs, validate_key};
use crate::server::{Answer, Ctx, State, xml_response};
use crate::store::{Object, Part};
use crate::xml::{self, HEADER, NS, el};

/// The largest object CopyObject copies, and the largest part UploadPartCopy makes (5 GiB).
pub const MAX_COPY_SIZE: u64 = MAX_PUT_SIZE;

/// `x-amz-copy-source` (`bucket/key` or `/bucket/key`, URL-encoded, maybe `?versionId=`): the source object.
fn copy_source(state: &Arc<State>, ctx: &Ctx) -> Result<(String, String, Arc<Object>), S3Error> {
    let raw = ctx.header("x-amz-copy-source").unwrap_or("");
    let decoded = percent_decode_str(raw.split('?').next().unwrap_or(""))
        .decode_utf8_lossy()
        .into_owned();
    let (bucket, key) = decoded
        .trim_start_matches('/')
        .split_once('/')
        .filter(|(b, k)| !b.is_empty() && !k.is_empty())
        .ok_or_else(|| {
            S3Error::invalid_argument(
                "Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
            )
        })?;
    let buckets = state.store.buckets();
    let b = buckets.get(bucket).ok_or_else(S3Error::no_such_bucket)?;
    let object = Arc::clone(b.objects.get(key).ok_or_else(S3Error::no_such_key)?);
    Ok((bucket.to_string(), key.to_string(), object))
}

/// `x-amz-copy-source-if-*`. As documented, a true if-match overrides a false if-unmodified-since, and a
/// false if-none-match fails whatever if-modified-since says.
fn check_source_conditions(ctx: &Ctx, src: &Object) -> Result<(), S3Error> {
    let failed = |h: &str| Err(S3Error::precondition_failed(h));
    let date = |h: &str| ctx.header(h).and_then(xml::parse_http_date);
    let modified = truncate_secs(src.last_modified);
    if let Some(v) = ctx.header("x-amz-copy-source-if-match") {
        if !etag_matches(v, &src.etag) {
            return failed("x-amz-copy-source-if-match");
        }
    } else if let Some(since) = date("x-amz-copy-source-if-unmodified-since")
        && modified > since
    {
        return failed("x-amz-copy-source-if-unmodified-since");
    }
    if let Some(v) = ctx.header("x-amz-copy-source-if-none-match") {
        if etag_matches(v, &src.etag) {
            return failed("x-amz-copy-source-if-none-match");
        }
    } else if let Some(since) = date("x-amz-copy-source-if-modified-since")
        && modified <= since
    {
        return failed("x-amz-copy-source-if-modified-since");
    }
    Ok(())
}

pub async fn copy_object(state: &Arc<State>, ctx: &Ctx) -> Answer {
    validate_key(&ctx.key)?;
    let replace = match ctx.header("x-amz-metadata-directive") {
        None => false,
        Some(d) if d.eq_ignore_ascii_case("COPY") => false,
        Some(d) if d.eq_ignore_ascii_case("REPLACE") => true,
        Some(_) => return Err(S3Error::invalid_argument("Unknown metadata directive.")),
    };
    let meta = if replace {
        Some(crate::meta::from_request(&ctx.headers)?)
    } else {
        None
    };
    let (src_bucket, src_key, src) = copy_source(state, ctx)?;
    check_source_conditions(ctx, &src)?;
    if src_bucket == ctx.bucket && src_key == ctx.key && !replace {
        return Err(S3Error::invalid_request(
            "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata, storage class, website redirect location or encryption attributes.",
        ));
    }
    if src.size > MAX_COPY_SIZE {
        return Err(S3Error::invalid_request(format!(
            "The specified copy source is larger than the maximum allowable size for a copy source: {MAX_COPY_SIZE}"
        )));
    }
    let directory = state
        .store
        .buckets()
        .get(&ctx.bucket)
        .ok_or_else(S3Error::no_such_bucket)?
        .directory;
    // Same bytes, so the same MD5 ETag on general-purpose buckets; directory buckets make a new opaque one.
    let etag = if directory {
        new_etag(true, None)
    } else {
        src.etag.clone()
    };
    let (content_type, meta) = match meta {
        Some(meta) => (
            ctx.header("content-type")
                .unwrap_or("binary/octet-stream")
                .to_string(),
            meta,
        ),
        None => (src.content_type.clone(), src.meta.clone()),
    };
    let object = Object {
        data: src.data.clone(),
        size: src.size,
        etag: etag.clone(),
        last_modified: SystemTime::now(),
        content_type,
        checksum: src.checksum.clone(),
        parts: 1,
        meta,
    };
    let modified = object.last_modified;
    // The destination's If-Match / If-None-Match are checked here, under the lock that swaps the copy in.
    commit(state, ctx, object)?;
    let mut out = format!("{HEADER}<CopyObjectResult xmlns=\"{NS}\">");
    el(&mut out, "ETag", &etag);
    el(&mut out, "LastModified", &xml::iso8601(modified));
    out.push_str("</CopyObjectResult>");
    Ok(xml_response(out))
}

/// `bytes=first-last` of an UploadPartCopy, as `(start, len)`.
fn copy_range(value: &str, size: u64) -> Result<(u64, u64), S3Error> {
    let malformed = || {
        S3Error::invalid_argument(
            "The x-amz-copy-source-range value must be of the form bytes=first-last where first and last are the zero-based offsets of the first and last bytes to copy",
        )
    };
    let (first, last) = value
        .trim()
        .strip_prefix("bytes=")
        .and_then(|r| r.split_once('-'))
        .ok_or_else(malformed)?;
    let first: u64 = first.parse().map_err(|_| malformed())?;
    let last: u64 = last.parse().map_err(|_| malformed())?;
    if first > last {
        return Err(malformed());
    }
    if last >= size {
        return Err(S3Error::invalid_argument(format!(
            "Range specified is not valid for source object of size: {size}"
        )));
    }
    Ok((first, last - first + 1))
}

pub async fn upload_part_copy(state: &Arc<State>, ctx: &Ctx) -> Answer {
    let id = upload_id(ctx)?;
    let number = part_number(ctx)?;
    let directory = check_upload(state, ctx, &id)?;
    let (_, _, src) = copy_source(state, ctx)?;
    check_source_conditions(ctx, &src)?;
    let (start, len) = match ctx.header("x-amz-copy-source-range") {
        None => (0, src.size),
        Some(_) if src.size <= MIN_PART_SIZE => {
            return Err(S3Error::invalid_request(
                "The specified copy source is not supported as a byte-range copy source.",
            ));
        }
        Some(r) => copy_range(r, src.size)?,
    };
    if len > MAX_COPY_SIZE {
        return Err(S3Error::entity_too_large(MAX_COPY_SIZE));
    }
    let algorithm = {
        let buckets = state.store.buckets();
        buckets
            .get(&ctx.bucket)
            .and_then(|b| b.uploads.get(&id))
            .ok_or_else(S3Error::no_such_upload)?
            .checksum_algorithm
            .clone()
    };
    let pieces = src.pieces(start, len);
    let plan = DigestPlan {
        md5: !directory,
        sha256: false,
        crc32: algorithm.as_deref() == Some("crc32"),
        crc32c: algorithm.as_deref() == Some("crc32c"),
        crc64nvme: algorithm.as_deref() == Some("crc64nvme"),
    };
    let digests = if plan.md5 || plan.crc32 || plan.crc32c || plan.crc64nvme {
        let pieces = pieces.clone();
        tokio::task::spawn_blocking(move || crate::body::digest_pieces(&pieces, plan))
            .await
            .map_err(|e| S3Error::internal(std::io::Error::other(e)))?
            .map_err(S3Error::internal)?
    } else {
        Received::default()
    };
    let checksum = match algorithm.as_deref() {
        Some("crc32") => digests.crc32.clone().map(|v| ("crc32", v)),
        Some("crc32c") => digests.crc32c.clone().map(|v| ("crc32c", v)),
        Some("crc64nvme") => digests.crc64nvme.clone().map(|v| ("crc64nvme", v)),
        _ => None,
    };
    let part = Part {
        data: pieces,
        size: len,
        etag: new_etag(directory, digests.md5),
        md5: digests.md5,
        checksums: checksum
            .iter()
            .map(|(a, v)| (a.to_string(), v.clone()))
            .collect(),
    };
    let etag = part.etag.clone();
    store_part(state, ctx, &id, number, part)?;
    let mut out = format!("{HEADER}<CopyPartResult xmlns=\"{NS}\">");
    el(&mut out, "ETag", &etag);
    el(&mut out, "LastModified", &xml::iso8601(SystemTime::now()));
    if let Some((alg, value)) = &checksum {
        let name = match *alg {
            "crc32" => "ChecksumCRC32",
            "crc32c" => "ChecksumCRC32C",
            _ => "ChecksumCRC64NVME",
        };
        el(&mut out, name, value);
    }
    out.push_str("</CopyPartResult>");
    Ok(xml_response(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_ranges_are_first_to_last_inclusive_and_inside_the_source() {
        assert_eq!(copy_range("bytes=0-9", 100).unwrap(), (0, 10));
        assert_eq!(copy_range("bytes=90-99", 100).unwrap(), (90, 10));
        for bad in ["bytes=5-4", "bytes=-5", "bytes=5-", "0-9", "bytes=a-b"] {
            let e = copy_range(bad, 100).unwrap_err();
            assert_eq!(e.code, "InvalidArgument", "{bad}");
        }
        let e = copy_range("bytes=90-100", 100).unwrap_err();
        assert!(e.message.contains("size: 100"), "{}", e.message);
    }
}
