"""The stat-keyed hash cache (fastflip.files.hashcache): an input injected again is not hashed again, and the
cache can only make fastflip refuse, never accept a file it should not."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest

from fastflip import Sampling
from fastflip.errors import LogMismatchError
from conftest import log_hash
from fastflip.files import copyapply, hashcache, hashing
from fastflip.files.filebytes import hash_file
from fastflip.files.inject import inject_file
from fastflip.files.revert import revert

OLD = 10**18  # an mtime (ns) long before now: the file is not "racy"


def _digest(path: str) -> str:
    """The file's digest with the logs' algorithm (the default), read here: never taken from the cache."""
    h = hashing.new()
    with open(path, "rb") as fh:
        h.update(fh.read())
    return h.hexdigest()


def _algorithm() -> str:
    return hashing.default_algorithm()


def _lie() -> str:
    """A well-formed digest of the logs' algorithm that no test file has."""
    return "0" * hashing.algorithm(_algorithm()).hex_len


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv(hashcache.ENV, str(d))
    return d


@pytest.fixture
def not_racy(monkeypatch):
    """Files written by the test a moment ago count as settled (a checkpoint is saved before it is injected)."""
    monkeypatch.setattr(hashcache, "RACY_S", -1.0)


@pytest.fixture
def ckpt(tmp_path):
    p = str(tmp_path / "ckpt.h5")
    with h5py.File(p, "w") as f:
        f["dense/kernel"] = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
        f["dense/bias"] = np.zeros(32, np.float32)
    os.utime(p, ns=(OLD, OLD))
    return p


def _inject(src: str, dst: str, seed: int):
    return inject_file(src, dst, sampling=Sampling(count=20), seed=seed)


def test_second_injection_reuses_the_input_hash(ckpt, tmp_path, cache, monkeypatch, not_racy):
    truth = _digest(ckpt)
    r1 = _inject(ckpt, str(tmp_path / "a.h5"), 1)
    assert log_hash(r1.log.manifest["input"]) == truth
    assert len(list(cache.iterdir())) == 1  # remembered
    # the second copy must not hash the input: make the streaming hash of the input impossible to use
    calls = []
    real = copyapply._copy_buffered

    def spy(*a, **k):
        calls.append(k.get("hash_input"))
        return real(*a, **k)

    monkeypatch.setattr(copyapply, "_copy_buffered", spy)
    r2 = _inject(ckpt, str(tmp_path / "b.h5"), 2)
    assert calls == [False] and log_hash(r2.log.manifest["input"]) == truth
    assert log_hash(r2.log.manifest["output"]) == _digest(str(tmp_path / "b.h5"))  # outputs are always hashed
    back = revert(r2.log, str(tmp_path / "b.h5"), str(tmp_path / "back.h5"))
    assert _digest(str(tmp_path / "back.h5")) == truth


def test_a_changed_file_misses_even_with_its_mtime_put_back(ckpt, tmp_path, cache, not_racy):
    _inject(ckpt, str(tmp_path / "a.h5"), 1)
    with h5py.File(ckpt, "r+") as f:  # same size, same mtime afterwards: only ctime tells
        f["dense/bias"][0] = 1.0
    os.utime(ckpt, ns=(OLD, OLD))
    r = _inject(ckpt, str(tmp_path / "b.h5"), 2)
    assert log_hash(r.log.manifest["input"]) == _digest(ckpt)
    assert hash_file(ckpt) == _digest(ckpt)


def test_a_file_just_written_is_not_cached(tmp_path, cache):
    p = tmp_path / "fresh.bin"
    p.write_bytes(b"x" * 100)
    os.utime(p, ns=(OLD, OLD))  # an old mtime does not make it settled: its ctime is now
    assert hash_file(str(p)) == _digest(str(p))
    assert not cache.exists() or not list(cache.iterdir())  # racy: mtime within RACY_S of the hash


def test_a_wrong_entry_makes_revert_refuse(ckpt, tmp_path, cache, not_racy):
    """The cache's worst case: an entry that lies. The log then names a wrong input hash, and revert refuses
    (the reverted bytes do not hash to it); nothing is accepted that should not be."""
    st = os.stat(ckpt)
    assert hashcache.remember(ckpt, st, _lie(), algorithm=_algorithm())
    r = _inject(ckpt, str(tmp_path / "a.h5"), 1)
    assert log_hash(r.log.manifest["input"]) == _lie()
    with pytest.raises(LogMismatchError, match="did not give the logged input back"):
        revert(r.log, str(tmp_path / "a.h5"), str(tmp_path / "back.h5"))
    assert not (tmp_path / "back.h5").exists()


def test_a_damaged_entry_is_ignored(ckpt, tmp_path, cache, not_racy):
    _inject(ckpt, str(tmp_path / "a.h5"), 1)
    (entry,) = cache.iterdir()
    entry.write_text("{not json")
    assert hash_file(ckpt) == _digest(ckpt)
    entry.write_text(json.dumps({"key": {}, _algorithm(): "1" * 64}))
    assert hash_file(ckpt) == _digest(ckpt)


def test_input_changed_while_copied_writes_nothing(ckpt, tmp_path, cache, monkeypatch):
    monkeypatch.setattr(hashcache, "same_state", lambda a, b: False)  # as if a write landed during the copy
    with pytest.raises(LogMismatchError, match="changed while it was being read"):
        _inject(ckpt, str(tmp_path / "a.h5"), 1)
    assert sorted(os.listdir(tmp_path)) == ["cache", "ckpt.h5"] or sorted(os.listdir(tmp_path)) == ["ckpt.h5"]


def test_off_turns_it_off(ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv(hashcache.ENV, "off")
    assert hashcache.cache_dir() is None
    _inject(ckpt, str(tmp_path / "a.h5"), 1)
    assert not hashcache.remember(ckpt, os.stat(ckpt), _lie(), algorithm=_algorithm())
    assert sorted(os.listdir(tmp_path)) == ["a.h5", "a.h5.fflog", "ckpt.h5"]


# ---------------------------------------------------------------- hashes that cannot lie


def _stale_entry(path: str, claimed: str) -> os.stat_result:
    """Leave the cache claiming ``claimed`` for the file's *current* state, as a write through a shared map that
    did not move mtime/ctime would: the cache keys on (dev, inode, size, mtime, ctime); ctime cannot be put back
    from user space, so the entry is made under the key the file has now."""
    os.utime(path, ns=(OLD, OLD))
    st = os.stat(path)
    assert hashcache.remember(path, st, claimed, algorithm=_algorithm())
    assert hashcache.lookup(path, st, _algorithm()) == claimed  # the lie is in place
    return st


def _change_bias(path: str, index: int = 31) -> None:
    with h5py.File(path, "r+") as f:  # same size: only the bytes differ
        f["dense/bias"][index] = 123.0


def test_a_file_mapped_for_write_is_not_taken_from_the_cache(ckpt, tmp_path, cache, not_racy):
    import mmap

    before = _digest(ckpt)
    _change_bias(ckpt)
    st = _stale_entry(ckpt, before)
    with open(ckpt, "r+b") as fh, mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_SHARED,
                                            prot=mmap.PROT_READ | mmap.PROT_WRITE) as mm:
        r = _inject(ckpt, str(tmp_path / "a.h5"), 1)
        assert log_hash(r.log.manifest["input"]) == _digest(ckpt) != before
        assert hashcache.lookup(ckpt, st, _algorithm()) is None  # a writer that may not move the times: not trusted
        assert hashcache.mapped_for_write(ckpt, st) is True
        assert not hashcache.remember(ckpt, st, _digest(ckpt), algorithm=_algorithm())  # nor recorded: mapped
        del mm
    assert hashcache.mapped_for_write(ckpt, os.stat(ckpt)) is False


def test_in_place_inject_hashes_the_bytes_it_replaces(ckpt, tmp_path, cache, not_racy):
    _change_bias(ckpt)
    original = _digest(ckpt)
    _stale_entry(ckpt, _lie())
    r = inject_file(ckpt, in_place=True, sampling=Sampling(count=20), seed=3)
    assert log_hash(r.log.manifest["input"]) == original  # not the cached lie
    revert(r.log_path, ckpt)
    assert _digest(ckpt) == original


def test_revert_not_atomic_checks_the_file_before_rewriting_it(ckpt, tmp_path, cache, not_racy):
    out = str(tmp_path / "a.h5")
    r = _inject(ckpt, out, 1)
    hit = {int(i) for t, i in zip(r.log.plan.tensor, r.log.plan.index) if r.log.plan.tensors[t].name == "dense/bias"}
    _change_bias(out, next(i for i in range(32) if i not in hit))  # not one of the logged sites
    changed = _digest(out)
    _stale_entry(out, log_hash(r.log.manifest["output"]))  # the cache says: the logged output
    with pytest.raises(LogMismatchError, match="not the output this log describes"):
        revert(r.log_path, out, atomic=False)
    assert _digest(out) == changed  # nothing was rewritten


def _cache_refused(cache_env: str, ckpt: str, tmp_path) -> None:
    with pytest.warns(UserWarning, match="hash cache folder .* not used"):
        assert not hashcache.remember(ckpt, os.stat(ckpt), _digest(ckpt), algorithm=_algorithm())
        _inject(ckpt, str(tmp_path / "o.h5"), 1)


def test_a_cache_folder_through_a_symlink_is_not_used(ckpt, tmp_path, monkeypatch, not_racy):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv(hashcache.ENV, str(tmp_path / "link"))
    _cache_refused(str(tmp_path / "link"), ckpt, tmp_path)
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("how", ["other-writable", "other-owner"])
def test_a_cache_folder_others_can_write_is_not_used(ckpt, tmp_path, monkeypatch, not_racy, how):
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    if how == "other-writable":
        os.chmod(d, 0o777)
    elif os.getuid() == 0:
        os.chown(d, 12345, -1)
    else:
        pytest.skip("needs root to give the folder to another user")
    monkeypatch.setenv(hashcache.ENV, str(d))
    _cache_refused(str(d), ckpt, tmp_path)
    assert list(d.iterdir()) == []


def test_the_default_folder_is_made_private(ckpt, tmp_path, monkeypatch, not_racy):
    monkeypatch.delenv(hashcache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    d = tmp_path / "xdg" / "fastflip" / "sha256"
    d.mkdir(parents=True)
    os.chmod(d, 0o775)  # made by an earlier fastflip under umask 002
    assert hashcache.remember(ckpt, os.stat(ckpt), _digest(ckpt), algorithm=_algorithm())
    assert os.stat(d).st_mode & 0o777 == 0o700 and len(list(d.iterdir())) == 1


def test_a_copy_takes_the_lookup_started_before_its_layout(ckpt, tmp_path, cache, monkeypatch, not_racy):
    """A copy-mode inject starts the input's cache lookup (and its /proc scan) in a background thread before it
    reads the layout; the copy then takes that answer. In place nothing is looked up ahead."""
    import threading

    truth = _digest(ckpt)
    _inject(ckpt, str(tmp_path / "a.h5"), 1)  # remembered
    scans = []
    real = hashcache.mapped_for_write
    monkeypatch.setattr(hashcache, "mapped_for_write",
                        lambda p, st: scans.append(threading.current_thread().name) or real(p, st))
    r = _inject(ckpt, str(tmp_path / "b.h5"), 2)
    assert scans == ["fastflip-hashcache"] and log_hash(r.log.manifest["input"]) == truth
    scans.clear()
    inject_file(ckpt, in_place=True, sampling=Sampling(count=1), seed=3)
    assert "fastflip-hashcache" not in scans  # in place the input's bytes are hashed: nothing to look up


def test_a_prefetched_answer_is_only_taken_for_the_same_file_state(ckpt, cache, not_racy):
    """A lookup of the file in another state (changed since the prefetch) ignores the prefetched answer."""
    hashcache.remember(ckpt, os.stat(ckpt), _digest(ckpt), algorithm=_algorithm())
    hashcache.prefetch(ckpt, _algorithm())
    _change_bias(ckpt)
    assert hashcache.lookup(ckpt, os.stat(ckpt), _algorithm()) is None
    st = os.stat(ckpt)
    hashcache.remember(ckpt, st, _digest(ckpt), algorithm=_algorithm())
    hashcache.prefetch(ckpt, _algorithm())
    assert hashcache.lookup(ckpt, st, _algorithm()) == _digest(ckpt)
    assert hashcache.lookup(ckpt, st, _algorithm()) == _digest(ckpt)  # taken once; then looked up again
