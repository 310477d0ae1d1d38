"""Configuration of a checkpoint-alteration experiment: the golden run and the fault scenarios.

Layer: ``experiment`` (may import campaign and below; imported by report, compat, cli and the demo).

A configuration is a mapping (a YAML or JSON file, or a dict)::

    name: digits-keras
    epochs: 5              # golden run length N
    seed: 0                # trainer seed (weights, data order) and base of the run seeds
    repetitions: 5         # default R for every scenario
    tolerance: 0.02        # accuracy tolerance of "masked" / "recovered"
    chance: null           # chance-level accuracy (default: the trainer's, else none)
    chance_margin: 0.05    # final accuracy <= chance + margin counts as diverged
    failure: [degraded, diverged, crashed]   # outcome classes counted as failure (rates, tests)
    compare: [[exp-msb-10, low-mantissa]]    # scenario pairs to test (default: every non-control pair)
    trainer: {framework: keras, batch_size: 32}
    scenarios:
      - {name: exp-msb-10, epoch: 2, bits: exponent-msb, count: 10, selection: {roles: [weight, bias]}}
      - {name: mid-epoch, at: {epoch: 3, iteration: 10}, bits: exponent-msb, count: 10}
      - {name: control, epoch: 2, control: true, repetitions: 1}

Each scenario takes the golden checkpoint saved after epoch ``epoch`` (0 = the
initial weights), injects with ``selection``/``bits``/``model``/``count`` (or
``rate``/``ber``)/``distribution``/``nan_policy`` (the arguments of
:func:`fastflip.files.inject.inject_file`), and resumes training to epoch N. A
``control`` scenario injects nothing: its runs must reproduce the golden curve.
``at: {epoch: E, iteration: I}`` injects after ``I`` batches of epoch ``E`` instead:
the golden state there is made once from checkpoint ``E - 1`` and checkpointed.

Examples
--------
>>> cfg = ExperimentConfig.from_dict({"epochs": 3, "scenarios": [{"name": "a", "epoch": 1, "count": 2}]})
>>> sc = cfg.scenarios[0]
>>> sc.repetitions, sc.sampling.bits, sc.sampling.count, cfg.run_seed(sc, 0) == cfg.run_seed(sc, 0) != cfg.run_seed(sc, 1)
(5, 'exponent-msb', 2, True)
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..core import configcheck as cc
from ..core.spec import Sampling
from ..errors import InputFileError, OptionError
from ..files.select import Selection
from .outcomes import check_failure

__all__ = ["Scenario", "ExperimentConfig", "load_config"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SCENARIO_KEYS = {"name", "epoch", "at", "selection", "bits", "model", "count", "rate", "ber", "distribution",
                  "nan_policy", "repetitions", "control", "sign_first"}
_CONFIG_KEYS = {"name", "epochs", "seed", "repetitions", "tolerance", "chance", "chance_margin", "trainer",
                "scenarios", "output", "keep_checkpoints", "failure", "compare"}


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Scenario:
    """One fault scenario: where (``epoch``, ``iteration``, ``selection``), what and how much to inject
    (``sampling``), and how often (``repetitions``).

    ``sampling`` is the scenario's :class:`~fastflip.core.spec.Sampling`, built from its table's sampling keys
    (``bits`` defaults to ``exponent-msb``). A ``control`` scenario injects nothing; when its table gives no
    amount, its sampling is ``count=0`` (flip nothing).
    """

    name: str
    epoch: int
    sampling: Sampling
    selection: Mapping[str, Any] = field(default_factory=dict)
    repetitions: int = 5
    control: bool = False
    iteration: int | None = None

    @property
    def start_epoch(self) -> int:
        """The golden checkpoint a run starts from: ``epoch``, or ``epoch - 1`` for a mid-epoch injection."""
        return self.epoch if self.iteration is None else self.epoch - 1

    def inject_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`fastflip.files.inject.inject_file` for this scenario (a control
        scenario injects nothing: its ``sampling`` is None)."""
        return {"selection": dict(self.selection) or None, "sampling": None if self.control else self.sampling}

    def as_dict(self) -> dict[str, Any]:
        """The scenario as one flat table (its keys filled with their defaults): what ``experiment.json``
        records and :meth:`digest` fingerprints. An amount the table did not give is None."""
        smp = self.sampling
        return {"name": self.name, "epoch": self.epoch, "selection": copy.deepcopy(dict(self.selection)),
                "bits": smp.bits, "model": smp.model, "count": smp.count or None, "rate": smp.rate, "ber": smp.ber,
                "distribution": smp.distribution, "nan_policy": smp.nan_policy, "sign_first": smp.sign_first,
                "repetitions": self.repetitions, "control": self.control, "iteration": self.iteration}

    def digest(self) -> str:
        """A fingerprint of everything that determines this scenario's runs (an experiment resumes the runs
        whose scenario digest is unchanged)."""
        d = self.as_dict()
        if d["iteration"] is None:  # scenarios injecting between epochs keep their earlier fingerprint
            del d["iteration"]
        return _digest(d)


@dataclass(frozen=True)
class ExperimentConfig:
    """A whole experiment (see the module docstring for the keys)."""

    epochs: int
    scenarios: tuple[Scenario, ...]
    name: str = "experiment"
    seed: int = 0
    tolerance: float = 0.02
    chance: float | None = None
    chance_margin: float = 0.05
    trainer: Mapping[str, Any] = field(default_factory=lambda: {"framework": "keras"})
    output: str | None = None
    keep_checkpoints: bool = False
    base_dir: str | None = None
    failure: tuple[str, ...] = ("degraded", "diverged", "crashed")
    compare: tuple[tuple[str, str], ...] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], base_dir: str | None = None) -> "ExperimentConfig":
        """Validate a configuration mapping (unknown keys and bad values raise :class:`OptionError`)."""
        if not isinstance(d, Mapping):
            raise OptionError("experiment configuration: expected a mapping at the top level")
        cc.check_keys(d, _CONFIG_KEYS, "experiment configuration")
        epochs = _int(d.get("epochs"), "epochs", 1)
        default_reps = _int(d.get("repetitions", 5), "repetitions", 1)
        raw = d.get("scenarios") or []
        if not isinstance(raw, (list, tuple)) or not raw:
            raise OptionError("scenarios: give a list of at least one scenario")
        scenarios = []
        for i, s in enumerate(raw):
            scenarios.append(_scenario(s, i, epochs, default_reps))
        names = [s.name for s in scenarios]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise OptionError(f"scenarios: duplicate name {sorted(dup)[0]!r}")
        trainer = _trainer(d.get("trainer") or {"framework": "keras"})
        tol = _float(d.get("tolerance", 0.02), "tolerance", 0.0, 1.0)
        chance = d.get("chance")

        failure = check_failure(d.get("failure"))
        compare = _compare(d.get("compare"), names)
        return cls(
            epochs=epochs, scenarios=tuple(scenarios), name=cc.string(d.get("name", "experiment"), "name"),
            seed=cc.integer(d.get("seed", 0), "seed", 0, 2**32 - 1), tolerance=tol,
            chance=None if chance is None else _float(chance, "chance", 0.0, 1.0),
            chance_margin=_float(d.get("chance_margin", 0.05), "chance_margin", 0.0, 1.0),
            trainer=dict(trainer), output=cc.opt_string(d.get("output"), "output"),
            keep_checkpoints=cc.boolean(d.get("keep_checkpoints", False), "keep_checkpoints"),
            base_dir=base_dir, failure=failure, compare=compare,
        )

    def golden_digest(self) -> str:
        """Fingerprint of what determines the golden run (trainer, epochs, seed)."""
        return _digest({"trainer": dict(self.trainer), "epochs": self.epochs, "seed": self.seed})

    def run_seed(self, scenario: Scenario, rep: int) -> int:
        """The injection seed of repetition ``rep`` of ``scenario`` (stable, distinct, recorded)."""
        ss = np.random.SeedSequence([self.seed, zlib.crc32(scenario.name.encode()), rep])
        return int(ss.generate_state(1, np.uint64)[0] >> np.uint64(1))

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["scenarios"] = [s.as_dict() for s in self.scenarios]
        d.pop("base_dir")
        return d


def _int(v: Any, name: str, lo: int) -> int:
    return cc.integer(v, name, lo)


def _float(v: Any, name: str, lo: float, hi: float) -> float:
    return cc.number(v, name, lo, hi)


_TRAINER_KEYS = {"keras": ("framework", "model_file", "batch_size", "threads", "checkpoint_format"),
                 "torch": ("framework", "model_file", "batch_size", "threads")}


def _trainer(t: Any) -> dict[str, Any]:
    """The ``trainer`` table, its built-in frameworks' keys checked (a custom trainer's are its own)."""
    t = cc.table(t, "trainer", optional=False)
    framework = cc.choice(t.get("framework", "keras"), "trainer.framework", ("keras", "torch", "custom"))
    if "model_file" in t:
        cc.string(t["model_file"], "trainer.model_file")
    if framework == "custom":
        return t
    cc.check_keys(t, _TRAINER_KEYS[framework], "trainer")
    if "batch_size" in t:
        cc.positive_int(t["batch_size"], "trainer.batch_size")
    if t.get("threads") is not None:
        cc.positive_int(t["threads"], "trainer.threads")
    if "checkpoint_format" in t:
        cc.choice(t["checkpoint_format"], "trainer.checkpoint_format", ("weights.h5", "keras"))
    return t




def _scenario(s: Any, i: int, epochs: int, default_reps: int) -> Scenario:
    if not isinstance(s, Mapping):
        raise OptionError(f"scenarios[{i}] must be a table (got {cc.show(s)})")
    cc.check_keys(s, _SCENARIO_KEYS, f"scenarios[{i}]")
    name = cc.string(s.get("name", f"scenario{i}"), f"scenarios[{i}].name")
    if not _NAME.match(name):
        raise OptionError(f"scenarios[{i}].name: {name!r}; use letters, digits, '.', '_' and '-'")
    iteration = None
    if s.get("at") is not None:
        at = s["at"]
        if s.get("epoch") is not None:
            raise OptionError(f"scenarios[{i}] ({name}): give either epoch or at, not both")
        if not isinstance(at, Mapping) or set(at) - {"epoch", "iteration"} or "epoch" not in at:
            raise OptionError(f"scenarios[{i}].at: expected {{epoch: E, iteration: I}} (inject after I batches of epoch E)")
        epoch = _int(at.get("epoch"), f"scenarios[{i}].at.epoch", 1)
        if at.get("iteration") is not None:
            iteration = _int(at["iteration"], f"scenarios[{i}].at.iteration", 1)
        else:  # {epoch: E} alone: at the end of epoch E, the plain form
            pass
    else:
        epoch = _int(s.get("epoch"), f"scenarios[{i}].epoch", 0)
    if epoch > epochs:
        raise OptionError(f"scenarios[{i}].epoch: {epoch} is after the last epoch ({epochs})")
    control = cc.boolean(s.get("control", False), f"scenarios[{i}].control")
    given = [k for k in ("count", "rate", "ber") if s.get(k) is not None]
    if not control and len(given) != 1:
        raise OptionError(f"scenarios[{i}] ({name}): give exactly one of count, rate, ber")
    key = f"scenarios[{i}]"
    selection = cc.table(s.get("selection"), f"{key}.selection")
    cc.check_keys(selection, ("include", "exclude", "regex", "dtypes", "roles", "layers"), f"{key}.selection")
    selection = {k: cc.strings(v, f"{key}.selection.{k}") for k, v in selection.items()}
    cc.named(f"{key}.selection", Selection.from_dict, dict(selection))  # validate now, not mid-experiment
    bits = s.get("bits", "exponent-msb")
    bits = str(bits) if isinstance(bits, int) and not isinstance(bits, bool) else cc.string(bits, f"{key}.bits")
    rate, ber = (None if s.get(k) is None else cc.number(s[k], f"{key}.{k}", 0, 1, lo_open=True) for k in ("rate", "ber"))
    count = None if s.get("count") is None else _int(s["count"], f"scenarios[{i}].count", 1)
    # the sampling fields are checked in one place, the Sampling spec (a control scenario without an amount: count 0)
    fields = {k: s[k] for k in ("model", "distribution", "nan_policy", "sign_first") if k in s}
    amount = {"count": count, "rate": rate, "ber": ber} if given else {"count": 0}
    spec = Sampling.from_mapping({**fields, "bits": bits, **{k: v for k, v in amount.items() if v is not None}},
                                 where=key)
    if not isinstance(spec.distribution, str):
        raise OptionError(f"{key}.distribution must be one of element, tensor (got a table)")
    return Scenario(
        name=name, epoch=epoch, sampling=spec, selection=selection,
        repetitions=_int(s.get("repetitions", default_reps), f"scenarios[{i}].repetitions", 1), control=control,
        iteration=iteration,
    )


def _compare(raw: Any, names: list[str]) -> tuple[tuple[str, str], ...] | None:
    """Validate ``compare: [[a, b], ...]`` (pairs of scenario names to test against each other)."""
    if raw is None:
        return None
    if not isinstance(raw, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in raw):
        raise OptionError("compare: expected a list of scenario pairs such as [[exp-msb, control]]")
    for a, b in raw:
        for n in (a, b):
            if str(n) not in names:
                raise OptionError(f"compare: no scenario named {n!r} (scenarios: {', '.join(names)})")
        if str(a) == str(b):
            raise OptionError(f"compare: {a!r} cannot be tested against itself")
    return tuple((str(a), str(b)) for a, b in raw)


def load_config(source: str | os.PathLike | Mapping[str, Any]) -> ExperimentConfig:
    """Read an experiment configuration from a YAML/JSON file or a mapping."""
    if isinstance(source, Mapping):
        return ExperimentConfig.from_dict(source)
    path = Path(source)
    if not path.is_file():
        raise InputFileError(f"{path}: experiment configuration not found")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise OptionError(f"{path}: not a text file (an experiment configuration is YAML or JSON text)") from None
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read the experiment configuration ({exc.strerror or exc})") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise OptionError(f"{path}: invalid JSON: {exc}") from None
    else:
        try:
            import yaml
        except ImportError:  # pragma: no cover - pyyaml is a declared extra
            raise OptionError(f"{path}: reading YAML needs pyyaml (pip install 'fastflip[yaml]'), or use JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise OptionError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from None
    try:
        return ExperimentConfig.from_dict(data or {}, base_dir=str(path.parent.resolve()))
    except OptionError as exc:  # name the file: "exp.yaml: scenarios[0].count must be ..."
        raise OptionError(f"{path}: {exc}") from None
