""".npy files and .npz archives that np.load reads or refuses: fastflip agrees element by element, or refuses in
one line (tests/attack_check.py).

Arrays are written by NumPy (``np.save``, ``write_array`` at header versions 1-3, ``np.savez``), archives by
``zipfile`` member by member (stored, deflated, bzip2, zip64 fields, data descriptors), and headers by hand where
NumPy would not write them.
"""

from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
import pytest

from attack_check import verdict
from framework_views import np_view
from test_zip_member_crc import bad_crc

A = np.arange(12, dtype="<f4").reshape(3, 4)
B = np.arange(5, dtype=">i8")
S, Z = zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED


def _npy(arr: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, version=version, allow_pickle=True)
    return buf.getvalue()


def _header(d: dict, pad_to: int = 64) -> bytes:
    """A version-1 .npy header holding ``repr(d)`` (padded to ``pad_to`` bytes; 1: not aligned)."""
    h = repr(d).encode()
    h += b" " * ((-(10 + len(h) + 1)) % pad_to) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h


def _version(npy: bytes, major: int, minor: int) -> bytes:
    """``npy`` with its magic's format version bytes set to ``major.minor``."""
    return npy[:6] + bytes([major, minor]) + npy[8:]


def _write(tmp_path, name: str, data: bytes) -> str:  # type: ignore[no-untyped-def]
    p = str(tmp_path / name)
    with open(p, "wb") as fh:
        fh.write(data)
    return p


NPY = {  # case -> (file bytes, expected verdict)
    "C order": (_npy(A), "agrees"),
    "Fortran order, 2-d (skipped)": (_npy(np.asfortranarray(A)), "agrees"),
    "Fortran order, 3x1": (_npy(np.asfortranarray(A[:, :1])), "agrees"),
    "Fortran flag on a 1-d array": (_header({"descr": "<f4", "fortran_order": True, "shape": (12,)}) + A.tobytes(),
                                    "agrees"),
    "big-endian float32": (_npy(A.astype(">f4")), "agrees"),
    "big-endian int64": (_npy(B), "agrees"),
    "structured dtype (skipped)": (_npy(np.zeros(3, dtype=[("x", "<f4"), ("y", "<i4")])), "agrees"),
    "sub-array field (skipped)": (_header({"descr": [("", "<f4", (2,))], "fortran_order": False, "shape": (3,)})
                                  + np.arange(6, dtype="<f4").tobytes(), "agrees"),
    "0-d array": (_npy(np.float64(3.5)), "agrees"),
    "0-element array": (_npy(np.zeros((3, 0))), "agrees"),
    "header version 2": (_npy(A, (2, 0)), "agrees"),
    "header version 3": (_npy(A, (3, 0)), "agrees"),
    "bytes after the data": (_npy(A) + b"\0" * 8, "agrees"),
    "header not aligned": (_header({"descr": "<f4", "fortran_order": False, "shape": (3, 4)}, pad_to=1) + A.tobytes(),
                           "agrees"),
    "descr '=f4'": (_header({"descr": "=f4", "fortran_order": False, "shape": (3, 4)}) + A.tobytes(), "agrees"),
    "descr '|f4'": (_header({"descr": "|f4", "fortran_order": False, "shape": (3, 4)}) + A.tobytes(), "agrees"),
    "float16": (_npy(np.arange(4, dtype="<f2")), "agrees"),
    "complex64 (skipped)": (_npy(np.arange(4, dtype="<c8")), "agrees"),
    "object array": (_npy(np.array([1, "a", None], dtype=object)), "refused"),
    "data cut short": (_npy(A)[:-4], "refused"),
    "an extra header key": (_header({"descr": "<f4", "fortran_order": False, "shape": (3, 4), "x": 1}) + A.tobytes(),
                            "refused"),
    "fortran_order 1 (not a bool)": (_header({"descr": "<f4", "fortran_order": 1, "shape": (3, 4)}) + A.tobytes(),
                                     "refused"),
    "shape a list": (_header({"descr": "<f4", "fortran_order": False, "shape": [3, 4]}) + A.tobytes(), "refused"),
    "shape holding True": (_header({"descr": "<f4", "fortran_order": False, "shape": (True, 4)}) + A.tobytes(),
                           "refused"),
    # np.load refuses these; fastflip used to read them
    "header version 1.1": (_version(_npy(A), 1, 1), "refused"),
    "header version 2.1": (_version(_npy(A, (2, 0)), 2, 1), "refused"),
    "a header over 10,000 bytes": (_header({"descr": "<f4", "fortran_order": False, "shape": (3, 4)},
                                           pad_to=16384) + A.tobytes(), "refused"),
}


#: The .npy cases whose one array fastflip skips (so it lists nothing to inject).
NPY_SKIPPED = {"Fortran order, 2-d (skipped)", "structured dtype (skipped)", "sub-array field (skipped)",
               "0-element array", "complex64 (skipped)", "object array"}


@pytest.mark.parametrize("case", list(NPY))
def test_npy(case, tmp_path):
    data, expected = NPY[case]
    skipped = case in NPY_SKIPPED
    assert verdict(_write(tmp_path, "case.npy", data), np_view, str(tmp_path / "w"), expect=expected,
                   skipped=["/array"] if skipped else [], empty=skipped)


@pytest.mark.parametrize("arr, skipped", [(np.array([True, False]), False), (np.arange(4, dtype="u1"), False),
                                          (np.array(["2020-01-01"], dtype="datetime64[D]"), True),
                                          (np.arange(3, dtype=np.longdouble), True), (np.array(["ab", "c"]), True),
                                          (np.zeros(3, dtype="V4"), True)], ids=str)
def test_npy_other_dtypes(arr, skipped, tmp_path):
    assert verdict(_write(tmp_path, "case.npy", _npy(arr)), np_view, str(tmp_path / "w"), expect="agrees",
                   skipped=["/array"] if skipped else [], empty=skipped)


def _zip(members: list[tuple[str, bytes, int]], comment: bytes = b"", zip64: bool = False) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data, method in members:
            zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = method
            with z.open(zi, "w", force_zip64=zip64) as fh:
                fh.write(data)
        z.comment = comment
    return buf.getvalue()


class _Unseekable(io.RawIOBase):
    """A sink zipfile cannot seek in: it writes each member's sizes in a data descriptor after its data."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[no-untyped-def, override]
        self.data += b
        return len(b)


def _streamed(members: list[tuple[str, bytes]], method: int) -> bytes:
    sink = _Unseekable()
    with zipfile.ZipFile(sink, "w", compression=method) as z:
        for name, data in members:
            with z.open(name, "w") as fh:
                fh.write(data)
    return bytes(sink.data)


def _savez(compressed: bool) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, a=A, b=B)
    return buf.getvalue()


def _crc_damaged(data: bytes, name: str) -> bytes:
    """The archive ``data`` with member ``name``'s recorded CRC-32 no longer that of its bytes."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return bad_crc(data, z.getinfo(name))


NPZ = {  # case -> (archive bytes, expected verdict)
    "np.savez": (_savez(False), "agrees"),
    "np.savez_compressed": (_savez(True), "agrees"),
    "stored and deflated members": (_zip([("a.npy", _npy(A), S), ("b.npy", _npy(B), Z)]), "agrees"),
    "a member in a folder": (_zip([("sub/a.npy", _npy(A), S)]), "agrees"),
    "Fortran-ordered members": (_zip([("a.npy", _npy(np.asfortranarray(A)), S),
                                      ("b.npy", _npy(np.asfortranarray(A)), Z)]), "agrees"),
    "header versions 2 and 3": (_zip([("a.npy", _npy(A, (2, 0)), S), ("b.npy", _npy(A, (3, 0)), Z)]), "agrees"),
    "0-d and 0-element members": (_zip([("s.npy", _npy(np.float32(2.5)), S), ("e.npy", _npy(np.zeros((0, 3))), S)]),
                                  "agrees"),
    "bytes after a member's data": (_zip([("a.npy", _npy(A) + b"\0" * 8, S), ("b.npy", _npy(B) + b"\0" * 8, Z)]),
                                    "agrees"),
    "a structured member": (_zip([("s.npy", _npy(np.zeros(2, dtype=[("x", "<f4")])), S), ("b.npy", _npy(B), S)]),
                            "agrees"),
    "bzip2 and lzma members (skipped)": (_zip([("a.npy", _npy(A), zipfile.ZIP_BZIP2), ("c.npy", _npy(A), zipfile.ZIP_LZMA),
                                               ("b.npy", _npy(B), S)]), "agrees"),
    "an archive comment": (_zip([("a.npy", _npy(A), S)], comment=b"hi"), "agrees"),
    "keys differing in case": (_zip([("a.npy", _npy(A), S), ("A.npy", _npy(A * 2), S)]), "agrees"),
    "a member named a.npy.npy": (_zip([("a.npy.npy", _npy(A), S)]), "agrees"),
    "zip64 fields, stored": (_zip([("a.npy", _npy(A), S)], zip64=True), "agrees"),
    "zip64 fields, deflated": (_zip([("a.npy", _npy(A), Z)], zip64=True), "agrees"),
    "data descriptors, stored": (_streamed([("a.npy", _npy(A)), ("b.npy", _npy(B))], S), "agrees"),
    "data descriptors, deflated": (_streamed([("a.npy", _npy(A)), ("b.npy", _npy(B))], Z), "agrees"),
    "a member without .npy": (_zip([("a", _npy(A), S), ("b.npy", _npy(B), S)]), "refused"),
    "a text member": (_zip([("readme.txt", b"hello", S), ("b.npy", _npy(B), S)]), "refused"),
    "a .npy member that is not one": (_zip([("x.npy", b"hello world", S), ("b.npy", _npy(B), S)]), "refused"),
    "a member cut short": (_zip([("a.npy", _npy(A)[:-4], S)]), "refused"),
    "no members": (_zip([]), "refused"),
    "bytes before the archive": (b"\0" * 64 + _savez(False), "refused"),
    "a stored member of header version 1.1": (_zip([("a.npy", _version(_npy(A), 1, 1), S)]), "refused"),
    "a deflated member of header version 1.1": (_zip([("a.npy", _version(_npy(A), 1, 1), Z)]), "refused"),
    # np.load (zipfile) refuses a member whose bytes do not match its CRC-32; fastflip used to flip it
    "a stored member failing its CRC-32": (_crc_damaged(_zip([("a.npy", _npy(A), S)]), "a.npy"), "refused"),
    "a deflated member failing its CRC-32": (_crc_damaged(_zip([("a.npy", _npy(A), Z)]), "a.npy"), "refused"),
}


#: The members fastflip skips, by .npz case (every other case: none).
NPZ_SKIPPED = {"Fortran-ordered members": ["/a", "/b"], "0-d and 0-element members": ["/e"],
               "a structured member": ["/s"], "bzip2 and lzma members (skipped)": ["/a", "/c"]}
#: The .npz cases that list no member to inject.
NPZ_EMPTY = {"Fortran-ordered members"}


@pytest.mark.parametrize("case", list(NPZ))
def test_npz(case, tmp_path):
    data, expected = NPZ[case]
    assert verdict(_write(tmp_path, "case.npz", data), np_view, str(tmp_path / "w"), expect=expected,
                   skipped=NPZ_SKIPPED.get(case, []), empty=case in NPZ_EMPTY)


def _loadable_members(path: str) -> dict[str, np.ndarray]:
    """np.load's reading of the members it reads without pickles (an object member it refuses alone)."""
    out = {}
    with np.load(path, allow_pickle=False) as z:
        for k in z.files:
            try:
                out["/" + k] = z[k]
            except ValueError:
                pass
    return out


def test_npz_object_member_skipped_others_agree(tmp_path):
    data = _zip([("o.npy", _npy(np.array([1, None], dtype=object)), S), ("b.npy", _npy(B), S),
                 ("a.npy", _npy(A), Z)])
    path = _write(tmp_path, "case.npz", data)
    assert verdict(path, _loadable_members, str(tmp_path / "w"), expect="agrees", skipped=["/o"])
