"""Inject a plan into live tensors, revert it exactly, or do both around a block.

Layer: ``live`` (may import files and below; imported by frameworks and above).

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
>>> from fastflip.core.plan import Plan, TensorRef
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
import secrets
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..errors import LogMismatchError, OptionError
from ..files.layout import Tensor
from ..core.plan import Plan, TensorRef
from ..core.configcheck import check_keys
from ..core.spec import SAMPLING_KEYS, Sampling
from ..files.select import Selection, select
from ..core.wordrule import WordCounts, became_nonfinite
from .siteaccess import Prepared
from .targets import Targets

__all__ = ["LiveLog", "inject", "revert", "injected", "tensor_refs", "targets", "select_live", "plan_for"]


def targets(obj: Any, *, include_optimizer: bool = False, optimizer: Any = None) -> Targets:
    """:class:`Targets` of a mapping, a PyTorch module or a Keras model (build once, reuse per trial).

    ``optimizer``: a ``torch.optim`` optimizer whose state joins the targets;
    ``include_optimizer=True``: a Keras model's optimizer variables.
    """
    return Targets.from_tensors(obj, include_optimizer=include_optimizer, optimizer=optimizer)


def tensor_refs(obj: Any, selection: "Selection | Mapping[str, Any] | None" = None) -> list[TensorRef]:
    """Names, dtypes and shapes of live tensors (optionally selected), in the order a ``SiteSpace`` should use.

    >>> [r.name for r in tensor_refs({"b": np.zeros(2, np.int8)})]
    ['b']
    """
    return [t.ref() for t in select_live(targets(obj), selection)]


def select_live(tg: Targets, selection: "Selection | Mapping[str, Any] | None" = None) -> list[Tensor]:
    """The records (:meth:`Targets.records`) that ``selection`` matches, with the CLI's meaning.

    Raises
    ------
    SelectionError
        Nothing matches; the message lists what exists.
    """
    if isinstance(selection, Mapping):
        selection = Selection.from_dict(selection)
    return select(tg.records(), selection)


@dataclass
class LiveLog(WordCounts):
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
            n, i = became_nonfinite(self.old_words[pos], self.new_words[pos], self.plan.tensors[j].word)
            nan, inf = nan + n, inf + i
        return nan, inf

    @property
    def seed(self) -> int | None:
        """The seed the plan was drawn with (drawn from the OS when none was given); None for a hand-made plan."""
        return self.plan.meta.get("seed")

    @property
    def bits_changed(self) -> int:
        """Bits that differ between the old and the new words (``scale`` changes bits, touches none)."""
        return int(np.bitwise_count(np.asarray(self.old_words, np.uint64) ^ np.asarray(self.new_words, np.uint64)).sum())

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
            "bits_changed": self.bits_changed,
            "sites": len(self.plan),
            "nan_count": nan,
            "inf_count": inf,
            "meta": dict(self.plan.meta),
        }


def inject(tensors: Any, plan: Plan, *, backend: str = "auto") -> LiveLog:
    """Apply ``plan`` to live tensors in place; return the log that reverts it.

    Parameters
    ----------
    tensors : Targets, mapping name -> tensor, torch.nn.Module or Keras model
    plan : fastflip.core.plan.Plan
        Its tensor names, dtypes (byte order aside) and shapes must match.
    backend : {'auto', 'cython', 'numba', 'numpy', 'cuda-raw', 'numba-cuda'}
        CPU kernel, or the GPU engine of CUDA tensors (CPU tensors then take 'auto').

    Raises
    ------
    TensorNotFoundError, PlanMismatchError, ReadOnlyTargetError
        Before anything is changed.
    DeviceError
        The CUDA kernels cannot be compiled (no NVRTC; before anything is changed), or a launch failed
        (the parts of the plan already flipped on other devices or the CPU are written back first).
    RepackError
        A ``torch.ao`` packed module touched by the plan could not be repacked after the write (names the module
        and the cause: e.g. a float16 word made Inf or NaN, which the float16 engine cannot hold); the old words
        are written back first, so the model is left as it was.

    A ``torch.ao`` packed module is repacked right after the write, so that its ``weight()`` and ``state_dict``
    show the change at once.
    """
    if not isinstance(plan, Plan):
        raise OptionError(f"plan must be a fastflip.core.plan.Plan, got {type(plan).__name__}")
    tg = tensors if isinstance(tensors, Targets) else targets(tensors)
    prep = tg.prepare(plan)
    tg.sync(prep)  # a packed weight reloaded since the targets were built: its current words first
    old, new = tg.apply(plan, prep, backend)
    _sync_or_write_back(tg, prep, old, backend)  # never left changed without its log: a failed repack puts back old
    return LiveLog(plan, old, new)


def _sync_or_write_back(tg: Targets, prep: Prepared, before: np.ndarray, backend: str) -> None:
    """After a write: repack the touched ``torch.ao`` modules, so that the model reads the written words at once
    (``state_dict``, ``weight()``, the next forward). When a repack raises, the words ``before`` the write go back
    (in the kept tensors and in every module repacked before the failure) and the error is raised."""
    try:
        tg.sync(prep, written=True)
    except BaseException:
        tg.write(prep, before, backend, checked=True)
        with contextlib.suppress(Exception):  # modules repacked before the failure take the words before again
            tg.sync(prep, written=True)
        raise


def revert(tensors: Any, log: LiveLog, *, backend: str = "auto") -> None:
    """Write the logged old words back, bit for bit.

    Raises
    ------
    LogMismatchError
        Some site does not hold the logged new word (the tensors changed since, or the
        log belongs elsewhere); nothing is written.
    RepackError
        A ``torch.ao`` packed module touched by the log could not be repacked after the write (names the module
        and the cause); the logged new words are written back first, so the model, its modules and the log stay
        as they were before the call (the revert can be tried again).

    A ``torch.ao`` packed module is repacked right after the write, so that its ``weight()`` and ``state_dict``
    show the reverted words at once.
    """
    tg = tensors if isinstance(tensors, Targets) else targets(tensors)
    prep = tg.prepare(log.plan)
    if len(log.old_words) != len(log.plan) or len(log.new_words) != len(log.plan):
        raise LogMismatchError("the log's word columns do not match its plan")
    tg.sync(prep)
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
    tg.write(prep, log.old_words, backend, checked=True)  # read() just checked the storages
    _sync_or_write_back(tg, prep, log.new_words, backend)


_SELECTION_KEYS = ("include", "exclude", "regex", "dtypes", "roles", "layers")


def plan_for(tg: Targets, *, seed: int | None = None, sampling: "Sampling | Mapping[str, Any] | None" = None,
             selection: "Selection | Mapping[str, Any] | None" = None, stream: Sequence[int] = (),
             **options: Any) -> Plan:
    """Draw one plan over the selected live tensors (what :func:`injected` does without a plan).

    ``selection`` (a :class:`~fastflip.files.select.Selection` or its mapping) or its fields
    as keywords (``include=``, ``layers=``, ``roles=``...) choose tensors with the
    CLI's ``--include/--exclude/--regex/--dtype/--role/--layer`` meaning. A seed left
    out is drawn from the OS and recorded in ``plan.meta['seed']``. What to flip is a
    :class:`~fastflip.core.spec.Sampling` (``sampling=``), or its fields as keywords (``count=``, ``bits=``, ...;
    :meth:`~fastflip.core.spec.Sampling.of`).
    """
    check_keys(options, (*SAMPLING_KEYS, *_SELECTION_KEYS), "live")
    selection_fields = {k: options.pop(k) for k in _SELECTION_KEYS if k in options}
    smp = Sampling.of(sampling, where="live", required=True, **options)
    assert smp is not None
    if selection_fields:
        if selection is not None:
            raise OptionError(f"give either selection= or its fields ({', '.join(selection_fields)}), not both")
        selection = Selection(**selection_fields)
    chosen = select_live(tg, selection)
    if seed is None:
        seed = secrets.randbits(63)
    plan = smp.plan([t.ref() for t in chosen], seed=seed, stream=stream,
                    read_words=tg.word_reader() if smp.nan_policy == "avoid" else None)
    if selection is not None:
        plan.meta["selection"] = (selection if isinstance(selection, Selection)
                                  else Selection.from_dict(selection)).as_dict()
    return plan


@contextlib.contextmanager
def injected(model_or_tensors: Any, plan: Plan | None = None, *, backend: str = "auto", optimizer: Any = None,
             include_optimizer: bool = False, **options: Any) -> Iterator[LiveLog]:
    """Inject on entry, revert on exit (also when the body raises).

    Parameters
    ----------
    model_or_tensors : torch.nn.Module, Keras model, mapping name -> tensor, or Targets
    plan : Plan, optional
        Apply this plan (e.g. from :func:`fastflip.live.site`); otherwise one is drawn.
    **options
        ``seed=None`` (drawn from the OS and recorded in ``log.seed``), ``stream=``, ``selection=`` (or
        ``include=``, ``exclude=``, ``regex=``, ``dtypes=``, ``roles=``, ``layers=``), and what to flip:
        ``sampling=`` (a :class:`~fastflip.core.spec.Sampling` or its table) or its fields as keywords
        (``count=`` / ``rate=`` / ``ber=``, ``bits=``, ``model=`` (fault model), ``distribution=``,
        ``replace=``, ``nan_policy=``, ``sign_first=``): see :func:`plan_for`.
    optimizer, include_optimizer
        Add a ``torch.optim`` optimizer's state / a Keras model's optimizer variables.

    Examples
    --------
    >>> w = {"w": np.ones(8, np.float32), "step": np.zeros((), np.int64)}
    >>> with injected(w, seed=3, count=2, bits="exponent-msb") as log:
    ...     sorted(set(w["w"].tolist())), log.plan.meta["left_out"]["tensors"]
    ([1.0, inf], ['step'])
    >>> w["w"].tolist() == [1.0] * 8
    True
    """
    tg = targets(model_or_tensors, include_optimizer=include_optimizer, optimizer=optimizer)
    if plan is None:
        plan = plan_for(tg, **options)
    elif options:
        raise OptionError(f"pass either a plan or sampling options, not both ({', '.join(options)})")
    log = inject(tg, plan, backend=backend)
    try:
        yield log
    finally:
        revert(tg, log, backend=backend)
