"""Writers that expect a local file (issue 18): each test is one thing a framework or tool does to its files.

Every test must pass on a local directory (that proves the test right) and is meant to pass on an expressfs
mount of either bucket kind once the writers issue lands. Run through scripts/run-framework-suite.sh, or
directly: EXPRESSFS_TEST_DIR=/mnt/bucket .venv-frameworks/bin/python -m pytest tests/frameworks
"""
import hashlib
import os
import random
import re
import sqlite3
import stat
import subprocess

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(300)


def run(cmd, timeout=120, label=None, **kw):
    """Runs a tool; a failure names the tool and the line of its output that says what went wrong (where its
    errno is), not its banner."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if done.returncode != 0:
        lines = [l.strip() for l in (done.stderr + done.stdout).splitlines() if l.strip()]
        hint = re.compile(r"err=|error|cannot|failed|denied|not permitted|busy|invalid", re.I)
        said = [l for l in lines if hint.search(l)] or lines[-1:]
        pytest.fail(f"{label or cmd[0]} exited {done.returncode}: {' | '.join(said)[-400:]}", pytrace=False)
    return done.stdout


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def leftovers(root, marker):
    """Names under root containing marker (tmp files or directories a writer should have removed)."""
    return [os.path.join(d, n) for d, dirs, files in os.walk(root) for n in dirs + files if marker in n]


def pytree(step):
    return {
        "params": {"w": np.arange(64, dtype=np.float32).reshape(8, 8) + step, "b": np.full(8, step, np.float32)},
        "step": np.array(step, np.int64),
    }


def assert_tree_equal(got, want):
    import jax

    flat_got, tree_got = jax.tree_util.tree_flatten(got)
    flat_want, tree_want = jax.tree_util.tree_flatten(want)
    assert tree_got == tree_want
    for g, w in zip(flat_got, flat_want):
        np.testing.assert_array_equal(np.asarray(g), w)


# --- checkpoint writers -------------------------------------------------------------------------------------


def test_orbax_standard_checkpointer(workdir):
    import jax
    import orbax.checkpoint as ocp

    tree = pytree(7)
    path = os.path.join(workdir, "ckpt")
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(path, tree)
    ckptr.wait_until_finished()
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, tree)
    assert_tree_equal(ckptr.restore(path, abstract), tree)
    assert leftovers(workdir, "orbax-checkpoint-tmp") == []


def test_orbax_checkpoint_manager_max_to_keep(workdir):
    import jax
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(workdir, options=options) as mngr:
        for step in range(5):
            mngr.save(step, args=ocp.args.StandardSave(pytree(step)))
        mngr.wait_until_finished()
        assert mngr.all_steps() == [3, 4]
    # A new manager (a restarted job) sees the same steps and restores the latest.
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, pytree(0))
    with ocp.CheckpointManager(workdir, options=options) as mngr:
        assert mngr.latest_step() == 4
        assert_tree_equal(mngr.restore(4, args=ocp.args.StandardRestore(abstract)), pytree(4))
    assert sorted(n for n in os.listdir(workdir) if n[0].isdigit()) == ["3", "4"]
    assert leftovers(workdir, "orbax-checkpoint-tmp") == []


def test_tensorflow_checkpoint_manager(workdir):
    import tensorflow as tf

    v = tf.Variable(tf.zeros([16]))
    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(v=v, step=step)
    mgr = tf.train.CheckpointManager(ckpt, workdir, max_to_keep=2)
    for i in range(1, 5):
        v.assign(tf.range(16, dtype=tf.float32) * i)
        step.assign(i)
        mgr.save()
    assert len(mgr.checkpoints) == 2

    v2 = tf.Variable(tf.zeros([16]))
    step2 = tf.Variable(0, dtype=tf.int64)
    restored = tf.train.Checkpoint(v=v2, step=step2)
    latest = tf.train.latest_checkpoint(workdir)
    assert latest is not None and latest.endswith("ckpt-4"), latest
    restored.restore(latest).assert_consumed()
    assert int(step2.numpy()) == 4
    np.testing.assert_array_equal(v2.numpy(), np.arange(16, dtype=np.float32) * 4)
    # max_to_keep deleted the older checkpoints' files.
    assert not [n for n in os.listdir(workdir) if n.startswith(("ckpt-1.", "ckpt-2."))]


def test_os_replace_checkpoint_cycle(workdir):
    final = os.path.join(workdir, "model.ckpt")
    for i in range(3):
        data = random.Random(i).randbytes(300_000 + i)
        tmp = final + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)  # the second and third cycles replace an existing file
        assert read(final) == data
    assert sorted(os.listdir(workdir)) == ["model.ckpt"]


def test_safetensors_save_and_load(workdir):
    # safetensors (Hugging Face's save_pretrained) writes a temporary file and renames it before closing it.
    from safetensors.numpy import load_file, save_file

    path = os.path.join(workdir, "model.safetensors")
    tensors = {"w": np.arange(300_000, dtype=np.float32), "b": np.ones((7, 3), dtype=np.int64)}
    for step in range(2):  # the second save replaces the first
        tensors["w"] += step
        save_file(tensors, path)
        loaded = load_file(path)
        assert sorted(loaded) == ["b", "w"]
        np.testing.assert_array_equal(loaded["w"], tensors["w"])
        np.testing.assert_array_equal(loaded["b"], tensors["b"])
    assert sorted(os.listdir(workdir)) == ["model.safetensors"]


def test_rename_directory(workdir):
    # What Orbax does last: STEP.orbax-checkpoint-tmp/ (a directory of files) renamed to STEP/.
    src = os.path.join(workdir, "1.tmp")
    os.makedirs(os.path.join(src, "sub"))
    write(os.path.join(src, "a"), b"alpha")
    write(os.path.join(src, "sub", "b"), b"beta")
    os.rename(src, os.path.join(workdir, "1"))
    assert os.listdir(workdir) == ["1"]
    assert read(os.path.join(workdir, "1", "a")) == b"alpha"
    assert read(os.path.join(workdir, "1", "sub", "b")) == b"beta"


# --- files edited in place ----------------------------------------------------------------------------------


def test_h5py_append_mode(workdir):
    import h5py

    path = os.path.join(workdir, "data.h5")
    first = np.arange(1000, dtype=np.float64)
    second = np.arange(500, dtype=np.int32).reshape(50, 10)
    with h5py.File(path, "w") as f:
        f.create_dataset("first", data=first)
    with h5py.File(path, "a") as f:
        assert list(f.keys()) == ["first"]
        f.create_dataset("second", data=second)
    with h5py.File(path, "r") as f:
        assert sorted(f.keys()) == ["first", "second"]
        np.testing.assert_array_equal(f["first"][:], first)
        np.testing.assert_array_equal(f["second"][:], second)


def sqlite_step(name, path, sql):
    """Runs one connection's worth of work; an error names the step and SQLite's extended code (which says
    whether it was the open, a read, a write, an fsync or a lock that failed)."""
    try:
        db = sqlite3.connect(path)
        try:
            return sql(db)
        finally:
            db.close()
    except sqlite3.Error as e:
        error = e
    # Outside the except block, so the report holds this line alone rather than a chain of two exceptions.
    pytest.fail(f"sqlite {name}: {error} ({getattr(error, 'sqlite_errorname', '?')})", pytrace=False)


def test_sqlite_reopen_update_integrity(workdir):
    path = os.path.join(workdir, "db.sqlite")

    def create(db):
        db.execute("create table t (k integer primary key, v text)")
        db.executemany("insert into t values (?, ?)", [(i, f"value-{i}" * 20) for i in range(2000)])
        db.commit()

    def update(db):
        db.execute("update t set v = 'changed' where k % 7 = 0")
        db.execute("insert into t values (5000, 'late')")
        db.commit()

    def check(db):
        return [
            db.execute("pragma integrity_check").fetchone()[0],
            db.execute("select count(*) from t").fetchone()[0],
            db.execute("select count(*) from t where v = 'changed'").fetchone()[0],
            db.execute("select v from t where k = 5000").fetchone()[0],
        ]

    sqlite_step("create", path, create)
    sqlite_step("reopen and update", path, update)
    assert sqlite_step("reopen and check", path, check) == ["ok", 2001, 286, "late"]


def test_fio_randwrite_verify(workdir):
    path = os.path.join(workdir, "fio.dat")
    # A relative name: fio cuts its error line at 128 characters, and a long path would push the errno out.
    common = [
        "fio", "--name=rw", "--filename=fio.dat", "--size=4M", "--bs=4k", "--rw=randwrite",
        "--ioengine=psync", "--verify=crc32c", "--verify_state_save=0", "--randrepeat=1", "--randseed=42",
    ]
    # Lays out the file, reopens it O_RDWR, writes 4 KiB blocks in random order and reads each back.
    run(common + ["--do_verify=1"], timeout=180, cwd=workdir, label="fio randwrite+verify")
    # A second process reading every block back against the same seed.
    run(common + ["--verify_only=1"], timeout=180, cwd=workdir, label="fio verify pass")
    assert os.path.getsize(path) == 4 << 20


def test_dd_notrunc_patch(workdir):
    path = os.path.join(workdir, "blob.bin")
    data = bytearray(random.Random(1).randbytes(1 << 20))
    write(path, data)
    patch = os.path.join(workdir, "patch.bin")
    write(patch, b"\xab" * 4096)
    run(["dd", f"if={patch}", f"of={path}", "bs=4096", "seek=100", "count=1", "conv=notrunc", "status=none"])
    data[100 * 4096:101 * 4096] = b"\xab" * 4096
    got = read(path)
    assert len(got) == len(data)
    assert got == bytes(data)


def test_truncate_grow(workdir):
    path = os.path.join(workdir, "grow.bin")
    data = random.Random(2).randbytes(100_000)
    write(path, data)
    run(["truncate", "-s", "300000", path])
    assert os.path.getsize(path) == 300_000
    assert read(path) == data + bytes(200_000)


def test_truncate_shrink(workdir):
    path = os.path.join(workdir, "shrink.bin")
    data = random.Random(3).randbytes(100_000)
    write(path, data)
    run(["truncate", "-s", "10000", path])
    assert os.path.getsize(path) == 10_000
    assert read(path) == data[:10_000]


def test_shell_append(workdir):
    path = os.path.join(workdir, "log.txt")
    run(["sh", "-c", 'printf "first\\n" > "$1"', "sh", path], label="sh >")
    run(["sh", "-c", 'printf "second\\n" >> "$1"', "sh", path], label="sh >>")
    run(["sh", "-c", 'printf "third\\n" >> "$1"', "sh", path], label="sh >>")
    assert read(path) == b"first\nsecond\nthird\n"


def test_reader_sees_live_writers_flushed_bytes(workdir):
    path = os.path.join(workdir, "live.log")
    first, second = b"A" * 10_000, b"B" * 5_000
    with open(path, "wb") as writer:
        writer.write(first)
        writer.flush()
        # A second open while the writer holds the file (tail -f, a TensorBoard reader, a lock file).
        with open(path, "rb") as reader:
            assert reader.read() == first
            writer.write(second)
            writer.flush()
            assert reader.read() == second
    assert read(path) == first + second


# --- names and attributes -----------------------------------------------------------------------------------


def test_huggingface_cache_symlinks(workdir):
    # The hub cache: snapshots/<rev>/<file> are relative links into blobs/<sha256>.
    repo = os.path.join(workdir, "models--org--tiny")
    rev = "0123456789abcdef0123456789abcdef01234567"
    files = {"config.json": b'{"hidden": 8}\n', "weights/model.bin": random.Random(4).randbytes(200_000)}
    os.makedirs(os.path.join(repo, "blobs"))
    os.makedirs(os.path.join(repo, "refs"))
    write(os.path.join(repo, "refs", "main"), rev.encode())
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        write(os.path.join(repo, "blobs", sha), data)
        link = os.path.join(repo, "snapshots", rev, name)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        target = os.path.relpath(os.path.join(repo, "blobs", sha), os.path.dirname(link))
        os.symlink(target, link)
    for name, data in files.items():
        link = os.path.join(repo, "snapshots", read(os.path.join(repo, "refs", "main")).decode(), name)
        assert os.path.islink(link)
        assert os.readlink(link) == ("../" * (name.count("/") + 2)) + "blobs/" + hashlib.sha256(data).hexdigest()
        assert read(link) == data


@pytest.mark.preserve_metadata
def test_rsync_twice_transfers_nothing(workdir, tmp_path, remount):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i, name in enumerate(["a.txt", "b.bin", "sub/c.bin"]):
        p = src / name
        p.write_bytes(random.Random(i).randbytes(1000 * (i + 1)))
        os.chmod(p, 0o640 if i % 2 else 0o600)
        os.utime(p, (1_700_000_000 + i, 1_700_000_000 + i))
    dst = os.path.join(workdir, "dst")
    out = run(["rsync", "-a", "--stats", f"{src}/", f"{dst}/"], label="first rsync")
    assert "Number of regular files transferred: 3" in out, out
    assert read(os.path.join(dst, "sub", "c.bin")) == (src / "sub/c.bin").read_bytes()
    remount()
    out = run(["rsync", "-a", "--stats", f"{src}/", f"{dst}/"], label="second rsync")
    sent = re.search(r"Number of regular files transferred: \d+", out)
    assert sent and sent.group().endswith(": 0"), f"second rsync re-sent: {sent and sent.group()}"


@pytest.mark.preserve_metadata
def test_chmod_kept(workdir, remount):
    path = os.path.join(workdir, "script.sh")
    write(path, b"#!/bin/sh\necho hi\n")
    os.chmod(path, 0o750)
    remount()
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert mode == 0o750, f"mode after remount is {mode:o}, not 750"
    assert read(path) == b"#!/bin/sh\necho hi\n"


@pytest.mark.preserve_metadata
def test_utime_kept(workdir, remount):
    path = os.path.join(workdir, "old.txt")
    write(path, b"written long ago\n")
    # Whole seconds: the s3fs metadata format stores seconds, so this must survive either format.
    os.utime(path, (1_600_000_000, 1_600_000_000))
    remount()
    mtime = os.stat(path).st_mtime
    assert mtime == 1_600_000_000, f"mtime after remount is {mtime:.0f}, not 1600000000"
    with open(path, "rb") as f:
        assert f.read() == b"written long ago\n"
        assert os.fstat(f.fileno()).st_mtime == 1_600_000_000
