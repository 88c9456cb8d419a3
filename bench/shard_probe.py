#!/usr/bin/env python3
"""A/B probe for the sequential path with several readers: 16 shard files of 100 MiB read through a fresh
read-only mount of each given expressfs binary, alternated, on one emulator holding one data set.

    python3 bench/shard_probe.py --rounds 3 /dev/shm/expressfs-base target/release/expressfs

8 processes each read every 8th shard in 1 MiB reads (the tar-shard DataLoader's pattern, without torch).
Per pass: MiB/s, CPU seconds and minor page faults of the daemon (/proc/PID/stat), the readers' and the
emulator's CPU; per mount, the daemon's peak RSS. `--passes N` reads the data set N times through each mount:
the first pass pays for every buffer the daemon touches for the first time, later ones show it settled.
`--idle S` leaves each mount idle S seconds after its last pass and prints its RSS before and after.
Loopback only; credentials passed explicitly.
"""
import argparse
import multiprocessing as mp
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from small_probe import Mount, probe_emulator, upload  # noqa: E402

MIB = 1 << 20


def stat_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


def read_whole(reader, expect, what):
    """Reads `reader` to its end in 1 MiB reads; exits unless it held `expect` bytes."""
    n = 0
    while True:
        b = reader.read(MIB)
        if not b:
            break
        n += len(b)
    if n != expect:
        raise SystemExit(f"{what}: {n} bytes, expected {expect}")


def read_share(paths, expect):
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            read_whole(f, expect, p)


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def emulator_pid(work):
    """The pid of the emulator serving from `work` (probe_emulator started it with its data there)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if f"{work}/data".encode() in argv and any(a.endswith(b"expressfs-emulator") for a in argv):
            return int(pid)
    raise SystemExit("emulator process not found")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def measure(binary, endpoint, work, extra, shards, size, readers, passes, idle):
    """Per pass (MiB/s, daemon CPU s, daemon minor faults, readers' CPU s, emulator CPU s); the daemon's peak
    RSS; its RSS right after the last pass and `idle` seconds later (None when `idle` is 0)."""
    emu = emulator_pid(work)
    m = Mount(binary, endpoint, work, extra + ["--read-only"], 0)
    rows = []
    try:
        paths = [f"{m.mnt}/shards/{i:03}.tar" for i in range(shards)]
        for _ in range(passes):
            cpu0, flt0 = stat_of(m.proc.pid)
            ecpu0, _ = stat_of(emu)
            kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.monotonic()
            ctx = mp.get_context("fork")
            procs = [ctx.Process(target=read_share, args=(paths[w::readers], size)) for w in range(readers)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
                assert p.exitcode == 0
            elapsed = time.monotonic() - t
            cpu1, flt1 = stat_of(m.proc.pid)
            ecpu1, _ = stat_of(emu)
            kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            rcpu = kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime
            rows.append((shards * size / MIB / elapsed, cpu1 - cpu0, flt1 - flt0, rcpu, ecpu1 - ecpu0))
        rss = peak_rss_mib(m.proc.pid)
        after = None
        if idle:
            busy = rss_mib(m.proc.pid)
            time.sleep(idle)
            after = (busy, rss_mib(m.proc.pid))
    finally:
        m.close()
    return rows, rss, after


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--ttfb-ms", type=int, default=0)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--shard-mib", type=int, default=100)
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=1, help="reads of the whole data set per mount")
    ap.add_argument("--idle", type=float, default=0, help="seconds to leave each mount idle after its last pass, "
                    "then print its RSS (an idle daemon gives its buffers' memory back after 15-20 s)")
    ap.add_argument("--emulator", default="target/release/expressfs-emulator")
    ap.add_argument("--work", default="/dev/shm")
    ap.add_argument("--arg", action="append", default=[], help="extra expressfs argument (all binaries)")
    a = ap.parse_args()
    size = a.shard_mib * MIB
    with probe_emulator(a.emulator, a.work, "shard-probe-", a.ttfb_ms) as (endpoint, work):
        body = os.urandom(size)
        upload(a.binaries[0], endpoint, work, ((f"shards/{i:03}.tar", body) for i in range(a.shards)))
        print(f"{a.shards} shards of {a.shard_mib} MiB, {a.readers} readers, TTFB {a.ttfb_ms} ms", flush=True)
        for r in range(a.rounds):
            for b in (a.binaries if r % 2 == 0 else a.binaries[::-1]):
                rows, rss, after = measure(b, endpoint, work, a.arg, a.shards, size, a.readers, a.passes, a.idle)
                for n, (rate, d, flt, rcpu, ecpu) in enumerate(rows):
                    print(f"round {r} {b} pass {n + 1}: {rate:,.0f} MiB/s, daemon CPU {d:.2f} s, minor faults {flt:,}, "
                          f"readers CPU {rcpu:.2f} s, emulator CPU {ecpu:.2f} s", flush=True)
                print(f"round {r} {b}: daemon peak RSS {rss:,.0f} MiB", flush=True)
                if after:
                    print(f"round {r} {b}: daemon RSS {after[0]:,.0f} MiB after the last pass, {after[1]:,.0f} MiB "
                          f"{a.idle:g} s later", flush=True)

if __name__ == "__main__":
    sys.exit(main())
