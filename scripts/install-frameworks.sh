#!/usr/bin/env bash
# Installs what the framework suite (tests/frameworks/) needs: the Debian tools it drives (fio, rsync) and a
# venv, .venv-frameworks, with the ML frameworks and pytest. Idempotent and non-interactive, so CI (root) can
# run it on every build; a second run installs nothing. 50 s to 2.5 min on a fresh machine here (2 cores).
# Env: FRAMEWORKS_VENV (default .venv-frameworks), EXPRESSFS_APT_UPDATE=1 forces `apt-get update` first.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${FRAMEWORKS_VENV:-.venv-frameworks}"
# Pinned to what installs on Python 3.11 here (2026-11-25); raise together, then rerun the suite locally.
PINS=(
  "numpy==2.4.6"
  "h5py==3.14.0"
  "jax==0.10.2"
  "jaxlib==0.10.2"
  "orbax-checkpoint==0.12.8"
  "safetensors==0.8.0"
  "tensorflow-cpu==2.21.0"
  "pytest==9.2.0"
  "pytest-timeout==2.4.0"
)

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

need_apt=()
command -v fio >/dev/null 2>&1 || need_apt+=(fio)
command -v rsync >/dev/null 2>&1 || need_apt+=(rsync)
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
apt_install() {
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
if [ "${EXPRESSFS_APT_UPDATE:-0}" = 1 ]; then
  $SUDO apt-get update -qq
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-frameworks: apt-get install ${need_apt[*]}"
  # A machine whose package lists are missing or stale fails the first try: refresh them once and retry.
  apt_install "${need_apt[@]}" || { $SUDO apt-get update -qq && apt_install "${need_apt[@]}"; }
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "install-frameworks: creating $VENV"
  python3 -m venv "$VENV"
fi
# Skip pip entirely when every pin is already satisfied (pip's own check takes seconds, the import test less).
if "$VENV/bin/python" - "${PINS[@]}" <<'EOF' >/dev/null 2>&1; then
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    assert version(name) == want, pin
EOF
  echo "install-frameworks: $VENV is up to date"
else
  echo "install-frameworks: pip install ${PINS[*]}"
  start=$(date +%s)
  "$VENV/bin/pip" install -q "${PINS[@]}"
  echo "install-frameworks: done in $(( $(date +%s) - start )) s"
fi
