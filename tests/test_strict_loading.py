"""Strict loading (models/loading.py, models/folders.py): a folder whose weights and config.json disagree, whose
weights are not finite, or which no longer matches the fingerprint its provenance.json recorded is refused in one
line by the package's classes, by the code the folder carries (trust_remote_code, without the package) and by the one
function every command opens folders with; what transformers intends (a base model and its head loading from each
other's folders, ignore_mismatched_sizes asked for, the loading report returned with output_loading_info=True) still
loads; a load that stands shows transformers' report, a refused one does not."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from transformers import AutoModel, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from difftransformer import DiffTransformerConfig, DiffTransformerForCausalLM, DiffTransformerModel
from difftransformer.errors import MissingInputError, UsageError
from difftransformer.models.folders import check_model_files, load_model_folder
from difftransformer.models.loading import (
    PROVENANCE_JSON,
    FolderMismatchError,
    folder_fingerprint,
    folder_problems,
    nonfinite_tensors,
)
from difftransformer.train.provenance import record_fingerprint
from helpers import random_model
from test_remote_code import NO_PACKAGE, PACKAGE_ROOT

# config.json edits and what the refusal says: the cases of issue 39 and one per kind of disagreement.
EDITS = {
    "one layer more": ({"num_hidden_layers": 3}, r"the weights lack 14 tensors the config asks for \(model\.layers\.2\.\*\)"),
    "one layer less": ({"num_hidden_layers": 1}, r"the weights hold 14 tensors the config has no place for \(model\.layers\.1\.\*\)"),
    "another vocabulary": ({"vocab_size": 400}, r"of another shape \(lm_head\.weight: \(97, 32\) saved, \(400, 32\) from the config"),
    "tied on paper only": ({"tie_word_embeddings": True}, "the config ties lm_head.weight to model.embed_tokens.weight"),
    "no per-head gain": ({"subln": "plain"}, r"no place for \(model\.layers\.\{0, 1\}\.self_attn\.subln\.weight\)"),
    "a per-token lambda": ({"lambda_mode": "token"}, r"lack 2 tensors .*lambda_proj\.weight"),
}  # fmt: skip


def edited(source: Path, folder: Path, fields: dict) -> Path:
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return folder


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("saved") / "diff"
    random_model(dtype=torch.float32, num_hidden_layers=2).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("edit", EDITS)
def test_a_folder_whose_weights_and_config_disagree_is_refused_in_one_line(edit, saved, tmp_path, caplog):
    fields, says = EDITS[edit]
    folder = edited(saved, tmp_path / "edited", fields)
    for load in (DiffTransformerForCausalLM.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with caplog.at_level(logging.WARNING), pytest.raises(FolderMismatchError, match=says) as refusal:
            load(folder)
        message = str(refusal.value)
        assert "\n" not in message and message.endswith(
            "Restore config.json to the values the weights were saved with"
        )
        assert "LOAD REPORT" not in caplog.text and "NOT tie" not in caplog.text  # the table is not shown
    with pytest.raises(
        UsageError, match=f"`init_from` '{folder}': cannot load the model: config.json and the"
    ):
        load_model_folder(folder, DiffTransformerForCausalLM, what="init_from")


def test_the_folders_own_code_refuses_them_too_without_the_package(saved, tmp_path):
    for edit, (fields, _) in EDITS.items():
        edited(saved, tmp_path / edit.replace(" ", "-"), fields)
    script = (
        NO_PACKAGE
        + r"""
import json
from transformers import AutoModelForCausalLM

outcome = {}
for name in sorted(os.listdir(work)):
    try:
        AutoModelForCausalLM.from_pretrained(os.path.join(work, name), trust_remote_code=True)
        outcome[name] = "loaded"
    except ValueError as err:
        outcome[name] = f"{type(err).__name__}: {err}"
print(json.dumps(outcome))
"""
    )
    shutil.copytree(saved, tmp_path / "as-saved")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", script, str(PACKAGE_ROOT), str(tmp_path)],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome.pop("as-saved") == "loaded"
    for edit, (_, says) in EDITS.items():
        found = outcome[edit.replace(" ", "-")]
        assert found.startswith("FolderMismatchError: config.json and the weights disagree"), (edit, found)
        assert re.search(says, found), (edit, found)
    assert "LOAD REPORT" not in done.stderr, done.stderr[-2000:]


def test_a_base_model_and_its_head_still_load_from_each_others_folders(saved, tmp_path, caplog):
    # transformers' intent: the head of a base model's folder is new, the head in a causal LM's folder unread; the
    # base model they share must still agree with its config, and the report of the head is shown
    with caplog.at_level(logging.WARNING):
        base = AutoModel.from_pretrained(saved)
    assert (
        type(base) is DiffTransformerModel and "lm_head.weight" in caplog.text and "UNEXPECTED" in caplog.text
    )
    base.save_pretrained(tmp_path / "base")
    head, info = DiffTransformerForCausalLM.from_pretrained(tmp_path / "base", output_loading_info=True)
    assert info["missing_keys"] == {"lm_head.weight"}
    torch.testing.assert_close(head.model.embed_tokens.weight, base.embed_tokens.weight, atol=0, rtol=0)
    with pytest.raises(FolderMismatchError, match=r"\(layers\.2\.\*\)"):
        AutoModel.from_pretrained(edited(saved, tmp_path / "deeper", {"num_hidden_layers": 3}))


def test_ignore_mismatched_sizes_still_draws_those_tensors_anew_when_asked(saved, tmp_path):
    folder = edited(saved, tmp_path / "wider", {"vocab_size": 400})
    model = DiffTransformerForCausalLM.from_pretrained(folder, ignore_mismatched_sizes=True)
    assert model.lm_head.weight.shape == (400, 32)
    # only shapes: a layer the weights lack is still refused
    with pytest.raises(FolderMismatchError, match="lack"):
        DiffTransformerForCausalLM.from_pretrained(
            edited(saved, tmp_path / "deeper", {"num_hidden_layers": 3}), ignore_mismatched_sizes=True
        )


def test_a_folder_that_agrees_loads_exactly_and_reports_its_loading_info_when_asked(saved):
    model, info = DiffTransformerForCausalLM.from_pretrained(saved, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    reference = random_model(dtype=torch.float32, num_hidden_layers=2)
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, atol=0, rtol=0, msg=name)


def test_any_model_class_opened_by_the_commands_is_held_to_its_config(tmp_path):
    # a Llama folder (convert --from-llama, eval of any causal LM) with one layer more on paper
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    assert type(load_model_folder(tmp_path / "llama")) is LlamaForCausalLM
    folder = edited(tmp_path / "llama", tmp_path / "deeper", {"num_hidden_layers": 3})
    with pytest.raises(UsageError, match=r"`source` .*: cannot load the model: .*model\.layers\.2\.\*"):
        load_model_folder(folder, LlamaForCausalLM, what="source")
    with pytest.raises(MissingInputError, match="`model` must be a saved model folder with a config.json"):
        load_model_folder(tmp_path / "nothing")


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_position_embeddings", 0), ("rms_norm_eps", 0.0), ("subln_eps", -1.0), ("lambda_std", "x"),
     ("lambda_std", float("nan")), ("initializer_range", -0.1), ("causal", "yes"), ("tie_word_embeddings", 1),
     ("eos_token_id", 97), ("pad_token_id", -1), ("bos_token_id", [0, 400]), ("lambda_init", float("inf"))],
)  # fmt: skip
def test_the_config_refuses_values_outside_the_models_bounds_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        DiffTransformerConfig(vocab_size=97, hidden_size=32, num_attention_heads=2, **{field: value})


def test_output_loading_info_returns_transformers_report_and_every_other_load_stays_strict(saved, tmp_path):
    # transformers' contract: a caller who asks for the loading report gets it, missing keys and all
    folder = edited(saved, tmp_path / "deeper", {"num_hidden_layers": 3})
    for load in (DiffTransformerForCausalLM.from_pretrained, AutoModelForCausalLM.from_pretrained):
        model, info = load(folder, output_loading_info=True)
        assert model.config.num_hidden_layers == 3
        assert {key for key in info["missing_keys"]} == {
            name for name in model.state_dict() if name.startswith("model.layers.2.")
        }
        assert len(info["missing_keys"]) == 14 and not info["unexpected_keys"]
        with pytest.raises(FolderMismatchError, match="lack 14 tensors"):
            load(folder)
    with pytest.raises(UsageError, match="cannot load the model: config.json and the weights disagree"):
        load_model_folder(folder, DiffTransformerForCausalLM)


def poisoned(source: Path, folder: Path, how: str) -> Path:
    """A copy of ``source`` whose weights hold a NaN in one q_proj (``nan``), an infinity in lm_head (``inf``) or
    4 KiB of 0xFF bytes (NaNs in float32) written over the start of the data region (``bytes``)."""
    shutil.copytree(source, folder)
    weights = folder / "model.safetensors"
    if how == "bytes":
        raw = bytearray(weights.read_bytes())
        start = 8 + int.from_bytes(raw[:8], "little")  # past the header: the first tensors' data
        raw[start : start + 4096] = b"\xff" * 4096
        weights.write_bytes(bytes(raw))
        return folder
    tensors = load_file(weights)
    name = "model.layers.1.self_attn.q_proj.weight" if how == "nan" else "lm_head.weight"
    tensors[name][0, 0] = float("nan") if how == "nan" else float("inf")
    save_file(tensors, weights, metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize(
    ("how", "says"),
    [("nan", r"1 tensor of the weights holds NaN or infinite values \(model\.layers\.1\.self_attn\.q_proj\.weight\)"),
     ("inf", r"1 tensor of the weights holds NaN or infinite values \(lm_head\.weight\)"),
     ("bytes", r"tensors? of the weights holds? NaN or infinite values \(")],
)  # fmt: skip
def test_weights_that_are_not_finite_are_refused_in_one_line_naming_them(saved, tmp_path, how, says):
    folder = poisoned(saved, tmp_path / how, how)
    for load in (DiffTransformerForCausalLM.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(FolderMismatchError, match=says) as refusal:
            load(folder)
        assert "\n" not in str(refusal.value)
    with pytest.raises(UsageError, match=f"`model` '{folder}': cannot load the model: .*{says}"):
        load_model_folder(folder, DiffTransformerForCausalLM)
    # the check on the files alone (train --resume, the vLLM plugin) finds the same tensors
    (problem,) = folder_problems(folder)
    assert re.search(says, problem), problem
    with pytest.raises(UsageError, match=f"`resume` '{folder}': cannot load the model: .*{says}"):
        check_model_files(folder, what="resume")
    # transformers' own load, asked for its report, is left to the caller
    model, _ = DiffTransformerForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not all(torch.isfinite(tensor).all() for tensor in model.state_dict().values())


def test_sharded_weights_and_quantized_ones_are_judged_by_their_values():
    """DTensor (FSDP2's and TP's shards) keeps torch's ``dequantize``, which has no sharding rule: it is judged as
    it is; a quantized weight (torchao's subclasses) by what its own ``dequantize`` gives."""
    poisoned = torch.tensor([[1.0, float("nan")]], dtype=torch.float64)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        shards = [
            ("w", distribute_tensor(poisoned, mesh, [Shard(0)])),
            ("b", distribute_tensor(torch.ones(2), mesh)),
        ]
        assert nonfinite_tensors(shards) == ["w"]
    finally:
        dist.destroy_process_group()

    class Quantized(torch.Tensor):
        def dequantize(self) -> torch.Tensor:
            return poisoned

    assert nonfinite_tensors([("q", torch.ones(1, 2).as_subclass(Quantized))]) == ["q"]


# Edits of config.json that keep every shape, each of which changes the logits.
SAME_SHAPES = {
    "rope_style": "half",
    "lambda_init": 0.5,
    "rms_norm_eps": 1e-2,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
    "causal": False,
}


@pytest.fixture(scope="module")
def fingerprinted(saved, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fingerprinted") / "diff"
    shutil.copytree(saved, folder)
    record_fingerprint(folder)
    return folder


@pytest.mark.parametrize("field", SAME_SHAPES)
def test_a_config_edit_that_keeps_the_shapes_is_refused_where_the_save_was_fingerprinted(
    field, saved, fingerprinted, tmp_path
):
    ids = torch.randint(0, 97, (1, 9))
    before = DiffTransformerForCausalLM.from_pretrained(fingerprinted)(ids).logits
    folder = edited(fingerprinted, tmp_path / "edited", {field: SAME_SHAPES[field]})
    says = (
        r"config\.json's model-defining fields changed since the model was saved \(provenance\.json records"
    )
    with pytest.raises(FolderMismatchError, match=says) as refusal:
        AutoModelForCausalLM.from_pretrained(folder)
    assert "\n" not in str(refusal.value)
    with pytest.raises(UsageError, match=f"`init_from` '{folder}': cannot load the model: {says}"):
        load_model_folder(folder, what="init_from")
    # the edit matters (the check is not a formality) and a folder without a fingerprint still loads as before
    unrecorded = edited(saved, tmp_path / "unrecorded", {field: SAME_SHAPES[field]})
    after = DiffTransformerForCausalLM.from_pretrained(unrecorded)(ids).logits
    assert (after - before).abs().max() > 1e-4


def test_a_fingerprinted_folder_loads_whatever_its_files_bookkeeping(fingerprinted, tmp_path):
    # key order, spacing and the fields that do not define the model (use_cache, dtype, the kernel choice) do not
    # count; the weights' bytes do
    folder = tmp_path / "rewritten"
    shutil.copytree(fingerprinted, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(use_cache=False, attention_backend="reference", transformers_version="5.0.0")
    (folder / "config.json").write_text(json.dumps(dict(reversed(config.items())), indent=1))
    assert folder_fingerprint(folder) == json.loads((folder / PROVENANCE_JSON).read_text())["saved"]
    assert load_model_folder(folder, DiffTransformerForCausalLM).config.use_cache is False
    tensors = load_file(folder / "model.safetensors")
    tensors["model.norm.weight"][0] += 1.0  # finite, the same shape: only the fingerprint sees it
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        FolderMismatchError, match=r"the weights \(\*\.safetensors\) changed since the model was"
    ):
        DiffTransformerForCausalLM.from_pretrained(folder)
    assert folder_problems(folder) and "weights" in folder_problems(folder)[0]


def test_the_vllm_plugin_carries_the_packages_model_code_unchanged():
    # the plugin's strict check of a folder before vLLM reads it is the package's from_pretrained, from this copy
    # (make hub writes it beside the configuration copy)
    plugin = PACKAGE_ROOT.parent / "serving" / "vllm" / "src" / "difftransformer_vllm"
    hub = PACKAGE_ROOT.parent / "hub"
    for name in ("configuration_difftransformer.py", "modeling_difftransformer.py"):
        assert (plugin / name).read_text() == (hub / name).read_text(), (
            f"{plugin / name} lags behind hub/: make hub copies both files there"
        )
