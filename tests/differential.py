"""The differential check of the reader tests: what a framework's own loader sees before and after an inject,
compared with the log's records (every logged flip, and nothing else).

``before`` and ``after`` map tensor names (fastflip's paths: ``/a/b``) to the stored words the framework
loaded (unsigned integer arrays, C order). A change under a name that no record names is allowed only where
fastflip's layout says the bytes are shared with a listed tensor (a skipped view inside it).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

__all__ = ["words", "check_logged_flips"]


def words(a: np.ndarray) -> np.ndarray:
    """The stored words of an array (unsigned integers of its item size, C order, native byte order)."""
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.byteswap().view(a.dtype.newbyteorder("<"))
    return a.reshape(-1).view(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else a.reshape(-1)


def check_logged_flips(before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray], log, layout) -> list[str]:
    """Problems (empty when none): a logged flip the framework does not see, or a change the log does not name."""
    problems: list[str] = []
    aliases = {t.path: t.aliases for t in layout.tensors}
    shared = {s.path for s in layout.skipped if "bytes" in s.reason}
    expect: dict[str, dict[int, int]] = {}
    plan = log.plan
    news = np.asarray(log.new_words, np.uint64)
    olds = np.asarray(log.old_words, np.uint64)
    for r in range(len(plan.index)):
        ref = plan.tensors[int(plan.tensor[r])]
        for name in aliases.get(ref.name, (ref.name,)):
            if int(news[r]) != int(olds[r]):
                expect.setdefault(name, {})[int(plan.index[r])] = int(news[r])
    if set(before) != set(after):
        problems.append(f"the framework sees other tensors after the inject: {sorted(set(before) ^ set(after))[:4]}")
    for name in sorted(set(before) & set(after)):
        b, a = words(before[name]), words(after[name])
        if b.shape != a.shape:
            problems.append(f"{name}: shape {b.shape} became {a.shape}")
            continue
        changed = set(np.flatnonzero(b != a).tolist())
        want = expect.get(name, {})
        if changed != set(want):
            if name in shared and not want:
                continue
            problems.append(f"{name}: changed elements {sorted(changed)[:6]}, logged {sorted(want)[:6]}")
            continue
        for i, w in want.items():
            if int(a[i]) != w:
                problems.append(f"{name}[{i}]: the framework reads word {int(a[i]):#x}, the log says {w:#x}")
    missing = set(expect) - set(after)
    if missing:
        problems.append(f"logged tensors the framework does not see: {sorted(missing)[:4]}")
    return problems
