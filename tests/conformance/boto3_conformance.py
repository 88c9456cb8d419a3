#!/usr/bin/env python3
"""Conformance of an S3 server as boto3 (the reference AWS SDK) sees it.

Default: starts expressfs-emulator (EXPRESSFS_EMULATOR, else target/release/expressfs-emulator, built if
missing) on 127.0.0.1 with a fresh data dir and checks a directory bucket and a general-purpose bucket.
With --endpoint it checks an already running server instead (e.g. SeaweedFS); checks that need the
emulator's admin endpoints, its process or a second emulator are then skipped or reduced, and only the
general-purpose checks run unless --directory-bucket is given.

Environment: EXPRESSFS_CONFORMANCE_LARGE=1 adds the large-object check at 2 GiB
(EXPRESSFS_CONFORMANCE_LARGE_MIB overrides the size); the 64 MiB variant always runs.
Every request goes to loopback with explicit credentials; instance metadata is disabled.
Prints PASS/FAIL/SKIP per check and bucket kind; exit code 1 if any check failed.
"""
import argparse
import collections
import hashlib
import http.client
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse

# Set before botocore loads: no instance-metadata probes, no profile lookups, no proxy for loopback.
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
os.environ.pop("AWS_PROFILE", None)
for _var in ("NO_PROXY", "no_proxy"):
    os.environ[_var] = ",".join(filter(None, [os.environ.get(_var), "127.0.0.1", "localhost"]))

import boto3  # noqa: E402
import botocore.config  # noqa: E402
from botocore.auth import SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ACCESS_KEY, SECRET_KEY, REGION = "AKIDEXPRESSFSTEST", "expressfs-test-secret", "us-east-1"
DIR_BUCKET, GENERAL_BUCKET = "conf--use1-az4--x-s3", "conf-general"
MIB = 1024 * 1024
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
RESULTS = []  # (name, kind, verdict)


class Skip(Exception):
    """Raised by a check that cannot run in this setup (reported as SKIP, not FAIL)."""


class Target:
    """What the checks talk to: endpoint, keys, and (when we started it) the emulator process."""

    def __init__(self, endpoint, access_key, secret_key, emulator=None, exe=None):
        self.endpoint, self.access_key, self.secret_key = endpoint, access_key, secret_key
        self.emulator, self.exe = emulator, exe
        # A run-unique key prefix, so reruns against a persistent server never see earlier objects.
        self.prefix = f"conf-{int(time.time())}-{os.getpid()}/"

    def client(self, access_key=None, secret_key=None):
        return make_client(self.endpoint, access_key or self.access_key, secret_key or self.secret_key)


def make_client(endpoint, access_key, secret_key):
    cfg = botocore.config.Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3},
                                 read_timeout=300)  # completing a 2 GiB upload concatenates on disk
    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=access_key,
                        aws_secret_access_key=secret_key, config=cfg)


# ---------------------------------------------------------------------------------------------------------
# Emulator process and helpers


class Emulator:
    """An expressfs-emulator subprocess on 127.0.0.1:0 with its own temp data dir."""

    def __init__(self, exe, buckets, extra=()):
        self.dir = tempfile.mkdtemp(prefix="expressfs-boto3-")
        self.log_path = os.path.join(self.dir, "emulator.log")
        self.log = open(self.log_path, "wb")
        cmd = [exe, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(self.dir, "data"),
               "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, *extra]
        for b in buckets:
            cmd += ["--bucket", b]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log)
        self.pid = self.proc.pid
        # Wait (bounded) for the "listening on http://127.0.0.1:PORT" line and take the port from it.
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline().decode(errors="replace") if ready else ""
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"emulator did not start (stdout {line!r}); see {self.log_path}")
        self.port = int(m.group(1))
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def admin(self, path):
        """GET an unauthenticated /_emulator/ endpoint, parsed as JSON (http.client: loopback, no proxy)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 200, f"GET {path} -> {resp.status} {body[:200]!r}"
            return json.loads(body)
        finally:
            conn.close()

    def rss_mib(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS in /proc status")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def find_emulator():
    exe = os.environ.get("EXPRESSFS_EMULATOR") or os.path.join(ROOT, "target/release/expressfs-emulator")
    if not os.access(exe, os.X_OK):
        print(f"{exe} missing: building it", flush=True)
        subprocess.run(["cargo", "build", "--release", "-p", "expressfs-emulator"], cwd=ROOT, check=True)
        exe = os.path.join(ROOT, "target/release/expressfs-emulator")
    return exe


def expect_error(fn, statuses, codes=None):
    """Runs fn, which must raise a ClientError with one of the HTTP statuses (and error codes)."""
    statuses = statuses if isinstance(statuses, (list, tuple)) else [statuses]
    try:
        fn()
    except ClientError as e:
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = e.response.get("Error", {}).get("Code")
        assert status in statuses and (codes is None or code in codes), \
            f"expected {statuses} {codes or ''}, got {status} {code}"
        return e
    raise AssertionError(f"expected error {statuses} {codes or ''}, got success")


def read_all(s3, bucket, key):
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def list_all(s3, **kw):
    """All pages of a ListObjectsV2 call, as a list of pages."""
    pages, token = [], None
    while True:
        page = s3.list_objects_v2(**kw, **({"ContinuationToken": token} if token else {}))
        pages.append(page)
        token = page.get("NextContinuationToken")
        assert page.get("IsTruncated", False) == bool(token), "IsTruncated disagrees with NextContinuationToken"
        if not token:
            return pages
        assert len(pages) < 1000, "pagination does not end"


def open_uploads(t, s3, bucket):
    """Upload ids the server still holds: the emulator's admin view if we own it, else ListMultipartUploads."""
    if t.emulator:
        return {u["upload_id"] for u in t.emulator.admin(f"/_emulator/uploads?bucket={bucket}")}
    return {u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])}


# ---------------------------------------------------------------------------------------------------------
# Checks. Each takes (target, s3 client, bucket, kind) and raises on a failed assertion.


def check_round_trip(t, s3, bucket, kind):
    key = t.prefix + "rt/a.bin"
    put = s3.put_object(Bucket=bucket, Key=key, Body=b"hello world")
    assert read_all(s3, bucket, key) == b"hello world"
    head = s3.head_object(Bucket=bucket, Key=key)
    assert head["ContentLength"] == 11 and head["ETag"] == put["ETag"], head
    s3.delete_object(Bucket=bucket, Key=key)
    expect_error(lambda: s3.head_object(Bucket=bucket, Key=key), 404)
    expect_error(lambda: s3.get_object(Bucket=bucket, Key=key), 404, ["NoSuchKey"])


def check_bad_credentials(t, s3, bucket, kind):
    # For a directory bucket boto3 first calls CreateSession; that call must be refused the same way.
    key = t.prefix + "auth/x"
    s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    wrong_secret = t.client(secret_key="not-the-secret")
    expect_error(lambda: wrong_secret.get_object(Bucket=bucket, Key=key), 403,
                 ["SignatureDoesNotMatch", "InvalidAccessKeyId"])
    unknown_key = t.client(access_key="AKIDUNKNOWNUNKNOWN00")
    expect_error(lambda: unknown_key.get_object(Bucket=bucket, Key=key), 403)
    assert read_all(s3, bucket, key) == b"x"  # the right keys still work


def raw_signed(url, credentials, service="s3", headers=None):
    """A SigV4 GET of `url` sent with http.client; returns (status, body text)."""
    headers = {"x-amz-content-sha256": EMPTY_SHA256, **(headers or {})}
    req = AWSRequest(method="GET", url=url, headers=headers)
    SigV4Auth(credentials, service, REGION).add_auth(req)
    parts = urllib.parse.urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", target, headers=dict(req.headers.items()))
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def xml_field(body, name):
    m = re.search(f"<{name}>([^<]*)</{name}>", body)
    return m.group(1) if m else None


def raw_signed_get(endpoint, bucket, key, access_key, secret_key):
    """A plain SigV4 (service s3, no session token) GET sent with http.client; returns (status, error code)."""
    url = f"{endpoint}/{bucket}/{urllib.parse.quote(key)}"
    status, body = raw_signed(url, Credentials(access_key, secret_key))
    return status, xml_field(body, "Code")


def check_bucketless_session(t, s3, bucket, kind):
    """Mountpoint's CRT client, path-style on a local endpoint, asks `GET /?session=` with no bucket: the
    emulator answers with a session good for its directory buckets (the real service never sees this form)."""
    key = t.prefix + "bucketless/x"
    s3.put_object(Bucket=bucket, Key=key, Body=b"mp")
    status, body = raw_signed(f"{t.endpoint}/?session=", Credentials(t.access_key, t.secret_key), "s3express")
    assert status == 200, f"bucketless CreateSession: expected 200, got {status}: {body[:300]}"
    session = Credentials(xml_field(body, "AccessKeyId"), xml_field(body, "SecretAccessKey"))
    token = xml_field(body, "SessionToken")
    assert session.access_key and session.secret_key and token, f"no credentials in {body[:300]}"
    url = f"{t.endpoint}/{bucket}/{urllib.parse.quote(key)}"
    status, body = raw_signed(url, session, "s3express", {"x-amz-s3session-token": token})
    assert (status, body) == (200, "mp"), f"GET with the bucketless session: {status} {body[:300]}"
    status, body = raw_signed(url, session, "s3express", {"x-amz-s3session-token": "forged"})
    assert status == 403, f"GET with a forged session token: expected 403, got {status}"


def check_no_session(t, s3, bucket, kind, general_bucket=None):
    key = t.prefix + "nosession/x"
    s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    status, code = raw_signed_get(t.endpoint, bucket, key, t.access_key, t.secret_key)
    assert status == 403, f"directory-bucket GET without a session: expected 403, got {status} {code}"
    # The refusal must be about the missing session, not a signing mistake of ours.
    assert code != "SignatureDoesNotMatch", "our raw signature was rejected; the check proves nothing"
    if general_bucket:  # control: the same signing code is accepted by a general-purpose bucket
        t.client().put_object(Bucket=general_bucket, Key=key, Body=b"y")
        status, code = raw_signed_get(t.endpoint, general_bucket, key, t.access_key, t.secret_key)
        assert status == 200, f"control GET on the general bucket: expected 200, got {status} {code}"


def check_listing(t, s3, bucket, kind):
    base = t.prefix + "p/"
    top = [f"{base}f{i:02d}" for i in range(30)]
    nested = [f"{base}d{i % 4}/x{i}" for i in range(10)]  # p/d0/x0 ... p/d3/x9
    keys = top + nested
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    # Paginated delimiter listing: every object once; prefixes may repeat across pages (directory buckets).
    pages = list_all(s3, Bucket=bucket, Prefix=base, Delimiter="/", MaxKeys=7)
    listed, prefixes, order = collections.Counter(), set(), []
    for page in pages:
        assert page["KeyCount"] <= 7, f"KeyCount {page['KeyCount']} > MaxKeys 7"
        listed.update(o["Key"] for o in page.get("Contents", []))
        order += [o["Key"] for o in page.get("Contents", [])]
        prefixes.update(p["Prefix"] for p in page.get("CommonPrefixes", []))
    assert len(pages) >= 5, f"34 entries at MaxKeys=7 came in {len(pages)} pages"
    dupes = sorted(k for k, n in listed.items() if n > 1)
    assert not dupes, f"keys listed more than once: {dupes}"
    assert set(listed) == set(top), f"missing {set(top) - set(listed)}, extra {set(listed) - set(top)}"
    assert prefixes == {f"{base}d{j}/" for j in range(4)}, sorted(prefixes)
    # Flat listing (no delimiter): all 40 keys; directory buckets in hash order, others in key order.
    flat = [o["Key"] for p in list_all(s3, Bucket=bucket, Prefix=base) for o in p.get("Contents", [])]
    assert sorted(flat) == sorted(keys), f"flat listing has {len(flat)} keys, expected {len(keys)}"
    if kind == "directory":
        assert flat != sorted(flat), "directory bucket listed 40 keys in key order"
        expect_error(lambda: s3.list_objects_v2(Bucket=bucket, Prefix=base, Delimiter="|"), 400)
        expect_error(lambda: s3.list_objects_v2(Bucket=bucket, Prefix=base + "f", Delimiter="/"), 400)
    else:
        assert flat == sorted(flat), "general-purpose bucket listing not in key order"
        assert order == sorted(order), "paginated general-purpose listing not in key order"
        # Any delimiter works: "d" rolls every nested key up into one prefix.
        page = s3.list_objects_v2(Bucket=bucket, Prefix=base, Delimiter="d")
        assert [p["Prefix"] for p in page.get("CommonPrefixes", [])] == [base + "d"], page.get("CommonPrefixes")
        assert [o["Key"] for o in page.get("Contents", [])] == top


def check_ranges(t, s3, bucket, kind):
    key = t.prefix + "range/obj"
    data = hashlib.sha256(b"seed").digest() * 32  # 1024 bytes of varied content
    data = data[:1000]
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    for rng, lo, hi in [("bytes=0-9", 0, 10), ("bytes=990-999", 990, 1000), ("bytes=-10", 990, 1000),
                        ("bytes=995-2000", 995, 1000)]:
        out = s3.get_object(Bucket=bucket, Key=key, Range=rng)
        body = out["Body"].read()
        assert body == data[lo:hi], f"{rng}: wrong bytes ({len(body)} bytes)"
        assert out["ContentRange"] == f"bytes {lo}-{hi - 1}/1000", f"{rng}: ContentRange {out['ContentRange']}"
        assert out["ContentLength"] == hi - lo and out["ResponseMetadata"]["HTTPStatusCode"] == 206, rng
    expect_error(lambda: s3.get_object(Bucket=bucket, Key=key, Range="bytes=1000-1100"), 416, ["InvalidRange"])


def check_conditionals(t, s3, bucket, kind):
    key = t.prefix + "cond/obj"
    etag = s3.put_object(Bucket=bucket, Key=key, Body=b"v1")["ETag"]
    assert s3.get_object(Bucket=bucket, Key=key, IfMatch=etag)["Body"].read() == b"v1"
    expect_error(lambda: s3.get_object(Bucket=bucket, Key=key, IfMatch='"0123456789abcdef"'), 412)
    expect_error(lambda: s3.get_object(Bucket=bucket, Key=key, IfNoneMatch=etag), 304)
    # Conditional create: refused on an existing key (content kept), accepted on a new one.
    expect_error(lambda: s3.put_object(Bucket=bucket, Key=key, Body=b"v2", IfNoneMatch="*"), 412,
                 ["PreconditionFailed"])
    assert read_all(s3, bucket, key) == b"v1", "a refused conditional put changed the object"
    s3.put_object(Bucket=bucket, Key=key + ".new", Body=b"n", IfNoneMatch="*")
    assert read_all(s3, bucket, key + ".new") == b"n"


def check_multipart(t, s3, bucket, kind):
    key = t.prefix + "mpu/obj"
    data = {1: b"a" * (5 * MIB), 2: b"b" * (5 * MIB), 3: b"c" * 1024}
    up = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    etags = {}
    for n in (3, 1, 2):  # out of order on purpose
        etags[n] = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=n, Body=data[n])["ETag"]
    assert up in open_uploads(t, s3, bucket), "open upload not listed"

    def parts(order):
        return {"Parts": [{"PartNumber": n, "ETag": etags[n]} for n in order]}
    expect_error(lambda: s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up,
                                                      MultipartUpload=parts([2, 1, 3])), 400, ["InvalidPartOrder"])
    # A refused Complete leaves the upload usable; ascending order then succeeds.
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload=parts([1, 2, 3]))
    want = hashlib.sha256(data[1] + data[2] + data[3]).hexdigest()
    assert hashlib.sha256(read_all(s3, bucket, key)).hexdigest() == want, "completed object differs"
    assert up not in open_uploads(t, s3, bucket), "completed upload still listed"
    # A part under 5 MiB that is not the last one.
    small = t.prefix + "mpu/small"
    up2 = s3.create_multipart_upload(Bucket=bucket, Key=small)["UploadId"]
    small_parts = [{"PartNumber": n, "ETag": s3.upload_part(Bucket=bucket, Key=small, UploadId=up2, PartNumber=n,
                                                            Body=b"x" * 1024)["ETag"]} for n in (1, 2)]
    expect_error(lambda: s3.complete_multipart_upload(Bucket=bucket, Key=small, UploadId=up2,
                                                      MultipartUpload={"Parts": small_parts}), 400, ["EntityTooSmall"])
    # Abort: the upload disappears from the server's view and the key never appears.
    assert up2 in open_uploads(t, s3, bucket), "upload not listed before abort"
    s3.abort_multipart_upload(Bucket=bucket, Key=small, UploadId=up2)
    assert up2 not in open_uploads(t, s3, bucket), "aborted upload still listed"
    expect_error(lambda: s3.head_object(Bucket=bucket, Key=small), 404)


def pattern_part(base, n, size):
    """Part n of the large object: a window of a 1 MiB pseudo-random block repeated, shifted per part, so
    every part differs (a server swapping parts changes the hash) without holding the object in memory."""
    off = (n * 4099) % MIB
    return bytes(memoryview(base)[off:off + size])


class RssSampler:
    """Polls the emulator's VmRSS every 20 ms on a thread, so a spike inside one request is seen too."""

    def __init__(self, emu):
        self.emu, self.stop_flag = emu, threading.Event()
        self.before = self.peak = emu.rss_mib()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self):
        while not self.stop_flag.wait(0.02):
            self.peak = max(self.peak, self.emu.rss_mib())

    def finish(self):
        self.stop_flag.set()
        self.thread.join()
        self.after = self.emu.rss_mib()
        self.peak = max(self.peak, self.after)


def check_large(t, s3, bucket, kind, size_mib):
    key = t.prefix + f"large/{size_mib}"
    block = b"".join(hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(MIB // 32))  # 1 MiB
    base = block * 65  # 64 MiB window + 1 MiB of shift room
    rss = RssSampler(t.emulator) if t.emulator else None
    try:
        want, done, remaining, n = hashlib.sha256(), [], size_mib * MIB, 0
        up = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        while remaining:
            n += 1
            part = pattern_part(base, n, min(64 * MIB, remaining))
            remaining -= len(part)
            want.update(part)
            etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=n, Body=part)["ETag"]
            done.append({"PartNumber": n, "ETag": etag})
            del part
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload={"Parts": done})
        del base
        got, total = hashlib.sha256(), 0
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        for chunk in iter(lambda: body.read(8 * MIB), b""):
            got.update(chunk)
            total += len(chunk)
    finally:
        if rss:
            rss.finish()
    assert total == size_mib * MIB, f"read {total} bytes, expected {size_mib * MIB}"
    assert got.hexdigest() == want.hexdigest(), "object read back differs from what was uploaded"
    s3.delete_object(Bucket=bucket, Key=key)
    if rss:
        growth = rss.peak - rss.before
        print(f"      emulator RSS {rss.before:.0f} -> peak {rss.peak:.0f} -> {rss.after:.0f} MiB", flush=True)
        assert growth < 512, f"emulator RSS grew by {growth:.0f} MiB (limit 512)"
    else:
        print("      server RSS not measured (not our process); content checked only", flush=True)


def check_append(t, s3, bucket, kind):
    members = s3.meta.service_model.operation_model("PutObject").input_shape.members
    if "WriteOffsetBytes" not in members:
        raise Skip(f"boto3 {boto3.__version__} has no WriteOffsetBytes")
    key = t.prefix + "append/log"
    s3.put_object(Bucket=bucket, Key=key, Body=b"one ")
    if kind == "directory":
        s3.put_object(Bucket=bucket, Key=key, Body=b"two", WriteOffsetBytes=4)
        assert read_all(s3, bucket, key) == b"one two"
        expect_error(lambda: s3.put_object(Bucket=bucket, Key=key, Body=b"x", WriteOffsetBytes=4), 400,
                     ["InvalidWriteOffset"])
    else:
        expect_error(lambda: s3.put_object(Bucket=bucket, Key=key, Body=b"two", WriteOffsetBytes=4), 501,
                     ["NotImplemented"])
    assert read_all(s3, bucket, key) == (b"one two" if kind == "directory" else b"one "), "refused append wrote"


def check_session_refresh(t, exe):
    """A second emulator whose sessions last 2 s: one client keeps working for 10 s (it must re-CreateSession)."""
    bucket = "ttl--use1-az4--x-s3"
    emu = Emulator(exe, [bucket], ["--session-ttl", "2"])
    try:
        s3 = make_client(emu.endpoint, t.access_key, t.secret_key)
        end, rounds = time.monotonic() + 10, 0
        while time.monotonic() < end:
            key = f"s/{rounds}"
            s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
            assert read_all(s3, bucket, key) == key.encode(), f"round {rounds}: wrong content"
            listed = [o["Key"] for p in list_all(s3, Bucket=bucket, Prefix="s/", Delimiter="/")
                      for o in p.get("Contents", [])]
            assert key in listed, f"round {rounds}: {key} not listed"
            rounds += 1
            time.sleep(0.25)
        assert rounds >= 20, f"only {rounds} rounds in 10 s"
        stats = emu.admin("/_emulator/stats").get(bucket, {})
        sessions = stats.get("CreateSession", {}).get("requests", 0)
        errors = sum(op.get("errors", 0) for op in stats.values())
        # 10 s of 2 s sessions: boto3 must have asked for several; none of its requests may have been refused
        # (a refusal hidden by a retry would mean it used an expired session).
        print(f"      {rounds} rounds, {sessions} CreateSession calls", flush=True)
        assert sessions >= 4, f"only {sessions} CreateSession calls in 10 s with a 2 s TTL"
        assert errors == 0, f"{errors} refused requests on the way: {json.dumps(stats)}"
    finally:
        emu.stop()


# ---------------------------------------------------------------------------------------------------------


def check_metadata_and_copy(t, s3, bucket, kind):
    key = t.prefix + "meta/obj"
    attrs = {"mode": "33188", "mtime": "1700000000"}
    s3.put_object(Bucket=bucket, Key=key, Body=b"data", Metadata=attrs)
    assert s3.head_object(Bucket=bucket, Key=key)["Metadata"] == attrs, "metadata not returned by HEAD"
    assert s3.get_object(Bucket=bucket, Key=key)["Metadata"] == attrs, "metadata not returned by GET"
    expect_error(lambda: s3.put_object(Bucket=bucket, Key=key + ".big", Body=b"x", Metadata={"k": "v" * 2100}),
                 400, ["MetadataTooLarge"])
    src = {"Bucket": bucket, "Key": key}
    # Copy onto itself: refused without REPLACE; with it the metadata changes and the bytes stay.
    expect_error(lambda: s3.copy_object(Bucket=bucket, Key=key, CopySource=src), 400, ["InvalidRequest"])
    s3.copy_object(Bucket=bucket, Key=key, CopySource=src, MetadataDirective="REPLACE",
                   Metadata={"mtime": "1800000000"})
    assert s3.head_object(Bucket=bucket, Key=key)["Metadata"] == {"mtime": "1800000000"}
    assert read_all(s3, bucket, key) == b"data"
    # Default COPY keeps the source's metadata; destination If-None-Match on an existing key is refused.
    s3.copy_object(Bucket=bucket, Key=key + ".copy", CopySource=src)
    assert s3.head_object(Bucket=bucket, Key=key + ".copy")["Metadata"] == {"mtime": "1800000000"}
    expect_error(lambda: s3.copy_object(Bucket=bucket, Key=key + ".copy", CopySource=src, IfNoneMatch="*"),
                 412, ["PreconditionFailed"])


def check_upload_part_copy(t, s3, bucket, kind):
    key, src_key = t.prefix + "upc/patched", t.prefix + "upc/source"
    original = bytes(i % 251 for i in range(12 * MIB))
    s3.put_object(Bucket=bucket, Key=src_key, Body=original)
    src = {"Bucket": bucket, "Key": src_key}
    up = s3.create_multipart_upload(Bucket=bucket, Key=key, Metadata={"mode": "33188"})["UploadId"]
    p1 = s3.upload_part_copy(Bucket=bucket, Key=key, UploadId=up, PartNumber=1, CopySource=src,
                             CopySourceRange=f"bytes=0-{5 * MIB - 1}")["CopyPartResult"]["ETag"]
    patch = b"\x5a" * (5 * MIB)
    p2 = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=2, Body=patch)["ETag"]
    p3 = s3.upload_part_copy(Bucket=bucket, Key=key, UploadId=up, PartNumber=3, CopySource=src,
                             CopySourceRange=f"bytes={10 * MIB}-{12 * MIB - 1}")["CopyPartResult"]["ETag"]
    expect_error(lambda: s3.upload_part_copy(Bucket=bucket, Key=key, UploadId=up, PartNumber=4, CopySource=src,
                                             CopySourceRange=f"bytes=0-{12 * MIB}"), 400, ["InvalidArgument"])
    # Complete: If-Match on a key that does not exist is 404; without conditions it completes.
    parts = {"Parts": [{"PartNumber": 1, "ETag": p1}, {"PartNumber": 2, "ETag": p2}, {"PartNumber": 3, "ETag": p3}]}
    expect_error(lambda: s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload=parts,
                                                      IfMatch='"0"'), 404, ["NoSuchKey"])
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload=parts, IfNoneMatch="*")
    want = original[:5 * MIB] + patch + original[10 * MIB:]
    assert read_all(s3, bucket, key) == want, "patched object differs"
    assert s3.head_object(Bucket=bucket, Key=key)["Metadata"] == {"mode": "33188"}, "upload metadata lost"


def run(name, kind, fn, *args):
    """Runs one check, prints its verdict at once (long checks show progress), records it."""
    started = time.monotonic()
    try:
        fn(*args)
        verdict, detail = "PASS", ""
    except Skip as e:
        verdict, detail = "SKIP", str(e)
    except Exception as e:  # noqa: BLE001 - a failing check is reported; the others still run
        verdict, detail = "FAIL", f"{type(e).__name__}: {e}"
        if not isinstance(e, (AssertionError, ClientError)):
            detail += "\n" + traceback.format_exc(limit=4)
    print(f"{verdict}  {name} [{kind}] ({time.monotonic() - started:.1f} s)" + (f": {detail}" if detail else ""),
          flush=True)
    RESULTS.append((name, kind, verdict))


def skip(name, kind, why):
    run(name, kind, lambda: (_ for _ in ()).throw(Skip(why)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoint", help="check this running server (http://127.0.0.1:PORT) instead of the emulator")
    ap.add_argument("--directory-bucket", help="directory bucket (name ends in --x-s3) on --endpoint")
    ap.add_argument("--general-bucket", help="general-purpose bucket on --endpoint")
    ap.add_argument("--access-key", default=ACCESS_KEY)
    ap.add_argument("--secret-key", default=SECRET_KEY)
    args = ap.parse_args()
    if args.endpoint:
        host = urllib.parse.urlsplit(args.endpoint).hostname
        if host not in ("127.0.0.1", "localhost", "::1"):
            ap.error("--endpoint must be a loopback address")
        if not (args.directory_bucket or args.general_bucket):
            ap.error("--endpoint needs --general-bucket and/or --directory-bucket")

    large = os.environ.get("EXPRESSFS_CONFORMANCE_LARGE") == "1"
    large_mib = int(os.environ.get("EXPRESSFS_CONFORMANCE_LARGE_MIB", "2048"))
    emulator, exe = None, None
    try:
        if args.endpoint:
            t = Target(args.endpoint, args.access_key, args.secret_key)
            buckets = [(args.directory_bucket, "directory"), (args.general_bucket, "general")]
            buckets = [(b, k) for b, k in buckets if b]
        else:
            exe = find_emulator()
            emulator = Emulator(exe, [DIR_BUCKET, GENERAL_BUCKET])
            print(f"emulator {exe} on {emulator.endpoint} (pid {emulator.pid})", flush=True)
            t = Target(emulator.endpoint, args.access_key, args.secret_key, emulator, exe)
            buckets = [(DIR_BUCKET, "directory"), (GENERAL_BUCKET, "general")]
        general = next((b for b, k in buckets if k == "general"), None)

        for bucket, kind in buckets:
            s3 = t.client()
            run("1 put/get/head/delete round trip", kind, check_round_trip, t, s3, bucket, kind)
            run("2 wrong secret / unknown key -> 403", kind, check_bad_credentials, t, s3, bucket, kind)
            if kind == "directory":
                run("3 request without a session -> 403", kind, check_no_session, t, s3, bucket, kind, general)
                if emulator:
                    run("3 bucketless CreateSession (Mountpoint, path-style)", kind, check_bucketless_session,
                        t, s3, bucket, kind)
            run("5 listing rules, pagination, order", kind, check_listing, t, s3, bucket, kind)
            run("6 ranges and Content-Range", kind, check_ranges, t, s3, bucket, kind)
            run("7 conditional get and put", kind, check_conditionals, t, s3, bucket, kind)
            run("8 multipart order, size rules, abort", kind, check_multipart, t, s3, bucket, kind)
            run("9 large object 64 MiB streams back, bounded RSS", kind, check_large, t, s3, bucket, kind, 64)
            if large:
                run(f"9 large object {large_mib} MiB streams back, bounded RSS", kind, check_large,
                    t, s3, bucket, kind, large_mib)
            else:
                skip(f"9 large object {large_mib} MiB", kind, "set EXPRESSFS_CONFORMANCE_LARGE=1")
            run("10 append with WriteOffsetBytes", kind, check_append, t, s3, bucket, kind)
            run("11 user metadata, CopyObject directives and conditions", kind, check_metadata_and_copy,
                t, s3, bucket, kind)
            run("12 UploadPartCopy ranges, conditional complete", kind, check_upload_part_copy, t, s3, bucket, kind)
        if any(k == "directory" for _, k in buckets):
            if emulator:
                run("4 session refresh (2 s TTL, 10 s of traffic)", "directory", check_session_refresh, t, exe)
            else:
                skip("4 session refresh", "directory", "needs a second emulator (not with --endpoint)")
    finally:
        if emulator:
            emulator.stop()

    counts = collections.Counter(v for _, _, v in RESULTS)
    print(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    sys.exit(1 if counts["FAIL"] else 0)


if __name__ == "__main__":
    main()
