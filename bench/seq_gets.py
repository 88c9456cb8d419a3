#!/usr/bin/env python3
"""GETs that one sequential reader costs: files of 3 and 24 MiB (read through the page cache) and of 100 MiB
(direct I/O) are read from start to end through a fresh read-only mount of each given expressfs binary, in
read(2) calls of 1 MiB, 128 KiB and 64 KiB, alternated, on one emulator. Prints the GetObject requests each
read sent (from the daemon's metrics) and checks every byte.

    python3 bench/seq_gets.py [--rounds N] [--ttfb-ms T] [--work DIR] BINARY...
"""

import argparse
import hashlib
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from small_probe import Mount, metrics, probe_emulator, upload  # noqa: E402

FILES = (("seq/f3.bin", 3 << 20), ("seq/f24.bin", 24 << 20), ("seq/f100.bin", 100 << 20))
READ_SIZES = (1 << 20, 128 << 10, 64 << 10)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_through(path, size, expect):
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(size):
            digest.update(chunk)
    return digest.digest() == expect


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ttfb-ms", type=int, default=4)
    ap.add_argument("--work", default="/dev/shm")
    ap.add_argument("--emulator", default="target/release/expressfs-emulator")
    ap.add_argument("binaries", nargs="+")
    args = ap.parse_args()
    data = {rel: os.urandom(size) for rel, size in FILES}
    digests = {rel: hashlib.sha256(body).digest() for rel, body in data.items()}
    with probe_emulator(args.emulator, args.work, "seq-gets-", args.ttfb_ms) as (endpoint, work):
        upload(args.binaries[0], endpoint, work, list(data.items()))
        for rnd in range(1, args.rounds + 1):
            for binary in args.binaries:
                for rel, _ in FILES:
                    for size in READ_SIZES:
                        port = free_port()
                        mount = Mount(binary, endpoint, work, [], port)
                        try:
                            before = metrics(port).get("s3.GetObject", 0)
                            ok = read_through(os.path.join(mount.mnt, rel), size, digests[rel])
                            gets = metrics(port).get("s3.GetObject", 0) - before
                        finally:
                            mount.close()
                        if not ok:
                            raise SystemExit(f"{binary}: {rel} read back wrong bytes")
                        print(f"round {rnd} {binary} {rel} read({size >> 10} KiB): {gets:.0f} GETs", flush=True)


if __name__ == "__main__":
    main()
