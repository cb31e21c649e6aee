"""The lowbit task with the quant extra: its in-memory weight schemes compute what the folders of
``difftransformer quantize`` compute, and every quantizer (hqq caches, torchao and compressed-tensors weights) runs
on every kind whose shapes it takes."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from difftransformer.convert import quantize
from difftransformer.convert.folders import save_converted
from difftransformer.eval import lowbit
from difftransformer.models import quantization
from helpers import random_model
from kind_table import KIND_FIELDS

pytestmark = pytest.mark.quant  # `make test-quant`: a venv with the quant extra

# d_model 64 and a 64-wide MLP: int4's groups of 32 inputs tile every layer
WIDE = dict(hidden_size=64, intermediate_size=64)


@pytest.mark.parametrize("scheme", list(quantization.SCHEMES))
@pytest.mark.parametrize("kind", ["diff", "diff_v2", "softmax"])
def test_the_in_memory_schemes_compute_the_quantized_folders_logits(tmp_path, kind, scheme):
    model = random_model(seed=3, dtype=torch.float32, **{**KIND_FIELDS[kind], **WIDE})
    model.save_pretrained(tmp_path / "source")
    written = quantize.quantize_folder(tmp_path / "source", quantization.SCHEMES[scheme])
    save_converted(written.model, tmp_path / "source", tmp_path / "q", finish=written.finish)
    in_memory = copy.deepcopy(model)
    kept = quantization.quantize_weights(in_memory, quantization.SCHEMES[scheme])
    assert kept == quantization.full_precision_modules(model.config)
    ids = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = in_memory(ids).logits
        want = AutoModelForCausalLM.from_pretrained(tmp_path / "q")(ids).logits
        full = model(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.equal(got, full)


@pytest.mark.parametrize("kind", ["diff", "gda", "diff_v2", "gated", "softmax"])
def test_every_quantizer_runs_and_leaves_the_model_it_measures_unchanged(kind):
    model = random_model(seed=4, dtype=torch.float32, **{**KIND_FIELDS[kind], **WIDE})
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    ids = torch.randint(0, 97, (3 * 40,), generator=torch.Generator().manual_seed(5)).tolist()
    options = lowbit.LowbitOptions(length=40, num_sequences=3, continuation=12, q_group_size=16, mqar_pairs=3)
    results = lowbit.run_lowbit(model, None, ids, options, progress=False)
    assert results["kv_caches"] == list(lowbit.KV_CACHES) and results["weights"] == list(quantization.SCHEMES)
    full, *rows = results["rows"]
    assert [row["quantizer"] for row in rows] == [f"kv {n}" for n in lowbit.KV_CACHES] + [
        f"weights {n}" for n in quantization.SCHEMES
    ]
    for row in rows:
        assert math.isfinite(row["loss"]) and row["loss"] != full["loss"], row["quantizer"]
        assert len(row["mqar_accuracies"]) == lowbit.MQAR_SEQUENCES
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
