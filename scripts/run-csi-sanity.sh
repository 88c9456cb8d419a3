#!/usr/bin/env bash
# Runs the Kubernetes CSI conformance suite (csi-sanity, from kubernetes-csi/csi-test) against expressfs-csi's
# Identity and Node services. Opt-in, not part of scripts/test.sh: csi-sanity is a Go program and its
# modules come from proxy.golang.org, which the CI machines cannot reach. Get it where Go 1.23+ and the
# module proxy are available:
#   go install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@v5.4.0
# then: CSI_SANITY=~/go/bin/csi-sanity bash scripts/run-csi-sanity.sh [extra csi-sanity flags]
#
# Skipped, because they cannot apply to a driver without a controller (static provisioning: a volume is a
# bucket that already exists, and GetPluginCapabilities announces no CONTROLLER_SERVICE):
# - every "[Controller Server]" spec (CreateVolume, ValidateVolumeCapabilities on a created volume, ...);
# - "should remove target path", which first creates its volume with CreateVolume.
# Publishing real volumes is covered by csi/tests/node.rs against the emulator.
set -euo pipefail
cd "$(dirname "$0")/.."
export AWS_EC2_METADATA_DISABLED=true

sanity="${CSI_SANITY:-$(command -v csi-sanity || true)}"
if [ -z "$sanity" ] || [ ! -x "$sanity" ]; then
  echo "run-csi-sanity: no csi-sanity binary; set CSI_SANITY=/path/to/csi-sanity (see the top of this script)" >&2
  exit 2
fi

cargo build -q -p expressfs -p expressfs-csi
bin="${CARGO_TARGET_DIR:-$PWD/target}/debug"
work="$(mktemp -d)"
driver_pid=""
cleanup() {
  if [ -n "$driver_pid" ]; then kill "$driver_pid" 2>/dev/null || true; wait "$driver_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

"$bin/expressfs-csi" --endpoint "unix://$work/csi.sock" --node-id sanity-node \
  --expressfs "$bin/expressfs" >"$work/driver.log" 2>&1 &
driver_pid=$!
for _ in $(seq 50); do [ -S "$work/csi.sock" ] && break; sleep 0.1; done
[ -S "$work/csi.sock" ] || { cat "$work/driver.log" >&2; echo "run-csi-sanity: the driver did not start" >&2; exit 1; }

"$sanity" --csi.endpoint "$work/csi.sock" --csi.mountdir "$work/mnt" --csi.stagingdir "$work/stage" \
  --ginkgo.no-color --ginkgo.skip='\[Controller Server\]|should remove target path' "$@"
