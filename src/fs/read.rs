//! Read handles: ranged GETs pinned to the ETag seen at open, with a sequential prefetch window.
//!
//! Sequential readers get chunks of `part_size` fetched ahead, the window doubling up to `max_window`;
//! a read that jumps elsewhere drops the window and fetches just what it needs. Memory per handle is
//! bounded by `max_window + part_size`. Every GET carries If-Match, so a replaced object yields an error,
//! never a mix of old and new bytes.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::task::JoinHandle;

use super::error::{FsError, FsResult};
use crate::s3::{ClientError, ObjectClient};

/// Smallest GET a random read makes, so small scattered reads do not cost one request per kernel page.
const MIN_RANDOM_FETCH: u64 = 256 * 1024;

enum ChunkData {
    Pending(JoinHandle<Result<Bytes, ClientError>>),
    Ready(Bytes),
}

struct Chunk {
    start: u64,
    end: u64,
    data: ChunkData,
}

impl Drop for Chunk {
    fn drop(&mut self) {
        if let ChunkData::Pending(task) = &self.data {
            task.abort();
        }
    }
}

pub struct Reader {
    client: Arc<dyn ObjectClient>,
    key: String,
    etag: String,
    size: u64,
    part_size: u64,
    max_window: u64,
    window: u64,
    chunks: VecDeque<Chunk>,
    /// Where the next prefetch starts.
    next_fetch: u64,
    /// End of the previous read, to tell sequential from random access.
    last_end: u64,
    pub bytes_fetched: u64,
}

impl Reader {
    pub fn new(
        client: Arc<dyn ObjectClient>,
        key: String,
        etag: String,
        size: u64,
        part_size: u64,
        max_window: u64,
    ) -> Reader {
        let part_size = part_size.max(64 * 1024);
        Reader {
            client,
            key,
            etag,
            size,
            part_size,
            max_window: max_window.max(part_size),
            window: part_size,
            chunks: VecDeque::new(),
            next_fetch: 0,
            last_end: 0,
            bytes_fetched: 0,
        }
    }

    fn spawn_fetch(&mut self, start: u64, end: u64) {
        let client = Arc::clone(&self.client);
        let key = self.key.clone();
        let etag = self.etag.clone();
        let task =
            tokio::spawn(async move { client.get_object(&key, start..end, Some(&etag)).await });
        self.bytes_fetched += end - start;
        self.chunks.push_back(Chunk {
            start,
            end,
            data: ChunkData::Pending(task),
        });
        self.next_fetch = end;
    }

    pub async fn read(&mut self, offset: u64, len: u32) -> FsResult<Bytes> {
        if offset >= self.size || len == 0 {
            return Ok(Bytes::new());
        }
        let end = (offset + len as u64).min(self.size);
        // The kernel's readahead sends several reads at once, so they may arrive out of order: anything inside
        // the window (or just past it) is sequential, and a read a little behind it is served on the side
        // without dropping the window.
        let front_start = self.chunks.front().map(|c| c.start);
        let in_window =
            front_start.is_some_and(|s| s <= offset) && offset <= self.next_fetch + self.part_size;
        let sequential = offset == self.last_end || in_window;
        if !sequential {
            if let Some(s) = front_start {
                if offset < s && s - offset <= 2 * self.part_size {
                    self.bytes_fetched += end - offset;
                    return self
                        .client
                        .get_object(&self.key, offset..end, Some(&self.etag))
                        .await
                        .map_err(|e| FsError::client(&self.key, e));
                }
            }
            self.chunks.clear();
            self.window = self.part_size;
            self.next_fetch = offset;
            let fetch_end = end.max(offset + MIN_RANDOM_FETCH).min(self.size);
            self.spawn_fetch(offset, fetch_end);
        } else {
            // Keep one part behind the reader for reads that arrive late.
            while self
                .chunks
                .front()
                .is_some_and(|c| c.end + self.part_size <= offset)
            {
                self.chunks.pop_front();
            }
            if self.chunks.is_empty() || self.next_fetch < offset {
                self.chunks.clear();
                self.next_fetch = offset;
            }
            let target = end.max(offset + self.window).min(self.size);
            while self.next_fetch < target {
                let chunk_end = (self.next_fetch + self.part_size).min(self.size);
                self.spawn_fetch(self.next_fetch, chunk_end);
            }
        }

        let mut out: Option<BytesMut> = None;
        let mut single: Option<Bytes> = None;
        for chunk in self.chunks.iter_mut() {
            if chunk.start >= end {
                break;
            }
            if chunk.end <= offset {
                continue;
            }
            if let ChunkData::Pending(task) = &mut chunk.data {
                let result = task
                    .await
                    .map_err(|e| FsError::Io(format!("{}: fetch task failed: {e}", self.key)))?;
                chunk.data = ChunkData::Ready(result.map_err(|e| FsError::client(&self.key, e))?);
            }
            let ChunkData::Ready(data) = &chunk.data else {
                unreachable!()
            };
            if data.len() as u64 != chunk.end - chunk.start {
                // The client never returns short bodies; if it did, wrong bytes would follow.
                return Err(FsError::Io(format!(
                    "{}: short read from the bucket",
                    self.key
                )));
            }
            let from = (offset.max(chunk.start) - chunk.start) as usize;
            let to = (end.min(chunk.end) - chunk.start) as usize;
            let piece = data.slice(from..to);
            match (&mut out, &single) {
                (None, None) => single = Some(piece),
                (None, Some(first)) => {
                    let mut buf = BytesMut::with_capacity((end - offset) as usize);
                    buf.extend_from_slice(first);
                    buf.extend_from_slice(&piece);
                    out = Some(buf);
                }
                (Some(buf), _) => buf.extend_from_slice(&piece),
            }
        }
        let data = match out {
            Some(buf) => buf.freeze(),
            None => single.unwrap_or_default(),
        };
        if data.len() as u64 != end - offset {
            return Err(FsError::Io(format!(
                "{}: read of {offset}..{end} assembled {} bytes",
                self.key,
                data.len()
            )));
        }
        if sequential {
            self.window = (self.window * 2).min(self.max_window);
        }
        self.last_end = end;
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::WriteCondition;
    use crate::s3::fake::FakeClient;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[tokio::test]
    async fn sequential_and_random_reads_return_the_right_bytes() {
        let fake = Arc::new(FakeClient::new("b", true));
        let data = pattern(3 * 1024 * 1024 + 17);
        let put = fake
            .put_object("k", Bytes::from(data.clone()), WriteCondition::None)
            .await
            .unwrap();
        let mut r = Reader::new(
            fake.clone(),
            "k".into(),
            put.etag,
            data.len() as u64,
            256 * 1024,
            1024 * 1024,
        );
        let mut pos = 0u64;
        while pos < data.len() as u64 {
            let got = r.read(pos, 128 * 1024).await.unwrap();
            assert_eq!(&got[..], &data[pos as usize..(pos as usize + got.len())]);
            assert!(!got.is_empty());
            pos += got.len() as u64;
        }
        for (off, len) in [
            (5u64, 10u32),
            (3_000_000, 200_000),
            (17, 1),
            (3 * 1024 * 1024, 100),
        ] {
            let got = r.read(off, len).await.unwrap();
            let end = (off as usize + len as usize).min(data.len());
            assert_eq!(&got[..], &data[off as usize..end]);
        }
        assert!(r.read(data.len() as u64 + 5, 10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_replaced_object_is_an_error_not_new_bytes() {
        let fake = Arc::new(FakeClient::new("b", true));
        let put = fake
            .put_object("k", Bytes::from(pattern(1000)), WriteCondition::None)
            .await
            .unwrap();
        fake.put_object("k", Bytes::from(vec![1u8; 1000]), WriteCondition::None)
            .await
            .unwrap();
        let mut r = Reader::new(fake, "k".into(), put.etag, 1000, 256 * 1024, 1024 * 1024);
        assert!(matches!(
            r.read(0, 100).await,
            Err(FsError::ObjectChanged { .. })
        ));
    }
}
