#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks for building, testing and demoing expressfs.
# Idempotent: skips what is already there. Runs as root or through sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

need_apt=()
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v mount >/dev/null 2>&1 || need_apt+=(mount)
# The Rust integration tests drive rsync through mounts (tests/attributes.rs) and read sockets with ss.
command -v rsync >/dev/null 2>&1 || need_apt+=(rsync)
command -v ss >/dev/null 2>&1 || need_apt+=(iproute2)
if [ ${#need_apt[@]} -gt 0 ] || [ "${EXPRESSFS_APT_UPDATE:-0}" = 1 ]; then
  echo "setup: apt-get install ${need_apt[*]:-(update only)}"
  $SUDO apt-get update -qq
  if [ ${#need_apt[@]} -gt 0 ]; then
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  fi
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: Rust is missing. Install it with rustup (https://rustup.rs), then run this again." >&2
  exit 1
fi

# Python tools used by the conformance checks and the demo live in a venv, never in the system Python.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import boto3' >/dev/null 2>&1; then
  echo "setup: installing boto3 into .venv"
  .venv/bin/pip install -q boto3
fi
