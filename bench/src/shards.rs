//! Workload 6: WebDataset-style tar shards. Each shard is a real ustar archive of samples, each sample a
//! `NNNNNN.jpg` of ~113 KB plus a small `NNNNNN.cls` label, as a training data loader would stream them.
//! Readers parse the tar headers as they go and count samples, so the figure is samples/s.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use anyhow::{Context, Result, ensure};
use aws_sdk_s3::Client;
use futures::StreamExt;

use crate::s3::{MIB, MultipartWriter, RANGE, get_range, pattern};

const BLOCK: usize = 512;
/// tar ends with two zero blocks.
const END_OF_ARCHIVE: u64 = 2 * BLOCK as u64;
/// Nominal image size; each sample varies a little around it so the tar padding is exercised.
const JPG_BYTES: usize = 113_000;
const JPG_SPREAD: usize = 4096;
/// Fixed mtime: the shards are byte-identical from run to run.
const MTIME: u64 = 1_700_000_000;
/// Threads (and tasks, for the limit) reading shards at once, like 8 data-loader workers.
pub const WORKERS: usize = 8;
/// Read size of the file-system readers.
const READ_SIZE: usize = MIB as usize;

/// The shards as uploaded.
#[derive(Clone, Debug)]
pub struct ShardSet {
    pub keys: Vec<String>,
    pub sizes: Vec<u64>,
    pub samples: u64,
}

/// Bytes a file of `len` bytes takes in a tar stream: header plus data padded to whole blocks.
fn tar_len(len: usize) -> u64 {
    (BLOCK + len.div_ceil(BLOCK) * BLOCK) as u64
}

/// Image size of sample `n` (a cheap hash spreads the sizes around `JPG_BYTES`).
fn jpg_len(n: u64) -> usize {
    let h = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    JPG_BYTES - JPG_SPREAD / 2 + (h as usize % JPG_SPREAD)
}

fn label(n: u64) -> String {
    format!("{}\n", n % 1000)
}

fn file_header(name: &str, len: usize) -> Result<tar::Header> {
    let mut h = tar::Header::new_ustar();
    h.set_path(name)?;
    h.set_size(len as u64);
    h.set_mode(0o644);
    h.set_mtime(MTIME);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    Ok(h)
}

/// Uploads `count` shards of at most `shard_mib` MiB each, streaming every shard as a multipart upload so
/// memory holds one 16 MiB part whatever the shard size.
pub fn write_shards(
    rt: &tokio::runtime::Handle,
    c: &Client,
    bucket: &str,
    count: usize,
    shard_mib: u64,
) -> Result<ShardSet> {
    let image = pattern(11, JPG_BYTES + JPG_SPREAD);
    let mut set = ShardSet {
        keys: Vec::new(),
        sizes: Vec::new(),
        samples: 0,
    };
    for s in 0..count {
        let key = format!("shards/shard-{s:06}.tar");
        let first = set.samples;
        let out = MultipartWriter::create(rt, c, bucket, &key, (16 * MIB) as usize)?;
        let mut tar = tar::Builder::new(out);
        let mut used = 0u64;
        let mut n = first;
        loop {
            let (jpg, cls) = (jpg_len(n), label(n));
            let sample = tar_len(jpg) + tar_len(cls.len());
            if used + sample + END_OF_ARCHIVE > shard_mib * MIB {
                break;
            }
            tar.append(&file_header(&format!("{n:06}.jpg"), jpg)?, &image[..jpg])?;
            tar.append(
                &file_header(&format!("{n:06}.cls"), cls.len())?,
                cls.as_bytes(),
            )?;
            used += sample;
            n += 1;
        }
        ensure!(n > first, "--shard-mib {shard_mib} cannot hold one sample");
        // into_inner writes the end-of-archive blocks.
        let size = tar.into_inner()?.finish()?;
        set.keys.push(key);
        set.sizes.push(size);
        set.samples = n;
    }
    Ok(set)
}

/// The sample key of a tar member: the path up to the first dot of its file name (WebDataset's rule, so
/// `000042.jpg` and `000042.cls` are one sample).
fn sample_key(path: &[u8]) -> &[u8] {
    let name_start = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    match path[name_start..].iter().position(|&b| b == b'.') {
        Some(dot) => &path[..name_start + dot],
        None => path,
    }
}

/// Counts samples in a tar stream fed in chunks of any size, checking each header's checksum. Data blocks
/// are skipped without being looked at, as a loader that hands bytes to a decoder would.
pub struct SampleCounter {
    header: [u8; BLOCK],
    filled: usize,
    skip: u64,
    last_key: Vec<u8>,
    samples: u64,
    ended: bool,
}

impl Default for SampleCounter {
    fn default() -> Self {
        SampleCounter {
            header: [0; BLOCK],
            filled: 0,
            skip: 0,
            last_key: Vec::new(),
            samples: 0,
            ended: false,
        }
    }
}

impl SampleCounter {
    pub fn feed(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            if self.ended {
                // After the end marker only zero padding may follow.
                ensure!(data.iter().all(|&b| b == 0), "data after end of archive");
                return Ok(());
            }
            if self.skip > 0 {
                let n = self.skip.min(data.len() as u64) as usize;
                self.skip -= n as u64;
                data = &data[n..];
                continue;
            }
            let n = (BLOCK - self.filled).min(data.len());
            self.header[self.filled..self.filled + n].copy_from_slice(&data[..n]);
            self.filled += n;
            data = &data[n..];
            if self.filled == BLOCK {
                self.filled = 0;
                self.on_header()?;
            }
        }
        Ok(())
    }

    fn on_header(&mut self) -> Result<()> {
        if self.header.iter().all(|&b| b == 0) {
            self.ended = true;
            return Ok(());
        }
        let h = tar::Header::from_byte_slice(&self.header);
        // The checksum is the byte sum of the header with its own field read as spaces.
        let sum: u32 = self
            .header
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    b as u32
                }
            })
            .sum();
        ensure!(h.cksum()? == sum, "bad tar header checksum");
        self.skip = h.entry_size()?.div_ceil(BLOCK as u64) * BLOCK as u64;
        if h.entry_type().is_file() {
            let path = h.path_bytes();
            let key = sample_key(&path);
            if key != self.last_key.as_slice() {
                self.samples += 1;
                self.last_key = key.to_vec();
            }
        }
        Ok(())
    }

    /// The sample count, once the whole archive went through.
    pub fn finish(self) -> Result<u64> {
        ensure!(
            self.ended && self.skip == 0 && self.filled == 0,
            "tar stream truncated"
        );
        Ok(self.samples)
    }
}

/// One shard through the raw client: 8 MiB ranged GETs, two in flight, fed to the counter in order.
async fn raw_shard(c: &Client, bucket: &str, key: &str, size: u64) -> Result<u64> {
    let ranges = (0..size.div_ceil(RANGE)).map(|i| (i * RANGE, ((i + 1) * RANGE).min(size) - 1));
    let mut bodies = futures::stream::iter(ranges)
        .map(|(start, end)| get_range(c, bucket, key, start, end))
        .buffered(2);
    let mut counter = SampleCounter::default();
    while let Some(body) = bodies.next().await {
        counter.feed(&body?)?;
    }
    counter.finish()
}

/// The limit: 8 tasks take shards one after the other, two 8 MiB GETs in flight each (16 in all, as in
/// `raw_read`). Returns the number of samples counted.
pub async fn raw_samples(c: &Client, bucket: &str, set: &ShardSet) -> Result<u64> {
    let next = Arc::new(AtomicUsize::new(0));
    let total = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..WORKERS {
        let (c, bucket, set) = (c.clone(), bucket.to_string(), set.clone());
        let (next, total) = (Arc::clone(&next), Arc::clone(&total));
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= set.keys.len() {
                    return Ok::<_, anyhow::Error>(());
                }
                let n = raw_shard(&c, &bucket, &set.keys[i], set.sizes[i]).await?;
                total.fetch_add(n, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(total.load(Ordering::Relaxed))
}

/// One shard through a mount: plain 1 MiB `read(2)`s from start to end.
fn fs_shard(path: &Path, size: u64) -> Result<u64> {
    let mut f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut buf = vec![0u8; READ_SIZE];
    let mut counter = SampleCounter::default();
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        counter.feed(&buf[..n])?;
    }
    ensure!(
        total == size,
        "{}: read {total} of {size} bytes",
        path.display()
    );
    counter.finish()
}

/// 8 threads take shards one after the other from the mount at `root`. Returns the samples counted.
pub fn fs_samples(root: &Path, set: &ShardSet) -> Result<u64> {
    let next = AtomicUsize::new(0);
    let total = AtomicU64::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= set.keys.len() {
                            return Ok(());
                        }
                        let n = fs_shard(&root.join(&set.keys[i]), set.sizes[i])?;
                        total.fetch_add(n, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("shard reader panicked"))??;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(total.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard built with the same headers as `write_shards`, in memory.
    fn shard(samples: u64) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        for n in 0..samples {
            let jpg = vec![7u8; jpg_len(n)];
            tar.append(
                &file_header(&format!("{n:06}.jpg"), jpg.len()).unwrap(),
                &jpg[..],
            )
            .unwrap();
            let cls = label(n);
            tar.append(
                &file_header(&format!("{n:06}.cls"), cls.len()).unwrap(),
                cls.as_bytes(),
            )
            .unwrap();
        }
        tar.into_inner().unwrap()
    }

    #[test]
    fn counts_samples_whatever_the_chunking() {
        let data = shard(5);
        for chunk in [1, 7, 511, 512, 513, 4096, data.len()] {
            let mut c = SampleCounter::default();
            for piece in data.chunks(chunk) {
                c.feed(piece).unwrap();
            }
            assert_eq!(c.finish().unwrap(), 5, "chunk {chunk}");
        }
    }

    #[test]
    fn sizes_match_the_tar_layout() {
        let data = shard(3);
        let expected: u64 = (0..3)
            .map(|n| tar_len(jpg_len(n)) + tar_len(label(n).len()))
            .sum::<u64>();
        assert_eq!(data.len() as u64, expected + END_OF_ARCHIVE);
    }

    #[test]
    fn rejects_truncation_and_bad_checksums() {
        let data = shard(2);
        let mut c = SampleCounter::default();
        c.feed(&data[..data.len() / 2]).unwrap();
        assert!(c.finish().is_err());

        let mut bad = data.clone();
        bad[0] ^= 1;
        assert!(SampleCounter::default().feed(&bad).is_err());
    }

    #[test]
    fn sample_keys_follow_webdataset() {
        assert_eq!(sample_key(b"000042.jpg"), b"000042");
        assert_eq!(sample_key(b"a.b/000042.seg.png"), b"a.b/000042");
        assert_eq!(sample_key(b"noext"), b"noext");
    }
}
