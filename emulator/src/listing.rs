//! ListObjectsV2. General-purpose buckets list in key order. Directory buckets list in a hash order (not
//! by name), allow only `/` as delimiter and prefixes ending in `/`, show prefixes of in-progress multipart
//! uploads, and may repeat a common prefix on later pages, as the real service does.

use std::collections::HashSet;
use std::sync::Arc;

use base64::Engine;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use crate::error::S3Error;
use crate::server::{Answer, Ctx, State, xml_response};
use crate::store::{Bucket, Object};
use crate::xml::{self, HEADER, NS, el};

/// `encoding-type=url` escapes everything but unreserved characters and `/`.
const URL_KEEP: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

enum Entry {
    Object(String, Arc<Object>),
    Prefix(String),
}

struct Page {
    entries: Vec<Entry>,
    next_token: Option<String>,
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

fn unb64(s: &str) -> Option<String> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
}

fn bad_token() -> S3Error {
    S3Error::invalid_argument("The continuation token provided is incorrect")
}

pub fn list_objects_v2(state: &Arc<State>, ctx: &Ctx) -> Answer {
    let prefix = ctx.q("prefix").unwrap_or("").to_string();
    let delimiter = ctx
        .q("delimiter")
        .filter(|d| !d.is_empty())
        .map(str::to_string);
    let max_keys: usize = match ctx.q("max-keys") {
        None => 1000,
        Some(v) => v
            .parse::<i64>()
            .map_err(|_| S3Error::invalid_argument("max-keys must be an integer"))?
            .clamp(0, 1000) as usize,
    };
    let token = ctx.q("continuation-token").map(str::to_string);
    let start_after = ctx
        .q("start-after")
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let url_encode = match ctx.q("encoding-type") {
        None => false,
        Some("url") => true,
        Some(other) => {
            return Err(S3Error::invalid_argument(format!(
                "Invalid Encoding Method specified in Request: {other}"
            )));
        }
    };

    let buckets = state.store.buckets();
    let bucket = buckets
        .get(&ctx.bucket)
        .ok_or_else(S3Error::no_such_bucket)?;
    let page = if bucket.directory {
        if delimiter.as_deref().is_some_and(|d| d != "/") {
            return Err(S3Error::invalid_argument(
                "Directory buckets support only '/' as a delimiter",
            ));
        }
        if !prefix.is_empty() && !prefix.ends_with('/') {
            return Err(S3Error::invalid_argument(
                "Directory buckets support only prefixes that end in the delimiter '/'",
            ));
        }
        if start_after.is_some() {
            return Err(S3Error::invalid_argument(
                "StartAfter is not supported for directory buckets",
            ));
        }
        list_hash_order(
            bucket,
            &prefix,
            delimiter.as_deref(),
            max_keys,
            token.as_deref(),
        )?
    } else {
        list_key_order(
            bucket,
            &prefix,
            delimiter.as_deref(),
            max_keys,
            token.as_deref(),
            start_after.as_deref(),
        )?
    };
    let storage_class = if bucket.directory {
        "EXPRESS_ONEZONE"
    } else {
        "STANDARD"
    };
    drop(buckets);

    let enc = |s: &str| {
        if url_encode {
            utf8_percent_encode(s, URL_KEEP).to_string()
        } else {
            s.to_string()
        }
    };
    let key_count = page.entries.len();
    let mut out = String::with_capacity(256 + key_count * 200);
    out.push_str(HEADER);
    out.push_str(&format!("<ListBucketResult xmlns=\"{NS}\">"));
    el(&mut out, "Name", &ctx.bucket);
    el(&mut out, "Prefix", &enc(&prefix));
    if let Some(d) = &delimiter {
        el(&mut out, "Delimiter", &enc(d));
    }
    el(&mut out, "MaxKeys", &max_keys.to_string());
    el(&mut out, "KeyCount", &key_count.to_string());
    el(
        &mut out,
        "IsTruncated",
        if page.next_token.is_some() {
            "true"
        } else {
            "false"
        },
    );
    if url_encode {
        el(&mut out, "EncodingType", "url");
    }
    if let Some(t) = &token {
        el(&mut out, "ContinuationToken", t);
    }
    if let Some(t) = &page.next_token {
        el(&mut out, "NextContinuationToken", t);
    }
    if let Some(s) = &start_after {
        el(&mut out, "StartAfter", &enc(s));
    }
    let mut prefixes = String::new();
    for entry in &page.entries {
        match entry {
            Entry::Object(key, o) => {
                out.push_str("<Contents>");
                el(&mut out, "Key", &enc(key));
                el(&mut out, "LastModified", &xml::iso8601(o.last_modified));
                el(&mut out, "ETag", &o.etag);
                el(&mut out, "Size", &o.size.to_string());
                el(&mut out, "StorageClass", storage_class);
                out.push_str("</Contents>");
            }
            Entry::Prefix(p) => {
                prefixes.push_str("<CommonPrefixes>");
                el(&mut prefixes, "Prefix", &enc(p));
                prefixes.push_str("</CommonPrefixes>");
            }
        }
    }
    out.push_str(&prefixes);
    out.push_str("</ListBucketResult>");
    Ok(xml_response(out))
}

/// Where `key` rolls up under the delimiter, if it does.
fn common_prefix(key: &str, prefix: &str, delimiter: Option<&str>) -> Option<String> {
    let d = delimiter?;
    let rest = &key[prefix.len()..];
    rest.find(d)
        .map(|i| format!("{prefix}{}", &rest[..i + d.len()]))
}

fn list_hash_order(
    bucket: &Bucket,
    prefix: &str,
    delimiter: Option<&str>,
    max_keys: usize,
    token: Option<&str>,
) -> Result<Page, S3Error> {
    let resume: Option<(u64, String)> = match token {
        None => None,
        Some(t) => {
            let raw = unb64(t).ok_or_else(bad_token)?;
            let (order, key) = raw.split_once(':').ok_or_else(bad_token)?;
            Some((
                u64::from_str_radix(order, 16).map_err(|_| bad_token())?,
                key.to_string(),
            ))
        }
    };
    // Keys of in-progress uploads show up as prefixes only (never as objects).
    let mut walk: Vec<(u64, &str, Option<&Arc<Object>>)> = bucket
        .objects
        .range(prefix.to_string()..)
        .take_while(|(k, _)| k.starts_with(prefix))
        .map(|(k, o)| (bucket.order_of(k), k.as_str(), Some(o)))
        .collect();
    if delimiter.is_some() {
        for upload in bucket.uploads.values() {
            if upload.key.starts_with(prefix) && !bucket.objects.contains_key(&upload.key) {
                walk.push((bucket.order_of(&upload.key), upload.key.as_str(), None));
            }
        }
    }
    walk.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    walk.dedup_by(|a, b| a.1 == b.1);
    let start = match &resume {
        None => 0,
        Some((order, key)) => walk.partition_point(|e| (e.0, e.1) <= (*order, key.as_str())),
    };

    let mut entries = Vec::new();
    let mut seen_prefixes = HashSet::new();
    let mut next_token = None;
    for (i, (order, key, object)) in walk.iter().enumerate().skip(start) {
        if entries.len() == max_keys {
            break;
        }
        if let Some(cp) = common_prefix(key, prefix, delimiter) {
            if seen_prefixes.insert(cp.clone()) {
                entries.push(Entry::Prefix(cp));
            }
        } else if let Some(o) = object {
            entries.push(Entry::Object(key.to_string(), Arc::clone(o)));
        } else {
            continue;
        }
        if entries.len() == max_keys && i + 1 < walk.len() {
            next_token = Some(b64(&format!("{order:016x}:{key}")));
        }
    }
    if max_keys == 0 {
        next_token = None;
    }
    Ok(Page {
        entries,
        next_token,
    })
}

fn list_key_order(
    bucket: &Bucket,
    prefix: &str,
    delimiter: Option<&str>,
    max_keys: usize,
    token: Option<&str>,
    start_after: Option<&str>,
) -> Result<Page, S3Error> {
    // Tokens say whether the last item was a key ("k:") or a rolled-up prefix ("p:") to skip past.
    let after: Option<(bool, String)> = match token {
        Some(t) => {
            let raw = unb64(t).ok_or_else(bad_token)?;
            match raw.split_at_checked(2) {
                Some(("k:", k)) => Some((false, k.to_string())),
                Some(("p:", p)) => Some((true, p.to_string())),
                _ => return Err(bad_token()),
            }
        }
        None => start_after.map(|s| (false, s.to_string())),
    };
    let mut entries = Vec::new();
    let mut last_prefix: Option<String> = None;
    let mut next_token = None;
    for (key, object) in bucket
        .objects
        .range(prefix.to_string()..)
        .take_while(|(k, _)| k.starts_with(prefix))
    {
        if let Some((is_prefix, a)) = &after
            && (key.as_str() <= a.as_str() || (*is_prefix && key.starts_with(a.as_str())))
        {
            continue;
        }
        let entry = match common_prefix(key, prefix, delimiter) {
            Some(cp) if last_prefix.as_deref() == Some(cp.as_str()) => continue,
            Some(cp) => Entry::Prefix(cp),
            None => Entry::Object(key.clone(), Arc::clone(object)),
        };
        if entries.len() == max_keys {
            next_token = Some(token_for(entries.last()));
            break;
        }
        if let Entry::Prefix(cp) = &entry {
            last_prefix = Some(cp.clone());
        }
        entries.push(entry);
    }
    if max_keys == 0 {
        next_token = None;
    }
    Ok(Page {
        entries,
        next_token,
    })
}

fn token_for(entry: Option<&Entry>) -> String {
    match entry {
        Some(Entry::Object(k, _)) => b64(&format!("k:{k}")),
        Some(Entry::Prefix(p)) => b64(&format!("p:{p}")),
        None => b64("k:"),
    }
}
