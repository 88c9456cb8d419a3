//! Response bodies (small in-memory ones, and file ranges streamed from disk) and request-body intake
//! (plain or `aws-chunked`, hashed while it streams to a file).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use md5::Md5;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::error::S3Error;
use crate::store::Piece;

/// Size of the chunks a streamed body is handed to hyper in: large enough that loopback throughput is not
/// syscall-bound.
const READ_CHUNK: usize = 1024 * 1024;

/// Ranges this long or longer are sent from the blob's mapping rather than read: the read's copy and the
/// faults on a fresh buffer were about half of the emulator's CPU per GiB served, and the emulator shares the
/// cores with the clients it serves. Below it, a read costs less than mapping a blob for it
/// (docs/BENCHMARKS.md).
const MAP_AT_LEAST: u64 = 512 * 1024;

/// The most of a long range taken at once (the blocking thread runs this far ahead of the socket).
const MAP_WINDOW: u64 = 16 * 1024 * 1024;

/// Bodies this short are read on the request's own task: handing them to a blocking thread and back cost more
/// than the read (thread wake-ups were about a quarter of the emulator's CPU on 100 KB GETs), and the
/// emulator shares the cores with the clients it serves. A blob is in the page cache in every run here.
const INLINE_AT_MOST: u64 = crate::store::SHORT_BLOB;

/// How a streamed file body should misbehave (fault injection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFault {
    None,
    /// Stop after half the bytes with an error: the connection is reset mid-body.
    ResetMidBody,
    /// Stop after half the bytes without an error: hyper closes the connection short of Content-Length.
    Truncate,
    /// Send half the bytes, then nothing for 20 s, then reset: a server that stalls mid-body.
    StallMidBody,
}

pub enum ResponseBody {
    Full(Option<Bytes>),
    Stream {
        rx: mpsc::Receiver<std::io::Result<Bytes>>,
        remaining: u64,
    },
}

impl ResponseBody {
    pub fn empty() -> Self {
        ResponseBody::Full(None)
    }

    pub fn full(data: impl Into<Bytes>) -> Self {
        let data = data.into();
        ResponseBody::Full((!data.is_empty()).then_some(data))
    }

    /// The pieces (a range of an object, possibly across several blobs): a short body at once, else streamed
    /// from a blocking thread that takes each window from the blob's mapping ([`crate::store::Blob::mapping`])
    /// or reads it, a window ahead of the socket. The pieces hold their blobs until the last byte is sent.
    pub fn pieces(pieces: Vec<Piece>, fault: BodyFault) -> Self {
        let len: u64 = pieces.iter().map(|p| p.2).sum();
        if fault == BodyFault::None && len <= INLINE_AT_MOST {
            return match read_pieces(&pieces, len) {
                Ok(bytes) => ResponseBody::full(bytes),
                Err(e) => ResponseBody::failed(e, len),
            };
        }
        let (tx, rx) = mpsc::channel(4);
        let stop_at = match fault {
            BodyFault::None => len,
            _ => len / 2,
        };
        tokio::task::spawn_blocking(move || {
            let mut sent = 0u64;
            for (blob, offset, piece_len) in pieces {
                let take = piece_len.min(stop_at.saturating_sub(sent));
                if take == 0 {
                    continue;
                }
                // A long range goes out in windows, so that one GET of a huge object is not read (on a
                // disk) all at once before its first byte is sent.
                let mut at = 0u64;
                while at < take {
                    let n = (take - at).min(MAP_WINDOW);
                    let window = match window_of(&blob, offset + at, n) {
                        Ok(w) => w,
                        Err(e) => {
                            let _ = tx.blocking_send(Err(e));
                            return;
                        }
                    };
                    // Chunks are views of the window; of a mapping, the socket write copies straight from
                    // the page cache.
                    let mut done = 0usize;
                    while done < window.len() {
                        let c = (window.len() - done).min(READ_CHUNK);
                        if tx.blocking_send(Ok(window.slice(done..done + c))).is_err() {
                            return;
                        }
                        done += c;
                    }
                    at += n;
                }
                sent += take;
            }
            if fault == BodyFault::StallMidBody {
                // Waits for the client to give up (its receiver goes), at most 20 s.
                for _ in 0..200 {
                    if tx.is_closed() {
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            }
            if matches!(fault, BodyFault::ResetMidBody | BodyFault::StallMidBody) {
                let _ = tx.blocking_send(Err(std::io::Error::other("injected connection reset")));
            }
        });
        ResponseBody::Stream { rx, remaining: len }
    }

    /// A body that fails at once (the connection is reset), as a streamed one whose read failed.
    fn failed(e: std::io::Error, len: u64) -> Self {
        let (tx, rx) = mpsc::channel(1);
        let _ = tx.try_send(Err(e));
        ResponseBody::Stream { rx, remaining: len }
    }
}

/// The bytes of `pieces` (`len` in all): one piece of a short blob is a view of its bytes kept in memory;
/// else they are copied into one buffer that is not zeroed first.
fn read_pieces(pieces: &[Piece], len: u64) -> std::io::Result<Bytes> {
    let mut views = Vec::with_capacity(pieces.len());
    for (blob, offset, piece_len) in pieces {
        let Some(whole) = blob.short_bytes()? else {
            views.push(read_range(blob, *offset, *piece_len)?);
            continue;
        };
        views.push(view(&whole, &blob.path, *offset, *piece_len)?);
    }
    if views.len() == 1 {
        return Ok(views.pop().expect("one view"));
    }
    let mut buf = BytesMut::with_capacity(usize::try_from(len).map_err(std::io::Error::other)?);
    for view in views {
        buf.extend_from_slice(&view);
    }
    Ok(buf.freeze())
}

/// `len` bytes of `blob` from `offset`: a view of the blob's mapping when long enough ([`MAP_AT_LEAST`]), else
/// read.
fn window_of(blob: &crate::store::Blob, offset: u64, len: u64) -> std::io::Result<Bytes> {
    if len < MAP_AT_LEAST {
        return read_range(blob, offset, len);
    }
    // A mapping that cannot be made (the process's map count is finite) is no reason to fail the GET.
    let Ok(mapped) = blob.mapping() else {
        return read_range(blob, offset, len);
    };
    view(&mapped, &blob.path, offset, len)
}

/// `len` bytes of `whole` (all of the blob at `path`) from `offset`, without a copy.
fn view(whole: &Bytes, path: &Path, offset: u64, len: u64) -> std::io::Result<Bytes> {
    let end = offset
        .checked_add(len)
        .filter(|&end| end <= whole.len() as u64)
        .ok_or_else(|| past_end(path, offset, len, whole.len() as u64))?;
    Ok(whole.slice(offset as usize..end as usize))
}

/// `len` bytes of `blob` from `offset`, read into a buffer that is not zeroed first.
fn read_range(blob: &crate::store::Blob, offset: u64, len: u64) -> std::io::Result<Bytes> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = File::open(&blob.path)?;
    let on_disk = file.metadata()?.len();
    if offset.checked_add(len).is_none_or(|end| end > on_disk) {
        return Err(past_end(&blob.path, offset, len, on_disk));
    }
    file.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::with_capacity(usize::try_from(len).map_err(std::io::Error::other)?);
    (&file).take(len).read_to_end(&mut buf)?;
    if buf.len() as u64 != len {
        return Err(crate::store::length_mismatch(
            &blob.path,
            buf.len() as u64,
            len,
        ));
    }
    Ok(Bytes::from(buf))
}

/// The error for `len` bytes at `offset` of a blob of `blob_len`.
fn past_end(path: &Path, offset: u64, len: u64, blob_len: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        format!(
            "{}: {len} bytes at {offset} run past its end ({blob_len})",
            path.display()
        ),
    )
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            ResponseBody::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            ResponseBody::Stream { rx, remaining } => match rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    *remaining = remaining.saturating_sub(chunk.len() as u64);
                    Poll::Ready(Some(Ok(Frame::data(chunk))))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Full(d) => d.is_none(),
            ResponseBody::Stream { remaining, .. } => *remaining == 0,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Full(d) => SizeHint::with_exact(d.as_ref().map_or(0, |d| d.len() as u64)),
            ResponseBody::Stream { remaining, .. } => SizeHint::with_exact(*remaining),
        }
    }
}

/// Which digests to compute over an uploaded body.
#[derive(Debug, Default, Clone, Copy)]
pub struct DigestPlan {
    pub md5: bool,
    pub sha256: bool,
    pub crc32: bool,
    pub crc32c: bool,
    pub crc64nvme: bool,
}

#[derive(Debug, Default, Clone)]
pub struct Received {
    pub size: u64,
    pub md5: Option<[u8; 16]>,
    pub sha256_hex: Option<String>,
    /// Base64 of the big-endian CRCs, as S3 writes them in `x-amz-checksum-*`.
    pub crc32: Option<String>,
    pub crc32c: Option<String>,
    pub crc64nvme: Option<String>,
    /// Trailing headers of an `aws-chunked` body (lower-case names).
    pub trailers: Vec<(String, String)>,
}

struct Hashers {
    md5: Option<Md5>,
    sha256: Option<Sha256>,
    crc32: Option<crc32fast::Hasher>,
    crc32c: Option<u32>,
    crc64: Option<crc64fast_nvme::Digest>,
    size: u64,
}

impl Hashers {
    fn new(plan: DigestPlan) -> Self {
        Hashers {
            md5: plan.md5.then(Md5::new),
            sha256: plan.sha256.then(Sha256::new),
            crc32: plan.crc32.then(crc32fast::Hasher::new),
            crc32c: plan.crc32c.then_some(0),
            crc64: plan.crc64nvme.then(crc64fast_nvme::Digest::new),
            size: 0,
        }
    }

    fn update(&mut self, data: &[u8]) {
        self.size += data.len() as u64;
        if let Some(h) = &mut self.md5 {
            h.update(data);
        }
        if let Some(h) = &mut self.sha256 {
            h.update(data);
        }
        if let Some(h) = &mut self.crc32 {
            h.update(data);
        }
        if let Some(c) = &mut self.crc32c {
            *c = crc32c::crc32c_append(*c, data);
        }
        if let Some(h) = &mut self.crc64 {
            h.write(data);
        }
    }

    fn finish(self, trailers: Vec<(String, String)>) -> Received {
        use base64::Engine;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        Received {
            size: self.size,
            md5: self.md5.map(|h| h.finalize().into()),
            sha256_hex: self.sha256.map(|h| hex::encode(h.finalize())),
            crc32: self.crc32.map(|h| b64(&h.finalize().to_be_bytes())),
            crc32c: self.crc32c.map(|c| b64(&c.to_be_bytes())),
            crc64nvme: self.crc64.map(|h| b64(&h.sum64().to_be_bytes())),
            trailers,
        }
    }
}

/// Digests of bytes already stored (slices of blobs), read in 1 MiB pieces: for a part copied server-side,
/// whose ETag (MD5) and checksum the service computes over the copied range. Blocking: call it from
/// `spawn_blocking`. Memory stays at one buffer whatever the range.
pub fn digest_pieces(
    pieces: &[crate::store::Piece],
    plan: DigestPlan,
) -> std::io::Result<Received> {
    use std::io::{Read, Seek, SeekFrom};
    let mut hashers = Hashers::new(plan);
    let mut buf = vec![0u8; 1024 * 1024];
    for (blob, offset, len) in pieces {
        let mut file = std::fs::File::open(&blob.path)?;
        file.seek(SeekFrom::Start(*offset))?;
        let mut left = *len;
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            let n = file.read(&mut buf[..want])?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "blob shorter than recorded",
                ));
            }
            hashers.update(&buf[..n]);
            left -= n as u64;
        }
    }
    Ok(hashers.finish(Vec::new()))
}

/// Incremental decoder of the `aws-chunked` content encoding (signed or unsigned chunks, optional trailers).
#[derive(Default)]
struct ChunkDecoder {
    buf: BytesMut,
    data_left: u64,
    state: ChunkState,
    trailers: Vec<(String, String)>,
}

#[derive(Default, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Header,
    Data,
    DataEnd,
    Trailers,
    Done,
}

impl ChunkDecoder {
    /// Feeds raw bytes; calls `out` with each piece of decoded payload.
    fn feed(
        &mut self,
        input: &[u8],
        out: &mut dyn FnMut(&[u8]) -> Result<(), S3Error>,
    ) -> Result<(), S3Error> {
        self.buf.extend_from_slice(input);
        loop {
            match self.state {
                ChunkState::Header => {
                    let Some(line) = self.take_line()? else {
                        return Ok(());
                    };
                    let size_hex = line.split(';').next().unwrap_or("").trim();
                    let size = u64::from_str_radix(size_hex, 16).map_err(|_| {
                        S3Error::incomplete_body(format!("bad aws-chunked header {line:?}"))
                    })?;
                    if size == 0 {
                        self.state = ChunkState::Trailers;
                    } else {
                        self.data_left = size;
                        self.state = ChunkState::Data;
                    }
                }
                ChunkState::Data => {
                    if self.buf.is_empty() {
                        return Ok(());
                    }
                    let n = (self.data_left as usize).min(self.buf.len());
                    let piece = self.buf.split_to(n);
                    out(&piece)?;
                    self.data_left -= n as u64;
                    if self.data_left == 0 {
                        self.state = ChunkState::DataEnd;
                    }
                }
                ChunkState::DataEnd => {
                    if self.buf.len() < 2 {
                        return Ok(());
                    }
                    if &self.buf[..2] != b"\r\n" {
                        return Err(S3Error::incomplete_body(
                            "aws-chunked data not followed by CRLF".into(),
                        ));
                    }
                    self.buf.advance(2);
                    self.state = ChunkState::Header;
                }
                ChunkState::Trailers => {
                    let Some(line) = self.take_line()? else {
                        return Ok(());
                    };
                    if line.is_empty() {
                        self.state = ChunkState::Done;
                    } else if let Some((k, v)) = line.split_once(':') {
                        self.trailers
                            .push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                    }
                }
                ChunkState::Done => return Ok(()),
            }
        }
    }

    fn take_line(&mut self) -> Result<Option<String>, S3Error> {
        match self.buf.windows(2).position(|w| w == b"\r\n") {
            Some(pos) => {
                let line = String::from_utf8_lossy(&self.buf[..pos]).into_owned();
                self.buf.advance(pos + 2);
                Ok(Some(line))
            }
            None if self.buf.len() > 64 * 1024 => {
                Err(S3Error::incomplete_body("aws-chunked line too long".into()))
            }
            None => Ok(None),
        }
    }

    fn finish(self) -> Result<Vec<(String, String)>, S3Error> {
        // Some clients end the trailer section without the final empty line.
        if self.state == ChunkState::Done
            || (self.state == ChunkState::Trailers && self.buf.is_empty())
        {
            Ok(self.trailers)
        } else {
            Err(S3Error::incomplete_body(
                "aws-chunked body ended early".into(),
            ))
        }
    }
}

/// Streams a request body to `dest`, decoding `aws-chunked` when `chunked`, and digests it on the way.
/// `limit` bounds the decoded size (the service's maximum object or part size).
pub async fn receive_to_file<B>(
    body: B,
    chunked: bool,
    plan: DigestPlan,
    dest: &Path,
    limit: u64,
) -> Result<Received, S3Error>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let file = File::create(dest).map_err(S3Error::internal)?;
    // Disk writes go to a blocking thread through a small queue, so a slow disk pushes back on the socket.
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(4);
    let writer = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut file = file;
        while let Some(buf) = rx.blocking_recv() {
            file.write_all(&buf)?;
        }
        file.flush()
    });

    let mut hashers = Hashers::new(plan);
    let mut decoder = chunked.then(ChunkDecoder::default);
    let mut pending: Vec<u8> = Vec::with_capacity(READ_CHUNK);
    let mut body = body;
    let mut failure: Option<S3Error> = None;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                failure = Some(S3Error::incomplete_body(format!("request body: {e}")));
                break;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let mut sink = |piece: &[u8]| -> Result<(), S3Error> {
            hashers.update(piece);
            if hashers.size > limit {
                return Err(S3Error::entity_too_large(limit));
            }
            pending.extend_from_slice(piece);
            Ok(())
        };
        let fed = match &mut decoder {
            Some(d) => d.feed(&data, &mut sink),
            None => sink(&data),
        };
        if let Err(e) = fed {
            failure = Some(e);
            break;
        }
        if pending.len() >= READ_CHUNK {
            let full = std::mem::replace(&mut pending, Vec::with_capacity(READ_CHUNK));
            if tx.send(full).await.is_err() {
                break;
            }
        }
    }
    if !pending.is_empty() && failure.is_none() {
        let _ = tx.send(pending).await;
    }
    drop(tx);
    let written = writer
        .await
        .map_err(|e| S3Error::internal(std::io::Error::other(e)))?;
    if let Some(e) = failure {
        return Err(e);
    }
    written.map_err(S3Error::internal)?;
    let trailers = match decoder {
        Some(d) => d.finish()?,
        None => Vec::new(),
    };
    Ok(hashers.finish(trailers))
}

/// Decodes a whole `aws-chunked` body held in memory (small XML documents).
pub fn decode_chunked(data: &[u8]) -> Result<Vec<u8>, S3Error> {
    let mut decoder = ChunkDecoder::default();
    let mut out = Vec::with_capacity(data.len());
    decoder.feed(data, &mut |p| {
        out.extend_from_slice(p);
        Ok(())
    })?;
    decoder.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body;
    use std::sync::Arc;

    fn decode(input: &[u8], split: usize) -> (Vec<u8>, Vec<(String, String)>) {
        let mut d = ChunkDecoder::default();
        let mut out = Vec::new();
        for piece in input.chunks(split) {
            d.feed(piece, &mut |p| {
                out.extend_from_slice(p);
                Ok(())
            })
            .unwrap();
        }
        (out, d.finish().unwrap())
    }

    #[test]
    fn decodes_signed_and_unsigned_chunks_with_trailers() {
        let body = b"5;chunk-signature=abc\r\nhello\r\n6\r\n world\r\n0\r\nx-amz-checksum-crc32c:AAAA\r\n\r\n";
        for split in [1, 3, 7, 1000] {
            let (data, trailers) = decode(body, split);
            assert_eq!(data, b"hello world");
            assert_eq!(
                trailers,
                vec![("x-amz-checksum-crc32c".to_string(), "AAAA".to_string())]
            );
        }
    }

    /// Collects a streamed body, or its first error.
    async fn collect(body: ResponseBody) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut body = std::pin::pin!(body);
        while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            out.extend_from_slice(frame?.data_ref().expect("a data frame"));
        }
        Ok(out)
    }

    fn blob_of(dir: &Path, name: &str, bytes: &[u8]) -> Arc<crate::store::Blob> {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        crate::store::Blob::new(path, bytes.len() as u64)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
    }

    #[tokio::test]
    async fn ranges_read_or_mapped_come_back_byte_for_byte_across_blobs_and_windows() {
        let dir = tempfile::tempdir().unwrap();
        // One blob longer than a map window (mapped in two windows), one below the mapping size (read).
        let big = pattern(MAP_WINDOW as usize + 700_001, 1);
        let small = pattern(300_000, 2);
        let (a, b) = (
            blob_of(dir.path(), "a", &big),
            blob_of(dir.path(), "b", &small),
        );
        let cases: Vec<Vec<(u64, u64, u8)>> = vec![
            vec![(0, big.len() as u64, 0)],
            vec![
                (12_345, big.len() as u64 - 12_345, 0),
                (0, small.len() as u64, 1),
            ],
            vec![(4095, MAP_AT_LEAST, 0), (7, 1, 1)],
            vec![(big.len() as u64 - (MAP_AT_LEAST - 1), MAP_AT_LEAST - 1, 0)],
            vec![(3, 0, 0), (1, 299_999, 1)],
            // Short enough to be read on the request's task, across both blobs and whole.
            vec![(5, 100_000, 1), (big.len() as u64 - 50_000, 50_000, 0)],
            vec![(0, INLINE_AT_MOST, 1)],
        ];
        for case in cases {
            let mut expected = Vec::new();
            let mut pieces = Vec::new();
            for (offset, len, which) in case {
                let (blob, bytes) = if which == 0 { (&a, &big) } else { (&b, &small) };
                expected.extend_from_slice(&bytes[offset as usize..(offset + len) as usize]);
                pieces.push((Arc::clone(blob), offset, len));
            }
            let got = collect(ResponseBody::pieces(pieces, BodyFault::None))
                .await
                .unwrap();
            assert_eq!(got.len(), expected.len());
            assert!(
                got == expected,
                "the bytes of each range come back in order"
            );
        }
    }

    #[tokio::test]
    async fn a_short_body_is_read_at_once_unless_a_fault_must_cut_it() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = pattern(INLINE_AT_MOST as usize + 1, 5);
        let blob = blob_of(dir.path(), "e", &bytes);
        let body = |len, fault| ResponseBody::pieces(vec![(Arc::clone(&blob), 0, len)], fault);
        assert!(matches!(
            body(INLINE_AT_MOST, BodyFault::None),
            ResponseBody::Full(Some(_))
        ));
        assert!(matches!(
            body(INLINE_AT_MOST + 1, BodyFault::None),
            ResponseBody::Stream { .. }
        ));
        let cut = collect(body(100_000, BodyFault::Truncate)).await.unwrap();
        assert_eq!(cut.len(), 50_000, "a fault still cuts a short body at half");
    }

    #[tokio::test]
    async fn a_short_blob_read_once_is_served_from_memory_after() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = pattern(100_000, 6);
        let blob = blob_of(dir.path(), "f", &bytes);
        let get = |offset: u64, len: u64| {
            collect(ResponseBody::pieces(
                vec![(Arc::clone(&blob), offset, len)],
                BodyFault::None,
            ))
        };
        assert!(get(10, 20).await.unwrap() == bytes[10..30]);
        // Gone from disk, the blob still answers: its bytes were kept by the first read.
        std::fs::remove_file(&blob.path).unwrap();
        assert!(get(0, 100_000).await.unwrap() == bytes);
        assert!(get(99_990, 10).await.unwrap() == bytes[99_990..]);
        assert!(
            get(99_995, 10).await.is_err(),
            "past its end is still an error"
        );
    }

    #[tokio::test]
    async fn a_long_blob_is_mapped_once_for_all_its_gets() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = pattern(3 * MAP_AT_LEAST as usize, 7);
        let blob = blob_of(dir.path(), "g", &bytes);
        for (offset, len) in [(0, MAP_AT_LEAST), (MAP_AT_LEAST + 3, 2 * MAP_AT_LEAST - 3)] {
            let body =
                ResponseBody::pieces(vec![(Arc::clone(&blob), offset, len)], BodyFault::None);
            let got = collect(body).await.unwrap();
            assert!(got == bytes[offset as usize..(offset + len) as usize]);
        }
        let (a, b) = (blob.mapping().unwrap(), blob.mapping().unwrap());
        assert_eq!(a.as_ptr(), b.as_ptr(), "one mapping, kept");
    }

    #[tokio::test]
    async fn a_range_past_its_blob_is_an_error_not_short_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = pattern(2 * MAP_AT_LEAST as usize, 3);
        let blob = blob_of(dir.path(), "c", &bytes);
        for (offset, len) in [
            (MAP_AT_LEAST + 1, MAP_AT_LEAST),
            (10, 2 * MAP_AT_LEAST),
            (MAP_AT_LEAST * 2 - 5, 6),
        ] {
            let body =
                ResponseBody::pieces(vec![(Arc::clone(&blob), offset, len)], BodyFault::None);
            assert!(collect(body).await.is_err(), "{len} bytes at {offset}");
        }
    }

    #[tokio::test]
    async fn a_truncating_fault_still_stops_at_half_of_a_mapped_range() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = pattern(3 * MAP_AT_LEAST as usize, 4);
        let blob = blob_of(dir.path(), "d", &bytes);
        let len = bytes.len() as u64;
        let body = ResponseBody::pieces(vec![(blob, 0, len)], BodyFault::Truncate);
        let got = collect(body).await.unwrap();
        assert_eq!(got.len() as u64, len / 2);
        assert!(got == bytes[..got.len()]);
    }

    #[test]
    fn refuses_a_body_cut_short() {
        let mut d = ChunkDecoder::default();
        d.feed(b"a\r\nhello", &mut |_| Ok(())).unwrap();
        assert!(d.finish().is_err());
    }
}
