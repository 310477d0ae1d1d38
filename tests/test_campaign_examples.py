"""The campaign examples run as shipped: examples/cnn_campaign.toml (after `make demo`) and examples/gpt2_campaign.py
(GPT-2 from its config, as Hugging Face builds it)."""

from __future__ import annotations

import io
import os

import pytest

from conftest import require

from fastflip.campaign import load_campaign
from fastflip.campaign.sweep import campaign_cells, sweep

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")

pytestmark = pytest.mark.framework


def test_cnn_campaign_toml_after_make_demo(tmp_path, monkeypatch, capsys):
    """The TOML a newcomer copies after `make demo`: it loads the demo's final PyTorch checkpoint (here one written
    the way the demo writes it), plans and sweeps with the built-in classifier in mini-batches."""
    torch = require("torch")
    from fastflip.cli import main
    from fastflip.frameworks.torch_state import save_checkpoint
    from fastflip.frameworks.trainers.torch_trainer import digits_cnn

    torch.manual_seed(0)
    ckpt = tmp_path / "demo-out" / "torch" / "golden" / "ckpt-e004.h5"
    ckpt.parent.mkdir(parents=True)
    save_checkpoint(ckpt, digits_cnn())
    monkeypatch.setenv("FASTFLIP_DEMO_OUT", str(tmp_path / "demo-out"))
    toml = os.path.join(EXAMPLES, "cnn_campaign.toml")
    assert main(["plan", toml]) == 0
    c = load_campaign(toml)
    assert sorted({x.group for x in campaign_cells(c)}) == ["0", "2", "4", "7"]
    assert c.evaluator.batch_size == 128 and c.evaluator.builtin == "classification"
    c.trials.per_cell = 3
    out = io.StringIO()
    res = sweep(c, str(tmp_path / "cnn.db"), workers=0, stream=out)
    assert res.complete and res.stored == 3 * 5 * 4
    said = out.getvalue()  # B is measured: batched on the prefix path, or serial when that measured faster
    assert ("batched trials: " in said and "per forward (prefix: golden activations cached" in said) or \
        "trials run one at a time (serial): measured no slower than batched; measured ms per trial: serial" in said
    monkeypatch.setenv("FASTFLIP_DEMO_OUT", str(tmp_path / "nowhere"))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.syspath_prepend(EXAMPLES)
    import cnn_campaign

    if not os.path.exists(os.path.join(EXAMPLES, os.pardir, "demo-out")):  # no demo output: the fix is named
        with pytest.raises(FileNotFoundError, match="run `make demo` first"):
            cnn_campaign.checkpoint()


@pytest.mark.parametrize("generation", [False, True], ids=["language-model", "generation"])
def test_gpt2_campaign_example(tmp_path, monkeypatch, capsys, generation):
    require("torch")
    require("transformers")
    monkeypatch.setenv("GPT2_CAMPAIGN_SIZE", "tiny")
    monkeypatch.syspath_prepend(EXAMPLES)
    import gpt2_campaign

    store = str(tmp_path / "g.db")
    args = ["-o", store, "--per-cell", "2", "-j", "0"] + (["--generation"] if generation else [])
    assert gpt2_campaign.main(args) == 0
    out = capsys.readouterr()
    assert "transformer.h.0.attn.c_attn" in out.out and f"{store}: " in out.out
    assert "batched trials: " in out.err
