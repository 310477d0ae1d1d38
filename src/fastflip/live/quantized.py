"""Quantized PyTorch weights as live tensors: torchao tensor subclasses and ``torch.ao`` packed modules.

Layer: ``live`` (may import files and below; imported by :mod:`fastflip.live.frameworks` only). torch is
never imported here: only the objects passed in are touched.

torchao tensor subclasses (``Int8Tensor`` of ``Int8WeightOnlyConfig`` / ``Int8DynamicActivationInt8WeightConfig``, ...)
    A parameter whose type defines ``__tensor_flatten__`` is reached through it: each inner plain tensor
    becomes a live tensor ``<parameter>.<inner>`` (``0.weight.qdata``, ``0.weight.scale``,
    ``0.weight.zero_point``), its layer the parameter's module. Roles: an inner name containing ``zero``
    is ``zero``, one containing ``scale`` is ``scale``, any other (``qdata``) takes the parameter's role
    (``weight``). The inner tensors *are* the storage the subclass computes from: a flip in ``qdata``
    changes the dequantized weight ``(qdata - zero_point) * scale`` the next forward uses, exactly; a
    revert restores the words bit for bit. Nested subclasses are flattened recursively.
``torch.ao`` packed modules (``Linear``, static ``Conv*`` / ``ConvTranspose*``, ``Embedding`` / ``EmbeddingBag``)
    The module's packed parameters hold the weight in the quantized engine's own layout, which no address
    reaches. fastflip unpacks it once and keeps that tensor on the module: its words (``<module>.weight``, role
    ``weight``; int8 for ``qint8``, uint8 for ``quint8``, **float16** for ``quantize_dynamic(...,
    dtype=torch.float16)``, whose engine packs float16), its bias (``<module>.bias``) and, for per-channel
    quantization, its scales and zero points (``<module>.weight.scale``, ``<module>.weight.zero_point``) become
    live tensors; each supported kind unpacks and repacks them bit for bit (:func:`_access`).
    :func:`fastflip.live.inject` and :func:`~fastflip.live.revert` write them back (through the targets'
    ``sync``) around each write, so the module's ``weight()``, its ``state_dict()`` and its next forward show
    exactly the flipped (or reverted) words at once; a forward pre-hook also writes them back before any forward
    that follows another change to those words (one comparison of the weight's words per forward). The float16
    engine saturates ±Inf and NaN to ±65504: a write that makes a float16 word non-finite is refused (the repack
    raises, and the callers put the words from before back). A per-tensor scale and zero point are numbers inside
    the quantizer, not storage: they cannot be flipped live (in a saved state_dict they are pickle numbers too).
    If the module's packed parameters are replaced (``load_state_dict``), the kept tensor is refreshed in place
    from them before the next write or forward (a new weight of another shape, dtype or quantization scheme
    makes the old targets refuse: rebuild them).
Packed weights no supported kind reaches (dynamic-quantized ``LSTM`` / ``GRU`` and their cells)
    Any module holding the engine's TorchScript object that :func:`_access` does not know: :func:`packed`
    names each by its ``state_dict`` key with why (any other TorchScript object a module holds, by its attribute
    path), so that the targets list it in ``skipped`` instead of dropping it silently.

Examples
--------
>>> inner_role("zero_point", "weight"), inner_role("qdata", "weight"), inner_role("scale", "weight")
('zero', 'weight', 'scale')
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterator

from ..errors import RepackError, one_line

__all__ = ["inner_role", "is_quantize_stub", "is_subclass", "subclass_tensors", "packed"]


def inner_role(attr: str, parent_role: str) -> str:
    """Role of a tensor subclass's inner tensor ``attr`` (``zero``, ``scale``, else ``parent_role``)."""
    low = attr.lower()
    if "zero" in low:
        return "zero"
    if "scale" in low:
        return "scale"
    return parent_role


def is_subclass(t: Any) -> bool:
    """True for a tensor subclass that flattens into inner tensors (``__tensor_flatten__``), e.g. torchao's."""
    return callable(getattr(type(t), "__tensor_flatten__", None))


def is_quantize_stub(model: Any, layer: str | None) -> bool:
    """True where the module ``layer`` of ``model`` (its dotted name; None: the model) is a converted ``QuantStub``
    (``torch.ao.nn.quantized.Quantize``), whose ``scale`` and ``zero_point`` quantize the input."""
    try:
        owner = model.get_submodule(layer or "")
    except (AttributeError, TypeError):
        return False
    cls = type(owner)
    return cls.__name__ == "Quantize" and cls.__module__.startswith("torch.ao.nn.quantized")


def subclass_tensors(name: str, t: Any, role: str, depth: int = 0) -> Iterator[tuple[str, Any, str]]:
    """``(name, inner tensor, role)`` of every plain tensor inside the subclass tensor ``t`` called ``name``.

    Inner tensors that are ``None`` (optional fields) are left out; nested subclasses are flattened.
    """
    if depth > 8:
        return
    attrs, _ctx = t.__tensor_flatten__()
    for attr in attrs:
        inner = getattr(t, attr, None)
        if inner is None:
            continue
        sub = f"{name}.{attr}"
        if is_subclass(inner):
            yield from subclass_tensors(sub, inner, inner_role(attr, role), depth + 1)
        else:
            yield sub, inner.detach(), inner_role(attr, role)


# ---------------------------------------------------------------------------------- torch.ao packed modules


class _Access:
    """How fastflip reaches one supported packed module (``params``: the parameter holder it packs through, None
    when the module packs its own weight): ``unpack()`` returns ``(weight, bias)``, ``repack(weight,
    bias)`` packs them, ``packed()`` is the engine object the module holds now (a new one after each repack or
    reload), ``saved`` the key of the weight in a saved ``state_dict`` and ``half`` whether the engine keeps a float16
    weight (``quantize_dynamic(..., dtype=torch.float16)``: its words are offered as float16)."""

    def __init__(self, params: Any, unpack: Callable[[], Any], repack: Callable[[Any, Any], None],
                 packed: Callable[[], Any], saved: str, bias: str | None, half: bool = False) -> None:
        self.params, self.unpack, self.repack, self.packed = params, unpack, repack, packed
        self.saved, self.saved_bias, self.half = saved, bias, half


def _access(module: Any, prefix: str) -> _Access | None:
    """The :class:`_Access` of a supported packed module (``prefix``: its path and a dot); None for any other.

    Supported: modules holding ``LinearPackedParams`` (dynamic and static ``Linear``, int8 and float16), modules
    packing their own weight (static ``Conv1d/2d/3d``, ``ConvTranspose``) and ``EmbeddingPackedParams``
    (8-bit quantized ``Embedding`` / ``EmbeddingBag``): each unpacks and repacks its words, quantizer and bias bit
    for bit. 4-bit embeddings (``quint4x2``) are not supported (their words are packed two to a byte).
    """
    params = getattr(module, "_packed_params", None)
    dtype = str(getattr(params, "dtype", None))  # of the packed weight (a 4-bit one is not reached)
    if hasattr(params, "_weight_bias") and hasattr(params, "set_weight_bias"):  # LinearPackedParams
        if dtype not in ("torch.qint8", "torch.float16"):
            return None
        saved = f"{prefix}_packed_params._packed_params"
        return _Access(params, lambda: params._weight_bias(), lambda w, b: params.set_weight_bias(w, b),
                       lambda: params._packed_params, f"{saved}/0", f"{saved}/1", dtype == "torch.float16")
    if hasattr(params, "_weight") and hasattr(params, "set_weight") and hasattr(params, "_packed_weight"):
        if dtype != "torch.quint8":
            return None
        return _Access(params, lambda: (params._weight(), None), lambda w, _b: params.set_weight(w),
                       lambda: params._packed_weight, f"{prefix}_packed_params._packed_weight", None)
    if _is_script_object(params) and hasattr(module, "_weight_bias") and hasattr(module, "set_weight_bias"):
        ref = weakref.ref(module)  # the holder is the value of a weak mapping keyed by this module
        return _Access(None, lambda: ref()._weight_bias(), lambda w, b: ref().set_weight_bias(w, b),
                       lambda: ref()._packed_params, f"{prefix}weight", f"{prefix}bias")
    return None


def _is_script_object(v: Any) -> bool:
    """Whether ``v`` is a TorchScript object (a quantized engine's packed parameters: no address reaches them)."""
    return type(v).__name__ == "ScriptObject" and type(v).__module__.startswith("torch")


class _Unpacked:
    """The unpacked weight (and bias) of one packed module; :func:`_before_forward` repacks it after a change."""

    def __init__(self, access: _Access) -> None:
        self.access = access
        self.weight: Any = None
        self.bias: Any = None
        self.parts: dict[str, Any] = {}
        self._load()

    def _load(self) -> None:
        """Unpack the module's packed parameters into this holder (in place when the layout is unchanged)."""
        import torch  # only reached for a torch module

        w, b = self.access.unpack()
        w = w.detach().to(torch.float16) if self.access.half else _owned(w)  # float16: unpacked to float32 exactly
        if self.weight is not None and self._same_kind(w, b):  # keep the addresses the targets hold
            self.parts["weight"].copy_(_words(w))
            for key, value in _qparams(w).items():
                self.parts[key].copy_(value)
            if b is not None:
                self.bias.copy_(b)
            if w.is_quantized and w.qscheme() == torch.per_tensor_affine:  # new scale, same storage
                old = self.weight
                self.weight = torch._empty_affine_quantized(
                    (0,), scale=w.q_scale(), zero_point=w.q_zero_point(), dtype=w.dtype).set_(
                    old.untyped_storage(), old.storage_offset(), old.shape, old.stride())
        else:
            self.weight, self.bias = w, (None if b is None else b.detach().clone())
            self.parts = {"weight": _words(self.weight), **_qparams(w)}
            if self.bias is not None:
                self.parts["bias"] = self.bias
        self.packed = self.access.packed()
        self.snapshot = {k: _bit_view(v).clone() for k, v in self.parts.items()}

    def _same_kind(self, w: Any, b: Any) -> bool:
        old = self.weight
        same = w.dtype == old.dtype and w.shape == old.shape and (b is None) == (self.bias is None)
        return same and (not w.is_quantized or w.qscheme() == old.qscheme())

    def sync(self, written: bool = False) -> None:
        """Bring holder and module together around a write by fastflip: before it (``written`` false), take the
        module's words when its packed parameters were replaced (``load_state_dict``); after it, repack the kept
        words at once (the write changed them), so that ``weight()`` and ``state_dict`` show the change."""
        if not self._take_reloaded() and written:
            self._repack()

    def refresh(self) -> None:
        """Before a forward: take the module's words when it was reloaded, repack when the kept words changed (their
        bits are compared, so a NaN left by a flip is unchanged, not repacked at every forward)."""
        import torch

        if self._take_reloaded():
            return
        if not all(torch.equal(_bit_view(v), self.snapshot[k]) for k, v in self.parts.items()):
            self._repack()

    def _take_reloaded(self) -> bool:
        """Take the module's words when its packed parameters were replaced since they were last packed or
        unpacked here (``load_state_dict``); true when they were."""
        if self.access.packed() is self.packed:
            return False
        self._load()
        return True

    def _repack(self) -> None:
        """Pack the kept words into the module and remember them as packed.

        Raises
        ------
        ValueError
            A float16 word is ±Inf or NaN: the engine would saturate it to ±65504 (the module cannot hold it).
        """
        w = self.weight
        if self.access.half:
            _check_finite_half(w)
            w = w.float()  # a new tensor: the engine's saturation pass writes into what it is given
        self.access.repack(w, self.bias)
        self.packed = self.access.packed()
        for k, v in self.parts.items():
            self.snapshot[k].copy_(_bit_view(v))


def _owned(w: Any) -> Any:
    """A quantized ``w`` over memory of its own: an engine may unpack its scales and zero points as views of the
    packed object (``EmbeddingPackedParams`` does), which the next repack frees."""
    import torch

    if not w.is_quantized:
        return w.detach()
    if w.qscheme() == torch.per_tensor_affine:
        return torch._make_per_tensor_quantized_tensor(w.int_repr(), w.q_scale(), w.q_zero_point())
    return torch._make_per_channel_quantized_tensor(w.int_repr(), w.q_per_channel_scales().clone(),
                                                    w.q_per_channel_zero_points().clone(), w.q_per_channel_axis())


def _words(w: Any) -> Any:
    """The stored words of ``w``: for a quantized tensor, an integer tensor over its own storage."""
    import torch

    if not w.is_quantized:
        return w.detach()
    words = {torch.qint8: torch.int8, torch.quint8: torch.uint8, torch.qint32: torch.int32}[w.dtype]
    return torch.empty(0, dtype=words).set_(w.untyped_storage(), w.storage_offset(), w.shape, w.stride())


def _bit_view(t: Any) -> Any:
    """The plain tensor ``t`` as signed integers of its element size (its words: equal bits compare equal, NaN
    included)."""
    import torch

    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _check_finite_half(w: Any) -> None:
    """Refuse a float16 weight holding ±Inf or NaN (``ValueError`` naming the first such word and element)."""
    import torch

    bad = torch.nonzero(~torch.isfinite(w).reshape(-1))
    if len(bad):
        i = int(bad[0])
        word = int(_bit_view(w.reshape(-1)[i : i + 1])) & 0xFFFF
        raise ValueError(f"float16 word {word:#06x} at element {i} of its weight is not finite, and the engine's "
                         "float16 packing saturates it to +-65504, so the module cannot hold it")


def _qparams(w: Any) -> dict[str, Any]:
    """Per-channel scales and zero points (the quantizer's own tensors); none for per-tensor quantization."""
    import torch

    if not w.is_quantized or w.qscheme() == torch.per_tensor_affine:
        return {}
    return {"weight.scale": w.q_per_channel_scales(), "weight.zero_point": w.q_per_channel_zero_points()}


def _named_sync(holder: _Unpacked, name: str) -> Callable[[bool], None]:
    """``holder.sync`` for the targets' module ``name``, as :func:`fastflip.live.inject` and
    :func:`~fastflip.live.revert` call it: a reload or repack that raises becomes a :class:`RepackError` of one
    line naming the module and the cause (those callers put the words from before the call back first). One
    callable per module, shared by its tensors, so that a write syncs each module once."""
    def sync(written: bool = False) -> None:
        try:
            holder.sync(written)
        except Exception as e:
            step = "repacking its written words" if written else "reloading its packed parameters"
            raise RepackError(f"torch.ao module {name!r}: {step} failed ({type(e).__name__}: {one_line(e)}); "
                              "its words from before this call are kept") from e
    return sync


def _part_source(holder: _Unpacked, key: str) -> Any:
    """The tensor ``holder`` keeps under ``key`` now (a reload of another kind replaces it)."""
    return lambda: holder.parts.get(key)


# module -> its holder; weak, so a copy of the module (deepcopy, pickle) carries no holder and computes with its
# own packed parameters until targets are built on it
_HOLDERS: "weakref.WeakKeyDictionary[Any, _Unpacked]" = weakref.WeakKeyDictionary()


def _before_forward(module: Any, args: Any) -> None:
    """Forward pre-hook of a packed module that fastflip reaches (a plain function: copies stay picklable)."""
    holder = _HOLDERS.get(module)
    if holder is not None:
        holder.refresh()


def packed(model: Any) -> tuple[list[tuple[str, Any, str | None, str, tuple[str, ...], Any, Any]],
                                  list[tuple[str, str]]]:
    """The packed weights of ``model``, from one walk of its modules: ``(tensors, unreached)``.

    ``tensors`` are ``(name, tensor, layer, role, aliases, source, sync)`` of the unpacked parameters of every
    supported packed quantized module (see :func:`_access`): ``source()`` is the tensor the module's holder keeps
    under that name now, ``sync()`` brings holder and module together (call it before writing the words, and
    ``sync(written=True)`` after, so that the module, its ``weight()`` and its ``state_dict`` show the change at
    once, not at the next forward). ``unreached`` are ``(name, why)`` of every TorchScript object that no supported
    module holds (the packed weights of dynamic-quantized ``LSTM``/``GRU`` and their cells, a 4-bit embedding's,
    any other module's), so that targets list them as left out instead of dropping them.

    The first call on a module unpacks it and installs the repacking pre-hook; later calls reuse that
    holder, so every :class:`~fastflip.live.targets.Targets` of the model reaches the same words. The
    aliases are the key paths of a saved state_dict (``<module>._packed_params._packed_params/0`` for a
    ``Linear``'s weight, ``.../1`` for its bias; ``<module>.weight`` for a convolution's), so a plan sampled from the
    saved file applies to the live module. A float16 ``Linear``'s weight has no file alias: torch saves it as
    float32, other words than the float16 ones offered live, so a plan drawn from the file does not apply to it.
    """
    modules = dict(model.named_modules())
    reached: set[int] = set()  # the supported modules and their parameter holders (which come after them)
    tensors: list[tuple[str, Any, str | None, str, tuple[str, ...], Any, Any]] = []
    for name, module in modules.items():
        access = None if id(module) in reached else _access(module, f"{name}." if name else "")
        if access is not None:
            reached.update((id(module), id(access.params)))
            tensors += _unpacked_tensors(name, module, access)
    unreached = [(f"{name}.{attr}" if name else attr, _unreached_why(modules, name, attr, value))
                 for name, module in modules.items() if id(module) not in reached
                 for attr, value in vars(module).items() if _is_script_object(value)]
    return tensors, unreached


def _unpacked_tensors(name: str, module: Any, access: _Access) -> Iterator[tuple[str, Any, str | None, str,
                                                                               tuple[str, ...], Any, Any]]:
    """The live tensors of the supported packed module ``name`` (see :func:`packed`), unpacking it on first use."""
    holder = _HOLDERS.get(module)
    if holder is None:
        holder = _HOLDERS[module] = _Unpacked(access)
        if _before_forward not in module._forward_pre_hooks.values():  # a copy already has it
            module.register_forward_pre_hook(_before_forward)
    prefix = f"{name}." if name else ""
    files = {"weight": None if access.half else access.saved, "bias": access.saved_bias,
             "weight.scale": f"{access.saved}/scale", "weight.zero_point": f"{access.saved}/zero_point"}
    sync = _named_sync(holder, name or type(module).__name__)
    for key, t in holder.parts.items():
        role = inner_role(key.rpartition(".")[2], "bias" if key == "bias" else "weight")
        aliases = tuple(dict.fromkeys(a for a in (f"model/{prefix}{key}", files[key])
                                      if a not in (None, prefix + key)))
        yield prefix + key, t, name or None, role, aliases, _part_source(holder, key), sync


def _unreached_why(modules: dict[str, Any], name: str, attr: str, value: Any) -> str:
    """Why the TorchScript object ``value`` at ``<name>.<attr>`` is left out: inside a ``torch.ao`` quantized module
    it is that module's packed weight, saved under this key; elsewhere, an object of that class fastflip cannot see
    into (not necessarily saved in the ``state_dict``)."""
    key = f"{name}.{attr}" if name else attr
    owner = _quantized_owner(modules, name)
    if owner is not None:
        return (f"torch.ao module {owner or type(modules['']).__name__!r} ({type(modules[owner]).__name__}) keeps "
                f"{key!r} packed by the quantized engine, which fastflip cannot unpack and repack bit for bit "
                "(quantized Linear, Conv and Embedding layers can be injected)")
    try:
        kind = f" of class {value._type().qualified_name()}"
    except Exception:  # a TorchScript object without a class type to name
        kind = ""
    return (f"module {name or type(modules['']).__name__!r} ({type(modules[name]).__name__}) holds {key!r}, a "
            f"TorchScript object{kind} whose contents fastflip cannot reach")


def _quantized_owner(modules: dict[str, Any], name: str) -> str | None:
    """The outermost module on the path to ``name`` (itself included) that is a ``torch.ao`` quantized module; None
    when there is none."""
    parts = name.split(".") if name else []
    for i in range(len(parts) + 1):
        path = ".".join(parts[:i])
        if type(modules[path]).__module__.startswith(("torch.ao.nn.quantized", "torch.nn.quantized")):
            return path
    return None
