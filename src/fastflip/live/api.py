"""Inject a plan into live tensors, revert it exactly, or do both around a block.

``inject(tensors, plan)`` flips the stored words in place (CPU memory through one
native call, GPU memory through one kernel launch per device, TensorFlow variables
through gather/scatter) and returns a :class:`LiveLog` of the old and new words.
``revert(tensors, log)`` writes the old words back, after checking that every site
still holds the logged new word. ``injected(...)`` is the context-manager form and
reverts on exit, also when the body raises.

For many trials on one model, build :class:`~fastflip.live.targets.Targets` once
and pass it instead of the model: each trial then costs one native call.

Examples
--------
>>> import numpy as np
>>> from fastflip.plan import Plan, TensorRef
>>> w = {"w": np.array([1.0, 2.0], dtype=np.float32)}
>>> plan = Plan.from_sites([TensorRef("w", "<f4", (2,))], [0], [1], xor_mask=[1 << 31])
>>> with injected(w, plan) as log:
...     w["w"].tolist()
[1.0, -2.0]
>>> w["w"].tolist(), log.nan_count
([1.0, 2.0], 0)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from ..errors import LogMismatchError, OptionError
from ..plan import Plan, TensorRef
from ..wordrule import nonfinite
from .targets import Targets

__all__ = ["LiveLog", "inject", "revert", "injected", "tensor_refs", "targets"]


def targets(obj: Any, *, include_optimizer: bool = False) -> Targets:
    """:class:`Targets` of a mapping, a PyTorch module or a Keras model (build once, reuse per trial)."""
    return Targets.from_tensors(obj, include_optimizer=include_optimizer)


def tensor_refs(obj: Any) -> list[TensorRef]:
    """Names, dtypes and shapes of live tensors, in the order a ``SiteSpace`` should use.

    >>> [r.name for r in tensor_refs({"b": np.zeros(2, np.int8)})]
    ['b']
    """
    return targets(obj).refs()


@dataclass
class LiveLog:
    """What one live injection did: the plan and every site's old and new word (native order).

    ``nan_count`` / ``inf_count``: sites whose value became NaN / ±Inf (it was not before).
    """

    plan: Plan
    old_words: np.ndarray
    new_words: np.ndarray

    def __len__(self) -> int:
        return len(self.old_words)

    def _became(self) -> tuple[int, int]:
        nan = inf = 0
        for j, pos in self.plan.per_tensor():
            dtype = self.plan.tensors[j].dtype
            old_nan, old_inf = nonfinite(self.old_words[pos], dtype)
            new_nan, new_inf = nonfinite(self.new_words[pos], dtype)
            nan += int((new_nan & ~old_nan).sum())
            inf += int((new_inf & ~old_inf).sum())
        return nan, inf

    @property
    def nan_count(self) -> int:
        return self._became()[0]

    @property
    def inf_count(self) -> int:
        return self._became()[1]

    @property
    def changed(self) -> int:
        """Sites whose word changed."""
        return int((self.old_words != self.new_words).sum())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record: tensors, per-site tensor/index/old/new words, counts and the plan's meta."""
        nan, inf = self._became()
        return {
            "tensors": [t.as_dict() for t in self.plan.tensors],
            "tensor": self.plan.tensor.tolist(),
            "index": self.plan.index.tolist(),
            "old_words": [int(w) for w in self.old_words],
            "new_words": [int(w) for w in self.new_words],
            "changed": self.changed,
            "nan_count": nan,
            "inf_count": inf,
            "meta": dict(self.plan.meta),
        }


def inject(tensors: Any, plan: Plan, *, backend: str = "auto") -> LiveLog:
    """Apply ``plan`` to live tensors in place; return the log that reverts it.

    Parameters
    ----------
    tensors : Targets, mapping name -> tensor, torch.nn.Module or Keras model
    plan : fastflip.plan.Plan
        Its tensor names, dtypes (byte order aside) and shapes must match.
    backend : {'auto', 'cython', 'numba', 'numpy'}
        CPU kernel.

    Raises
    ------
    TensorNotFoundError, PlanMismatchError, ReadOnlyTargetError
        Before anything is changed.
    """
    if not isinstance(plan, Plan):
        raise OptionError(f"plan must be a fastflip.plan.Plan, got {type(plan).__name__}")
    tg = tensors if isinstance(tensors, Targets) else targets(tensors)
    prep = tg.prepare(plan)
    old, new = tg.apply(plan, prep, backend)
    return LiveLog(plan, old, new)


def revert(tensors: Any, log: LiveLog, *, backend: str = "auto") -> None:
    """Write the logged old words back, bit for bit.

    Raises
    ------
    LogMismatchError
        Some site does not hold the logged new word (the tensors changed since, or the
        log belongs elsewhere); nothing is written.
    """
    tg = tensors if isinstance(tensors, Targets) else targets(tensors)
    prep = tg.prepare(log.plan)
    if len(log.old_words) != len(log.plan) or len(log.new_words) != len(log.plan):
        raise LogMismatchError("the log's word columns do not match its plan")
    current = tg.read(prep, backend)
    differs = current != log.new_words
    if differs.any():
        bad = np.flatnonzero(differs)
        i = int(bad[0])
        name = log.plan.tensors[int(log.plan.tensor[i])].name
        raise LogMismatchError(
            f"{len(bad)} of {len(log)} sites do not hold the logged new word (first: {name}[{int(log.plan.index[i])}] "
            f"holds {int(current[i]):#x}, the log says {int(log.new_words[i]):#x}); nothing was reverted"
        )
    tg.write(prep, log.old_words, backend)


@contextlib.contextmanager
def injected(model_or_tensors: Any, plan: Plan | None = None, *, backend: str = "auto",
             **sampling_kwargs: Any) -> Iterator[LiveLog]:
    """Inject on entry, revert on exit (also when the body raises).

    Without ``plan``, one is drawn by :func:`fastflip.sampling.make_plan` over all the
    tensors with ``sampling_kwargs`` (``seed=``, ``count=``/``rate=``/``ber=``,
    ``model=``, ``bits=``...).
    """
    tg = targets(model_or_tensors)
    if plan is None:
        from ..sampling import make_plan

        if sampling_kwargs.get("nan_policy") == "avoid":
            sampling_kwargs.setdefault("read_words", tg.word_reader())
        plan = make_plan(tg.refs(), **sampling_kwargs)
    elif sampling_kwargs:
        raise OptionError(f"pass either a plan or sampling options, not both ({', '.join(sampling_kwargs)})")
    log = inject(tg, plan, backend=backend)
    try:
        yield log
    finally:
        revert(tg, log, backend=backend)
