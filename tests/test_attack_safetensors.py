"""safetensors files that the safetensors library reads or refuses: fastflip agrees element by element, or refuses
in one line (tests/attack_check.py).

The files are written here byte by byte (8-byte length, JSON header, data), so headers a writer never produces
(gaps, trailing bytes, odd metadata, non-JSON constants) can be tried; the library's own reading
(``safetensors.numpy.load_file``, ``safetensors.torch`` for the formats NumPy lacks) is the judge.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from attack_check import verdict
from conftest import require
from framework_views import st_numpy_view, st_torch_view

A = np.arange(4, dtype="<f4").tobytes()
B = np.arange(2, dtype="<f4").tobytes()


def _e(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def _file(tmp_path, header: dict | bytes, data: bytes, pad: bytes = b"") -> str:  # type: ignore[no-untyped-def]
    """A safetensors file: ``header`` (a dict, or the header's exact bytes) plus ``pad``, then ``data``."""
    h = (header if isinstance(header, bytes) else json.dumps(header).encode()) + pad
    p = str(tmp_path / "case.safetensors")
    with open(p, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + data)
    return p


ONE = {"a": _e("F32", [4], 0, 16)}
RAW = b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}'

CASES = {  # case -> (header, data, pad, expected verdict)
    "two tensors": ({"a": _e("F32", [4], 0, 16), "b": _e("F32", [2], 16, 24)}, A + B, b"", "agrees"),
    "entries out of offset order": ({"b": _e("F32", [2], 16, 24), "a": _e("F32", [4], 0, 16)}, A + B, b"", "agrees"),
    "header padded with spaces": (ONE, A, b"      ", "agrees"),
    "header padded with newline and tab": (ONE, A, b"\n\t ", "agrees"),
    "string metadata": ({"__metadata__": {"format": "pt"}, **ONE}, A, b"", "agrees"),
    "null metadata": ({"__metadata__": None, **ONE}, A, b"", "agrees"),
    "only metadata, no tensors": ({"__metadata__": {"a": "b"}}, b"", b"", "agrees"),
    "empty header": ({}, b"", b"", "agrees"),
    "0-element tensors at the ends": ({"z": _e("F32", [0], 0, 0), "a": _e("F32", [4], 0, 16),
                                       "y": _e("F32", [3, 0], 16, 16)}, A, b"", "agrees"),
    "0-d tensor": ({"s": _e("F32", [], 0, 4)}, A[:4], b"", "agrees"),
    "unknown field in an entry": (RAW[:-2] + b', "x": 1}}', A, b"", "agrees"),
    "names: non-ASCII, empty, with '/'": ({"\u00e9\u4e2d": _e("F32", [4], 0, 16), "": _e("F32", [2], 16, 24),
                                          "a/b": _e("F32", [2], 24, 32)}, A + B + B, b"", "agrees"),
    "name given as a \\u escape": (RAW.replace(b'"a"', b'"\\u0061"'), A, b"", "agrees"),
    "BOOL words 2 and 255": ({"x": _e("BOOL", [4], 0, 4)}, bytes([0, 1, 2, 255]), b"", "agrees"),
    "a dtype fastflip skips (C64)": ({"c": _e("C64", [1], 0, 8), "a": _e("F32", [4], 8, 24)}, b"\1" * 8 + A, b"",
                                     "agrees"),
    "overlapping ranges": ({"a": _e("F32", [4], 0, 16), "b": _e("F32", [2], 8, 16)}, A, b"", "refused"),
    "a key given twice": (RAW[:-1] + b', "a": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}', A + A, b"",
                          "refused"),
    "size disagrees with shape": ({"a": _e("F32", [3], 0, 16)}, A, b"", "refused"),
    "header padded with NULs": (ONE, A, b"\0\0\0", "refused"),
    "header starting with a space": (b" " + RAW, A, b"", "refused"),
    "float offsets": (RAW.replace(b"[0, 16]", b"[0.0, 16]"), A, b"", "refused"),
    "float shape": (RAW.replace(b"[4]", b"[4.0]"), A, b"", "refused"),
    "header not UTF-8": (RAW.replace(b'"a"', b'"a\xff"'), A, b"", "refused"),
    # the library refuses these; fastflip used to read them
    "a gap between tensors": ({"a": _e("F32", [4], 0, 16), "b": _e("F32", [2], 20, 28)}, A + b"\0" * 4 + B, b"",
                              "refused"),
    "a gap before the first tensor": ({"a": _e("F32", [4], 4, 20)}, b"\0" * 4 + A, b"", "refused"),
    "bytes after the last tensor": (ONE, A + b"\0" * 4, b"", "refused"),
    "a 0-element tensor inside another's range": ({"a": _e("F32", [4], 0, 16), "z": _e("F32", [0], 4, 4)}, A, b"",
                                                  "refused"),
    "integer metadata value": ({"__metadata__": {"format": 1}, **ONE}, A, b"", "refused"),
    "metadata a list": ({"__metadata__": ["x"], **ONE}, A, b"", "refused"),
    "a dtype the library does not know": ({"x": _e("Q9", [4], 0, 4), "a": _e("F32", [4], 4, 20)}, b"\1" * 4 + A,
                                          b"", "refused"),
    "6-bit floats not ending on a byte": ({"x": _e("F6_E2M3", [4], 0, 4)}, b"\1" * 4, b"", "refused"),
    "NaN in the header": (RAW[:1] + b'"__metadata__": {"x": NaN}, ' + RAW[1:], A, b"", "refused"),
    "a lone surrogate escape": (RAW.replace(b'"a"', b'"\\ud800"'), A, b"", "refused"),
}


#: The tensors fastflip skips, by case (every other case: none).
SKIPPED = {"0-element tensors at the ends": ["/y", "/z"], "a dtype fastflip skips (C64)": ["/c"]}
#: The cases whose header lists no tensor.
EMPTY = {"only metadata, no tensors", "empty header"}


@pytest.mark.parametrize("case", list(CASES))
def test_headers(case, tmp_path):
    header, data, pad, expected = CASES[case]
    require("safetensors.numpy")
    path = _file(tmp_path, header, data, pad)
    assert verdict(path, st_numpy_view, str(tmp_path / "w"), expect=expected, skipped=SKIPPED.get(case, []),
                   empty=case in EMPTY)


@pytest.mark.parametrize("dtype, npdt", [("U64", "<u8"), ("I8", "|i1"), ("F64", "<f8"), ("U16", "<u2"),
                                         ("U32", "<u4"), ("I16", "<i2"), ("F16", "<f2"), ("I64", "<i8")])
def test_integer_and_float_dtypes_agree(dtype, npdt, tmp_path):
    require("safetensors.numpy")
    arr = np.array([1, 0, 3, 7], dtype=npdt)
    path = _file(tmp_path, {"x": _e(dtype, [2, 2], 0, arr.nbytes)}, arr.tobytes())
    assert verdict(path, st_numpy_view, str(tmp_path / "w"), expect="agrees")


@pytest.mark.framework
@pytest.mark.parametrize("dtype, nbytes", [("BF16", 8), ("F8_E4M3", 4), ("F8_E5M2", 4)])
def test_formats_numpy_lacks_agree(dtype, nbytes, tmp_path):
    """Read by safetensors.torch, the words compared with fastflip's at its offsets."""
    require("torch")
    path = _file(tmp_path, {"x": _e(dtype, [4], 0, nbytes), "a": _e("F32", [4], nbytes, nbytes + 16)},
                 bytes(range(1, nbytes + 1)) + A)
    assert verdict(path, st_torch_view, str(tmp_path / "w"), expect="agrees")
