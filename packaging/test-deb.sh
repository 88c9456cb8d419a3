#!/usr/bin/env bash
# Installs the package with dpkg and mounts the emulator through the installed binaries only (no Rust
# toolchain in PATH): the daemon, the fstab helper and the man page must all come from the package.
set -euo pipefail
cd "$(dirname "$0")/.."
deb=$(ls -1t target/debian/expressfs_*.deb | head -1)
dpkg -i "$deb"
export PATH=/usr/sbin:/usr/bin:/sbin:/bin AWS_EC2_METADATA_DISABLED=true
export AWS_ACCESS_KEY_ID=AKIDEXPRESSFSTEST AWS_SECRET_ACCESS_KEY=expressfs-test-secret
command -v cargo >/dev/null && { echo "cargo is still in PATH"; exit 1; }
work=$(mktemp -d)
expressfs-emulator --listen 127.0.0.1:0 --data-dir "$work/data" --bucket pkg--use1-az4--x-s3 > "$work/emu.out" &
emu=$!
trap 'umount "$work/mnt" 2>/dev/null || true; kill $emu 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 50); do grep -q listening "$work/emu.out" && break; sleep 0.1; done
endpoint=$(sed -n 's/.*listening on //p' "$work/emu.out")
mkdir -p "$work/mnt"
printf 'pkg--use1-az4--x-s3 %s expressfs _netdev,nofail,endpoint-url=%s,region=us-east-1,allow-overwrite 0 0\n' "$work/mnt" "$endpoint" > "$work/fstab"
mount --fstab "$work/fstab" "$work/mnt"
echo "written through the packaged mount" > "$work/mnt/hello.txt"
test "$(cat "$work/mnt/hello.txt")" = "written through the packaged mount"
expressfs --version
man -w expressfs >/dev/null 2>&1 || test -f /usr/share/man/man1/expressfs.1.gz
systemd-analyze verify /lib/systemd/system/expressfs@.service 2>&1 | grep -v "Failed to prepare filename\|Command .* is not executable" || true
umount "$work/mnt"
echo "package test passed"
