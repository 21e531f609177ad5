"""Issue 25: imports point down. The graph of trainwise's imports, counting those inside functions,
has no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "trainwise"


def module_of(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the trainwise modules it imports anywhere in its file (a package's submodule imports
    count as the submodule: `from trainwise.strategies import base` -> strategies.base)."""
    modules = {module_of(p, package): p for p in package.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainwise"):
                base = node.module.removeprefix("trainwise").lstrip(".")
                for alias in node.names:
                    sub = f"{base}.{alias.name}" if base else alias.name
                    edges[name].add(sub if sub in modules else base)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("trainwise."):
                        edges[name].add(alias.name.removeprefix("trainwise."))
        edges[name] &= set(modules) - {name, ""}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected sets of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(frozenset(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_inside_functions(tmp_path):
    """A cycle made only by an import inside a function is found, and so is one through a package's
    submodule; a module importing a sibling that imports nothing back is no cycle."""
    pkg = tmp_path / "trainwise"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "low.py": "def f():\n    from trainwise import high  # deferred\n    return high\n",
        "high.py": "from trainwise.low import f\n",
        "sub/__init__.py": "from trainwise.sub import leaf\n",
        "sub/leaf.py": "import trainwise.alone\n",
        "alone.py": "x = 1\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    edges = graph(pkg)
    assert edges["low"] == {"high"} and edges["sub"] == {"sub.leaf"} and edges["sub.leaf"] == {"alone"}
    assert cycles(edges) == [frozenset({"low", "high"})]


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, f"import cycles: {sorted(map(sorted, found))}"


def unexplained_imports(package: Path = PACKAGE) -> list[str]:
    """`file:line` of every import inside a function with no `#` comment on its line nor on the line above
    its run of consecutive in-function imports (one comment may explain a block)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        inner = {}
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import | ast.ImportFrom):
                        inner[node.lineno] = node
        ends = {node.end_lineno: node.lineno for node in inner.values()}
        for start in sorted(inner):
            if "#" in lines[start - 1]:
                continue
            above = start - 1
            while above in ends:  # the block's first line
                above = ends[above] - 1
            if not (above >= 1 and lines[above - 1].strip().startswith("#")):
                found.append(f"{path.relative_to(package.parent)}:{start}")
    return found


def test_every_deferred_import_says_why(tmp_path):
    """Issue 25: an import inside a function is there to keep start-up light (a heavy or optional package),
    and says so in a comment; one without a reason belongs at the top of its module."""
    pkg = tmp_path / "trainwise"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "def a():\n    import torch  # heavy: torch\n"
        "def b():\n    # heavy: torch, transformers\n    import torch\n    import transformers\n"
        "def c():\n    import json\n"
    )
    assert unexplained_imports(pkg) == ["trainwise/m.py:8"]
    found = unexplained_imports()
    assert not found, f"imports inside functions with no reason (move them to the top, or say why): {found}"


def test_the_api_loads_rich_only_to_show_something():
    """The API's default render is rich on stderr: importing the API (and the CLI's start) must not load it."""
    import subprocess
    import sys

    code = "import sys, trainwise.api.compare, trainwise.api.render, trainwise.cli; print('rich' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "False", run.stderr


def rooms(doc: Path = PACKAGE.parent / "docs" / "architecture.md") -> list[str]:
    """The rooms in docs/architecture.md's Layout block, top first (each may import only those after it)."""
    import re

    block = re.search(r"```\ntrainwise/\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)
    assert block, "docs/architecture.md has no Layout block starting 'trainwise/'"
    found = []
    for line in block[1].splitlines():
        if m := re.match(r"^  ((?:[a-z_]+/\s+)+)", line):
            found += [r.strip("/") for r in m[1].split()]
    return found


# issue 60: the imports from a room above that remain, each named; a new one fails here, one that goes must leave it.
KNOWN_UP: set[tuple[str, str]] = set()


def test_each_room_imports_only_the_rooms_below_it():
    """docs/architecture.md's layer picture as the code's imports read it, those inside functions too: a module
    imports no module of a room above its own (the order of the Layout block)."""
    order = rooms()
    assert order[-1] == "core" and len(order) == len(set(order)) >= 10, order
    rank = {room: i for i, room in enumerate(order)}  # 0: the top
    up = {
        (module, target)
        for module, targets in graph().items()
        for target in targets
        if module.split(".")[0] in rank
        and target.split(".")[0] in rank
        and rank[target.split(".")[0]] < rank[module.split(".")[0]]
    }
    assert up - KNOWN_UP == set(), f"imports from a room above: {sorted(up - KNOWN_UP)}"
    assert KNOWN_UP - up == set(), f"gone (drop them from KNOWN_UP): {sorted(KNOWN_UP - up)}"


def test_no_room_or_module_shadows_a_verb():
    """`trainwise.estimate(...)` is a verb found on first use (trainwise/__init__.py); a subpackage or top-level module
    of that name would replace it on import (`trainwise.estimate` the package: 'module' object is not callable)."""
    import trainwise

    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}
    clash = names & (trainwise._VERBS | {"open", "recipe"})
    assert not clash, f"trainwise/ holds a module named as a verb: {sorted(clash)}"
