//! In-memory [`ObjectClient`] for unit tests of the core. Follows the service's rules that the core relies
//! on (conditional writes, append offsets, rename, directory-bucket listing shape) but not its protocol.
//! Integration tests use the real SDK against the emulator instead.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;

use super::{
    ClientError, ListPage, ObjectClient, ObjectInfo, PutResult, UploadedPart, WriteCondition,
};

#[derive(Clone)]
struct Stored {
    data: Bytes,
    etag: String,
    modified: SystemTime,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Stored>,
    uploads: HashMap<String, (String, BTreeMap<i32, Bytes>)>,
}

pub struct FakeClient {
    bucket: String,
    directory: bool,
    state: Mutex<State>,
    counter: AtomicU64,
    pub requests: AtomicU64,
    /// GETs still to fail with a transient error (fault injection for unit tests).
    failing_gets: AtomicU64,
    /// While set, a listing reads the bucket and then waits here before it answers, so a test can change
    /// the bucket between the two (a listing answered from before the change).
    list_gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
}

impl FakeClient {
    pub fn new(bucket: &str, directory: bool) -> FakeClient {
        FakeClient {
            bucket: bucket.into(),
            directory,
            state: Mutex::new(State::default()),
            counter: AtomicU64::new(1),
            requests: AtomicU64::new(0),
            failing_gets: AtomicU64::new(0),
            list_gate: Mutex::new(None),
        }
    }

    /// Holds every listing, after it read the bucket, until the returned gate gets permits.
    pub fn hold_lists(&self) -> Arc<tokio::sync::Semaphore> {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        *self.list_gate.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&gate));
        gate
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn etag(&self) -> String {
        format!("\"fake-{}\"", self.counter.fetch_add(1, Ordering::Relaxed))
    }

    /// The stored bytes of `key`, for assertions.
    pub fn object(&self, key: &str) -> Option<Bytes> {
        self.state().objects.get(key).map(|s| s.data.clone())
    }

    /// Makes the next `n` GETs fail as if retries were exhausted.
    pub fn fail_next_gets(&self, n: u64) {
        self.failing_gets.store(n, Ordering::SeqCst);
    }

    pub fn open_uploads(&self) -> usize {
        self.state().uploads.len()
    }

    fn list_page(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        continuation_token: Option<&str>,
        max_keys: i32,
    ) -> ListPage {
        let state = self.state();
        let after = continuation_token.unwrap_or("");
        let mut page = ListPage::default();
        let mut count = 0;
        for (key, s) in state
            .objects
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
        {
            if key.as_str() <= after {
                continue;
            }
            let rest = &key[prefix.len()..];
            let rolled = delimiter.and_then(|d| {
                rest.find(d)
                    .map(|i| format!("{prefix}{}", &rest[..i + d.len()]))
            });
            if let Some(cp) = rolled {
                if page.common_prefixes.last() == Some(&cp) {
                    continue;
                }
                if count == max_keys {
                    page.next_continuation_token = Some(key.clone());
                    break;
                }
                page.common_prefixes.push(cp);
            } else {
                if count == max_keys {
                    page.next_continuation_token = Some(key.clone());
                    break;
                }
                page.objects.push(info(key, s));
            }
            count += 1;
        }
        // Resume just before the next item (tokens are exclusive lower bounds).
        if let Some(next) = &page.next_continuation_token {
            let prev: String = state
                .objects
                .range(..next.clone())
                .next_back()
                .map(|(k, _)| k.clone())
                .unwrap_or_default();
            page.next_continuation_token = Some(prev);
        }
        page
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

    fn store(&self, state: &mut State, key: &str, data: Bytes) -> PutResult {
        let etag = self.etag();
        let size = data.len() as u64;
        state.objects.insert(
            key.into(),
            Stored {
                data,
                etag: etag.clone(),
                modified: SystemTime::now(),
            },
        );
        PutResult {
            etag,
            size: Some(size),
        }
    }
}

fn info(key: &str, s: &Stored) -> ObjectInfo {
    ObjectInfo {
        key: key.into(),
        size: s.data.len() as u64,
        etag: s.etag.clone(),
        last_modified: s.modified,
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
        Ok(())
    }

    async fn head_object(&self, key: &str) -> Result<ObjectInfo, ClientError> {
        let state = self.state();
        state
            .objects
            .get(key)
            .map(|s| info(key, s))
            .ok_or_else(|| ClientError::NotFound { key: key.into() })
    }

    async fn list_objects(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        continuation_token: Option<&str>,
        max_keys: i32,
    ) -> Result<ListPage, ClientError> {
        let page = self.list_page(prefix, delimiter, continuation_token, max_keys);
        let gate = self
            .list_gate
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(gate) = gate {
            gate.acquire().await.expect("gate open").forget();
        }
        Ok(page)
    }

    async fn get_object(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<Bytes, ClientError> {
        let injected = self
            .failing_gets
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if injected.is_ok() {
            return Err(ClientError::Transient {
                code: "InternalError".into(),
                message: "injected by the fake".into(),
            });
        }
        let state = self.state();
        let s = state
            .objects
            .get(key)
            .ok_or_else(|| ClientError::NotFound { key: key.into() })?;
        if if_match.is_some_and(|e| e != s.etag) {
            return Err(ClientError::PreconditionFailed { key: key.into() });
        }
        let len = s.data.len() as u64;
        if range.start >= len && len > 0 {
            return Err(ClientError::InvalidRange { key: key.into() });
        }
        Ok(s.data
            .slice(range.start.min(len) as usize..range.end.min(len) as usize))
    }

    async fn put_object(
        &self,
        key: &str,
        body: Bytes,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        let mut state = self.state();
        self.check(&state, key, &condition)?;
        Ok(self.store(&mut state, key, body))
    }

    async fn append_object(
        &self,
        key: &str,
        offset: u64,
        body: Bytes,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        if !self.directory {
            return Err(ClientError::NotSupported("append".into()));
        }
        let mut state = self.state();
        self.check(&state, key, &condition)?;
        let current = state
            .objects
            .get(key)
            .map(|s| s.data.clone())
            .unwrap_or_default();
        if current.len() as u64 != offset {
            return Err(ClientError::InvalidWriteOffset {
                key: key.into(),
                message: "offset mismatch".into(),
            });
        }
        let mut data = current.to_vec();
        data.extend_from_slice(&body);
        Ok(self.store(&mut state, key, Bytes::from(data)))
    }

    async fn create_multipart_upload(&self, key: &str) -> Result<String, ClientError> {
        let id = format!("upload-{}", self.counter.fetch_add(1, Ordering::Relaxed));
        self.state()
            .uploads
            .insert(id.clone(), (key.into(), BTreeMap::new()));
        Ok(id)
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        part_number: i32,
        body: Bytes,
    ) -> Result<UploadedPart, ClientError> {
        let mut state = self.state();
        let (k, parts) = state
            .uploads
            .get_mut(upload_id)
            .ok_or_else(|| ClientError::NotFound { key: key.into() })?;
        assert_eq!(k, key);
        parts.insert(part_number, body);
        Ok(UploadedPart {
            part_number,
            etag: format!("\"part-{part_number}\""),
            checksum: None,
        })
    }

    async fn complete_multipart_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<UploadedPart>,
        condition: WriteCondition,
    ) -> Result<PutResult, ClientError> {
        let mut state = self.state();
        self.check(&state, key, &condition)?;
        let (_, stored) = state
            .uploads
            .remove(upload_id)
            .ok_or_else(|| ClientError::NotFound { key: key.into() })?;
        let mut data = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            if self.directory && p.part_number != i as i32 + 1 {
                return Err(ClientError::Service {
                    status: 400,
                    code: "InvalidPartOrder".into(),
                    message: String::new(),
                });
            }
            data.extend_from_slice(
                stored
                    .get(&p.part_number)
                    .ok_or_else(|| ClientError::Malformed("missing part".into()))?,
            );
        }
        Ok(self.store(&mut state, key, Bytes::from(data)))
    }

    async fn abort_multipart_upload(&self, _key: &str, upload_id: &str) -> Result<(), ClientError> {
        self.state().uploads.remove(upload_id);
        Ok(())
    }

    async fn delete_object(&self, key: &str) -> Result<(), ClientError> {
        self.state().objects.remove(key);
        Ok(())
    }

    async fn rename_object(
        &self,
        source_key: &str,
        destination_key: &str,
        destination_condition: WriteCondition,
    ) -> Result<(), ClientError> {
        if !self.directory {
            return Err(ClientError::NotSupported("rename".into()));
        }
        let mut state = self.state();
        self.check(&state, destination_key, &destination_condition)?;
        let s = state
            .objects
            .remove(source_key)
            .ok_or_else(|| ClientError::NotFound {
                key: source_key.into(),
            })?;
        state.objects.insert(destination_key.into(), s);
        Ok(())
    }
}
