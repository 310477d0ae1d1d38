"""Golden-prefix reuse for batched trials: a ``torch.fx`` graph cut before the first use of a faulted tensor.

Layer: ``campaign`` (may import frameworks and below; imported by experiment, report, compat and cli).

The values the rest of the network needs from before the cut are computed once on the fault-free
model; each block of trials then runs only the rest (:mod:`fastflip.campaign.batched`).
"""

from __future__ import annotations

from typing import Any, Sequence

from .pertrial import Unbatchable

__all__ = ["first_uses", "split_after_prefix", "split_at", "split_after_layer"]


def first_uses(gm: Any) -> dict[int, int]:
    """``{id(tensor): index of the first graph node that reads it}`` for every parameter and buffer ``gm`` reads
    (a ``call_module`` node reads its module's own tensors, a ``get_attr`` node the tensor it names).

    The index is the boundary a fault in that tensor cuts the graph at (:func:`split_at`): every trial whose
    faults lie in tensors first read at node ``k`` or later reuses the golden values at that boundary.
    """
    modules = dict(gm.named_modules())
    first: dict[int, int] = {}
    for k, n in enumerate(gm.graph.nodes):
        if n.op == "call_module":
            mod = modules[n.target]
            for t in list(mod.parameters()) + list(mod.buffers()):
                first.setdefault(id(t), k)
        elif n.op == "get_attr":
            obj: Any = gm
            for part in str(n.target).split("."):
                obj = getattr(obj, part)
            first.setdefault(id(obj), k)
    return first


def split_after_prefix(gm: Any, x: Any, faulted: Sequence[Any],
                       first: dict[int, int] | None = None) -> tuple[Any, tuple[Any, ...]] | None:
    """Split a traced model before the first graph node that reads a tensor of ``faulted``.

    Returns ``(suffix, inputs)``: a ``torch.fx.GraphModule`` whose inputs are the values
    the rest of the network needs from the prefix (computed here once on the fault-free
    model with input ``x``), or None when there is no prefix to reuse. ``suffix(*inputs)``
    equals ``gm(x)``. ``first`` is :func:`first_uses` of ``gm`` when the caller has it.
    """
    first = first_uses(gm) if first is None else first
    at = min((first[id(t)] for t in faulted if id(t) in first), default=None)
    if at is None:
        raise Unbatchable("no graph node reads the faulted tensors")
    split = split_at(gm, x, at)
    return None if split is None else split[:2]


def split_at(gm: Any, x: Any, first: int) -> tuple[Any, tuple[Any, ...], list[Any]] | None:
    """``(suffix, inputs, frontier nodes)``: ``gm`` cut before its node ``first`` (see :func:`split_after_prefix`)."""
    import torch
    import torch.fx as fx

    nodes = list(gm.graph.nodes)
    prefix = nodes[:first]
    if all(n.op in ("placeholder", "get_attr") for n in prefix):
        return None
    later = set(nodes[first:])
    frontier = [n for n in prefix if n.op != "get_attr" and any(u in later for u in n.users)]
    env: dict[Any, Any] = {}
    want = set(frontier)
    interp = fx.Interpreter(gm)
    with torch.no_grad():
        args = iter([x])
        for n in prefix:
            if n.op == "placeholder":
                env[n] = next(args)
            else:
                env[n] = getattr(interp, n.op)(n.target, *fx.node.map_arg((n.args, n.kwargs), lambda a: env[a]))
            for a in n.all_input_nodes:  # free the values whose every user has run and the rest does not need
                if a not in want and a in env and all(u in env for u in a.users):
                    del env[a]
    inputs = tuple(env[n] for n in frontier)
    batch = x.shape[0]
    if not all(isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == batch for v in inputs):
        raise Unbatchable("the rest of the network needs values that are not batch-major tensors (sizes?)")
    graph = fx.Graph()
    remap: dict[Any, Any] = {}
    for n in frontier:
        remap[n] = graph.placeholder(f"golden_{n.name}")
    for n in prefix:
        if n.op == "get_attr" and any(u in later for u in n.users):
            remap[n] = graph.node_copy(n, lambda a: remap[a])
    for n in nodes[first:]:
        remap[n] = graph.node_copy(n, lambda a: remap[a])
    return fx.GraphModule(gm, graph), inputs, frontier


def split_after_layer(gm: Any, x: Any, name: str) -> tuple[Any, tuple[Any, ...], int] | None:
    """Cut a traced model right after the call of layer output ``name`` (``layer`` or ``layer#k``, the k-th call).

    Returns ``(suffix, inputs, position of that layer's output among inputs)`` or None (nothing to reuse).
    """
    layer, _, k = name.partition("#")
    calls = [i for i, n in enumerate(gm.graph.nodes) if n.op == "call_module" and n.target == f"0.{layer}"]
    if len(calls) <= int(k or 0):
        raise Unbatchable(f"layer {name} is not a call of the traced graph")
    at = calls[int(k or 0)]
    split = split_at(gm, x, at + 1)
    if split is None:
        return None
    suffix, inputs, frontier = split
    node = list(gm.graph.nodes)[at]
    if node not in frontier:
        raise Unbatchable(f"the output of layer {name} is not used by the rest of the network")
    return suffix, inputs, frontier.index(node)
