#!/usr/bin/env bash
# rsync -a of N files of 50 KB into an empty directory of a fresh mount (--preserve-metadata), for each given
# expressfs binary in turn, each on a fresh directory-bucket emulator at TTFB 4 ms (loopback only). Prints the
# wall time and the requests the emulator served, by kind; checks the copy with diff -r.
#
#     bash bench/rsync_probe.sh [--files N] BINARY...
set -euo pipefail
FILES=200
if [ "${1:-}" = "--files" ]; then FILES=$2; shift 2; fi
[ $# -gt 0 ] || { echo "usage: $0 [--files N] BINARY..." >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
EMULATOR=$ROOT/target/release/expressfs-emulator
export AWS_EC2_METADATA_DISABLED=true AWS_ACCESS_KEY_ID=AKIDEXPRESSFSTEST
export AWS_SECRET_ACCESS_KEY=expressfs-test-secret AWS_REGION=us-east-1
WORK=$(mktemp -d /dev/shm/rsync-probe-XXXXXX)
trap 'mountpoint -q "$WORK/mnt" && umount "$WORK/mnt"; [ -n "${EMU:-}" ] && kill "$EMU" 2>/dev/null; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/src"
for i in $(seq 1 "$FILES"); do head -c 50000 /dev/urandom > "$WORK/src/f$i"; done
PORT=$((20000 + RANDOM % 20000))
for BIN in "$@"; do
  rm -rf "$WORK/data" && mkdir -p "$WORK/data" "$WORK/mnt"
  "$EMULATOR" --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" --bucket rsync--use1-az4--x-s3 --ttfb-ms 4 \
    > "$WORK/emulator.log" 2>&1 &
  EMU=$!
  for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/_emulator/stats" > /dev/null && break; sleep 0.1; done
  "$BIN" --endpoint-url "http://127.0.0.1:$PORT" --region us-east-1 --allow-overwrite --allow-delete \
    --preserve-metadata rsync--use1-az4--x-s3 "$WORK/mnt"
  curl -s -X POST "http://127.0.0.1:$PORT/_emulator/stats/reset" > /dev/null
  start=$(date +%s.%N)
  rsync -a "$WORK/src/" "$WORK/mnt/dst/"
  end=$(date +%s.%N)
  diff -r "$WORK/src" "$WORK/mnt/dst"
  requests=$(curl -s "http://127.0.0.1:$PORT/_emulator/stats" | python3 -c '
import json, sys
ops = {}
for bucket, by_op in json.load(sys.stdin).items():
    if isinstance(by_op, dict):
        for op, c in by_op.items():
            if isinstance(c, dict):
                ops[op] = ops.get(op, 0) + c.get("requests", 0)
print(sum(ops.values()), " ".join(f"{k}={v}" for k, v in sorted(ops.items())))')
  took=$(python3 -c "print(f'{$end - $start:.2f}')")
  echo "$BIN: $FILES files in $took s, requests $requests"
  umount "$WORK/mnt"
  kill "$EMU"; wait "$EMU" 2>/dev/null || true; EMU=
  PORT=$((PORT + 1))
done
