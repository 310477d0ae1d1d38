"""The CLI's new-file and in-place paths at their floor: the copy done in the kernel where nothing changes, and
in-place revert/replay reading the file once.

The figures are in bench/test_cli_floor_bench.py; these tests check what the faster paths write and read. What they
write is judged by the frameworks' own loaders (h5py, safetensors) against changes worked out from the log alone
(:mod:`framework_judge`); byte equality with another path's output is checked besides, where it adds something.
"""

from __future__ import annotations

import errno
import hashlib
import os

import h5py
import numpy as np
import pytest

from conftest import snapshot
from framework_judge import assert_judged
from format_builders import write_checkpoint_dir
from framework_views import dir_view, h5_view, st_numpy_view
from fastflip import Sampling
from fastflip.files import copyapply, filebytes, fileio, h5apply, hashing
from fastflip.files.copyapply import copy_apply
from fastflip.files.h5apply import route_sites
from fastflip.files.inject import inject_file
from fastflip.files.layout import read_layout


def _h5(path, n=1 << 16):
    with h5py.File(path, "w") as f:
        f.create_dataset("a", data=np.linspace(-2, 2, n, dtype="f4"))
        f.create_dataset("b", data=np.linspace(-1, 1, n // 4, dtype="f8"))
    return str(path)


def _reference(src, dst, count=3):
    """A plan of ``count`` flips injected into ``dst + ".ref"`` (the reference output) and its routes in ``src``."""
    ref = inject_file(src, dst + ".ref", sampling=Sampling(count=count), seed=5, log_path=False)
    return ref, route_sites(src, ref.log.plan, {t.path: t for t in read_layout(src).tensors})


def _copy(src, dst, count=3, block=4096):
    """copy_apply of a plan of ``count`` flips; returns (output digest, old words, new words, plan's reference)."""
    ref, routes = _reference(src, dst, count)
    _, h_out, old, new = copy_apply(src, dst, ref.log.plan, routes, block=block)
    return h_out, old, new, ref


def _counting(monkeypatch, fail: int | None = None, after: int = 0) -> list[int]:
    """The byte counts asked of ``os.copy_file_range``, one per call; with ``fail``, every call after the first
    ``after`` raises that errno (0: every call)."""
    calls: list[int] = []
    real = os.copy_file_range

    def fake(fd_in, fd_out, count, offset_src=None, offset_dst=None):
        calls.append(count)
        if fail is not None and len(calls) > after:
            raise OSError(fail, os.strerror(fail))
        return real(fd_in, fd_out, count, offset_src, offset_dst)

    monkeypatch.setattr(os, "copy_file_range", fake)
    return calls


def _count_preads(monkeypatch) -> list[int]:
    """The byte counts asked of ``os.pread`` from now on."""
    preads: list[int] = []
    real_pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: preads.append(n) or real_pread(fd, n, at))
    return preads


@pytest.mark.skipif(not hasattr(os, "copy_file_range"), reason="no os.copy_file_range on this system")
def test_untouched_blocks_are_copied_in_the_kernel(tmp_path, monkeypatch):
    """Blocks no flip touches go file to file (copy_file_range); the output is the one the buffered copy writes."""
    src = _h5(tmp_path / "a.h5")
    calls = _counting(monkeypatch)
    h_out, old, new, ref = _copy(src, str(tmp_path / "b.h5"))
    blocks = -(-os.path.getsize(src) // 4096)
    assert 0 < len(calls) < blocks  # most blocks in the kernel, the touched ones written from the buffer
    assert_judged(h5_view(src), h5_view(str(tmp_path / "b.h5")), ref.log)
    assert open(tmp_path / "b.h5", "rb").read() == open(str(tmp_path / "b.h5.ref"), "rb").read()
    assert h_out == filebytes.hash_file(str(tmp_path / "b.h5"), "sha256", cache=False)
    assert np.array_equal(old, ref.log.old_words) and np.array_equal(new, ref.log.new_words)


@pytest.mark.parametrize("err", [errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL])
def test_kernel_copy_falls_back_to_a_buffer(tmp_path, monkeypatch, err):
    """Another file system or an old kernel (copy_file_range refused): the same bytes through a buffer; the
    untouched blocks are written from the buffer already read (the input read once), and the kernel is asked once
    (later blocks are not offered to it again)."""
    if not hasattr(os, "copy_file_range"):
        pytest.skip("no os.copy_file_range on this system")
    src, out = _h5(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    ref, routes = _reference(src, out)
    calls = _counting(monkeypatch, fail=err)
    preads = _count_preads(monkeypatch)
    seen = count_reads(monkeypatch, copyapply, src)
    _, h_out, old, new = copy_apply(src, out, ref.log.plan, routes, block=4096)
    assert seen["bytes"] + sum(preads) == os.path.getsize(src)  # the input read once
    assert len(calls) == 1  # refused once
    assert_judged(h5_view(src), h5_view(out), ref.log)
    assert open(out, "rb").read() == open(out + ".ref", "rb").read()
    assert h_out == filebytes.hash_file(out, "sha256", cache=False)
    assert np.array_equal(old, ref.log.old_words) and np.array_equal(new, ref.log.new_words)


def test_kernel_copy_refused_part_way(tmp_path, monkeypatch):
    """The kernel copies the first clean span, then refuses (EXDEV): the background copy reads the rest through a
    buffer (the input read once); the output and its hash are the same."""
    if not hasattr(os, "copy_file_range"):
        pytest.skip("no os.copy_file_range on this system")
    src, out = _h5(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    ref, routes = _reference(src, out, count=6)
    calls = _counting(monkeypatch, fail=errno.EXDEV, after=1)
    preads = _count_preads(monkeypatch)
    seen = count_reads(monkeypatch, copyapply, src)
    _, h_out, old, new = copy_apply(src, out, ref.log.plan, routes, block=4096)
    assert len(calls) == 2  # refused once, not asked again
    assert seen["bytes"] + sum(preads) == os.path.getsize(src)  # the input read once (the kernel copies besides)
    assert open(out, "rb").read() == open(out + ".ref", "rb").read()
    assert h_out == filebytes.hash_file(out, "sha256", cache=False)
    assert np.array_equal(old, ref.log.old_words) and np.array_equal(new, ref.log.new_words)


def test_kernel_copy_other_errors_are_not_swallowed(tmp_path, monkeypatch):
    """A real I/O failure while copying is not retried through a buffer: it surfaces."""
    if not hasattr(os, "copy_file_range"):
        pytest.skip("no os.copy_file_range on this system")
    src = _h5(tmp_path / "a.h5")
    _counting(monkeypatch, fail=errno.EIO)
    with pytest.raises(OSError):
        _copy(src, str(tmp_path / "b.h5"))


def test_length_changing_patches_keep_the_buffered_copy():
    """A patch that changes a length (a re-deflated zip member) moves every later byte: no kernel copy then."""
    assert copyapply._kernel_copy_ok(np.array([False, False])) == hasattr(os, "copy_file_range")
    assert not copyapply._kernel_copy_ok(np.array([False, True]))


class _Counting:
    """sha256 that adds the bytes it is fed to ``fed[0]``; ``copy`` only when ``copyable``."""

    def __init__(self, fed, copyable, h=None):
        self.fed, self.copyable, self.h = fed, copyable, h or hashlib.sha256()
        if copyable:
            self.copy = lambda: _Counting(self.fed, True, self.h.copy())

    def update(self, data):
        self.fed[0] += memoryview(data).nbytes
        self.h.update(data)

    def hexdigest(self):
        return self.h.hexdigest()


@pytest.fixture
def counting():
    """Two test algorithms counting the bytes hashed: one whose hashers copy their state, one whose do not."""
    fed = [0]
    for name, copyable in (("test-count", True), ("test-count-nocopy", False)):
        hashing.register(hashing.Algorithm(name, 64, None, None, lambda c=copyable: _Counting(fed, c)))
    yield fed
    hashing.unregister("test-count")
    hashing.unregister("test-count-nocopy")


def test_the_output_hash_shares_the_inputs_prefix(tmp_path, counting):
    """The bytes before the first changed block are hashed once: the output's hash starts as a copy of the
    input's there; both digests are those of the files."""
    src, out = _h5(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    ref, routes = _reference(src, out, count=1)
    first = int(min(r.offsets.min() for r in routes)) // 4096 * 4096
    assert first > 0
    size = os.path.getsize(src)
    h_in, h_out, _, _ = copy_apply(src, out, ref.log.plan, routes, block=4096, algorithm="test-count",
                                   cached_input=False)
    assert counting[0] == size + (size - first)  # the prefix once, the rest twice
    assert (h_in, h_out) == (filebytes.hash_file(src, "sha256", cache=False),
                             filebytes.hash_file(out, "sha256", cache=False))
    assert_judged(h5_view(src), h5_view(out), ref.log)
    counting[0] = 0  # a hasher that cannot copy its state: both hashes fed from the start, the same digests
    again = copy_apply(src, out + ".2", ref.log.plan, routes, block=4096, algorithm="test-count-nocopy",
                       cached_input=False)
    assert counting[0] == 2 * size and again[:2] == (h_in, h_out)


def test_a_copy_that_changes_nothing_hashes_the_file_once(tmp_path, counting):
    """No site on the raw path (all left to h5py, or none): the output is the input, hashed once."""
    src, out = _h5(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    ref, _ = _reference(src, out, count=1)
    h_in, h_out, _, _ = copy_apply(src, out, ref.log.plan, [], block=4096, algorithm="test-count",
                                   cached_input=False)
    assert counting[0] == os.path.getsize(src)
    assert open(out, "rb").read() == open(src, "rb").read()
    assert h_in == h_out == filebytes.hash_file(src, "sha256", cache=False)


@pytest.mark.parametrize("durable", [True, False])
def test_a_durable_copy_starts_writeback_block_by_block(tmp_path, monkeypatch, durable):
    """A durable new file asks the kernel to write each block back as soon as it is copied (the fsync at the
    commit then waits for little); every output byte is asked for exactly once. Not durable: never."""
    src = _h5(tmp_path / "a.h5", n=1 << 20)  # 6 MiB: two copy blocks
    spans: list[tuple[int, int]] = []
    monkeypatch.setattr(filebytes, "start_writeback", lambda fd, at, n: spans.append((at, n)))
    out = str(tmp_path / "b.h5")
    res = inject_file(src, out, sampling=Sampling(count=3), seed=2, durable=durable)
    assert_judged(h5_view(src), h5_view(out), res.log)
    if not durable:
        assert spans == []
        return
    if not copyapply._kernel_copy_ok(np.array([], bool)):
        pytest.skip("no os.copy_file_range on this system: the buffered copy writes in order")
    spans.sort()
    assert len(spans) > 1
    assert [a for a, _ in spans] == [0, *np.cumsum([n for _, n in spans[:-1]]).tolist()]  # no gap, no overlap
    assert sum(n for _, n in spans) == os.path.getsize(out) == os.path.getsize(src)
    assert res.log.manifest["output"]["hash"] == filebytes.hash_file(out, res.log.manifest["output"]["hash_algorithm"],
                                                                  cache=False)


def test_start_writeback_is_harmless(tmp_path):
    """The writeback request changes no byte and accepts an empty range."""
    p = tmp_path / "f.bin"
    p.write_bytes(b"x" * 10000)
    with open(p, "r+b") as fh:
        fh.write(b"y" * 100)
        fh.flush()
        fileio.start_writeback(fh.fileno(), 0, 10000)
        fileio.start_writeback(fh.fileno(), 0, 0)
    assert p.read_bytes() == b"y" * 100 + b"x" * 9900


# ------------------------------------------------------------------ revert and replay: the file read once


class _Counted:
    """A file object that adds the bytes read through it to ``counter["bytes"]``."""

    def __init__(self, fh, counter):
        self._fh, self._counter = fh, counter

    def read(self, *a):
        b = self._fh.read(*a)
        self._counter["bytes"] += len(b)
        return b

    def readinto(self, buf):
        n = self._fh.readinto(buf)
        self._counter["bytes"] += n or 0
        return n

    def __iter__(self):
        for line in self._fh:
            self._counter["bytes"] += len(line)
            yield line

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._fh.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._fh, name)


def count_reads(monkeypatch, module=filebytes, path: str | None = None) -> dict:
    """``{"bytes": read, "opens": opened for reading}`` from now on, through ``open`` in ``module`` (default
    :mod:`fastflip.files.filebytes`: hashes, copies, byte diffs), of the file ``path`` (None: of every file)."""
    counter = {"bytes": 0, "opens": 0}
    want = None if path is None else os.path.realpath(path)
    real = open

    def counted(file, mode="r", *a, **k):
        fh = real(file, mode, *a, **k)
        if "r" not in mode or "+" in mode:
            return fh
        if want is not None and not (isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == want):
            return fh
        counter["opens"] += 1
        return _Counted(fh, counter)

    monkeypatch.setattr(module, "open", counted, raising=False)
    return counter


def _hashed_output(tmp_path, gzip=False):
    src = str(tmp_path / "a.h5")
    with h5py.File(src, "w") as f:
        f.create_dataset("a", data=np.linspace(-2, 2, 1 << 16, dtype="f4"))
        if gzip:
            noise = np.random.default_rng(0).standard_normal((128, 128)).astype("f4") * 0.05
            f.create_dataset("g", data=noise, chunks=(32, 32), compression_opts=1,
                             compression="gzip", shuffle=True)
    res = inject_file(src, str(tmp_path / "b.h5"), sampling=Sampling(count=20), seed=3, hash_algorithm="sha256",
                      selection={"include": ["g"]} if gzip else None)
    assert_judged(h5_view(src), h5_view(res.output), res.log)
    return src, res


@pytest.mark.parametrize("atomic", [False, True])
def test_revert_reads_the_file_once(tmp_path, monkeypatch, atomic):
    """Direct and atomic revert: the hash now and the hash once restored come from one read of the file."""
    from fastflip.files.revert import revert

    src, res = _hashed_output(tmp_path)
    size = os.path.getsize(res.output)
    total = count_reads(monkeypatch)
    out = revert(res.log_path, res.output, atomic=atomic)
    assert total["bytes"] <= size + 4096  # once (before: the file before and after the restore: twice)
    assert open(res.output, "rb").read() == open(src, "rb").read()
    assert out.digest == filebytes.hash_file(src, "sha256", cache=False) and out.verified


def test_revert_refuses_another_file_and_changes_nothing(tmp_path):
    """The one-read revert still refuses a file that is not the logged output, before writing anything."""
    from fastflip.errors import LogMismatchError
    from fastflip.files.revert import revert

    _, res = _hashed_output(tmp_path)
    with open(res.output, "r+b") as fh:
        fh.seek(-1, 2)
        fh.write(b"\x7f")
    before = open(res.output, "rb").read()
    with pytest.raises(LogMismatchError, match="not the output this log describes"):
        revert(res.log_path, res.output, atomic=False)
    assert open(res.output, "rb").read() == before


def test_replay_of_a_logged_delta_reads_the_input_once(tmp_path, monkeypatch):
    """Replay of a log holding a byte delta (re-encoded gzip chunks): one read gives both hashes."""
    from fastflip.files.replay import replay

    src, res = _hashed_output(tmp_path, gzip=True)
    assert res.log.undo is not None and res.log.undo.new_size == res.log.undo.size
    total = count_reads(monkeypatch)
    again = replay(res.log_path, src, str(tmp_path / "c.h5"))
    assert total["bytes"] <= os.path.getsize(src) + 4096  # once (before: the input, then the copy: twice)
    assert_judged(h5_view(src), h5_view(again.output), res.log)  # the replay, read by h5py, is the logged change
    assert open(again.output, "rb").read() == open(res.output, "rb").read()


# ------------------------------------------------------------------ revert_dir


def test_revert_dir_reads_each_shard_once(tmp_path, monkeypatch):
    from fastflip.files.sharded import inject_dir, revert_dir

    d = write_checkpoint_dir(tmp_path / "m", n_shards=2, rows=512)
    before, expect = snapshot(d), dir_view(d, st_numpy_view)
    res = inject_dir(d, in_place=True, seed=2, sampling=Sampling(count=40))
    touched = res.log.manifest["checkpoint_dir"]["shards"]
    assert len(touched) == 2
    assert_judged(expect, dir_view(d, st_numpy_view), res.log)
    size = sum(os.path.getsize(os.path.join(d, n)) for n in touched)
    total = count_reads(monkeypatch)
    assert revert_dir(res.log_path, d).verified
    assert total["bytes"] <= size + 4096  # once a shard (before: three times)
    assert snapshot(d) == before


def test_revert_dir_leaves_a_shard_already_restored(tmp_path):
    """In place, a shard already at its logged input (a killed commit) is left alone; the others restored."""
    import shutil

    from fastflip.files.sharded import inject_dir, revert_dir

    d = write_checkpoint_dir(tmp_path / "m", n_shards=2, rows=512)
    shutil.copytree(d, str(tmp_path / "orig"))
    res = inject_dir(d, in_place=True, seed=2, sampling=Sampling(count=40))
    first = sorted(res.log.manifest["checkpoint_dir"]["shards"])[0]
    shutil.copyfile(str(tmp_path / "orig" / first), os.path.join(d, first))
    ino = os.stat(os.path.join(d, first)).st_ino
    out = revert_dir(res.log_path, d)
    assert out.sites == len(res.log) - res.log.manifest["checkpoint_dir"]["shards"][first]["sites"]
    assert os.stat(os.path.join(d, first)).st_ino == ino  # not rewritten
    assert snapshot(d) == snapshot(str(tmp_path / "orig"))
    assert not [f for f in os.listdir(d) if ".fastflip-" in f]


def test_revert_dir_without_hashes_needs_no_verify(tmp_path, capsys):
    """A directory log without hashes: refused with a pointer to --no-verify, reverted (unverified) with it."""
    from fastflip.cli import main
    from fastflip.errors import LogMismatchError
    from fastflip.files.sharded import inject_dir, revert_dir

    d = write_checkpoint_dir(tmp_path / "m", n_shards=2, rows=512)
    before = snapshot(d)
    res = inject_dir(d, in_place=True, atomic=False, hash_files=False, log_path=False, seed=2,
                     sampling=Sampling(count=40))
    with pytest.raises(LogMismatchError, match="--no-verify"):
        revert_dir(res.log, d)
    assert snapshot(d) != before
    lp = str(tmp_path / "m.fflog")
    res.log.save(lp)
    assert main(["revert", lp, d, "-q"]) == 2
    assert "--no-verify" in capsys.readouterr().err
    assert main(["revert", lp, d, "--no-verify", "-q"]) == 0
    assert snapshot(d) == before


# ------------------------------------------------------------------ CLI start-up


def test_a_command_imports_no_other_command(tmp_path):
    """``fastflip inject ...`` builds the parser of inject alone: no other command's module is imported."""
    import subprocess
    import sys

    code = ("import sys\nfrom fastflip.cli import main\ntry:\n    main(['inject', '--help'])\nexcept SystemExit:\n"
            "    pass\nprint(sorted(m for m in sys.modules if m.startswith('fastflip.cli.') and m.endswith('_cmd')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "['fastflip.cli.inject_cmd']"
    assert "usage: fastflip inject" in r.stdout


def test_the_full_parser_still_lists_every_command(capsys):
    from fastflip.cli import COMMANDS, main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name, _ in COMMANDS)
    assert main([]) == 2  # no command: the help, exit 2


# ------------------------------------------------------------------ commit: the replaced file freed beside the run


@pytest.mark.skipif(os.name != "posix", reason="an open file cannot be replaced on Windows")
def test_the_replaced_output_is_freed_after_the_commit(tmp_path, monkeypatch):
    """Replacing an existing output: its old inode is handed, still open, to a background close after the
    rename (freeing its blocks costs as much as truncating it); the log is never held; a new output holds
    nothing."""
    src = _h5(tmp_path / "a.h5")
    out = str(tmp_path / "b.h5")
    handed: list[list[int]] = []
    monkeypatch.setattr(fileio, "release_later", lambda fds: handed.append(list(fds)))
    inject_file(src, out, sampling=Sampling(count=1), seed=1)
    assert handed == [[]]  # nothing replaced
    old = os.stat(out)
    res = inject_file(src, out, sampling=Sampling(count=1), seed=2)
    assert_judged(h5_view(src), h5_view(out), res.log)
    (fd,), = handed[1:]
    try:
        st = os.fstat(fd)
        assert (st.st_ino, st.st_nlink) == (old.st_ino, 0)  # the replaced file, no longer named
        assert os.stat(out).st_ino != old.st_ino
    finally:
        os.close(fd)
    assert res.log.manifest["output"]["hash"] == filebytes.hash_file(out, res.log.manifest["output"]["hash_algorithm"],
                                                                  cache=False)


def test_release_later_closes_in_the_background(tmp_path):
    fds = [os.open(tmp_path, os.O_RDONLY) for _ in range(3)]
    fileio.release_later(fds)
    import threading

    for t in [t for t in threading.enumerate() if t.name == "fastflip-release"]:
        t.join(5)
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_the_program_sets_its_objects_aside_for_the_exit(tmp_path):
    """``python -m fastflip`` freezes the garbage collector after the command (the exit's collection then walks
    none of the imported objects); atexit handlers still run, and the command's files are complete."""
    import subprocess
    import sys

    src = _h5(tmp_path / "a.h5")
    out = str(tmp_path / "b.h5")
    code = ("import atexit, gc, runpy, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
            f"sys.argv = ['fastflip', 'inject', {src!r}, '-o', {out!r}, '--count', '2', '--seed', '1', '-q']\n"
            "runpy.run_module('fastflip', run_name='__main__', alter_sys=True)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "frozen True"
    from fastflip.files.log import InjectionLog

    log = InjectionLog.load(out + ".fflog")
    assert log.manifest["output"]["hash"] == filebytes.hash_file(out, log.manifest["output"]["hash_algorithm"],
                                                              cache=False)


def test_main_itself_leaves_the_collector_alone(tmp_path, capsys):
    """A host process that calls ``main`` (again and again) keeps collecting its garbage."""
    import gc

    from fastflip.cli import main

    before = gc.get_freeze_count()
    src = _h5(tmp_path / "a.h5")
    assert main(["inject", src, "-o", str(tmp_path / "b.h5"), "--count", "1", "--seed", "1", "-q"]) == 0
    assert gc.get_freeze_count() == before


# ------------------------------------------------------------------ layout: the overlap check's chunk budget


def test_the_overlap_check_counts_allocated_chunks_not_the_grid(tmp_path, monkeypatch):
    """A dataset whose chunk grid exceeds what is left of the check's budget, with few chunks allocated, is
    still walked (its index counted only then), and an allocated chunk on another dataset's bytes is refused."""
    import struct

    from fastflip.errors import FastflipError
    from fastflip.files import h5overlap

    p = str(tmp_path / "sparse.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("a", data=np.arange(64, dtype="f4"))
        s = f.create_dataset("s", shape=(800,), dtype="f4", chunks=(8,))  # a grid of 100 chunks
        s[:8] = 1.0  # one allocated
        oa, first = f["a"].id.get_offset(), s.id.get_chunk_info(0).byte_offset
    monkeypatch.setattr(h5overlap, "MAX_CHUNKS_CHECKED", 5)
    assert [t.path for t in read_layout(p).tensors] == ["/a", "/s"]  # sound: read
    raw = bytearray(open(p, "rb").read())
    at = raw.find(struct.pack("<Q", first))
    raw[at:at + 8] = struct.pack("<Q", oa)
    open(p, "wb").write(bytes(raw))
    with pytest.raises(FastflipError, match="share bytes"):
        read_layout(p)


# ------------------------------------------------------------------ a failure in the background kernel copy


@pytest.mark.skipif(not hasattr(os, "copy_file_range"), reason="no os.copy_file_range on this system")
def test_kernel_copy_failure_surfaces_at_once(tmp_path, monkeypatch, capsys):
    """EIO on the background thread's first kernel copy: the command stops in one line, with no output and no
    temporary, and the clean blocks are not offered to the kernel again as though it had refused."""
    from fastflip.cli import main

    src = str(tmp_path / "big.h5")
    with h5py.File(src, "w") as f:  # three 4 MiB read blocks: one touched, the others clean
        f.create_dataset("a", data=np.linspace(-2, 2, 3 << 20, dtype="f4"))
    calls: list[int] = []
    real = os.copy_file_range

    def fake(fd_in, fd_out, count, offset_src=None, offset_dst=None):
        calls.append(count)
        if len(calls) == 1:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd_in, fd_out, count, offset_src, offset_dst)

    monkeypatch.setattr(os, "copy_file_range", fake)
    out = tmp_path / "out"
    out.mkdir()
    rc = main(["inject", src, "-o", str(out / "o.h5"), "--count", "1", "--seed", "1", "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert os.listdir(out) == []  # no output, no log, no temporary
    assert len(calls) == 1


@pytest.mark.parametrize("algorithm", ["sha256", "blake3"])
def test_output_hash_on_a_helper_thread_or_not_gives_one_digest(tmp_path, monkeypatch, algorithm):
    """The output's hash fed from a helper thread (more than two cores) or on the reading thread (two or fewer):
    the same digests, those of the files written; the helper thread is used only where asked."""
    if algorithm not in hashing.available():
        pytest.skip(f"{algorithm} is not installed")
    import threading

    src = _h5(tmp_path / "a.h5", n=1 << 17)
    ref, routes = _reference(src, str(tmp_path / "o.h5"), count=6)
    digests, helpers = [], []
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start",
                        lambda self: helpers.append(self.name) or real_start(self))
    for aside in (True, False):
        monkeypatch.setattr(copyapply, "_hash_aside", lambda algorithm, aside=aside: aside)
        out = str(tmp_path / f"o{aside}.h5")
        helpers.clear()
        h_in, h_out, _, _ = copy_apply(src, out, ref.log.plan, routes, block=4096, cached_input=False,
                                       algorithm=algorithm)
        assert any(n.startswith("fastflip-hash") for n in helpers) == aside
        assert h_out == filebytes.hash_file(out, algorithm, cache=False)
        assert h_in == filebytes.hash_file(src, algorithm, cache=False)
        digests.append((h_in, h_out))
    assert digests[0] == digests[1] and digests[0][0] != digests[0][1]
