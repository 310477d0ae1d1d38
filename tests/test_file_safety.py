"""Nothing lost, nothing let in: path safety, writer locks, logs as evidence, temporaries."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import zipfile

import h5py
import numpy as np
import pytest

from conftest import log_hash, require
from fastflip.errors import FileLockedError, InputFileError, LogMismatchError, OutputError
from fastflip.files.filebytes import sha256_file
from fastflip.files.inject import inject_file
from fastflip.files.revert import revert
from fastflip.files.keras_archive import ArchiveLimits, edit_archive, read_archive
from fastflip.files.log import InjectionLog
from fastflip.files.paths import sweep_stale
from h5fixtures import keras_legacy_like
from test_cli_core import ckpt, run  # noqa: F401  (ckpt is a fixture)

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def cli(capsys, *argv):
    return run(capsys, *map(str, argv))


def cli_proc(*argv, env=None, timeout=120):
    e = dict(os.environ, PYTHONPATH=SRC, **(env or {}))
    return subprocess.run([sys.executable, "-m", "fastflip", *map(str, argv)], capture_output=True, text=True,
                          env=e, timeout=timeout)


def keras_like(path, extra=()):
    """A .keras-shaped archive: config.json, metadata.json and an HDF5 model.weights.h5."""
    inner = str(path) + ".inner.h5"
    with h5py.File(inner, "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.linspace(-1, 1, 64, dtype="f4").reshape(8, 8))
        f.create_dataset("layers/dense/vars/1", data=np.arange(8, dtype="f4"))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("metadata.json", '{"keras_version": "3"}')
        z.writestr("config.json", '{"class_name": "Sequential"}')
        z.write(inner, "model.weights.h5")
        for name, data in extra:
            z.writestr(name, data)
    os.unlink(inner)
    return str(path)


# ------------------------------------------------------------------------------------- 1. path safety


def test_log_equal_to_input_or_output_is_refused(ckpt, tmp_path, capsys):
    before = sha256_file(ckpt)
    out = tmp_path / "o.h5"
    for log in (ckpt, out):
        rc, _, err = cli(capsys, "inject", ckpt, "-o", out, "--log", log, "--count", "3")
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert "the log is" in err
    assert sha256_file(ckpt) == before and not out.exists()
    rc, _, err = cli(capsys, "inject", ckpt, "--in-place", "--log", ckpt, "--count", "3")
    assert rc == 2 and "log is the input" in err and sha256_file(ckpt) == before


def test_devices_fifos_and_directories_are_never_replaced(ckpt, tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for target in ("/dev/null", fifo, tmp_path):
        rc, _, err = cli(capsys, "inject", ckpt, "-o", target, "--count", "1", "--force")
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert ("not a regular file" in err) or ("is a directory" in err)
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")  # still the device
    import stat

    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    rc, _, err = cli(capsys, "inject", ckpt, "-o", tmp_path / "o.h5", "--log", "/dev/null", "--count", "1")
    assert rc == 2 and "not a regular file" in err and not (tmp_path / "o.h5").exists()


def test_existing_output_needs_force(ckpt, tmp_path, capsys):
    out = tmp_path / "o.h5"
    assert cli(capsys, "inject", ckpt, "-o", out, "--count", "2", "--seed", "1")[0] == 0
    first = sha256_file(out)
    rc, _, err = cli(capsys, "inject", ckpt, "-o", out, "--count", "2", "--seed", "2")
    assert rc == 2 and "exists; use --force" in err and sha256_file(out) == first
    assert cli(capsys, "inject", ckpt, "-o", out, "--count", "2", "--seed", "2", "--force")[0] == 0
    assert sha256_file(out) != first
    log = str(out) + ".fflog"
    rc, _, err = cli(capsys, "replay", log, ckpt, "-o", out)
    assert rc == 2 and "--force" in err
    rc, _, err = cli(capsys, "replay", log, ckpt, "-o", log, "--force")  # never onto its own log
    assert rc == 2 and "is the input" in err


def test_in_place_through_a_symlink_writes_the_real_file(ckpt, tmp_path, capsys):
    link = tmp_path / "link.h5"
    link.symlink_to(ckpt)
    before = sha256_file(ckpt)
    rc, out, err = cli(capsys, "inject", link, "--in-place", "--count", "4", "--seed", "3")
    assert rc == 0, err
    assert link.is_symlink() and os.readlink(link) == ckpt  # the link is still the link
    assert sha256_file(ckpt) != before  # ... and the real file changed
    logs = [p for p in os.listdir(tmp_path) if p.endswith(".fflog")]
    assert logs == ["model.h5.fflog"]  # beside the real file
    assert cli(capsys, "revert", tmp_path / logs[0], link)[0] == 0
    assert link.is_symlink() and sha256_file(ckpt) == before


def test_keras_output_equal_to_input_needs_in_place(tmp_path, capsys):
    src = keras_like(tmp_path / "m.keras")
    before = sha256_file(src)
    rc, _, err = cli(capsys, "inject", src, "-o", src, "--count", "2", "--force")
    assert rc == 2 and "--in-place" in err and sha256_file(src) == before


# ------------------------------------------------------------------------------------- 2. writer locks


def test_second_writer_is_refused_with_the_holder(ckpt, tmp_path, capsys):
    hold = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from fastflip.files.locks import WriterLock
        with WriterLock({ckpt!r}, "test holder"):
            print("held", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=SRC))
    try:
        assert hold.stdout.readline().strip() == "held"
        before = sha256_file(ckpt)
        link = tmp_path / "alias.h5"
        os.link(ckpt, link)  # a hard link is the same file: the same lock
        for name in (ckpt, link):
            rc, _, err = cli(capsys, "inject", name, "--in-place", "--count", "2")
            assert rc == 2 and f"pid {hold.pid}" in err and "test holder" in err, err
        with pytest.raises(FileLockedError, match=f"pid {hold.pid}"):
            revert(InjectionLog.load(_make_log(tmp_path)), ckpt)
        assert sha256_file(ckpt) == before
        assert not [p for p in os.listdir(tmp_path) if p.endswith(".fflog") and p.startswith("model.h5")]
    finally:
        hold.kill()
        hold.wait()
    assert cli(capsys, "inject", ckpt, "--in-place", "--count", "2")[0] == 0  # the kernel dropped the lock


def _make_log(tmp_path):
    other = str(tmp_path / "other.h5")
    keras_legacy_like(other)
    return inject_file(other, str(tmp_path / "other.out.h5"), seed=1, count=2).log_path


def test_simultaneous_in_place_runs_lose_nothing(tmp_path):
    src = str(tmp_path / "big.h5")
    with h5py.File(src, "w") as f:
        f.create_dataset("w", data=np.random.default_rng(0).random(6_000_000).astype("f4"))
    before = sha256_file(src)
    procs = [subprocess.Popen([sys.executable, "-m", "fastflip", "inject", src, "--in-place", "--count", "50",
                               "--seed", str(s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=SRC)) for s in (1, 2)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    ok = [r for r in results if r[0] == 0]
    refused = [r for r in results if r[0] != 0]
    assert all("is writing this file" in e for _, e in refused), refused
    logs = sorted((p for p in os.listdir(tmp_path) if p.endswith(".fflog")), key=lambda n: os.path.getmtime(tmp_path / n))
    assert len(ok) >= 1 and len(logs) == len(ok)  # one log per success: none lost, none overwritten
    for name in reversed(logs):  # every injection is undone, newest first: back to the original bytes
        revert(str(tmp_path / name), src)
    assert sha256_file(src) == before


# ------------------------------------------------------------------------------------- 3. logs as evidence


def test_keras_logs_replay_and_revert(tmp_path, capsys):
    src = keras_like(tmp_path / "m.keras")
    before = sha256_file(src)
    out = tmp_path / "o.keras"
    rc, _, err = cli(capsys, "inject", src, "-o", out, "--count", "5", "--seed", "4")
    assert rc == 0, err
    lg = InjectionLog.load(str(out) + ".fflog")
    assert lg.manifest["input"]["path"] == src and lg.manifest["output"]["path"] == str(out)
    assert lg.manifest["container"]["input_sha256"] == before
    rc, o, err = cli(capsys, "replay", str(out) + ".fflog", src, "-o", tmp_path / "again.keras")
    assert rc == 0, err
    assert sha256_file(tmp_path / "again.keras") == sha256_file(out)  # the archive itself, bit for bit
    rc, o, err = cli(capsys, "revert", str(out) + ".fflog", out)
    assert rc == 0, err
    with read_archive(out) as a, read_archive(src) as b:
        assert sha256_file(a) == sha256_file(b)  # the weights file is the original again
    assert sha256_file(src) == before


def test_keras_second_in_place_keeps_the_first_log_and_both_revert(tmp_path, capsys):
    src = keras_like(tmp_path / "m.keras")
    with read_archive(src) as w:
        original = sha256_file(w)
    for seed in (1, 2):
        assert cli(capsys, "inject", src, "--in-place", "--count", "3", "--seed", seed)[0] == 0
    logs = sorted(p for p in os.listdir(tmp_path) if p.endswith(".fflog"))
    assert logs == ["m.keras.2.fflog", "m.keras.fflog"]
    assert cli(capsys, "revert", tmp_path / "m.keras.2.fflog", src)[0] == 0
    assert cli(capsys, "revert", tmp_path / "m.keras.fflog", src)[0] == 0
    with read_archive(src) as w:
        assert sha256_file(w) == original


def test_failed_run_keeps_existing_output_and_log(ckpt, tmp_path, monkeypatch):
    out = str(tmp_path / "o.h5")
    inject_file(ckpt, out, seed=1, count=3)
    kept = sha256_file(out), sha256_file(out + ".fflog")
    real_replace = os.replace

    def failing(a, b):
        if b == out:
            raise OSError(5, "Input/output error")
        return real_replace(a, b)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OutputError, match="write failed"):
        inject_file(ckpt, out, seed=2, count=3)
    monkeypatch.setattr(os, "replace", real_replace)
    assert (sha256_file(out), sha256_file(out + ".fflog")) == kept
    assert not [p for p in os.listdir(tmp_path) if ".fastflip-" in p]
    # the same for a .keras archive: the archive write fails, the old log stays
    src = keras_like(tmp_path / "m.keras")
    kout = str(tmp_path / "o.keras")
    from fastflip.files.inject import inject_checkpoint_file

    inject_checkpoint_file(src, kout, seed=1, count=2)
    kept = sha256_file(kout), sha256_file(kout + ".fflog")
    monkeypatch.setattr(os, "replace", lambda a, b: failing(a, b) if b != kout else (_ for _ in ()).throw(
        OSError(28, "No space left on device")))
    with pytest.raises(OutputError, match="disk full"):
        inject_checkpoint_file(src, kout, seed=2, count=2)
    monkeypatch.setattr(os, "replace", real_replace)
    assert (sha256_file(kout), sha256_file(kout + ".fflog")) == kept


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_duplicate_archive_entry_is_refused(tmp_path, capsys):
    src = keras_like(tmp_path / "m.keras", extra=[("config.json", '{"other": 1}')])
    rc, _, err = cli(capsys, "inject", src, "-o", tmp_path / "o.keras", "--count", "1")
    assert rc == 2 and "more than once" in err and not (tmp_path / "o.keras").exists()


def test_hashless_log_reverts_only_with_no_verify(ckpt, tmp_path, capsys):
    original = sha256_file(ckpt)
    res = inject_file(ckpt, in_place=True, atomic=False, seed=1, count=4, hash_files=False, log_path=True)
    assert log_hash(res.log.manifest["input"]) is None  # what the API writes without hashes
    rc, o, err = cli(capsys, "revert", res.log_path, ckpt)
    assert rc == 2 and "--no-verify" in err and "matches" not in o
    impostor = str(tmp_path / "imp.h5")
    keras_legacy_like(impostor)  # the original, not the logged output: the logged words are not there
    rc, o, err = cli(capsys, "revert", res.log_path, impostor, "--no-verify")
    assert rc == 2 and "not the logged new words" in err and "matches" not in o
    rc, o, err = cli(capsys, "revert", res.log_path, ckpt, "--no-verify")
    assert rc == 0 and "NOT verified" in o and "matches" not in o
    assert sha256_file(ckpt) == original


@pytest.mark.parametrize("tamper", [
    lambda m, c: m["tensors"][0].__setitem__("shape", "x"),
    lambda m, c: m["tensors"][0].__setitem__("dtype", "<U3"),
    lambda m, c: m["tensors"][0].__setitem__("shape", [2**40, 2**40]),
    lambda m, c: m["input"].__setitem__("sha256", 5),
    lambda m, c: c.__setitem__("index", c["index"] + 10**6),
    lambda m, c: c.__setitem__("tensor", c["tensor"] + 99),
    lambda m, c: c.__setitem__("new_word", c["new_word"][:-1]),
    lambda m, c: c.__setitem__("index", np.zeros_like(c["index"])),
    lambda m, c: c.__setitem__("old_word", c["old_word"].astype("f8")),
], ids=["shape-type", "dtype", "huge-shape", "hash-type", "index-range", "tensor-range", "length", "duplicate",
        "word-type"])
def test_tampered_logs_are_refused_before_anything_is_written(ckpt, tmp_path, capsys, tamper):
    out = str(tmp_path / "o.h5")
    res = inject_file(ckpt, out, seed=1, count=6)
    with zipfile.ZipFile(res.log_path) as z:
        m = json.loads(z.read("manifest.json"))
        cols = {n[:-4]: np.load(z.open(n)) for n in z.namelist() if n.endswith(".npy")}
    tamper(m, cols)
    bad = str(tmp_path / "bad.fflog")
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("manifest.json", json.dumps(m))
        for n, a in cols.items():
            with z.open(n + ".npy", "w") as fh:
                np.save(fh, a)
    before = sha256_file(out)
    with pytest.raises((LogMismatchError, InputFileError)):
        InjectionLog.load(bad)
    for argv in (("revert", bad, out), ("replay", bad, ckpt, "-o", tmp_path / "r.h5")):
        rc, _, err = cli(capsys, *argv)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and ("damaged log" in err or "not a" in err), err
    assert sha256_file(out) == before and not (tmp_path / "r.h5").exists()


# ------------------------------------------------------------------------------------- 4. temporaries


def test_stale_temporaries_of_dead_runs_are_swept(ckpt, tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    stale = tmp_path / f".o.h5.fastflip-{pid}-abc123.tmp"
    stale.write_bytes(b"x" * 100)
    live = tmp_path / f".o.h5.fastflip-{os.getppid()}-abc123.tmp"  # a live process's temporary stays
    live.write_bytes(b"y")
    unrelated = tmp_path / ".something.tmp"
    unrelated.write_bytes(b"z")
    inject_file(ckpt, str(tmp_path / "o.h5"), seed=1, count=1)
    assert not stale.exists() and live.exists() and unrelated.exists()
    d = tmp_path / f"fastflip-keras-{pid}-zz9"
    d.mkdir()
    (d / "model.weights.h5").write_bytes(b"w")
    assert sweep_stale(str(tmp_path)) == [str(d)]


def test_sigterm_removes_temporaries(tmp_path):
    src = str(tmp_path / "big.h5")
    with h5py.File(src, "w") as f:
        f.create_dataset("w", data=np.zeros(2_000_000, "f4"))
    script = textwrap.dedent(f"""
        import sys, time
        import fastflip.files.inject as inj
        real = inj.copy_apply
        def slow(*a, **k):
            r = real(*a, **k)
            print("copied", flush=True)
            time.sleep(60)
            return r
        inj.copy_apply = slow
        from fastflip.cli import main
        sys.exit(main(["inject", {src!r}, "-o", {str(tmp_path / 'o.h5')!r}, "--count", "3"]))
        """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=SRC))
    assert p.stdout.readline().strip() == "copied"
    assert [n for n in os.listdir(tmp_path) if ".fastflip-" in n]  # the temporary exists now
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=30)
    assert rc == -signal.SIGTERM and "terminated" in p.stderr.read()  # cleaned up, then died of the signal
    assert sorted(os.listdir(tmp_path)) == ["big.h5"]


# ------------------------------------------------------------------------------------- 4. bounded archives


def test_archive_member_limits(tmp_path, capsys):
    src = keras_like(tmp_path / "m.keras", extra=[("assets/blob.bin", b"\0" * (8 << 20))])
    with pytest.raises(InputFileError, match="inflates past the limit"):
        with edit_archive(src, tmp_path / "o.keras", limits=ArchiveLimits(max_bytes=4 << 20)):
            pass
    with pytest.raises(InputFileError, match="inflates past the limit"):
        with edit_archive(src, tmp_path / "o.keras", limits=ArchiveLimits(max_ratio=100)):
            pass
    assert not (tmp_path / "o.keras").exists()
    rc, _, err = cli_proc("inject", src, "-o", tmp_path / "o.keras", "--count", "1",
                          env={"FASTFLIP_ARCHIVE_MAX_BYTES": str(1 << 20)}).returncode, None, None
    assert rc == 2
    with edit_archive(src, tmp_path / "o.keras"):  # the defaults accept it, streamed
        pass
    with zipfile.ZipFile(tmp_path / "o.keras") as z:
        assert z.read("assets/blob.bin") == b"\0" * (8 << 20)


# ------------------------------------------------------------------------------------- 4. layout walk


def test_deep_nesting_is_found_and_link_chains_are_fast(tmp_path):
    from fastflip.files.layout import read_layout

    deep = str(tmp_path / "deep.h5")
    with h5py.File(deep, "w") as f:
        g = f
        for _ in range(1500):
            g = g.create_group("g")
        g["w"] = np.ones(3, "f4")
    lay = read_layout(deep)
    assert [t.path.count("/") for t in lay.tensors] == [1501] and not lay.skipped
    chain = str(tmp_path / "chain.h5")
    with h5py.File(chain, "w") as f:
        g = f.create_group("g0")
        for i in range(30):  # g_i links a and b both to g_{i+1}: 2**30 paths to the bottom
            nxt = f.create_group(f"tmp{i}")
            g["a"] = nxt
            g["b"] = nxt
            del f[f"tmp{i}"]
            g = nxt
        g["w"] = np.ones(3, "f4")
    lay = read_layout(chain)
    (t,) = lay.tensors
    assert t.path == "/g0" + "/a" * 30 + "/w" and len(t.aliases) == 16
    assert any("more than 16 paths" in s.reason for s in lay.skipped)


@pytest.mark.framework
def test_real_keras_archive_log_replays_and_reverts(tmp_path, capsys):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    keras = require("keras")
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.BatchNormalization()])
    m.compile(optimizer="adam", loss="mse")
    m.fit(np.ones((4, 4), "f4"), np.ones((4, 3), "f4"), epochs=1, verbose=0)
    src = str(tmp_path / "m.keras")
    m.save(src)
    out = tmp_path / "o.keras"
    assert cli(capsys, "inject", src, "-o", out, "--count", "6", "--seed", "2")[0] == 0
    assert cli(capsys, "replay", str(out) + ".fflog", src, "-o", tmp_path / "r.keras")[0] == 0
    assert sha256_file(tmp_path / "r.keras") == sha256_file(out)
    assert cli(capsys, "revert", str(out) + ".fflog", out)[0] == 0
    back = keras.models.load_model(out)
    for a, b in zip(back.weights, m.weights):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_declared_shapes_near_2_64_are_refused_clearly(tmp_path, capsys):
    src = str(tmp_path / "huge.h5")
    with h5py.File(src, "w") as f:  # chunked, never written: the declared shape costs no disk
        f.create_dataset("ok", shape=(2**56,), dtype="f8", chunks=(1024,))
        f.create_dataset("big", shape=(2**62,), dtype="f8", chunks=(1024,))
        f.create_dataset("max", shape=(2**63 - 1,), dtype="i1", chunks=(4096,))
        for i in range(10):  # 10 x 2**59 bytes: each addressable, all together 2**65.3 bits
            f.create_dataset(f"many/{i}", shape=(2**56,), dtype="f8", chunks=(1024,))
    rc, out, err = cli(capsys, "inject", src, "-o", tmp_path / "o.h5", "--include", "ok", "--count", "5", "--seed", "1")
    assert rc == 0 and "5 bit(s) in 5 element(s)" in out, err
    got = InjectionLog.load(str(tmp_path / "o.h5.fflog"))
    assert (got.plan.index >= 0).all() and (got.plan.index < 2**56).all()
    for name in ("big", "max"):
        rc, out, err = cli(capsys, "inject", src, "-o", tmp_path / "p.h5", "--include", name, "--count", "5")
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "more than can be addressed" in err, err
    rc, out, err = cli(capsys, "inject", src, "-o", tmp_path / "p.h5", "--include", "many/*", "--count", "5")
    assert rc == 2 and "more than can be addressed (2**63)" in err, err
    rc, out, err = cli(capsys, "inspect", src)
    assert rc == 0 and "big" in out
