"""Fixtures of the framework suite: every test gets a fresh directory under EXPRESSFS_TEST_DIR (an expressfs
mount, or any local directory) or, without it, under pytest's tmp_path.

Environment:
  EXPRESSFS_TEST_DIR      where the tests write (default: a pytest tmp dir)
  EXPRESSFS_REMOUNT_CMD   shell command that unmounts and remounts EXPRESSFS_TEST_DIR; tests of attributes call
                          it so that what they check comes from the bucket, not from the daemon's memory
  EXPRESSFS_TEST_KEEP=1   leave each test's directory behind (for looking at a failure)
"""
import os
import shutil
import subprocess
import uuid

import pytest

# The frameworks log a lot at import and pick up whatever accelerator they see; keep them quiet and on CPU.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "preserve_metadata: needs the mount's --preserve-metadata (mode and times kept in the bucket)",
    )


# One directory per run, so reruns against the same bucket never see an earlier run's files.
RUN_ID = uuid.uuid4().hex[:8]


@pytest.fixture
def workdir(request, tmp_path):
    base = os.environ.get("EXPRESSFS_TEST_DIR")
    if not base:
        yield str(tmp_path)
        return
    path = os.path.join(base, f"fw-{RUN_ID}", request.node.name)
    os.makedirs(path)
    yield path
    if os.environ.get("EXPRESSFS_TEST_KEEP") != "1":
        # Best effort: on a mount that cannot delete yet, a failed cleanup must not turn a pass into an error.
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def remount():
    """Makes later reads come from storage: remounts when the runner says how, else does nothing (a local
    directory keeps attributes by itself)."""

    def run():
        cmd = os.environ.get("EXPRESSFS_REMOUNT_CMD")
        if cmd:
            done = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"remount failed ({done.returncode}): {done.stderr.strip()[-500:]}"

    return run
