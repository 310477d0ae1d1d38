"""Evidence before change for checkpoint directories: the log is durable before
the output directory or the first shard changes, in one section with SIGINT/SIGTERM deferred; hashes of shards
about to change come from their bytes; an in-place writer locks the whole checkpoint. Tiny synthetic safetensors
shards (numpy + safetensors), in process; tests/test_crash_kill.py kills real runs."""

from __future__ import annotations

import hashlib
import json
import os
import signal

import pytest

from format_builders import INDEX, write_checkpoint_dir
from fastflip import Sampling
from fastflip.errors import FileLockedError, OptionError
from fastflip.files import hashcache
from fastflip.files.locks import WriterLock
from fastflip.files.sharded import inject_dir, replay_dir, revert_dir


def shards(d: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(d)):
        if name.endswith(".safetensors"):
            with open(os.path.join(d, name), "rb") as fh:
                out[name] = fh.read()
    return out


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


EVERY_SHARD = Sampling(count=60, bits="0-31")  # seed 3 touches every one of the three shards


@pytest.fixture
def src(tmp_path):
    return write_checkpoint_dir(str(tmp_path / "model"))


@pytest.fixture
def deferred_term():
    """A SIGTERM handler recording what ``probe()`` says when the signal is delivered."""
    seen: list = []
    probe = {"f": lambda: None}
    old = signal.signal(signal.SIGTERM, lambda s, f: seen.append(probe["f"]()))
    yield seen, probe
    signal.signal(signal.SIGTERM, old)


def _hook(monkeypatch, before):
    """Call ``before(dst)`` ahead of every os.replace / os.rename (the commit's renames)."""
    real_replace, real_rename = os.replace, os.rename

    def replace(a, b, **kw):
        before(os.fspath(b))
        return real_replace(a, b, **kw)

    def rename(a, b, **kw):
        before(os.fspath(b))
        return real_rename(a, b, **kw)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", rename)


def _watch_commit(monkeypatch, d: str, log_path: str, original: dict, signal_at: int | None = None) -> list:
    """Record, at each rename onto the log or a shard of ``d``: ("log", no shard changed yet) or ("shard", the
    log is in place); raise SIGTERM just before the ``signal_at``-th of them."""
    events: list = []

    def before(dst):
        if dst == log_path:
            events.append(("log", shards(d) == original))
        elif dst.endswith(".safetensors"):
            events.append(("shard", os.path.exists(log_path)))
        watched = dst == log_path or dst.endswith(".safetensors")
        if watched and len(events) == signal_at:
            signal.raise_signal(signal.SIGTERM)

    _hook(monkeypatch, before)
    return events


def test_copy_the_log_is_in_place_before_the_output_directory(src, tmp_path, monkeypatch, deferred_term):
    out = str(tmp_path / "out")
    seen, probe = deferred_term
    probe["f"] = lambda: (os.path.isdir(out), os.path.exists(out + ".fflog"))
    at_rename: list = []

    def before(dst):
        if dst in (out, out + ".fflog"):
            at_rename.append((dst, os.path.exists(out + ".fflog")))
            if len(at_rename) == 1:
                signal.raise_signal(signal.SIGTERM)  # held back until both are in place

    _hook(monkeypatch, before)
    res = inject_dir(src, out, seed=3, sampling=EVERY_SHARD)
    assert at_rename == [(out + ".fflog", False), (out, True)]  # the log first, then the directory
    assert seen == [(True, True)]
    monkeypatch.undo()
    assert sorted(os.listdir(out)) == sorted(os.listdir(src))
    assert oct(os.stat(out).st_mode & 0o777) == oct(0o777 & ~_umask())  # a new folder, as mkdir would make it
    revert_dir(res.log_path, out, str(tmp_path / "back"))
    assert shards(str(tmp_path / "back")) == shards(src)


def _umask() -> int:
    m = os.umask(0o022)
    os.umask(m)
    return m


def test_in_place_log_first_then_every_shard_with_signals_deferred(src, monkeypatch, deferred_term):
    original = shards(src)
    log_path = src + ".fflog"
    seen, probe = deferred_term
    probe["f"] = lambda: sum(shards(src)[k] != v for k, v in original.items())
    events = _watch_commit(monkeypatch, src, log_path, original, signal_at=2)
    res = inject_dir(src, in_place=True, seed=3, sampling=EVERY_SHARD)
    touched = len(res.log.manifest["checkpoint_dir"]["shards"])
    assert touched == 3
    assert events == [("log", True)] + [("shard", True)] * touched
    assert seen == [touched]  # delivered after the last shard, not between two
    monkeypatch.undo()
    revert_dir(res.log_path, src)
    assert shards(src) == original


def _inject_with_a_failing_shard_rename(monkeypatch, src: str, nth: int) -> None:
    """An in-place inject whose ``nth`` rename of a temporary onto a shard fails (EIO)."""
    real, calls = os.replace, []

    def replace(a, b, **kw):
        if os.fspath(b).endswith(".safetensors") and os.fspath(a).endswith(".tmp"):
            calls.append(b)
            if len(calls) == nth:
                raise OSError(5, "Input/output error")
        return real(a, b, **kw)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError):
        inject_dir(src, in_place=True, seed=3, sampling=EVERY_SHARD)
    monkeypatch.undo()


def test_a_failed_rename_after_the_first_shard_keeps_the_log_that_reverts_it(src, monkeypatch):
    original = shards(src)
    _inject_with_a_failing_shard_rename(monkeypatch, src, 2)
    now = shards(src)
    assert sum(now[k] != v for k, v in original.items()) == 1  # one shard changed, then the commit failed
    assert not [n for n in os.listdir(src) if n.endswith(".tmp")]  # the other temporaries are gone
    revert_dir(src + ".fflog", src)  # ... and the log that describes it is still there
    assert shards(src) == original


def test_staging_keeps_the_evidence_once_a_file_it_describes_has_changed(tmp_path, monkeypatch):
    """fileio.Staging with several files: a rename that fails after the first file keeps the log (the way back)."""
    from fastflip.files.fileio import staged

    a, b, log = (str(tmp_path / n) for n in ("a", "b", "a.fflog"))
    for p in (a, b):
        with open(p, "w") as fh:
            fh.write("old")
    real = os.replace

    def replace(x, y, **kw):
        if os.fspath(y) == b:
            raise OSError(5, "Input/output error")
        return real(x, y, **kw)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError):
        with staged() as st:
            for p in (a, b):
                with open(st.add(p), "w") as fh:
                    fh.write("new")
            with open(st.add(log, evidence=True), "w") as fh:
                fh.write("log")
    monkeypatch.undo()
    assert open(a).read() == "new" and open(log).read() == "log" and open(b).read() == "old"
    assert sorted(os.listdir(tmp_path)) == ["a", "a.fflog", "b"]


def test_a_failed_first_rename_takes_the_log_back(src, monkeypatch):
    original = shards(src)
    _inject_with_a_failing_shard_rename(monkeypatch, src, 1)
    assert shards(src) == original and not os.path.exists(src + ".fflog")


def test_non_atomic_in_place_with_a_log_file_is_refused(src):
    original = shards(src)
    with pytest.raises(OptionError, match="atomic=True"):
        inject_dir(src, in_place=True, atomic=False, seed=3, sampling=EVERY_SHARD, log_path=src + ".fflog")
    assert shards(src) == original and not os.path.exists(src + ".fflog")
    res = inject_dir(src, in_place=True, atomic=False, seed=3, sampling=EVERY_SHARD, log_path=False)
    assert res.counts["bits_changed"] == 60 and shards(src) != original


def test_replay_in_place_commits_its_log_first(src, tmp_path, monkeypatch):
    res = inject_dir(src, str(tmp_path / "out"), seed=3, sampling=EVERY_SHARD)
    original = shards(src)
    lp = str(tmp_path / "replayed.fflog")
    events = _watch_commit(monkeypatch, src, lp, original)
    replay_dir(res.log_path, src, in_place=True, log_path=lp)
    assert events[0] == ("log", True) and events[1:] == [("shard", True)] * 3
    monkeypatch.undo()
    assert shards(src) == shards(str(tmp_path / "out"))


def _poison(path: str, digest: str) -> None:
    """Make the hash cache claim ``digest`` for ``path`` as it is now (as a write through a shared map could)."""
    assert hashcache.remember(path, os.stat(path), digest, hashed_at=os.stat(path).st_ctime + 60)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTFLIP_HASH_CACHE", str(tmp_path / "hash-cache"))


def test_in_place_inject_hashes_the_shards_bytes_not_the_cache(src, cache):
    original = shards(src)
    for name in original:
        _poison(os.path.join(src, name), "0" * 64)
    res = inject_dir(src, in_place=True, seed=3, sampling=EVERY_SHARD)
    logged = res.log.manifest["checkpoint_dir"]["shards"]
    assert {k: v["input_sha256"] for k, v in logged.items()} == {k: _sha(v) for k, v in original.items()}
    revert_dir(res.log_path, src)
    assert shards(src) == original


def test_revert_hashes_the_shards_bytes_not_the_cache(src, cache):
    original = shards(src)
    res = inject_dir(src, in_place=True, seed=3, sampling=EVERY_SHARD)
    rec = res.log.manifest["checkpoint_dir"]["shards"]
    for name in rec:  # the cache claims every changed shard is already the original
        _poison(os.path.join(src, name), rec[name]["input_sha256"])
    out = revert_dir(res.log_path, src)
    assert out.sites == 60 and shards(src) == original


@pytest.mark.parametrize("in_place", [True, False])
def test_revert_stages_each_shard_once(src, tmp_path, monkeypatch, in_place):
    """Each restored shard is written to one temporary (beside it in place, in the staged folder otherwise), which
    the directory's commit fsyncs and renames: no second temporary per shard."""
    import tempfile

    original = shards(src)
    res = inject_dir(src, in_place=True, seed=3, sampling=EVERY_SHARD)
    made: list = []
    real = tempfile.mkstemp
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **kw: made.append(kw.get("prefix")) or real(*a, **kw))
    back = src if in_place else str(tmp_path / "back")
    out = revert_dir(res.log_path, src, None if in_place else back)
    assert out.sites == 60 and shards(back) == original
    touched = sorted(res.log.manifest["checkpoint_dir"]["shards"])
    assert len(touched) == 3
    assert len(made) == (len(touched) if in_place else 0)  # the output folder is one mkdtemp


@pytest.mark.parametrize("in_place", [True, False])
def test_revert_of_a_partly_committed_directory(src, tmp_path, in_place):
    """A shard already at its logged input (a kill between the commit's renames) is carried as it is, in place or
    into an output directory, and the others are restored."""
    original = shards(src)
    res = inject_dir(src, in_place=True, seed=3, sampling=EVERY_SHARD)
    first = sorted(res.log.manifest["checkpoint_dir"]["shards"])[0]
    with open(os.path.join(src, first), "wb") as fh:  # as if its rename never happened
        fh.write(original[first])
    back = src if in_place else str(tmp_path / "back")
    out = revert_dir(res.log_path, src, None if in_place else back)
    assert out.sites == 60 - res.log.manifest["checkpoint_dir"]["shards"][first]["sites"]
    assert shards(back) == original


@pytest.mark.parametrize("held", ["model-00002-of-00003.safetensors", INDEX])
def test_in_place_writers_lock_the_whole_checkpoint(src, tmp_path, held):
    res = inject_dir(src, str(tmp_path / "out"), seed=3, sampling=EVERY_SHARD)
    original = shards(src)
    with WriterLock(os.path.join(src, held), "another writer"):
        with pytest.raises(FileLockedError, match="another writer"):
            inject_dir(src, in_place=True, seed=3, sampling=EVERY_SHARD)
        with pytest.raises(FileLockedError):
            replay_dir(res.log_path, src, in_place=True)
        with pytest.raises(FileLockedError):
            inject_dir(src, in_place=True, atomic=False, seed=3, sampling=EVERY_SHARD, log_path=False)
    assert shards(src) == original and not [n for n in os.listdir(src) if ".fastflip-" in n]
    res = inject_dir(src, in_place=True, seed=3, sampling=EVERY_SHARD)
    with WriterLock(os.path.join(src, held), "another writer"):
        with pytest.raises(FileLockedError):
            revert_dir(res.log_path, src)
    revert_dir(res.log_path, src)
    assert shards(src) == original


def test_an_output_directory_never_carries_fastflip_scratch_files(src, tmp_path):
    """A copy made while another fastflip writer works in the input (lock records, temporaries) leaves them out."""
    scratch = [".fastflip-2049-1234.lock", ".config.json.fastflip-99999-ab.tmp", ".x.fastflip-99999-cd.tmp.bak"]
    for name in scratch:
        with open(os.path.join(src, name), "w") as fh:
            fh.write("{}")
    out = str(tmp_path / "out")
    inject_dir(src, out, seed=3, sampling=EVERY_SHARD)
    assert not set(scratch) & set(os.listdir(out))
    assert sorted(os.listdir(out)) == sorted(n for n in os.listdir(src) if n not in scratch)


def test_force_replaces_an_output_directory_after_its_new_log(src, tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    inject_dir(src, out, seed=1, sampling=EVERY_SHARD)
    first = shards(out)
    at_log: list = []
    _hook(monkeypatch, lambda dst: at_log.append(shards(out) == first) if dst == out + ".fflog" else None)
    res = inject_dir(src, out, seed=2, sampling=EVERY_SHARD, overwrite=True)
    monkeypatch.undo()
    assert at_log == [True]  # the new log goes in while the old output is still there
    assert shards(out) != first and sorted(os.listdir(tmp_path)) == ["model", "out", "out.fflog"]  # nothing left aside
    revert_dir(res.log_path, out, str(tmp_path / "back"))
    assert shards(str(tmp_path / "back")) == shards(src)


@pytest.mark.parametrize("in_place", [False, True])
def test_region_evidence_of_a_directory_is_refused_before_anything_is_written(src, tmp_path, in_place):
    """A checkpoint directory's log holds each shard's hash: ``hash_files="regions"`` is refused, not ignored."""
    original = shards(src)
    out = None if in_place else str(tmp_path / "out")
    with pytest.raises(OptionError, match="region evidence is for single files"):
        inject_dir(src, out, in_place=in_place, hash_files="regions", count=2, seed=1)
    assert shards(src) == original and (out is None or not os.path.exists(out))


def test_a_plan_naming_tensors_without_the_leading_slash_is_refused_in_one_line(src):
    """inject_dir's check for tensors that need re-encoded bytes looks plan names up as ``Layout.tensor`` does
    (leading '/' optional): a plan naming tensors without it reaches the shard's own one-line refusal of names it
    does not hold, instead of ending in a KeyError; nothing is written."""
    import dataclasses

    from fastflip.errors import FastflipError
    from fastflip.files.sharded import restore_dir

    before = shards(src)
    res = inject_dir(src, in_place=True, atomic=False, seed=3, sampling=EVERY_SHARD, log_path=False)
    restore_dir(src, res.log)
    assert shards(src) == before
    plan = res.log.plan
    bare = dataclasses.replace(plan, tensors=tuple(dataclasses.replace(t, name=t.name.lstrip("/"))
                                                   for t in plan.tensors))
    assert any(t.name != b.name for t, b in zip(plan.tensors, bare.tensors))
    with pytest.raises(FastflipError) as exc:
        inject_dir(src, in_place=True, atomic=False, plan=bare, log_path=False)
    assert not isinstance(exc.value, KeyError) and "\n" not in str(exc.value)
    assert shards(src) == before
