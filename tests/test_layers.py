"""The package's layering, read from the source with ``ast`` (tools/archstats.py): imports point downward
only and there is no import cycle.

Layers, lowest first (docs/internals.md): errors → core → kernels → files → live → frameworks → campaign →
experiment → report, compat → cli (and the demo). A module may import its own subpackage and any lower layer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import archstats  # noqa: E402

RANKS = {
    "fastflip.errors": 0,
    "fastflip.core": 1, "fastflip.kernels": 2, "fastflip.files": 3, "fastflip.live": 4, "fastflip.frameworks": 5,
    "fastflip.campaign": 6, "fastflip.experiment": 7, "fastflip.report": 8, "fastflip.compat": 8,
    "fastflip.cli": 9, "fastflip.demo": 9, "fastflip.__main__": 10,
}


def layer(module: str) -> str:
    """The layer a module belongs to: ``fastflip.<subpackage>`` or a root module."""
    parts = module.split(".")
    return ".".join(parts[:2])


@pytest.fixture(scope="module")
def graph() -> archstats.Graph:
    return archstats.import_graph(ROOT / "src")


def test_every_module_has_a_layer(graph: archstats.Graph) -> None:
    unplaced = sorted(m for m in graph.modules if m != "fastflip" and layer(m) not in RANKS)
    assert not unplaced, f"modules outside the layers (add them to a subpackage or to RANKS): {unplaced}"


def test_imports_point_downward(graph: archstats.Graph) -> None:
    upward = []
    for e in graph.edges:
        if e.src == "fastflip" or e.dst == "fastflip":  # the root: lazy re-exports / __version__
            continue
        a, b = layer(e.src), layer(e.dst)
        if a != b and RANKS[b] >= RANKS[a]:
            upward.append(f"{e.src}:{e.line} imports {e.dst} ({'module' if e.top else 'function'} level)")
    assert not upward, "imports that do not point downward:\n" + "\n".join(upward)


def test_no_import_cycles(graph: archstats.Graph) -> None:
    assert archstats.cycles(graph) == []


# Modules that may import fastflip modules inside functions, and why (docs/internals.md, "Imports"). A key names
# one module exactly; a key ending in ".*" names a package and every module below it. (The root package's lazy
# re-exports go through importlib in its ``__getattr__``, not through import statements, so it needs no entry.)
LAZY = {
    "fastflip.cli.*": "a subcommand's code is imported when it runs, so `fastflip --help` stays light",
    "fastflip.campaign.trials": "the batched-trials machinery (campaign/batched.py, torch.fx splits) is imported when a "
                               "runner's trials may batch, not by sweeps whose trials run one by one",
    "fastflip.files.formats": "the per-format reader registry imports one reader when a file of that format is read",
    "fastflip.files.encoded": "the patchers of filtered HDF5 chunks and zip members are imported when a plan has "
                              "sites there (a command on raw storage loads neither)",
    "fastflip.files.archives": "the .keras archive code (and zip writing) is imported when a file is a .keras archive",
    "fastflip.files.layout": "the Keras sharded reader (files/keras_sharded.py) is imported when a Keras sharded "
                             "save is read, not for a single file",
    "fastflip.files.inject": "the in-place writers (files/inplace.py) and the region-evidence copy "
                             "(files/copyregions.py) are imported by the inject that uses them, not for a new file",
    "fastflip.kernels.engines": "the compiled Cython extension is optional: imported when its backend loads",
}


def lazy_allowed(module: str, lazy: dict[str, str] = LAZY) -> bool:
    """Whether ``module`` may import fastflip modules inside functions: it is a key of ``lazy``, or lies
    below a ``pkg.*`` key (the root package's key ``fastflip`` allows the root module only)."""
    return module in lazy or any(k.endswith(".*") and (module == k[:-2] or module.startswith(k[:-1]))
                                 for k in lazy)


def hidden_imports(graph: archstats.Graph, lazy: dict[str, str] = LAZY) -> list[str]:
    """``module:line -> target`` of each function-level internal import in a module ``lazy`` does not allow."""
    return sorted({f"{e.src}:{e.line} -> {e.dst}" for e in graph.edges if not e.top and not lazy_allowed(e.src, lazy)})


def test_function_level_imports_only_where_documented(graph: archstats.Graph) -> None:
    hidden = hidden_imports(graph)
    assert not hidden, "internal imports inside functions (move them to the top of the module):\n" + "\n".join(hidden)


def test_every_lazy_entry_is_still_needed(graph: archstats.Graph) -> None:
    """An entry whose module no longer imports anything inside a function is removed (the table stays honest)."""
    inner = {e.src for e in graph.edges if not e.top}
    stale = sorted(k for k in LAZY if not any(lazy_allowed(m, {k: ""}) for m in inner))
    assert not stale, f"LAZY entries without a function-level internal import (remove them): {stale}"


# Modules that import another module's private (underscore) name, and why. Shared helpers are public, documented
# functions of the module that owns them (e.g. files/sites.py for inject.py and sharded.py).
PRIVATE_IMPORTS = {
    "fastflip.report.experiment_data": "campaign.store._version_tuple (not yet made public)",
    "fastflip.report.bitclass": "report.campaign_data._SITE_BIT_SQL (not yet made public)",
    "fastflip.cli.hdf5_corrupter_cmd": "cli.inject_cmd._print_summary (not yet made public)",
}


def _is_module(name: str) -> bool:
    """Whether ``name`` is an importable module (a compiled extension installed elsewhere than ``src/``)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _private_imports(src: Path) -> list[str]:
    """``module:line name`` for each ``from <fastflip module> import _name`` (a private function, class or value;
    aliases of public names, private submodules and dunders are not counted)."""
    import ast

    found = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).with_suffix("")
        parts = list(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        mod = ".".join(parts)
        pkg = parts if rel.name == "__init__" else parts[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = pkg[: len(pkg) - node.level + 1] + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "fastflip":
                base = node.module.split(".")
            else:
                continue
            where = src.joinpath(*base)
            for a in node.names:
                name = a.name
                if not name.startswith("_") or name.startswith("__") or (where / name).is_dir() \
                        or (where / f"{name}.py").exists() or list(where.glob(f"{name}.*.so")) \
                        or _is_module(".".join([*base, name])):
                    continue
                found.append(f"{mod}:{node.lineno} {'.'.join(base)}.{name}")
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    bad = [f for f in _private_imports(ROOT / "src") if f.split(":")[0] not in PRIVATE_IMPORTS]
    assert not bad, "private names imported from other modules (make them public where they belong):\n" + "\n".join(bad)


def test_the_private_import_check_sees_them(tmp_path: Path) -> None:
    pkg = tmp_path / "fastflip" / "files"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("def _helper():\n    pass\n")
    (pkg / "b.py").write_text("from .a import _helper\nfrom . import a as _a\n")
    assert _private_imports(tmp_path) == ["fastflip.files.b:1 fastflip.files.a._helper"]


def test_the_checker_sees_what_it_checks(tmp_path: Path) -> None:
    """The graph finds a planted cycle and a function-level import (so the tests above can fail)."""
    pkg = tmp_path / "src" / "fastflip"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("from .b import x\n")
    (pkg / "core" / "b.py").write_text("def f():\n    from ..core import a\n")
    g = archstats.import_graph(tmp_path / "src")
    assert archstats.cycles(g) == [["fastflip.core.a", "fastflip.core.b"]]  # the function-level edge counts
    assert archstats.cycles(g, top_only=True) == []
    assert [(e.src, e.top) for e in g.edges] == [("fastflip.core.a", True), ("fastflip.core.b", False)]


def _planted(tmp_path: Path, files: dict[str, str]) -> archstats.Graph:
    """The import graph of a small ``fastflip`` package made of ``files`` (path below the package -> source)."""
    pkg = tmp_path / "src" / "fastflip"
    for rel, text in {"__init__.py": "", **files}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return archstats.import_graph(tmp_path / "src")


def test_the_lazy_check_sees_a_planted_function_level_import(tmp_path: Path) -> None:
    """A function-level internal import is reported in any module not in LAZY, and allowed below
    ``fastflip.cli``; a plain key covers its own module only (``fastflip`` is not the whole package)."""
    g = _planted(tmp_path, {
        "__init__.py": "def __getattr__(name):\n    from .core import a\n",
        "core/__init__.py": "", "core/a.py": "x = 1\n",
        "core/b.py": "def f():\n    from .a import x\n    return x\n",
        "cli/__init__.py": "", "cli/run_cmd.py": "def main():\n    from ..core import b\n",
    })
    assert hidden_imports(g) == ["fastflip.core.b:2 -> fastflip.core.a", "fastflip:2 -> fastflip.core.a"]
    assert hidden_imports(g, {"fastflip": "root", "fastflip.cli.*": "cli"}) == ["fastflip.core.b:2 -> fastflip.core.a"]
    assert lazy_allowed("fastflip.cli") and lazy_allowed("fastflip.cli.run_cmd")
    assert not lazy_allowed("fastflip.core.b") and not lazy_allowed("fastflip.client")


def test_type_checking_imports_are_the_only_ones_left_out(tmp_path: Path) -> None:
    """A cycle closed by a function-level import or by a package's ``__init__`` counts; one closed only by an
    ``if TYPE_CHECKING:`` import does not (it never runs), unless asked for."""
    g = _planted(tmp_path, {
        "files/__init__.py": "def read():\n    from . import reader\n",
        "files/reader.py": "from . import FormatError\n",
        "live/__init__.py": "",
        "live/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import T\n",
        "live/b.py": "def f():\n    from . import a\n",
    })
    assert archstats.cycles(g) == [["fastflip.files", "fastflip.files.reader"]]
    typed = archstats.import_graph(tmp_path / "src", type_only=True)
    assert archstats.cycles(typed) == [["fastflip.files", "fastflip.files.reader"], ["fastflip.live.a", "fastflip.live.b"]]


def test_no_cycles_even_through_type_checking_imports() -> None:
    """Names are shared downward too: no circle closes through an ``if TYPE_CHECKING:`` import either."""
    assert archstats.cycles(archstats.import_graph(ROOT / "src", type_only=True)) == []
