"""The examples of docs/activations.md run as written."""

from __future__ import annotations

import os
import re
import tomllib

import pytest

from conftest import require
from fastflip.campaign import Campaign

pytestmark = pytest.mark.framework
DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "activations.md")


def test_python_example_runs() -> None:
    require("torch")
    code = re.search(r"```python\n(.*?)```", open(DOC).read(), re.S).group(1)
    exec(compile(code, DOC, "exec"), {"__name__": "docs_example"})


def test_campaign_example_is_valid() -> None:
    block = re.search(r"```toml\n(.*?)```", open(DOC).read(), re.S).group(1)
    c = Campaign.from_dict(tomllib.loads(block))
    assert c.target.kind == "activations" and c.select == {"layers": ["fc1", "fc2"]}
