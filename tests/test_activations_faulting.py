"""The faulting flow PyTorch and Keras share (live/act_hooks.Hooks.faulting): the same refusals and the same
treatment of a target that runs outside a forward of the model, whichever framework hooks it."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
import pytest

import fastflip
from conftest import require
from fastflip.core.plan import TensorRef
from fastflip.core.sampling import SiteSpace
from fastflip.core.spec import Sampling
from fastflip.errors import OptionError, SelectionError

pytestmark = pytest.mark.framework
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _torch() -> tuple[Any, Callable[[], Any], Callable[[], Any]]:
    """A small PyTorch net (class ``Net``), a call of the model and a direct call of its ``head`` layer."""
    torch = require("torch")
    from act_models import small_net

    model = small_net()
    return model, lambda: model(torch.randn(2, 3, 8, 8)), lambda: model.head(torch.randn(2, 8 * 8 * 8))


def _keras() -> tuple[Any, Callable[[], Any], Callable[[], Any]]:
    """A small Keras subclassed net (class ``Net``), a call of the model and a direct call of its ``head`` layer."""
    from test_activations_keras import subclassed_model

    model = subclassed_model()
    return model, lambda: model(np.zeros((2, 8), np.float32)), lambda: model.head(np.zeros((2, 16), np.float32))


FRAMEWORKS = {"torch": _torch, "keras": _keras}


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_fixed_plan_naming_a_missing_layer_is_refused_with_the_model_named(framework: str) -> None:
    model, forward, _ = FRAMEWORKS[framework]()
    plan = SiteSpace([TensorRef("nope", "<f4", (3,))]).plan(Sampling(count=1), seed=1)
    with pytest.raises(SelectionError, match=r"layer 'nope' is not in this Net; its layers: .*head"):
        with fastflip.injected_activations(model, 1, plan=plan):
            forward()


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_target_run_outside_a_forward_of_the_model_is_refused(framework: str) -> None:
    """Calling a selected layer itself (not the model) inside the block, before any forward, is one line that
    says to call the model; the same block then faults the model's forward as usual."""
    model, forward, layer_call = FRAMEWORKS[framework]()
    with pytest.raises(OptionError, match="layer head ran outside a forward of the model itself: call the model"):
        with fastflip.injected_activations(model, seed=1, count=1, selection=fastflip.Selection(layers=["head"])):
            layer_call()
    with fastflip.injected_activations(model, seed=1, count=1, selection=fastflip.Selection(layers=["head"])) as log:
        forward()
    assert log.layers == ["head"] and log.forwards == 1 and len(log) == 2  # one site in each of 2 samples


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_forward_numbers_and_empty_blocks(framework: str) -> None:
    """``forward=`` needs PyTorch's per-forward hooks; a block without a forward of the model is refused."""
    model, forward, _ = FRAMEWORKS[framework]()
    sel = fastflip.Selection(layers=["head"])
    if framework == "keras":
        with pytest.raises(OptionError, match=r"forward= \(fault one forward of the block\) needs a PyTorch model"):
            with fastflip.injected_activations(model, seed=1, count=1, forward=0, selection=sel):
                forward()
    else:
        with pytest.raises(OptionError, match=r"forward=1 but the Net ran 1 forward\(s\)"):
            with fastflip.injected_activations(model, seed=1, count=1, forward=1, selection=sel):
                forward()
    with pytest.raises(OptionError, match="the Net never ran a forward inside injected_activations"):
        with fastflip.injected_activations(model, seed=1, count=1, selection=sel):
            pass


def _bad_forward(framework: str, model: Any) -> Callable[[], Any]:
    """A call of the model with an input of the wrong width: the forward raises (after the model's first layers)."""
    if framework == "keras":
        return lambda: model(np.zeros((2, 9), np.float32))
    torch = require("torch")
    return lambda: model(torch.randn(2, 3, 9, 9))


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_target_run_outside_after_forwards_and_after_a_raising_forward_is_refused_alike(framework: str) -> None:
    """After a forward of the model, and after a forward that raised, a direct call of a selected layer is refused
    in the same one line whichever framework hooks it (it is part of no forward: faulted there, it would be
    logged under a forward it is not in); a forward that raises ends as any other (it is counted), and the next
    forward is faulted as usual."""
    model, forward, layer_call = FRAMEWORKS[framework]()
    refusal = r"^layer head ran outside a forward of the model itself: call the model, not its layers$"
    with fastflip.injected_activations(model, seed=1, count=1, selection=fastflip.Selection(layers=["head"])) as log:
        forward()
        with pytest.raises(OptionError, match=refusal):
            layer_call()
        with pytest.raises(Exception) as err:
            _bad_forward(framework, model)()
        assert not isinstance(err.value, OptionError)
        with pytest.raises(OptionError, match=refusal):
            layer_call()
        forward()
    assert log.forwards == 3 and log.forward.tolist() == [0, 0, 2, 2]  # one site in each of 2 samples


def test_torch_forward_k_that_raises_before_its_targets_and_is_retried_is_refused() -> None:
    """``forward=0`` whose forward raises before its target runs, then retried: the retry is forward 1 (a raising
    forward counts) and was not faulted, yet the block ended without a word and its log held no fault. It is
    refused in one line; the model's weights and a clean forward's output stay as they were."""
    torch = require("torch")
    model, forward, _ = _torch()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        clean = model(x)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    refusal = (r"^forward=0 of the Net ended before its targets ran \(a forward that raises counts: a retry runs "
               r"as forward 1\): nothing was injected$")
    with pytest.raises(OptionError, match=refusal):
        with fastflip.injected_activations(model, seed=1, count=1, forward=0,
                                           selection=fastflip.Selection(layers=["head"])):
            with pytest.raises(Exception) as err:
                _bad_forward("torch", model)()
            assert not isinstance(err.value, OptionError)
            with torch.no_grad():
                model(x)
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(model(x), clean)
    with fastflip.injected_activations(model, seed=1, count=1, forward=1,
                                       selection=fastflip.Selection(layers=["head"])) as log:
        with pytest.raises(Exception):
            _bad_forward("torch", model)()
        with torch.no_grad():
            model(x)
    assert log.forward.tolist() == [1, 1]  # forward=k+1 faults the retry


def _torch_nets() -> Any:
    """Two small PyTorch nets: ``Twice`` calls itself inside its own forward before its ``head`` runs;
    ``Checkpointed`` runs its ``head`` under gradient checkpointing (recomputed in ``backward()``)."""
    torch = require("torch")
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head = nn.Linear(4, 4), nn.Linear(4, 3)

        def forward(self, x: Any, inner: bool = False) -> Any:
            return self.body(x) if inner else self.head(self(x, inner=True))

    class Checkpointed(Twice):
        def forward(self, x: Any, inner: bool = False) -> Any:
            return checkpoint(self.head, self.body(x), use_reentrant=False)

    torch.manual_seed(0)
    return Twice(), Checkpointed()


def test_torch_a_model_calling_itself_runs_one_forward_and_a_recompute_in_backward_is_refused_naming_it() -> None:
    """A call of the model inside its own forward is part of that forward (the target after it is faulted, one
    forward counted); a target that gradient checkpointing recomputes in ``backward()`` is refused in one line
    that says so."""
    torch = require("torch")
    twice, checkpointed = _torch_nets()
    x = torch.randn(2, 4)
    sel = fastflip.Selection(layers=["head"])
    with torch.no_grad(), fastflip.injected_activations(twice, seed=1, count=1, selection=sel) as log:
        twice(x)
    assert log.forwards == 1 and log.layers == ["head"] and len(log) == 2
    with pytest.raises(OptionError, match=r"^layer head ran outside a forward of the model itself: call the model, "
                                          r"not its layers; it ran in backward\(\), where gradient checkpointing "
                                          r"recomputes it: turn checkpointing off to fault it$"):
        with fastflip.injected_activations(checkpointed, seed=1, count=1, selection=sel):
            checkpointed(x.requires_grad_()).sum().backward()
