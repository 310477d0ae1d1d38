"""docs/live.md runs: every ```python block (except those marked ``<!-- shown, not run -->``) is executed in order."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import require

pytestmark = pytest.mark.framework
DOC = Path(__file__).resolve().parents[1] / "docs" / "live.md"
_BLOCK = re.compile(r"(<!-- shown, not run -->\s*)?```python\n(.*?)```", re.S)


def blocks(text: str) -> list[str]:
    """The runnable code blocks of a Markdown page, in order."""
    return [m.group(2) for m in _BLOCK.finditer(text) if not m.group(1)]


def test_the_live_models_page_runs(tmp_path, monkeypatch) -> None:
    require("torch")
    require("keras")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    text = DOC.read_text()
    code = blocks(text)
    assert len(code) >= 10 and "pytorchfi" not in "".join(code)  # the PyTorchFI side is shown, not run
    assert "declare_weight_fi" in text
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "live_md"}
    for i, block in enumerate(code):
        try:
            exec(compile(block, f"{DOC.name}[block {i}]", "exec"), namespace)
        except Exception as exc:  # name the block that failed
            raise AssertionError(f"docs/live.md block {i} failed: {exc!r}\n{block}") from exc
    assert namespace["sdc"] >= 0 and namespace["one"] >= 0
