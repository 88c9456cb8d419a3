"""PyTorch workloads of the bench: torch.utils.data.DataLoader over an expressfs mount (plain open()) against
AWS's S3 Connector for PyTorch (s3torchconnector, Mountpoint's CRT client), on one local emulator.

Data sets (uploaded through a writable expressfs mount, so the driver needs nothing beyond the standard
library and torch): WebDataset-style tar shards of ~115 KB samples (`NNNNNN.jpg` + `NNNNNN.cls`) and loose
100 KB files. Every sample carries its index and a CRC32; loader workers check both, the main process checks
that every index arrived exactly once.

Workloads: tar shards as an IterableDataset with 4 and 8 workers; shuffled loose files as a map-style
Dataset with 8 workers. Per run: items/s, CPU seconds of all client processes (driver + loader workers +
expressfs daemon; the daemon's share in brackets), the emulator's CPU seconds (it shares the cores with both clients; reported apart),
the daemon's peak RSS, the loader workers' peak memory, and the emulator's requests per
operation. Each TTFB gets its own emulator; the clients are alternated round by round; cells are medians, and
"ratio by round" is the median and range of each round's pair (the two clients ran back to back).

Run: `scripts/install-pytorch-peer.sh`, `cargo build --release -p expressfs -p expressfs-emulator`, then
`.venv-pytorch/bin/python bench/pytorch_bench.py --ttfb-ms 4,0 --rounds 3` (or `expressfs-bench --pytorch`).
`--no-connector` runs the mount side alone (no s3torchconnector needed). Loopback only.

By default every mount round gets a fresh daemon, which first-touches its whole footprint in the round (costly on
a VM whose host backs freed memory lazily: `bench/fresh_memory.py`). `--keep-mount` keeps one mount per TTFB for
all rounds, as a training job keeps its mount across epochs (the loader workers are still forked per epoch, as
DataLoader does without `persistent_workers`); the kernel's page cache is dropped before every round of either
client, so every round still fetches every byte (root only).
"""

import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
import warnings
from concurrent.futures import ThreadPoolExecutor

# torch warns about a missing NumPy and about more workers than CPUs: both deliberate here.
warnings.filterwarnings("ignore", category=UserWarning, module="torch")

from torch.utils.data import Dataset, IterableDataset, get_worker_info

BUCKET = "torch--use1-az4--x-s3"
KEY, SECRET, REGION = "AKIDEXPRESSFSTEST", "expressfs-test-secret", "us-east-1"
SHARDS, LOOSE = "shards", "loose"
BLOCK = 512
SAMPLE_BYTES = 115_000
SPREAD = 4096
LOOSE_BYTES = 100_000
CHUNK = 1 << 20
BATCH = 16
MTIME = 1_700_000_000

# Credentials and region explicit, and no instance-metadata lookups: everything stays on 127.0.0.1.
os.environ.update(
    AWS_EC2_METADATA_DISABLED="true",
    AWS_ACCESS_KEY_ID=KEY,
    AWS_SECRET_ACCESS_KEY=SECRET,
    AWS_REGION=REGION,
    AWS_DEFAULT_REGION=REGION,
)
os.environ.pop("AWS_SESSION_TOKEN", None)
os.environ.pop("AWS_PROFILE", None)

_BASE = random.Random(7).randbytes(2 << 20)


# ---------------------------------------------------------------- samples


def payload(index, size):
    """`size` bytes: the index, filler that differs per index, and the CRC32 of both."""
    off = (index * 7919) % (len(_BASE) - size)
    head = struct.pack("<Q", index) + _BASE[off : off + size - 12]
    return head + struct.pack("<I", zlib.crc32(head))


def check(data, index):
    """Raises unless `data` is sample `index`, intact."""
    if len(data) < 12 or struct.unpack_from("<Q", data)[0] != index:
        raise ValueError(f"sample {index}: wrong index")
    if zlib.crc32(memoryview(data)[:-4]) != struct.unpack_from("<I", data, len(data) - 4)[0]:
        raise ValueError(f"sample {index}: bad checksum")


def sample_size(index):
    return SAMPLE_BYTES - SPREAD // 2 + (index * 2654435761) % SPREAD


def tar_header(name, size):
    import tarfile

    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, MTIME
    return info.tobuf(tarfile.USTAR_FORMAT)


def padded(n):
    return -(-n // BLOCK) * BLOCK


def write_shard(path, first, shard_bytes):
    """Writes samples from `first` on until the shard is full; returns the number written."""
    n, used = 0, 0
    with open(path, "wb") as f:
        while True:
            i = first + n
            size = sample_size(i)
            label = b"%d\n" % (i % 1000)
            need = BLOCK + padded(size) + BLOCK + padded(len(label))
            if n and used + need + 2 * BLOCK > shard_bytes:
                break
            for name, body in ((f"{i:06d}.jpg", payload(i, size)), (f"{i:06d}.cls", label)):
                f.write(tar_header(name, len(body)))
                f.write(body)
                f.write(b"\0" * (padded(len(body)) - len(body)))
            used += need
            n += 1
        f.write(b"\0" * (2 * BLOCK))
    return n


def tar_samples(f):
    """(index, image bytes) of each sample of a tar stream read from `f` in 1 MiB reads, checked."""
    buf, pos = b"", 0

    def take(n):
        nonlocal buf, pos
        if len(buf) - pos < n:
            parts, have = [buf[pos:]], len(buf) - pos
            while have < n:
                more = f.read(max(CHUNK, n - have))
                if not more:
                    raise ValueError("truncated tar")
                parts.append(more)
                have += len(more)
            buf, pos = b"".join(parts), 0
        out = buf[pos : pos + n]
        pos += n
        return out

    image = None
    while True:
        header = take(BLOCK)
        if header.count(0) == BLOCK:
            return
        name = header[:100].rstrip(b"\0").decode()
        size = int(header[124:136].strip(b"\0 ") or b"0", 8)
        body = take(padded(size))[:size]
        stem, _, ext = name.partition(".")
        index = int(stem)
        if ext == "jpg":
            check(body, index)
            image = (index, body)
        elif ext == "cls":
            if image is None or image[0] != index or int(body) != index % 1000:
                raise ValueError(f"sample {index}: label without its image")
            yield image
            image = None


# ---------------------------------------------------------------- datasets (module level: workers pickle them)


def as_list(batch):
    return batch


def reader_key(reader):
    return reader.key


class MountShards(IterableDataset):
    """IterableDataset over the shard files of a mount; each worker takes every n-th shard."""

    def __init__(self, root):
        self.paths = sorted(os.path.join(root, n) for n in os.listdir(root))

    def __iter__(self):
        w = get_worker_info()
        mine = self.paths[w.id :: w.num_workers] if w else self.paths
        for p in mine:
            with open(p, "rb") as f:
                for index, _ in tar_samples(f):
                    yield index


class ConnectorShards(IterableDataset):
    """IterableDataset over S3IterableDataset's objects (sharded across workers by the connector)."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        for reader in self.inner:
            for index, _ in tar_samples(reader):
                yield index


class MountFiles(Dataset):
    """Map-style Dataset of the loose files of a mount, read with plain open()."""

    def __init__(self, root):
        self.root = root
        self.names = sorted(os.listdir(root))

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        name = self.names[i]
        with open(os.path.join(self.root, name), "rb") as f:
            data = f.read()
        index = int(name.split(".")[0])
        check(data, index)
        return index


def connector_file(reader):
    """S3MapDataset's transform: read the whole object and check it."""
    data = reader.read()
    index = int(reader.key.rsplit("/", 1)[1].split(".")[0])
    check(data, index)
    return index


# ---------------------------------------------------------------- processes and measurements


def proc_stat_cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def proc_kib(pid, field, name="status"):
    try:
        with open(f"/proc/{pid}/{name}") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid):
    out = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.update(int(c) for c in f.read().split())
    except OSError:
        pass
    return out


class WorkerMemory(threading.Thread):
    """Samples the loader workers (our children other than `skip`) every `every` seconds: the peak of their
    summed PSS (shared pages split fairly, so the torch pages forked from us do not count 8 times) and the
    largest single worker's peak RSS. A PSS sample walks every page table of every worker (torch maps GBs of
    libraries), about 60 ms of CPU for 8 workers: at 100 ms it took a fifth of the two cores from the run it
    measured (perf, 2026-11-26)."""

    def __init__(self, skip, every):
        super().__init__(daemon=True)
        self.skip, self.every, self.stop = set(skip), every, threading.Event()
        self.pss_mib, self.hwm_mib = 0.0, 0.0

    def run(self):
        while not self.stop.wait(self.every):
            self.sample()

    def sample(self):
        """One sample; returns the (wall, CPU) seconds it took, for the caller to leave out of its figures."""
        wall, cpu = time.perf_counter(), time.thread_time()
        pids = children(os.getpid()) - self.skip
        pss = sum(proc_kib(p, "Pss:", "smaps_rollup") for p in pids) / 1024
        self.pss_mib = max(self.pss_mib, pss)
        for p in pids:
            self.hwm_mib = max(self.hwm_mib, proc_kib(p, "VmHWM:") / 1024)
        return time.perf_counter() - wall, time.thread_time() - cpu


class Emulator:
    def __init__(self, exe, ttfb_ms, data_dir):
        self.dir = tempfile.mkdtemp(prefix="torch-emu-", dir=data_dir)
        self.proc = subprocess.Popen(
            [exe, "--listen", "127.0.0.1:0", "--data-dir", self.dir, "--bucket", BUCKET, "--ttfb-ms", str(ttfb_ms)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.proc.stdout.readline()
        if "listening on " not in line:
            raise RuntimeError(f"emulator did not start: {line!r}")
        self.endpoint = line.split("listening on ")[1].strip()

    def reset_stats(self):
        urllib.request.urlopen(urllib.request.Request(self.endpoint + "/_emulator/stats/reset", method="POST")).read()

    def served(self):
        """Since the last reset, over all buckets (and the bucketless session): requests per operation, and
        the bytes of response bodies sent (what the emulator's CPU went into)."""
        stats = json.load(urllib.request.urlopen(self.endpoint + "/_emulator/stats"))
        ops, sent = {}, 0
        for per_bucket in stats.values():
            for op, s in per_bucket.items():
                ops[op] = ops.get(op, 0) + s["requests"]
                sent += s.get("bytes_out", 0)
        return ops, sent

    def close(self):
        self.proc.kill()
        self.proc.wait()
        subprocess.run(["rm", "-rf", self.dir], check=False)


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split(" ")[4] == path for line in f)


class Mount:
    def __init__(self, exe, endpoint, extra):
        self.work = tempfile.mkdtemp(prefix="torch-mnt-")
        self.root = os.path.join(self.work, "mnt")
        os.mkdir(self.root)
        self.log = open(os.path.join(self.work, "expressfs.log"), "w")
        cmd = [exe, "--foreground", "--endpoint-url", endpoint, "--region", REGION, *extra, BUCKET, self.root]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        deadline = time.time() + 30
        while not mounted(self.root):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("expressfs did not mount: " + open(self.log.name).read()[-500:])
            time.sleep(0.005)

    def close(self):
        subprocess.run(["umount", self.root], check=False)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if not mounted(self.root):
            subprocess.run(["rm", "-rf", self.work], check=False)


# ---------------------------------------------------------------- the bench


def upload(emu, args):
    """Writes both data sets through a writable mount; returns the number of shard samples."""
    m = Mount(args.expressfs, emu.endpoint, [])
    try:
        os.makedirs(os.path.join(m.root, SHARDS))
        os.makedirs(os.path.join(m.root, LOOSE))
        shard_bytes = args.shard_mib << 20
        # Sample indices of each shard are fixed by a dry count, so the shards can be written in parallel.
        per_shard = write_shard(os.devnull, 0, shard_bytes)
        firsts = [s * per_shard for s in range(args.shards)]
        with ThreadPoolExecutor(4) as ex:
            counts = list(
                ex.map(
                    lambda s: write_shard(os.path.join(m.root, SHARDS, f"shard-{s:06d}.tar"), firsts[s], shard_bytes),
                    range(args.shards),
                )
            )

        def put(i):
            with open(os.path.join(m.root, LOOSE, f"{i:06d}.bin"), "wb") as f:
                f.write(payload(i, LOOSE_BYTES))

        with ThreadPoolExecutor(32) as ex:
            list(ex.map(put, range(args.small_files)))
    finally:
        m.close()
    return sum(counts), firsts, counts


def connector_config(endpoint, reader):
    from s3torchconnector import S3ClientConfig, S3ReaderConstructor

    # The default (sequential) reader keeps every byte of an object read so far in memory; the range-based
    # one reads what is asked for, through a buffer.
    constructor = S3ReaderConstructor.range_based() if reader == "range" else S3ReaderConstructor.sequential()
    return dict(
        region=REGION,
        endpoint=endpoint,
        s3client_config=S3ClientConfig(force_path_style=True),
        reader_constructor=constructor,
    )


def build(client, workload, root, endpoint, workers, reader):
    """The Dataset and DataLoader of one run."""
    import torch.utils.data as tud

    kind, _ = workload
    if kind == "shards":
        if client == "mount":
            ds = MountShards(os.path.join(root, SHARDS))
        else:
            from s3torchconnector import S3IterableDataset

            inner = S3IterableDataset.from_prefix(
                f"s3://{BUCKET}/{SHARDS}/", enable_sharding=True, **connector_config(endpoint, reader)
            )
            ds = ConnectorShards(inner)
        return tud.DataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=as_list)
    if client == "mount":
        ds = MountFiles(os.path.join(root, LOOSE))
    else:
        from s3torchconnector import S3MapDataset

        ds = S3MapDataset.from_prefix(
            f"s3://{BUCKET}/{LOOSE}/", transform=connector_file, **connector_config(endpoint, reader)
        )
    return tud.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers, collate_fn=as_list)


def drop_page_cache():
    """Empties the kernel's page cache, so that a kept mount's files are fetched again (root only)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1")


def reset_peak_rss(pid):
    """Restarts the VmHWM count of `pid` (a kept daemon's peak is then this round's)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def new_mount(emu, args):
    return Mount(args.expressfs, emu.endpoint, ["--read-only", *args.expressfs_arg])


def run_one(client, workload, emu, args, expected, kept=None):
    """One timed pass of one client over one workload; returns its measurements. `kept`: the mount of
    `--keep-mount`, reused (and not unmounted) instead of a fresh one."""
    workers = workload[1]
    if kept:
        drop_page_cache()
    mount = (kept or new_mount(emu, args)) if client == "mount" else None
    if kept and mount:
        reset_peak_rss(mount.proc.pid)
    skip = {emu.proc.pid} | ({mount.proc.pid} if mount else set())
    try:
        emu.reset_stats()
        daemon_cpu0 = proc_stat_cpu(mount.proc.pid) if mount else 0.0
        emulator_cpu0 = proc_stat_cpu(emu.proc.pid)
        t0 = os.times()
        mem = WorkerMemory(skip, args.memory_every)
        sample_wall, sample_cpu = 0.0, 0.0
        mem.start()
        started = time.perf_counter()
        loader = build(client, workload, mount.root if mount else None, emu.endpoint, workers, args.connector_reader)
        seen = bytearray(expected)
        count = 0
        for batch in loader:
            for index in batch:
                if index >= expected or seen[index]:
                    raise ValueError(f"{client}: sample {index} unexpected or twice")
                seen[index] = 1
            count += len(batch)
            if count == expected:
                # A last sample while the workers still hold what they read (the loader stops them once it is
                # exhausted, and a run can be shorter than the period); its time and CPU are not the run's.
                mem.stop.set()
                mem.join()
                sample_wall, sample_cpu = mem.sample()
        mem.stop.set()
        del loader  # joins the workers, so their CPU time lands in os.times()'s children
        elapsed = time.perf_counter() - started - sample_wall
        t1 = os.times()
        if count != expected:
            raise ValueError(f"{client}: {count} items, expected {expected}")
        cpu = (t1.user - t0.user) + (t1.system - t0.system)
        cpu += (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system) - sample_cpu
        row = dict(rate=count / elapsed, secs=elapsed, cpu=cpu, workers_pss=mem.pss_mib, worker_hwm=mem.hwm_mib)
        if mount:
            row["daemon_cpu"] = proc_stat_cpu(mount.proc.pid) - daemon_cpu0
            row["cpu"] += row["daemon_cpu"]
            row["daemon_rss"] = proc_kib(mount.proc.pid, "VmHWM:") / 1024
        # The emulator shares the cores with both clients: its CPU is reported, not counted in the client's.
        row["emulator_cpu"] = proc_stat_cpu(emu.proc.pid) - emulator_cpu0
        row["requests"], sent = emu.served()
        row["mib_sent"] = sent / (1 << 20)
        return row
    finally:
        if mount and mount is not kept:
            mount.close()


def median(rows, key):
    vals = sorted(r[key] for r in rows if key in r)
    return vals[(len(vals) - 1) // 2] if vals else None


def median_ops(rows):
    """Each operation's median request count over the rounds."""
    ops = {op for r in rows for op in r["requests"]}
    return {op: median([dict(n=r["requests"].get(op, 0)) for r in rows], "n") for op in ops}


def round_ratios(mount_rows, connector_rows):
    """Mount over connector rate, round by round: the two ran back to back under the same conditions, so
    each pair's ratio is spared the drift between rounds that the ratio of the two medians is not."""
    return sorted(m["rate"] / c["rate"] for m, c in zip(mount_rows, connector_rows) if m.get("rate") and c.get("rate"))


def fmt_round_ratios(ratios):
    if not ratios:
        return "-"
    mid = ratios[(len(ratios) - 1) // 2]
    return f"{mid:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})" if len(ratios) > 1 else f"{mid:.2f}"


def fmt_requests(ops, items):
    short = {"GetObject": "GET", "HeadObject": "HEAD", "ListObjectsV2": "LIST", "CreateSession": "session"}
    parts = [f"{short.get(op, op)} {n}" for op, n in sorted(ops.items(), key=lambda kv: -kv[1]) if n]
    per_item = sum(ops.values()) / items if items else 0
    return ", ".join(parts) + f" ({per_item:.2f}/item)"


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ttfb-ms", default="4,0", help="emulator TTFBs, comma-separated (one emulator each)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--shard-mib", type=int, default=100)
    p.add_argument("--small-files", type=int, default=5000)
    p.add_argument("--shard-workers", default="4,8")
    p.add_argument("--file-workers", type=int, default=8)
    p.add_argument("--expressfs", default=os.path.join(here, "target/release/expressfs"))
    p.add_argument("--emulator", default=os.path.join(here, "target/release/expressfs-emulator"))
    p.add_argument("--emulator-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    p.add_argument("--expressfs-arg", action="append", default=[], help="extra expressfs flag (repeatable)")
    p.add_argument(
        "--connector-reader",
        choices=["sequential", "range"],
        default="sequential",
        help="s3torchconnector's reader: its default (sequential) or range-based",
    )
    p.add_argument("--no-connector", action="store_true", help="the mount side alone")
    p.add_argument(
        "--keep-mount",
        action="store_true",
        help="one mount per TTFB for every round (page cache dropped before each round; root only)",
    )
    p.add_argument(
        "--memory-every",
        type=float,
        default=1.0,
        help="seconds between samples of the loader workers' memory (each walks their page tables: it costs CPU)",
    )
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    if args.keep_mount and os.geteuid() != 0:
        p.error("--keep-mount drops the kernel's page cache before every round: run it as root")

    if not args.no_connector:
        try:
            import s3torchconnector  # noqa: F401  (known before uploading anything)
        except ImportError:
            print("s3torchconnector is not installed: the mount side alone", file=sys.stderr)
            args.no_connector = True
    clients = ["mount"] if args.no_connector else ["mount", "connector"]
    import torch

    workloads = [("shards", int(w)) for w in args.shard_workers.split(",")] + [("files", args.file_workers)]
    table = []
    for ttfb in [int(t) for t in args.ttfb_ms.split(",")]:
        emu = Emulator(args.emulator, ttfb, args.emulator_dir)
        kept = None
        try:
            print(f"TTFB {ttfb} ms: uploading ...", file=sys.stderr, flush=True)
            samples, _, _ = upload(emu, args)
            if args.keep_mount and "mount" in clients:
                kept = new_mount(emu, args)
            rows = {(w, c): [] for w in workloads for c in clients}
            for rnd in range(args.rounds):
                order = clients if rnd % 2 == 0 else clients[::-1]
                for w in workloads:
                    expected = samples if w[0] == "shards" else args.small_files
                    for c in order:
                        r = run_one(c, w, emu, args, expected, kept)
                        rows[(w, c)].append(r)
                        print(
                            f"TTFB {ttfb} round {rnd + 1} {w[0]}/{w[1]}w {c}: {r['rate']:.0f} items/s, "
                            f"cpu {r['cpu']:.1f} s" + (f" (daemon {r['daemon_cpu']:.2f} s)" if "daemon_cpu" in r else "")
                            + f", emulator cpu {r['emulator_cpu']:.1f} s for "
                            f"{r['mib_sent']:,.0f} MiB sent, "
                            f"{fmt_requests(r['requests'], expected)}",
                            file=sys.stderr,
                            flush=True,
                        )
            for w in workloads:
                expected = samples if w[0] == "shards" else args.small_files
                table.append((ttfb, w, expected, {c: rows[(w, c)] for c in clients}))
        finally:
            if kept:
                kept.close()
            emu.close()
    report(table, args, torch.__version__)


def report(table, args, torch_version):
    try:
        from importlib.metadata import version

        conn = version("s3torchconnector")
    except Exception:
        conn = "not installed"
    cmd = " ".join(["bench/pytorch_bench.py", *sys.argv[1:]])
    print(f"PyTorch DataLoader: expressfs mount (plain open()) vs s3torchconnector {conn}; torch {torch_version}, "
          f"{args.connector_reader} reader, {os.cpu_count()} CPUs, {args.rounds} round(s), medians, "
          f"{'one mount kept for all rounds' if args.keep_mount else 'a fresh mount per round'}; `{cmd}`")
    print()
    head = "| TTFB | workload | items | connector items/s | mount items/s | ratio | ratio by round, median (range) | CPU s connector / mount (daemon) |" \
           " emulator CPU s connector / mount | daemon peak RSS MiB | workers' peak PSS MiB connector / mount | requests, connector | requests, mount |"
    print(head)
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for ttfb, (kind, workers), items, by in table:
        name = f"{args.shards} tar shards x {args.shard_mib} MiB, {workers} workers" if kind == "shards" else \
            f"{args.small_files} files of 100 KB, shuffled, {workers} workers"
        m, c = by.get("mount", []), by.get("connector", [])
        mr, cr = median(m, "rate"), median(c, "rate")
        ratio = f"{mr / cr:.2f}" if mr and cr else "-"
        f0 = lambda v: "-" if v is None else f"{v:,.0f}"  # noqa: E731
        f1 = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        req = lambda rows: fmt_requests(median_ops(rows), items) if rows else "-"  # noqa: E731
        print(f"| {ttfb} ms | {name} | {items:,} | {f0(cr)} | {f0(mr)} | {ratio} | {fmt_round_ratios(round_ratios(m, c))} | "
              f"{f1(median(c, 'cpu'))} / {f1(median(m, 'cpu'))} ({f1(median(m, 'daemon_cpu'))}) | "
              f"{f1(median(c, 'emulator_cpu'))} / {f1(median(m, 'emulator_cpu'))} | {f0(median(m, 'daemon_rss'))} | "
              f"{f0(median(c, 'workers_pss'))} / {f0(median(m, 'workers_pss'))} | {req(c)} | {req(m)} |")


if __name__ == "__main__":
    main()
