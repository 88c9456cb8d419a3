#!/usr/bin/env python3
"""Conformance of an S3 server as boto3 sees it.

Default: starts expressfs-emulator (EXPRESSFS_EMULATOR or target/{release,debug}/expressfs-emulator) on
127.0.0.1 and checks a directory bucket and a general-purpose bucket. With --endpoint it checks an already
running server instead (e.g. SeaweedFS), general-purpose checks only unless --directory-bucket is given.

Every request goes to loopback with explicit credentials; instance metadata is disabled.
Exit code 0 when every check passed.
"""
import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time

os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
os.environ.pop("AWS_PROFILE", None)

import boto3  # noqa: E402
import botocore.config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY, SECRET, REGION = "AKIDEXPRESSFSTEST", "expressfs-test-secret", "us-east-1"
RESULTS = []


def client(endpoint, key=KEY, secret=SECRET):
    cfg = botocore.config.Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3})
    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=key,
                        aws_secret_access_key=secret, config=cfg)


def status(e):
    return e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def code(e):
    return e.response.get("Error", {}).get("Code")


def check(name):
    def wrap(fn):
        def run(*args):
            label = f"{name} [{args[-1]}]" if args else name
            try:
                fn(*args)
                RESULTS.append((label, "PASS", ""))
            except Exception as e:  # a failed check is reported, the others still run
                RESULTS.append((label, "FAIL", repr(e)[:300]))
        return run
    return wrap


def expect_error(fn, statuses, codes=None):
    try:
        fn()
    except ClientError as e:
        assert status(e) in statuses, f"status {status(e)} not in {statuses}: {e}"
        if codes:
            assert code(e) in codes, f"code {code(e)} not in {codes}"
        return e
    raise AssertionError(f"expected an error {statuses}")


@check("put/get/head/delete round trip")
def round_trip(s3, bucket, kind):
    s3.put_object(Bucket=bucket, Key="rt/a.bin", Body=b"hello")
    assert s3.get_object(Bucket=bucket, Key="rt/a.bin")["Body"].read() == b"hello"
    assert s3.head_object(Bucket=bucket, Key="rt/a.bin")["ContentLength"] == 5
    s3.delete_object(Bucket=bucket, Key="rt/a.bin")
    expect_error(lambda: s3.head_object(Bucket=bucket, Key="rt/a.bin"), [404])
    expect_error(lambda: s3.get_object(Bucket=bucket, Key="rt/a.bin"), [404], ["NoSuchKey"])


@check("wrong keys refused with 403")
def wrong_keys(endpoint, bucket, kind):
    expect_error(lambda: client(endpoint, secret="wrong").list_objects_v2(Bucket=bucket, Prefix="rt/", Delimiter="/"), [403])
    expect_error(lambda: client(endpoint, key="AKIDUNKNOWN").head_object(Bucket=bucket, Key="x"), [403])


@check("request without a session refused")
def no_session(endpoint, bucket, kind):
    # Plain SigV4 (service s3, no x-amz-s3session-token) against a directory bucket.
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    import urllib.request
    import urllib.error
    url = f"{endpoint}/{bucket}/anything"
    req = AWSRequest(method="GET", url=url, headers={"x-amz-content-sha256": hashlib.sha256(b"").hexdigest()})
    SigV4Auth(Credentials(KEY, SECRET), "s3", REGION).add_auth(req)
    try:
        urllib.request.urlopen(urllib.request.Request(url, headers=dict(req.headers.items())))
        raise AssertionError("a directory-bucket GET without a session was served")
    except urllib.error.HTTPError as e:
        assert e.code == 403, e.code


@check("listing rules, pagination, order")
def listing(s3, bucket, kind):
    keys = [f"ls/k{i:02d}" for i in range(40)] + ["ls/d1/a", "ls/d1/b", "ls/d2/c"]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=b"x")
    objects, prefixes, token = [], set(), None
    while True:
        kw = {"ContinuationToken": token} if token else {}
        page = s3.list_objects_v2(Bucket=bucket, Prefix="ls/", Delimiter="/", MaxKeys=7, **kw)
        assert page["KeyCount"] <= 7
        objects += [o["Key"] for o in page.get("Contents", [])]
        prefixes |= {p["Prefix"] for p in page.get("CommonPrefixes", [])}
        token = page.get("NextContinuationToken")
        if not token:
            break
    assert sorted(objects) == sorted(keys[:40]) and len(set(objects)) == len(objects), objects
    assert prefixes == {"ls/d1/", "ls/d2/"}, prefixes
    flat = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="ls/")["Contents"]]
    assert sorted(flat) == sorted(keys)
    if kind == "directory":
        assert flat != sorted(flat), "directory bucket listing came back in key order"
        expect_error(lambda: s3.list_objects_v2(Bucket=bucket, Delimiter="|"), [400])
        expect_error(lambda: s3.list_objects_v2(Bucket=bucket, Prefix="ls", Delimiter="/"), [400])
    else:
        assert flat == sorted(flat)
        page = s3.list_objects_v2(Bucket=bucket, Prefix="ls/", Delimiter="|")
        assert len(page["Contents"]) == len(keys)


@check("ranges")
def ranges(s3, bucket, kind):
    data = bytes(i % 251 for i in range(1000))
    s3.put_object(Bucket=bucket, Key="range", Body=data)
    for rng, lo, hi in [("bytes=0-9", 0, 10), ("bytes=990-999", 990, 1000), ("bytes=-10", 990, 1000), ("bytes=995-2000", 995, 1000)]:
        out = s3.get_object(Bucket=bucket, Key="range", Range=rng)
        assert out["Body"].read() == data[lo:hi], rng
        assert out["ContentRange"] == f"bytes {lo}-{hi - 1}/1000", out["ContentRange"]
    expect_error(lambda: s3.get_object(Bucket=bucket, Key="range", Range="bytes=1000-1100"), [416], ["InvalidRange"])


@check("conditional requests")
def conditions(s3, bucket, kind):
    etag = s3.put_object(Bucket=bucket, Key="cond", Body=b"v1")["ETag"]
    s3.get_object(Bucket=bucket, Key="cond", IfMatch=etag)
    expect_error(lambda: s3.get_object(Bucket=bucket, Key="cond", IfMatch='"nope"'), [412])
    expect_error(lambda: s3.get_object(Bucket=bucket, Key="cond", IfNoneMatch=etag), [304])
    expect_error(lambda: s3.put_object(Bucket=bucket, Key="cond", Body=b"v2", IfNoneMatch="*"), [412])
    assert s3.get_object(Bucket=bucket, Key="cond")["Body"].read() == b"v1"


@check("multipart: out-of-order parts, order and size rules, abort")
def multipart(s3, bucket, kind):
    mib = 1024 * 1024
    data = {1: b"a" * (5 * mib), 2: b"b" * (5 * mib), 3: b"c" * 1024}
    up = s3.create_multipart_upload(Bucket=bucket, Key="mpu")["UploadId"]
    etags = {}
    for n in (3, 1, 2):
        etags[n] = s3.upload_part(Bucket=bucket, Key="mpu", UploadId=up, PartNumber=n, Body=data[n])["ETag"]
    parts = lambda ns: {"Parts": [{"PartNumber": n, "ETag": etags[n]} for n in ns]}  # noqa: E731
    expect_error(lambda: s3.complete_multipart_upload(Bucket=bucket, Key="mpu", UploadId=up, MultipartUpload=parts([2, 1])), [400], ["InvalidPartOrder"])
    s3.complete_multipart_upload(Bucket=bucket, Key="mpu", UploadId=up, MultipartUpload=parts([1, 2, 3]))
    got = s3.get_object(Bucket=bucket, Key="mpu")["Body"].read()
    assert hashlib.sha256(got).digest() == hashlib.sha256(data[1] + data[2] + data[3]).digest()
    up = s3.create_multipart_upload(Bucket=bucket, Key="small")["UploadId"]
    small = [s3.upload_part(Bucket=bucket, Key="small", UploadId=up, PartNumber=n, Body=b"x" * 100)["ETag"] for n in (1, 2)]
    expect_error(lambda: s3.complete_multipart_upload(Bucket=bucket, Key="small", UploadId=up, MultipartUpload={"Parts": [{"PartNumber": n + 1, "ETag": e} for n, e in enumerate(small)]}), [400], ["EntityTooSmall"])
    s3.abort_multipart_upload(Bucket=bucket, Key="small", UploadId=up)
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert up not in [u["UploadId"] for u in uploads], "aborted upload still listed"


@check("large object streams back intact without server memory growth")
def large(s3, bucket, emulator_pid, kind):
    size_mib = 2048 if os.environ.get("EXPRESSFS_CONFORMANCE_LARGE") == "1" else 64
    part = bytes(i % 239 for i in range(1024 * 1024)) * 64  # 64 MiB, reused for every part
    want = hashlib.sha256()
    up = s3.create_multipart_upload(Bucket=bucket, Key="large")["UploadId"]
    done = []
    for n in range(1, size_mib // 64 + 1):
        want.update(part)
        done.append({"PartNumber": n, "ETag": s3.upload_part(Bucket=bucket, Key="large", UploadId=up, PartNumber=n, Body=part)["ETag"]})
    s3.complete_multipart_upload(Bucket=bucket, Key="large", UploadId=up, MultipartUpload={"Parts": done})
    before = rss_mib(emulator_pid)
    got, peak = hashlib.sha256(), before
    body = s3.get_object(Bucket=bucket, Key="large")["Body"]
    for chunk in iter(lambda: body.read(8 * 1024 * 1024), b""):
        got.update(chunk)
        peak = max(peak, rss_mib(emulator_pid))
    assert got.digest() == want.digest(), "bytes differ"
    if emulator_pid:
        assert peak - before < 512, f"emulator RSS grew {peak - before:.0f} MiB"


@check("append with write offset (directory buckets)")
def append(s3, bucket, kind):
    s3.put_object(Bucket=bucket, Key="log", Body=b"one ")
    try:
        s3.put_object(Bucket=bucket, Key="log", Body=b"two", WriteOffsetBytes=4)
    except (TypeError, Exception) as e:  # older boto3 lacks the parameter
        if "WriteOffsetBytes" in str(e) and "Unknown parameter" in str(e):
            RESULTS.append(("append [skip]", "SKIP", "boto3 without WriteOffsetBytes"))
            return
        raise
    assert s3.get_object(Bucket=bucket, Key="log")["Body"].read() == b"one two"
    expect_error(lambda: s3.put_object(Bucket=bucket, Key="log", Body=b"x", WriteOffsetBytes=4), [400], ["InvalidWriteOffset"])


def rss_mib(pid):
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@check("session refresh across a 2 s session TTL for 10 s")
def session_refresh(exe, kind):
    with tempfile.TemporaryDirectory() as data:
        proc, endpoint = start_emulator(exe, data, ["--session-ttl", "2", "--bucket", "ttl--use1-az4--x-s3"])
        try:
            s3 = client(endpoint)
            end, rounds = time.time() + 10, 0
            while time.time() < end:
                s3.put_object(Bucket="ttl--use1-az4--x-s3", Key=f"s/{rounds}", Body=b"x")
                assert s3.get_object(Bucket="ttl--use1-az4--x-s3", Key=f"s/{rounds}")["Body"].read() == b"x"
                s3.list_objects_v2(Bucket="ttl--use1-az4--x-s3", Prefix="s/", Delimiter="/")
                rounds += 1
                time.sleep(0.25)
            assert rounds >= 20, rounds
        finally:
            proc.kill()


def start_emulator(exe, data, extra):
    proc = subprocess.Popen([exe, "--listen", "127.0.0.1:0", "--data-dir", data, "--access-key", KEY,
                             "--secret-key", SECRET] + extra, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise SystemExit(f"emulator did not start: {line!r}")
    return proc, line.strip().split("listening on ")[1]


def find_emulator():
    for path in (os.environ.get("EXPRESSFS_EMULATOR"), f"{ROOT}/target/release/expressfs-emulator", f"{ROOT}/target/debug/expressfs-emulator"):
        if path and os.access(path, os.X_OK):
            return path
    subprocess.run(["cargo", "build", "-p", "expressfs-emulator"], cwd=ROOT, check=True)
    return f"{ROOT}/target/debug/expressfs-emulator"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoint", help="check this running server instead of starting the emulator")
    ap.add_argument("--directory-bucket")
    ap.add_argument("--general-bucket")
    args = ap.parse_args()

    proc = None
    if args.endpoint:
        endpoint, pid = args.endpoint, None
        buckets = [(b, k) for b, k in ((args.directory_bucket, "directory"), (args.general_bucket, "general")) if b]
    else:
        exe = find_emulator()
        data = tempfile.mkdtemp(prefix="boto3-conformance-")
        proc, endpoint = start_emulator(exe, data, ["--bucket", "conf--use1-az4--x-s3", "--bucket", "conf-general"])
        pid = proc.pid
        buckets = [("conf--use1-az4--x-s3", "directory"), ("conf-general", "general")]
    try:
        s3 = client(endpoint)
        for bucket, kind in buckets:
            round_trip(s3, bucket, kind)
            wrong_keys(endpoint, bucket, kind)
            listing(s3, bucket, kind)
            ranges(s3, bucket, kind)
            conditions(s3, bucket, kind)
            multipart(s3, bucket, kind)
            large(s3, bucket, pid, kind)
            if kind == "directory":
                no_session(endpoint, bucket, kind)
                append(s3, bucket, kind)
        if not args.endpoint:
            session_refresh(exe, "directory")
    finally:
        if proc:
            proc.kill()
    width = max(len(r[0]) for r in RESULTS)
    for label, verdict, detail in RESULTS:
        print(f"{verdict:4}  {label:{width}}  {detail}")
    failed = [r for r in RESULTS if r[1] == "FAIL"]
    print(f"{len(RESULTS) - len(failed)} of {len(RESULTS)} checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
