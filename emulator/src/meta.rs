//! User metadata (`x-amz-meta-*` headers): taken from PutObject, CreateMultipartUpload and CopyObject with
//! `x-amz-metadata-directive: REPLACE`, returned on HEAD and GET.
//!
//! Size limit, from the S3 User Guide's "Working with object metadata"
//! (https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingMetadata.html): "Within the PUT request
//! header, the user-defined metadata is limited to 2 KB in size. The size of user-defined metadata is measured
//! by taking the sum of the number of bytes in the UTF-8 encoding of each key and value." Whether a key
//! counts with its `x-amz-meta-` prefix is not said; we count it (the stricter reading, so what passes here
//! passes there). Past the limit the service answers 400 MetadataTooLarge.

use http::HeaderMap;

use crate::body::ResponseBody;
use crate::error::S3Error;
use crate::store::UserMeta;

const PREFIX: &str = "x-amz-meta-";
pub const MAX_USER_META_BYTES: usize = 2 * 1024;

/// The request's user metadata, in name order. Repeated headers are joined with `,` (as HTTP does).
pub fn from_request(headers: &HeaderMap) -> Result<UserMeta, S3Error> {
    let mut meta: UserMeta = Vec::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(PREFIX) else {
            continue;
        };
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        match meta.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => {
                v.push(',');
                v.push_str(&value);
            }
            None => meta.push((key.to_string(), value)),
        }
    }
    let size: usize = meta
        .iter()
        .map(|(k, v)| PREFIX.len() + k.len() + v.len())
        .sum();
    if size > MAX_USER_META_BYTES {
        return Err(S3Error::new(
            400,
            "MetadataTooLarge",
            format!(
                "Your metadata headers exceed the maximum allowed metadata size ({size} bytes; the limit is {MAX_USER_META_BYTES})."
            ),
        ));
    }
    meta.sort();
    Ok(meta)
}

/// Adds `x-amz-meta-*` headers for `meta` to a response.
pub fn to_response(r: &mut http::Response<ResponseBody>, meta: &UserMeta) {
    for (k, v) in meta {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::try_from(format!("{PREFIX}{k}")),
            http::HeaderValue::from_str(v),
        ) {
            r.headers_mut().append(n, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::try_from(*k).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn metadata_is_collected_sorted_and_without_prefix() {
        let h = headers(&[
            ("x-amz-meta-mtime", "1700000000"),
            ("content-type", "text/plain"),
            ("x-amz-meta-mode", "33188"),
            ("x-amz-meta-mode", "x"),
        ]);
        let meta = from_request(&h).unwrap();
        assert_eq!(
            meta,
            [
                ("mode".to_string(), "33188,x".to_string()),
                ("mtime".to_string(), "1700000000".to_string())
            ]
        );
    }

    #[test]
    fn metadata_over_two_kilobytes_is_refused() {
        let room = MAX_USER_META_BYTES - "x-amz-meta-a".len();
        let exact = "v".repeat(room);
        assert!(from_request(&headers(&[("x-amz-meta-a", &exact)])).is_ok());
        let over = "v".repeat(room + 1);
        let e = from_request(&headers(&[("x-amz-meta-a", &over)])).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (400, "MetadataTooLarge"));
    }
}
