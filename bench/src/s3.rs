//! The raw aws-sdk-s3 side: the client, uploading the data set, and the limit of each workload (the best
//! request pattern we know for the same bytes, with no FUSE in the way).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::{Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;
use futures::StreamExt;

/// The emulator's long-term credentials (its defaults; every client in the suite is given them explicitly).
pub const KEY: &str = "AKIDEXPRESSFSTEST";
pub const SECRET: &str = "expressfs-test-secret";
pub const REGION: &str = "us-east-1";
pub const MIB: u64 = 1024 * 1024;

/// Size of one ranged GET of the limit readers.
pub const RANGE: u64 = 8 * MIB;

pub fn client(endpoint: &str) -> Client {
    let config = aws_sdk_s3::config::Builder::new()
        .behavior_version_latest()
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new(KEY, SECRET, None, None, "bench"))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .build();
    Client::from_conf(config)
}

/// Incompressible deterministic bytes (xorshift), so no layer can cheat by compressing.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Every part of a [`put_big`] object holds the same bytes: this pattern, cut short in the last part.
const BIG_PART: u64 = 64 * MIB;
const BIG_SEED: u64 = 7;

/// The bytes of an object written by [`put_big`], to check what a client read.
pub struct BigObject {
    part: Vec<u8>,
}

impl Default for BigObject {
    fn default() -> BigObject {
        BigObject {
            part: pattern(BIG_SEED, BIG_PART as usize),
        }
    }
}

impl BigObject {
    /// Whether `buf` is what the object holds at `off`.
    pub fn matches(&self, off: u64, buf: &[u8]) -> bool {
        let mut at = off;
        let mut rest = buf;
        while !rest.is_empty() {
            let in_part = (at % BIG_PART) as usize;
            let n = rest.len().min(self.part.len() - in_part);
            if rest[..n] != self.part[in_part..in_part + n] {
                return false;
            }
            rest = &rest[n..];
            at += n as u64;
        }
        true
    }
}

/// Uploads `mib` MiB as a multipart upload with 64 MiB parts, four in flight. Memory stays bounded whatever
/// the size: every part is a slice of the same 64 MiB buffer, so a 4 GiB object costs 64 MiB of RAM.
pub async fn put_big(c: &Client, bucket: &str, key: &str, mib: u64) -> Result<()> {
    let id = c
        .create_multipart_upload()
        .bucket(bucket)
        .key(key)
        .checksum_algorithm(ChecksumAlgorithm::Crc32C)
        .send()
        .await?
        .upload_id
        .unwrap_or_default();
    let part = Bytes::from(pattern(BIG_SEED, BIG_PART as usize));
    let count = mib.div_ceil(64);
    // Four parts in flight, CRC32C-checked and not hashed for the signature, as a tuned uploader (and
    // expressfs) sends them: this is the limit for the checkpoint workload.
    let uploads = futures::stream::iter(1..=count).map(|n| {
        let len = if n == count {
            ((mib - 64 * (count - 1)) * MIB) as usize
        } else {
            (64 * MIB) as usize
        };
        let (c, body, id) = (c.clone(), part.slice(..len), id.clone());
        async move {
            let out = c
                .upload_part()
                .bucket(bucket)
                .key(key)
                .upload_id(&id)
                .part_number(n as i32)
                .checksum_algorithm(ChecksumAlgorithm::Crc32C)
                .body(ByteStream::from(body))
                .customize()
                .disable_payload_signing()
                .send()
                .await?;
            Ok::<_, anyhow::Error>(
                CompletedPart::builder()
                    .part_number(n as i32)
                    .set_e_tag(out.e_tag)
                    .set_checksum_crc32_c(out.checksum_crc32_c)
                    .build(),
            )
        }
    });
    let parts: Vec<_> = uploads
        .buffered(4)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    complete(c, bucket, key, &id, parts).await
}

async fn complete(
    c: &Client,
    bucket: &str,
    key: &str,
    id: &str,
    parts: Vec<CompletedPart>,
) -> Result<()> {
    c.complete_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(parts))
                .build(),
        )
        .send()
        .await?;
    Ok(())
}

/// PUTs many small objects, `concurrency` at a time. Takes an iterator so 100,000 keys are never all
/// materialised as tasks at once.
pub async fn put_many(
    c: &Client,
    bucket: &str,
    objects: impl Iterator<Item = (String, Bytes)>,
    concurrency: usize,
) -> Result<()> {
    let mut puts = futures::stream::iter(objects)
        .map(|(key, body)| async move {
            c.put_object()
                .bucket(bucket)
                .key(key)
                .body(ByteStream::from(body))
                .send()
                .await?;
            Ok::<_, anyhow::Error>(())
        })
        .buffer_unordered(concurrency);
    while let Some(done) = puts.next().await {
        done?;
    }
    Ok(())
}

/// Every key of a bucket (no delimiter), in listing order.
async fn all_keys(c: &Client, bucket: &str) -> Result<Vec<String>> {
    let mut keys = Vec::new();
    let mut token = None;
    loop {
        let out = c
            .list_objects_v2()
            .bucket(bucket)
            .set_continuation_token(token)
            .send()
            .await?;
        keys.extend(
            out.contents()
                .iter()
                .filter_map(|o| o.key().map(String::from)),
        );
        token = out.next_continuation_token.clone();
        if token.is_none() {
            return Ok(keys);
        }
    }
}

/// Copies every object of `from` into `to` with server-side CopyObject: s3fs cannot use a directory bucket,
/// so it reads a general-purpose twin holding the same bytes under the same keys. Returns the object count.
pub async fn mirror(c: &Client, from: &str, to: &str) -> Result<usize> {
    let keys = all_keys(c, from).await?;
    let mut copies = futures::stream::iter(&keys)
        .map(|key| async move {
            c.copy_object()
                .bucket(to)
                .key(key)
                .copy_source(format!("{from}/{key}"))
                .send()
                .await?;
            Ok::<_, anyhow::Error>(())
        })
        .buffer_unordered(32);
    while let Some(done) = copies.next().await {
        done?;
    }
    Ok(keys.len())
}

/// One ranged GET, whole body in memory.
pub async fn get_range(c: &Client, bucket: &str, key: &str, start: u64, end: u64) -> Result<Bytes> {
    let out = c
        .get_object()
        .bucket(bucket)
        .key(key)
        .range(format!("bytes={start}-{end}"))
        .send()
        .await?;
    let body = out.body.collect().await?.into_bytes();
    anyhow::ensure!(body.len() as u64 == end - start + 1, "short body");
    Ok(body)
}

/// The limit for one big object: 16 parallel 8 MiB ranged GETs over it. Returns MB/s.
pub async fn raw_read(c: &Client, bucket: &str, key: &str, size: u64) -> Result<f64> {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let chunks = size.div_ceil(RANGE) as usize;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (c, bucket, key, next) = (
            c.clone(),
            bucket.to_string(),
            key.to_string(),
            Arc::clone(&next),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= chunks {
                    return Ok::<_, anyhow::Error>(());
                }
                let start = i as u64 * RANGE;
                let end = (start + RANGE).min(size) - 1;
                get_range(&c, &bucket, &key, start, end).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(size as f64 / MIB as f64 / started.elapsed().as_secs_f64())
}

/// Limit of workload 2: the four `par/` objects, each read by its own `raw_read`. Returns MB/s.
pub async fn limit_parallel(c: &Client, bucket: &str, quarter: u64) -> Result<f64> {
    let started = Instant::now();
    let mut readers = Vec::new();
    for i in 0..4 {
        let (c, b) = (c.clone(), bucket.to_string());
        readers.push(tokio::spawn(async move {
            raw_read(&c, &b, &format!("par/{i}.bin"), quarter).await
        }));
    }
    for r in readers {
        r.await??;
    }
    Ok((4 * quarter) as f64 / MIB as f64 / started.elapsed().as_secs_f64())
}

/// The offsets of the random-read workload: a fixed LCG, so every client reads the same places.
pub fn random_offsets(seed: u64, count: usize, size: u64, len: u64) -> Vec<u64> {
    let mut s = seed;
    (0..count)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) % (size - len)
        })
        .collect()
}

/// Limit of workload 3: one ranged GET of `len` bytes after the other. Returns reads/s over the time spent
/// in the GETs, as the mount's figure counts only its `read(2)`s.
pub async fn limit_random(
    c: &Client,
    bucket: &str,
    big: u64,
    reads: usize,
    len: u64,
) -> Result<f64> {
    let mut busy = Duration::ZERO;
    for off in random_offsets(99, reads, big, len) {
        let started = Instant::now();
        get_range(c, bucket, "big/seq.bin", off, off + len - 1).await?;
        busy += started.elapsed();
    }
    Ok(reads as f64 / busy.as_secs_f64())
}

/// Limit of workload 4: 64 concurrent whole-object GETs. Returns files/s.
pub async fn limit_small(c: &Client, bucket: &str, n: usize) -> Result<f64> {
    let started = Instant::now();
    let mut gets = futures::stream::iter(0..n)
        .map(|i| async move {
            c.get_object()
                .bucket(bucket)
                .key(format!("small/{i:06}.jpg"))
                .send()
                .await?
                .body
                .collect()
                .await?;
            Ok::<_, anyhow::Error>(())
        })
        .buffer_unordered(64);
    while let Some(done) = gets.next().await {
        done?;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Limit of workload 5: ListObjectsV2 pages over `list/`. Returns (entries, entries/s).
pub async fn limit_list(c: &Client, bucket: &str) -> Result<(usize, f64)> {
    let started = Instant::now();
    let mut token = None;
    let mut count = 0usize;
    loop {
        let out = c
            .list_objects_v2()
            .bucket(bucket)
            .prefix("list/")
            .delimiter("/")
            .set_continuation_token(token)
            .send()
            .await?;
        count += out.contents().len();
        token = out.next_continuation_token.clone();
        if token.is_none() {
            return Ok((count, count as f64 / started.elapsed().as_secs_f64()));
        }
    }
}

/// A `std::io::Write` that turns a byte stream into a multipart upload, one part per `part_size` bytes,
/// so a producer such as `tar::Builder` can write an object of any size with one part in memory.
/// Must be used from a thread outside the runtime (it blocks on each part).
pub struct MultipartWriter {
    rt: tokio::runtime::Handle,
    c: Client,
    bucket: String,
    key: String,
    upload_id: String,
    part_size: usize,
    buf: Vec<u8>,
    parts: Vec<CompletedPart>,
    written: u64,
}

impl MultipartWriter {
    pub fn create(
        rt: &tokio::runtime::Handle,
        c: &Client,
        bucket: &str,
        key: &str,
        part_size: usize,
    ) -> Result<MultipartWriter> {
        let upload_id = rt
            .block_on(c.create_multipart_upload().bucket(bucket).key(key).send())?
            .upload_id
            .unwrap_or_default();
        Ok(MultipartWriter {
            rt: rt.clone(),
            c: c.clone(),
            bucket: bucket.into(),
            key: key.into(),
            upload_id,
            part_size,
            buf: Vec::with_capacity(part_size),
            parts: Vec::new(),
            written: 0,
        })
    }

    fn upload_buffered(&mut self) -> Result<()> {
        let n = self.parts.len() as i32 + 1;
        let body = std::mem::replace(&mut self.buf, Vec::with_capacity(self.part_size));
        let out = self.rt.block_on(
            self.c
                .upload_part()
                .bucket(&self.bucket)
                .key(&self.key)
                .upload_id(&self.upload_id)
                .part_number(n)
                .body(ByteStream::from(body))
                .send(),
        )?;
        self.parts.push(
            CompletedPart::builder()
                .part_number(n)
                .set_e_tag(out.e_tag)
                .build(),
        );
        Ok(())
    }

    /// Uploads the last (short) part and completes the upload. Returns the object size.
    pub fn finish(mut self) -> Result<u64> {
        if !self.buf.is_empty() || self.parts.is_empty() {
            self.upload_buffered()?;
        }
        let parts = std::mem::take(&mut self.parts);
        self.rt.block_on(complete(
            &self.c,
            &self.bucket,
            &self.key,
            &self.upload_id,
            parts,
        ))?;
        Ok(self.written)
    }
}

impl std::io::Write for MultipartWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let take = data.len().min(self.part_size - self.buf.len());
        self.buf.extend_from_slice(&data[..take]);
        self.written += take as u64;
        if self.buf.len() == self.part_size {
            self.upload_buffered().map_err(std::io::Error::other)?;
        }
        Ok(take)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // Parts go out when full; a partial part cannot be uploaded early (parts but the last are >= 5 MiB).
        Ok(())
    }
}

/// The bundled emulator serving `buckets` with our credentials and a time to first byte of `ttfb`, its data
/// in a new directory named `prefix...` under `dir` (the temporary directory if None), removed with the
/// returned guard.
pub fn start_emulator(
    prefix: &str,
    dir: Option<&std::path::Path>,
    buckets: &[&str],
    ttfb: Duration,
) -> Result<(tempfile::TempDir, expressfs_emulator::Emulator)> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(prefix);
    let data = match dir {
        Some(dir) => builder.tempdir_in(dir)?,
        None => builder.tempdir()?,
    };
    let emu = expressfs_emulator::Emulator::start_background(expressfs_emulator::EmulatorConfig {
        data_dir: data.path().join("emulator"),
        buckets: buckets.iter().map(|b| b.to_string()).collect(),
        access_key: KEY.into(),
        secret_key: SECRET.into(),
        ttfb,
        ..Default::default()
    })?;
    Ok((data, emu))
}

/// One request to the emulator's admin endpoints (`/_emulator/...`); the answer's body, or None if the
/// emulator cannot be reached.
pub fn emulator_admin(endpoint: &str, method: &str, path: &str, body: &str) -> Option<String> {
    use std::io::{Read, Write};
    let addr = endpoint.strip_prefix("http://")?;
    let mut conn = std::net::TcpStream::connect(addr).ok()?;
    conn.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    // HTTP/1.0: the server closes after the answer, so reading to the end is the whole response.
    write!(
        conn,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).ok()?;
    Some(answer.split_once("\r\n\r\n")?.1.to_string())
}

/// GetObject requests the emulator has answered so far and the body bytes those answers declared
/// (summed over buckets), from its `/_emulator/stats` counters. "Declared": a client that asks for a long
/// range and hangs up early is counted for the whole range. Differences across a workload show how a
/// client fetches. None if the counters cannot be read (the figures are informative only).
pub fn emulator_gets(endpoint: &str) -> Option<(u64, u64)> {
    let body = emulator_admin(endpoint, "GET", "/_emulator/stats", "")?;
    // Each bucket has a `"GetObject": {"requests": N, ..., "bytes_out": M}` object; no JSON parser needed
    // for our own flat format.
    let (mut gets, mut bytes) = (0, 0);
    for op in body.split("\"GetObject\"").skip(1) {
        let fields = op.split('}').next().unwrap_or("");
        gets += number_after(fields, "\"requests\"")?;
        bytes += number_after(fields, "\"bytes_out\"")?;
    }
    Some((gets, bytes))
}

/// Request-body bytes the emulator has received so far, every operation of every bucket (its
/// `/_emulator/stats` counters). None if they cannot be read.
pub fn emulator_bytes_in(endpoint: &str) -> Option<u64> {
    let body = emulator_admin(endpoint, "GET", "/_emulator/stats", "")?;
    body.split("\"bytes_in\"").skip(1).map(leading_number).sum()
}

/// The integer following `name` and a colon in `text`.
fn number_after(text: &str, name: &str) -> Option<u64> {
    leading_number(text.split_once(name)?.1)
}

/// The integer at the start of `rest`, after a colon and spaces.
fn leading_number(rest: &str) -> Option<u64> {
    let digits: String = rest
        .trim_start_matches([':', ' '])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_object_matches_across_parts_and_catches_a_wrong_byte() {
        let object = BigObject::default();
        let part = &object.part;
        let n = part.len();
        let across = [part[n - 2], part[n - 1], part[0], part[1]];
        assert!(object.matches(BIG_PART - 2, &across));
        assert!(object.matches(3 * BIG_PART + 10, &part[10..15]));
        let mut wrong = across;
        wrong[3] ^= 1;
        assert!(!object.matches(BIG_PART - 2, &wrong));
        assert!(!object.matches(BIG_PART - 1, &across));
    }
}
