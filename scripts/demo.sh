#!/usr/bin/env bash
# The demo: installs what is missing, builds, starts the bundled directory-bucket emulator on 127.0.0.1 with a
# generated training dataset, mounts it with expressfs, reads it the way a training job does and writes a
# checkpoint through the mount, printing what it did and how fast. No AWS account or network needed.
set -euo pipefail
cd "$(dirname "$0")/.."
export AWS_EC2_METADATA_DISABLED=true
bash scripts/setup.sh
echo "== building (release)"
cargo build --release --locked -p expressfs -p expressfs-emulator 2>&1 | tail -n 2
exec .venv/bin/python scripts/demo.py "$@"
