#!/usr/bin/env bash
# Installs the PyTorch peer of the bench (bench/pytorch_bench.py, `expressfs-bench --pytorch`): a venv,
# .venv-pytorch, with torch and AWS's S3 Connector for PyTorch (s3torchconnector, on Mountpoint's CRT client).
# Not run by CI: PyPI's default torch wheel pulls its CUDA libraries: about 3 GB of wheels, 5.4 GB installed
# (2.5 minutes here).
# Idempotent: a second run finds both packages importable at the pinned versions and installs nothing.
# Env: PYTORCH_VENV (default .venv-pytorch); PYTORCH_INDEX_URL, an extra pip index (for example a CPU-only
# torch index, when one is reachable) that torch is taken from instead of the default index; PYTORCH_MIN_FREE_GB (default 8), the
# free space on the venv's file system below which the default (CUDA) wheel is refused.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${PYTORCH_VENV:-.venv-pytorch}"
# What installs on Python 3.11 here (2026-11-25); raise together, then rerun the bench's --pytorch workloads.
PINS=(
  "torch==2.15.0"
  "s3torchconnector==1.5.0"
)

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "${PINS[@]}" <<'PY' >/dev/null 2>&1; then
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    assert version(name).split("+")[0] == want, pin  # a local label (+cpu, +cu132) is the same release
import torch, s3torchconnector  # noqa: F401  (installed is not enough: they must import)
PY
  echo "install-pytorch-peer: $VENV is up to date"
  exit 0
fi

parent="$(dirname "$(realpath -m "$VENV")")"
mkdir -p "$parent"
free_gb=$(df -Pk "$parent" | awk 'NR==2 { print int($4 / 1048576) }')
min_gb="${PYTORCH_MIN_FREE_GB:-8}"
echo "install-pytorch-peer: ${free_gb} GB free on $(df -P "$parent" | awk 'NR==2 { print $6 }')"
if [ -n "${PYTORCH_INDEX_URL:-}" ]; then
  echo "install-pytorch-peer: torch from $PYTORCH_INDEX_URL"
elif [ "$free_gb" -lt "$min_gb" ]; then
  echo "install-pytorch-peer: the default torch wheel brings its CUDA libraries (about 3 GB of wheels, 5.4 GB installed, more while" >&2
  echo "  downloading); only ${free_gb} GB free, ${min_gb} GB wanted. Free some space, lower PYTORCH_MIN_FREE_GB," >&2
  echo "  or point PYTORCH_INDEX_URL at a reachable CPU-only torch index." >&2
  exit 1
else
  echo "install-pytorch-peer: torch from PyPI includes its CUDA wheels: about 3 GB to download, 5.4 GB installed"
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "install-pytorch-peer: creating $VENV"
  python3 -m venv "$VENV"
fi
start=$(date +%s)
echo "install-pytorch-peer: pip install ${PINS[*]}"
# --no-cache-dir: pip's cache would keep a second copy of the 3 GB of wheels.
if [ -n "${PYTORCH_INDEX_URL:-}" ]; then
  # torch alone from that index first; the connector then finds it satisfied and comes from the default one.
  "$VENV/bin/pip" install -q --no-cache-dir --index-url "$PYTORCH_INDEX_URL" "${PINS[0]}"
fi
"$VENV/bin/pip" install -q --no-cache-dir "${PINS[@]}"
"$VENV/bin/python" -c 'import torch, s3torchconnector; print("install-pytorch-peer: torch", torch.__version__, "s3torchconnector", s3torchconnector.__version__ if hasattr(s3torchconnector, "__version__") else "")'
echo "install-pytorch-peer: done in $(( $(date +%s) - start )) s; $(du -sh "$VENV" | cut -f1) in $VENV"
