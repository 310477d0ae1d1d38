"""Bounds on a pickle before it is unpickled, and on the walk of what it built.

Layer: ``files`` (may import core, kernels and files; imported by live and above).

A pickle of a few hundred bytes can ask for gigabytes: a memo index of 2**27 makes the C
unpickler grow its memo table to that size, and a chain of lists each holding the
previous one twice is a DAG of a few nodes but 2**40 paths. :func:`scan_pickle` reads the
opcodes (``pickletools.genops``: decoding only, nothing is built) and refuses a pickle with
more than :data:`MAX_OPS` opcodes or a memo index beyond the opcodes read so far (a pickler
numbers its memo entries in order). :func:`walk_tensors` walks the unpickled object with a
visited set (each container once, under the first path that reaches it), a node bound
and a depth bound.

Examples
--------
>>> import pickle
>>> scan_pickle(pickle.dumps({"a": [1, 2]}, protocol=2), "ok.pt") <= TORCH_OPCODES
True
>>> sorted(scan_pickle(pickle.dumps({"a": [1, 2]}, protocol=4), "ok.pt") - TORCH_OPCODES)
['FRAME', 'MEMOIZE', 'SHORT_BINUNICODE']
>>> bomb = b"\\x80\\x04]r\\x00\\x00\\x00\\x08." # an empty list stored at memo index 2**27
>>> try:
...     scan_pickle(bomb, "bomb.pt")
... except FormatError as e:
...     print(str(e)[:63])
bomb.pt: the pickle stores memo entry 134217728 after 3 opcodes
"""

from __future__ import annotations

import pickletools
import warnings
from typing import Any, Callable, Sequence

from ...errors import FormatError

__all__ = ["MAX_OPS", "MAX_NODES", "MAX_DEPTH", "TORCH_OPCODES", "scan_pickle", "walk_tensors"]

MAX_OPS = 50_000_000  # opcodes of one pickle (a state_dict of 100,000 tensors takes about 3 million)
MAX_NODES = 10_000_000  # container entries visited by the walk
MAX_DEPTH = 64  # nesting of containers
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
#: The opcodes ``torch.load(weights_only=True)`` reads (``torch._weights_only_unpickler``: the pickle protocol 2 that
#: ``torch.save`` writes); a pickle holding any other (``pickle_protocol=4``'s FRAME, STACK_GLOBAL, ...) it refuses.
TORCH_OPCODES = frozenset((
    "GLOBAL", "NEWOBJ", "REDUCE", "BUILD", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "MARK", "TUPLE", "TUPLE1",
    "TUPLE2", "TUPLE3", "NONE", "NEWFALSE", "NEWTRUE", "EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET",
    "BININT", "BININT1", "BININT2", "BINFLOAT", "BINUNICODE", "SHORT_BINSTRING", "BINPERSID", "BINGET",
    "LONG_BINGET", "BINPUT", "LONG_BINPUT", "LONG1", "PROTO", "STOP"))


def scan_pickle(data: Any, where: str) -> frozenset[str]:
    """Refuse (one line) a pickle whose opcodes would make the unpickler allocate beyond its size; return the names
    of the opcodes it holds (for :data:`TORCH_OPCODES`).

    ``data`` is the pickle's bytes or a binary stream at its start (left after its STOP).

    Raises
    ------
    FormatError
        Too many opcodes, a memo index beyond the opcodes read so far, or an undecodable opcode stream.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # a crafted STRING argument's escapes
            return _scan(data, where)
    except FormatError:
        raise
    except (ValueError, OverflowError, MemoryError, EOFError, UnicodeError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise FormatError(f"{where}: the pickle cannot be read ({type(exc).__name__}: {first})") from None


def _scan(data: Any, where: str) -> frozenset[str]:
    n = 0
    ops: set[str] = set()
    for op, arg, _pos in pickletools.genops(data if isinstance(data, (bytes, bytearray)) else _Capped(data)):
        n += 1
        ops.add(op.name)
        if n > MAX_OPS:
            raise FormatError(f"{where}: the pickle holds more than {MAX_OPS} opcodes; refusing it")
        if op.name in _PUTS and not (isinstance(arg, int) and 0 <= arg <= n):
            raise FormatError(f"{where}: the pickle stores memo entry {arg} after {n} opcodes (a pickler "
                              "numbers them in order); the file is damaged or crafted")
    return frozenset(ops)


class _Capped:
    """A binary stream whose reads stop at its end without asking for more (a declared length of 2**62 bytes
    is never allocated)."""

    def __init__(self, fh: Any) -> None:
        self.fh = fh
        here = fh.tell()
        self.end = fh.seek(0, 2)
        fh.seek(here)

    def read(self, n: int = -1) -> bytes:
        left = self.end - self.fh.tell()
        return self.fh.read(left if n < 0 else min(n, left))

    def readline(self) -> bytes:
        return self.fh.readline(1 << 20)

    def tell(self) -> int:
        return self.fh.tell()


def _key_text(k: Any) -> str:
    if isinstance(k, str):
        return k
    if isinstance(k, int) and not isinstance(k, bool) and abs(k) < 10**18:
        return str(k)
    if isinstance(k, (bool, float, type(None))):
        return repr(k)
    raise FormatError(f"saved object with a dictionary key of type {type(k).__name__} (keys are names or "
                      "small integers)")


def walk_tensors(obj: Any, is_leaf: Callable[[Any], bool],
                 parts: Callable[[Any], Sequence[tuple[str, Any]]] | None = None) -> list[tuple[str, Any]]:
    """[(key path, leaf)] of every leaf below ``obj`` through dicts, lists and tuples, in walk order.

    ``parts(leaf)``, when given, names a leaf's own inner leaves (a quantized tensor's per-channel scales and
    zero points), listed under ``<leaf path>/<name>`` right after the leaf.

    Each container is entered once (a visited set by identity): a container reached again
    through another path adds nothing, so shared references cost one visit. A leaf reached
    through two paths is listed under both (tied weights).

    Raises
    ------
    FormatError
        More than :data:`MAX_NODES` entries, or nesting deeper than :data:`MAX_DEPTH`.
    """
    out: list[tuple[str, Any]] = []
    seen: set[int] = set()
    nodes = 0
    stack: list[tuple[Any, str, int]] = [(obj, "", 0)]
    while stack:
        o, prefix, depth = stack.pop()
        if is_leaf(o):
            out.append((prefix or "/", o))
            if parts is not None:
                stack.extend((v, f"{prefix}/{k}", depth + 1) for k, v in reversed(tuple(parts(o))))
            continue
        if isinstance(o, dict):
            items = [(_key_text(k), v) for k, v in o.items()]
        elif isinstance(o, (list, tuple)):
            items = [(str(i), v) for i, v in enumerate(o)]
        else:
            continue
        if id(o) in seen:
            continue
        seen.add(id(o))
        if depth >= MAX_DEPTH:
            raise FormatError(f"saved object nested more than {MAX_DEPTH} levels deep")
        nodes += len(items)
        if nodes > MAX_NODES:
            raise FormatError(f"saved object with more than {MAX_NODES} container entries; refusing it")
        stack.extend((v, f"{prefix}/{k}", depth + 1) for k, v in reversed(items))
    return out
