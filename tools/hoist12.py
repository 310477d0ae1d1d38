"""One-off (issue 12): move function-level internal imports to module top where the layering allows.

Skips modules in SKIP (lazy by design) and imports inside ``try`` blocks. Prints what it moved.
"""
import ast, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "fastflip"
SKIP = sys.argv[1:]


def internal(node, is_pkg):
    return isinstance(node, ast.ImportFrom) and node.level > 0


def process(path: Path) -> int:
    text = path.read_text()
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    parents = {}
    for n in ast.walk(tree):
        for c in ast.iter_child_nodes(n):
            parents[c] = n
    moved, drop = [], set()
    for n in ast.walk(tree):
        if not internal(n, False):
            continue
        p, in_fn, in_try = parents.get(n), False, False
        while p is not None:
            if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
                in_fn = True
            if isinstance(p, ast.Try):
                in_try = True
            p = parents.get(p)
        if not in_fn or in_try:
            continue
        body = parents[n].body if hasattr(parents[n], "body") else None
        if body is not None and len([s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]) == 1:
            continue  # the import is the only statement
        # relative level must be the same at module level (it is: same file)
        seg = "".join(lines[n.lineno - 1:n.end_lineno]).strip()
        moved.append(seg)
        drop.update(range(n.lineno - 1, n.end_lineno))
        # a blank line left after the import inside the function goes too
        if n.end_lineno < len(lines) and lines[n.end_lineno].strip() == "":
            nxt = n.end_lineno
            prev = lines[n.lineno - 2].strip() if n.lineno >= 2 else ""
            if prev.endswith(":") or prev.startswith(("from ", "import ")) or prev.endswith('"""') or prev == "":
                drop.add(nxt)
    if not moved:
        return 0
    # insertion point: after the last module-level import
    last = max(s.end_lineno for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom)))
    uniq = []
    for m in moved:
        if m not in uniq and m not in text.split("\n\n")[0]:
            uniq.append(m)
    out = []
    for i, line in enumerate(lines):
        if i in drop:
            continue
        out.append(line)
        if i == last - 1:
            out.extend(u + "\n" for u in uniq)
    path.write_text("".join(out))
    print(path.relative_to(ROOT), len(moved))
    return len(moved)


total = 0
for p in sorted(SRC.rglob("*.py")):
    mod = ".".join(p.relative_to(SRC.parent).with_suffix("").parts)
    if any(mod == s or mod.startswith(s + ".") for s in SKIP):
        continue
    total += process(p)
print("moved", total)
