"""torch.save files that torch.load(weights_only=True) reads or refuses: fastflip agrees element by element, or
refuses in one line (tests/attack_check.py).

Each case is written by torch itself, then (for the malformed ones) its archive is rewritten entry by entry or its
pickle or records patched by hand. The cases that ``refused`` pins are files fastflip once read although torch
reads them otherwise or not at all.
"""

from __future__ import annotations

import collections
import io
import struct
import zipfile

import numpy as np
import pytest

from attack_check import verdict
from conftest import require
from framework_views import big_endian_archive, state_dict_view, torch_view
from hostile_files import SRef, T, torch_pickle, torch_zip_bytes

pytestmark = pytest.mark.framework

STORED, DEFLATED = zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED


def _view(path: str) -> dict[str, np.ndarray]:
    """torch's reading, a tensor saved alone named ``/`` as fastflip names it."""
    return {(k or "/"): v for k, v in torch_view(path).items()}


def _save(path: str, obj: object, **kw: object) -> str:
    require("torch").save(obj, path, **kw)
    return path


def _rezip(src: str, dst: str, entry, prefix: bytes = b"", comment: bytes = b"", zip64: bool = False) -> str:  # type: ignore[no-untyped-def]
    """``src``'s archive written again entry by entry: ``entry(name, data)`` gives [(name, data, method)]."""
    buf = io.BytesIO()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(buf, "w") as zout:
        for info in zin.infolist():
            for name, data, method in entry(info.filename, zin.read(info)):
                zi = zipfile.ZipInfo(name, date_time=info.date_time)
                zi.compress_type = method
                with zout.open(zi, "w", force_zip64=zip64) as fh:
                    fh.write(data)
        zout.comment = comment
    with open(dst, "wb") as fh:
        fh.write(prefix + buf.getvalue())
    return dst


def _same(n: str, d: bytes) -> list:
    return [(n, d, STORED)]


def _replace(suffix: str, data: bytes):  # type: ignore[no-untyped-def]
    """An entry rule: the entry whose name ends with ``suffix`` holds ``data``."""
    return lambda n, d: [(n, data if n.endswith(suffix) else d, STORED)]


def _patch_pickle(src: str, dst: str, old: bytes, new: bytes) -> str:
    """``src`` with ``old`` replaced by ``new`` in its data.pkl (a GLOBAL's module and name lines)."""
    def entry(n: str, d: bytes) -> list:
        if n.endswith("data.pkl"):
            assert old in d, (old, d[:200])
            d = d.replace(old, new)
        return [(n, d, STORED)]
    return _rezip(src, dst, entry)


def _base(tmp) -> str:  # type: ignore[no-untyped-def]
    torch = require("torch")
    return _save(str(tmp / "base.pt"), {"w": torch.arange(12, dtype=torch.float32).view(3, 4), "b": torch.ones(3)})


def _uint16(tmp) -> str:  # type: ignore[no-untyped-def]
    """A uint16 tensor: torch saves it on an untyped storage (``_rebuild_tensor_v3``)."""
    torch = require("torch")
    return _save(str(tmp / "u16.pt"), {"u": torch.tensor([1, 2, 300, 4], dtype=torch.uint16)})


# --------------------------------------------------------------------------------------------
# written by torch.save: fastflip lists the tensors torch returns, at the bytes torch reads


def _framework_files() -> dict:
    torch = require("torch")
    base = torch.arange(24, dtype=torch.float32)
    sd = collections.OrderedDict(w=torch.ones(2))
    sd._metadata = {"": {"version": 1}}  # type: ignore[attr-defined]
    return {
        "views with storage offsets": {"a": base, "b": base[4:10]},
        "a slice saved alone": {"b": base[4:10]},
        "transposed (non-contiguous)": {"t": base.view(4, 6).t()},
        "strided columns": {"t": base.view(4, 6)[:, ::2]},
        "expanded (zero stride)": {"e": torch.ones(1, 3).expand(4, 3)},
        "as_strided zero stride": {"z": torch.tensor([1.0]).as_strided((5,), (0,))},
        "overlapping views": {"a": base[0:10], "b": base[5:15]},
        "0-element tensors": {"z": torch.empty(0), "y": torch.empty(3, 0), "w": torch.ones(3)},
        "0-d tensor": {"s": torch.tensor(3.5)},
        "nested containers, non-tensor values": {"l": [torch.ones(2), (torch.zeros(3), {"x": torch.arange(4)})],
                                                 "n": None, "i": 3, "s": "str"},
        "state_dict with _metadata": sd,
        "bool, int8": {"b": torch.tensor([True, False, True]), "i": torch.tensor([-1, 2], dtype=torch.int8)},
        "float16, bfloat16, float8": {"h": torch.ones(3, dtype=torch.float16), "b": torch.ones(3, dtype=torch.bfloat16),
                                      "f": torch.ones(3, dtype=torch.float8_e4m3fn)},
        "uint16, uint32, uint64 (untyped storages)": {"a": torch.tensor([1, 300], dtype=torch.uint16),
                                                      "b": torch.tensor([1, 70000], dtype=torch.uint32),
                                                      "c": torch.tensor([1, 2**40], dtype=torch.uint64)},
        "float64, int64": {"a": torch.arange(5, dtype=torch.float64), "b": torch.arange(5, dtype=torch.int64)},
        "tied (one tensor, two keys)": {"a": base, "b": base},
        "a list at the top": [torch.ones(2), torch.zeros(2)],
        "a tensor at the top": torch.arange(6.0),
    }


FRAMEWORK = ["views with storage offsets", "a slice saved alone", "transposed (non-contiguous)", "strided columns",
             "expanded (zero stride)", "as_strided zero stride", "overlapping views", "0-element tensors",
             "0-d tensor", "nested containers, non-tensor values", "state_dict with _metadata", "bool, int8",
             "float16, bfloat16, float8", "uint16, uint32, uint64 (untyped storages)", "float64, int64",
             "tied (one tensor, two keys)", "a list at the top", "a tensor at the top"]


#: The tensors fastflip skips (views into shared or non-contiguous storage, 0 elements), by case of FRAMEWORK
#: (every other case: none).
FRAMEWORK_SKIPPED = {"views with storage offsets": ["/b"], "transposed (non-contiguous)": ["/t"],
                     "strided columns": ["/t"], "expanded (zero stride)": ["/e"], "as_strided zero stride": ["/z"],
                     "overlapping views": ["/b"], "0-element tensors": ["/y", "/z"]}
#: The cases of FRAMEWORK whose every tensor fastflip skips.
FRAMEWORK_EMPTY = {"transposed (non-contiguous)", "strided columns", "expanded (zero stride)",
                   "as_strided zero stride"}


@pytest.mark.parametrize("case", FRAMEWORK)
def test_files_torch_writes_agree(case, tmp_path):
    path = _save(str(tmp_path / "f.pt"), _framework_files()[case])
    assert verdict(path, _view, str(tmp_path / "w"), expect="agrees", skipped=FRAMEWORK_SKIPPED.get(case, []),
                   empty=case in FRAMEWORK_EMPTY)


@pytest.mark.parametrize("case", ["views with storage offsets", "nested containers, non-tensor values", "0-d tensor"])
def test_legacy_files_torch_writes_agree(case, tmp_path):
    path = _save(str(tmp_path / "f.pt"), _framework_files()[case], _use_new_zipfile_serialization=False)
    assert verdict(path, _view, str(tmp_path / "w"), expect="agrees", skipped=FRAMEWORK_SKIPPED.get(case, []))


def test_complex_and_legacy_float8_refused(tmp_path):
    torch = require("torch")
    p = _save(str(tmp_path / "c.pt"), {"c": torch.ones(3, dtype=torch.complex64), "w": torch.ones(2)})
    assert verdict(p, _view, str(tmp_path / "c"), expect="refused")
    p = _save(str(tmp_path / "h.pt"), {"h": torch.ones(3, dtype=torch.float8_e4m3fn)},
              _use_new_zipfile_serialization=False)
    assert verdict(p, _view, str(tmp_path / "h"), expect="refused")


def test_big_endian_float32_agrees(tmp_path):
    torch = require("torch")
    little = _save(str(tmp_path / "f.pt"), {"f": torch.tensor([1.0, 2.0, 3.5])})
    big_endian_archive(little, str(tmp_path / "big.pt"), itemsize=4)
    assert verdict(str(tmp_path / "big.pt"), _view, str(tmp_path / "w"), expect="agrees")


# --------------------------------------------------------------------------------------------
# the archive rewritten: what torch still reads fastflip reads alike; what it refuses, fastflip refuses


ARCHIVES = {  # case -> (entry rule, rewrite options, expected verdict)
    "rewritten as it is": (_same, {}, "agrees"),
    "zip64 local and central fields": (_same, {"zip64": True}, "agrees"),
    "a comment after the directory": (_same, {"comment": b"hello"}, "agrees"),
    "data.pkl deflated": (lambda n, d: [(n, d, DEFLATED if n.endswith("data.pkl") else STORED)], {}, "agrees"),
    "no byteorder entry (little)": (lambda n, d: [] if n.endswith("byteorder") else [(n, d, STORED)], {}, "agrees"),
    "an unreferenced storage entry": (lambda n, d: [(n, d, STORED)] + (
        [(n.rsplit("/", 1)[0] + "/data/999", b"\0" * 8, STORED)] if n.endswith("data.pkl") else []), {}, "agrees"),
    "storages deflated": (lambda n, d: [(n, d, DEFLATED if "/data/" in n else STORED)], {}, "refused"),
    "bytes before the archive": (_same, {"prefix": b"\0" * 100}, "refused"),
    "storages in another folder": (lambda n, d: [(n.replace("base/", "other/") if "/data/" in n else n, d, STORED)],
                                   {}, "refused"),
    "a storage entry longer than its pickle says": (
        lambda n, d: [(n, d + b"\0" * 4 if n.endswith("/data/0") else d, STORED)], {}, "refused"),
    "a storage entry missing": (lambda n, d: [] if n.endswith("/data/0") else [(n, d, STORED)], {}, "refused"),
    "data.pkl named DATA.PKL": (lambda n, d: [(n.replace("data.pkl", "DATA.PKL"), d, STORED)], {}, "refused"),
    # torch.load refuses these; fastflip used to read them
    "byteorder 'little\\n'": (_replace("byteorder", b"little\n"), {}, "refused"),
    "data.pkl at the archive's root": (lambda n, d: [(n.split("/", 1)[1], d, STORED)], {}, "refused"),
    "first entry in another folder": (lambda n, d: ([("zzz/extra", b"x", STORED)] if n.endswith("data.pkl") else [])
                                      + [(n, d, STORED)], {}, "refused"),
    "version record missing": (lambda n, d: [] if n == "base/version" else [(n, d, STORED)], {}, "refused"),
    "version record 'x'": (_replace("base/version", b"x"), {}, "refused"),
    "version record 99": (_replace("base/version", b"99"), {}, "refused"),
    ".storage_alignment not a number": (_replace(".storage_alignment", b"abc"), {}, "refused"),
    # torch finds records ignoring letter case: it read the zeros of DATA/0 where fastflip flipped data/0
    "storage twin in other case, before": (lambda n, d: ([("base/DATA/0", bytes(len(d)), STORED)]
                                                         if n == "base/data/0" else []) + [(n, d, STORED)], {},
                                           "refused"),
    "storage twin in other case, after": (lambda n, d: [(n, d, STORED)] + (
        [("base/DATA/0", bytes(len(d)), STORED)] if n == "base/data/0" else []), {}, "refused"),
    "byteorder twin BYTEORDER 'big'": (lambda n, d: [(n, d, STORED)] + (
        [("base/BYTEORDER", b"big", STORED)] if n == "base/byteorder" else []), {}, "refused"),
}


@pytest.mark.parametrize("case", list(ARCHIVES))
def test_rewritten_archives(case, tmp_path):
    entry, options, expected = ARCHIVES[case]
    path = _rezip(_base(tmp_path), str(tmp_path / "case.pt"), entry, **options)
    assert verdict(path, _view, str(tmp_path / "w"), expect=expected)


def test_data_pkl_at_the_root_refused_for_its_folder(tmp_path):
    """torch.load needs data.pkl in a folder: the refusal says so, not that the first entry is elsewhere."""
    from fastflip.errors import FormatError
    from fastflip.files.formats.torchsave import read_torch_layout
    path = _rezip(_base(tmp_path), str(tmp_path / "root.pt"), lambda n, d: [(n.split("/", 1)[1], d, STORED)])
    with pytest.raises(FormatError, match="needs exactly one <name>/data.pkl"):
        read_torch_layout(path)


def test_unreadable_version_record_one_line(tmp_path, monkeypatch):
    """An OSError while the version record is read is the one-line damaged-archive refusal, not a traceback."""
    from fastflip.errors import FormatError
    from fastflip.files.formats import torchsave
    real = torchsave.entry_data

    def failing(path, entry, fh):  # type: ignore[no-untyped-def]
        if entry.name.endswith("/version"):
            raise OSError(5, "Input/output error")
        return real(path, entry, fh)
    monkeypatch.setattr(torchsave, "entry_data", failing)
    with pytest.raises(FormatError, match="damaged torch.save archive.*nothing was read"):
        torchsave.read_torch_layout(_base(tmp_path))


# --------------------------------------------------------------------------------------------
# the pickle: what torch's weights-only unpickler refuses, fastflip refuses


@pytest.mark.parametrize("protocol, expected", [(2, "agrees"), (3, "agrees"), (4, "refused"), (5, "refused")])
@pytest.mark.parametrize("legacy", [False, True])
def test_pickle_protocols(protocol, expected, legacy, tmp_path):
    """torch.load(weights_only=True) reads protocol 2's opcodes only (protocol 3 without bytes is the same);
    protocol 4 frames it refuses, and the legacy format's protocol 3 header too."""
    torch = require("torch")
    path = _save(str(tmp_path / "p.pt"), {"w": torch.ones(3), "s": "abc"}, pickle_protocol=protocol,
                 _use_new_zipfile_serialization=not legacy)
    assert verdict(path, _view, str(tmp_path / "w"), expect="refused" if legacy and protocol > 2 else expected)


@pytest.mark.parametrize("value", [frozenset({1}), slice(1, 2)])
def test_globals_torch_does_not_allow_refused(value, tmp_path):
    torch = require("torch")
    path = _save(str(tmp_path / "g.pt"), {"w": torch.ones(3), "x": value})
    assert verdict(path, _view, str(tmp_path / "w"), expect="refused")


def test_untyped_storage_by_another_name_refused(tmp_path):
    """torch allows torch.storage.UntypedStorage, not torch.UntypedStorage."""
    path = _patch_pickle(_uint16(tmp_path), str(tmp_path / "n.pt"), b"torch.storage\nUntypedStorage",
                         b"torch\nUntypedStorage")
    assert verdict(path, _view, str(tmp_path / "w"), expect="refused")


def test_untyped_storage_shared_by_two_dtypes_agrees(tmp_path):
    """A uint32 tensor named onto the uint16 tensor's untyped storage: torch reinterprets the bytes; fastflip lists
    the first and skips the second as a view inside it."""
    torch = require("torch")
    src = _save(str(tmp_path / "two.pt"), {"a": torch.tensor([1, 2, 300, 4], dtype=torch.uint16),
                                           "b": torch.tensor([5, 70000], dtype=torch.uint32)})
    path = _patch_pickle(src, str(tmp_path / "shared.pt"), b"X\x01\x00\x00\x001", b"X\x01\x00\x00\x000")
    assert verdict(path, _view, str(tmp_path / "w"), expect="agrees", skipped=["/b"])


def test_big_endian_untyped_storage_refused(tmp_path):
    """torch swaps a big-endian storage by its element: an untyped storage's bytes stay as they are, so its uint16
    words read otherwise than fastflip's big-endian words."""
    big = str(tmp_path / "big.pt")
    big_endian_archive(_uint16(tmp_path), big, itemsize=2)
    assert verdict(big, _view, str(tmp_path / "w"), expect="refused")


@pytest.mark.parametrize("obj", ["int and str keys", "a '/' key and a nested key"])
def test_two_tensors_under_one_key_path_refused(obj, tmp_path):
    """{1: a, '1': b} and {'a/b': a, 'a': {'b': b}}: torch returns both tensors, fastflip would name both alike."""
    torch = require("torch")
    a, b = torch.ones(4), torch.zeros(4)
    saved = {1: a, "1": b} if obj == "int and str keys" else {"a/b": a, "a": {"b": b}}
    path = _save(str(tmp_path / "k.pt"), saved)
    assert verdict(path, _view, str(tmp_path / "w"), expect="refused")


F32 = np.arange(16, dtype="<f4").tobytes()


@pytest.mark.parametrize("stride", [(1,), (4, 1, 1)], ids=["fewer strides", "more strides"])
def test_strides_not_one_a_dimension_refused(stride, tmp_path):
    """torch refuses a record whose strides do not match its dimensions; fastflip skipped it as non-contiguous and
    read the rest of a file torch does not load."""
    rec = {"w": T(SRef("0", 16), 0, (4,), (1,)), "v": T(SRef("0", 16), 0, (2, 4), stride)}
    path = str(tmp_path / "s.pt")
    with open(path, "wb") as fh:
        fh.write(torch_zip_bytes(torch_pickle(rec), {"0": F32}))
    assert verdict(path, _view, str(tmp_path / "w"), expect="refused")


def _located(tmp_path, location: bytes) -> str:
    path = str(tmp_path / "loc.pt")
    with open(path, "wb") as fh:
        pkl = torch_pickle({"w": T(SRef("0", 16), 0, (16,), (1,))})
        fh.write(torch_zip_bytes(pkl.replace(b"X\x03\x00\x00\x00cpu", b"X" + struct.pack("<I", len(location))
                                             + location), {"0": F32}))
    return path


def test_storage_on_a_device_torch_does_not_restore_refused(tmp_path):
    assert verdict(_located(tmp_path, b"xyz"), _view, str(tmp_path / "w"), expect="refused")


def test_storage_saved_on_cuda_agrees_with_map_location_cpu(tmp_path):
    """A checkpoint saved on a GPU: read as torch.load(weights_only=True, map_location="cpu") reads it."""
    torch = require("torch")

    def view(p: str) -> dict[str, np.ndarray]:
        return state_dict_view(torch.load(p, weights_only=True, map_location="cpu"))

    assert verdict(_located(tmp_path, b"cuda:0"), view, str(tmp_path / "w"), expect="agrees")
