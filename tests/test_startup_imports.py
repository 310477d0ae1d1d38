"""What a CLI command costs at start-up: the modules it imports (only what its input needs) and its garbage
collections.

Each command runs in a fresh interpreter, as ``python -m fastflip`` does, and hands back ``sys.modules`` as it
stood at exit (and how many collections ran once its file modules were loading). A command on a raw HDF5 file
imports no zip reader, no chunk codec, no ``.keras`` archive code and no ``difflib``; the modules come in when the
input needs them (a deflated ``.npz``, a gzip-chunked HDF5 file, a ``.keras`` archive, a sha256 log).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fastflip.files import hashing

# Runs the CLI in this interpreter and writes to the file given first, at exit: the number of garbage collections
# once the command's file modules were loading, then the names in sys.modules.
_DRIVER = ("import atexit, gc, runpy, sys\n"
           "out, n = sys.argv.pop(1), [0]\n"
           "gc.callbacks.append(lambda phase, info: phase == 'start' and 'fastflip.files' in sys.modules\n"
           "                    and n.__setitem__(0, n[0] + 1))\n"
           "atexit.register(lambda: open(out, 'w').write('\\n'.join([str(n[0]), *sorted(sys.modules)])))\n"
           "sys.argv[0] = 'fastflip'\n"
           "runpy.run_module('fastflip', run_name='__main__', alter_sys=True)\n")

#: Modules no command on a raw HDF5 file needs: the zip-member and chunk codecs, the other formats' readers,
#: the .keras archive code, name suggestions for errors, and the frameworks.
NOT_FOR_RAW_HDF5 = (
    "difflib", "fastflip.files.keras_archive", "fastflip.files.zipmembers", "fastflip.files.h5chunks",
    "fastflip.files.formats.zipraw", "fastflip.files.formats.npz_members", "fastflip.files.formats.numpy_io",
    "fastflip.files.formats.zipcrc", "fastflip.files.formats.torchsave", "fastflip.files.formats.torchquant",
    "fastflip.files.formats.safetensors_io", "fastflip.files.sharded", "fastflip.files.keras_sharded", "torch", "keras",
    "tensorflow",
)


def run_traced(tmp_path: Path, *argv: object) -> tuple[int, set[str]]:
    """(garbage collections during the command, modules loaded at its exit) of ``fastflip *argv`` (exit status
    0 or 1)."""
    out = tmp_path / f"modules-{len(list(tmp_path.glob('modules-*')))}.txt"
    r = subprocess.run([sys.executable, "-c", _DRIVER, str(out), *map(str, argv)], capture_output=True, text=True,
                       env=os.environ.copy())
    assert r.returncode in (0, 1), r.stderr
    n, *mods = out.read_text().split()
    return int(n), set(mods)


def modules_of(tmp_path: Path, *argv: object) -> set[str]:
    """The modules loaded when ``fastflip *argv`` exits."""
    return run_traced(tmp_path, *argv)[1]


@pytest.fixture
def raw_h5(tmp_path: Path) -> str:
    import h5py

    p = str(tmp_path / "w.h5")
    with h5py.File(p, "w") as f:
        f["dense/kernel"] = np.linspace(-1, 1, 64, dtype="<f4").reshape(8, 8)
    return p


def test_inject_into_raw_hdf5_imports_no_zip_chunk_or_archive_code(tmp_path: Path, raw_h5: str) -> None:
    mods = modules_of(tmp_path, "inject", raw_h5, "-o", tmp_path / "o.h5", "--count", 3, "--seed", 1, "--no-log", "-q")
    assert "fastflip.files.inject" in mods  # the command ran
    assert sorted(mods & {*NOT_FOR_RAW_HDF5, "zipfile"}) == []  # no log written: no zip at all
    mods = modules_of(tmp_path, "inject", raw_h5, "-o", tmp_path / "o.h5", "--count", 3, "--seed", 1, "--force", "-q")
    assert "zipfile" in mods  # the log is a zip archive
    assert sorted(mods & set(NOT_FOR_RAW_HDF5)) == []


#: Modules a new file from a count of single-bit flips does not need: NumPy's random package (its sites come from
#: Philox words computed in Python) with what it loads (secrets, hmac, hashlib), thread pools (the copy and the
#: hash cache use plain threads), and the in-place and region-evidence writers.
NOT_FOR_A_NEW_FILE = ("numpy.random", "secrets", "hmac", "concurrent.futures", "fastflip.files.copyregions",
                      "fastflip.files.fingerprint", "fastflip.files.inplace")


@pytest.mark.parametrize("model", [None, "stuck-at-1"])
def test_a_one_flip_new_file_imports_no_numpy_random_nor_in_place_code(tmp_path: Path, raw_h5: str, model) -> None:
    more = () if model is None else ("--model", model)
    mods = modules_of(tmp_path, "inject", raw_h5, "-o", tmp_path / "o.h5", "--count", 1, "--seed", 1, *more,
                      "--force", "-q")
    assert "fastflip.files.inject" in mods
    if hashing.default_algorithm() != "sha256":
        assert "hashlib" not in mods
    assert sorted(mods & set(NOT_FOR_A_NEW_FILE)) == []


def test_revert_and_inspect_of_raw_hdf5_import_no_zip_readers_nor_sha256(tmp_path: Path, raw_h5: str) -> None:
    out = str(tmp_path / "o.h5")
    algo = hashing.default_algorithm()
    subprocess.run([sys.executable, "-m", "fastflip", "inject", raw_h5, "-o", out, "--count", "3", "--seed", "2",
                    "--hash", algo, "-q"], check=True)
    mods = modules_of(tmp_path, "revert", out + ".fflog", out, "-o", tmp_path / "r.h5", "-q")
    assert "fastflip.files.revert" in mods
    assert sorted(mods & {*NOT_FOR_RAW_HDF5, "secrets", "numpy.random"}) == []
    if algo != "sha256":  # the log's algorithm only
        assert "hashlib" not in mods
    mods = modules_of(tmp_path, "inspect", raw_h5, "-q")
    assert "fastflip.files.layout" in mods
    assert sorted(mods & {*NOT_FOR_RAW_HDF5, "zipfile", "hashlib", "secrets"}) == []


def test_the_code_an_input_needs_is_imported(tmp_path: Path, raw_h5: str) -> None:
    import h5py

    npz = str(tmp_path / "w.npz")  # deflated members: the zip-member code re-encodes them
    np.savez_compressed(npz, w=np.linspace(-1, 1, 64, dtype="<f4"))
    mods = modules_of(tmp_path, "inject", npz, "-o", tmp_path / "o.npz", "--count", 2, "--seed", 1, "--no-log", "-q")
    assert {"zipfile", "fastflip.files.zipmembers", "fastflip.files.formats.numpy_io"} <= mods

    gz = str(tmp_path / "gz.h5")  # gzip chunks: the chunk codec
    with h5py.File(gz, "w") as f:
        f.create_dataset("w", data=np.linspace(-1, 1, 256, dtype="<f4"), chunks=(64,), compression="gzip")
    mods = modules_of(tmp_path, "inject", gz, "-o", tmp_path / "o2.h5", "--count", 2, "--seed", 1, "--no-log", "-q")
    assert "fastflip.files.h5chunks" in mods

    keras = str(tmp_path / "m.keras")  # a .keras archive: the archive code
    with zipfile.ZipFile(keras, "w") as z:
        z.writestr("config.json", "{}")
        z.write(raw_h5, "model.weights.h5")
    assert "fastflip.files.keras_archive" in modules_of(tmp_path, "inspect", keras, "-q")

    out = str(tmp_path / "s.h5")  # a sha256 log: hashlib
    subprocess.run([sys.executable, "-m", "fastflip", "inject", raw_h5, "-o", out, "--count", "1", "--seed", "3",
                    "--hash", "sha256", "-q"], check=True)
    assert "hashlib" in modules_of(tmp_path, "revert", out + ".fflog", out, "-o", tmp_path / "r.h5", "-q")


def test_a_small_command_runs_no_garbage_collection(tmp_path: Path, raw_h5: str) -> None:
    """The program collects cycles after 50,000 new objects, not 700: a 1-flip inject (NumPy, h5py and fastflip
    imported, some 40,000 objects that live until the exit) walks none of them again and again."""
    n, mods = run_traced(tmp_path, "inject", raw_h5, "-o", tmp_path / "o.h5", "--count", 1, "--seed", 1, "-q")
    assert "fastflip.files.inject" in mods
    assert n <= 2
