#!/usr/bin/env python3
"""How much CPU the emulator spends serving the same bytes to an expressfs mount and to s3torchconnector.

    .venv-pytorch/bin/python bench/emulator_share.py --rounds 4 target/release/expressfs [--syscalls]

16 shards of 100 MiB; 8 processes read every 8th shard in 1 MiB reads, through a fresh read-only mount, or
with s3torchconnector's S3Client (sequential reader), clients alternated. Per run: MiB/s and the emulator's CPU
seconds (/proc/PID/stat); with --syscalls, the emulator's writev, mmap and context-switch counts (perf stat).
Needs s3torchconnector (scripts/install-pytorch-peer.sh). Loopback only; credentials passed explicitly.
"""
import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shard_probe as sp  # noqa: E402
from small_probe import BUCKET, ENV, Mount, probe_emulator, upload  # noqa: E402

MIB = 1 << 20
SHARDS, SIZE = 16, 100 * MIB
EVENTS = "context-switches,syscalls:sys_enter_writev,syscalls:sys_enter_mmap"


def connector_read(endpoint, keys):
    from s3torchconnector import S3ReaderConstructor
    from s3torchconnector._s3client import S3Client, S3ClientConfig

    client = S3Client("us-east-1", endpoint=endpoint, s3client_config=S3ClientConfig(force_path_style=True))
    for key in keys:
        reader = client.get_object(BUCKET, key, reader_constructor=S3ReaderConstructor.sequential())
        sp.read_whole(reader, SIZE, key)


def run(who, binary, endpoint, work, emu, syscalls):
    mount = None
    if who == "mount":
        mount = Mount(binary, endpoint, work, ["--read-only"], 0)
        paths = [f"{mount.mnt}/shards/{i:03}.tar" for i in range(SHARDS)]
        target, args = sp.read_share, lambda w: (paths[w::8], SIZE)
    else:
        keys = [f"shards/{i:03}.tar" for i in range(SHARDS)]
        target, args = connector_read, lambda w: (endpoint, keys[w::8])
    stat = None
    if syscalls:
        stat = subprocess.Popen(["perf", "stat", "-x,", "-e", EVENTS, "-p", str(emu)],
                                stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)
    try:
        cpu0, _ = sp.stat_of(emu)
        t = time.monotonic()
        procs = [mp.get_context("fork").Process(target=target, args=args(w)) for w in range(8)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
            if p.exitcode != 0:
                raise SystemExit(f"{who}: a reader failed")
        elapsed = time.monotonic() - t
        cpu1, _ = sp.stat_of(emu)
    finally:
        if mount:
            mount.close()
    counts = ""
    if stat:
        stat.send_signal(2)
        lines = [l.split(",") for l in stat.communicate()[1].splitlines() if l.count(",") > 3]
        counts = ", " + ", ".join(f"{l[2].replace('syscalls:sys_enter_', '')} {l[0]}" for l in lines)
    print(f"{who:9s} {SHARDS * SIZE / MIB / elapsed:7,.0f} MiB/s, emulator CPU {cpu1 - cpu0:.2f} s{counts}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--emulator", default="target/release/expressfs-emulator")
    ap.add_argument("--work", default="/dev/shm")
    ap.add_argument("--syscalls", action="store_true", help="count the emulator's syscalls with perf stat")
    a = ap.parse_args()
    os.environ.update(ENV)  # the connector's processes take their credentials and region from here
    with probe_emulator(a.emulator, a.work, "emulator-share-", 0) as (endpoint, work):
        body = os.urandom(SIZE)
        upload(a.binary, endpoint, work, ((f"shards/{i:03}.tar", body) for i in range(SHARDS)))
        emu = sp.emulator_pid(work)
        for r in range(a.rounds):
            for who in (["mount", "connector"] if r % 2 == 0 else ["connector", "mount"]):
                run(who, a.binary, endpoint, work, emu, a.syscalls)


if __name__ == "__main__":
    sys.exit(main())
