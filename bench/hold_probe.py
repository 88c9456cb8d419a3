#!/usr/bin/env python3
"""Memory probe: the daemon's RSS while N small files (100 KB) are held open after one read each.

    python3 bench/hold_probe.py --files 2000 BASE NEW

For each binary, alternated, twice: a fresh read-only mount of one data set on the emulator, the files opened
by path (no listing first, so their lookups fetch their first bytes) and read whole, all kept open, then all
closed. With --big-first, a 256 MiB file is read through the mount before (its 8 MiB parts leave the HTTP
client's connections with large read buffers). Prints the daemon's VmRSS before, with every file open, and after closing. Loopback only; credentials
passed explicitly (small_probe.ENV).
"""
import argparse
import os
import time

import small_probe as sp


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--emulator", default="target/release/expressfs-emulator")
    p.add_argument("--work", default="/dev/shm")
    p.add_argument("--big-first", action="store_true")
    p.add_argument("binaries", nargs="+")
    a = p.parse_args()
    with sp.probe_emulator(a.emulator, a.work, "hold-", 0) as (endpoint, work):
        data = [(f"small/{i:06}.jpg", os.urandom(sp.SIZE)) for i in range(a.files)]
        big = [("big/file", os.urandom(256 << 20))] if a.big_first else []
        sp.upload(a.binaries[0], endpoint, work, data + big)
        for _ in range(a.rounds):
            for binary in a.binaries:
                m = sp.Mount(binary, endpoint, work, ["--read-only"], 0)
                try:
                    for rel, body in big:
                        with open(f"{m.mnt}/{rel}", "rb") as f:
                            if f.read() != body:
                                raise SystemExit(f"{rel}: wrong bytes")
                    before, held = rss_mib(m.proc.pid), []
                    for rel, body in data:
                        f = open(f"{m.mnt}/{rel}", "rb")
                        if f.read() != body:
                            raise SystemExit(f"{rel}: wrong bytes")
                        held.append(f)
                    time.sleep(0.5)
                    holding = rss_mib(m.proc.pid)
                    for f in held:
                        f.close()
                    time.sleep(0.5)
                    print(f"{binary}: {a.files} files held open: daemon RSS {before} -> {holding} MiB, "
                          f"{rss_mib(m.proc.pid)} MiB after closing them", flush=True)
                finally:
                    m.close()


if __name__ == "__main__":
    main()
