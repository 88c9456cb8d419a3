//! Multipart uploads: create, upload part, complete, abort, list parts, list uploads.
//! Rules checked as the service does: part numbers 1..=10,000, parts of at least 5 MiB but the last,
//! ascending order in Complete, matching ETags and checksums; directory buckets also need consecutive parts.

use std::sync::Arc;
use std::time::SystemTime;

use hyper::body::Incoming;
use md5::{Digest, Md5};

use crate::body::ResponseBody;
use crate::error::S3Error;
use crate::objects::{
    check_write_conditions, commit_seen, has_write_conditions, new_etag, receive_verified,
    validate_key,
};
use crate::server::{Answer, Ctx, State, respond, set_header, small_body, xml_response};
use crate::store::{Blob, Object, Part, Upload};
use crate::xml::{self, HEADER, NS, el};

pub const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;
pub const MAX_PARTS: u32 = 10_000;

pub fn create(state: &Arc<State>, ctx: &Ctx) -> Answer {
    validate_key(&ctx.key)?;
    // The completed object gets the metadata given here (CompleteMultipartUpload takes none).
    let meta = crate::meta::from_request(&ctx.headers)?;
    let id = base64_id(state.store.unique());
    {
        let mut buckets = state.store.buckets();
        let b = buckets
            .get_mut(&ctx.bucket)
            .ok_or_else(S3Error::no_such_bucket)?;
        let dir = b.dir.join(format!("mpu-{}", state.store.unique()));
        std::fs::create_dir_all(&dir).map_err(S3Error::internal)?;
        b.uploads.insert(
            id.clone(),
            Upload {
                key: ctx.key.clone(),
                dir,
                initiated: SystemTime::now(),
                checksum_algorithm: ctx
                    .header("x-amz-checksum-algorithm")
                    .map(|a| a.to_ascii_lowercase()),
                parts: Default::default(),
                content_type: ctx
                    .header("content-type")
                    .unwrap_or("binary/octet-stream")
                    .to_string(),
                meta,
            },
        );
    }
    let mut out = format!("{HEADER}<InitiateMultipartUploadResult xmlns=\"{NS}\">");
    el(&mut out, "Bucket", &ctx.bucket);
    el(&mut out, "Key", &ctx.key);
    el(&mut out, "UploadId", &id);
    out.push_str("</InitiateMultipartUploadResult>");
    let mut r = xml_response(out);
    if let Some(alg) = ctx.header("x-amz-checksum-algorithm") {
        set_header(&mut r, "x-amz-checksum-algorithm", alg);
    }
    Ok(r)
}

fn base64_id(raw: String) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("upload-{raw}"))
}

pub fn upload_id(ctx: &Ctx) -> Result<String, S3Error> {
    ctx.q("uploadId")
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .ok_or_else(S3Error::no_such_upload)
}

pub fn check_upload(state: &Arc<State>, ctx: &Ctx, id: &str) -> Result<bool, S3Error> {
    let buckets = state.store.buckets();
    let b = buckets
        .get(&ctx.bucket)
        .ok_or_else(S3Error::no_such_bucket)?;
    match b.uploads.get(id) {
        Some(u) if u.key == ctx.key => Ok(b.directory),
        _ => Err(S3Error::no_such_upload()),
    }
}

pub async fn upload_part(state: &Arc<State>, ctx: &Ctx, body: Incoming) -> Answer {
    let id = upload_id(ctx)?;
    let number = part_number(ctx)?;
    let directory = check_upload(state, ctx, &id)?;
    let (path, received, checksum) = receive_verified(state, ctx, body, "part", directory).await?;
    let part = Part {
        data: vec![(Blob::new(path, received.size), 0, received.size)],
        size: received.size,
        etag: new_etag(directory, received.md5),
        md5: received.md5,
        checksums: checksum.clone().into_iter().collect(),
    };
    let etag = part.etag.clone();
    store_part(state, ctx, &id, number, part)?;
    let mut r = respond(200, ResponseBody::empty());
    set_header(&mut r, "etag", &etag);
    if let Some((alg, value)) = checksum
        && let (Ok(n), Ok(v)) = (
            http::HeaderName::try_from(format!("x-amz-checksum-{alg}")),
            http::HeaderValue::from_str(&value),
        )
    {
        r.headers_mut().insert(n, v);
    }
    Ok(r)
}

pub fn part_number(ctx: &Ctx) -> Result<u32, S3Error> {
    ctx.q("partNumber")
        .and_then(|n| n.parse().ok())
        .filter(|n| (1..=MAX_PARTS).contains(n))
        .ok_or_else(|| {
            S3Error::invalid_argument(
                "Part number must be an integer between 1 and 10000, inclusive",
            )
        })
}

/// Stores a part (a part uploaded again replaces the old one, whose blobs go with it, outside the lock).
pub fn store_part(
    state: &Arc<State>,
    ctx: &Ctx,
    id: &str,
    number: u32,
    part: Part,
) -> Result<(), S3Error> {
    let _replaced = {
        let mut buckets = state.store.buckets();
        let upload = buckets
            .get_mut(&ctx.bucket)
            .and_then(|b| b.uploads.get_mut(id))
            .ok_or_else(S3Error::no_such_upload)?;
        upload.parts.insert(number, part)
    };
    Ok(())
}

pub async fn complete(state: &Arc<State>, ctx: &Ctx, body: Incoming) -> Answer {
    let id = upload_id(ctx)?;
    let body = small_body(ctx, body, 4 * 1024 * 1024).await?;
    let requested = xml::parse_complete(&body)?;
    let asked: Vec<(u32, String)> = requested
        .iter()
        .map(|p| (p.part_number, p.etag.trim_matches('"').to_string()))
        .collect();
    // Validate against the stored parts and collect the files to concatenate.
    let (directory, parts, content_type, meta, seen) = {
        let buckets = state.store.buckets();
        let b = buckets
            .get(&ctx.bucket)
            .ok_or_else(S3Error::no_such_bucket)?;
        let Some(upload) = b.uploads.get(&id).filter(|u| u.key == ctx.key) else {
            // Completed already with these parts (a retry whose first answer was lost): the same result.
            let done = b
                .completed
                .iter()
                .find(|(i, k, p, _)| *i == id && *k == ctx.key && *p == asked);
            return match done {
                Some((.., etag)) => Ok(complete_result(ctx, etag)),
                None => Err(S3Error::no_such_upload()),
            };
        };
        let mut parts = Vec::with_capacity(requested.len());
        for (i, p) in requested.iter().enumerate() {
            if i > 0 && p.part_number <= requested[i - 1].part_number {
                return Err(S3Error::new(
                    400,
                    "InvalidPartOrder",
                    "The list of parts was not in ascending order. The parts list must be specified in order by part number.",
                ));
            }
            if b.directory && p.part_number != i as u32 + 1 {
                return Err(S3Error::new(
                    400,
                    "InvalidPartOrder",
                    "Directory buckets need consecutive part numbers starting at 1.",
                ));
            }
            let stored = upload
                .parts
                .get(&p.part_number)
                .ok_or_else(|| invalid_part(p.part_number))?;
            if stored.etag.trim_matches('"') != p.etag.trim_matches('"') {
                return Err(invalid_part(p.part_number));
            }
            for (alg, value) in &p.checksums {
                if stored.checksums.iter().any(|(a, v)| a == alg && v != value) {
                    return Err(invalid_part(p.part_number));
                }
            }
            if i + 1 < requested.len() && stored.size < MIN_PART_SIZE {
                return Err(S3Error::new(
                    400,
                    "EntityTooSmall",
                    "Your proposed upload is smaller than the minimum allowed object size.",
                ));
            }
            parts.push(stored.clone());
        }
        // Conditions are checked now (fail fast) and again at commit, where a change in between is a
        // conflict (409), not a failed condition.
        let current = b.objects.get(&ctx.key).cloned();
        check_write_conditions(ctx, current.as_deref())?;
        let seen = has_write_conditions(ctx).then_some(current);
        (
            b.directory,
            parts,
            upload.content_type.clone(),
            upload.meta.clone(),
            seen,
        )
    };

    let size = parts.iter().map(|p| p.size).sum();
    let etag = if directory {
        new_etag(true, None)
    } else {
        let mut h = Md5::new();
        for p in &parts {
            h.update(p.md5.unwrap_or_default());
        }
        format!("\"{}-{}\"", hex::encode(h.finalize()), parts.len())
    };
    // The object is made of the part blobs themselves: completing copies no bytes (as in the service).
    let object = Object {
        data: parts.iter().flat_map(|p| p.data.iter().cloned()).collect(),
        size,
        etag: etag.clone(),
        last_modified: SystemTime::now(),
        content_type,
        checksum: None,
        parts: parts.len() as u32,
        meta,
    };
    if let Err(e) = commit_seen(state, ctx, object, seen) {
        // After a conflict the service wants a new upload ("re-initiate the multipart upload"): this one is gone.
        if e.code == "ConditionalRequestConflict" {
            remove_upload(state, &ctx.bucket, &id);
        }
        return Err(e);
    }
    remove_upload(state, &ctx.bucket, &id);
    if let Some(b) = state.store.buckets().get_mut(&ctx.bucket) {
        const KEPT: usize = 10_000;
        if b.completed.len() == KEPT {
            b.completed.pop_front();
        }
        b.completed
            .push_back((id, ctx.key.clone(), asked, etag.clone()));
    }
    Ok(complete_result(ctx, &etag))
}

fn complete_result(ctx: &Ctx, etag: &str) -> http::Response<ResponseBody> {
    let mut out = format!("{HEADER}<CompleteMultipartUploadResult xmlns=\"{NS}\">");
    el(
        &mut out,
        "Location",
        &format!("/{}/{}", ctx.bucket, ctx.key),
    );
    el(&mut out, "Bucket", &ctx.bucket);
    el(&mut out, "Key", &ctx.key);
    el(&mut out, "ETag", etag);
    out.push_str("</CompleteMultipartUploadResult>");
    xml_response(out)
}

fn invalid_part(n: u32) -> S3Error {
    S3Error::new(
        400,
        "InvalidPart",
        format!(
            "One or more of the specified parts could not be found (part {n}). The part may not have been uploaded, or the specified entity tag or checksum may not match the part's."
        ),
    )
}

pub fn remove_upload(state: &Arc<State>, bucket: &str, id: &str) -> bool {
    let removed = state
        .store
        .buckets()
        .get_mut(bucket)
        .and_then(|b| b.uploads.remove(id));
    match removed {
        // Part blobs not taken by a completed object are deleted as the upload drops.
        Some(u) => {
            let _ = std::fs::remove_dir_all(u.dir);
            true
        }
        None => false,
    }
}

pub fn abort(state: &Arc<State>, ctx: &Ctx) -> Answer {
    let id = upload_id(ctx)?;
    check_upload(state, ctx, &id)?;
    if !remove_upload(state, &ctx.bucket, &id) {
        return Err(S3Error::no_such_upload());
    }
    Ok(respond(204, ResponseBody::empty()))
}

pub fn list_parts(state: &Arc<State>, ctx: &Ctx) -> Answer {
    let id = upload_id(ctx)?;
    let buckets = state.store.buckets();
    let b = buckets
        .get(&ctx.bucket)
        .ok_or_else(S3Error::no_such_bucket)?;
    let u = b
        .uploads
        .get(&id)
        .filter(|u| u.key == ctx.key)
        .ok_or_else(S3Error::no_such_upload)?;
    let mut out = format!("{HEADER}<ListPartsResult xmlns=\"{NS}\">");
    el(&mut out, "Bucket", &ctx.bucket);
    el(&mut out, "Key", &ctx.key);
    el(&mut out, "UploadId", &id);
    el(&mut out, "IsTruncated", "false");
    for (n, p) in &u.parts {
        out.push_str("<Part>");
        el(&mut out, "PartNumber", &n.to_string());
        el(&mut out, "ETag", &p.etag);
        el(&mut out, "Size", &p.size.to_string());
        out.push_str("</Part>");
    }
    out.push_str("</ListPartsResult>");
    Ok(xml_response(out))
}

pub fn list_uploads(state: &Arc<State>, ctx: &Ctx) -> Answer {
    let prefix = ctx.q("prefix").unwrap_or("");
    let buckets = state.store.buckets();
    let b = buckets
        .get(&ctx.bucket)
        .ok_or_else(S3Error::no_such_bucket)?;
    let mut uploads: Vec<_> = b
        .uploads
        .iter()
        .filter(|(_, u)| u.key.starts_with(prefix))
        .collect();
    uploads.sort_by(|a, b| (&a.1.key, a.0).cmp(&(&b.1.key, b.0)));
    let mut out = format!("{HEADER}<ListMultipartUploadsResult xmlns=\"{NS}\">");
    el(&mut out, "Bucket", &ctx.bucket);
    el(&mut out, "Prefix", prefix);
    el(&mut out, "IsTruncated", "false");
    for (id, u) in uploads.iter().take(1000) {
        out.push_str("<Upload>");
        el(&mut out, "Key", &u.key);
        el(&mut out, "UploadId", id);
        el(&mut out, "Initiated", &xml::iso8601(u.initiated));
        out.push_str("</Upload>");
    }
    out.push_str("</ListMultipartUploadsResult>");
    Ok(xml_response(out))
}
