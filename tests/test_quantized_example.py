"""examples/quantized_model.py runs as written (torchao int8 live, a quantized state_dict file, a GPTQ layer)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from conftest import require

pytestmark = pytest.mark.framework
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quantized_model.py"


def test_quantized_example_runs(capsys):
    for extra in ("torch", "torchao", "transformers", "safetensors"):
        require(extra)
    runpy.run_path(str(EXAMPLE), run_name="__main__")  # its own asserts check every flip and revert
    out = capsys.readouterr().out
    assert "qdata weight, scale scale, zero_point zero" in out
    assert "torch.load agrees, reverted" in out
    assert "roles: {'qweight': 'weight', 'qzeros': 'zero', 'scales': 'scale'}" in out
    assert "gptq: word (" in out
