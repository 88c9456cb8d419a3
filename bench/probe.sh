#!/usr/bin/env bash
# One workload on a standalone emulator, with the daemon's and the emulator's CPU time and the daemon's
# request counts: the probe behind the profiling notes in docs/BENCHMARKS.md ("Where the time goes").
#   bash bench/probe.sh small-files [EXPRESSFS_BINARY] [expressfs flags...]   # PROBE_FILES (5,000) x 100 KB, 64 threads
#   bash bench/probe.sh checkpoint  [EXPRESSFS_BINARY] [expressfs flags...]   # 1 GiB in 1 MiB writes + fsync
# Needs a release build (cargo build --release --workspace). Loopback only; credentials passed explicitly.
# PROBE_DIR=/dev/shm keeps the emulator's bytes (and so disk writeback) off the disk; the default is /tmp.
set -euo pipefail
mode=${1:?small-files or checkpoint}
files=${PROBE_FILES:-5000}
bin=${2:-target/release/expressfs}
shift $(( $# >= 2 ? 2 : 1 ))
export AWS_EC2_METADATA_DISABLED=true AWS_ACCESS_KEY_ID=AKIDEXPRESSFSTEST \
    AWS_SECRET_ACCESS_KEY=expressfs-test-secret AWS_REGION=us-east-1
bucket=probe--use1-az4--x-s3
work=$(mktemp -d "${PROBE_DIR:-/tmp}/expressfs-probe-XXXXXX")
mnt=$work/mnt
mkdir -p "$work/data" "$mnt"
target/release/expressfs-emulator --listen 127.0.0.1:0 --data-dir "$work/data" --bucket "$bucket" \
    --ttfb-ms 4 > "$work/emu.out" 2>/dev/null &
emu=$!
cleanup() { umount "$mnt" 2>/dev/null || true; kill "$emu" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
for _ in $(seq 50); do grep -q http "$work/emu.out" && break; sleep 0.1; done
endpoint=$(grep -o 'http://[0-9.:]*' "$work/emu.out" | head -1)
mount_it() { "$bin" "$bucket" "$mnt" --endpoint-url "$endpoint" --region us-east-1 --metrics-addr 127.0.0.1:9465 "$@"; }
cpu() { awk '{print ($14 + $15) / 100}' "/proc/$1/stat"; }
requests() { curl -s http://127.0.0.1:9465/metrics | grep '^expressfs_s3_requests_total' || true; }

case $mode in
small-files)
    mount_it
    python3 -c "
import os
os.makedirs('$mnt/small', exist_ok=True)
for i in range($files):
    open('$mnt/small/%06d.jpg' % i, 'wb').write(os.urandom(100000))"
    umount "$mnt"
    mount_it --read-only "$@"
    daemon=$(pgrep -nf "$bin $bucket $mnt")
    d0=$(cpu "$daemon") e0=$(cpu "$emu")
    python3 -c "
import time
from concurrent.futures import ThreadPoolExecutor
t = time.time()
read = lambda i: len(open('$mnt/small/%06d.jpg' % i, 'rb').read())
with ThreadPoolExecutor(64) as ex:
    assert sum(ex.map(read, range($files))) == $files * 100000
print('small files: %.0f files/s' % ($files / (time.time() - t)))"
    ;;
checkpoint)
    mount_it "$@"
    daemon=$(pgrep -nf "$bin $bucket $mnt")
    sync
    d0=$(cpu "$daemon") e0=$(cpu "$emu")
    python3 -c "
import os, time
block = os.urandom(1 << 20)
t = time.time()
f = open('$mnt/ckpt.bin', 'wb', buffering=0)
for _ in range(1024):
    f.write(block)
written = time.time() - t
os.fsync(f.fileno())
f.close()
total = time.time() - t
print('checkpoint: %.0f MB/s (writes %.2f s, fsync %.2f s)' % (1024 * 1.048576 / total, written, total - written))"
    ;;
*) echo "unknown mode $mode" >&2; exit 2 ;;
esac
awk -v d="$(cpu "$daemon")" -v d0="$d0" -v e="$(cpu "$emu")" -v e0="$e0" \
    'BEGIN { printf "CPU seconds: daemon %.2f, emulator %.2f\n", d - d0, e - e0 }'
requests
