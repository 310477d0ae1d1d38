"""Read configuration files of the older checkpoint corrupter (hdf5_corrupter) and map them faithfully.

Keys and how they map to :func:`fastflip.inject.inject_file` options:

=========================  ================================================================
old key                    fastflip
=========================  ================================================================
hdf5_file                  the input file (a path given on the command line wins)
injection_type: count      ``injection_tries`` attempts, each made with probability
                           ``injection_probability``: count ~ Binomial(tries, p) drawn from
                           the seeded generator (p = 1 gives exactly ``tries``)
injection_type: percentage ``injection_tries`` percent of *all* entries of the selected
                           datasets are attempted, each with probability ``injection_probability``
float_precision            the old tool packed values at this width; fastflip always uses the
                           dataset's real dtype and warns when they disagree
first_bit, last_bit        inclusive range in the old *sign-first* numbering (0 = sign bit);
                           positions past a dtype's width are clamped, with a warning
burst                      n > 1: ``adjacent:n`` (n consecutive bits inside the range)
bit_mask                   a string of 0/1 in sign-first order placed at ``first_bit``:
                           the fixed ``mask`` model
scaling_factor             ``scale:factor`` (when not 1 / null)
allow_sign_change: false   the sign bit is removed from the allowed bits
allow_NaN_values: false    ``nan_policy='avoid'``
use_random_locations       true: every dataset; false: only ``locations_to_corrupt``
locations_to_corrupt       list of dataset paths (exact)
save_injection_sequence,   the log is written to ``injection_sequence_path`` (else beside
injection_sequence_path    the output as usual)
=========================  ================================================================

Sites are sampled uniformly over elements (the old tool picked a dataset first; use
``distribution='tensor'`` to get that behaviour back).

Examples
--------
>>> cfg = {"injection_type": "count", "injection_tries": 5, "injection_probability": 1.0,
...        "first_bit": 1, "last_bit": 8, "float_precision": 32}
>>> m = map_old_config(cfg, dtypes=["<f4"])
>>> m.kwargs["count"], m.kwargs["bits"], m.kwargs["sign_first"], m.warnings
(5, '1-8', True, [])
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from .errors import InputFileError, OptionError
from .select import Selection

__all__ = ["OLD_KEYS", "OldConfigMapping", "load_old_config", "map_old_config"]

OLD_KEYS = ("hdf5_file", "log_file", "injection_probability", "injection_type", "injection_tries", "float_precision",
            "first_bit", "last_bit", "burst", "bit_mask", "scaling_factor", "allow_sign_change", "allow_NaN_values",
            "use_random_locations", "locations_to_corrupt", "save_injection_sequence", "injection_sequence_path")


@dataclass
class OldConfigMapping:
    """The mapped options (``kwargs`` for inject_file, minus ``count`` for probabilistic tries) and warnings."""

    kwargs: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    input_file: str | None = None
    attempts: int = 0
    probability: float = 1.0


def load_old_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse the YAML file (PyYAML, the ``yaml`` extra); unknown keys raise OptionError."""
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise InputFileError(f"{p}: config file not found")
    try:
        import yaml
    except ImportError:  # pragma: no cover - the yaml extra is installed by the README set-up
        raise OptionError("reading old YAML configs needs PyYAML: pip install 'fastflip[yaml]'") from None
    try:
        with open(p) as fh:
            data = yaml.safe_load(fh) or {}
    except yaml.YAMLError as exc:
        raise OptionError(f"{p}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise OptionError(f"{p}: expected a mapping of keys (hdf5_file, injection_tries, ...)")
    unknown = sorted(set(data) - set(OLD_KEYS))
    if unknown:
        raise OptionError(f"{p}: unknown key {unknown[0]!r}; known keys: {', '.join(OLD_KEYS)}")
    return data


def _truthy(v: Any, default: bool) -> bool:
    if v is None:
        return default
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def map_old_config(cfg: Mapping[str, Any], dtypes: Iterable[str], total_elements: int | None = None,
                   seed: int | None = None) -> OldConfigMapping:
    """Map old keys to inject_file options for a file whose selected tensors have ``dtypes``."""
    warnings: list[str] = []
    kw: dict[str, Any] = {}
    dts = sorted({np.dtype(d).str for d in dtypes})
    widths = sorted({np.dtype(d).itemsize * 8 for d in dts if np.dtype(d).kind == "f"}) or sorted(
        {np.dtype(d).itemsize * 8 for d in dts})
    prec = cfg.get("float_precision")
    if prec is not None and widths and any(int(prec) != w for w in widths):
        warnings.append(f"float_precision {prec} disagrees with the data ({', '.join(dts)}): "
                        "the real dtype is used, so every logged flip changes the stored value")
    width = min(widths) if widths else 64
    first = int(cfg.get("first_bit", 0) or 0)
    last = cfg.get("last_bit")
    last = width - 1 if last is None else int(last)
    if last >= width:
        warnings.append(f"last_bit {last} lies past the {width}-bit data; clamped to {width - 1}")
        last = width - 1
    if first > last:
        raise OptionError(f"first_bit {first} is after last_bit {last}")
    positions = list(range(first, last + 1))
    if not _truthy(cfg.get("allow_sign_change"), True):
        positions = [p for p in positions if p != 0]  # sign-first: 0 is the sign bit
        if not positions:
            raise OptionError("the bit range holds only the sign bit but allow_sign_change is false")
    kw["bits"] = f"{first}-{last}" if positions == list(range(first, last + 1)) else ",".join(map(str, positions))
    kw["sign_first"] = True
    mask = cfg.get("bit_mask")
    burst = cfg.get("burst")
    factor = cfg.get("scaling_factor")
    if mask not in (None, "", 0):
        s = str(mask).strip()
        if set(s) - {"0", "1"}:
            raise OptionError(f"bit_mask {mask!r}: give a string of 0 and 1 (sign-first order)")
        pattern = 0
        for j, ch in enumerate(s):
            if ch == "1":
                pos = width - 1 - (first + j)
                if pos < 0:
                    raise OptionError(f"bit_mask {s!r} starting at first_bit {first} runs past the {width}-bit word")
                pattern |= 1 << pos
        kw["model"] = f"mask:{pattern:#x}"
        kw["bits"] = None
        kw["sign_first"] = False
    elif burst not in (None, 0, 1, False):
        kw["model"] = f"adjacent:{int(burst)}"
    elif factor not in (None, 1, 1.0):
        kw["model"] = f"scale:{float(factor)}"
    else:
        kw["model"] = "flip"
    if not _truthy(cfg.get("allow_NaN_values"), True):
        kw["nan_policy"] = "avoid"
    if not _truthy(cfg.get("use_random_locations"), True):
        locs = cfg.get("locations_to_corrupt") or []
        if isinstance(locs, str):
            locs = [locs]
        if not locs:
            raise OptionError("use_random_locations is false but locations_to_corrupt is empty")
        kw["selection"] = Selection(include=tuple("/" + str(x).lstrip("/") for x in locs))
    if _truthy(cfg.get("save_injection_sequence"), False) and cfg.get("injection_sequence_path"):
        kw["log_path"] = str(cfg["injection_sequence_path"])
    kind = str(cfg.get("injection_type", "count")).lower()
    tries = cfg.get("injection_tries", 1)
    prob = float(cfg.get("injection_probability", 1.0) if cfg.get("injection_probability") is not None else 1.0)
    if not 0 <= prob <= 1:
        raise OptionError(f"injection_probability {prob} must lie in [0, 1]")
    if kind == "count":
        attempts = int(tries)
    elif kind == "percentage":
        if total_elements is None:
            raise OptionError("injection_type percentage needs the number of entries of the file")
        attempts = int(round(float(tries) / 100.0 * total_elements))
    else:
        raise OptionError(f"injection_type {kind!r}: use count or percentage")
    if prob >= 1.0:
        kw["count"] = attempts
    else:
        rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([int(seed or 0), 0x01D])))
        kw["count"] = int(rng.binomial(attempts, prob))
    return OldConfigMapping(kw, warnings, cfg.get("hdf5_file"), attempts, prob)
