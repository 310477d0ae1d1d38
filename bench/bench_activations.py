"""Per-sample activation faults and weight-fault trials on a ResNet-18-shaped model, next to PyTorchFI 0.6.0.

Model: torchvision's ResNet-18 layout built in code (``tests/act_models.py``), random weights,
eval mode, input 64 x 3 x 32 x 32, ``torch.no_grad``, one torch thread (the machine is shared).

Activation faults, one batch of 64 = 64 trials (one fault per sample in a conv output):

- fastflip: ``injected_activations(per_sample=True, count=1, model='flip')`` over the 20 conv
  layers' outputs (sites uniform over their elements; an exact float32 bit flip) and one forward;
- PyTorchFI: ``random_neuron_inj_batched`` (a random value per sample; it deep-copies the model
  in ``declare_neuron_fi``) and one forward of the corrupted copy; and its bit-flip model
  ``random_neuron_single_bit_inj_batched`` (flips a bit of an 8-bit quantisation of the value,
  per element in Python strings);
- the fault-free forward, for scale.

Weight faults, one trial = one fault in a conv weight, model ready to run, then restored:

- fastflip: ``SiteSpace.plan`` + ``live.inject`` + ``live.revert`` (targets prepared once);
- PyTorchFI: ``random_weight_inj`` (deep copy of the model with one value set; restore = drop it).

Run: ``pytest bench/bench_activations.py --benchmark-only --benchmark-columns=min,median,max,rounds``
(PyTorchFI: ``pip install --no-deps pytorchfi==0.6.0``, as ``make bench`` does).
"""

from __future__ import annotations

import itertools
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

torch = pytest.importorskip("torch")
from act_models import resnet18  # noqa: E402

import fastflip  # noqa: E402
from fastflip import live  # noqa: E402
from fastflip.core.sampling import SiteSpace  # noqa: E402
from fastflip.core.spec import Sampling  # noqa: E402

BATCH = 64


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    model = resnet18()
    x = torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    convs = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)]
    return model, x, convs


def _pfi(kind: str, model):  # noqa: ANN001, ANN202
    core = pytest.importorskip("pytorchfi.core", reason="pip install --no-deps pytorchfi==0.6.0")
    if kind == "bitflip":
        from pytorchfi.neuron_error_models import single_bit_flip_func

        return single_bit_flip_func(model, BATCH, input_shape=[3, 32, 32], layer_types=[torch.nn.Conv2d],
                                    use_cuda=False, bits=8)
    return core.fault_injection(model, BATCH, input_shape=[3, 32, 32], layer_types=[torch.nn.Conv2d], use_cuda=False)


def test_forward_fault_free(benchmark, setup) -> None:
    model, x, _ = setup
    with torch.no_grad():
        benchmark.pedantic(lambda: model(x), rounds=5, warmup_rounds=1)
    benchmark.extra_info["trials_per_round"] = BATCH


def test_activations_per_sample_fastflip(benchmark, setup) -> None:
    model, x, convs = setup
    sel = fastflip.Selection(layers=convs)
    seeds = itertools.count()

    def batch_of_trials():
        with torch.no_grad(), fastflip.injected_activations(model, next(seeds), count=1, per_sample=True,
                                                            selection=sel) as log:
            model(x)
        return log

    log = benchmark.pedantic(batch_of_trials, rounds=5, warmup_rounds=1)
    assert len(log) == BATCH and sorted(set(log.sample.tolist())) == list(range(BATCH))
    benchmark.extra_info["trials_per_round"] = BATCH


def test_activations_per_sample_pytorchfi_value(benchmark, setup) -> None:
    model, x, _ = setup
    pfi = _pfi("value", model)
    from pytorchfi.neuron_error_models import random_neuron_inj_batched

    def batch_of_trials():
        with torch.no_grad():
            return random_neuron_inj_batched(pfi)(x)

    benchmark.pedantic(batch_of_trials, rounds=5, warmup_rounds=1)
    benchmark.extra_info["trials_per_round"] = BATCH


def test_activations_per_sample_pytorchfi_bitflip(benchmark, setup) -> None:
    model, x, convs = setup
    pfi = _pfi("bitflip", model)
    from pytorchfi.neuron_error_models import random_neuron_single_bit_inj_batched

    peaks: list[float] = []  # per conv layer in forward order (PyTorchFI's layer numbering), with headroom
    hooks = [m.register_forward_hook(lambda m, a, o: peaks.append(1.01 * float(o.abs().max())))
             for n, m in model.named_modules() if n in convs]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    ranges = peaks

    def batch_of_trials():
        with torch.no_grad():
            return random_neuron_single_bit_inj_batched(pfi, ranges)(x)

    benchmark.pedantic(batch_of_trials, rounds=5, warmup_rounds=1)
    benchmark.extra_info["trials_per_round"] = BATCH


def test_weight_trial_fastflip(benchmark, setup) -> None:
    model, _, _ = setup
    tg = live.targets({f"model/{k}": v for k, v in model.state_dict().items()})  # the module's own storage
    space = SiteSpace([r for r in tg.refs() if r.name.endswith(".weight") and len(r.shape) == 4])
    counter, one = itertools.count(), Sampling(count=1)
    benchmark(lambda: live.revert(tg, live.inject(tg, space.plan(one, seed=6, stream=(next(counter),)))))


def test_weight_trial_pytorchfi(benchmark, setup) -> None:
    model, _, _ = setup
    pfi = _pfi("value", model)
    from pytorchfi.weight_error_models import random_weight_inj

    benchmark.pedantic(lambda: random_weight_inj(pfi, min_val=-1, max_val=1), rounds=10, warmup_rounds=1)
