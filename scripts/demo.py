#!/usr/bin/env python3
"""expressfs demo: emulator + mount + training-style read + checkpoint write, with figures.

Everything talks to 127.0.0.1 only; credentials and region are explicit; instance metadata is disabled.
"""
import argparse
import concurrent.futures as cf
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import boto3
from botocore.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACCESS_KEY, SECRET_KEY, REGION = "AKIDEXPRESSFSTEST", "expressfs-test-secret", "us-east-1"
BUCKET = "demo--use1-az4--x-s3"


def env():
    e = dict(os.environ)
    e.update(AWS_EC2_METADATA_DISABLED="true", AWS_ACCESS_KEY_ID=ACCESS_KEY,
             AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION=REGION)
    e.pop("AWS_PROFILE", None)
    e.pop("AWS_SESSION_TOKEN", None)
    return e


def start_emulator(data_dir, ttfb_ms):
    exe = os.path.join(ROOT, "target/release/expressfs-emulator")
    proc = subprocess.Popen(
        [exe, "--listen", "127.0.0.1:0", "--data-dir", data_dir, "--bucket", BUCKET,
         "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, "--ttfb-ms", str(ttfb_ms)],
        stdout=subprocess.PIPE, text=True, env=env())
    line = proc.stdout.readline()
    if "listening on" not in line:
        raise SystemExit(f"emulator did not start: {line!r}")
    return proc, line.strip().split("listening on ")[1]


def s3(endpoint):
    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=SECRET_KEY,
                        config=Config(s3={"addressing_style": "path"}, max_pool_connections=32))


def populate(client, n_images, image_kb, n_shards, shard_mb):
    rnd = random.Random(7)
    jobs = [(f"train/images/{i // 1000:03d}/img_{i:06d}.jpg", rnd.randbytes(image_kb * 1024)) for i in range(n_images)]
    jobs += [(f"train/shards/shard-{i:04d}.tar", rnd.randbytes(shard_mb << 20)) for i in range(n_shards)]
    digests = {k: hashlib.sha256(v).hexdigest() for k, v in jobs}
    with cf.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: client.put_object(Bucket=BUCKET, Key=kv[0], Body=kv[1]), jobs))
    return digests


def read_file(path):
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--image-kb", type=int, default=100)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mb", type=int, default=64)
    ap.add_argument("--checkpoint-mb", type=int, default=256)
    ap.add_argument("--workers", type=int, default=32)
    ap.add_argument("--ttfb-ms", type=int, default=4, help="emulated time to first byte (S3 Express is ~4 ms)")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="expressfs-demo-")
    mnt = os.path.join(work, "mnt")
    os.mkdir(mnt)
    emu, endpoint = start_emulator(os.path.join(work, "data"), args.ttfb_ms)
    mounted = False
    try:
        print(f"emulator: {endpoint}  bucket: {BUCKET}  ttfb: {args.ttfb_ms} ms")
        client = s3(endpoint)
        t = time.time()
        digests = populate(client, args.images, args.image_kb, args.shards, args.shard_mb)
        print(f"dataset: {args.images} images x {args.image_kb} KB + {args.shards} shards x {args.shard_mb} MiB "
              f"uploaded in {time.time() - t:.1f} s")

        exe = os.path.join(ROOT, "target/release/expressfs")
        t = time.time()
        subprocess.run([exe, BUCKET, mnt, "--endpoint-url", endpoint, "--region", REGION,
                        "--allow-overwrite", "--allow-delete"], check=True, env=env())
        mounted = True
        print(f"mounted {BUCKET} at {mnt} in {time.time() - t:.2f} s")
        print(f"$ ls {mnt}/train  ->  {sorted(os.listdir(os.path.join(mnt, 'train')))}")

        # Training-style read 1: many small files, many workers (an image-folder dataset).
        images = []
        for d, _, files in os.walk(os.path.join(mnt, "train/images")):
            images += [os.path.join(d, f) for f in files]
        t = time.time()
        with cf.ThreadPoolExecutor(args.workers) as pool:
            results = list(pool.map(read_file, images))
        dt = time.time() - t
        bad = sum(1 for p, (h, _) in zip(images, results) if h != digests[os.path.relpath(p, mnt)])
        print(f"small files: {len(images)} read by {args.workers} threads in {dt:.2f} s = "
              f"{len(images) / dt:,.0f} files/s, {sum(n for _, n in results) / dt / 1e6:,.0f} MB/s, "
              f"sha256 mismatches: {bad}")

        # Training-style read 2: shards read sequentially, one worker per shard (WebDataset-style).
        shards = sorted(os.path.join(mnt, "train/shards", f) for f in os.listdir(os.path.join(mnt, "train/shards")))
        t = time.time()
        with cf.ThreadPoolExecutor(len(shards)) as pool:
            results = list(pool.map(read_file, shards))
        dt = time.time() - t
        bad += sum(1 for p, (h, _) in zip(shards, results) if h != digests[os.path.relpath(p, mnt)])
        print(f"shards: {len(shards)} x {args.shard_mb} MiB read in parallel in {dt:.2f} s = "
              f"{sum(n for _, n in results) / dt / 1e6:,.0f} MB/s")

        # Checkpoint write through the mount, then read back and compare with the bucket.
        ckpt = os.path.join(mnt, "checkpoints/epoch-0001.pt")
        os.makedirs(os.path.dirname(ckpt), exist_ok=True)
        payload = random.Random(1).randbytes(1 << 20)
        h = hashlib.sha256()
        t = time.time()
        with open(ckpt, "wb") as f:
            for _ in range(args.checkpoint_mb):
                f.write(payload)
                h.update(payload)
            f.flush()
            os.fsync(f.fileno())
        dt = time.time() - t
        stored = hashlib.sha256(client.get_object(Bucket=BUCKET, Key="checkpoints/epoch-0001.pt")["Body"].read()).hexdigest()
        print(f"checkpoint: {args.checkpoint_mb} MiB written + fsync in {dt:.2f} s = {args.checkpoint_mb * 1.048576 / dt:,.0f} MB/s, "
              f"bucket copy {'matches' if stored == h.hexdigest() else 'DIFFERS'}")
        if bad or stored != h.hexdigest():
            print("demo FAILED: data mismatch")
            return 1
        print("demo OK")
        return 0
    finally:
        if mounted:
            subprocess.run(["umount", mnt])
            time.sleep(0.5)
        emu.terminate()
        emu.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
