#!/usr/bin/env python3
"""A/B probe for what a directory listing costs the daemon: one emulator holding one directory of N keys
(written with boto3), then for each binary, alternated, a fresh read-only mount with `--metadata-ttl 0` (every
readdir lists the bucket again) that lists the directory `--listings` times. Prints the wall time and the
daemon's CPU per listed key (/proc/PID/stat).

    .venv/bin/python bench/list_probe.py --keys 20000 NEW_BINARY BASE_BINARY
"""

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import tempfile
import time

import boto3
from botocore.config import Config

BUCKET = "listprobe--use1-az4--x-s3"
ENV = dict(
    AWS_EC2_METADATA_DISABLED="true",
    AWS_ACCESS_KEY_ID="AKIDEXPRESSFSTEST",
    AWS_SECRET_ACCESS_KEY="expressfs-test-secret",
    AWS_REGION="us-east-1",
)


def cpu_of(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(binary, endpoint, work, keys, listings):
    mnt = tempfile.mkdtemp(dir=work, prefix="mnt-")
    daemon = subprocess.Popen(
        [binary, BUCKET, mnt, "--endpoint-url", endpoint, "--read-only", "--metadata-ttl", "0", "-f"],
        env={**os.environ, **ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 20
        while not os.path.ismount(mnt):
            if daemon.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{binary} did not mount")
            time.sleep(0.05)
        os.listdir(os.path.join(mnt, "d"))  # the first listing starts the session and the connections
        cpu0, t0 = cpu_of(daemon.pid), time.perf_counter()
        for _ in range(listings):
            found = len(os.listdir(os.path.join(mnt, "d")))
            if found != keys:
                raise RuntimeError(f"{binary}: listed {found} entries, expected {keys}")
        return time.perf_counter() - t0, cpu_of(daemon.pid) - cpu0
    finally:
        subprocess.run(["umount", mnt], check=False)
        daemon.wait(timeout=20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--keys", type=int, default=20000)
    ap.add_argument("--listings", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--emulator", default="target/release/expressfs-emulator")
    ap.add_argument("--work", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    a = ap.parse_args()
    os.environ.update(ENV)
    work = tempfile.mkdtemp(dir=a.work, prefix="list-probe-")
    emu = subprocess.Popen(
        [a.emulator, "--listen", "127.0.0.1:0", "--data-dir", f"{work}/data", "--bucket", BUCKET],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        endpoint = emu.stdout.readline().split("listening on ")[1].strip()
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, max_pool_connections=32),
        )
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda i: s3.put_object(Bucket=BUCKET, Key=f"d/file-{i:07d}.jpg", Body=b"x"), range(a.keys)))
        print(f"{a.listings} listings of {a.keys} keys per mount")
        for r in range(a.rounds):
            order = a.binaries if r % 2 == 0 else list(reversed(a.binaries))
            for binary in order:
                wall, cpu = measure(binary, endpoint, work, a.keys, a.listings)
                per_key = cpu / (a.listings * a.keys) * 1e6
                print(f"round {r} {binary}: {wall:.2f} s, daemon CPU {cpu:.2f} s ({per_key:.1f} us per listed key)")
    finally:
        emu.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
