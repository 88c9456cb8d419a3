#!/usr/bin/env python3
"""A/B probe for many writers at once: each given expressfs binary (or a wrapper script that execs one)
mounted fresh, writable, per workload, alternated, on one emulator.

    python3 bench/write_probe.py --rounds 4 /dev/shm/expressfs-base target/release/expressfs

Two workloads:
  small  32 threads, each writing 100 files of 100 KB (3,200 PutObjects);
  big    8 threads, each writing one 64 MiB file in 1 MiB writes (multipart uploads side by side).
Per run: seconds, the daemon's CPU seconds (/proc/PID/stat) and its peak RSS (VmHWM). Each file's size is
checked through the mount afterwards. Loopback only; credentials passed explicitly.
"""
import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shard_probe import peak_rss_mib  # noqa: E402
from small_probe import Mount, cpu_of, probe_emulator  # noqa: E402

MIB = 1 << 20
SMALL = 100_000


def in_threads(n, work):
    threads = [threading.Thread(target=work, args=(t,)) for t in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def small_writers(root, tag):
    body = os.urandom(SMALL)

    def write(t):
        d = f"{root}/{tag}/t{t}"
        os.makedirs(d, exist_ok=True)
        for i in range(100):
            with open(f"{d}/{i}.bin", "wb") as f:
                f.write(body)

    in_threads(32, write)
    return [(f"{root}/{tag}/t{t}/{i}.bin", SMALL) for t in range(32) for i in range(100)]


def big_writers(root, tag):
    chunk = os.urandom(MIB)

    def write(t):
        with open(f"{root}/{tag}-{t}.bin", "wb") as f:
            for _ in range(64):
                f.write(chunk)

    in_threads(8, write)
    return [(f"{root}/{tag}-{t}.bin", 64 * MIB) for t in range(8)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--ttfb-ms", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--emulator", default="target/release/expressfs-emulator")
    ap.add_argument("--work", default="/dev/shm")
    a = ap.parse_args()
    with probe_emulator(a.emulator, a.work, "write-probe-", a.ttfb_ms) as (endpoint, work):
        for r in range(a.rounds):
            order = a.binaries if r % 2 == 0 else a.binaries[::-1]
            for b in order:
                for name, workload in (("small", small_writers), ("big", big_writers)):
                    m = Mount(b, endpoint, work, [], 0)
                    try:
                        started = time.monotonic()
                        written = workload(m.mnt, f"r{r}-{name}-{a.binaries.index(b)}")
                        elapsed = time.monotonic() - started
                        cpu, rss = cpu_of(m.proc.pid), peak_rss_mib(m.proc.pid)
                        for path, size in written:
                            if os.path.getsize(path) != size:
                                raise SystemExit(f"{path}: {os.path.getsize(path)} bytes, expected {size}")
                    finally:
                        m.close()
                    print(f"round {r} {b} {name}: {elapsed:.2f} s, daemon CPU {cpu:.2f} s, peak RSS {int(rss)} MiB",
                          flush=True)


if __name__ == "__main__":
    sys.exit(main())
