"""Activation (neuron) faults: bit flips in the outputs of chosen layers during forward passes.

Layer: ``live`` (may import files and below; imported by frameworks and above).

``injected_activations(model, seed=..., sampling=Sampling(count=...), selection=Selection(layers=[...]))``
(or the shorthand ``count=...``)
is a context manager: inside the block, every forward pass of ``model`` has the
selected layers' outputs altered by the fault model (PyTorch forward hooks; Keras
layer calls wrapped on the instance, see :mod:`fastflip.live.act_frameworks`); on
exit the hooks are removed, also when the body raises.

Sites. A layer's *output space* is one sample's output (the output without its
batch dimension 0). The first forward inside the block learns every selected
layer's output shape (a probe of the same call: on PyTorch's ``meta`` device when
the model allows it, else a real forward with the model's buffers and RNG state
left untouched) and builds a :class:`~fastflip.core.sampling.SiteSpace` over those
spaces, so sites are uniform over the selected layers' output elements (a layer is
hit in proportion to its output size, unless ``distribution`` says otherwise) with the
same :class:`~fastflip.core.spec.Sampling` fields as weights: bits, fault model,
count / rate / ber, distribution, replace and NaN policy. A layer called several times in one forward (a
reused ``ReLU``) has one output space per call: ``name``, ``name#1``, ...

Targets beyond plain layer outputs (:mod:`fastflip.live.act_targets`): the first
tensor of a tuple / dict / ``ModelOutput`` output (``attn:out.0``) or a chosen
element (``attn:out.1``, ``encoder:out.last_hidden_state``); in PyTorch, the outputs
of torch functions called inside a module (``attn:softmax``, ``attn:matmul``,
``attn:sdpa``) and a Hugging Face KV cache (``attn:cache.key``, ``attn:cache.value``;
:mod:`fastflip.live.act_ops`). ``forward=k`` faults only forward ``k`` of the block
(one generation step).

- ``per_sample=False``: one plan, drawn from ``(seed, *stream)``, is applied to
  every sample of every forward in the block: a fault in the unit that computes
  those neurons (results do not depend on the batch size).
- ``per_sample=True``: sample ``b`` of a batch gets its own plan, drawn from
  ``(seed, *stream, b)``, so one forward of a batch of B inputs runs B independent
  trials (PyTorchFI's per-batch-element neuron faults); trial ``b`` is regenerated
  from its key alone.

New words follow the plan's word rule exactly (:mod:`fastflip.core.wordrule`, tested
against :mod:`fastflip.core.reference`); they are computed on the host for the few
faulted elements and written back with the framework's own indexing, so the same
code serves CPU and CUDA tensors. ``nan_policy='avoid'``: sites whose new value
would be NaN/Inf are redrawn in the same layer for that sample and input (same
seed and input, same redraw).

The :class:`ActivationLog` (``log`` of the ``with`` statement) holds one row per
faulted element and forward: forward number, layer, sample, flat index in the
sample's output, touched bits, old and new word.

Examples
--------
>>> import numpy as np
>>> from fastflip.core.plan import TensorRef
>>> from fastflip.core.spec import Sampling
>>> s = Sites([TensorRef("fc", "<f4", (4,))], seed=3, sampling=Sampling(count=1, bits="31"), per_sample=True)
>>> sample, index, *_ = s.layer_sites(0, batch=3)
>>> sample.tolist(), bool(((0 <= index) & (index < 4)).all())
([0, 1, 2], True)
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ..core.bits import BitSpec
from ..core.blockplan import PlanBlock
from ..core.dtypes import word_type
from ..errors import BitRangeError, OptionError
from ..core.faults import FaultModel
from ..core.plan import Plan, TensorRef
from ..core.sampling import SiteSpace
from ..core.spec import Sampling
from ..core.wordrule import WordCounts, became_nonfinite, new_words, nonfinite
from . import act_frameworks

__all__ = ["ActivationLog", "Sites", "injected_activations", "layer_outputs", "draw_seed"]


def draw_seed() -> int:
    """A fresh non-negative 63-bit seed from the operating system (recorded in the log)."""
    return secrets.randbits(63)


@dataclass
class ActivationLog(WordCounts):
    """Every faulted activation element of one ``injected_activations`` block.

    Columns (one row per element per forward): ``forward`` (0-based forward pass in
    the block), ``layer`` (index into ``layers``), ``sample`` (batch position),
    ``index`` (flat C-order index in that sample's output), ``bits`` (mask of the
    touched bits), ``old_words`` / ``new_words`` (raw words, native order).
    """

    layers: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    seed: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    forwards: int = 0
    _chunks: list[tuple[np.ndarray, ...]] = field(default_factory=list, repr=False)
    _cols: dict[str, np.ndarray] | None = field(default=None, repr=False)

    _NAMES = ("forward", "layer", "sample", "index", "bits", "old_words", "new_words")

    def add(self, forward: int, layer: int, sample: np.ndarray, index: np.ndarray, bits: np.ndarray,
            old: np.ndarray, new: np.ndarray) -> None:
        n = len(index)
        self._chunks.append((np.full(n, forward, np.int64), np.full(n, layer, np.int32), sample.astype(np.int64),
                             index.astype(np.int64), bits.astype(np.uint64), old.astype(np.uint64),
                             new.astype(np.uint64)))
        self._cols = None

    def _col(self, name: str) -> np.ndarray:
        if self._cols is None:
            dtypes = (np.int64, np.int32, np.int64, np.int64, np.uint64, np.uint64, np.uint64)
            self._cols = {k: (np.concatenate([c[i] for c in self._chunks]) if self._chunks else np.zeros(0, dt))
                          for i, (k, dt) in enumerate(zip(self._NAMES, dtypes))}
        return self._cols[name]

    forward = property(lambda self: self._col("forward"))
    layer = property(lambda self: self._col("layer"))
    sample = property(lambda self: self._col("sample"))
    index = property(lambda self: self._col("index"))
    bits = property(lambda self: self._col("bits"))
    old_words = property(lambda self: self._col("old_words"))
    new_words = property(lambda self: self._col("new_words"))

    def __len__(self) -> int:
        return len(self.index)

    def _became(self) -> tuple[int, int]:
        nan = inf = 0
        for li, dt in enumerate(self.dtypes):
            at = self.layer == li
            if not at.any():
                continue
            n, i = became_nonfinite(self.old_words[at], self.new_words[at], dt)
            nan, inf = nan + n, inf + i
        return nan, inf

    def records(self) -> list[dict[str, Any]]:
        """One dict per row: forward, layer name, sample, index, bits (positions, high first), old, new."""
        out = []
        for f, li, s, i, b, o, n in zip(*(self._col(k).tolist() for k in self._NAMES)):
            out.append({"forward": f, "layer": self.layers[li], "sample": s, "index": i,
                        "bits": [k for k in range(63, -1, -1) if b >> k & 1], "old": o, "new": n})
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record of the block (layers, seed, options, every row)."""
        nan, inf = self._became()
        return {"layers": [{"name": n, "dtype": d, "shape": list(s)} for n, d, s in zip(self.layers, self.dtypes, self.shapes)],
                "seed": self.seed, "meta": dict(self.meta), "forwards": self.forwards,
                **{k: [int(x) for x in self._col(k)] for k in self._NAMES},
                "changed": self.changed, "nan_count": nan, "inf_count": inf}


class Sites:
    """The fault sites of every sample slot over the layers' per-sample output spaces.

    ``sampling`` (a :class:`~fastflip.core.spec.Sampling`) says what each sample slot's plan draws, as
    for weights; ``plan`` (a :class:`~fastflip.core.plan.Plan` over ``refs``) fixes the sites instead
    of drawing them (campaigns); it needs ``per_sample=False``. Give one of them.
    """

    def __init__(self, refs: Sequence[TensorRef], *, seed: int, stream: Sequence[int] = (),
                 sampling: Sampling | None = None, per_sample: bool = False, plan: Any = None,
                 samples_per_plan: int | None = None) -> None:
        self.refs = list(refs)
        self.seed, self.stream, self.per_sample = int(seed), tuple(int(s) for s in stream), bool(per_sample)
        if (sampling is None) == (plan is None):
            raise OptionError("activation sites: give either sampling= (sites to draw) or plan= (fixed sites)")
        self.model = sampling.fault_model if sampling is not None else FaultModel.parse(None)
        self.nan_policy = sampling.nan_policy if sampling is not None else "allow"
        self.bits = sampling.bit_spec if sampling is not None else None
        # each slot's plan is drawn with NaN/Inf allowed: the words are known only in the forward (see fault)
        self._draw = sampling.with_changes(nan_policy="allow") if sampling is not None else None
        self._block: Any = None
        if isinstance(plan, PlanBlock):  # trial j's plan in samples j*n ... j*n+n-1
            if not samples_per_plan:
                raise OptionError("a block of plans needs samples_per_plan=")
            self._check_plan(plan)
            self._block, self._per = plan, int(samples_per_plan)
            self.space = None
            self._plans = {}
        elif plan is not None:
            if per_sample:
                raise OptionError("a fixed plan applies to every sample: use per_sample=False with plan=")
            self._check_plan(plan)
            self.space = None
            self._plans: dict[int, Plan] = {0: plan}
        else:
            assert sampling is not None
            self.space = _space(self.refs, self.bits, sampling.distribution_arg)
            self._plans = {}
        self._cache: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}

    def _check_plan(self, plan: Plan) -> None:
        have = {r.name: r for r in self.refs}
        for r in plan.tensors:
            if have.get(r.name) != r:
                raise OptionError(f"the plan's layer output {r.name} {r.shape} is not an output of "
                                  f"the selected layers ({', '.join(f'{x.name} {x.shape}' for x in self.refs[:6])})")
        self._plan_tensors = [[x.name for x in self.refs].index(r.name) for r in plan.tensors]

    def plan(self, slot: int) -> Plan:
        """The plan of sample slot ``slot`` (slot 0 for every sample when ``per_sample`` is False)."""
        slot = slot if self.per_sample else 0
        p = self._plans.get(slot)
        if p is None:
            assert self.space is not None
            stream = (*self.stream, slot) if self.per_sample else self.stream
            p = self._plans[slot] = self._draw.plan(self.space, seed=self.seed, stream=stream)
        return p

    def _layer_of(self, p: Plan) -> np.ndarray:
        if self.space is not None:
            return p.tensor
        return np.asarray(self._plan_tensors, dtype=np.int64)[p.tensor] if len(p) else p.tensor

    def layer_sites(self, layer: int, batch: int) -> tuple[np.ndarray, ...]:
        """(sample, index, and, or, xor, scale or None, bits) of layer ``layer`` for a batch of ``batch``."""
        key = (layer, batch)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if self._block is not None:
            return self._block_sites(layer, batch)
        by_layer = self._by_layer(batch)
        at = by_layer["starts"]
        cols = [c[at[layer]:at[layer + 1]] for c in by_layer["cols"]]
        if not self.per_sample and batch > 1:  # the same sites in every sample
            k = len(cols[1])
            cols = [np.repeat(np.arange(batch, dtype=np.int64), k)] + [np.tile(c, batch) for c in cols[1:]]
        out = tuple(cols[:5]) + ((None if np.isnan(cols[5]).all() else cols[5]), cols[6])
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = out
        return out

    def _block_sites(self, layer: int, batch: int) -> tuple[np.ndarray, ...]:
        """:meth:`layer_sites` of a block of plans: trial ``j``'s sites in each of its ``samples_per_plan`` samples."""
        b, n = self._block, self._per
        if batch != n * len(b):
            raise OptionError(f"a block of {len(b)} plans over {n} samples each needs forwards of {n * len(b)} "
                              f"samples, not {batch}")
        rows = np.flatnonzero(np.asarray(self._plan_tensors, dtype=np.int64)[b.tensor] == layer)
        trial = b.trial_of_row[rows]
        sample = (trial[:, None] * n + np.arange(n, dtype=np.int64)).reshape(-1)
        cols = [np.repeat(c[rows], n) for c in (b.index, b.and_mask, b.or_mask, b.xor_mask)]
        scale = None if b.scale is None or np.isnan(b.scale[rows]).all() else np.repeat(b.scale[rows], n)
        out = (sample, *cols, scale, np.repeat(b.bits[rows], n))
        self._cache[(layer, batch)] = out
        return out

    def _by_layer(self, batch: int) -> dict[str, Any]:
        """Every sample slot's sites, concatenated and grouped by layer (once per batch size)."""
        slots = batch if self.per_sample else 1
        hit = self._cache.get((-1, slots))
        if hit is not None:
            return hit  # type: ignore[return-value]
        plans = [self.plan(b) for b in range(slots)]
        layer = np.concatenate([self._layer_of(p) for p in plans]).astype(np.int64)
        sample = np.repeat(np.arange(slots, dtype=np.int64), [len(p) for p in plans])
        scale = np.concatenate([p.scale if p.scale is not None else np.full(len(p), np.nan) for p in plans])
        cols = [sample, np.concatenate([p.index for p in plans])] + [
            np.concatenate([getattr(p, c) for p in plans]) for c in ("and_mask", "or_mask", "xor_mask")
        ] + [scale, np.concatenate([p.bits for p in plans])]
        order = np.argsort(layer, kind="stable")
        res = {"cols": [c[order] for c in cols],
               "starts": np.searchsorted(layer[order], np.arange(len(self.refs) + 1))}
        self._cache[(-1, slots)] = res  # type: ignore[assignment]
        return res

    def fault(self, layer: int, batch: int, read: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, ...]:
        """Sites and words of one layer output: (sample, index, bits, old, new) for ``read(flat positions)``.

        ``read`` returns the current raw words (uint64) at flat positions of the batched output.
        """
        ref = self.refs[layer]
        n = ref.size
        sample, index, a, o, x, scale, bits = self.layer_sites(layer, batch)
        old = read(sample * n + index)
        new = new_words(old, a, o, x, scale, _word(ref))
        if self.nan_policy == "avoid" and len(new):
            bad = _nonfinite_new(new, _word(ref))
            if bad.any():
                sample, index, bits, old, new = self._redraw(layer, sample, index, bits, old, new, bad, read)
        return sample, index, bits, old, new

    def _redraw(self, layer: int, sample: np.ndarray, index: np.ndarray, bits: np.ndarray, old: np.ndarray,
                new: np.ndarray, bad: np.ndarray, read: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, ...]:
        """Redraw, for each sample with a NaN/Inf site, that sample's sites of this layer with NaN/Inf avoided."""
        ref = self.refs[layer]
        space = _space([ref], self.bits)
        keep = ~np.isin(sample, np.unique(sample[bad]))
        cols = [[c[keep]] for c in (sample, index, bits, old, new)]
        for b in np.unique(sample[bad]).tolist():
            k = int((sample == b).sum())
            base = int(b) * ref.size
            redraw = Sampling(count=k, model=self.model, replace=self._draw.replace, nan_policy="avoid")
            p = space.plan(redraw, seed=self.seed, stream=(*self.stream, 1 << 30, layer, int(b)),
                           read_words=lambda q, base=base: read(base + q.index))
            o = read(base + p.index)
            w = new_words(o, p.and_mask, p.or_mask, p.xor_mask, p.scale, _word(ref))
            for c, v in zip(cols, (np.full(len(p), b, np.int64), p.index, p.bits, o, w)):
                c.append(v)
        return tuple(np.concatenate(c) for c in cols)


def _space(refs: Sequence[TensorRef], bits: Any, distribution: Any = "element") -> SiteSpace:
    """The site space, or one line naming the layer outputs that lack a named bit field."""
    try:
        return SiteSpace(refs, bits=bits, distribution=distribution)
    except BitRangeError as exc:
        bad = []
        for r in refs:
            try:
                BitSpec.parse(bits).resolve(_word(r))
            except BitRangeError:
                bad.append(f"{r.name} ({getattr(r, 'format', None) or np.dtype(r.dtype)})")
        shown = ",".join(BitSpec.parse(bits).items)
        raise BitRangeError(f"bits {shown!r} do not exist in the output of layer(s) {', '.join(bad[:6])} ({exc}); "
                            "select float layers (Selection(dtypes=['float'])) or give bit positions") from None


def _word(ref: TensorRef) -> Any:
    """What the word functions take for a ref: its WordType where refs carry float formats, else its dtype."""
    return getattr(ref, "word", None) or ref.dtype


def _nonfinite_new(new: np.ndarray, dtype: str) -> np.ndarray:
    nn, ni = nonfinite(new, dtype)
    return nn | ni


# ------------------------------------------------------------------------------ the context manager

def _frameworks(model: Any) -> Any:
    return act_frameworks.hooks_for(model)


def layer_outputs(model: Any, run: Callable[[], Any], selection: Any = None) -> list[TensorRef]:
    """Per-sample output refs (name, dtype, shape without the batch dimension) of the selected layers.

    ``run()`` must call ``model`` (e.g. a fault-free evaluation); the outputs of its
    first forward are recorded and nothing is changed. Raises when a selected layer
    never runs.
    """
    hooks = _frameworks(model)
    names = hooks.select(selection)
    with hooks.recording(names) as rec:
        run()
    return hooks.refs(names, rec, selection)


@contextlib.contextmanager
def injected_activations(network: Any, /, seed: int | None = None, *,
                         sampling: "Sampling | Mapping[str, Any] | None" = None, selection: Any = None,
                         per_sample: bool = False, stream: Sequence[int] = (), plan: Any = None,
                         samples_per_plan: int | None = None, forward: int | None = None,
                         **shorthand: Any) -> Iterator[ActivationLog]:
    """Fault the outputs of the selected layers of a model in every forward inside the block.

    Parameters
    ----------
    network : torch.nn.Module or Keras model
        The model (positional; ``model=`` names the fault model, as for weights).
    seed : int, optional
        Drawn from the operating system when left out (``log.seed`` records it).
    sampling : Sampling or mapping, optional
        What to flip in each sample slot's plan, with the meaning it has for weights
        (:class:`~fastflip.core.spec.Sampling`): ``count`` sites, each output element with
        probability ``rate``, or each allowed bit with probability ``ber``; ``bits``;
        ``model`` (``flip``, ``random-bits:2``, ``adjacent:2``, ``stuck-at-1``, ``mask:0b11``,
        ``random-value``, ``zero``, ``scale:2.0``); ``distribution`` over the layer outputs
        (``element``: in proportion to their sizes; ``tensor``; or weights by output name);
        ``replace``; ``nan_policy`` (``avoid``: sites whose new value would be NaN/Inf are
        redrawn in the same layer for that sample and input).
    **shorthand
        The fields of ``sampling`` as keywords (``count=1, bits="30"``, ...), made into one
        Sampling by :meth:`~fastflip.core.spec.Sampling.of`; give either these or ``sampling``.
    selection : fastflip.Selection, optional
        ``layers`` / ``include`` / ``exclude`` / ``regex`` match layer names (PyTorch
        module paths like ``layer1.0.conv2``, Keras layer names); ``dtypes`` filters
        by output dtype. Default: every leaf layer (a module without children).
        ``layers`` also takes ``MODULE:WHAT`` patterns (``transformer.h.*.attn:softmax``,
        ``attn:out.1``, ``attn:cache.key``). Targets matched by a glob whose output holds
        no tensor, or that never run, are left out with one warning.
    per_sample : bool
        Independent faults per batch sample (see the module docstring).
    plan : Plan or fastflip.core.blockplan.PlanBlock, optional
        Fixed sites over the layer outputs (``layer_outputs`` gives their refs), instead of a
        sampling. A block of ``B`` plans with ``samples_per_plan = n`` runs ``B`` trials in
        forwards of ``B * n`` samples: trial ``j``'s plan in samples ``j*n … j*n+n-1``
        (batched campaign trials).
    forward : int, optional
        Fault only this forward of the block (0-based; in ``generate``, the step that
        generates token ``forward``); sites are drawn from its shapes. PyTorch only.

    Yields
    ------
    ActivationLog
        Filled while the block runs; complete after it.
    """
    smp = Sampling.of(sampling, where="injected_activations", required=plan is None, **shorthand)
    if plan is not None and smp is not None:
        raise OptionError("injected_activations: a plan fixes the sites; give either plan= or a sampling, not both")
    if seed is None:
        seed = draw_seed()
    if int(seed) != seed or seed < 0:
        raise OptionError(f"seed must be a non-negative integer (got {seed!r})")
    hooks = _frameworks(network)
    names = hooks.select(selection)
    fields = smp.as_dict() if smp is not None else {}
    fields["model"] = (smp.fault_model if smp is not None else FaultModel.parse(None)).as_dict()
    log = ActivationLog(seed=int(seed), meta={**fields, "per_sample": per_sample, "stream": list(stream),
                                             "forward": forward})
    state: dict[str, Any] = {"sites": None}

    def make_sites(refs: list[TensorRef]) -> Sites:
        s = Sites(refs, seed=int(seed), stream=stream, sampling=smp, per_sample=per_sample, plan=plan,
                  samples_per_plan=samples_per_plan)
        log.layers, log.shapes = [r.name for r in refs], [r.shape for r in refs]
        log.dtypes = [getattr(r, "format", None) or r.dtype for r in refs]
        state["sites"] = s
        return s

    if plan is not None:
        make_sites(list(plan.tensors))
    if forward is not None and (int(forward) != forward or forward < 0 or plan is not None):
        raise OptionError(f"forward= takes the 0-based number of one forward in the block, without plan= (got {forward!r})")
    with hooks.faulting(names, selection, log, state, make_sites, at=forward):
        yield log
