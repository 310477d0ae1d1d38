"""Faulted modules that run once per trial on their share of a repeated batch.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

A block of ``B`` trials runs the evaluation inputs repeated ``B`` times along the batch
(trial ``j``'s rows at ``j*n … j*n+n-1``). :class:`PerTrial` makes every module that holds a
faulted tensor (in its own parameters or buffers) run ``B`` times, each time on trial ``j``'s rows
with trial ``j``'s faulty copy in its slots (the serial forward's kernel and batch size); every other
module runs once for all. It needs no graph: the modules' ``forward`` is replaced for the block and
put back afterwards, so it works for models ``torch.fx`` cannot trace (Hugging Face models).

* Inputs whose first dimension is the block's rows are split; other inputs (a ``(1, L)`` position
  index that broadcasts over the batch) are given whole to each trial, and an output of batch 1
  made from them is expanded to the trial's ``n`` rows.
* Tuple and list outputs are joined element by element.
* Fault-free modules with parameters whose input has few rows per trial (fewer than :data:`SMALL_ROWS`:
  a classifier head on one vector per input) also run once per trial, with the serial batch: matrix
  kernels pick other code paths for a few rows, whose last bits differ.
* ``poison=True`` (the batcher's probe) puts NaN into the faulted tensors' own slots outside the
  holders' forwards: a model that reads a faulted tensor anywhere else (a parent's
  ``F.linear(x, self.child.weight)``) gives NaN outputs there, which the probe sees, and its trials
  run one at a time.

Examples
--------
>>> import torch
>>> m = torch.nn.Sequential(torch.nn.Linear(1, 1, bias=False)).eval()
>>> _ = torch.nn.init.ones_(m[0].weight)
>>> stack = torch.tensor([[[2.0]], [[3.0]]])          # trial 0: w = 2, trial 1: w = 3
>>> with PerTrial(m.named_modules(), {id(m[0].weight): stack}, 2) as pt:
...     pt.rows = 4
...     out = m(torch.ones(4, 1))
>>> out[:, 0].tolist(), m[0].weight.item()
([2.0, 2.0, 3.0, 3.0], 1.0)
"""

from __future__ import annotations

from typing import Any, Iterable

from ..errors import FastflipError

__all__ = ["PerTrial", "Unbatchable", "SMALL_ROWS"]

#: Modules with parameters whose input has fewer rows than this per trial run once per trial too: CPU matrix
#: kernels for a few rows give other last bits than for a batch of many (torch's Linear on fewer than 12 rows, not a
#: multiple of 4), and rows must equal the serial trial's exactly. Such modules are cheap.
SMALL_ROWS = 16


class Unbatchable(FastflipError):
    """The model cannot run several trials in one forward (the message says why)."""


class PerTrial:
    """Context manager: the modules among ``modules`` holding a tensor of ``stacks`` run trial by trial.

    Set :attr:`rows` (``B × n``) before each forward (and :attr:`only` to run one trial on all of them).

    Parameters
    ----------
    modules : iterable of (name, module)
        Candidate modules (a module object met twice is patched once).
    stacks : dict
        ``{id(original tensor): stack of B faulty copies}``.
    trials : int
        ``B``.
    poison : bool
        NaN in the faulted slots outside the holders' forwards (see the module docstring).
    small_rows : int
        Fault-free modules with parameters seeing fewer rows per trial run per trial too (:data:`SMALL_ROWS`).
    """

    def __init__(self, modules: Iterable[tuple[str, Any]], stacks: dict[int, Any], trials: int,
                 poison: bool = False, small_rows: int = SMALL_ROWS) -> None:
        self.modules = list(modules)
        self.stacks = stacks
        self.trials = int(trials)
        self.poison = poison
        self.small_rows = int(small_rows)
        self.rows = 0
        #: run only this trial (on all the rows) instead of all of them
        self.only: int | None = None
        self._undo: list[Any] = []

    def __enter__(self) -> "PerTrial":
        import torch

        seen: set[int] = set()
        try:
            for name, mod in self.modules:
                if id(mod) in seen:
                    continue
                seen.add(id(mod))
                hit = {}
                for store in ("_parameters", "_buffers"):
                    for pn, t in getattr(mod, store).items():
                        if t is not None and id(t) in self.stacks:
                            outside = t
                            if self.poison and t.is_floating_point():
                                outside = torch.full_like(t, float("nan"))
                            hit[(store, pn)] = (t, outside, self.stacks[id(t)])
                if hit or (mod._parameters and self.small_rows):
                    self._patch(name, mod, hit)
        except BaseException:
            self.__exit__()
            raise
        if not any(hit for *_, hit in self._undo):
            self.__exit__()
            raise Unbatchable("no module of the model holds the faulted tensors")
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._undo:
            mod, had, old, hit = self._undo.pop()
            for (store, pn), (orig, _, _) in hit.items():
                getattr(mod, store)[pn] = orig
            if had:
                mod.forward = old
            else:
                del mod.forward

    def _patch(self, name: str, mod: Any, hit: dict) -> None:
        import torch

        had = "forward" in vars(mod)
        orig = mod.forward
        for (store, pn), (_, outside, _) in hit.items():
            getattr(mod, store)[pn] = outside

        def per_trial(*a: Any, **kw: Any) -> Any:
            js = range(self.trials) if self.only is None else [self.only]
            rows = self.rows
            n = rows // len(js)
            if not hit and (len(js) == 1 or not _small(a, rows, n, self.small_rows)):
                return orig(*a, **kw)  # a fault-free module on enough rows: once for all trials

            def part(t: Any, j: int) -> Any:
                if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == rows:
                    return t[j * n:(j + 1) * n]
                return t

            outs = []
            try:
                for k, j in enumerate(js):
                    for (store, pn), (_, _, st) in hit.items():
                        getattr(mod, store)[pn] = st[j]
                    outs.append(orig(*[part(t, k) for t in a], **{key: part(v, k) for key, v in kw.items()}))
            finally:
                for (store, pn), (_, outside, _) in hit.items():
                    getattr(mod, store)[pn] = outside
            return _join(outs, n, name)

        self._undo.append((mod, had, vars(mod).get("forward"), hit))
        mod.forward = per_trial


def _small(args: tuple, rows: int, n: int, limit: int) -> bool:
    """Whether a module's batch-major input has fewer than ``limit`` rows (all but the last axis) per trial."""
    import torch

    t = next((t for t in args if isinstance(t, torch.Tensor)), None)
    if t is None or not t.dim() or t.shape[0] != rows:
        return False
    return t.numel() // (t.shape[-1] if t.dim() > 1 else 1) * n // rows < limit


def _join(outs: list[Any], n: int, name: str) -> Any:
    """One output from the per-trial outputs: tensors concatenated along the batch (batch-1 ones expanded to
    ``n`` rows each), tuples and lists element by element, other values only when every trial's is equal."""
    import torch

    first = outs[0]
    if len(outs) == 1:
        return first
    if isinstance(first, torch.Tensor):
        if all(o.dim() and o.shape[0] == n for o in outs):
            return torch.cat(outs, 0)
        if all(o.dim() and o.shape[0] == 1 for o in outs):
            return torch.cat([o.expand(n, *o.shape[1:]) for o in outs], 0)
        raise Unbatchable(f"module {name or 'the model'} returns values that are not batch-major")
    if isinstance(first, (tuple, list)) and not hasattr(first, "_fields"):
        return type(first)(_join([o[i] for o in outs], n, name) for i in range(len(first)))
    if first is None or all(o is first or o == first for o in outs[1:]):
        return first
    raise Unbatchable(f"module {name or 'the model'} returns a {type(first).__name__}, which trials cannot share")
