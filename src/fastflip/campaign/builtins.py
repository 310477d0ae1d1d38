"""The built-in evaluators: classification, regression, language-model and generation, in mini-batches.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

A built-in evaluator judges the model on ``[evaluator] data`` (a ``module:function`` returning the
evaluation set, or a data loader yielding its batches) in mini-batches of ``[evaluator] batch_size``.
Models may return what they return: a tensor, a tuple or list (its first tensor), a mapping or a
transformers ``ModelOutput`` (its ``logits``, else its first tensor) — :func:`logits_of`.

* ``classification``: data ``(x, y)``; the answer is each input's top-1 (or top-k) class, the metric
  the top-k accuracy.
* ``regression``: data ``(x, y)``; the answer is the outputs (within ``rtol``/``atol``), the metric the
  mean squared error (lower is better).
* ``language-model``: data the token ids ``(sequences, length)`` (or a mapping with ``input_ids``); the
  answer is the top-1 next-token prediction at every position, the metric the perplexity of the
  sequences' own next tokens (lower is better); the raw outputs judged for ``masked_numeric`` are the
  per-position negative log-likelihoods; a sequence with a non-finite logit makes the trial a DUE.
* ``generation``: data the prompt token ids ``(prompts, length)``; greedy decoding of
  ``max_new_tokens`` tokens, one full forward per token (no cache: the same arithmetic in serial and
  batched trials); the answer is the generated tokens, the metric the fraction of generated tokens
  equal to the fault-free (golden) generation; a non-finite logit at any step is a DUE.

:class:`Builtin` runs one trial (``evaluator(model)``) or, for batched trials
(:mod:`fastflip.campaign.batched`), ``B`` trials whose inputs are repeated ``B`` times along the batch
(:meth:`Builtin.run`): each trial's rows are judged on their own, with the serial shapes, so the
rows of a batched sweep equal those of ``--batch-trials 1``.

Examples
--------
>>> ev = Builtin("classification", np.eye(3, dtype=np.float32), np.array([0, 1, 1]), batch_size=2)
>>> [len(c) for c in ev.chunks]
[2, 1]
>>> ev(lambda x: x).metric  # the identity "model": the arg-max of each row of the eye
0.6666666666666666
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import OptionError
from .outcomes import Answer

__all__ = ["BUILTIN_KINDS", "Builtin", "logits_of", "to_numpy", "model_forward", "load_data", "classification_answer"]

#: The ``[evaluator] builtin`` names.
BUILTIN_KINDS = ("classification", "regression", "language-model", "generation")
#: Built-ins whose metric is a loss (lower is better).
LOSS_KINDS = ("regression", "language-model")
#: Built-ins that judge token ids (no labels).
TOKEN_KINDS = ("language-model", "generation")


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (str, bytes))


def logits_of(out: Any) -> Any:
    """The tensor a model's output stands for: the tensor itself, the ``logits`` of a mapping or
    ``ModelOutput`` (else its first tensor), the first tensor of a tuple or list.

    >>> logits_of({"loss": None, "logits": np.ones(2)}).tolist(), logits_of((np.zeros(1), 5)).tolist()
    ([1.0, 1.0], [0.0])
    """
    if _is_tensor(out):
        return out
    if isinstance(out, Mapping) or hasattr(out, "logits"):
        lg = out.get("logits") if isinstance(out, Mapping) else getattr(out, "logits", None)
        if lg is not None:
            return logits_of(lg)
        items = list(out.values()) if isinstance(out, Mapping) else []
    elif isinstance(out, (tuple, list)):
        items = list(out)
    else:
        items = []
    for item in items:
        if _is_tensor(item):
            return item
    raise OptionError(f"the model returned a {type(out).__name__} holding no tensor; a built-in evaluator needs "
                      "a tensor, a tuple of tensors, a mapping or a ModelOutput with logits")


def to_numpy(x: Any) -> np.ndarray:
    """A framework tensor (or array-like) as a NumPy array (bfloat16 as float32)."""
    if hasattr(x, "detach"):  # torch
        x = x.detach()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.cpu().numpy()
    return np.asarray(x)


def model_forward(model: Any) -> Callable[[np.ndarray], np.ndarray]:
    """``f(inputs) -> logits`` (NumPy) for a PyTorch module, a Keras model or a plain callable."""
    mods = [c.__module__ for c in type(model).__mro__]
    mod = next((m for m in mods if m.startswith(("torch", "keras", "tensorflow", "tf_keras"))), mods[0])
    if mod.startswith("torch"):
        import torch

        first = next(iter(list(model.parameters()) + list(model.buffers())), None)
        device = None if first is None else first.device

        def torch_forward(x: np.ndarray) -> np.ndarray:
            with torch.no_grad():  # the inputs go where the model lives (a CUDA model stays on its GPU)
                xt = torch.as_tensor(x) if device is None else torch.as_tensor(x).to(device)
                return to_numpy(logits_of(model(xt)))

        return torch_forward
    if mod.startswith(("keras", "tensorflow", "tf_keras")):
        return lambda x: to_numpy(logits_of(model(x, training=False)))
    if callable(model):
        return lambda x: to_numpy(logits_of(model(x)))
    raise OptionError(f"builtin evaluator: cannot run a {type(model).__name__}; give [evaluator] function instead")


def _array(a: Any, what: str) -> np.ndarray:
    if isinstance(a, Mapping) and "input_ids" in a:  # a tokenizer's output
        a = a["input_ids"]
    try:
        arr = to_numpy(a)
    except (TypeError, ValueError) as exc:
        raise OptionError(f"[evaluator] data: the {what} are not one array ({exc})") from None
    if arr.dtype == object or arr.ndim == 0 or len(arr) == 0:
        raise OptionError(f"[evaluator] data: the {what} must be a non-empty array (equal lengths), got {arr.dtype} "
                          f"of shape {arr.shape}")
    return arr


def _pair(obj: Any) -> bool:
    """Whether ``obj`` is one ``(x, y)`` (two arrays or nested lists), not a list of two batches."""
    return isinstance(obj, (tuple, list)) and len(obj) == 2 and all(
        _is_tensor(v) or (isinstance(v, list) and not (v and isinstance(v[0], tuple))) for v in obj)


def load_data(obj: Any, kind: str) -> tuple[np.ndarray, np.ndarray | None, int | None]:
    """``(x, y, loader batch size)`` from what ``[evaluator] data`` returned.

    ``(x, y)`` for classification and regression; token ids (an array or a mapping with
    ``input_ids``) for the language-model built-ins; or, for any of them, an iterable of such
    batches (a data loader), concatenated in order (the third item is then its first batch's size).

    >>> x, y, b = load_data([(np.zeros((2, 3)), np.array([0, 1])), (np.ones((1, 3)), np.array([1]))], "classification")
    >>> x.shape, y.tolist(), b
    ((3, 3), [0, 1, 1], 2)
    """
    tokens = kind in TOKEN_KINDS
    single = _is_tensor(obj) or isinstance(obj, Mapping) if tokens else _pair(obj)
    if tokens and isinstance(obj, (list, tuple)) and obj and not (_is_tensor(obj[0]) or isinstance(obj[0], (Mapping, tuple))):
        single = True  # nested lists of token ids
    batches = [obj] if single else None
    if batches is None:
        if isinstance(obj, (str, bytes)) or not hasattr(obj, "__iter__"):
            want = "token ids" if tokens else "(x, y)"
            raise OptionError(f"[evaluator] data must return {want} or a data loader yielding them, "
                              f"got a {type(obj).__name__}")
        batches = list(obj)
        if not batches:
            raise OptionError("[evaluator] data: the data loader yielded no batch")
    xs, ys = [], []
    for b in batches:
        if tokens:
            xs.append(_array(b[0] if isinstance(b, (tuple, list)) and not _is_tensor(b) and len(b) == 2
                             and _is_tensor(b[0]) else b, "token ids"))
        else:
            if not _pair(b):
                raise OptionError(f"[evaluator] data: a {kind} batch is (x, y), got a {type(b).__name__}")
            xs.append(_array(b[0], "inputs"))
            ys.append(_array(b[1], "labels"))
    try:
        x = xs[0] if len(xs) == 1 else np.concatenate(xs)
        y = None if tokens else (ys[0] if len(ys) == 1 else np.concatenate(ys))
    except ValueError as exc:
        raise OptionError(f"[evaluator] data: the batches do not stack ({exc})") from None
    if tokens:
        if x.dtype.kind not in "iu" or x.ndim != 2:
            raise OptionError(f"[evaluator] builtin = '{kind}' needs integer token ids of shape (sequences, length), "
                              f"got {x.dtype} {x.shape}")
        if kind == "language-model" and x.shape[1] < 2:
            raise OptionError("[evaluator] builtin = 'language-model' needs sequences of at least 2 tokens")
    elif len(x) != len(y):
        raise OptionError(f"[evaluator] data: {len(x)} inputs but {len(y)} labels")
    return x, y, (None if single else len(xs[0]))


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Per input, its predicted class (k = 1) or its set of k best classes (sorted, so sets compare)."""
    if scores.ndim < 2:
        raise OptionError(f"builtin classification: the model's outputs have shape {scores.shape}; "
                          "expected (inputs, classes) scores")
    if k == 1:
        return np.argmax(scores, axis=-1)
    if k > scores.shape[-1]:
        raise OptionError(f"[evaluator] top_k = {k} exceeds the {scores.shape[-1]} classes of the model's outputs")
    return np.sort(np.argsort(-scores, axis=-1, kind="stable")[..., :k], axis=-1)


def classification_answer(scores: Any, y: np.ndarray, k: int = 1) -> Answer:
    """The built-in classifier judgement of outputs ``scores`` on labels ``y``.

    Predictions are the top-1 class (or, with ``k > 1``, the set of the k best classes);
    the metric is the top-k accuracy.

    >>> a = classification_answer(np.array([[0.1, 0.9], [0.8, 0.2]]), np.array([1, 1]))
    >>> a.predictions.tolist(), a.metric
    ([1, 0], 0.5)
    """
    scores = np.asarray(scores)
    pred = _top_k(scores, k)
    hit = pred == y if k == 1 else (pred == np.asarray(y)[..., None]).any(axis=-1)
    return Answer(scores, pred, float(np.mean(hit)))


def _log_softmax_at(logits: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``log softmax(logits)[..., index]`` along the last axis (NaN where not finite; float32 is plenty and keeps a
    50,000-token vocabulary cheap)."""
    lg = logits.astype(np.float32, copy=False)
    with np.errstate(all="ignore"):
        top = lg.max(axis=-1, keepdims=True)
        lse = np.log(np.exp(lg - top).sum(axis=-1)) + top[..., 0]
        return np.take_along_axis(lg, index[..., None], axis=-1)[..., 0] - lse


def _finite_rows(a: np.ndarray) -> np.ndarray:
    return np.isfinite(a.reshape(len(a), -1)).all(axis=1)


class Builtin:
    """A built-in evaluator (module docstring): ``evaluator(model) -> Answer``.

    Parameters
    ----------
    kind : str
        One of :data:`BUILTIN_KINDS`.
    x, y : arrays
        The evaluation inputs (token ids for the language-model built-ins) and labels (None for those).
    batch_size : int, optional
        Inputs per forward (default: all at once).
    top_k : int
        Classification: the top-k accuracy and answer.
    max_new_tokens : int
        Generation: the tokens decoded greedily per prompt.
    """

    def __init__(self, kind: str, x: np.ndarray, y: np.ndarray | None = None, *, batch_size: int | None = None,
                 top_k: int = 1, max_new_tokens: int = 8) -> None:
        if kind not in BUILTIN_KINDS:
            raise OptionError(f"[evaluator] builtin must be one of {', '.join(BUILTIN_KINDS)}, got {kind!r}")
        self.kind = self.__name__ = kind
        self.x, self.y = x, y
        self.batch_size = int(batch_size or len(x))
        self.chunks = [x[i:i + self.batch_size] for i in range(0, len(x), self.batch_size)]
        self.top_k = top_k
        self.max_new_tokens = int(max_new_tokens)
        #: whether one forward of a chunk's inputs is the whole evaluation of that chunk (golden-prefix reuse)
        self.single_forward = kind != "generation"
        self._golden_tokens: np.ndarray | None = None

    @property
    def inputs(self) -> np.ndarray:
        """The whole evaluation set (what batched activation trials repeat)."""
        return self.x

    def __call__(self, model: Any) -> Answer:
        fwd = model_forward(model)
        return self.run(lambda x, chunk, inputs, only=None: fwd(x), 1)[0]

    def run(self, forward: Callable[[np.ndarray, int | None, np.ndarray | None], np.ndarray], trials: int) -> list[Answer]:
        """The answers of ``trials`` trials evaluated together.

        ``forward(inputs, chunk, chunk_inputs, only=None)`` returns the logits (NumPy, batch first) of ``inputs``:
        the chunk's inputs repeated ``trials`` times (trial ``j``'s rows at ``j*n … j*n+n-1``), or, with
        ``only=j``, trial ``j``'s rows alone. ``chunk`` is the chunk's index and ``chunk_inputs`` its inputs when
        the forward is the chunk's only one (a golden prefix may be reused), else None (generation steps).
        """
        parts: list[list[Any]] = [[] for _ in range(trials)]
        for c, chunk in enumerate(self.chunks):
            step = self._generate if self.kind == "generation" else self._once
            for j, p in enumerate(step(forward, c, chunk, trials)):
                parts[j].append(p)
        return [self.answer(p) for p in parts]

    @staticmethod
    def _tile(chunk: np.ndarray, trials: int) -> np.ndarray:
        return chunk if trials == 1 else np.concatenate([chunk] * trials)

    @staticmethod
    def _forward_all(forward: Callable, x: np.ndarray, n: int, trials: int, chunk: int | None,
                     chunk_x: np.ndarray | None) -> np.ndarray:
        """The logits of ``x`` (``n`` rows per trial) for all trials; a single row per trial runs each trial on its
        own (frameworks pick other kernels for a batch of one, whose last bits differ from a wider batch's)."""
        if n > 1 or trials == 1:
            return forward(x, chunk, chunk_x)
        return np.concatenate([forward(x[j:j + 1], chunk, chunk_x, only=j) for j in range(trials)])

    @staticmethod
    def _rows(out: np.ndarray, n: int, trials: int) -> list[np.ndarray]:
        out = np.asarray(out)
        if out.ndim == 0 or out.shape[0] != n * trials:
            raise OptionError(f"the model's outputs have shape {out.shape} for {n * trials} inputs; a built-in "
                              "evaluator needs outputs with the batch first")
        return [out[j * n:(j + 1) * n] for j in range(trials)]

    def _once(self, forward: Callable, c: int, chunk: np.ndarray, trials: int) -> list[Any]:
        rows = self._rows(self._forward_all(forward, self._tile(chunk, trials), len(chunk), trials, c, chunk),
                          len(chunk), trials)
        if self.kind != "language-model":
            return rows
        out = []
        for lg in rows:
            if lg.ndim != 3 or lg.shape[:2] != chunk.shape:
                raise OptionError(f"builtin language-model: the model's logits have shape {lg.shape}; expected "
                                  f"(sequences, length, vocabulary) = {chunk.shape} + (V,)")
            nll = -_log_softmax_at(lg[:, :-1], chunk[:, 1:].astype(np.int64))
            nll[~_finite_rows(lg)] = np.nan  # a non-finite logit anywhere in a sequence: a DUE
            out.append((np.argmax(lg, axis=-1), nll))
        return out

    def _generate(self, forward: Callable, c: int, chunk: np.ndarray, trials: int) -> list[Any]:
        n = len(chunk)
        ids = self._tile(chunk, trials).astype(np.int64)
        tokens = [[] for _ in range(trials)]
        logp = [[] for _ in range(trials)]
        for _ in range(self.max_new_tokens):
            step = []
            for j, lg in enumerate(self._rows(self._forward_all(forward, ids, n, trials, None, None), n, trials)):
                if lg.ndim != 3 or lg.shape[1] != ids.shape[1]:
                    raise OptionError(f"builtin generation: the model's logits have shape {lg.shape}; expected "
                                      "(prompts, length, vocabulary)")
                last = lg[:, -1]
                nxt = np.argmax(last, axis=-1)
                lp = _log_softmax_at(last, nxt)
                lp[~_finite_rows(last)] = np.nan
                tokens[j].append(nxt)
                logp[j].append(lp)
                step.append(nxt)
            ids = np.concatenate([ids, np.concatenate(step)[:, None].astype(np.int64)], axis=1)
        return [(np.stack(t, axis=1), np.stack(p, axis=1)) for t, p in zip(tokens, logp)]

    def answer(self, parts: Sequence[Any]) -> Answer:
        """The :class:`~fastflip.campaign.outcomes.Answer` of one trial from its per-chunk parts."""
        if self.kind == "classification":
            return classification_answer(np.concatenate(parts), self.y, self.top_k)
        if self.kind == "regression":
            out = np.concatenate(parts)
            if out.shape != self.y.shape and out.size == self.y.size:
                out = out.reshape(self.y.shape)
            return Answer(out, None, float(np.mean((out.astype(np.float64) - self.y) ** 2)))
        pred = np.concatenate([p[0] for p in parts])
        raw = np.concatenate([p[1] for p in parts])
        if self.kind == "language-model":
            with np.errstate(all="ignore"):
                return Answer(raw, pred, float(np.exp(np.mean(raw, dtype=np.float64))))
        if self._golden_tokens is None:  # the first answer is the golden run's (the runner evaluates it first)
            self._golden_tokens = pred
        return Answer(raw, pred, float(np.mean(pred == self._golden_tokens)))
