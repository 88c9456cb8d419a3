#!/usr/bin/env bash
# Builds the Debian package: target/debian/expressfs_<version>_<arch>.deb with the daemon (also the
# /sbin/mount.expressfs helper, linked by postinst), the emulator, the systemd unit, a man page and completions.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-deb >/dev/null 2>&1 || cargo install cargo-deb --locked
cargo build --release --locked -p expressfs -p expressfs-emulator
./target/release/expressfs-gen-docs target/assets
cargo deb --no-build -p expressfs
ls -1 target/debian/*.deb
