"""One-off: move the modules of issue 12 (phase a: git mv; phase b: rewrite imports and names)."""
import ast, re, subprocess, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from moves import MOVES

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "fastflip"

def new_name(old: str) -> str:
    """old full dotted name (fastflip.x.y) -> new full dotted name."""
    rel = old[len("fastflip."):] if old.startswith("fastflip.") else None
    if rel is None:
        return old
    parts = rel.split(".")
    for i in range(len(parts), 0, -1):
        key = ".".join(parts[:i])
        if key in MOVES:
            return "fastflip." + ".".join([MOVES[key]] + parts[i:])
    return old

def old_modules() -> dict[str, str]:
    """old dotted name -> new dotted name for every module (pre-move tree)."""
    out = {}
    for p in SRC.rglob("*.py"):
        parts = list(p.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        old = ".".join(parts)
        out[old] = new_name(old)
    return out

def phase_a():
    mods = old_modules()
    import json
    (ROOT / "tools" / "modmap.json").write_text(json.dumps(mods, indent=1, sort_keys=True))
    for key, dst in MOVES.items():
        src = SRC / (key + ".py")
        if not src.exists():
            src = SRC / key
        if not src.exists():
            print("skip", key); continue
        target = SRC / (dst.replace(".", "/") + (".py" if src.suffix == ".py" else ""))
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "mv", str(src), str(target)], check=True, cwd=ROOT)

def rel(from_mod: str, is_pkg: bool, target: str) -> str:
    base = from_mod.split(".") if is_pkg else from_mod.split(".")[:-1]
    tparts = target.split(".")
    n = 0
    while n < len(base) and n < len(tparts) and base[n] == tparts[n]:
        n += 1
    up = len(base) - n
    return "." * (up + 1) + ".".join(tparts[n:])

def phase_b():
    import json
    mods = json.loads((ROOT / "tools" / "modmap.json").read_text())
    inv = {v: k for k, v in mods.items()}
    oldset = set(mods)
    for p in sorted(SRC.rglob("*.py")):
        parts = list(p.relative_to(SRC.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        new = ".".join(parts)
        old = inv.get(new)
        if old is None:
            continue
        text = p.read_text()
        lines = text.splitlines(keepends=True)
        changed = False
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = old.split(".") if is_pkg else old.split(".")[:-1]
            if node.level > 1:
                base = base[: len(base) - (node.level - 1)]
            absmod = ".".join(base + ([node.module] if node.module else []))
            i = node.lineno - 1
            line = lines[i]
            m = re.match(r"^(\s*)from\s+(\S+)\s+import\s+(.*)$", line, re.S)
            assert m, (p, line)
            submods = [a for a in node.names if f"{absmod}.{a.name}" in oldset]
            if submods:
                assert len(node.names) == 1, (p, line)
                a = node.names[0]
                tgt = new_name(f"{absmod}.{a.name}")
                parent, leaf = tgt.rsplit(".", 1)
                alias = a.asname or a.name
                stmt = f"from {rel(new, is_pkg, parent)} import {leaf}" + (f" as {alias}" if alias != leaf else "")
                lines[i] = f"{m.group(1)}{stmt}\n"
            else:
                lines[i] = f"{m.group(1)}from {rel(new, is_pkg, new_name(absmod))} import {m.group(3)}"
            changed = changed or lines[i] != line
        if changed:
            p.write_text("".join(lines))

def phase_c():
    """Dotted names and paths in every text file."""
    keys = sorted(MOVES, key=len, reverse=True)
    dotted = re.compile(r"(?<![\w.])fastflip\.(" + "|".join(map(re.escape, keys)) + r")(?!\w)")
    slashed = re.compile(r"(?<![\w])fastflip/(" + "|".join(map(re.escape, keys)) + r")(\.py|/)")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    for f in files:
        if f.startswith("tools/") or not re.search(r"\.(py|md|rst|toml|yaml|yml|txt|cfg|in|pyx)$|Makefile$", f):
            continue
        p = ROOT / f
        text = p.read_text()
        t2 = dotted.sub(lambda m: "fastflip." + MOVES[m.group(1)], text)
        t2 = slashed.sub(lambda m: "fastflip/" + MOVES[m.group(1)].replace(".", "/") + m.group(2), t2)
        if t2 != text:
            p.write_text(t2)
            print("names:", f)

if __name__ == "__main__":
    {"a": phase_a, "b": phase_b, "c": phase_c}[sys.argv[1]]()
