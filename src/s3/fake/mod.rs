//! In-memory [`ObjectClient`] for tests of the core. Follows the service's rules that the core relies on
//! (conditional writes, append offsets, rename, multipart checks, directory-bucket listing shape) but not its
//! protocol; `tests/client_conformance.rs` runs the same checks against it and against the SDK client on
//! the emulator, so the two cannot drift apart. Counts requests per operation and injects faults
//! ([`FaultPlan`]). Built only for tests (`cfg(test)` or the `testing` feature).

mod faults;

pub use faults::{Counts, FaultPlan, Gate, Op, transient};

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;

use super::{
    ClientError, ListPage, ObjectClient, ObjectInfo, PutResult, UploadedPart, UserMetadata,
    WriteCondition,
};
use faults::Counters;

/// Every part of a multipart upload but the last must be at least this big (as in the service).
const MIN_PART_SIZE: usize = 5 * 1024 * 1024;
const MAX_PART_NUMBER: i32 = 10_000;
const MAX_LIST_KEYS: usize = 1000;

#[derive(Clone)]
struct Stored {
    data: Bytes,
    etag: String,
    modified: SystemTime,
    metadata: UserMetadata,
}

struct Upload {
    key: String,
    /// Part number -> (ETag, bytes).
    parts: BTreeMap<i32, (String, Bytes)>,
    metadata: UserMetadata,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Stored>,
    uploads: HashMap<String, Upload>,
    /// Completed uploads: (upload id, key, the parts asked for as (number, ETag)) and what completing gave. As
    /// S3 answers, a Complete sent again with the same parts gets the same result.
    completed: HashMap<(String, String), CompletedUpload>,
}

/// The parts a completed upload was completed with, as (number, ETag), and what completing gave.
type CompletedUpload = (Vec<(i32, String)>, PutResult);

pub struct FakeClient {
    bucket: String,
    directory: bool,
    state: Mutex<State>,
    /// Source of unique ETags and upload ids.
    serial: AtomicU64,
    counters: Counters,
    faults: FaultPlan,
}

impl FakeClient {
    pub fn new(bucket: &str, directory: bool) -> FakeClient {
        FakeClient {
            bucket: bucket.into(),
            directory,
            state: Mutex::new(State::default()),
            serial: AtomicU64::new(1),
            counters: Counters::default(),
            faults: FaultPlan::default(),
        }
    }

    /// Requests of `op` sent so far.
    pub fn count(&self, op: Op) -> u64 {
        self.counts().get(op)
    }

    /// Requests sent so far, per operation.
    pub fn counts(&self) -> Counts {
        self.counters.snapshot()
    }

    /// Faults to inject into later requests.
    pub fn faults(&self) -> &FaultPlan {
        &self.faults
    }

    /// The stored bytes of `key`, for assertions (not a request).
    pub fn object(&self, key: &str) -> Option<Bytes> {
        self.state().objects.get(key).map(|s| s.data.clone())
    }

    /// Multipart uploads neither completed nor aborted (not a request).
    pub fn open_uploads(&self) -> usize {
        self.state().uploads.len()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one request of `op` and fails it if the fault plan says so.
    fn send(&self, op: Op) -> Result<(), ClientError> {
        self.counters.add(op);
        match self.faults.take_failure(op) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Hands an answer back, after the gate of `op` if the test holds it.
    async fn answer<T>(&self, op: Op, result: Result<T, ClientError>) -> Result<T, ClientError> {
        self.faults.pass(op).await;
        result
    }

    fn etag(&self) -> String {
        format!("\"fake-{}\"", self.serial.fetch_add(1, Ordering::Relaxed))
    }

    fn list_page(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        continuation_token: Option<&str>,
        max_keys: i32,
    ) -> Result<ListPage, ClientError> {
        if self.directory {
            if delimiter.is_some_and(|d| d != "/") {
                return Err(invalid_argument(
                    "Directory buckets support only '/' as a delimiter",
                ));
            }
            if !prefix.is_empty() && !prefix.ends_with('/') {
                return Err(invalid_argument(
                    "Directory buckets support only prefixes that end in the delimiter '/'",
                ));
            }
        }
        let state = self.state();
        // Directory buckets list in an order of their own (here a hash of the key), not by name, so the core
        // cannot come to rely on sorted listings; general-purpose buckets list by key.
        let order = |key: &str| if self.directory { fnv1a(key) } else { 0 };
        let mut walk: Vec<(u64, &str, Option<&Stored>)> = state
            .objects
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, s)| (order(k), k.as_str(), Some(s)))
            .collect();
        // A delimited listing of a directory bucket also shows the keys of uploads in progress, as prefixes.
        if self.directory && delimiter.is_some() {
            for upload in state.uploads.values() {
                if upload.key.starts_with(prefix) && !state.objects.contains_key(&upload.key) {
                    walk.push((order(&upload.key), upload.key.as_str(), None));
                }
            }
        }
        walk.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        walk.dedup_by(|a, b| a.1 == b.1);
        // A token is the position of the last entry a page took: the next page starts after it.
        let mut i = match continuation_token {
            None => 0,
            Some(token) => {
                let (o, k) = token
                    .split_once(':')
                    .and_then(|(o, k)| Some((u64::from_str_radix(o, 16).ok()?, k)))
                    .ok_or_else(|| {
                        invalid_argument("The continuation token provided is incorrect")
                    })?;
                walk.partition_point(|e| (e.0, e.1) <= (o, k))
            }
        };
        let max_keys = max_keys.clamp(0, MAX_LIST_KEYS as i32) as usize;
        let mut page = ListPage::default();
        let mut taken = 0;
        while i < walk.len() && max_keys > 0 {
            if taken == max_keys {
                let (o, k, _) = walk[i - 1];
                page.next_continuation_token = Some(format!("{o:016x}:{k}"));
                break;
            }
            let (_, key, stored) = walk[i];
            i += 1;
            match common_prefix(key, prefix, delimiter) {
                // In key order the prefix stands for the run of keys under it: take them all, so no later page
                // repeats it. In hash order they are scattered, and a later page may repeat it (as the service
                // does on directory buckets).
                Some(cp) => {
                    while !self.directory && i < walk.len() && walk[i].1.starts_with(&cp) {
                        i += 1;
                    }
                    if !page.common_prefixes.contains(&cp) {
                        page.common_prefixes.push(cp);
                        taken += 1;
                    }
                }
                None => {
                    if let Some(s) = stored {
                        // Listings carry no user metadata.
                        page.objects.push(ObjectInfo {
                            metadata: UserMetadata::new(),
                            ..info(key, s)
                        });
                        taken += 1;
                    }
                }
            }
        }
        Ok(page)
    }

    fn check(
        &self,
        state: &State,
        key: &str,
        condition: &WriteCondition,
    ) -> Result<(), ClientError> {
        match (condition, state.objects.get(key)) {
            (WriteCondition::IfNoneMatch, Some(_)) => {
                Err(ClientError::PreconditionFailed { key: key.into() })
            }
            (WriteCondition::IfMatch(_), None) => Err(ClientError::NotFound { key: key.into() }),
            (WriteCondition::IfMatch(e), Some(s)) if *e != s.etag => {
                Err(ClientError::PreconditionFailed { key: key.into() })
            }
            _ => Ok(()),
        }
    }

    fn store(
        &self,
        state: &mut State,
        key: &str,
        data: Bytes,
        metadata: UserMetadata,
    ) -> PutResult {
        let etag = self.etag();
        let size = data.len() as u64;
        state.objects.insert(
            key.into(),
            Stored {
                data,
                etag: etag.clone(),
                modified: SystemTime::now(),
                metadata,
            },
        );
        PutResult {
            etag,
            size: Some(size),
        }
    }

    fn get(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<Bytes, ClientError> {
        let state = self.state();
        let s = state
            .objects
            .get(key)
            .ok_or_else(|| ClientError::NotFound { key: key.into() })?;
        if if_match.is_some_and(|e| e != s.etag) {
            return Err(ClientError::PreconditionFailed { key: key.into() });
        }
        // Clamped to the object; a range that starts at or past its end is empty (the client's rule: the
        // service's InvalidRange there means "nothing to read").
        let len = s.data.len() as u64;
        let start = range.start.min(len);
        Ok(s.data
            .slice(start as usize..range.end.clamp(start, len) as usize))
    }

    fn append(
        &self,
        key: &str,
        offset: u64,
        body: Bytes,
        condition: &WriteCondition,
    ) -> Result<PutResult, ClientError> {
        if !self.directory {
            return Err(ClientError::NotSupported("append".into()));
        }
        if body.is_empty() {
            // As S3 Express answers.
            return Err(ClientError::Service {
                status: 400,
                code: "InvalidRequest".into(),
                message: "Request body cannot be empty when 'write offset' is specified.".into(),
            });
        }
        let mut state = self.state();
        self.check(&state, key, condition)?;
        let (current, metadata) = state
            .objects
            .get(key)
            .map(|s| (s.data.clone(), s.metadata.clone()))
            .unwrap_or_default();
        if current.len() as u64 != offset {
            return Err(ClientError::InvalidWriteOffset {
                key: key.into(),
                message: "offset mismatch".into(),
            });
        }
        let mut data = current.to_vec();
        data.extend_from_slice(&body);
        Ok(self.store(&mut state, key, Bytes::from(data), metadata))
    }

    fn upload(
        &self,
        key: &str,
        upload_id: &str,
        part_number: i32,
        body: Bytes,
    ) -> Result<UploadedPart, ClientError> {
        if !(1..=MAX_PART_NUMBER).contains(&part_number) {
            return Err(invalid_argument(
                "Part number must be an integer between 1 and 10000, inclusive",
            ));
        }
        let etag = self.etag();
        let mut state = self.state();
        let upload = state
            .uploads
            .get_mut(upload_id)
            .filter(|u| u.key == key)
            .ok_or_else(|| ClientError::UploadGone { key: key.into() })?;
        upload.parts.insert(part_number, (etag.clone(), body));
        Ok(UploadedPart {
            part_number,
            etag,
            checksum: None,
        })
    }

    fn complete(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[UploadedPart],
        condition: &WriteCondition,
    ) -> Result<PutResult, ClientError> {
        let mut state = self.state();
        let asked: Vec<(i32, String)> = parts
            .iter()
            .map(|p| (p.part_number, p.etag.trim_matches('"').to_string()))
            .collect();
        let Some(upload) = state.uploads.get(upload_id).filter(|u| u.key == key) else {
            return match state
                .completed
                .get(&(upload_id.to_string(), key.to_string()))
            {
                Some((done, result)) if *done == asked => Ok(result.clone()),
                _ => Err(ClientError::UploadGone { key: key.into() }),
            };
        };
        let mut data = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            if i > 0 && p.part_number <= parts[i - 1].part_number {
                return Err(service_error("InvalidPartOrder"));
            }
            if self.directory && p.part_number != i as i32 + 1 {
                return Err(service_error("InvalidPartOrder"));
            }
            let stored = match upload.parts.get(&p.part_number) {
                Some((etag, bytes)) if etag.trim_matches('"') == p.etag.trim_matches('"') => bytes,
                _ => return Err(service_error("InvalidPart")),
            };
            if i + 1 < parts.len() && stored.len() < MIN_PART_SIZE {
                return Err(service_error("EntityTooSmall"));
            }
            data.extend_from_slice(stored);
        }
        self.check(&state, key, condition)?;
        let metadata = state
            .uploads
            .remove(upload_id)
            .map(|u| u.metadata)
            .unwrap_or_default();
        let result = self.store(&mut state, key, Bytes::from(data), metadata);
        state.completed.insert(
            (upload_id.to_string(), key.to_string()),
            (asked, result.clone()),
        );
        Ok(result)
    }

    fn rename(
        &self,
        source_key: &str,
        destination_key: &str,
        condition: &WriteCondition,
    ) -> Result<(), ClientError> {
        if !self.directory {
            return Err(ClientError::NotSupported("rename".into()));
        }
        // The service's RenameObject does not move keys that end in the delimiter (directory markers).
        if source_key.ends_with('/') || destination_key.ends_with('/') {
            return Err(ClientError::NotSupported(
                "rename of a key ending in '/'".into(),
            ));
        }
        let mut state = self.state();
        // The source is checked first; every failure names the source key, as the SDK client reports it,
        // except a refused destination precondition.
        let source_missing = || ClientError::NotFound {
            key: source_key.into(),
        };
        if !state.objects.contains_key(source_key) {
            return Err(source_missing());
        }
        self.check(&state, destination_key, condition)
            .map_err(|e| match e {
                ClientError::NotFound { .. } => source_missing(),
                other => other,
            })?;
        if source_key != destination_key {
            // RenameObject moves the object as it is, its last-modified date included.
            let moved = state.objects.remove(source_key).expect("checked above");
            state.objects.insert(destination_key.into(), moved);
        }
        Ok(())
    }

    fn copy(
        &self,
        source_key: &str,
        source_if_match: Option<&str>,
        destination_key: &str,
        condition: &WriteCondition,
    ) -> Result<PutResult, ClientError> {
        let mut state = self.state();
        let source = state
            .objects
            .get(source_key)
            .ok_or_else(|| ClientError::NotFound {
                key: source_key.into(),
            })?;
        if source.data.len() as u64 > super::MAX_COPY_OBJECT_SIZE {
            return Err(invalid_argument(
                "The specified copy source is larger than the maximum allowable size for a copy source",
            ));
        }
        if source_if_match.is_some_and(|etag| etag != source.etag) {
            let refused = match condition {
                WriteCondition::None => source_key,
                _ => destination_key,
            };
            return Err(ClientError::PreconditionFailed {
                key: refused.into(),
            });
        }
        let (data, metadata) = (source.data.clone(), source.metadata.clone());
        self.check(&state, destination_key, condition)?;
        Ok(self.store(&mut state, destination_key, data, metadata))
    }

    fn replace_metadata(
        &self,
        key: &str,
        metadata: &UserMetadata,
        if_match: &str,
    ) -> Result<PutResult, ClientError> {
        let mut state = self.state();
        let data = match state.objects.get(key) {
            None => return Err(ClientError::NotFound { key: key.into() }),
            Some(s) if s.etag != if_match => {
                return Err(ClientError::PreconditionFailed { key: key.into() });
            }
            Some(s) => s.data.clone(),
        };
        if data.len() as u64 > super::MAX_COPY_OBJECT_SIZE {
            return Err(invalid_argument(
                "The specified copy source is larger than the maximum allowable size for a copy source",
            ));
        }
        let mut result = self.store(&mut state, key, data, metadata.clone());
        // CopyObject reports no size.
        result.size = None;
        Ok(result)
    }
}

fn info(key: &str, s: &Stored) -> ObjectInfo {
    ObjectInfo {
        key: key.into(),
        size: s.data.len() as u64,
        etag: s.etag.clone(),
        last_modified: s.modified,
        metadata: s.metadata.clone(),
    }
}

/// A stable hash of a key (FNV-1a): the listing order of the fake's directory buckets.
fn fnv1a(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Where `key` rolls up under the delimiter, if it does.
fn common_prefix(key: &str, prefix: &str, delimiter: Option<&str>) -> Option<String> {
    let d = delimiter?;
    let rest = &key[prefix.len()..];
    rest.find(d)
        .map(|i| format!("{prefix}{}", &rest[..i + d.len()]))
}

fn service_error(code: &str) -> ClientError {
    ClientError::Service {
        status: 400,
        code: code.into(),
        message: String::new(),
    }
}

fn invalid_argument(message: &str) -> ClientError {
    ClientError::Service {
        status: 400,
        code: "InvalidArgument".into(),
        message: message.into(),
    }
}

#[async_trait]
impl ObjectClient for FakeClient {
    fn bucket(&self) -> &str {
        &self.bucket
    }

    fn is_directory_bucket(&self) -> bool {
        self.directory
    }

    async fn head_bucket(&self) -> Result<(), ClientError> {
        self.send(Op::HeadBucket)?;
        self.answer(Op::HeadBucket, Ok(())).await
    }

    async fn head_object(&self, key: &str) -> Result<ObjectInfo, ClientError> {
        self.send(Op::Head)?;
        let result = self
            .state()
            .objects
            .get(key)
            .map(|s| info(key, s))
            .ok_or_else(|| ClientError::NotFound { key: key.into() });
        self.answer(Op::Head, result).await
    }

    async fn list_objects(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        continuation_token: Option<&str>,
        max_keys: i32,
    ) -> Result<ListPage, ClientError> {
        self.send(Op::List)?;
        if continuation_token.is_none() && self.faults().take_empty_first_page() {
            // A token before every entry: the next page is the first one there would have been.
            let empty = ListPage {
                next_continuation_token: Some(format!("{:016x}:", 0)),
                ..ListPage::default()
            };
            return self.answer(Op::List, Ok(empty)).await;
        }
        let result = self.list_page(prefix, delimiter, continuation_token, max_keys);
        self.answer(Op::List, result).await
    }

    async fn get_object(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<Bytes, ClientError> {
        // The SDK client sends nothing for an empty range.
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        self.send(Op::Get)?;
        let result = self.get(key, range, if_match);
        self.answer(Op::Get, result).await
    }

    async fn put_object_with_metadata(
        &self,
        key: &str,
        body: Bytes,
        condition: WriteCondition,
        metadata: &UserMetadata,
    ) -> Result<PutResult, ClientError> {
        self.send(Op::Put)?;
        let result = {
            let mut state = self.state();
            self.check(&state, key, &condition)
                .map(|()| self.store(&mut state, key, body, metadata.clone()))
        };
        self.answer(Op::Put, result).await
    }

    async fn append_object(
        &self,
        key: &str,
        offset: u64,
        body: Bytes,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        self.send(Op::Append)?;
        let result = self.append(key, offset, body, &condition);
        self.answer(Op::Append, result).await
    }

    async fn create_multipart_upload_with_metadata(
        &self,
        key: &str,
        metadata: &UserMetadata,
    ) -> Result<String, ClientError> {
        self.send(Op::CreateUpload)?;
        let id = format!("upload-{}", self.serial.fetch_add(1, Ordering::Relaxed));
        self.state().uploads.insert(
            id.clone(),
            Upload {
                key: key.into(),
                parts: BTreeMap::new(),
                metadata: metadata.clone(),
            },
        );
        self.answer(Op::CreateUpload, Ok(id)).await
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        part_number: i32,
        body: Bytes,
    ) -> Result<UploadedPart, ClientError> {
        self.send(Op::UploadPart)?;
        let result = self.upload(key, upload_id, part_number, body);
        self.answer(Op::UploadPart, result).await
    }

    async fn upload_part_copy(
        &self,
        key: &str,
        upload_id: &str,
        part_number: i32,
        source_key: &str,
        range: Range<u64>,
        source_etag: &str,
    ) -> Result<UploadedPart, ClientError> {
        self.send(Op::UploadPartCopy)?;
        let source = self.state().objects.get(source_key).cloned();
        let result = match source {
            None => Err(ClientError::NotFound {
                key: source_key.into(),
            }),
            Some(s) if s.etag != source_etag => Err(ClientError::PreconditionFailed {
                key: source_key.into(),
            }),
            Some(s) if s.data.len() <= MIN_PART_SIZE => Err(invalid_argument(
                "The specified copy source is not supported as a byte-range copy source.",
            )),
            Some(s) if range.start >= range.end || range.end > s.data.len() as u64 => Err(
                invalid_argument("Range specified is not valid for the source object"),
            ),
            Some(s) => {
                let body = s.data.slice(range.start as usize..range.end as usize);
                self.upload(key, upload_id, part_number, body)
            }
        };
        self.answer(Op::UploadPartCopy, result).await
    }

    async fn complete_multipart_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<UploadedPart>,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        self.send(Op::CompleteUpload)?;
        let result = self.complete(key, upload_id, &parts, &condition);
        self.answer(Op::CompleteUpload, result).await
    }

    async fn abort_multipart_upload(&self, key: &str, upload_id: &str) -> Result<(), ClientError> {
        self.send(Op::AbortUpload)?;
        let result = {
            let mut state = self.state();
            match state.uploads.get(upload_id) {
                Some(u) if u.key == key => {
                    state.uploads.remove(upload_id);
                    Ok(())
                }
                _ => Err(ClientError::UploadGone { key: key.into() }),
            }
        };
        self.answer(Op::AbortUpload, result).await
    }

    async fn delete_object(&self, key: &str) -> Result<(), ClientError> {
        self.send(Op::Delete)?;
        self.state().objects.remove(key);
        self.answer(Op::Delete, Ok(())).await
    }

    async fn copy_object(
        &self,
        source_key: &str,
        source_if_match: Option<&str>,
        destination_key: &str,
        destination_condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        self.send(Op::Copy)?;
        let result = self.copy(
            source_key,
            source_if_match,
            destination_key,
            &destination_condition,
        );
        self.answer(Op::Copy, result).await
    }

    async fn replace_metadata(
        &self,
        key: &str,
        metadata: &UserMetadata,
        if_match: &str,
    ) -> Result<PutResult, ClientError> {
        self.send(Op::Copy)?;
        let result = self.replace_metadata(key, metadata, if_match);
        self.answer(Op::Copy, result).await
    }

    async fn rename_object(
        &self,
        source_key: &str,
        destination_key: &str,
        destination_condition: WriteCondition,
    ) -> Result<(), ClientError> {
        self.send(Op::Rename)?;
        let result = self.rename(source_key, destination_key, &destination_condition);
        self.answer(Op::Rename, result).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn planned_failures_hit_the_next_requests_of_their_operation_only() {
        let fake = FakeClient::new("b", true);
        fake.put_object("k", Bytes::from_static(b"v"), WriteCondition::None)
            .await
            .unwrap();
        fake.faults().fail_next(Op::Get, 2, transient());
        assert_eq!(fake.head_object("k").await.unwrap().size, 1);
        for _ in 0..2 {
            assert_eq!(fake.get_object("k", 0..1, None).await, Err(transient()));
        }
        assert_eq!(&fake.get_object("k", 0..1, None).await.unwrap()[..], b"v");
        // Failed requests were sent all the same; assertion helpers send none.
        fake.object("k");
        let counts = fake.counts();
        assert_eq!(
            (
                counts.get(Op::Put),
                counts.get(Op::Head),
                counts.get(Op::Get)
            ),
            (1, 1, 3)
        );
        assert_eq!(counts.total(), 5);
        assert_eq!(fake.count(Op::List), 0);
    }

    #[tokio::test]
    async fn directory_buckets_list_out_of_key_order() {
        let keys: Vec<String> = (b'a'..=b'z').map(|c| format!("{}", c as char)).collect();
        for directory in [true, false] {
            let fake = FakeClient::new("b", directory);
            for k in &keys {
                fake.put_object(k, Bytes::new(), WriteCondition::None)
                    .await
                    .unwrap();
            }
            let page = fake.list_objects("", Some("/"), None, 1000).await.unwrap();
            let listed: Vec<String> = page.objects.into_iter().map(|o| o.key).collect();
            assert_eq!(listed != keys, directory, "{listed:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_operation_answers_when_its_gate_lets_it() {
        let fake = Arc::new(FakeClient::new("b", true));
        let gate = fake.faults().hold(Op::List);
        let list = |fake: &Arc<FakeClient>| {
            let fake = Arc::clone(fake);
            tokio::spawn(async move { fake.list_objects("", Some("/"), None, 10).await })
        };
        let first = list(&fake);
        while gate.held() == 0 {
            tokio::task::yield_now().await;
        }
        // The listing read the bucket before this write: it answers without the new key.
        fake.put_object("late", Bytes::new(), WriteCondition::None)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!first.is_finished(), "answered through a closed gate");
        gate.release(1);
        assert!(first.await.unwrap().unwrap().objects.is_empty());
        gate.open();
        assert_eq!(list(&fake).await.unwrap().unwrap().objects.len(), 1);
        assert_eq!(gate.held(), 0);
    }
}
