//! Ranged GET that never returns a short body.
//!
//! The SDK retries a request until it gets an answer, but a body that breaks after the answer started (reset,
//! truncation, a stall cut by stalled-stream protection, a checksum mismatch) is the caller's problem. Here a
//! broken body is resumed from the first byte not yet received, with a new ranged GET pinned to the ETag of
//! the first answer, so the pieces always come from one object version. Every answer is checked against its
//! Content-Range / Content-Length; anything inconsistent is an error, never data.

use std::error::Error as StdError;
use std::ops::Range;
use std::sync::atomic::Ordering;

use aws_sdk_s3::primitives::ByteStream;
use bytes::{Bytes, BytesMut};
use tracing::{debug, warn};

use super::direct::GetAnswer;
use super::errors::map_sdk_error;
use super::{SdkClient, backoff_delay};
use crate::s3::{ClientError, ObjectInfo};

impl SdkClient {
    pub(super) async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<Bytes, ClientError> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let mut pinned: Option<String> =
            if_match.filter(|etag| !etag.is_empty()).map(str::to_string);
        // Exclusive end of what we will return; shrinks to the object size once an answer tells us the size.
        let mut end = range.end;
        // Allocated once the first answer tells us how much is really coming.
        let mut buf: Option<BytesMut> = None;
        // Broken answers in a row without new bytes, and in total: a body that keeps breaking but makes progress
        // is resumed longer than one that makes none, within a hard cap.
        let mut strikes = 0u32;
        let mut interruptions = 0u32;
        let budget = self.config.max_attempts.max(1);
        loop {
            let received = buf.as_ref().map_or(0, |b| b.len() as u64);
            let offset = range.start + received;
            if offset >= end {
                return Ok(buf.map(crate::buffers::pooled).unwrap_or_default());
            }
            let response = match self.send_get(key, offset..end, pinned.as_deref()).await {
                Ok(response) => response,
                // The read starts at or past the end of the object: nothing to return.
                Err(ClientError::InvalidRange { .. }) if received == 0 => return Ok(Bytes::new()),
                Err(e) => return Err(e),
            };
            let window = answer_window(key, &response)?;
            if window.start > offset {
                return Err(ClientError::Malformed(format!(
                    "GET {key}: asked for bytes from {offset}, answer starts at {}",
                    window.start
                )));
            }
            if let Some(etag) = response.e_tag.as_deref() {
                match &pinned {
                    // The server ignored If-Match (or the object changed between our requests).
                    Some(expected) if !etag_eq(expected, etag) => {
                        return Err(ClientError::PreconditionFailed {
                            key: key.to_string(),
                        });
                    }
                    Some(_) => {}
                    None => pinned = Some(etag.to_string()),
                }
            }
            if let Some(total) = window.object_size {
                end = end.min(total).max(range.start);
                if offset >= end {
                    continue;
                }
            }
            let skip = offset - window.start;
            let want = (end - offset).min(window.len.saturating_sub(skip));
            if want == 0 {
                return Err(ClientError::Malformed(format!(
                    "GET {key}: asked for bytes from {offset}, answer ends at {}",
                    window.start + window.len
                )));
            }
            // Read to the end of the body when our window reaches it, so a checksum mismatch detected at the
            // end of the stream is seen; stop early only if the server sent more than we need.
            let drain = skip + want >= window.len;
            let mut body = Body::new(response.body, self.config.stall_timeout);
            // All that was asked, in one chunk: no buffer of ours, no copy (small objects).
            let first = if buf.is_none() && skip == 0 && want == end - offset {
                match body.whole(want, drain).await {
                    Ok(Some(bytes)) => return Ok(bytes),
                    other => other.map(|_| ()),
                }
            } else {
                Ok(())
            };
            // Sized by what this answer can deliver, never by the caller's range alone (the object size may be
            // unknown: `Content-Range: bytes a-b/*`).
            let out = buf.get_or_insert_with(|| crate::buffers::take(want as usize));
            let before = out.len();
            let outcome = match first {
                Ok(()) => read_body(&mut body, out, skip, want, drain).await,
                Err(e) => Err(e),
            };
            let problem = match outcome {
                Ok(()) if (out.len() - before) as u64 == want => None,
                Ok(()) => Some(format!(
                    "body ended after {} of {want} bytes",
                    out.len() - before
                )),
                Err(BodyError::ChecksumMismatch(detail)) => {
                    // Nothing from this answer can be trusted.
                    out.truncate(before);
                    Some(format!("checksum mismatch: {detail}"))
                }
                Err(BodyError::Broken(detail)) => Some(detail),
            };
            if let Some(problem) = problem {
                interruptions += 1;
                // Bytes kept from this answer forgive the earlier strikes.
                strikes = if out.len() > before { 1 } else { strikes + 1 };
                if pinned.is_none() {
                    // Without an ETag the next answer could be another object version: start over.
                    out.clear();
                }
                if strikes >= budget || interruptions >= budget.saturating_mul(3) {
                    return Err(ClientError::Transient {
                        code: "BodyInterrupted".into(),
                        message: format!(
                            "GET {key}: body broke {interruptions} times ({strikes} without progress), last: {problem}"
                        ),
                    });
                }
                warn!(key, received = out.len(), interruptions, problem = %problem, "GET body broke; resuming");
                self.body_resumes.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(backoff_delay(strikes)).await;
            }
        }
    }

    /// One ranged GET from byte 0 that also yields what a HEAD would (size from Content-Range, ETag, date).
    /// When that cannot work (an empty object answering 416, an archived object refusing GET, a missing
    /// header, a broken body), HEAD and a GET pinned to its ETag give the answer instead; a missing object or
    /// bucket, an exhausted retry budget or missing credentials are answers already.
    pub(super) async fn head_and_first_bytes(
        &self,
        key: &str,
        len: u64,
    ) -> Result<(ObjectInfo, Bytes), ClientError> {
        match self.first_bytes_in_one_get(key, len).await {
            Err(
                e @ (ClientError::NotFound { .. }
                | ClientError::NoSuchBucket { .. }
                | ClientError::Transient { .. }
                | ClientError::NoCredentials(_)),
            ) => Err(e),
            Err(e) => {
                debug!(key, error = %e, "first bytes not in one GET; asking with HEAD");
                crate::s3::head_then_first_bytes(self, key, len).await
            }
            found => found,
        }
    }

    async fn first_bytes_in_one_get(
        &self,
        key: &str,
        len: u64,
    ) -> Result<(ObjectInfo, Bytes), ClientError> {
        let response = self.send_get(key, 0..len.max(1), None).await?;
        let window = answer_window(key, &response)?;
        let malformed = |what: &str| ClientError::Malformed(format!("GET {key}: {what}"));
        let size = window
            .object_size
            .ok_or_else(|| malformed("no object size in the answer"))?;
        if window.start != 0 {
            return Err(malformed("answer does not start at byte 0"));
        }
        let etag = response.e_tag.clone().ok_or_else(|| malformed("no ETag"))?;
        let info = ObjectInfo {
            key: key.to_string(),
            size,
            etag,
            last_modified: super::to_system_time(response.last_modified.as_ref()),
            metadata: super::user_metadata(Some(&response.metadata)),
        };
        let want = window.len.min(len);
        let drain = want >= window.len;
        let mut body = Body::new(response.body, self.config.stall_timeout);
        let bytes = match body.all(want, drain).await {
            Some(bytes) => bytes,
            // Broken or failed its checksum: the resuming GET, pinned to this version, finishes it.
            None => self.get_range(key, 0..want, Some(&info.etag)).await?,
        };
        Ok((info, bytes))
    }

    async fn send_get(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<GetAnswer, ClientError> {
        let header = format!("bytes={}-{}", range.start, range.end - 1);
        if let Some(direct) = &self.direct {
            return direct.get(self, key, &header, if_match).await;
        }
        self.run(|client| {
            let request = client
                .get_object()
                .bucket(&self.config.bucket)
                .key(key)
                .range(header.clone())
                .set_if_match(if_match.map(str::to_string));
            async move {
                request
                    .send()
                    .await
                    .map(GetAnswer::from)
                    .map_err(|e| map_sdk_error(&e, &self.config.bucket, key))
            }
        })
        .await
    }
}

/// Which bytes of the object an answer carries.
#[derive(Debug, PartialEq, Eq)]
struct Window {
    start: u64,
    len: u64,
    object_size: Option<u64>,
}

fn answer_window(key: &str, response: &GetAnswer) -> Result<Window, ClientError> {
    let content_length = response.content_length;
    let window = match response.content_range.as_deref() {
        Some(value) => {
            let (start, last, object_size) = parse_content_range(value).ok_or_else(|| {
                ClientError::Malformed(format!("GET {key}: unparsable Content-Range {value:?}"))
            })?;
            Window {
                start,
                len: last - start + 1,
                object_size,
            }
        }
        // A 200 answer: the whole object (some servers ignore Range).
        None => {
            let len = content_length.ok_or_else(|| {
                ClientError::Malformed(format!(
                    "GET {key}: answer has neither Content-Range nor Content-Length"
                ))
            })?;
            Window {
                start: 0,
                len,
                object_size: Some(len),
            }
        }
    };
    if let Some(length) = content_length
        && length != window.len
    {
        return Err(ClientError::Malformed(format!(
            "GET {key}: Content-Length {length} does not match Content-Range length {}",
            window.len
        )));
    }
    if let Some(size) = window.object_size
        && window.start + window.len > size
    {
        return Err(ClientError::Malformed(format!(
            "GET {key}: Content-Range beyond object size {size}"
        )));
    }
    Ok(window)
}

/// `bytes 0-99/1234` -> (0, 99, Some(1234)); `bytes 0-99/*` -> (0, 99, None).
fn parse_content_range(value: &str) -> Option<(u64, u64, Option<u64>)> {
    let rest = value.trim().strip_prefix("bytes")?.trim_start();
    let (span, total) = rest.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let first: u64 = first.trim().parse().ok()?;
    let last: u64 = last.trim().parse().ok()?;
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    (first <= last).then_some((first, last, total))
}

/// ETags compare equal ignoring quotes and a weak-validator prefix (servers differ in how they echo them).
fn etag_eq(a: &str, b: &str) -> bool {
    fn bare(tag: &str) -> &str {
        tag.trim().trim_start_matches("W/").trim_matches('"')
    }
    bare(a) == bare(b)
}

enum BodyError {
    ChecksumMismatch(String),
    Broken(String),
}

/// The least a body in one chunk must hold to be handed on without a copy. The chunk is a slice of the HTTP
/// client's read buffer and keeps all of that buffer alive (up to about 400 KiB) while a reader holds it: a
/// few KiB kept by an open file could pin a hundred times their size, and copying them costs next to nothing.
const UNCOPIED_CHUNK_MIN: usize = 64 << 10;

/// A GET's body as it streams in, with one chunk that can be put back. A body that sends nothing for its
/// `stall` is broken (the SDK's stalled-stream protection does the same for its own GETs; GETs sent without
/// the orchestrator have only this).
struct Body {
    stream: ByteStream,
    put_back: Option<Bytes>,
    stall: std::time::Duration,
}

impl Body {
    fn new(stream: ByteStream, stall: std::time::Duration) -> Body {
        Body {
            stream,
            put_back: None,
            stall,
        }
    }

    async fn next(&mut self) -> Result<Option<Bytes>, BodyError> {
        if let Some(chunk) = self.put_back.take() {
            return Ok(Some(chunk));
        }
        let Ok(next) = tokio::time::timeout(self.stall, self.stream.next()).await else {
            return Err(BodyError::Broken(format!(
                "no body bytes for {:?}",
                self.stall
            )));
        };
        match next {
            None => Ok(None),
            Some(Ok(chunk)) => Ok(Some(chunk)),
            Some(Err(e)) => {
                let detail = super::errors::describe(&e);
                debug!(error = %detail, "GET body error");
                Err(if is_checksum_mismatch(&e) {
                    BodyError::ChecksumMismatch(detail)
                } else {
                    BodyError::Broken(detail)
                })
            }
        }
    }

    /// The body's first `want` bytes when its first chunk is exactly those (a small object's answer, read by
    /// one `recv`) and at least [`UNCOPIED_CHUNK_MIN`]: handed on as they are, without a copy into a buffer of
    /// ours. With `drain`, the end of the stream must follow, so that a checksum mismatch or a surplus found
    /// there is seen. `None` otherwise; the first chunk is then put back for [`read_body`].
    async fn whole(&mut self, want: u64, drain: bool) -> Result<Option<Bytes>, BodyError> {
        let Some(first) = self.next().await? else {
            return Ok(None);
        };
        if first.len() as u64 != want || first.len() < UNCOPIED_CHUNK_MIN {
            self.put_back = Some(first);
            return Ok(None);
        }
        if drain {
            read_body(self, &mut BytesMut::new(), 0, 0, true).await?;
        }
        crate::buffers::count_unpooled();
        Ok(Some(first))
    }

    /// All of the body's first `want` bytes: as one chunk when [`Body::whole`] can hand it on, else copied into
    /// a buffer of their size. None when the body broke, ended short or failed its checksum.
    async fn all(&mut self, want: u64, drain: bool) -> Option<Bytes> {
        if let Some(bytes) = self.whole(want, drain).await.ok()? {
            return Some(bytes);
        }
        let mut buf = BytesMut::with_capacity(want as usize);
        read_body(self, &mut buf, 0, want, drain).await.ok()?;
        (buf.len() as u64 == want).then(|| buf.freeze())
    }
}

/// Appends bytes `skip..skip + want` of the body to `out`. Stops once they are in unless `drain` asks to read
/// to the end of the stream.
async fn read_body(
    body: &mut Body,
    out: &mut BytesMut,
    skip: u64,
    want: u64,
    drain: bool,
) -> Result<(), BodyError> {
    let mut to_skip = skip;
    let mut to_take = want;
    loop {
        if to_take == 0 && !drain {
            return Ok(());
        }
        let Some(mut chunk) = body.next().await? else {
            return Ok(());
        };
        if to_skip > 0 {
            let n = to_skip.min(chunk.len() as u64);
            let _ = chunk.split_to(n as usize);
            to_skip -= n;
        }
        let n = to_take.min(chunk.len() as u64) as usize;
        out.extend_from_slice(&chunk[..n]);
        to_take -= n as u64;
        if n < chunk.len() && drain {
            return Err(BodyError::Broken(
                "body longer than its Content-Length".into(),
            ));
        }
    }
}

fn is_checksum_mismatch(err: &(dyn StdError + 'static)) -> bool {
    let mut cause: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(current) = cause {
        if current
            .downcast_ref::<aws_smithy_checksums::body::validate::Error>()
            .is_some()
        {
            return true;
        }
        cause = current.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_parses() {
        assert_eq!(
            parse_content_range("bytes 0-99/1234"),
            Some((0, 99, Some(1234)))
        );
        assert_eq!(parse_content_range("bytes 5-5/*"), Some((5, 5, None)));
        assert_eq!(parse_content_range("bytes */1234"), None);
        assert_eq!(parse_content_range("bytes 9-3/10"), None);
        assert_eq!(parse_content_range("items 0-1/2"), None);
    }

    fn output(range: Option<&str>, length: Option<u64>) -> GetAnswer {
        GetAnswer {
            content_length: length,
            content_range: range.map(str::to_string),
            e_tag: None,
            last_modified: None,
            metadata: Default::default(),
            body: ByteStream::new(aws_smithy_types::body::SdkBody::empty()),
        }
    }

    #[test]
    fn answer_windows_are_checked() {
        let w = answer_window("k", &output(Some("bytes 10-19/100"), Some(10))).unwrap();
        assert_eq!(
            w,
            Window {
                start: 10,
                len: 10,
                object_size: Some(100)
            }
        );
        // 200 without Content-Range: the whole object.
        let w = answer_window("k", &output(None, Some(42))).unwrap();
        assert_eq!(
            w,
            Window {
                start: 0,
                len: 42,
                object_size: Some(42)
            }
        );
        // Inconsistent headers are errors, not data.
        assert!(matches!(
            answer_window("k", &output(Some("bytes 10-19/100"), Some(9))),
            Err(ClientError::Malformed(_))
        ));
        assert!(matches!(
            answer_window("k", &output(Some("bytes 95-104/100"), None)),
            Err(ClientError::Malformed(_))
        ));
        assert!(matches!(
            answer_window("k", &output(None, None)),
            Err(ClientError::Malformed(_))
        ));
    }

    #[test]
    fn etags_compare_loosely_on_quotes_only() {
        assert!(etag_eq("\"abc\"", "abc"));
        assert!(etag_eq("W/\"abc\"", "\"abc\""));
        assert!(!etag_eq("\"abc\"", "\"abd\""));
    }

    fn body_of(bytes: &'static [u8]) -> Body {
        Body::new(
            ByteStream::from(Bytes::from_static(bytes)),
            std::time::Duration::from_secs(5),
        )
    }

    /// A body of several chunks, as a large answer comes off the socket.
    fn chunked(chunks: &[&'static [u8]]) -> Body {
        let frames: Vec<Result<http_body::Frame<Bytes>, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(http_body::Frame::data(Bytes::from_static(c))))
            .collect();
        let body = http_body_util::StreamBody::new(futures::stream::iter(frames));
        Body::new(
            ByteStream::new(aws_smithy_types::body::SdkBody::from_body_1_x(body)),
            std::time::Duration::from_secs(5),
        )
    }

    #[tokio::test]
    async fn read_body_skips_and_takes() {
        let mut out = BytesMut::new();
        read_body(&mut body_of(b"0123456789"), &mut out, 2, 5, false)
            .await
            .ok()
            .unwrap();
        assert_eq!(&out[..], b"23456");
        let mut out = BytesMut::new();
        read_body(&mut body_of(b"0123456789"), &mut out, 3, 7, true)
            .await
            .ok()
            .unwrap();
        assert_eq!(&out[..], b"3456789");
        // Draining a body that is longer than the window is an inconsistency.
        let mut out = BytesMut::new();
        assert!(matches!(
            read_body(&mut body_of(b"0123456789"), &mut out, 0, 4, true).await,
            Err(BodyError::Broken(_))
        ));
    }

    #[tokio::test]
    async fn a_body_in_one_chunk_is_handed_on_and_others_are_put_back() {
        let source = Bytes::from(vec![7u8; UNCOPIED_CHUNK_MIN]);
        let stream = || ByteStream::from(source.clone());
        let stall = std::time::Duration::from_secs(5);
        let mut body = Body::new(stream(), stall);
        let want = UNCOPIED_CHUNK_MIN as u64;
        let traffic = crate::buffers::taken();
        let whole = body.whole(want, true).await.ok().unwrap().unwrap();
        // The very bytes of the chunk, not a copy of them.
        assert_eq!(whole.as_ptr(), source.as_ptr());
        assert_eq!(whole.len(), UNCOPIED_CHUNK_MIN);
        // Traffic all the same, for the idle watch.
        assert!(crate::buffers::taken() > traffic);

        // A small chunk is copied instead, so that it does not keep a whole read buffer alive.
        let mut body = body_of(b"0123456789");
        assert!(body.whole(10, true).await.ok().unwrap().is_none());
        let mut out = BytesMut::new();
        read_body(&mut body, &mut out, 0, 10, true)
            .await
            .ok()
            .unwrap();
        assert_eq!(&out[..], b"0123456789");

        // A first chunk shorter than the window goes back, and nothing of the body is lost.
        static BIG: [u8; UNCOPIED_CHUNK_MIN] = [1; UNCOPIED_CHUNK_MIN];
        let mut body = chunked(&[&BIG[..1000], &BIG[1000..]]);
        assert!(body.whole(want, true).await.ok().unwrap().is_none());
        let mut out = BytesMut::new();
        read_body(&mut body, &mut out, 0, want, true)
            .await
            .ok()
            .unwrap();
        assert_eq!(&out[..], &BIG[..]);

        // A whole first chunk with more after it breaks the Content-Length: an error, not the bytes.
        let mut body = chunked(&[&BIG, b"x"]);
        assert!(matches!(
            body.whole(want, true).await,
            Err(BodyError::Broken(_))
        ));
    }
}
