#!/usr/bin/env python3
"""A/B probe for the per-file path (issue 21): small files read through a fresh read-only mount of each
given expressfs binary, alternated, on one emulator holding one data set.

    python3 bench/small_probe.py --ttfb-ms 0 --rounds 3 /dev/shm/expressfs-base target/release/expressfs

Two readers, each on its own fresh mount (no page cache carried over):
  threads  64 threads, files in order, open().read() (workload 4's pattern, from Python: TCGETS included);
  procs    8 processes, each its share of the files in one shuffled order, open().read() with a length check
           (the PyTorch DataLoader's pattern, without torch).
Per run: files/s, CPU seconds of the daemon (/proc/PID/stat) and of the readers, FUSE requests by operation
and S3 requests, as deltas of the daemon's metrics. Loopback only; credentials passed explicitly.
"""
import argparse
import contextlib
import multiprocessing as mp
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

SIZE = 100_000
BUCKET = "probe--use1-az4--x-s3"
ENV = dict(
    os.environ,
    AWS_EC2_METADATA_DISABLED="true",
    AWS_ACCESS_KEY_ID="AKIDEXPRESSFSTEST",
    AWS_SECRET_ACCESS_KEY="expressfs-test-secret",
    AWS_REGION="us-east-1",
)


def cpu_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metrics(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'expressfs_fuse_requests_total\{op="(\w+)"\} (\S+)', line)
        if m:
            out["fuse." + m.group(1)] = float(m.group(2))
        m = re.match(r"expressfs_s3_requests_total\{(.*)\} (\S+)", line)
        if m:
            op = re.search(r'op(?:eration)?="(\w+)"', m.group(1))
            key = "s3." + (op.group(1) if op else m.group(1))
            out[key] = out.get(key, 0) + float(m.group(2))
    return out


class Mount:
    def __init__(self, binary, endpoint, work, extra, port):
        self.mnt = tempfile.mkdtemp(dir=work, prefix="mnt-")
        self.port = port
        args = [binary, "--foreground", "--endpoint-url", endpoint, "--region", "us-east-1"]
        if port:
            args += ["--metrics-addr", f"127.0.0.1:{port}"]
        self.proc = subprocess.Popen(args + extra + [BUCKET, self.mnt], env=ENV,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            if os.path.ismount(self.mnt):
                return
            time.sleep(0.05)
        raise RuntimeError("mount did not come up")

    def close(self):
        subprocess.run(["umount", self.mnt], check=True)
        self.proc.wait(timeout=20)
        os.rmdir(self.mnt)


@contextlib.contextmanager
def probe_emulator(exe, work_root, prefix, ttfb_ms):
    """The emulator on a free loopback port, its data in a new directory under `work_root`: yields
    (endpoint, that directory); stops it and removes the directory afterwards."""
    work = tempfile.mkdtemp(dir=work_root, prefix=prefix)
    emu = subprocess.Popen([exe, "--listen", "127.0.0.1:0", "--data-dir", f"{work}/data", "--bucket", BUCKET,
                            "--ttfb-ms", str(ttfb_ms)],
                           env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        while True:
            line = emu.stdout.readline()
            if not line:
                raise RuntimeError("emulator exited")
            m = re.search(r"http://[0-9.:]+", line)
            if m:
                break
        yield m.group(0), work
    finally:
        emu.terminate()
        emu.wait()
        shutil.rmtree(work, ignore_errors=True)


def upload(binary, endpoint, work, files):
    """Writes each (path in the bucket, bytes) of `files` through a fresh mount of `binary`."""
    up = Mount(binary, endpoint, work, [], 0)
    try:
        for rel, body in files:
            os.makedirs(os.path.dirname(f"{up.mnt}/{rel}"), exist_ok=True)
            with open(f"{up.mnt}/{rel}", "wb") as f:
                f.write(body)
    finally:
        up.close()


def read_share(paths):
    for p in paths:
        with open(p, "rb") as f:
            if len(f.read()) != SIZE:
                raise SystemExit(f"{p}: wrong length")


def run_threads(root, n):
    next_i = iter(range(n))
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = next(next_i, None)
            if i is None:
                return
            with open(f"{root}/small/{i:06}.jpg", "rb") as f:
                assert len(f.read()) == SIZE

    threads = [threading.Thread(target=worker) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run_procs(root, n, seed):
    order = list(range(n))
    random.Random(seed).shuffle(order)
    paths = [f"{root}/small/{i:06}.jpg" for i in order]
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=read_share, args=(paths[w::8],)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0


def measure(binary, endpoint, work, extra, mode, n, seed, port):
    m = Mount(binary, endpoint, work, extra + ["--read-only"], port)
    try:
        before = metrics(port)
        d0 = cpu_of(m.proc.pid)
        self0 = resource.getrusage(resource.RUSAGE_SELF)
        kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.monotonic()
        if mode == "threads":
            run_threads(m.mnt, n)
        else:
            run_procs(m.mnt, n, seed)
        elapsed = time.monotonic() - t
        d = cpu_of(m.proc.pid) - d0
        self1 = resource.getrusage(resource.RUSAGE_SELF)
        kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        readers = (self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime) + (
            kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime)
        after = metrics(port)
    finally:
        m.close()
    delta = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}
    return n / elapsed, d, readers, delta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--ttfb-ms", type=int, default=4)
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="threads,procs")
    ap.add_argument("--emulator", default="target/release/expressfs-emulator")
    ap.add_argument("--work", default="/dev/shm")
    ap.add_argument("--arg", action="append", default=[], help="extra expressfs argument (all binaries)")
    ap.add_argument("--port", type=int, default=9475)
    a = ap.parse_args()
    with probe_emulator(a.emulator, a.work, "small-probe-", a.ttfb_ms) as (endpoint, work):
        body = os.urandom(SIZE)
        upload(a.binaries[0], endpoint, work, ((f"small/{i:06}.jpg", body) for i in range(a.files)))
        print(f"{a.files} files of {SIZE} B, TTFB {a.ttfb_ms} ms", flush=True)
        for r in range(a.rounds):
            order = a.binaries if r % 2 == 0 else a.binaries[::-1]
            for mode in a.modes.split(","):
                for b in order:
                    rate, d, readers, delta = measure(b, endpoint, work, a.arg, mode, a.files, r, a.port)
                    fuse = " ".join(f"{k[5:]}={v:.0f}" for k, v in sorted(delta.items()) if k.startswith("fuse."))
                    s3 = " ".join(f"{k[3:]}={v:.0f}" for k, v in sorted(delta.items()) if k.startswith("s3."))
                    print(f"round {r} {mode:7} {b}: {rate:,.0f} files/s, CPU daemon {d:.2f} s readers "
                          f"{readers:.2f} s | fuse {fuse} | s3 {s3}", flush=True)

if __name__ == "__main__":
    sys.exit(main())
