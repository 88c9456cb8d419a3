#!/usr/bin/env python3
"""A/B probe for lookups below the root: every file of a small tree read by path, without listing first (a
loader that has an index of its files, a checkpoint restore), through a fresh read-only mount of each given
expressfs binary, alternated, on one emulator holding one data set.

    python3 bench/walk_probe.py --ttfb-ms 4 --rounds 3 /dev/shm/expressfs-base target/release/expressfs

The tree: `data/train/class_NN/NNN.jpg` (20 directories of 30 files) and `ckpt/step_N/` (5 checkpoints of
`_METADATA`, `manifest.ocdbt` and 20 files under `d/`), 710 files. Per run: seconds, and the requests the
emulator served by operation. Every file's bytes are checked. Loopback only; credentials passed explicitly.
"""
import argparse
import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import small_probe  # noqa: E402  (its emulator, mount and upload helpers)


def tree():
    files = [f"data/train/class_{c:02}/{i:03}.jpg" for c in range(20) for i in range(30)]
    for s in range(5):
        files += [f"ckpt/step_{s}/_METADATA", f"ckpt/step_{s}/manifest.ocdbt"]
        files += [f"ckpt/step_{s}/d/{k:02}" for k in range(20)]
    return files


def requests(endpoint):
    stats = json.load(urllib.request.urlopen(endpoint + "/_emulator/stats"))
    return {op: v.get("requests", 0) for op, v in stats.get(small_probe.BUCKET, {}).items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--ttfb-ms", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--emulator", default="target/release/expressfs-emulator")
    ap.add_argument("--work", default="/dev/shm")
    a = ap.parse_args()
    files = tree()
    body = lambda f: f.encode() * 10  # noqa: E731
    with small_probe.probe_emulator(a.emulator, a.work, "walk-probe-", a.ttfb_ms) as (endpoint, work):
        small_probe.upload(a.binaries[0], endpoint, work, ((f, body(f)) for f in files))
        print(f"{len(files)} files, TTFB {a.ttfb_ms} ms", flush=True)
        for r in range(a.rounds):
            for binary in a.binaries if r % 2 == 0 else a.binaries[::-1]:
                mount = small_probe.Mount(binary, endpoint, work, ["--read-only"], 0)
                try:
                    before = requests(endpoint)
                    started = time.monotonic()
                    for f in files:
                        with open(f"{mount.mnt}/{f}", "rb") as fh:
                            if fh.read() != body(f):
                                raise SystemExit(f"{f}: wrong bytes")
                    elapsed = time.monotonic() - started
                    after = requests(endpoint)
                finally:
                    mount.close()
                spent = {op: n - before.get(op, 0) for op, n in sorted(after.items()) if n - before.get(op, 0)}
                print(f"round {r} {binary}: {elapsed:.2f} s, {spent}", flush=True)


if __name__ == "__main__":
    main()
