"""One way to say how many sites to hit: the :class:`~fastflip.core.spec.Sampling` (tools/archstats.py's
"forms that say how many sites", read from the source with ``ast``)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import archstats  # noqa: E402


def test_sampling_is_the_one_form_that_says_how_many_sites() -> None:
    assert archstats.sampling_forms() == ["fastflip.core.spec:Sampling"]
    assert archstats.figures()["forms that say how many sites"] == 1


def test_the_form_check_sees_a_planted_form(tmp_path: Path) -> None:
    """Public functions, classes' fields and methods (``__init__`` included) are forms; private names,
    private modules and functions nested in functions are not."""
    pkg = tmp_path / "src" / "fastflip"
    files = {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/a.py": ("def draw(count=None, rate=None): ...\n"
                      "def _draw(count=None, ber=None): ...\n"
                      "def outer():\n    def inner(count, rate): ...\n"
                      "class Spec:\n    count: int\n    ber: float\n"
                      "class Space:\n    def __init__(self, count, rate): ...\n    def plan(self, count, ber): ...\n"
                      "    def _plan(self, count, ber): ...\n"
                      "class _Hidden:\n    def plan(self, count, rate): ...\n"
                      "def sized(count, bits): ...\n"),
        "core/_private.py": "def draw(count, rate): ...\n",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    assert archstats.sampling_forms(tmp_path) == ["fastflip.core.a:draw", "fastflip.core.a:Spec",
                                                  "fastflip.core.a:Space.__init__", "fastflip.core.a:Space.plan"]
