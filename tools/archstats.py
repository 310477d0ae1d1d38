"""Architecture figures of the fastflip source tree, read from the code with ``ast``.

Counts modules, lines, import cycles (over every runtime import, and again with the ``if TYPE_CHECKING:``
imports), function-level internal imports, the places that define
the word rule ``((old & and) | or) ^ xor`` and the public forms that say how many sites to hit
(:func:`sampling_forms`); ``tests/test_layers.py`` uses :func:`import_graph` to
enforce the layering. Run from the repository root::

    python tools/archstats.py            # figures as a small table
    python tools/archstats.py --edges    # also list every function-level internal import

Only the standard library is used, so it runs on any checkout (before or after a refactor).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "fastflip"

# A line of code (not prose) that spells the word rule: ``(((old & a) | o) ^ x)`` in any dialect.
_RULE = re.compile(r"\(\(\(?\s*old\s*&\s*[\w\[\]]+\s*\)\s*\|\s*[\w\[\]]+\s*\)\s*\^\s*[\w\[\]]+")


@dataclass
class Edge:
    """One internal import: ``src`` imports ``dst`` at line ``line``; ``top`` when at module level."""

    src: str
    dst: str
    line: int
    top: bool


@dataclass
class Graph:
    """The internal import graph of the package."""

    modules: dict[str, Path] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)


def module_name(path: Path, src: Path) -> str:
    """Dotted name of the module at ``path`` under the source root ``src``."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module, type_only: bool = False) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every runtime import statement with whether it runs at module level; ``type_only``: also those under
    ``if TYPE_CHECKING:`` (which never run), as module level."""
    out: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def walk(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in (child.body + child.orelse if type_only else child.orelse):
                    walk_one(sub, top)
                continue
            walk_one(child, top)

    def walk_one(child: ast.AST, top: bool) -> None:
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            out.append((child, top))
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            walk(child, False)
        else:
            walk(child, top)

    walk(tree, True)
    return out


def _resolve(mod: str, is_pkg: bool, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    """Internal modules an import statement loads (the longest existing module prefix of each name)."""
    targets: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = mod.split(".") if is_pkg else mod.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{a.name}" for a in node.names] or [prefix]
        names.append(prefix)
    for name in names:
        if not (name == PACKAGE or name.startswith(PACKAGE + ".")):
            continue
        parts = name.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        if parts:
            targets.append(".".join(parts))
    # ``from .x import y`` loads x; ``from . import x`` loads the package and x: keep the most specific ones.
    uniq = sorted(set(targets))
    return [t for t in uniq if not any(o != t and o.startswith(t + ".") for o in uniq)] if not isinstance(
        node, ast.Import) else uniq


def import_graph(src: Path | None = None, type_only: bool = False) -> Graph:
    """Parse every module of the package under ``src`` (default: ``ROOT/src``) and return its import graph
    (``type_only``: with the ``if TYPE_CHECKING:`` imports as well, to find circles of names)."""
    src = src or ROOT / "src"
    graph = Graph()
    for path in sorted((src / PACKAGE).rglob("*.py")):
        graph.modules[module_name(path, src)] = path
    for mod, path in graph.modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, top in _imports(tree, type_only):
            for dst in _resolve(mod, path.name == "__init__.py", node, graph.modules):
                if dst != mod:
                    graph.edges.append(Edge(mod, dst, node.lineno, top))
    return graph


def cycles(graph: Graph, top_only: bool = False) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan) over every runtime import: module-level
    and function-level (``top_only``: module-level only). Only ``if TYPE_CHECKING:`` imports, which never run,
    are left out of the graph; a package's ``__init__`` counts like any module (``pkg/__init__`` importing
    ``pkg.x`` while ``pkg.x`` imports from ``pkg`` is a cycle)."""
    adj: dict[str, set[str]] = {m: set() for m in graph.modules}
    for e in graph.edges:
        if top_only and not e.top:
            continue
        adj[e.src].add(e.dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in adj:
        if v not in index:
            strong(v)
    return out


def _docstring_lines(text: str) -> set[int]:
    """Line numbers of the docstrings (bare string statements) of a Python source."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def rule_sites(root: Path | None = None) -> list[str]:
    """``path:line`` of every line of code (not prose) that spells the word rule, in src/ and ext/."""
    root = root or ROOT
    found = []
    files = [p for p in (root / "src" / PACKAGE).rglob("*") if p.suffix in {".py", ".pyx", ".pxd", ".h", ".c", ".cu"}]
    files += [p for p in (root / "ext").glob("*") if p.suffix in {".pyx", ".pxd", ".h", ".cu"}]
    for path in sorted(files):
        text = path.read_text(encoding="utf-8", errors="replace")
        prose = _docstring_lines(text) if path.suffix == ".py" else set()
        for n, line in enumerate(text.splitlines(), 1):
            code = line.strip()
            if n in prose or "``" in code or code.startswith(("#", '"""', "*", "//", "/*")):
                continue
            if _RULE.search(code):
                found.append(f"{path.relative_to(root)}:{n}")
    return found


def _private(name: str) -> bool:
    """A name a user is not meant to call: one leading underscore (a dunder such as ``__init__`` is public)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _amount_names(node: ast.AST) -> set[str]:
    """A function's parameter names, or a class's annotated field names (a dataclass's fields)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = node.args
        return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
    if isinstance(node, ast.ClassDef):
        return {b.target.id for b in node.body if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)}
    return set()


def sampling_forms(root: Path | None = None) -> list[str]:
    """The public forms that say "how many sites" on their own: ``module:name`` (``module:Class.method`` for a
    method) of every function, class or method whose parameters (for a class: annotated fields) include
    ``count`` and ``rate`` or ``ber``.

    Public means what a user can call by name: a module-level function or class, or a method of such a class,
    where no part of the dotted name (module, class, function) starts with one underscore: private helpers
    are not forms a user can say, and functions nested in functions are not reachable (neither is read).
    Everything else takes a :class:`fastflip.core.spec.Sampling` (``sampling=``, or
    its fields as shorthand keywords gathered by ``**`` into ``Sampling.of``), which is itself listed: the
    target figure is 1.
    """
    root = root or ROOT
    graph = import_graph(root / "src")
    found = []
    for mod, path in sorted(graph.modules.items()):
        if any(_private(part) for part in mod.split(".")):
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or _private(node.name):
                continue
            named = [(node.name, node)]
            if isinstance(node, ast.ClassDef):
                named += [(f"{node.name}.{m.name}", m) for m in node.body
                          if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _private(m.name)]
            for name, n in named:
                names = _amount_names(n)
                if "count" in names and names & {"rate", "ber"}:
                    found.append(f"{mod}:{name}")
    return found


def figures(root: Path | None = None) -> dict[str, int]:
    """The figures quoted in docs/internals.md."""
    root = root or ROOT
    graph = import_graph(root / "src")
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in graph.modules.values())
    rules = rule_sites(root)
    return {
        "modules": len(graph.modules),
        "lines": lines,
        "import cycles (all imports)": len(cycles(graph)),
        "modules in a cycle": sum(len(c) for c in cycles(graph)),
        "import cycles (module-level imports)": len(cycles(graph, top_only=True)),
        "import cycles (with TYPE_CHECKING imports)": len(cycles(import_graph(root / "src", type_only=True))),
        "function-level internal imports": len({(e.src, e.line) for e in graph.edges if not e.top}),
        "  of them outside cli/": len({(e.src, e.line) for e in graph.edges
                                       if not e.top and not (e.src + ".").startswith(f"{PACKAGE}.cli.")}),
        "word-rule definitions (files)": len({r.rsplit(":", 1)[0] for r in rules}),
        "word-rule definitions (lines)": len(rules),
        "forms that say how many sites": len(sampling_forms(root)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    ap.add_argument("--edges", action="store_true", help="list function-level internal imports and cycles")
    args = ap.parse_args(argv)
    for key, value in figures(args.root).items():
        print(f"{key:44s} {value}")
    if args.edges:
        graph = import_graph(args.root / "src")
        for e in graph.edges:
            if not e.top:
                print(f"  inner  {e.src}:{e.line} -> {e.dst}")
        for c in cycles(graph):
            print("  cycle  " + " -> ".join(c))
        for c in cycles(import_graph(args.root / "src", type_only=True)):
            print("  cycle (with TYPE_CHECKING imports)  " + " -> ".join(c))
        for r in rule_sites(args.root):
            print("  rule   " + r)
        for f in sampling_forms(args.root):
            print("  sampling " + f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
