"""The package's import rules (docs/architecture.md), checked on every module's import statements (read with ast,
nothing imported): each package imports only packages below it, and eval only what evaluating a model needs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "src" / "difftransformer"

# Lower first. A package may import its own modules and those of any package of a lower rank; packages of one
# rank do not import each other. The top rank holds the commands and tools that may use everything.
RANKS: dict[str, int] = {
    "errors": -1,
    "storage": 0,
    "stats": 0,
    "flags": 0,
    "process_signals": 0,
    "plotting": 1,
    "ops": 1,
    "layers": 2,
    "models": 3,
    "convert": 4,
    "data": 4,
    "train": 5,
    "eval": 5,
    "compare": 6,
    "bench": 7,
    "cli": 7,
    "generate": 7,
    "generate_cli": 7,
    "__main__": 7,
    "__init__": 7,
}
# eval works on any causal LM: it needs the models, their layers (logit hooks), the data, the storage, the
# statistics, the plots, the usage error and the flag generator (its options become flags).
EVAL_MAY_IMPORT = {
    "errors",
    "eval",
    "models",
    "layers",
    "ops",
    "data",
    "storage",
    "stats",
    "plotting",
    "flags",
}


def unit(module_path: Path) -> str:
    """The package (or top-level module) a source file belongs to: 'ops', 'train', 'cli', ..."""
    parts = module_path.relative_to(ROOT).with_suffix("").parts
    return parts[0]


def imported_units(path: Path) -> set[tuple[str, int]]:
    """(unit, line) of every difftransformer import in ``path``, lazy and relative ones included. A bare
    ``import difftransformer`` is the root package, which exports the models."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = path.relative_to(ROOT.parent).with_suffix("").parts[:-1]
    if path.name == "__init__.py":
        package = path.relative_to(ROOT.parent).parts[:-1]
    found = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                module = ".".join(base + ([node.module] if node.module else []))
                names = [module] if node.module else [f"{module}.{alias.name}" for alias in node.names]
            elif node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] != "difftransformer":
                continue
            target = parts[1] if len(parts) > 1 else "models"
            if target in RANKS or (ROOT / target).is_dir() or (ROOT / f"{target}.py").is_file():
                found.add((target, node.lineno))
            # else: ``from difftransformer import X`` names an export of the root package (a model class)
    return found


def violations() -> list[str]:
    problems = []
    for path in sorted(ROOT.rglob("*.py")):
        source = unit(path)
        if source not in RANKS:
            problems.append(f"{path.relative_to(ROOT)}: {source!r} has no rank in tests/test_architecture.py")
            continue
        for target, line in sorted(imported_units(path)):
            where = f"{path.relative_to(ROOT)}:{line} imports {target}"
            if target == source:
                continue
            if target not in RANKS:
                problems.append(f"{where}, which has no rank in tests/test_architecture.py")
                continue
            if source == "eval" and target not in EVAL_MAY_IMPORT:
                problems.append(f"{where}, which eval may not (only {', '.join(sorted(EVAL_MAY_IMPORT))})")
            elif RANKS[target] >= RANKS[source] and RANKS[source] < RANKS["bench"]:
                problems.append(f"{where}, not below {source}")
    return problems


def test_every_package_imports_only_packages_below_it():
    assert violations() == []


def test_the_checker_sees_a_violation(tmp_path, monkeypatch):
    """The check is not vacuous: an upward import (lazy, inside a function) and a relative one are caught."""
    fake = tmp_path / "difftransformer"
    (fake / "ops").mkdir(parents=True)
    (fake / "train").mkdir()
    (fake / "ops" / "kernel.py").write_text("def f():\n    from difftransformer.train import runner\n")
    (fake / "train" / "x.py").write_text("from ..compare import runs\nfrom . import presets\n")
    (fake / "storage.py").write_text("import os\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", fake)
    found = violations()
    assert any("ops/kernel.py:2 imports train" in p for p in found), found
    assert any("train/x.py:1 imports compare" in p for p in found), found
    assert len(found) == 2


@pytest.mark.parametrize("name", ["eval", "train", "compare", "data"])
def test_each_upper_package_has_modules(name):
    assert list((ROOT / name).glob("*.py")), name
