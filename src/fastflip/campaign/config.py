"""A campaign's definition: a TOML/YAML file and the same as a Python object.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

A campaign is the grid of *cells* (bit position or field × tensor group × flips per
trial × fault model × injection epoch) and, per cell, a number of trials, each one
inject → evaluate → revert. Trial ``i`` of cell ``c`` draws its sites from
``(seed, c, i)`` alone (a counter-based generator), so any trial can be regenerated
without its log, and a resumed sweep gives the same outcomes as an uninterrupted one.

File form (TOML; YAML takes the same keys)::

    name = "resnet-bits"
    seed = 42
    mode = "memory"                # memory (live tensors) | checkpoint (a file per trial)
    paths = ["."]                  # put on sys.path (relative to this file) for factories/evaluators

    [target]
    checkpoint = "model.h5"        # an HDF5 checkpoint ("ckpt-{epoch}.h5" with epochs), or
    # factory = "mymod:weights"    # a function returning {name: ndarray}
    # kind = "activations"         # with a factory returning a PyTorch/Keras model: fault the outputs of
                                   # the selected layers ([select] layers) during each trial's evaluation

    [select]                       # all optional (fastflip.files.select.Selection keys)
    include = ["*kernel*"]
    exclude = []
    dtypes = ["float32"]
    roles = ["weight"]
    layers = []

    [cells]
    bits = ["31", "30", "exponent", "mantissa"]   # one cell per entry (a bit spec)
    group_by = "layer"             # none | tensor | layer | role
    flips = [1]                    # sites per trial
    faults = ["flip"]              # fault models (FaultModel.parse strings)
    epochs = []                    # checkpoint campaigns: injection epochs
    distribution = "element"

    [trials]
    per_cell = 1000                # or margin = 0.01 (Leveugle sample size per cell), or
    # half_width = 0.01            # sequential stopping per cell, in blocks of `block`

    [evaluator]
    function = "mymod:evaluate"    # or builtin = "classification" (or "regression") with
                                   # data = "mymod:heldout" returning (x, y), or builtin =
                                   # "language-model" / "generation" with data returning token ids,
                                   # or command = "python eval.py {checkpoint}" (checkpoint mode)
    returns = ["predictions", "metric"]   # what the function returns (outputs/predictions/metric)
    critical = 0.05                # metric drop above which an SDC is critical
    failure = ["sdc", "critical", "due"]  # outcome classes that count as failure

Examples
--------
>>> c = Campaign.from_dict({"name": "x", "seed": 3, "target": {"factory": "m:f"},
...                         "cells": {"bits": ["31", "0-22"], "flips": [1, 2]},
...                         "trials": {"per_cell": 10}, "evaluator": {"function": "m:e"}})
>>> c.cells.bits, c.trials.per_cell
(['31', '0-22'], 10)
>>> Campaign.from_dict(c.to_dict()) == c
True
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..core import configcheck as cc
from ..core.bits import BitSpec
from ..core.faults import FaultModel
from ..errors import OptionError
from ..files.fileio import atomic_output
from ..files.select import Selection
from .builtins import BUILTIN_KINDS
from .outcomes import DEFAULT_FAILURE, RETURN_KINDS, parse_failure

__all__ = [
    "TargetSpec",
    "CellsSpec",
    "TrialsSpec",
    "EvaluatorSpec",
    "Campaign",
    "load_campaign",
]

GROUP_BY = ("none", "tensor", "layer", "role")
MODES = ("memory", "checkpoint")
BUILTIN_EVALUATORS = BUILTIN_KINDS


_SELECT_KEYS = ("include", "exclude", "regex", "dtypes", "roles", "layers")
_TOP_KEYS = ("name", "seed", "target", "evaluator", "trials", "cells", "select", "mode", "paths", "base_dir")


def _from_mapping(cls: type, data: Any, section: str) -> Any:
    data = cc.table(data, f"[{section}]")
    cc.check_keys(data, [f.name for f in dataclasses.fields(cls)], f"[{section}]")
    return cls(**data)


@dataclass
class TargetSpec:
    """What the faults go into: an HDF5 checkpoint, or a factory returning named arrays or a model.

    ``kind = "activations"`` (a factory's PyTorch/Keras model) puts the faults into the
    outputs of the selected layers during each trial's evaluation instead of its weights.
    """

    checkpoint: str | None = None
    factory: str | None = None
    kind: str = "weights"

    def __post_init__(self) -> None:
        self.checkpoint = cc.opt_string(self.checkpoint, "[target] checkpoint")
        self.factory = cc.opt_string(self.factory, "[target] factory")
        self.kind = cc.choice(self.kind, "[target] kind", ("weights", "activations"))
        if self.kind == "activations" and self.factory is None:
            raise OptionError("[target] kind = 'activations' needs factory = 'module:function' returning the model")
        if (self.checkpoint is None) == (self.factory is None):
            raise OptionError("[target]: give exactly one of checkpoint = 'file.h5' or factory = 'module:function'")
        if self.factory is not None and ":" not in self.factory:
            raise OptionError(f"[target] factory must read 'module:function', got {self.factory!r}")


@dataclass
class CellsSpec:
    """The grid: bits × groups × flips × faults × epochs (see the module docstring)."""

    bits: list[str] = field(default_factory=lambda: ["all"])
    group_by: str = "none"
    flips: list[int] = field(default_factory=lambda: [1])
    faults: list[str] = field(default_factory=lambda: ["flip"])
    epochs: list[int] = field(default_factory=list)
    distribution: str = "element"

    def __post_init__(self) -> None:
        self.bits = cc.strings(self.bits, "[cells] bits", ints_ok=True)
        if not self.bits:
            raise OptionError("[cells] bits: give at least one bit spec (e.g. ['31', 'exponent'])")
        for b in self.bits:
            cc.named("[cells] bits", BitSpec.parse, b)
        self.group_by = cc.choice(self.group_by, "[cells] group_by", GROUP_BY)
        self.flips = cc.ints(self.flips, "[cells] flips", 1)
        if not self.flips:
            raise OptionError("[cells] flips: give at least one number of sites per trial (e.g. [1])")
        self.faults = cc.strings(self.faults, "[cells] faults")
        if not self.faults:
            raise OptionError("[cells] faults: give at least one fault model (e.g. ['flip'])")
        for f in self.faults:
            cc.named("[cells] faults", FaultModel.parse, f)
        self.epochs = cc.ints(self.epochs, "[cells] epochs", 0)
        self.distribution = cc.choice(self.distribution, "[cells] distribution", ("element", "tensor"))


@dataclass
class TrialsSpec:
    """How many trials per cell: fixed, from a margin (Leveugle), or sequential to a half-width."""

    per_cell: int | None = None
    margin: float | None = None
    confidence: float = 0.95
    p: float = 0.5
    half_width: float | None = None
    block: int = 100
    min_trials: int = 100
    max_per_cell: int = 100_000

    def __post_init__(self) -> None:
        if self.per_cell is not None:
            self.per_cell = cc.positive_int(self.per_cell, "[trials] per_cell")
        if self.margin is not None:
            self.margin = cc.number(self.margin, "[trials] margin", 0, 1, lo_open=True, hi_open=True)
        if self.half_width is not None:
            self.half_width = cc.number(self.half_width, "[trials] half_width", 0, 0.5, lo_open=True, hi_open=True)
        self.confidence = cc.number(self.confidence, "[trials] confidence", 0, 1, lo_open=True, hi_open=True)
        self.p = cc.number(self.p, "[trials] p", 0, 1, lo_open=True, hi_open=True)
        self.block = cc.positive_int(self.block, "[trials] block")
        self.min_trials = cc.positive_int(self.min_trials, "[trials] min_trials")
        self.max_per_cell = cc.positive_int(self.max_per_cell, "[trials] max_per_cell")
        given = [k for k in ("per_cell", "margin", "half_width") if getattr(self, k) is not None]
        if len(given) != 1:
            raise OptionError("[trials]: give exactly one of per_cell = N, margin = E (sample size) or half_width = H (sequential)")

    @property
    def sequential(self) -> bool:
        return self.half_width is not None


@dataclass
class EvaluatorSpec:
    """How a trial is judged: a user function, a built-in evaluator or a command (checkpoint mode).

    The outcome classes and what ``failure`` may name are in :mod:`fastflip.campaign.outcomes`.
    """

    function: str | None = None
    builtin: str | None = None
    data: str | None = None
    command: str | None = None
    critical: float = 0.01
    timeout: float | None = None
    returns: list[str] | None = None
    failure: list[str] = field(default_factory=lambda: list(DEFAULT_FAILURE))
    top_k: int = 1
    rtol: float = 0.0
    atol: float = 0.0
    greater_is_better: bool = True
    batch_trials: int | None = None  # trials per forward pass (None: automatic; 1: serial); not part of the identity
    batch_size: int | None = None  # built-ins: inputs per forward (None: the data loader's batches, else all at once)
    max_new_tokens: int | None = None  # builtin = "generation": tokens decoded per prompt (default 8)

    def __post_init__(self) -> None:
        if self.batch_trials is not None:
            self.batch_trials = cc.positive_int(self.batch_trials, "[evaluator] batch_trials")
        for k in ("batch_size", "max_new_tokens"):
            if getattr(self, k) is not None:
                setattr(self, k, cc.positive_int(getattr(self, k), f"[evaluator] {k}"))
        for k in ("function", "builtin", "data", "command"):
            setattr(self, k, cc.opt_string(getattr(self, k), f"[evaluator] {k}"))
        # a NaN or infinite threshold would make every SDC critical or none: refuse it
        self.critical = cc.number(self.critical, "[evaluator] critical")
        if self.timeout is not None:
            self.timeout = cc.number(self.timeout, "[evaluator] timeout", 0, lo_open=True)
        given = [k for k in ("function", "builtin", "command") if getattr(self, k) is not None]
        if len(given) != 1:
            raise OptionError("[evaluator]: give exactly one of function = 'module:function', "
                              f"builtin = {' | '.join(repr(b) for b in BUILTIN_EVALUATORS)} or command = '...'")
        if self.function is not None and ":" not in self.function:
            raise OptionError(f"[evaluator] function must read 'module:function', got {self.function!r}")
        if self.builtin is not None:
            if self.builtin == "accuracy":  # the first name of the classification evaluator
                self.builtin = "classification"
            if self.builtin not in BUILTIN_EVALUATORS:
                raise OptionError(f"[evaluator] builtin must be one of {', '.join(BUILTIN_EVALUATORS)}, got {self.builtin!r}")
            if not self.data or ":" not in self.data:
                what = "(x, y)" if self.builtin in ("classification", "regression") else "token ids"
                raise OptionError(f"[evaluator] builtin = '{self.builtin}' needs data = 'module:function' returning "
                                  f"{what} (or a data loader yielding batches of them)")
            if self.builtin in ("regression", "language-model"):
                self.greater_is_better = False  # their metrics are the mean squared error and the perplexity
        if self.max_new_tokens is not None and self.builtin != "generation":
            raise OptionError("[evaluator] max_new_tokens applies to builtin = 'generation'")
        if self.batch_size is not None and self.builtin is None:
            raise OptionError("[evaluator] batch_size applies to built-in evaluators (a function batches its own data)")
        if self.returns is not None:
            self.returns = cc.strings(self.returns, "[evaluator] returns")
            bad = [r for r in self.returns if r not in RETURN_KINDS]
            if bad or not self.returns or len(set(self.returns)) != len(self.returns):
                raise OptionError(f"[evaluator] returns: name some of {', '.join(RETURN_KINDS)} once each, got {self.returns!r}")
            if self.function is None:
                raise OptionError("[evaluator] returns applies to function evaluators (built-ins and commands say it themselves)")
        self.failure = list(parse_failure(self.failure))
        self.top_k = cc.positive_int(self.top_k, "[evaluator] top_k")
        self.rtol = cc.number(self.rtol, "[evaluator] rtol", 0)
        self.atol = cc.number(self.atol, "[evaluator] atol", 0)
        self.greater_is_better = cc.boolean(self.greater_is_better, "[evaluator] greater_is_better")


@dataclass
class Campaign:
    """A whole campaign (see the module docstring); ``base_dir`` resolves relative paths."""

    name: str
    seed: int
    target: TargetSpec
    evaluator: EvaluatorSpec
    trials: TrialsSpec
    cells: CellsSpec = field(default_factory=CellsSpec)
    select: dict[str, list[str]] = field(default_factory=dict)
    mode: str = "memory"
    paths: list[str] = field(default_factory=list)
    base_dir: str = "."

    def __post_init__(self) -> None:
        self.name = cc.string(self.name, "name")
        self.seed = cc.integer(self.seed, "seed", 0, 2**63 - 1)
        self.mode = cc.choice(self.mode, "mode", MODES)
        if self.cells.epochs and self.target.checkpoint is None:
            raise OptionError("[cells] epochs need a checkpoint target (a path with {epoch})")
        if self.cells.epochs and "{epoch}" not in (self.target.checkpoint or ""):
            raise OptionError("[cells] epochs: the checkpoint path must contain {epoch}, e.g. 'ckpt-{epoch}.h5'")
        if self.evaluator.command is not None and self.mode != "checkpoint":
            raise OptionError("[evaluator] command needs mode = 'checkpoint' (it is given the checkpoint path)")
        if self.target.kind == "activations" and (self.mode != "memory" or self.cells.epochs):
            raise OptionError("[target] kind = 'activations' runs in mode = 'memory' without [cells] epochs")
        if self.mode == "checkpoint" and self.target.checkpoint is None:
            raise OptionError("mode = 'checkpoint' needs [target] checkpoint")
        self.paths = cc.strings(self.paths, "paths")
        select = cc.table(self.select, "[select]")
        cc.check_keys(select, _SELECT_KEYS, "[select]")
        select = {k: cc.strings(v, f"[select] {k}") for k, v in select.items()}
        self.select = cc.named("[select]", Selection.from_dict, select).as_dict()  # validates; canonical lists
        self.select = {k: v for k, v in self.select.items() if v}

    # -------------------------------------------------------------- conversion
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base_dir: str | None = None) -> "Campaign":
        """Build from the file's mapping (sections as nested mappings)."""
        data = cc.table(data, "campaign", optional=False)
        cc.check_keys(data, _TOP_KEYS, "campaign")
        for key in ("name", "seed", "target", "evaluator", "trials"):
            if key not in data:
                raise OptionError(f"campaign: missing {key!r}")
        return cls(
            name=data["name"],
            seed=data["seed"],
            target=_from_mapping(TargetSpec, data["target"], "target"),
            evaluator=_from_mapping(EvaluatorSpec, data["evaluator"], "evaluator"),
            trials=_from_mapping(TrialsSpec, data["trials"], "trials"),
            cells=_from_mapping(CellsSpec, data.get("cells"), "cells"),
            select=data.get("select"),
            mode=data.get("mode", "memory"),
            paths=data.get("paths", []),
            base_dir=base_dir if base_dir is not None else cc.string(data.get("base_dir", "."), "base_dir"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready mapping (``from_dict(to_dict())`` gives an equal campaign)."""
        return dataclasses.asdict(self)

    def definition(self) -> dict[str, Any]:
        """What identifies the campaign's results (everything but where it was loaded from)."""
        d = self._file_dict()
        d["evaluator"].pop("batch_trials", None)  # how many trials share a forward pass changes no result
        for k in ("batch_size", "max_new_tokens"):  # unset: the identity of campaigns written before these keys
            if d["evaluator"].get(k) is None:
                d["evaluator"].pop(k, None)
        return d

    def _file_dict(self) -> dict[str, Any]:
        d = self.to_dict()
        d.pop("base_dir")
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_toml(self) -> str:
        """The campaign as a TOML file's text (``load_campaign`` reads it back to an equal campaign).

        >>> c = Campaign.from_dict({"name": "x", "seed": 3, "target": {"factory": "m:f"},
        ...                         "trials": {"per_cell": 10}, "evaluator": {"function": "m:e"}})
        >>> print(c.to_toml().splitlines()[0])
        name = "x"
        """
        d = self._file_dict()
        lines = [f"{k} = {_toml_value(v)}" for k, v in d.items() if not isinstance(v, dict) and v is not None]
        for k, v in d.items():
            if isinstance(v, dict):
                lines.append(f"\n[{k}]")
                lines += [f"{kk} = {_toml_value(vv)}" for kk, vv in v.items() if vv is not None]
        return "\n".join(lines) + "\n"

    def save(self, path: str) -> None:
        """Write the campaign to a ``.toml`` or ``.yaml`` file (relative paths stay relative)."""
        ext = os.path.splitext(path)[1].lower()
        if ext == ".toml":
            text = self.to_toml()
        elif ext in (".yaml", ".yml"):
            import yaml

            text = yaml.safe_dump(self._file_dict(), sort_keys=False)
        else:
            raise OptionError(f"campaign file {path}: use a .toml or .yaml file")
        with atomic_output(path) as tmp:
            with open(tmp, "w") as fh:
                fh.write(text)

    def resolve(self, path: str) -> str:
        """A path of the campaign file, made absolute against ``base_dir``."""
        return path if os.path.isabs(path) else os.path.normpath(os.path.join(self.base_dir, path))

    def checkpoint_path(self, epoch: int | None = None) -> str:
        assert self.target.checkpoint is not None
        p = self.target.checkpoint
        if epoch is not None:
            p = p.replace("{epoch}", str(epoch))
        return self.resolve(p)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise OptionError(f"cannot write {type(v).__name__} values to TOML")


def load_campaign(path: str) -> Campaign:
    """Read a campaign from a ``.toml`` or ``.yaml``/``.yml`` file (paths resolve against its folder)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise OptionError(f"cannot read campaign file {path}: {exc.strerror or exc}") from exc
    ext = os.path.splitext(path)[1].lower()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise OptionError(f"{path}: not a text file (a campaign file is TOML or YAML text)") from None
    if ext in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:  # pragma: no cover - extras
            raise OptionError("YAML campaign files need pyyaml: pip install 'fastflip[yaml]'") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise OptionError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    elif ext == ".toml":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise OptionError(f"{path}: not valid TOML ({exc})") from exc
    else:
        raise OptionError(f"campaign file {path}: use a .toml or .yaml file")
    if not isinstance(data, dict):
        raise OptionError(f"{path}: a campaign file holds a table of settings")
    try:
        return Campaign.from_dict(data, base_dir=os.path.dirname(os.path.abspath(path)))
    except OptionError as exc:  # name the file: "campaign.toml: [trials] per_cell must be ..."
        raise OptionError(f"{path}: {exc}") from None

