"""The evaluation tasks are siblings: no task module imports another, what they share lies below them, the paper's
numbers live in one module, and a package outside ours adds a task through an entry point."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from difftransformer.cli import main
from difftransformer.eval import registry
from difftransformer.eval.registry import TASKS
from difftransformer.eval.suite import SuiteSettings

EVAL = Path(__file__).resolve().parents[1] / "src" / "difftransformer" / "eval"
COMMANDS = ("cli", "harness_cli", "harness")  # the command modules, above every task


def eval_modules_imported(path: Path, root: Path) -> set[tuple[str, int]]:
    """(top-level module of difftransformer.eval, line) of every import of one in ``path``: absolute, relative
    (``from . import x``) and lazy ones, ``from difftransformer.eval import chance`` counting as eval.chance."""
    package = ["difftransformer", *path.parent.relative_to(root.parent).parts]  # the module's own package
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (package[: len(package) - node.level + 1] if node.level else []) + (
                node.module.split(".") if node.module else []
            )
            names = [".".join([*base, alias.name]) for alias in node.names] + [".".join(base)]
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["difftransformer", "eval"] and len(parts) > 2:
                found.add((parts[2], node.lineno))
    return found


def task_of(path: Path, root: Path) -> str | None:
    """The task a module belongs to (its module, or the package it lies in), None for a shared one."""
    first = path.relative_to(root).with_suffix("").parts[0]
    return first if first in TASKS else None


def sibling_imports(root: Path = EVAL) -> list[str]:
    """Every import of a task module by another task's module or by a shared module below the tasks."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        own = task_of(path, root)
        if own is None and path.stem in (*COMMANDS, "__init__") and path.parent == root:
            continue  # the commands and the package's exports sit above the tasks
        for target, line in sorted(eval_modules_imported(path, root)):
            if target in TASKS and target != own:
                who = f"task {own}" if own else "shared module"
                problems.append(f"{path.relative_to(root)}:{line} ({who}) imports the task {target}")
    return problems


def test_no_task_imports_another_and_shared_modules_import_none():
    assert sibling_imports() == []


def test_the_sibling_check_sees_an_import_of_another_task(tmp_path):
    root = tmp_path / "eval"
    (root / "hallucination").mkdir(parents=True)
    (root / "quant.py").write_text("def f():\n    from difftransformer.eval.mqar import run_mqar\n")
    (root / "hallucination" / "qa.py").write_text("from .. import needle\nfrom . import judges\n")
    (root / "maps.py").write_text("from difftransformer.eval import attention, options\n")
    (root / "attention.py").write_text("from difftransformer.eval import maps, paper\n")
    found = sibling_imports(root)
    assert found == [
        "hallucination/qa.py:1 (task hallucination) imports the task needle",
        "maps.py:1 (shared module) imports the task attention",
        "quant.py:2 (task quant) imports the task mqar",
    ]


def test_the_papers_numbers_live_in_one_module():
    """No task module states a number of the paper itself: its measures point to difftransformer.eval.paper."""
    for path in sorted(EVAL.rglob("*.py")):
        if task_of(path, EVAL) is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "paper":
                assert not isinstance(node.value, (ast.Constant, ast.JoinedStr)), f"{path.name}:{node.lineno}"
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                assert not any(n.startswith("PAPER") for n in names), f"{path.name}:{node.lineno}"


PLUGIN = """
import dataclasses
from pathlib import Path

from difftransformer.eval.options import option
from difftransformer.eval.task import Chart, Column, Panel, Task
from difftransformer.storage import write_json


@dataclasses.dataclass(frozen=True)
class CountOptions:
    tokens: int = option(3, "tokens to count")


class CountTask(Task):
    name = "count"
    title = "Counting (count)"
    help = "counts the tokens it was given"
    reads_text = False
    needs_tokenizer = False
    Options = CountOptions
    light = CountOptions()

    def light_options(self, light, suite):
        return light

    def run(self, model, tokenizer, texts, options, output_dir: Path, progress: bool) -> dict:
        results = {"task": "count", "tokens": options.tokens, "vocab": model.config.vocab_size}
        write_json(Path(output_dir) / "count.json", results)
        return results

    def summarise(self, results):
        return {"tokens": results["tokens"]}

    def columns(self, summary):
        return [Column("tokens", summary["tokens"], 0)]

    def describe(self, options):
        return "Counts."

    def chart(self, summary):
        return Chart("bars", "count", [Panel("tokens", ["tokens"])])


TASK = CountTask()
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """An installed distribution outside ours that registers the task ``count`` by an entry point."""
    (tmp_path / "countplugin").mkdir()
    (tmp_path / "countplugin" / "__init__.py").write_text(PLUGIN)
    info = tmp_path / "countplugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: countplugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\ncount = countplugin:TASK\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.plugin_tasks.cache_clear()
    yield
    registry.plugin_tasks.cache_clear()


def test_a_package_outside_ours_adds_a_task_by_entry_point(plugin):
    assert registry.task_names() == (*TASKS, "count")
    task = registry.get_task("count")
    assert task.name == "count" and dataclasses.fields(task.Options)[0].name == "tokens"
    assert registry.parse_tasks("count,mqar") == ("mqar", "count")
    with pytest.raises(
        ValueError, match="`tasks` must be distinct comma-separated names from needle, .*, count"
    ):
        registry.parse_tasks("counts")
    assert SuiteSettings(tasks=("count",), light={"count": {"tokens": 5}}).light_settings("count").tokens == 5


def test_the_eval_command_runs_a_task_a_plugin_registers(plugin, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(model_dir)  # fmt: skip
    out = tmp_path / "out"
    argv = [
        "eval",
        "count",
        "--model",
        str(model_dir),
        "--output-dir",
        str(out),
        "--tokens",
        "7",
        "--no-progress",
    ]
    assert main(argv) == 0
    results = json.loads((out / "count.json").read_text())
    assert (results["task"], results["tokens"], results["vocab"]) == ("count", 7, 64)


def test_a_plugin_cannot_take_a_built_in_name_or_be_no_task(plugin, tmp_path):
    info = tmp_path / "countplugin-0.1.dist-info" / "entry_points.txt"
    info.write_text(f"[{registry.ENTRY_POINT_GROUP}]\nmqar = countplugin:TASK\n")
    registry.plugin_tasks.cache_clear()
    with pytest.raises(RuntimeError, match=r"take the built-in task names \['mqar'\]"):
        registry.task_names()
    info.write_text(f"[{registry.ENTRY_POINT_GROUP}]\ncount = countplugin:CountOptions\n")
    registry.plugin_tasks.cache_clear()
    with pytest.raises(TypeError, match="is a type, not a difftransformer.eval.task.Task"):
        registry.get_task("count")
