//! What the tests of mount-s3's request flags need from the service: buckets that allow anonymous reads (a
//! public bucket policy), access point aliases that stand for a bucket, and a record of the headers recent
//! requests carried (`GET /_emulator/requests`), so a test can see what the client sent.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use http::HeaderMap;

/// Requests kept by the record, newest last; older ones are dropped.
const RECORD_LIMIT: usize = 1000;

/// Query parameters left out of the record: a presigned request's credentials.
const SECRET_PARAMS: &[&str] = &[
    "x-amz-signature",
    "x-amz-security-token",
    "x-amz-s3session-token",
    "x-amz-credential",
];

/// `query` without the parameters of [`SECRET_PARAMS`].
fn without_secrets(query: &str) -> String {
    query
        .split('&')
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or("");
            !pair.is_empty() && !SECRET_PARAMS.contains(&name.to_ascii_lowercase().as_str())
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// Headers left out of the record: credentials.
const SECRET_HEADERS: &[&str] = &[
    "authorization",
    "x-amz-s3session-token",
    "x-amz-security-token",
];

#[derive(Debug, Default)]
pub struct Access {
    public: Mutex<HashSet<String>>,
    aliases: Mutex<HashMap<String, String>>,
    record: Mutex<Record>,
}

#[derive(Debug, Default)]
struct Record {
    on: bool,
    entries: VecDeque<serde_json::Value>,
}

impl Access {
    pub fn new(public: &[String], aliases: &[(String, String)], record: bool) -> Access {
        let access = Access::default();
        for bucket in public {
            access.set_public(bucket);
        }
        for (alias, bucket) in aliases {
            access.set_alias(alias, bucket);
        }
        access.set_recording(record);
        access
    }

    /// Anonymous GET, HEAD and LIST are served for this bucket (general purpose buckets only: S3 Express has
    /// no anonymous access).
    pub fn set_public(&self, bucket: &str) {
        lock(&self.public).insert(bucket.to_string());
    }

    pub fn is_public(&self, bucket: &str) -> bool {
        lock(&self.public).contains(bucket)
    }

    /// An access point alias (`name-...-s3alias`) that addresses `bucket`; also an access point's host label
    /// (`NAME-ACCOUNT`, the first label of the host an access point ARN resolves to).
    pub fn set_alias(&self, alias: &str, bucket: &str) {
        lock(&self.aliases).insert(alias.to_string(), bucket.to_string());
    }

    pub fn is_alias(&self, name: &str) -> bool {
        lock(&self.aliases).contains_key(name)
    }

    /// The bucket an alias stands for; the name itself otherwise.
    pub fn resolve(&self, name: String) -> String {
        lock(&self.aliases).get(&name).cloned().unwrap_or(name)
    }

    pub fn set_recording(&self, on: bool) {
        let mut record = lock(&self.record);
        record.on = on;
        if !on {
            record.entries.clear();
        }
    }

    /// Keeps one request's headers (names in lower case, credentials left out) when recording is on.
    pub fn record(&self, op: &str, bucket: &str, key: &str, query: &str, headers: &HeaderMap) {
        let mut record = lock(&self.record);
        if !record.on {
            return;
        }
        let mut fields = serde_json::Map::new();
        for (name, value) in headers {
            if SECRET_HEADERS.contains(&name.as_str()) {
                continue;
            }
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            fields.insert(name.as_str().to_string(), serde_json::Value::String(value));
        }
        let signed = headers.contains_key("authorization");
        let query = without_secrets(query);
        if record.entries.len() == RECORD_LIMIT {
            record.entries.pop_front();
        }
        record.entries.push_back(serde_json::json!({
            "op": op, "bucket": bucket, "key": key, "query": query, "signed": signed, "headers": fields,
        }));
    }

    /// The recorded requests matching the filters given (bucket, key, op), oldest first, as JSON.
    pub fn recorded(&self, bucket: Option<&str>, key: Option<&str>, op: Option<&str>) -> String {
        let record = lock(&self.record);
        let matches = |entry: &serde_json::Value, field: &str, want: Option<&str>| {
            want.is_none_or(|w| entry[field].as_str() == Some(w))
        };
        let list: Vec<&serde_json::Value> = record
            .entries
            .iter()
            .filter(|e| {
                matches(e, "bucket", bucket) && matches(e, "key", key) && matches(e, "op", op)
            })
            .collect();
        serde_json::to_string(&list).unwrap_or_else(|_| "[]".into())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What an anonymous request may do on a public bucket: read.
pub fn anonymous_may(op: &str) -> bool {
    matches!(
        op,
        "GetObject" | "HeadObject" | "ListObjectsV2" | "HeadBucket" | "GetBucketLocation"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_filter_and_leave_credentials_out() {
        let access = Access::new(
            &["pub".into()],
            &[("ap-x-s3alias".into(), "b".into())],
            false,
        );
        assert!(access.is_public("pub") && !access.is_public("b"));
        assert_eq!(access.resolve("ap-x-s3alias".into()), "b");
        assert_eq!(access.resolve("other".into()), "other");
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "AWS4-HMAC-SHA256 secret".parse().unwrap());
        headers.insert("x-amz-storage-class", "STANDARD_IA".parse().unwrap());
        access.record("PutObject", "b", "k", "", &headers);
        assert_eq!(access.recorded(None, None, None), "[]", "off by default");
        access.set_recording(true);
        access.record("PutObject", "b", "k", "", &headers);
        access.record(
            "GetObject",
            "b",
            "k",
            "partNumber=2&X-Amz-Credential=AKID%2F&X-Amz-Signature=abc&x-id=GetObject",
            &HeaderMap::new(),
        );
        let put: serde_json::Value =
            serde_json::from_str(&access.recorded(Some("b"), Some("k"), Some("PutObject")))
                .unwrap();
        assert_eq!(put.as_array().unwrap().len(), 1);
        assert_eq!(put[0]["headers"]["x-amz-storage-class"], "STANDARD_IA");
        assert!(put[0]["headers"].get("authorization").is_none());
        assert_eq!(put[0]["signed"], true);
        let all: serde_json::Value =
            serde_json::from_str(&access.recorded(None, None, None)).unwrap();
        assert_eq!(all.as_array().unwrap().len(), 2);
        assert_eq!(
            all[1]["query"], "partNumber=2&x-id=GetObject",
            "presigned credentials left out"
        );
        assert!(anonymous_may("GetObject") && !anonymous_may("PutObject"));
    }
}
