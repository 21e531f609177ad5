"""Issue 54: a strategy's behaviour lives with it. No code outside a strategy's own family (its module, or the package
it is declared in) reads its name: the loop, the data, the export, the estimate and the plan search get what a
strategy does through its hooks (a data view, a sampler, a loss, its seams, `on_by_default`), never by asking which
strategies a row holds. Read off the code's string literals, as the no-cycle test reads its imports."""

from __future__ import annotations

import ast
from pathlib import Path

from trainwise import strategies
from trainwise.strategies.knobs import KNOBS

PACKAGE = Path(strategies.__file__).resolve().parents[1]
# the same word with another meaning, where it is not a knob's value: each with why
ELSEWHERE = {
    ("strategies/base.py", "lora"): "the pip extra trainwise[lora] (PACKAGE_EXTRAS: pyproject's optional-dependencies)",
    ("strategies/base.py", "liger"): "the pip extra trainwise[liger]",
    ("strategies/base.py", "cce"): "the pip extra trainwise[cce]",
    ("strategies/scale.py", "pin_memory"): "DeepSpeed's offload config key, {'device': 'cpu', 'pin_memory': True}",
    ("strategies/batching/__init__.py", "packing"): "TRL's SFTConfig field of that name (then TRL pads nothing)",
    ("exporting/user_config.py", "packing"): "TRL's SFTConfig field of that name, in the file written back",
    ("exporting/user_config.py", "padding_free"): "TRL's SFTConfig field of that name, in the file written back",
}


def homes(package: Path = PACKAGE) -> dict[str, Path]:
    """Each strategy's family: the package it is declared in (strategies/lm/), or its module (strategies/optim.py)."""
    found: dict[str, Path] = {}
    for path in (package / "strategies").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                name = node.args[0].value
                if name in strategies.REGISTRY and getattr(node.func, "id", "") in ("Strategy", "_optimizer", "_zero"):
                    found[name] = path.parent if path.parent.name != "strategies" else path
    return found


def values() -> set[str]:
    """Every value a knob takes (bf16 is a precision as well as a strategy's name; sdpa an attention kernel)."""
    return {str(c) for k in KNOBS.values() if k.choices for c in k.choices}


def named_outside(package: Path = PACKAGE) -> list[str]:
    """`file:line name` for each string literal that is a strategy's name, outside its family, the registry, the
    registry's relations (a Strategy's conflicts, with_one_of, overlaps and interacts) and ELSEWHERE, where it is no
    knob's value."""
    home, taken, found = homes(package), values(), []
    for path in sorted(package.rglob("*.py")):
        if path == package / "strategies" / "__init__.py":  # the registry: default rows, aliases, the short list
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        relations = {
            id(c)
            for node in ast.walk(tree)
            if isinstance(node, ast.keyword) and node.arg in ("conflicts", "with_one_of", "overlaps", "interacts")
            for c in ast.walk(node.value)
        }
        rel = path.relative_to(package).as_posix()
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in relations:
                continue
            name = node.value
            if name not in strategies.REGISTRY or name == "baseline" or name in taken or (rel, name) in ELSEWHERE:
                continue
            family = home.get(name)
            if family is not None and (path == family or family in path.parents):
                continue
            found.append(f"{rel}:{node.lineno} {name}")
    return found


def test_strategies_have_families_and_names_read_nowhere_else():
    """Every strategy has a family, and no other code reads its name."""
    assert set(homes()) | {"baseline"} == set(strategies.REGISTRY)  # the baseline: the registry's own
    found = named_outside()
    assert not found, f"a strategy's name read outside its family (give the reader a hook instead): {found}"


def test_the_check_finds_a_name_read_elsewhere(tmp_path):
    """It fails where it should: a module of the loop asking whether a row packs."""
    pkg = tmp_path / "trainwise"
    (pkg / "strategies").mkdir(parents=True)
    (pkg / "training").mkdir()
    (pkg / "training" / "loop.py").write_text('def stream(plan):\n    return plan.value("packing")\n')
    (pkg / "strategies" / "lm.py").write_text('S = Strategy("packing", "...", conflicts=frozenset({"dynamic_pad"}))\n')
    assert named_outside(pkg) == ["training/loop.py:2 packing"]
