//! SigV4 request verification (header and presigned-query forms), as S3 and S3 Express check it.
//!
//! The emulator recomputes the signature from the request it received; the payload hash is whatever the
//! client declared in `x-amz-content-sha256` (the body is checked against a hex hash later, while it streams).

use hmac::{Hmac, Mac};
use http::{HeaderMap, Method};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Characters SigV4 leaves unescaped: `A-Z a-z 0-9 - _ . ~`.
const SIGV4_ESCAPE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// What a request claims about its signer, parsed from `Authorization` or the `X-Amz-*` query parameters.
#[derive(Debug, Clone)]
pub struct SignedRequest {
    pub access_key: String,
    pub date: String,
    pub region: String,
    pub service: String,
    pub signed_headers: Vec<String>,
    pub signature: String,
    pub amz_date: String,
    pub payload_hash: String,
    pub presigned: bool,
    pub expires_secs: Option<u64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthParseError {
    #[error("request is not signed")]
    Missing,
    #[error("{0}")]
    Malformed(String),
}

/// Pulls the signing claims out of the request.
pub fn parse(
    headers: &HeaderMap,
    query: &[(String, String)],
) -> Result<SignedRequest, AuthParseError> {
    if let Some(auth) = headers.get("authorization") {
        let auth = auth
            .to_str()
            .map_err(|_| AuthParseError::Malformed("non-ASCII Authorization".into()))?;
        return parse_header(auth, headers);
    }
    let q = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    if q("X-Amz-Algorithm").is_some() {
        let algorithm = q("X-Amz-Algorithm").unwrap_or_default();
        if algorithm != "AWS4-HMAC-SHA256" {
            return Err(AuthParseError::Malformed(format!(
                "unsupported algorithm {algorithm}"
            )));
        }
        let credential = q("X-Amz-Credential")
            .ok_or_else(|| AuthParseError::Malformed("no X-Amz-Credential".into()))?;
        let (access_key, date, region, service) = split_credential(&credential)?;
        let signed_headers = q("X-Amz-SignedHeaders")
            .unwrap_or_default()
            .split(';')
            .map(str::to_string)
            .collect();
        return Ok(SignedRequest {
            access_key,
            date,
            region,
            service,
            signed_headers,
            signature: q("X-Amz-Signature").unwrap_or_default(),
            amz_date: q("X-Amz-Date").unwrap_or_default(),
            payload_hash: "UNSIGNED-PAYLOAD".into(),
            presigned: true,
            expires_secs: q("X-Amz-Expires").and_then(|v| v.parse().ok()),
        });
    }
    Err(AuthParseError::Missing)
}

fn parse_header(auth: &str, headers: &HeaderMap) -> Result<SignedRequest, AuthParseError> {
    let rest = auth
        .strip_prefix("AWS4-HMAC-SHA256")
        .ok_or_else(|| AuthParseError::Malformed("only AWS4-HMAC-SHA256 is supported".into()))?;
    let (mut credential, mut signed, mut signature) = (None, None, None);
    for part in rest.split(',') {
        let part = part.trim();
        if let Some(v) = part.strip_prefix("Credential=") {
            credential = Some(v);
        } else if let Some(v) = part.strip_prefix("SignedHeaders=") {
            signed = Some(v);
        } else if let Some(v) = part.strip_prefix("Signature=") {
            signature = Some(v);
        }
    }
    let (Some(credential), Some(signed), Some(signature)) = (credential, signed, signature) else {
        return Err(AuthParseError::Malformed(
            "Authorization lacks Credential, SignedHeaders or Signature".into(),
        ));
    };
    let (access_key, date, region, service) = split_credential(credential)?;
    let header = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let payload_hash = header("x-amz-content-sha256");
    if payload_hash.is_empty() {
        return Err(AuthParseError::Malformed(
            "missing required header x-amz-content-sha256".into(),
        ));
    }
    Ok(SignedRequest {
        access_key,
        date,
        region,
        service,
        signed_headers: signed.split(';').map(str::to_string).collect(),
        signature: signature.to_string(),
        amz_date: header("x-amz-date"),
        payload_hash,
        presigned: false,
        expires_secs: None,
    })
}

fn split_credential(credential: &str) -> Result<(String, String, String, String), AuthParseError> {
    let parts: Vec<&str> = credential.split('/').collect();
    if parts.len() != 5 || parts[4] != "aws4_request" {
        return Err(AuthParseError::Malformed(format!(
            "malformed credential scope {credential:?}"
        )));
    }
    Ok((
        parts[0].into(),
        parts[1].into(),
        parts[2].into(),
        parts[3].into(),
    ))
}

/// Splits a raw query string into decoded pairs, in order.
pub fn parse_query(raw: &str) -> Vec<(String, String)> {
    raw.split('&')
        .filter(|s| !s.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
            (decode(k), decode(v))
        })
        .collect()
}

fn canonical_query(query: &[(String, String)]) -> String {
    let mut pairs: Vec<(String, String)> = query
        .iter()
        .filter(|(k, _)| k != "X-Amz-Signature")
        .map(|(k, v)| {
            (
                utf8_percent_encode(k, SIGV4_ESCAPE).to_string(),
                utf8_percent_encode(v, SIGV4_ESCAPE).to_string(),
            )
        })
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

fn canonical_header_value(headers: &HeaderMap, name: &str) -> String {
    headers
        .get_all(name)
        .iter()
        .map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The signature the request should carry if it was signed with `secret`.
pub fn expected_signature(
    signed: &SignedRequest,
    secret: &str,
    method: &Method,
    raw_path: &str,
    query: &[(String, String)],
    headers: &HeaderMap,
) -> String {
    let mut canonical = String::with_capacity(512);
    canonical.push_str(method.as_str());
    canonical.push('\n');
    canonical.push_str(if raw_path.is_empty() { "/" } else { raw_path });
    canonical.push('\n');
    canonical.push_str(&canonical_query(query));
    canonical.push('\n');
    for name in &signed.signed_headers {
        canonical.push_str(name);
        canonical.push(':');
        canonical.push_str(&canonical_header_value(headers, name));
        canonical.push('\n');
    }
    canonical.push('\n');
    canonical.push_str(&signed.signed_headers.join(";"));
    canonical.push('\n');
    canonical.push_str(&signed.payload_hash);

    let scope = format!(
        "{}/{}/{}/aws4_request",
        signed.date, signed.region, signed.service
    );
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{}\n{}\n{}",
        signed.amz_date,
        scope,
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let key = signing_key(secret, &signed.date, &signed.region, &signed.service);
    hex::encode(hmac(&key, string_to_sign.as_bytes()))
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Vec<u8> {
    let k = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, service.as_bytes());
    hmac(&k, b"aws4_request")
}

/// Constant-time comparison, so the emulator does not teach timing attacks by example.
pub fn signatures_equal(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Parses `x-amz-date` (`YYYYMMDDTHHMMSSZ`) to seconds since the epoch.
pub fn parse_amz_date(value: &str) -> Option<i64> {
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    time::PrimitiveDateTime::parse(value, format)
        .ok()
        .map(|t| t.assume_utc().unix_timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GET-object example from the AWS SigV4 documentation for S3 (published test vector).
    #[test]
    fn matches_the_published_s3_example() {
        let mut headers = HeaderMap::new();
        headers.insert("host", "examplebucket.s3.amazonaws.com".parse().unwrap());
        headers.insert("range", "bytes=0-9".parse().unwrap());
        headers.insert(
            "x-amz-content-sha256",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
                .parse()
                .unwrap(),
        );
        headers.insert("x-amz-date", "20130524T000000Z".parse().unwrap());
        let signed = SignedRequest {
            access_key: "AKIAIOSFODNN7EXAMPLE".into(),
            date: "20130524".into(),
            region: "us-east-1".into(),
            service: "s3".into(),
            signed_headers: vec![
                "host".into(),
                "range".into(),
                "x-amz-content-sha256".into(),
                "x-amz-date".into(),
            ],
            signature: String::new(),
            amz_date: "20130524T000000Z".into(),
            payload_hash: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into(),
            presigned: false,
            expires_secs: None,
        };
        let sig = expected_signature(
            &signed,
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            &Method::GET,
            "/test.txt",
            &[],
            &headers,
        );
        assert_eq!(
            sig,
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn query_is_sorted_and_reencoded() {
        let q = parse_query("prefix=a%20b%2F&list-type=2&delimiter=%2F&session");
        assert_eq!(
            canonical_query(&q),
            "delimiter=%2F&list-type=2&prefix=a%20b%2F&session="
        );
    }

    #[test]
    fn amz_dates_parse() {
        assert_eq!(parse_amz_date("19700101T000010Z"), Some(10));
        assert_eq!(parse_amz_date("garbage"), None);
    }
}
