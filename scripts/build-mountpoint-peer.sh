#!/usr/bin/env bash
# Builds the Mountpoint peer of the benchmark suite: bench/mountpoint, a bench-only wrapper around Mountpoint
# for Amazon S3's file system library and CRT client (crates.io: mountpoint-s3-fs, mountpoint-s3-client).
# Installs what the CRT and the FUSE binding need to build (cmake and clang for the C code and its bindings,
# libfuse3's headers), then builds in release mode; expressfs-bench finds the result by itself.
# Not called by .ci/run, and not part of the main cargo workspace. Takes a while on 2 cores (the CRT is C).
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends cmake clang libclang-dev libfuse3-dev pkg-config

cargo build --release --locked --manifest-path bench/mountpoint/Cargo.toml
exe=bench/mountpoint/target/release/expressfs-bench-mountpoint
"$exe" --version
echo "built $(pwd)/$exe"
