"""Settings of the older checkpoint corrupter (hdf5_corrupter): read its YAML configs and flags, check them.

Layer: ``compat`` (may import experiment and below; imported by cli).

:class:`OldSettings` holds what the older tool's settings reader holds after reading a config or its
command-line flags; :func:`settings_from_config` and :func:`settings_from_flags` build it, checking it the
way the older tool did (one-line :class:`~fastflip.errors.OptionError` instead of its exit). Two designs
run it: :mod:`fastflip.compat.oldtool` reproduces the older tool's sampling (the default of
``fastflip inject --config`` and of ``fastflip hdf5-corrupter``), :func:`map_old_config` maps the same
settings onto fastflip's own design (element-uniform, without replacement, exact stored words).
``docs/oldtool.md`` lists every rule next to the older tool's behaviour.

Every key that any version of the older tool read is accepted: ``hdf5_file``, ``log_file_path``
(``log_file``), ``injection_probability``, ``injection_type``, ``injection_tries``, ``float_precision``,
``first_bit``, ``last_bit``, ``burst``, ``bit_mask``, ``scaling_factor``, ``allow_sign_change``,
``allow_NaN_values``, ``use_random_locations``, ``locations_to_corrupt``, ``save_injection_sequence``,
``load_injection_sequence``, ``injection_sequence_path``, and the first version's ``prob``,
``max_corruption_percentage``, ``first_byte``, ``last_byte``, ``bit`` (read, and ignored with a warning).

Examples
--------
>>> s = settings_from_config({"hdf5_file": "m.h5", "log_file_path": "log-", "injection_probability": 1,
...     "injection_type": "count", "injection_tries": 5, "float_precision": 64, "first_bit": 1, "last_bit": 8,
...     "allow_sign_change": True, "allow_NaN_values": False, "use_random_locations": True,
...     "locations_to_corrupt": [], "save_injection_sequence": False})
>>> s.tries, s.first_bit, s.last_bit, s.slot_bits()
(5.0, 1, 8, [0, 1, 2, 3, 4, 5, 6, 7, 8])
>>> s.mode
'range'
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from ..errors import InputFileError, OptionError
from ..files.select import Selection

__all__ = ["OLD_KEYS", "REQUIRED_KEYS", "OldSettings", "OldConfigMapping", "load_old_config", "settings_from_config",
           "settings_from_flags", "expand_locations", "map_old_config", "refused_by_old_tool", "config_with_flags",
           "FLAG_KEYS"]

REQUIRED_KEYS = ("hdf5_file", "log_file_path", "injection_probability", "injection_type", "injection_tries",
                 "allow_sign_change", "allow_NaN_values", "use_random_locations", "locations_to_corrupt",
                 "save_injection_sequence")
OPTIONAL_KEYS = ("float_precision", "first_bit", "last_bit", "burst", "bit_mask", "scaling_factor",
                 "injection_sequence_path", "load_injection_sequence", "log_file")
FIRST_VERSION_KEYS = ("prob", "max_corruption_percentage", "first_byte", "last_byte", "bit")
OLD_KEYS = REQUIRED_KEYS + OPTIONAL_KEYS + FIRST_VERSION_KEYS


@dataclass(frozen=True)
class OldSettings:
    """The older tool's settings after reading (names as its YAML keys; bits in its sign-first numbering).

    ``mode`` is ``'range'`` (flip ``burst`` distinct bits of ``first_bit..last_bit``), ``'mask'``
    (``bit_mask`` at a random offset) or ``'scale'`` (``scaling_factor``). ``precision`` is 16, 32, 64 or
    ``'auto'``: the width the older tool packed every float value at before flipping.
    """

    hdf5_file: str | None = None
    log_file_path: str = ""
    probability: float = 1.0
    injection_type: str = "count"
    tries: float = 1
    precision: int | str = 64
    first_bit: int | None = None
    last_bit: int | None = None
    burst: int = 1
    bit_mask: str | None = None
    scaling_factor: float | None = None
    allow_sign_change: bool = True
    allow_nan: bool = False
    use_random_locations: bool = True
    locations: tuple[str, ...] = ()
    save_sequence: bool = False
    save_indexes: bool = True
    sequence_path: str = ""
    load_sequence: bool = False
    warnings: tuple[str, ...] = field(default=(), compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def mode(self) -> str:
        if self.scaling_factor is not None:
            return "scale"
        return "mask" if self.bit_mask is not None else "range"

    def width(self, stored_bits: int) -> int:
        """The float width values are packed at (``auto``: the stored width)."""
        return stored_bits if self.precision == "auto" else int(self.precision)

    def bit_range(self, width: int) -> tuple[int, int]:
        """(first, last) sign-first bit range for a ``width``-bit float (the full word when not given)."""
        first = 0 if self.first_bit is None or self.precision == "auto" else self.first_bit
        last = width - 1 if self.last_bit is None or self.precision == "auto" else self.last_bit
        return first, last

    def slots(self, width: int) -> tuple[int, int]:
        """The older tool's draw range ``start..end`` (inclusive): with ``allow_sign_change`` and a range that
        starts after the sign, the start moves down by one and the start slot stands for the sign bit."""
        first, last = self.bit_range(width)
        if self.allow_sign_change and first > 0:
            first -= 1
        return first, last

    def slot_bits(self, width: int = 32) -> list[int]:
        """The sign-first bit each slot of :meth:`slots` flips, in slot order."""
        start, end = self.slots(width)
        return [0 if (self.allow_sign_change and s == start) else s for s in range(start, end + 1)]

    def attempts(self, file_entries: int) -> int:
        """Injection attempts: ``count`` truncates the tries; ``percentage`` is ``int(tries * entries / 100)``
        over every entry of the file (truncated, as the older tool did)."""
        if self.injection_type == "percentage":
            return int(self.tries * file_entries / 100)
        return int(self.tries)


@dataclass
class OldConfigMapping:
    """Options for :func:`fastflip.files.inject.inject_file` in fastflip's own design, and warnings."""

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
        import yaml  # the yaml extra
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


def _num(cfg: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    v = cfg.get(key)
    if v is None:
        return default
    try:
        return kind(float(v)) if kind is int else kind(v)
    except (TypeError, ValueError):
        raise OptionError(f"{key}: {v!r} is not a number") from None


def _precision(v: Any) -> int | str:
    if v is None:
        return 64
    s = str(v).strip().lower()
    if s == "auto":
        return "auto"
    if s not in ("16", "32", "64"):
        raise OptionError(f"float_precision {v!r}: use 16, 32, 64 or auto")
    return int(s)


def _mask(v: Any) -> str | None:
    if v is None or v == "":
        return None
    s = str(v).strip()
    if not s or set(s) - {"0", "1"}:
        raise OptionError(f"bit_mask {v!r}: give a string of 0 and 1 (sign-first order), e.g. \"101101\"")
    return s


def settings_from_config(cfg: Mapping[str, Any], *, source: str = "config") -> OldSettings:
    """Read a config mapping (as :func:`load_old_config` returns) the way the older tool's reader did.

    Missing keys that the older tool required get its defaults, with a warning each (it stopped with a
    KeyError). The first version's keys (``prob``, ``max_corruption_percentage``, ``first_byte``, ...) are
    read only when the later keys are absent.
    """
    warnings: list[str] = []
    missing = [k for k in REQUIRED_KEYS if k not in cfg]
    legacy = [k for k in FIRST_VERSION_KEYS if k in cfg]
    if legacy:
        warnings.append(f"{source}: keys of the tool's first version ({', '.join(legacy)}) are read as "
                        "prob -> injection_probability, max_corruption_percentage -> percentage tries; "
                        "byte/bit positions are ignored (every bit of the range is drawn)")
    if missing and not legacy:
        warnings.append(f"{source}: the older tool required {', '.join(missing)}; their defaults are used")
    kw: dict[str, Any] = {}
    prob = cfg.get("injection_probability", cfg.get("prob"))
    kw["probability"] = 1.0 if prob is None else _num({"p": prob}, "p", float, 1.0)
    if "injection_tries" not in cfg and "max_corruption_percentage" in cfg:
        kw["injection_type"], kw["tries"] = "percentage", _num(cfg, "max_corruption_percentage", float, 0.0)
    else:
        kw["injection_type"] = str(cfg.get("injection_type", "count")).strip().lower()
        kw["tries"] = _num(cfg, "injection_tries", float, 1.0)
    kw["hdf5_file"] = None if cfg.get("hdf5_file") is None else str(cfg["hdf5_file"])
    kw["log_file_path"] = str(cfg.get("log_file_path", cfg.get("log_file")) or "")
    kw["precision"] = _precision(cfg.get("float_precision"))
    if "float_precision" not in cfg:
        warnings.append(f"{source}: no float_precision: values are packed as float64 before flipping, as the "
                        "older tool did by default (float_precision: auto or 32 flips float32 words exactly)")
    kw["first_bit"] = _num(cfg, "first_bit", int, None)
    kw["last_bit"] = _num(cfg, "last_bit", int, None)
    kw["burst"] = _num(cfg, "burst", int, 1)
    kw["bit_mask"] = _mask(cfg.get("bit_mask"))
    kw["scaling_factor"] = _num(cfg, "scaling_factor", float, None)
    kw["allow_sign_change"] = _truthy(cfg.get("allow_sign_change"), True)
    kw["allow_nan"] = _truthy(cfg.get("allow_NaN_values"), False)
    kw["use_random_locations"] = _truthy(cfg.get("use_random_locations"), not cfg.get("locations_to_corrupt"))
    locs = cfg.get("locations_to_corrupt") or []
    kw["locations"] = tuple(str(x) for x in ([locs] if isinstance(locs, str) else locs))
    kw["save_sequence"] = _truthy(cfg.get("save_injection_sequence"), False)
    kw["load_sequence"] = _truthy(cfg.get("load_injection_sequence"), False)
    kw["sequence_path"] = str(cfg.get("injection_sequence_path") or "")
    if kw["sequence_path"] and not kw["save_sequence"]:
        kw["load_sequence"] = True  # the later reader: a sequence path without saving means load it
    fp = cfg.get("float_precision")
    unquoted = [f"float_precision: {fp} unquoted: YAML reads a number, which its reader compared with the strings "
                f"\"16\", \"32\", \"64\", \"auto\" and refused (write \"{fp}\" to run it there)"
                ] if isinstance(fp, int) and not isinstance(fp, bool) else []
    return check_settings(OldSettings(**kw), warnings, unquoted)


FLAG_KEYS = {"hdf5File": "hdf5_file", "logFilePath": "log_file_path", "firstBit": "first_bit", "lastBit": "last_bit",
             "injectionProbability": "injection_probability", "injectionType": "injection_type",
             "injectionTries": "injection_tries", "scalingFactor": "scaling_factor"}
_CONFIG_ONLY_FLAGS = ("floatPrecision", "burst", "bitMask", "locationsToCorrupt", "saveInjectionSequence",
                      "loadInjectionSequence", "injectionSequencePath", "allowSignChange", "useRandomLocations",
                      "allowNaNValues")


def config_with_flags(cfg: Mapping[str, Any], args: Any) -> tuple[dict[str, Any], list[str]]:
    """A config with the value flags given beside ``--configFile`` put over its keys, as the older tool's README
    promised for ``-f -l -d -e -p -t -k -a`` ("Overwrites value from config file"; ``-c config.yaml -t count
    -k 34``); returns it and the other old flags given, which the tool never read beside a config file.

    >>> from types import SimpleNamespace as NS
    >>> flags = dict.fromkeys([*FLAG_KEYS, *_CONFIG_ONLY_FLAGS])
    >>> config_with_flags({"injection_tries": 5}, NS(**{**flags, "injectionTries": 34.0, "burst": 2}))
    ({'injection_tries': 34.0}, ['--burst'])
    """
    out = dict(cfg)
    for flag, key in FLAG_KEYS.items():
        if getattr(args, flag, None) is not None:
            out[key] = getattr(args, flag)
    ignored = [f"--{f}" for f in _CONFIG_ONLY_FLAGS if getattr(args, f, None) not in (None, False)]
    return out, ignored


def settings_from_flags(args: Any) -> OldSettings:
    """Settings from the older tool's command-line flags (an argparse namespace of
    :mod:`fastflip.cli.hdf5_corrupter_cmd`). Its switches were ``store_true``: absent means false."""
    warnings: list[str] = []
    save = args.saveInjectionSequence
    kw: dict[str, Any] = {
        "hdf5_file": args.hdf5File, "log_file_path": args.logFilePath or "",
        "probability": 1.0 if args.injectionProbability is None else float(args.injectionProbability),
        "injection_type": (args.injectionType or "").strip().lower(),
        "tries": -1 if args.injectionTries is None else float(args.injectionTries),
        "precision": _precision(args.floatPrecision), "first_bit": args.firstBit, "last_bit": args.lastBit,
        "burst": 1 if args.burst is None else int(args.burst), "bit_mask": _mask(args.bitMask),
        "scaling_factor": None if args.scalingFactor is None else float(args.scalingFactor),
        "allow_sign_change": bool(args.allowSignChange), "allow_nan": bool(args.allowNaNValues),
        "use_random_locations": bool(args.useRandomLocations), "locations": tuple(args.locationsToCorrupt or ()),
        "save_sequence": save is not None,
        "save_indexes": not save or len(save) < 2 or str(save[1]).lower() == "true",
        "sequence_path": (save[0] if save else "") or args.loadInjectionSequence or args.injectionSequencePath or "",
        "load_sequence": bool(args.loadInjectionSequence or (args.injectionSequencePath and save is None)),
    }
    notes = []
    if args.floatPrecision is None:
        warnings.append("no --floatPrecision: values are packed as float64 before flipping (the older tool's default "
                        "in its config versions without the key)")
        notes.append("no --floatPrecision: its settings check required one (\"Float precision must be submitted\")")
    return check_settings(OldSettings(**kw), warnings, notes)


def refused_by_old_tool(s: OldSettings) -> list[str]:
    """Settings that run here but that the older tool's last version (``settings_reader.py``) refused or crashed
    on, so that it has no results of its own for them: one line each (printed as notes, not errors).

    >>> refused_by_old_tool(OldSettings(burst=3))[0].split(":")[0]
    'burst 3 without first_bit and last_bit'
    """
    out: list[str] = []
    if s.bit_mask is not None or s.scaling_factor is not None:
        what = "bit_mask" if s.bit_mask is not None else "scaling_factor"
        out.append(f"{what}: its settings check refused every {what} (an operator-precedence bug read it as "
                   "\"float_precision auto does not allow a bit range, scaling factor or bit mask\")")
    ranged = s.burst > 1 or s.first_bit is not None or s.last_bit is not None
    if s.mode == "range" and s.precision == "auto" and ranged:
        out.append("float_precision auto with a bit range or burst: it refused them as incompatible settings")
    elif s.mode == "range" and ranged and (s.first_bit is None or s.last_bit is None):
        given = f"burst {s.burst}" if s.burst > 1 else ("first_bit" if s.first_bit is not None else "last_bit")
        out.append(f"{given} without first_bit and last_bit: it left its bit range unset and crashed when drawing "
                   "bits (fastflip uses the whole word)")
    return out


def check_settings(s: OldSettings, warnings: list[str] | None = None, notes: Sequence[str] = ()) -> OldSettings:
    """The older tool's checks (same order, one-line errors); returns ``s`` with its warnings and the notes of
    :func:`refused_by_old_tool` (after ``notes`` given by the reader)."""
    warnings = list(warnings or [])
    if s.load_sequence and s.injection_type not in ("count", "percentage"):
        s = replace(s, injection_type="count", tries=1)  # a loaded sequence ignores type and tries
    if s.injection_type not in ("count", "percentage"):
        raise OptionError(f"injection_type {s.injection_type or None!r}: it must be either \"percentage\" or \"count\"")
    if s.precision != "auto" and (s.first_bit is not None or s.last_bit is not None):
        w = int(s.precision)
        first, last = s.bit_range(w)
        if not 0 <= first <= last <= w - 1:
            raise OptionError(f"float_precision is {w}, so first_bit and last_bit must be an interval in [0-{w - 1}] "
                              f"(got {first}..{last})")
    if not 0 <= s.probability <= 1:
        raise OptionError(f"injection_probability {s.probability} must lie in [0, 1]")
    if s.injection_type == "percentage":
        if not 0 <= s.tries <= 100:
            raise OptionError(f"injection_tries {s.tries}: a percentage must lie in [0, 100]")
        if s.tries > 1:
            warnings.append(f"injection_tries {s.tries} (percentage): the older tool accepted only [0, 1]")
    elif int(s.tries) < 1:
        raise OptionError("injection_tries for injection_type \"count\" must be a positive integer")
    if s.burst < 1:
        raise OptionError("burst must be a positive integer")
    ranged = s.burst > 1 or s.first_bit is not None or s.last_bit is not None
    if ranged + (s.scaling_factor is not None) + (s.bit_mask is not None) > 1:
        raise OptionError("bit range (also burst), scaling_factor and bit_mask are incompatible settings; keep one")
    if s.bit_mask is not None and s.precision != "auto" and len(s.bit_mask) > int(s.precision):
        raise OptionError(f"bit_mask {s.bit_mask!r} is longer than float_precision {s.precision}")
    if s.save_sequence and s.load_sequence:
        raise OptionError("save_injection_sequence and loading an injection sequence are incompatible")
    if s.load_sequence and not s.sequence_path:
        raise OptionError("loading an injection sequence needs its path (injection_sequence_path)")
    if not s.locations and not s.use_random_locations and not s.load_sequence:
        raise OptionError("locations_to_corrupt must be given when use_random_locations is false")
    if s.precision == "auto" and s.mode != "range":
        raise OptionError("float_precision auto takes the bit range from each value; no bit_mask or scaling_factor")
    refused = [*notes, *refused_by_old_tool(s)]
    return replace(s, warnings=tuple(warnings), notes=tuple(
        f"the older tool refused or crashed on this setting, so no results of its own exist for it: {n}" for n in refused))


def expand_locations(prefixes: Iterable[str], names: Sequence[str]) -> list[str]:
    """The older tool's prefix rule: every dataset path that starts with a given location, per location
    in the given order (a dataset under two locations is listed twice, so it is drawn twice as often).

    >>> expand_locations(["/predictor/conv1/"], ["/predictor/conv1/W", "/predictor/conv1/b", "/predictor/fc/W"])
    ['/predictor/conv1/W', '/predictor/conv1/b']
    """
    out: list[str] = []
    for loc in prefixes:
        p = "/" + str(loc).lstrip("/")
        hit = [n for n in names if n.startswith(p)]
        if not hit:
            raise OptionError(f"there are no datasets with the prefix {p!r} (locations_to_corrupt)")
        out.extend(hit)
    return out


def map_old_config(cfg: "Mapping[str, Any] | OldSettings", dtypes: Iterable[str] = (),
                   total_elements: int | None = None, seed: int | None = None,
                   names: Sequence[str] | None = None) -> OldConfigMapping:
    """Map old settings onto fastflip's own design (``--design fastflip``).

    Same bits (the sign-slot rule resolved to a set of bits), ``burst`` as ``random-bits:N``, ``bit_mask``
    as ``mask:...@random``, prefixes expanded, percentage truncated, ``allow_NaN_values: false`` as
    ``nan_policy='avoid'``; but elements uniform over the selection, drawn without replacement, and the
    stored words flipped exactly (float32 as float32, integers as their stored word).
    ``injection_probability`` below 1 draws the count from a Binomial (seeded).

    >>> m = map_old_config({"injection_type": "count", "injection_tries": 5, "first_bit": 1, "last_bit": 8,
    ...                     "allow_sign_change": True, "float_precision": 32}, ["<f4"])
    >>> m.kwargs["count"], m.kwargs["bits"], m.kwargs["model"]
    (5, '0,1,2,3,4,5,6,7,8', 'flip')
    """
    import numpy as np

    s = cfg if isinstance(cfg, OldSettings) else settings_from_config(cfg, source="config")
    warnings = list(s.warnings)
    kw: dict[str, Any] = {"sign_first": True}
    dts = sorted({np.dtype(d).str for d in dtypes})
    fwidths = sorted({np.dtype(d).itemsize * 8 for d in dts if np.dtype(d).kind == "f"})
    width = fwidths[0] if fwidths else (int(s.precision) if s.precision != "auto" else 32)
    if s.precision not in ("auto", width) and fwidths:
        warnings.append(f"float_precision {s.precision} on {width}-bit floats: fastflip's design flips the stored "
                        f"{width}-bit words (bit positions past bit {width - 1} are dropped)")
    if s.mode == "mask":
        assert s.bit_mask is not None
        kw["model"] = f"mask:0b{s.bit_mask}@random"
        kw["bits"] = None
        kw["sign_first"] = False
    elif s.mode == "scale":
        kw["model"] = f"scale:{float(s.scaling_factor or 1.0)}"
        kw["bits"] = None
    else:
        bits = sorted({b for b in s.slot_bits(width) if b < width})
        kw["model"] = "flip" if s.burst == 1 else f"random-bits:{s.burst}"
        kw["bits"] = ",".join(map(str, bits))
    if not s.allow_nan:
        kw["nan_policy"] = "avoid"
    if not s.use_random_locations:
        if names is None:
            kw["selection"] = Selection(include=tuple("/" + x.lstrip("/") + "**" for x in s.locations))
        else:
            chosen = sorted(set(expand_locations(s.locations, names)))
            kw["selection"] = Selection(regex=tuple("^" + re.escape(n) + "$" for n in chosen))
    if s.save_sequence and s.sequence_path:
        kw["log_path"] = s.sequence_path
    attempts = s.attempts(total_elements or 0) if s.injection_type == "percentage" else int(s.tries)
    if s.injection_type == "percentage" and total_elements is None:
        raise OptionError("injection_type percentage needs the number of entries of the file")
    if s.probability >= 1.0:
        kw["count"] = attempts
    else:
        rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([int(seed or 0), 0x01D])))
        kw["count"] = int(rng.binomial(attempts, s.probability))
    return OldConfigMapping(kw, warnings, s.hdf5_file, attempts, s.probability)
