"""Builders of hostile checkpoints for the reader tests: raw zips, torch pickles, legacy torch files.

Zips are written by hand (stored entries, local headers, central directory) so that a test can
place entries where a normal writer never would: twice under one name, or one inside another.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
import zlib

__all__ = ["Entry", "raw_zip", "nested_zip", "SRef", "T", "torch_pickle", "torch_zip_bytes", "torch_legacy_bytes"]


class Entry:
    """One stored zip entry: its name, data and general-purpose flags."""

    def __init__(self, name: str, data: bytes, flags: int = 0, attr: int = 0) -> None:
        self.name, self.data, self.flags, self.attr = name, data, flags, attr

    def local(self) -> bytes:
        n = self.name.encode()
        return struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, self.flags, 0, 0, 0, zlib.crc32(self.data),
                           len(self.data), len(self.data), len(n), 0) + n

    def central(self, at: int) -> bytes:
        n = self.name.encode()
        return struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, self.flags, 0, 0, 0, zlib.crc32(self.data),
                           len(self.data), len(self.data), len(n), 0, 0, 0, 0, self.attr, at) + n


def _finish(body: bytes, cds: list[bytes]) -> bytes:
    cd = b"".join(cds)
    return body + cd + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(cds), len(cds), len(cd), len(body), 0)


def raw_zip(entries: list[Entry]) -> bytes:
    """A zip of stored entries in order (names may repeat)."""
    body, cds = b"", []
    for e in entries:
        cds.append(e.central(len(body)))
        body += e.local() + e.data
    return _finish(body, cds)


def nested_zip(outer: Entry, inner: Entry, rest: list[Entry] = ()) -> bytes:  # type: ignore[assignment]
    """A zip whose entry ``inner`` (local header and data) lies inside the data of ``outer``: overlapping entries."""
    pad = b"\0" * 16  # the outer entry's own data first, then the inner entry
    at = len(outer.local()) + len(outer.data) + len(pad)
    outer = Entry(outer.name, outer.data + pad + inner.local() + inner.data, outer.flags)
    body = outer.local() + outer.data
    cds = [outer.central(0), inner.central(at)]
    for e in rest:
        cds.append(e.central(len(body)))
        body += e.local() + e.data
    return _finish(body, cds)


class SRef:
    """A storage named by a persistent id (``view``: the legacy format's view metadata)."""

    def __init__(self, key: str, numel: int, storage: str = "FloatStorage", view: tuple | None = None) -> None:
        self.key, self.numel, self.storage, self.view = key, numel, storage, view


class _Global:
    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


class T:
    """A tensor record: ``torch._utils._rebuild_tensor_v2(storage, offset, shape, stride, False, OrderedDict())``."""

    def __init__(self, ref: SRef, offset: int, shape: tuple, stride: tuple) -> None:
        self.args = (ref, offset, tuple(shape), tuple(stride), False, collections.OrderedDict())


class _Pickler(pickle._Pickler):  # the pure-Python pickler: globals written by name, nothing imported
    def __init__(self, buf: io.BytesIO, legacy: bool) -> None:
        super().__init__(buf, protocol=2)
        self.legacy = legacy

    def persistent_id(self, o: object) -> tuple | None:
        if isinstance(o, SRef):
            pid = ("storage", _Global("torch", o.storage), o.key, "cpu", o.numel)
            return pid + (o.view,) if self.legacy else pid
        return None

    def save(self, obj: object, save_persistent_id: bool = True) -> None:
        if isinstance(obj, _Global):
            self.write(b"c" + obj.module.encode() + b"\n" + obj.name.encode() + b"\n")
            return
        if isinstance(obj, T):
            self.save(_Global("torch._utils", "_rebuild_tensor_v2"))
            self.save(obj.args)
            self.write(pickle.REDUCE)
            return
        super().save(obj, save_persistent_id)


def torch_pickle(obj: object, legacy: bool = False) -> bytes:
    """``obj`` pickled the way torch.save pickles it (T records become tensors), without torch."""
    buf = io.BytesIO()
    _Pickler(buf, legacy).dump(obj)
    return buf.getvalue()


def torch_zip_bytes(pkl: bytes, storages: dict[str, bytes], extra: list[Entry] = ()) -> bytes:  # type: ignore[assignment]
    """A torch.save zip archive (``archive/...``) holding ``pkl`` and the storages."""
    entries = [Entry("archive/data.pkl", pkl), Entry("archive/byteorder", b"little")]
    entries += [Entry(f"archive/data/{k}", b) for k, b in storages.items()] + list(extra)
    return raw_zip(entries + [Entry("archive/version", b"3\n")])


def torch_legacy_bytes(obj: object, storages: dict[str, tuple[bytes, int]]) -> bytes:
    """A legacy (pre-1.6) torch.save file: magic, protocol, sys_info, object, keys, then each storage."""
    out = [pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2), pickle.dumps(1001, protocol=2),
           pickle.dumps({"protocol_version": 1001, "little_endian": True,
                         "type_sizes": {"short": 2, "int": 4, "long": 4}}, protocol=2),
           torch_pickle(obj, legacy=True), pickle.dumps(sorted(storages), protocol=2)]
    for k in sorted(storages):
        data, itemsize = storages[k]
        out.append(struct.pack("<q", len(data) // itemsize) + data)
    return b"".join(out)
