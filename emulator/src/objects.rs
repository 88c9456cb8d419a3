//! Object operations: GetObject/HeadObject, PutObject (and directory-bucket appends), CopyObject,
//! RenameObject, DeleteObject, DeleteObjects.

use std::sync::Arc;
use std::time::SystemTime;

use base64::Engine;
use hyper::body::Incoming;
use percent_encoding::percent_decode_str;

use crate::body::{BodyFault, DigestPlan, Received, ResponseBody, receive_to_file};
use crate::error::S3Error;
use crate::server::{Answer, Ctx, State, respond, set_header, small_body, xml_response};
use crate::store::{Blob, Object};
use crate::xml::{self, HEADER, NS, el};

pub const MAX_PUT_SIZE: u64 = 5 * 1024 * 1024 * 1024;
/// Directory buckets allow at most this many appends (and parts) per object.
pub const MAX_APPENDS: u32 = 10_000;
const CHECKSUM_ALGORITHMS: [&str; 5] = ["crc32", "crc32c", "crc64nvme", "sha1", "sha256"];

pub fn is_aws_chunked(ctx: &Ctx) -> bool {
    ctx.header("content-encoding")
        .is_some_and(|e| e.split(',').any(|p| p.trim() == "aws-chunked"))
        || ctx
            .header("x-amz-content-sha256")
            .is_some_and(|v| v.starts_with("STREAMING-"))
}

/// ETag for new content: MD5 on general-purpose buckets, an opaque random value on directory buckets.
pub fn new_etag(directory: bool, md5: Option<[u8; 16]>) -> String {
    match (directory, md5) {
        (false, Some(m)) => format!("\"{}\"", hex::encode(m)),
        _ => format!("\"{}\"", hex::encode(rand::random::<[u8; 16]>())),
    }
}

/// Which checksum the client declared (header or trailer), if any.
pub fn declared_checksum(ctx: &Ctx) -> Option<String> {
    for alg in CHECKSUM_ALGORITHMS {
        if ctx
            .headers
            .contains_key(format!("x-amz-checksum-{alg}").as_str())
        {
            return Some(alg.to_string());
        }
    }
    if let Some(trailer) = ctx.header("x-amz-trailer")
        && let Some(alg) = trailer.trim().strip_prefix("x-amz-checksum-")
    {
        return Some(alg.to_ascii_lowercase());
    }
    ctx.header("x-amz-sdk-checksum-algorithm")
        .map(|a| a.to_ascii_lowercase())
}

/// Receives a body to a new file in the bucket, checking payload hash, Content-MD5 and declared checksums.
/// Returns what was received and the declared checksum that was verified.
pub async fn receive_verified(
    state: &Arc<State>,
    ctx: &Ctx,
    body: Incoming,
    kind: &str,
    directory: bool,
) -> Result<(std::path::PathBuf, Received, Option<(String, String)>), S3Error> {
    let payload_hash = ctx.header("x-amz-content-sha256").unwrap_or("").to_string();
    let sha_signed =
        payload_hash.len() == 64 && payload_hash.bytes().all(|b| b.is_ascii_hexdigit());
    let checksum = declared_checksum(ctx);
    let plan = DigestPlan {
        md5: !directory || ctx.headers.contains_key("content-md5"),
        sha256: sha_signed,
        crc32: checksum.as_deref() == Some("crc32"),
        crc32c: checksum.as_deref() == Some("crc32c"),
        crc64nvme: checksum.as_deref() == Some("crc64nvme"),
    };
    let path = state.store.new_file(&ctx.bucket, kind)?;
    let received = match receive_to_file(body, is_aws_chunked(ctx), plan, &path, MAX_PUT_SIZE).await
    {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
    };
    let fail = |e: S3Error| {
        let _ = std::fs::remove_file(&path);
        Err(e)
    };
    if let Some(declared) = ctx.header("x-amz-decoded-content-length")
        && declared.parse::<u64>().ok() != Some(received.size)
    {
        return fail(S3Error::incomplete_body(format!(
            "x-amz-decoded-content-length {declared} but {} bytes arrived",
            received.size
        )));
    }
    if sha_signed
        && received.sha256_hex.as_deref() != Some(payload_hash.to_ascii_lowercase().as_str())
    {
        return fail(S3Error::new(
            400,
            "XAmzContentSHA256Mismatch",
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
        ));
    }
    if let Some(expected) = ctx.header("content-md5") {
        let got = received
            .md5
            .map(|m| base64::engine::general_purpose::STANDARD.encode(m));
        if got.as_deref() != Some(expected.trim()) {
            return fail(S3Error::bad_digest("Content-MD5"));
        }
    }
    let mut verified = None;
    if let Some(alg) = checksum {
        let name = format!("x-amz-checksum-{alg}");
        let claimed = ctx.header(&name).map(str::to_string).or_else(|| {
            received
                .trailers
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
        });
        let computed = match alg.as_str() {
            "crc32" => received.crc32.clone(),
            "crc32c" => received.crc32c.clone(),
            "crc64nvme" => received.crc64nvme.clone(),
            _ => None,
        };
        match (claimed, computed) {
            (Some(c), Some(v)) if c == v => verified = Some((alg, v)),
            (Some(_), Some(_)) => return fail(S3Error::bad_digest(&name)),
            // SHA-1/SHA-256 checksums are accepted unverified (documented limitation).
            (Some(c), None) => verified = Some((alg, c)),
            (None, Some(v)) => verified = Some((alg, v)),
            (None, None) => {}
        }
    }
    Ok((path, received, verified))
}

/// `If-None-Match: *` / `If-Match: etag` on a write, checked against the current object.
pub fn check_write_conditions(ctx: &Ctx, current: Option<&Object>) -> Result<(), S3Error> {
    if let Some(v) = ctx.header("if-none-match") {
        if v.trim() != "*" {
            return Err(S3Error::not_implemented(
                "If-None-Match with a value other than *",
            ));
        }
        if current.is_some() {
            return Err(S3Error::precondition_failed("If-None-Match"));
        }
    }
    if let Some(v) = ctx.header("if-match") {
        match current {
            None => return Err(S3Error::no_such_key()),
            Some(o) if !etag_matches(v, &o.etag) => {
                return Err(S3Error::precondition_failed("If-Match"));
            }
            _ => {}
        }
    }
    Ok(())
}

pub fn etag_matches(condition: &str, etag: &str) -> bool {
    condition.split(',').any(|c| {
        let c = c.trim();
        c == "*" || c.trim_matches('"') == etag.trim_matches('"')
    })
}

fn parse_range(value: &str, size: u64) -> Result<Option<(u64, u64)>, S3Error> {
    let invalid = || {
        S3Error::new(
            416,
            "InvalidRange",
            "The requested range is not satisfiable",
        )
    };
    let Some(spec) = value.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None); // S3 ignores multi-range requests and sends the whole object.
    }
    let (a, b) = spec.split_once('-').ok_or_else(invalid)?;
    let (start, end) = if a.is_empty() {
        let n: u64 = b.parse().map_err(|_| invalid())?;
        if n == 0 || size == 0 {
            return Err(invalid());
        }
        (size.saturating_sub(n), size - 1)
    } else {
        let start: u64 = a.parse().map_err(|_| invalid())?;
        let end: u64 = if b.is_empty() {
            u64::MAX
        } else {
            b.parse().map_err(|_| invalid())?
        };
        if end < start {
            return Ok(None);
        }
        if start >= size {
            return Err(invalid());
        }
        (start, end.min(size - 1))
    };
    Ok(Some((start, end)))
}

pub fn get_object(state: &Arc<State>, ctx: &Ctx) -> Answer {
    if ctx.has("partNumber") {
        return Err(S3Error::not_implemented("GetObject with partNumber"));
    }
    // The object (and so its blobs) is held until the body is sent: a concurrent overwrite cannot delete
    // the bytes under this read.
    let object = {
        let buckets = state.store.buckets();
        let b = buckets
            .get(&ctx.bucket)
            .ok_or_else(S3Error::no_such_bucket)?;
        Arc::clone(b.objects.get(&ctx.key).ok_or_else(S3Error::no_such_key)?)
    };
    let not_modified = || {
        let mut r = respond(304, ResponseBody::empty());
        set_header(&mut r, "etag", &object.etag);
        set_header(
            &mut r,
            "last-modified",
            &xml::http_date(object.last_modified),
        );
        r
    };
    if let Some(v) = ctx.header("if-match") {
        if !etag_matches(v, &object.etag) {
            return Err(S3Error::precondition_failed("If-Match"));
        }
    } else if let Some(since) = ctx
        .header("if-unmodified-since")
        .and_then(xml::parse_http_date)
        && truncate_secs(object.last_modified) > since
    {
        return Err(S3Error::precondition_failed("If-Unmodified-Since"));
    }
    if let Some(v) = ctx.header("if-none-match") {
        if etag_matches(v, &object.etag) {
            return Ok(not_modified());
        }
    } else if let Some(since) = ctx
        .header("if-modified-since")
        .and_then(xml::parse_http_date)
        && truncate_secs(object.last_modified) <= since
    {
        return Ok(not_modified());
    }
    let range = match ctx.header("range") {
        Some(r) => parse_range(r, object.size)?,
        None => None,
    };
    let (status, start, len) = match range {
        Some((s, e)) => (206, s, e - s + 1),
        None => (200, 0, object.size),
    };
    let head = ctx.method == http::Method::HEAD;
    let fault = if head || len < 2 {
        BodyFault::None
    } else {
        ctx.body_fault
    };
    let body = if head || len == 0 {
        ResponseBody::empty()
    } else {
        ResponseBody::pieces(object.pieces(start, len), fault)
    };
    let mut r = respond(status, body);
    set_header(&mut r, "content-length", &len.to_string());
    set_header(&mut r, "etag", &object.etag);
    set_header(
        &mut r,
        "last-modified",
        &xml::http_date(object.last_modified),
    );
    set_header(&mut r, "content-type", &object.content_type);
    set_header(&mut r, "accept-ranges", "bytes");
    crate::meta::to_response(&mut r, &object.meta);
    if status == 206 {
        set_header(
            &mut r,
            "content-range",
            &format!("bytes {start}-{}/{}", start + len - 1, object.size),
        );
    }
    if status == 200
        && ctx
            .header("x-amz-checksum-mode")
            .is_some_and(|m| m.eq_ignore_ascii_case("ENABLED"))
        && let Some((alg, value)) = &object.checksum
    {
        let name = format!("x-amz-checksum-{alg}");
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::try_from(name),
            http::HeaderValue::from_str(value),
        ) {
            r.headers_mut().insert(n, v);
            set_header(&mut r, "x-amz-checksum-type", "FULL_OBJECT");
        }
    }
    if state
        .store
        .buckets()
        .get(&ctx.bucket)
        .is_some_and(|b| b.directory)
    {
        set_header(&mut r, "x-amz-storage-class", "EXPRESS_ONEZONE");
    }
    Ok(r)
}

pub fn truncate_secs(t: SystemTime) -> SystemTime {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs)
}

fn checksum_header(r: &mut http::Response<ResponseBody>, checksum: &Option<(String, String)>) {
    if let Some((alg, value)) = checksum
        && let (Ok(n), Ok(v)) = (
            http::HeaderName::try_from(format!("x-amz-checksum-{alg}")),
            http::HeaderValue::from_str(value),
        )
    {
        r.headers_mut().insert(n, v);
    }
}

pub async fn put_object(state: &Arc<State>, ctx: &Ctx, body: Incoming) -> Answer {
    let directory = {
        let buckets = state.store.buckets();
        buckets
            .get(&ctx.bucket)
            .ok_or_else(S3Error::no_such_bucket)?
            .directory
    };
    validate_key(&ctx.key)?;
    if let Some(offset) = ctx.header("x-amz-write-offset-bytes") {
        if !directory {
            // Read the body before refusing, as S3 does: left unread on a kept-alive connection, its bytes
            // could be taken for the start of the client's next request (a flaky 400 in the boto3 checks).
            let _ = http_body_util::BodyExt::collect(body).await;
            return Err(S3Error::not_implemented(
                "x-amz-write-offset-bytes (appends) on general purpose buckets",
            ));
        }
        let offset: u64 = offset.trim().parse().map_err(|_| {
            S3Error::invalid_argument("x-amz-write-offset-bytes must be a non-negative integer")
        })?;
        return append(state, ctx, body, offset).await;
    }
    let meta = crate::meta::from_request(&ctx.headers)?;
    let seen = conditions_at_start(state, ctx)?;
    let (path, received, checksum) = receive_verified(state, ctx, body, "obj", directory).await?;
    let blob = Blob::new(path, received.size);
    keep_if_short(&blob);
    let object = Object {
        data: vec![(blob, 0, received.size)],
        size: received.size,
        etag: new_etag(directory, received.md5),
        last_modified: SystemTime::now(),
        content_type: ctx
            .header("content-type")
            .unwrap_or("binary/octet-stream")
            .to_string(),
        checksum: checksum.clone(),
        parts: 1,
        meta,
    };
    let etag = object.etag.clone();
    commit_seen(state, ctx, object, seen)?;
    let mut r = respond(200, ResponseBody::empty());
    set_header(&mut r, "etag", &etag);
    checksum_header(&mut r, &checksum);
    Ok(r)
}

/// Swaps a new object in if the write conditions still hold. The replaced object's blobs (and, on failure,
/// the new one's) are deleted once nothing holds them, outside the lock.
pub fn commit(state: &Arc<State>, ctx: &Ctx, object: Object) -> Result<(), S3Error> {
    commit_seen(state, ctx, object, None)
}

/// The object a conditional write found when it started (`Some(None)`: no object), so that its commit can tell
/// a concurrent change from a failed condition. `None` when the request carries no write condition.
pub type Seen = Option<Option<Arc<Object>>>;

/// Checks the write conditions when a request starts (a failed condition answers before the body is read)
/// and remembers the object they were checked against.
pub fn conditions_at_start(state: &Arc<State>, ctx: &Ctx) -> Result<Seen, S3Error> {
    if !has_write_conditions(ctx) {
        return Ok(None);
    }
    let buckets = state.store.buckets();
    let b = buckets
        .get(&ctx.bucket)
        .ok_or_else(S3Error::no_such_bucket)?;
    let current = b.objects.get(&ctx.key).cloned();
    check_write_conditions(ctx, current.as_deref())?;
    Ok(Some(current))
}

pub fn has_write_conditions(ctx: &Ctx) -> bool {
    ctx.headers.contains_key("if-match") || ctx.headers.contains_key("if-none-match")
}

/// The service's answer when another write to the key lands while a conditional write is in flight
/// (PutObject, CompleteMultipartUpload and CopyObject API references: "If a conflicting operation occurs
/// during the upload S3 returns a 409 ConditionalRequestConflict response").
pub fn conditional_conflict() -> S3Error {
    S3Error::new(
        409,
        "ConditionalRequestConflict",
        "A conflicting operation occurred. If using PutObject you can retry the request. If using multipart upload you should initiate another CreateMultipartUpload request and re-upload each part.",
    )
}

/// [`commit`], answering 409 ConditionalRequestConflict when the key changed since `seen` was taken.
pub fn commit_seen(
    state: &Arc<State>,
    ctx: &Ctx,
    object: Object,
    seen: Seen,
) -> Result<(), S3Error> {
    let _replaced = {
        let mut buckets = state.store.buckets();
        let b = buckets
            .get_mut(&ctx.bucket)
            .ok_or_else(S3Error::no_such_bucket)?;
        let current = b.objects.get(&ctx.key);
        if let Some(seen) = &seen {
            let same = match (seen, current) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            };
            if !same {
                return Err(conditional_conflict());
            }
        }
        check_write_conditions(ctx, current.map(|o| o.as_ref()))?;
        b.objects.insert(ctx.key.clone(), Arc::new(object))
    };
    Ok(())
}

/// A short object's bytes go to memory with its upload rather than with its first GET, so that the first
/// client to read it (in a bench, the first of the clients compared) pays no more than the next.
fn keep_if_short(blob: &Blob) {
    if let Err(e) = blob.short_bytes() {
        tracing::warn!(path = %blob.path.display(), error = %e, "a blob just written cannot be read back");
    }
}

async fn append(state: &Arc<State>, ctx: &Ctx, body: Incoming, offset: u64) -> Answer {
    let meta = crate::meta::from_request(&ctx.headers)?;
    let (tmp, received, _) = receive_verified(state, ctx, body, "append", true).await?;
    if received.size == 0 {
        // Not yet a blob, whose drop would remove its file.
        let _ = std::fs::remove_file(&tmp);
        return Err(S3Error::invalid_request(
            "Request body cannot be empty when 'write offset' is specified.",
        ));
    }
    let blob = Blob::new(tmp, received.size);
    keep_if_short(&blob);
    let blob = (blob, 0, received.size);
    let (etag, size, _replaced) = {
        let mut buckets = state.store.buckets();
        let b = buckets
            .get_mut(&ctx.bucket)
            .ok_or_else(S3Error::no_such_bucket)?;
        let current = b.objects.get(&ctx.key).cloned();
        check_write_conditions(ctx, current.as_deref())?;
        let wrong_offset = || {
            S3Error::new(
                400,
                "InvalidWriteOffset",
                "The write offset value that you specified does not match the current object size.",
            )
        };
        let object = match &current {
            None if offset != 0 => return Err(wrong_offset()),
            None => Object {
                data: vec![blob],
                size: received.size,
                etag: new_etag(true, None),
                last_modified: SystemTime::now(),
                content_type: ctx
                    .header("content-type")
                    .unwrap_or("binary/octet-stream")
                    .to_string(),
                checksum: None,
                parts: 1,
                meta,
            },
            Some(current) if offset != current.size => return Err(wrong_offset()),
            Some(current) if current.parts >= MAX_APPENDS => {
                return Err(S3Error::new(
                    400,
                    "TooManyParts",
                    "The object has reached the maximum number of appends (10,000).",
                ));
            }
            // The appended bytes become one more blob of the object: nothing is copied, and readers of the
            // previous version keep their blobs. An append keeps the object's metadata (the S3 Express
            // append is a write to the existing object, not a new one).
            Some(current) => Object {
                data: current.data.iter().cloned().chain([blob]).collect(),
                size: current.size + received.size,
                etag: new_etag(true, None),
                last_modified: SystemTime::now(),
                content_type: current.content_type.clone(),
                checksum: None,
                parts: current.parts + 1,
                meta: current.meta.clone(),
            },
        };
        let (etag, size) = (object.etag.clone(), object.size);
        (
            etag,
            size,
            b.objects.insert(ctx.key.clone(), Arc::new(object)),
        )
    };
    let mut r = respond(200, ResponseBody::empty());
    set_header(&mut r, "etag", &etag);
    set_header(&mut r, "x-amz-object-size", &size.to_string());
    Ok(r)
}

/// Keys are 1 to 1024 bytes of UTF-8 (path-style requests have already been decoded).
pub fn validate_key(key: &str) -> Result<(), S3Error> {
    if key.is_empty() || key.len() > 1024 {
        return Err(S3Error::new(
            400,
            "KeyTooLongError",
            "Your key is too long (or empty)",
        ));
    }
    Ok(())
}

/// RenameObject (directory buckets): atomically moves `x-amz-rename-source` to the request key.
pub fn rename_object(state: &Arc<State>, ctx: &Ctx) -> Answer {
    validate_key(&ctx.key)?;
    let raw = ctx
        .header("x-amz-rename-source")
        .ok_or_else(|| S3Error::invalid_request("x-amz-rename-source is required"))?;
    let source = percent_decode_str(raw.strip_prefix('/').unwrap_or(raw))
        .decode_utf8_lossy()
        .into_owned();
    validate_key(&source)?;
    // As the service documents: RenameObject does not move an object whose key ends in the delimiter.
    if source.ends_with('/') || ctx.key.ends_with('/') {
        return Err(S3Error::invalid_request(
            "RenameObject does not support keys that end with the delimiter '/'",
        ));
    }
    let replaced = {
        let mut buckets = state.store.buckets();
        let b = buckets
            .get_mut(&ctx.bucket)
            .ok_or_else(S3Error::no_such_bucket)?;
        if !b.directory {
            return Err(S3Error::not_implemented(
                "RenameObject on general purpose buckets",
            ));
        }
        let token = ctx.header("x-amz-client-token").map(str::to_string);
        if let Some(token) = &token
            && b.renames
                .iter()
                .any(|(t, from, to)| t == token && *from == source && *to == ctx.key)
        {
            return Ok(respond(200, ResponseBody::empty()));
        }
        let src = Arc::clone(b.objects.get(&source).ok_or_else(S3Error::no_such_key)?);
        if let Some(v) = ctx.header("x-amz-rename-source-if-match")
            && !etag_matches(v, &src.etag)
        {
            return Err(S3Error::precondition_failed("x-amz-rename-source-if-match"));
        }
        if let Some(v) = ctx.header("x-amz-rename-source-if-none-match")
            && etag_matches(v, &src.etag)
        {
            return Err(S3Error::precondition_failed(
                "x-amz-rename-source-if-none-match",
            ));
        }
        check_write_conditions(ctx, b.objects.get(&ctx.key).map(|o| o.as_ref()))?;
        if source == ctx.key {
            None
        } else {
            // RenameObject keeps the object as it was, last-modified date included (User Guide, "Renaming
            // objects in directory buckets").
            b.objects.remove(&source);
            if let Some(token) = token {
                const KEPT: usize = 10_000;
                if b.renames.len() == KEPT {
                    b.renames.pop_front();
                }
                b.renames
                    .push_back((token, source.clone(), ctx.key.clone()));
            }
            b.objects.insert(ctx.key.clone(), src)
        }
    };
    drop(replaced); // its blobs go once no reader holds them
    Ok(respond(200, ResponseBody::empty()))
}

pub fn delete_object(state: &Arc<State>, ctx: &Ctx) -> Answer {
    remove_key(state, &ctx.bucket, &ctx.key, ctx.header("if-match"))?;
    Ok(respond(204, ResponseBody::empty()))
}

fn remove_key(
    state: &Arc<State>,
    bucket: &str,
    key: &str,
    if_match: Option<&str>,
) -> Result<(), S3Error> {
    let removed = {
        let mut buckets = state.store.buckets();
        let b = buckets
            .get_mut(bucket)
            .ok_or_else(S3Error::no_such_bucket)?;
        if let Some(cond) = if_match {
            match b.objects.get(key) {
                None => return Err(S3Error::no_such_key()),
                Some(o) if !etag_matches(cond, &o.etag) => {
                    return Err(S3Error::precondition_failed("If-Match"));
                }
                _ => {}
            }
        }
        b.objects.remove(key)
    };
    drop(removed); // outside the lock: its blobs go once no reader holds them
    Ok(())
}

/// DeleteObjects: `<Delete><Object><Key>k</Key></Object>...<Quiet>true</Quiet></Delete>`.
pub async fn delete_objects(state: &Arc<State>, ctx: &Ctx, body: Incoming) -> Answer {
    let body = small_body(ctx, body, 2 * 1024 * 1024).await?;
    let text = String::from_utf8_lossy(&body);
    let quiet = text.contains("<Quiet>true</Quiet>");
    let mut keys = Vec::new();
    for piece in text.split("<Key>").skip(1) {
        let key = piece.split("</Key>").next().unwrap_or("");
        keys.push(
            quick_xml::escape::unescape(key)
                .map(|k| k.into_owned())
                .unwrap_or_else(|_| key.to_string()),
        );
    }
    if keys.len() > 1000 {
        return Err(S3Error::new(
            400,
            "MalformedXML",
            "At most 1000 keys per DeleteObjects request",
        ));
    }
    let mut out = format!("{HEADER}<DeleteResult xmlns=\"{NS}\">");
    for key in keys {
        match remove_key(state, &ctx.bucket, &key, None) {
            Ok(()) if quiet => {}
            Ok(()) => {
                out.push_str("<Deleted>");
                el(&mut out, "Key", &key);
                out.push_str("</Deleted>");
            }
            Err(e) => {
                out.push_str("<Error>");
                el(&mut out, "Key", &key);
                el(&mut out, "Code", e.code);
                el(&mut out, "Message", &e.message);
                out.push_str("</Error>");
            }
        }
    }
    out.push_str("</DeleteResult>");
    Ok(xml_response(out))
}
