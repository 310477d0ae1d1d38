"""Judge an injection by the framework's own reading, with the expected change worked out from the log alone.

A *reading* maps fastflip's tensor paths (``/a/b``) to the arrays a framework's loader returned
(``torch.load(weights_only=True)``, ``safetensors``, ``np.load``, ``h5py``): floats, integers, or the unsigned
words of a format NumPy lacks (bfloat16, float8), C-contiguous. Nothing here calls fastflip's readers: the log gives
each site's tensor, dtype, flat element index, masks and old/new words; the element's word is taken from the
framework's array (its dtype, byte order and C order), checked against the logged old word, the logged new word
is checked against the site's masks or scale rule, and it is written into the reading itself. Arrays the framework returned
sharing memory (tied weights, views into one storage) then see the change exactly as the framework shows it.

Typical use::

    expect = load(src)                          # the framework's reading of the input (changed by judge)
    assert_judged(expect, load(out), res.log)   # exactly the logged sites changed, as logged; nothing else

In place, take the reading before the inject (it must not map the file: the loaders of :mod:`framework_views`
read into memory).
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

import numpy as np

__all__ = ["logical_words", "apply_logged", "compare_readings", "copy_reading", "changed_sites", "judge",
           "assert_judged"]


def _word_dtype(a: np.ndarray) -> np.dtype:
    """The unsigned dtype of ``a``'s item size, in ``a``'s byte order."""
    order = a.dtype.byteorder if a.dtype.byteorder in "<>" else "="
    return np.dtype(f"u{a.dtype.itemsize}").newbyteorder(order)


def _word_view(a: np.ndarray) -> np.ndarray:
    """A flat view of ``a``'s stored words (same memory, same byte order): assigning an integer stores that word."""
    if not a.flags.c_contiguous:
        raise AssertionError(f"the framework returned a non-contiguous array {a.shape}: cannot name its elements")
    return a.reshape(-1).view(_word_dtype(a))


def logical_words(a: np.ndarray) -> np.ndarray:
    """The words of ``a``'s elements as uint64 (C order; byte order resolved: bit 0 is the value's lowest bit)."""
    return _word_view(np.ascontiguousarray(a)).astype(np.uint64)


def copy_reading(reading: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Independent copies of a reading's arrays (for a reading kept across an in-place change of the file)."""
    return {k: np.array(v, copy=True) for k, v in reading.items()}


def _order(dt: np.dtype) -> str:
    if dt.itemsize == 1 or dt.byteorder == "|":
        return "|"
    if dt.byteorder == "=":
        return "<" if sys.byteorder == "little" else ">"
    return dt.byteorder


def apply_logged(reading: dict[str, np.ndarray], log: Any) -> list[str]:
    """Check every logged site against ``reading`` and write its logged new word into it; return the problems.

    Checked per site: the tensor is one the framework returned, with the logged shape and word width (and, where
    the framework keeps a non-native byte order, the logged one); the framework's word at the flat index is the
    logged old word; the logged new word is ``((old & and_mask) | or_mask) ^ xor_mask`` for a bitwise site, and
    for a scaled one the element's value times the factor by the model's rule (:func:`_scaled`; a format NumPy lacks:
    :func:`_format_scaled`). A read-only array is replaced by a writable copy first.
    """
    plan = log.plan
    problems: list[str] = []
    old = np.asarray(log.old_words, np.uint64)
    new = np.asarray(log.new_words, np.uint64)
    scale = plan.scale if plan.scale is not None else np.full(len(plan), np.nan)
    for r in range(len(plan)):
        ref = plan.tensors[int(plan.tensor[r])]
        name, i = ref.name, int(plan.index[r])
        if name not in reading:
            problems.append(f"logged tensor {name} is not in the framework's reading ({sorted(reading)[:6]})")
            continue
        a = reading[name]
        if not a.flags.writeable:
            a = reading[name] = np.array(a, copy=True)
        dt = np.dtype(ref.dtype)
        if tuple(a.shape) != tuple(ref.shape) or a.dtype.itemsize != dt.itemsize:
            problems.append(f"{name}: the framework reads {a.dtype}{a.shape}, the log says {ref.dtype}{ref.shape}")
            continue
        if ref.format is None and a.dtype.kind != dt.kind and {a.dtype.kind, dt.kind} != {"b", "u"}:
            problems.append(f"{name}: the framework reads kind {a.dtype.kind!r}, the log says {ref.dtype}")
            continue
        if _order(a.dtype) == ">" and _order(dt) != ">":
            problems.append(f"{name}: the framework reads big-endian {a.dtype}, the log says {ref.dtype}")
            continue
        bits = 8 * dt.itemsize
        full = (1 << bits) - 1
        view = _word_view(a)
        if not 0 <= i < view.size:
            problems.append(f"{name}[{i}]: outside the framework's {view.size} elements")
            continue
        got = int(view[i])
        if got != int(old[r]):
            problems.append(f"{name}[{i}]: the framework reads word {got:#x}, the log's old word is {int(old[r]):#x}")
        if np.isnan(scale[r]):
            rule = (((int(old[r]) & int(plan.and_mask[r])) | int(plan.or_mask[r])) ^ int(plan.xor_mask[r])) & full
        else:
            rule = _scaled(a, i, float(scale[r])) if ref.format is None else _format_scaled(got, float(scale[r]),
                                                                                           ref.format)
        if rule != int(new[r]):
            problems.append(f"{name}[{i}]: the logged new word {int(new[r]):#x} is not the rule's {rule:#x} of the "
                            f"old word {int(old[r]):#x}")
        view[i] = int(new[r])
    return problems


def _scaled(a: np.ndarray, i: int, factor: float) -> int:
    """The word of ``a``'s element ``i`` times ``factor``, by the scale model's documented rule: the product in
    float64, rounded to a float dtype; for an integer rounded half away from zero and saturated at the limits."""
    value = a.reshape(-1)[i]
    if a.dtype.kind == "f":
        new = np.array([float(value) * factor]).astype(a.dtype)
    else:
        product = float(int(value)) * factor
        rounded = 0 if product != product else int(np.sign(product) * np.floor(abs(product) + 0.5))
        info = np.iinfo(a.dtype)
        new = np.array([min(max(rounded, int(info.min)), int(info.max))], a.dtype)
    return int(logical_words(new)[0])


def _format_scaled(word: int, factor: float, fmt: str) -> int:
    """The word of ``word`` (a bfloat16 / float8 word) times ``factor`` by the scale model's documented rule: the
    value decoded by ``ml_dtypes``, the product in float64 rounded once to the nearest value of the format (ties to
    the even word); beyond the largest finite value Inf, or that value where the format has no Inf (float8_e4m3fn
    saturates, as PyTorch converts); a NaN product the format's NaN. ``ml_dtypes``'s own cast is not used: it rounds
    float64 through float32 (twice)."""
    import ml_dtypes

    t = np.dtype(getattr(ml_dtypes, fmt))
    words = np.arange(1 << (8 * t.itemsize), dtype=f"u{t.itemsize}")
    with np.errstate(invalid="ignore"):
        values = words.view(t).astype(np.float64)
    x = float(values[word]) * factor
    if x != x:
        return int(np.array([np.nan]).astype(t).view(words.dtype)[0])
    sign = 1 << (8 * t.itemsize - 1)
    positive = values[:sign]
    finite = np.flatnonzero(np.isfinite(positive))  # increasing words, increasing values
    top, below = float(positive[finite[-1]]), float(positive[finite[-2]])
    neg = sign if np.copysign(1.0, x) < 0 else 0
    ax = abs(x)
    if ax >= top + (top - below) / 2:
        inf = np.flatnonzero(np.isinf(positive))
        return neg | int(inf[0] if len(inf) else finite[-1])
    k = int(np.searchsorted(positive[finite], ax))
    lo, hi = int(finite[max(k - 1, 0)]), int(finite[min(k, len(finite) - 1)])
    dlo, dhi = ax - float(positive[lo]), float(positive[hi]) - ax
    return neg | (lo if dlo < dhi or (dlo == dhi and lo % 2 == 0) else hi)


def compare_readings(expect: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]) -> list[str]:
    """The differences (empty when none) between two readings: tensor names, shapes, word widths, and every word."""
    problems: list[str] = []
    if set(expect) != set(got):
        problems.append(f"the framework reads other tensors: {sorted(set(expect) ^ set(got))[:6]}")
    for name in sorted(set(expect) & set(got)):
        a, b = np.asarray(expect[name]), np.asarray(got[name])
        if a.shape != b.shape or a.dtype.itemsize != b.dtype.itemsize:
            problems.append(f"{name}: {a.dtype}{a.shape} expected, the framework reads {b.dtype}{b.shape}")
            continue
        wa, wb = logical_words(a), logical_words(b)
        diff = np.flatnonzero(wa != wb)
        if len(diff):
            k = int(diff[0])
            problems.append(f"{name}: {len(diff)} element(s) differ, first [{k}]: expected word {int(wa[k]):#x}, "
                            f"the framework reads {int(wb[k]):#x}")
    return problems


def changed_sites(log: Any) -> int:
    """How many logged sites change their word (a test whose file must change asserts this is positive)."""
    return int(np.count_nonzero(np.asarray(log.old_words, np.uint64) != np.asarray(log.new_words, np.uint64)))


def judge(expect: dict[str, np.ndarray], got: Mapping[str, np.ndarray], log: Any,
          require_change: bool = True) -> list[str]:
    """The problems (empty when none) of ``got``, the framework's reading after an injection, against ``expect``,
    its reading before (changed in place by :func:`apply_logged`): every site must be as logged, every other
    element bit-identical, and (``require_change``) some logged site must change its word."""
    problems = [] if changed_sites(log) or not require_change else ["no logged site changes its word"]
    return problems + apply_logged(expect, log) + compare_readings(expect, got)


def assert_judged(expect: dict[str, np.ndarray], got: Mapping[str, np.ndarray], log: Any,
                  require_change: bool = True, what: object = None) -> None:
    """Assert that :func:`judge` finds no problem; the message holds the first eight (after ``what``, if given)."""
    problems = judge(expect, got, log, require_change)
    assert not problems, problems[:8] if what is None else (what, problems[:8])
