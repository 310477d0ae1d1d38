"""The outcome vocabulary of fastflip: what a campaign trial and an experiment run can end as.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

One table (``docs/outcomes.md``) names every class; this module holds the names, the
campaign trial's judge and the ``failure`` selection. It imports only NumPy and
:mod:`fastflip.errors`: the campaign, the store, the reports and the
experiment import their names from here.

Campaign trials (:data:`TRIAL_OUTCOMES`, stored as codes 0–3 in that order)
    * ``masked``: the task's answer is unchanged (for a classifier: every input's top-k
      prediction). A masked trial whose raw outputs changed (only numerically) carries the
      flag ``numeric`` and is counted as the visible sub-class ``masked_numeric``; it is
      not a failure unless ``failure`` names it.
    * ``sdc``: the answer changed (for a classifier: the prediction of at least one
      input); the fraction of inputs whose answer changed is stored.
    * ``critical``: an SDC whose metric got worse by more than ``critical``.
    * ``due``: NaN/Inf outputs or metric, an exception, or a worker that died.

Experiment runs (:data:`RUN_OUTCOMES`): ``masked``, ``recovered``, ``degraded``,
``diverged``, ``crashed`` (see :mod:`fastflip.experiment.outcomes`). ``masked`` means the
same there: the fault left no visible trace in what the run is judged on.

Examples
--------
>>> parse_failure(["sdc", "due"])
('sdc', 'due')
>>> counts = {"masked": 90, "masked_numeric": 30, "sdc": 6, "critical": 1, "due": 3}
>>> failure_count(counts, DEFAULT_FAILURE), failure_count(counts, ("masked_numeric", "sdc", "critical", "due"))
(10, 40)
>>> golden = Answer(outputs=np.array([[2.0, 1.0], [0.0, 3.0]]), predictions=np.array([0, 1]), metric=1.0)
>>> judge(golden, Answer(np.array([[2.0, 1.5], [0.0, 3.0]]), np.array([0, 1]), 1.0), critical=0.1)
Judgement(outcome=0, numeric=True, changed=0.0, metric=1.0, delta=0.0)
>>> judge(golden, Answer(np.array([[1.0, 2.0], [0.0, 3.0]]), np.array([1, 1]), 0.5), critical=0.1)
Judgement(outcome=2, numeric=True, changed=0.5, metric=0.5, delta=0.5)
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import OptionError

__all__ = [
    "TRIAL_OUTCOMES",
    "RUN_OUTCOMES",
    "RUN_DEFAULT_FAILURE",
    "MASKED", "SDC", "CRITICAL", "DUE",
    "MASKED_NUMERIC",
    "FAILURE_CLASSES",
    "DEFAULT_FAILURE",
    "COUNT_CLASSES",
    "parse_failure",
    "failure_count",
    "failure_sql",
    "Answer",
    "Judgement",
    "judge",
    "answer_from",
    "RETURN_KINDS",
]

#: Exclusive classes of a campaign trial, in the order of their stored codes.
TRIAL_OUTCOMES = ("masked", "sdc", "critical", "due")
MASKED, SDC, CRITICAL, DUE = 0, 1, 2, 3
#: The visible sub-class of ``masked``: the answer held, the raw outputs changed.
MASKED_NUMERIC = "masked_numeric"
#: Classes ``[evaluator] failure`` may name.
FAILURE_CLASSES = (MASKED_NUMERIC, "sdc", "critical", "due")
#: What counts as a failure unless the campaign says otherwise.
DEFAULT_FAILURE = ("sdc", "critical", "due")
#: Every count a summary carries per cell (``masked`` includes ``masked_numeric``).
COUNT_CLASSES = ("masked", MASKED_NUMERIC, "sdc", "critical", "due")
#: Exclusive classes of an experiment run (:mod:`fastflip.experiment.outcomes`).
RUN_OUTCOMES = ("masked", "recovered", "degraded", "diverged", "crashed")
#: What counts as a failed experiment run unless the experiment says otherwise.
RUN_DEFAULT_FAILURE = ("degraded", "diverged", "crashed")
#: What a custom evaluator may return (``[evaluator] returns``).
RETURN_KINDS = ("outputs", "predictions", "metric")


def parse_failure(classes: Iterable[str] | str | None) -> tuple[str, ...]:
    """Validate ``[evaluator] failure``: a non-empty list of :data:`FAILURE_CLASSES` (kept in that order).

    >>> parse_failure("due")
    ('due',)
    >>> parse_failure(["crash"])
    Traceback (most recent call last):
    ...
    fastflip.errors.OptionError: [evaluator] failure: unknown outcome class 'crash'; choose from masked_numeric, sdc, critical, due
    """
    if classes is None:
        return DEFAULT_FAILURE
    items = [classes] if isinstance(classes, str) else list(classes)
    for c in items:
        if c == "masked":
            raise OptionError("[evaluator] failure: 'masked' means the answer held and cannot be a failure; "
                              f"choose from {', '.join(FAILURE_CLASSES)}")
        if c not in FAILURE_CLASSES:
            raise OptionError(f"[evaluator] failure: unknown outcome class {c!r}; choose from {', '.join(FAILURE_CLASSES)}")
    if not items:
        raise OptionError(f"[evaluator] failure: name at least one class of {', '.join(FAILURE_CLASSES)}")
    return tuple(c for c in FAILURE_CLASSES if c in items)


def failure_count(counts: Mapping[str, Any], failure: Sequence[str] = DEFAULT_FAILURE) -> Any:
    """Failures among ``counts`` (a mapping of :data:`COUNT_CLASSES` to counts or count arrays)."""
    total: Any = 0
    for c in failure:
        total = total + counts[c]
    return total


def failure_sql(failure: Sequence[str] = DEFAULT_FAILURE, outcome: str = "outcome", numeric: str = "numeric") -> str:
    """An SQL boolean over a trials row that is true for a failure.

    >>> failure_sql(("masked_numeric", "due"))
    '(outcome IN (3) OR (outcome = 0 AND COALESCE(numeric, 0) = 1))'
    """
    codes = [str(TRIAL_OUTCOMES.index(c)) for c in failure if c != MASKED_NUMERIC]
    parts = [f"{outcome} IN ({', '.join(codes)})"] if codes else []
    if MASKED_NUMERIC in failure:
        parts.append(f"({outcome} = {MASKED} AND COALESCE({numeric}, 0) = 1)")
    return "(" + " OR ".join(parts) + ")"


class Answer(NamedTuple):
    """What an evaluator said about one model state: raw outputs, predictions, metric (each optional)."""

    outputs: np.ndarray | None
    predictions: np.ndarray | None
    metric: float | None


class Judgement(NamedTuple):
    """A trial's outcome code, its ``numeric`` flag, the fraction of inputs whose answer changed,
    its metric and how much worse the metric got (``delta``, positive = worse)."""

    outcome: int
    numeric: bool | None
    changed: float | None
    metric: float | None
    delta: float | None


def _usable(x: Any) -> bool:
    return x is not None and not isinstance(x, (str, bytes))


def answer_from(result: Any, returns: Sequence[str] | None = None) -> Answer:
    """Normalise an evaluator's result into an :class:`Answer`.

    ``returns`` names what the evaluator gives (:data:`RETURN_KINDS`): with one kind the
    result is that value; with several, a mapping with those keys or a tuple in that
    order. Without ``returns`` the result is read as before: a mapping with
    ``outputs``/``predictions``/``metric``, an ``(outputs, metric)`` pair, a number
    (metric) or an array (outputs). Anything else is an :class:`~fastflip.errors.OptionError`.

    >>> answer_from(0.5).metric
    0.5
    >>> answer_from({"predictions": [1, 2]}, ["predictions"]).predictions
    array([1, 2])
    >>> answer_from(None)
    Traceback (most recent call last):
    ...
    fastflip.errors.OptionError: the evaluator returned None: return a metric, outputs, predictions or a mapping of them ([evaluator] returns)
    """
    if isinstance(result, Answer):
        return result
    if result is None or isinstance(result, (str, bytes)):
        raise OptionError(f"the evaluator returned {result!r}: return a metric, outputs, predictions or a mapping "
                          "of them ([evaluator] returns)")
    got: dict[str, Any] = {}
    if returns:
        kinds = list(returns)
        if len(kinds) == 1 and not isinstance(result, Mapping):
            got[kinds[0]] = result
        elif isinstance(result, Mapping):
            missing = [k for k in kinds if k not in result]
            if missing:
                raise OptionError(f"the evaluator's mapping lacks {', '.join(missing)} (it has {', '.join(map(str, result))}); "
                                  "[evaluator] returns names what it must hold")
            got = {k: result[k] for k in kinds}
        elif isinstance(result, tuple) and len(result) == len(kinds):
            got = dict(zip(kinds, result))
        else:
            raise OptionError(f"the evaluator returned a {type(result).__name__}, not the {', '.join(kinds)} "
                              "that [evaluator] returns names (a mapping or a tuple in that order)")
    elif isinstance(result, Mapping):
        got = {k: result[k] for k in RETURN_KINDS if k in result and result[k] is not None}
        if not got:
            raise OptionError("an evaluator's mapping must hold 'outputs', 'predictions' and/or 'metric'")
    elif isinstance(result, tuple) and len(result) == 2:
        got = {"outputs": result[0], "metric": result[1]}
    else:
        arr = np.asarray(result)
        if arr.dtype.kind not in "biufc":
            raise OptionError(f"the evaluator returned a {type(result).__name__} that is not numeric; "
                              "return a metric, outputs or predictions ([evaluator] returns)")
        if arr.size == 1:
            got = {"metric": arr.reshape(-1)[0]}
        else:
            got = {"outputs": arr}
    outputs = predictions = None
    metric: float | None = None
    try:
        if _usable(got.get("outputs")):
            outputs = np.asarray(got["outputs"])
        if _usable(got.get("predictions")):
            predictions = np.asarray(got["predictions"])
        if _usable(got.get("metric")):
            metric = float(got["metric"])
    except (TypeError, ValueError) as exc:
        raise OptionError(f"the evaluator's result is not numeric ({exc}); return numbers or arrays") from None
    for name, a in (("outputs", outputs), ("predictions", predictions)):
        if a is not None and (a.dtype.kind not in "biufc" or a.size == 0):
            raise OptionError(f"the evaluator's {name} are {'empty' if a.size == 0 else a.dtype}: "
                              "give a non-empty numeric array")
    if outputs is None and predictions is None and metric is None:
        raise OptionError("the evaluator returned nothing usable: no outputs, predictions or metric")
    return Answer(outputs, predictions, metric)


def _nonfinite(a: np.ndarray | None) -> bool:
    return a is not None and a.dtype.kind in "fc" and not bool(np.isfinite(a).all())


def _rows_changed(golden: np.ndarray, got: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """Per input (first axis), whether ``got`` differs from ``golden`` beyond the tolerance."""
    if golden.shape != got.shape:
        return np.ones(max(1, len(got) if got.ndim else 1), bool)
    if rtol == 0 and atol == 0 or golden.dtype.kind not in "fc":
        diff = golden != got
    else:
        diff = ~np.isclose(got, golden, rtol=rtol, atol=atol, equal_nan=False)
    if diff.ndim == 0:
        return diff.reshape(1)
    return diff.reshape(len(diff), -1).any(axis=1)


def judge(golden: Answer, got: Answer, *, critical: float, rtol: float = 0.0, atol: float = 0.0,
          greater_is_better: bool = True) -> Judgement:
    """Classify one trial against the golden run (see the module docstring and ``docs/outcomes.md``).

    The answer is, in order of preference: the predictions (exact comparison), else the
    outputs (equal within ``rtol``/``atol``; exact when both are 0), else the metric. A
    change of the outputs that leaves the answer unchanged sets ``numeric``.
    """
    metric = got.metric
    if _nonfinite(got.outputs) or _nonfinite(got.predictions) or (metric is not None and not math.isfinite(metric)):
        return Judgement(DUE, None, None, None, None)
    delta = None
    if metric is not None and golden.metric is not None:
        d = golden.metric - metric if greater_is_better else metric - golden.metric
        delta = round(float(d), 12)
    numeric = None
    if golden.outputs is not None and got.outputs is not None:
        numeric = not (golden.outputs.shape == got.outputs.shape and np.array_equal(golden.outputs, got.outputs))
    if golden.predictions is not None and got.predictions is not None:
        rows = _rows_changed(golden.predictions, got.predictions, 0.0, 0.0)
    elif golden.outputs is not None and got.outputs is not None:
        rows = _rows_changed(golden.outputs, got.outputs, rtol, atol)
    elif golden.metric is not None and metric is not None:
        rows = np.array([metric != golden.metric])
    else:
        raise OptionError("the evaluator's trial result has none of the outputs, predictions or metric "
                          "its golden result had; return the same kinds every time")
    changed = float(rows.mean())
    if not rows.any():
        return Judgement(MASKED, numeric, 0.0, metric, delta)
    if numeric is None:
        numeric = True
    outcome = CRITICAL if delta is not None and delta > critical else SDC
    return Judgement(outcome, numeric, changed, metric, delta)
