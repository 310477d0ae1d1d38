"""The log's integrity hash: a registry of algorithms, the fastest available by default, verified by name.

blake3 runs here when the ``fasthash`` extra is installed; the registry is also exercised with sha256 and a
test-only algorithm (hashlib's md5 under another name) so that nothing depends on blake3 alone.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import require
from fastflip import Sampling
from fastflip.errors import LogMismatchError, MissingExtraError, OptionError
from fastflip.files import hashcache, hashing
from fastflip.files.filebytes import hash_file
from fastflip.files.inject import inject_file
from fastflip.files.replay import replay
from fastflip.files.revert import revert
from fastflip.files.log import InjectionLog

SMP = Sampling(count=5, bits="sign")


@pytest.fixture
def h5(tmp_path):
    p = str(tmp_path / "w.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("w", data=np.arange(4096, dtype="f4"))
        f.create_dataset("g", data=np.ones((64, 64), "f4"), chunks=(16, 16), compression="gzip")
    return p


@pytest.fixture
def test_algo():
    """A test-only algorithm (md5 under another name): the registry, not a package, decides what runs."""
    hashing.register(hashing.Algorithm("test-md5", 32, None, None, hashlib.md5))
    yield "test-md5"
    hashing.unregister("test-md5")


def _md5(path):
    return hashlib.md5(open(path, "rb").read()).hexdigest()


def test_registered_algorithm_is_logged_and_verified(h5, tmp_path, test_algo):
    out = str(tmp_path / "o.h5")
    res = inject_file(h5, out, seed=1, sampling=SMP, hash_algorithm=test_algo)
    m = InjectionLog.load(res.log_path).manifest
    assert m["input"]["hash_algorithm"] == test_algo and m["input"]["hash"] == _md5(h5)
    assert m["output"]["hash"] == _md5(out) and m["input"]["sha256"] is None
    r = revert(res.log_path, out, str(tmp_path / "back.h5"))
    assert r.verified and r.algorithm == test_algo and r.digest == _md5(h5) and r.sha256 is None
    assert open(str(tmp_path / "back.h5"), "rb").read() == open(h5, "rb").read()
    rp = replay(res.log_path, h5, str(tmp_path / "again.h5"))
    assert rp.log.manifest["output"]["hash"] == _md5(out)


def test_verification_uses_the_logged_algorithm(h5, tmp_path, test_algo, monkeypatch):
    """A sha256 log is still verified by sha256 whatever the default is now, and a wrong file is refused."""
    out = str(tmp_path / "o.h5")
    res = inject_file(h5, out, seed=2, sampling=SMP, hash_algorithm="sha256")
    monkeypatch.setenv(hashing.ENV, test_algo)
    assert hashing.default_algorithm() == test_algo
    r = revert(res.log_path, out, str(tmp_path / "back.h5"))
    assert r.algorithm == "sha256" and r.sha256 == hashlib.sha256(open(h5, "rb").read()).hexdigest()
    with h5py.File(out, "r+") as f:  # another file at the logged sites' words: the hash refuses it
        f["w"][100] = 7.0
    with pytest.raises(LogMismatchError, match="sha256 differs"):
        revert(res.log_path, out, str(tmp_path / "back2.h5"))


def test_log_naming_a_missing_algorithm_is_one_line(h5, tmp_path):
    hashing.register(hashing.Algorithm("test-gone", 32, None, None, hashlib.md5))
    try:
        out = str(tmp_path / "o.h5")
        res = inject_file(h5, out, seed=3, sampling=SMP, hash_algorithm="test-gone")
        before = open(out, "rb").read()
        hashing.register(hashing.Algorithm("test-gone", 32, "no_such_module_fastflip", "fasthash", hashlib.md5))
        with pytest.raises(MissingExtraError, match="test-gone needs the no_such_module_fastflip package"):
            revert(res.log_path, out)
        assert open(out, "rb").read() == before  # nothing was changed
    finally:
        hashing.unregister("test-gone")
    with pytest.raises(OptionError, match="unknown hash algorithm"):
        inject_file(h5, str(tmp_path / "p.h5"), seed=1, sampling=SMP, hash_algorithm="md4")


def test_revert_and_replay_read_the_logged_hashes_through_one_routine(h5, tmp_path, test_algo, monkeypatch):
    """An output entry hashed with another algorithm than the input's is refused by revert and by replay alike,
    through :func:`hashing.logged_hashes`, with nothing written."""
    out = str(tmp_path / "o.h5")
    res = inject_file(h5, out, seed=4, sampling=SMP, hash_algorithm="sha256")
    before = open(out, "rb").read()
    m = dict(res.log.manifest, output=hashing.file_entry(out, _md5(out), test_algo))
    mixed = InjectionLog(m, res.log.plan, res.log.old_words, res.log.new_words, res.log.undo)
    calls = []
    real = hashing.logged_hashes
    monkeypatch.setattr(hashing, "logged_hashes", lambda man: calls.append(1) or real(man))
    with pytest.raises(LogMismatchError, match="input is hashed with 'sha256' but its output with 'test-md5'"):
        revert(mixed, out)
    with pytest.raises(LogMismatchError, match="input is hashed with 'sha256' but its output with 'test-md5'"):
        replay(mixed, h5, str(tmp_path / "again.h5"))
    assert calls == [1, 1]
    assert open(out, "rb").read() == before and not os.path.exists(tmp_path / "again.h5")


def test_damaged_hash_fields_are_refused(h5, tmp_path):
    from fastflip.files.logcheck import validate_log

    res = inject_file(h5, str(tmp_path / "o.h5"), seed=1, sampling=SMP, hash_algorithm="sha256")
    cols = res.log.columns()
    for bad in ({"hash_algorithm": "sha256", "hash": "ab"}, {"hash_algorithm": 5, "hash": None},
                {"hash_algorithm": "sha256", "hash": "Z" * 64}):
        m = dict(res.log.manifest, input=dict(res.log.manifest["input"], **bad))
        with pytest.raises(LogMismatchError, match="damaged log: input.hash"):
            validate_log("x.fflog", m, cols)


def test_default_is_the_fastest_available(monkeypatch, test_algo):
    monkeypatch.delenv(hashing.ENV, raising=False)
    assert hashing.default_algorithm() == hashing.available()[0]
    assert "sha256" in hashing.available() and "test-md5" in hashing.available()
    hashing.register(hashing.Algorithm("test-md5", 32, None, None, hashlib.md5), first=True)
    assert hashing.default_algorithm() == "test-md5"
    monkeypatch.setenv(hashing.ENV, "sha256")
    assert hashing.default_algorithm() == "sha256"


def test_hash_cache_keeps_one_entry_per_algorithm(tmp_path, monkeypatch, test_algo):
    monkeypatch.setenv(hashcache.ENV, str(tmp_path / "cache"))
    p = str(tmp_path / "f.bin")
    with open(p, "wb") as fh:
        fh.write(b"x" * 1000)
    st = os.stat(p)
    later = st.st_ctime_ns / 1e9 + 60
    assert hashcache.remember(p, st, _md5(p), later, test_algo)
    assert hashcache.lookup(p, st) is None  # no sha256 entry: the md5 one is not taken for it
    assert hashcache.lookup(p, st, test_algo) == _md5(p)
    assert hashcache.remember(p, st, hashlib.sha256(b"x" * 1000).hexdigest(), later)
    assert hashcache.lookup(p, st, test_algo) == _md5(p) and hashcache.lookup(p, st)[:8] == \
        hashlib.sha256(b"x" * 1000).hexdigest()[:8]


def test_blake3_is_the_default_when_installed(h5, tmp_path, monkeypatch):
    blake3 = require("blake3")
    monkeypatch.delenv(hashing.ENV, raising=False)
    assert hashing.default_algorithm() == "blake3"
    out = str(tmp_path / "o.h5")
    res = inject_file(h5, out, seed=4, sampling=SMP)
    m = res.log.manifest
    want = blake3.blake3(open(h5, "rb").read()).hexdigest()
    assert m["input"]["hash_algorithm"] == "blake3" and m["input"]["hash"] == want
    assert hash_file(out, "blake3", cache=False) == m["output"]["hash"]
    r = revert(res.log_path, out)
    assert r.algorithm == "blake3" and r.digest == want and open(out, "rb").read() == open(h5, "rb").read()


def test_blake3_hashes_in_a_forked_child_after_the_parent_did():
    """A child made by os.fork() after the parent hashed with BLAKE3's threads hashes too (the parent's thread
    pool is not copied by fork: a threaded update in the child would wait forever)."""
    require("blake3")
    code = ("import os; from fastflip.files import hashing\n"
            "data = b'x' * (8 << 20)\n"
            "def digest():\n    h = hashing.new('blake3'); h.update(data); return h.hexdigest()\n"
            "want = digest(); pid = os.fork()\n"
            "if pid == 0:\n    os._exit(0 if digest() == want else 1)\n"
            "print(os.waitpid(pid, 0)[1])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stderr


def test_cli_hash_option_and_revert_message(h5, tmp_path):
    out = str(tmp_path / "o.h5")
    env = dict(os.environ)
    run = lambda *a: subprocess.run([sys.executable, "-m", "fastflip", *a], capture_output=True, text=True, env=env)
    r = run("inject", h5, "-o", out, "--count", "3", "--seed", "1", "--hash", "sha256")
    assert r.returncode == 0, r.stderr
    r = run("log", out + ".fflog")
    assert f"sha256 {hashlib.sha256(open(h5, 'rb').read()).hexdigest()}" in r.stdout
    r = run("revert", out + ".fflog", out)
    assert r.returncode == 0 and "sha256" in r.stdout and "matches the logged input" in r.stdout
    r = run("inject", h5, "-o", str(tmp_path / "p.h5"), "--count", "3", "--hash", "md4")
    assert r.returncode == 2 and "unknown hash algorithm 'md4'" in r.stderr


def test_hash_thread_hashes_in_order_and_hands_back_an_error():
    """HashThread: the pieces handed, in order, give hashlib's digest; an update's error is raised at the next
    wait and at close, which may be called again."""
    t = hashing.HashThread(hashing.new("sha256"))
    t.start()
    parts = [os.urandom(n) for n in (1, 70000, 3, 5000)]
    for p in parts:
        t.hand([memoryview(p)])
    t.close()
    assert t.h.hexdigest() == hashlib.sha256(b"".join(parts)).hexdigest()

    class Failing:
        def update(self, data):
            raise OSError(5, "Input/output error")

    t = hashing.HashThread(Failing())
    t.start()
    with pytest.raises(OSError):
        t.wait(t.hand([b"x"]))
    with pytest.raises(OSError):
        t.close()
    t.close(check=False)  # again: nothing left to stop
    assert not t.is_alive()
