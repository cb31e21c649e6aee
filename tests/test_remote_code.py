"""Saved folders carry the model's code: they load and generate with trust_remote_code=True in a process where
difftransformer cannot be imported, and give the in-package model's logits and greedy continuations."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers.models.llama.modeling_llama
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

import difftransformer
from difftransformer import DiffTransformerForCausalLM
from difftransformer.data.tokenizer import train_tokenizer
from difftransformer.models import remote_code
from difftransformer.models.configuration import AUTO_MAP
from helpers import NO_PACKAGE, random_model
from kind_table import COMPOSITION_FIELDS, KIND_FIELDS

# every kind, and a composition whose windows bite on the short inputs
KINDS = {**KIND_FIELDS, "motif-window-3": COMPOSITION_FIELDS["motif-window-3"]}
PACKAGE_ROOT = Path(difftransformer.__file__).resolve().parents[1]

# Then every folder is loaded the way a user without the package would.
WITHOUT_PACKAGE = (
    NO_PACKAGE
    + r"""
import json
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

inputs = torch.load(os.path.join(work, "inputs.pt"))
report = {}
for kind in json.loads(sys.argv[3]):
    folder = os.path.join(work, kind)
    refusals = []
    for trust in (None, False):
        try:
            AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=trust)
        except ValueError as err:
            refusals.append(str(err))
        else:
            refusals.append("loaded without trust_remote_code")
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    base = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        logits = model(inputs["ids"]).logits
        generated = model.generate(
            inputs["prompt"], attention_mask=torch.ones_like(inputs["prompt"]), max_new_tokens=6, do_sample=False
        )
        hidden = base(inputs["ids"]).last_hidden_state
    # A folder saved again from the loaded copy carries the code too (transformers' own custom_object_save).
    model.save_pretrained(folder + "-again")
    again = AutoModelForCausalLM.from_pretrained(folder + "-again", trust_remote_code=True).eval()
    with torch.no_grad():
        logits_again = again(inputs["ids"]).logits
    report[kind] = dict(
        config=type(config).__module__,
        model=type(model).__module__,
        refusals=refusals,
        logits=logits,
        generated=generated,
        hidden=hidden,
        logits_again=logits_again,
    )
tokenizer = AutoTokenizer.from_pretrained(os.path.join(work, "diff"), trust_remote_code=True)
report["token_ids"] = tokenizer(inputs["text"])["input_ids"]
# A tokenizer folder alone (prepare's output, compare's tokenizer/) needs no flag at all.
alone = AutoTokenizer.from_pretrained(os.path.join(work, "tokenizer"))
report["token_ids_alone"] = alone(inputs["text"])["input_ids"]
torch.save(report, os.path.join(work, "report.pt"))
"""
)


def test_folders_load_and_generate_without_the_package(tmp_path):
    ids = torch.randint(0, 97, (2, 24))
    prompt = ids[:, :4]
    text = "to be or not to be"
    tokenizer = train_tokenizer(["to be or not to be, that is the question. " * 8], vocab_size=300)
    torch.save(dict(ids=ids, prompt=prompt, text=text), tmp_path / "inputs.pt")
    expected = {}
    for seed, (kind, fields) in enumerate(KINDS.items()):
        model = random_model(seed=seed, dtype=torch.float32, **fields)
        model.save_pretrained(tmp_path / kind)
        saved = json.loads((tmp_path / kind / "config.json").read_text())
        assert saved["auto_map"] == {
            "AutoConfig": "configuration_difftransformer.DiffTransformerConfig",
            "AutoModel": "modeling_difftransformer.DiffTransformerModel",
            "AutoModelForCausalLM": "modeling_difftransformer.DiffTransformerForCausalLM",
        }
        assert {path.name for path in (tmp_path / kind).glob("*.py")} == set(remote_code.model_code())
        with torch.no_grad():
            expected[kind] = dict(
                logits=model(ids).logits,
                generated=model.generate(
                    prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False
                ),
                hidden=model.model(ids).last_hidden_state,
            )
        # In a process that has the package, the folder still opens with the package's own classes.
        assert type(AutoModelForCausalLM.from_pretrained(tmp_path / kind)) is DiffTransformerForCausalLM
    tokenizer.save_pretrained(tmp_path / "diff")
    tokenizer.save_pretrained(tmp_path / "tokenizer")

    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PACKAGE, str(PACKAGE_ROOT), str(tmp_path), json.dumps(list(KINDS))],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = torch.load(tmp_path / "report.pt")
    for kind in KINDS:
        got, want = report[kind], expected[kind]
        assert got["model"].startswith("transformers_modules.") and got["config"].startswith(
            "transformers_modules."
        )
        for refusal in got["refusals"]:
            assert "trust_remote_code=True" in refusal, refusal
        torch.testing.assert_close(got["logits"], want["logits"], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(got["hidden"], want["hidden"], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(got["logits_again"], got["logits"], atol=0, rtol=0)
        assert torch.equal(got["generated"], want["generated"]), kind
    assert report["token_ids"] == report["token_ids_alone"] == tokenizer(text)["input_ids"]
    for word in ("kernel", "compil", "warn"):
        assert word not in done.stderr.lower(), done.stderr[-2000:]


def test_trainer_checkpoints_carry_the_code(tmp_path):
    model = random_model(seed=1, dtype=torch.float32)
    trainer = Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), report_to=[]))
    trainer.save_model(str(tmp_path / "run"))
    assert {path.name for path in (tmp_path / "run").glob("*.py")} == set(remote_code.model_code())
    for name, text in remote_code.model_code().items():
        assert (tmp_path / "run" / name).read_text() == text, name
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["auto_map"] == AUTO_MAP


def test_the_committed_model_code_is_what_the_sources_generate():
    """hub/ holds the files a saved folder carries, committed for readers, and the vLLM plugin a copy of them (its
    configuration and its strict check of a folder); make hub writes them again: they must be what the package's
    sources generate now."""
    hub = PACKAGE_ROOT.parent / "hub"
    assert {path.name for path in hub.glob("*.py")} == set(remote_code.model_code())
    stale = remote_code.stale_model_code(hub)
    assert stale == [], "the model sources changed: run `make hub` and commit hub/ and serving/vllm"
    plugin = PACKAGE_ROOT.parent / "serving" / "vllm" / "src" / "difftransformer_vllm"
    assert remote_code.stale_model_code(plugin) == [], "run `make hub` and commit serving/vllm"


def test_the_modeling_file_is_at_most_twice_llamas():
    """The modeling file holds the layers and model classes the model runs, as transformers' modeling_llama.py
    does (its operators and strict load beside it, as transformers keeps Llama's in its own modules): no more than
    twice the installed modeling_llama.py's lines."""
    llama = Path(transformers.models.llama.modeling_llama.__file__).read_text().count("\n")
    modeling = remote_code.model_code()[remote_code.MODELING_FILE].count("\n")
    assert modeling <= 2 * llama, (modeling, llama)


def test_regenerating_changes_nothing_and_both_files_carry_the_hash_of_the_pair(tmp_path, monkeypatch):
    random_model(seed=0, dtype=torch.float32).save_pretrained(tmp_path)
    code = remote_code.model_code()
    assert code == remote_code.model_code() and remote_code.stale_model_code(tmp_path) == []
    digest = remote_code.code_digest({name: text.split("\n", 1)[1] for name, text in code.items()})
    for name, text in code.items():
        assert f"model code {digest};" in text.splitlines()[0], name
    # An edited copy in a folder is reported; an edited package source changes both files' stamp.
    (tmp_path / remote_code.MODELING_FILE).write_text(code[remote_code.MODELING_FILE] + "# edited\n")
    (tmp_path / remote_code.CONFIGURATION_FILE).unlink()
    assert sorted(remote_code.stale_model_code(tmp_path)) == [
        remote_code.CONFIGURATION_FILE,
        remote_code.MODELING_FILE,
    ]
    load = remote_code._load

    def edited(name: str):
        module = load(name)
        if name.endswith(".layers.mlp"):
            source = module.source + "\n\nEDITED = 1\n"
            return dataclasses.replace(module, source=source, tree=ast.parse(source))
        return module

    monkeypatch.setattr(remote_code, "_load", edited)
    changed = remote_code.model_code()
    assert "\nEDITED = 1\n" in changed[remote_code.MODELING_FILE]
    assert all(digest not in text.splitlines()[0] for text in changed.values())


class WrappedModel(DiffTransformerForCausalLM):
    """What a wrapper does to the model's class (FSDP2's fully_shard makes a subclass in torch's own module)."""


def test_a_wrapper_subclass_leaves_only_our_code_in_the_folder(tmp_path):
    model = random_model(seed=2, dtype=torch.float32)
    model.__class__ = WrappedModel
    model.save_pretrained(tmp_path)
    assert {p.name for p in tmp_path.glob("*.py")} == set(remote_code.model_code())
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["auto_map"] == AUTO_MAP


def test_the_model_files_import_only_each_other_and_installed_packages():
    """Each file imports only the files before it (configuration, operators, loading, modeling) and installed
    packages; only the configuration and modeling files register Auto classes, exactly those config.json's auto_map
    names."""
    code = remote_code.model_code()
    order = [remote_code.CONFIGURATION_FILE, *(name for name, _, _ in remote_code.MODEL_FILES)]
    assert sorted(code) == sorted(order)
    registered = {}
    for name, text in code.items():
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert order.index(f"{node.module}.py") < order.index(name), (name, node.module)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert not any(module.partition(".")[0] == "difftransformer" for module in modules), name
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "register_for_auto_class":
                registered[node.args[0].value] = f"{name[:-3]}.{node.func.value.id}"
        compile(text, name, "exec")
    assert registered == AUTO_MAP
    # The package's own classes are not registered: the config's save writes the files instead of transformers
    # copying the package's modules.
    assert DiffTransformerForCausalLM._auto_class is None


def probe_package(root: Path, files: dict[str, str]) -> None:
    """A package ``probe`` under ``root`` with ``models/configuration.py``, ``models/modeling.py`` and the other
    given files (module path -> source)."""
    for relative, text in {"__init__.py": "", "models/__init__.py": "", **files}.items():
        path = root / "probe" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_unexportable_model_code_is_refused_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    for attribute, value in (
        ("PACKAGE", "probe"),
        ("CONFIGURATION_MODULE", "probe.models.configuration"),
        ("MODELING_MODULE", "probe.models.modeling"),
    ):
        monkeypatch.setattr(remote_code, attribute, value)
    config = "from probe.ops.names import STYLES\n\nclass DiffTransformerConfig:\n    styles = STYLES\n"
    cases = {
        "import probe.ops.helper\n": "import names from the module",
        "from .configuration import DiffTransformerConfig\n": "absolute imports",
        "def f():\n    from probe.ops.helper import VALUE\n": "package imports at the top",
        "from probe.ops.helper import VALUE\nVALUE = 2\n": "defines names another model module defines",
        "from probe.ops.helper import MISSING\n": "is not defined in the flat file",
    }
    for modeling, reason in cases.items():
        probe_package(
            tmp_path,
            {
                "models/configuration.py": config,
                "models/modeling.py": modeling,
                "ops/__init__.py": "",
                "ops/helper.py": "VALUE = 1\n",
                "ops/names.py": 'STYLES = ("a", "b")\n',
            },
        )
        for name in [name for name in sys.modules if name.partition(".")[0] == "probe"]:
            monkeypatch.delitem(sys.modules, name)
        with pytest.raises(remote_code.ExportError, match=reason):
            remote_code.model_code()
    probe_package(tmp_path, {"ops/names.py": "STYLES = object()\n", "models/modeling.py": ""})
    for name in [name for name in sys.modules if name.partition(".")[0] == "probe"]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(remote_code.ExportError, match="not a literal"):
        remote_code.model_code()
    for name in [name for name in sys.modules if name.partition(".")[0] == "probe"]:
        monkeypatch.delitem(sys.modules, name)


def test_package_only_modules_stay_out_of_the_flat_files():
    """The C++ kernels, the blocked CPU path and the code writer are the package's: no flat file holds their code,
    and each name the model modules import from them is None there, so the operators take their PyTorch paths."""
    code = remote_code.model_code()
    for module in remote_code.PACKAGE_ONLY:
        source = module.replace(".", "/") + ".py"
        assert all(f"# ---- {source} " not in text for text in code.values()), source
    assigned_none = {
        target.id
        for text in code.values()
        for node in ast.parse(text).body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value is None
        for target in node.targets
    }
    assert {
        "cpp_kernels",
        "diff_attention_blocked",
        "diff_attention_decode",
        "diff_attention_flex",
        "write_model_code",
    } <= assigned_none
    assert all("register_native_kernels" not in text for text in code.values())
    # The definitions only the package uses (the matching rules, say) are left out, and nothing else is: the flat
    # configuration still builds and resolves every kind.
    defined = {
        f"{node.name}.{item.name}" if item is not node else node.name
        for text in code.values()
        for node in ast.parse(text).body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
        for item in [node, *(node.body if isinstance(node, ast.ClassDef) else [])]
        if isinstance(item, (ast.FunctionDef, ast.ClassDef))
    }
    left_out = set().union(*remote_code.PACKAGE_ONLY_DEFINITIONS.values())
    assert "DiffTransformerConfig.matched_baseline" in left_out and not left_out & defined
    assert {"DiffTransformerConfig.check", "AttentionParts.renamings", "strict_from_pretrained"} <= defined


def test_a_flat_file_that_uses_a_package_only_definition_is_refused(monkeypatch):
    only = {
        **remote_code.PACKAGE_ONLY_DEFINITIONS,
        "difftransformer.layers.parts": frozenset({"AttentionParts.windowed"}),
    }
    monkeypatch.setattr(remote_code, "PACKAGE_ONLY_DEFINITIONS", only)
    with pytest.raises(remote_code.ExportError, match="AttentionParts.windowed, which only the package has"):
        remote_code.model_code()
    monkeypatch.setattr(
        remote_code, "PACKAGE_ONLY_DEFINITIONS", {"difftransformer.layers.parts": frozenset({"nope"})}
    )
    with pytest.raises(remote_code.ExportError, match="not defined here"):
        remote_code.model_code()
