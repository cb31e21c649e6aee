"""`difftransformer quantize`: every scheme on every kind writes a folder that loads strictly with the logits of the
model it quantized, leaves the declared modules in full precision, and computes each quantized layer as its stored
integers and scales do in float64; bad requests are refused before any work."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

import difftransformer  # noqa: F401  (registers the Auto classes)
from difftransformer.cli import main
from difftransformer.convert import quantize
from difftransformer.convert.folders import ConversionError, save_converted
from difftransformer.models import quantization
from difftransformer.models.loading import nonfinite_tensors
from helpers import random_model
from kind_table import KIND_FIELDS

pytestmark = pytest.mark.quant  # `make test-quant`: a venv with the quant extra

SCHEMES = tuple(quantization.SCHEMES)
# int4's groups of 32 inputs tile every layer of the table's models with a 64-wide MLP
WIDE_MLP = dict(intermediate_size=64)


def saved(tmp_path, kind: str, **fields):
    model = random_model(seed=3, dtype=torch.float32, **{**KIND_FIELDS[kind], **WIDE_MLP, **fields})
    model.save_pretrained(tmp_path / "source")
    return model, tmp_path / "source"


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("kind", list(KIND_FIELDS))
def test_every_scheme_writes_a_folder_that_loads_strictly_with_the_quantized_logits(tmp_path, kind, scheme):
    model, source = saved(tmp_path, kind)
    try:
        quantize.check_quantizable(model.config, quantization.SCHEMES[scheme])
    except ConversionError as refusal:  # int4's groups do not tile this kind's shapes at d_model 32
        assert scheme == "int4" and "quantizes in groups of 32 inputs" in str(refusal)
        return
    result = quantize.quantize_folder(source, quantization.SCHEMES[scheme])
    save_converted(result.model, source, tmp_path / "q", finish=result.finish)
    quantized = result.model
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "q")  # strict: names, shapes, finite values
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want, full = loaded(ids).logits, quantized(ids).logits, model(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.equal(got, full)  # the weights did change
    record = json.loads((tmp_path / "q" / quantize.QUANTIZATION_JSON).read_text())
    kept = quantization.full_precision_modules(model.config)
    assert record["scheme"] == scheme and "lm_head" in record["full_precision"]
    for name, module in loaded.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rpartition(".")[2] in kept:
            assert type(module.weight) is torch.nn.Parameter and module.weight.dtype == torch.float32, name
            torch.testing.assert_close(module.weight, model.get_submodule(name).weight, atol=0, rtol=0)
        if name.rpartition(".")[2] == "lambda_vectors":
            assert name in record["full_precision"]


def stored_weight(folder, name: str, scheme: str) -> torch.Tensor:
    """Layer ``name``'s weight dequantized in float64 from the integers and scales the folder stores."""
    with safe_open(str(folder / "model.safetensors"), framework="pt") as stored:
        if scheme == "w8a8":  # compressed-tensors: int8 weight, a scale per output channel, symmetric
            q, scale = stored.get_tensor(f"{name}.weight"), stored.get_tensor(f"{name}.weight_scale")
            assert q.dtype == torch.int8
            return q.double() * scale.double()
        # torchao: int8 values (int4's in [-8, 7]), a scale and zero point per row or per group of inputs
        q = stored.get_tensor(f"{name}._weight_qdata")
        scale = stored.get_tensor(f"{name}._weight_scale").double()
        zero = stored.get_tensor(f"{name}._weight_zero_point").double()
        assert q.dtype == torch.int8
        if scheme == "int4":
            assert q.min() >= -8 and q.max() <= 7
        group = q.shape[1] // scale.shape[1]
        return (q.double() - zero.repeat_interleave(group, 1)) * scale.repeat_interleave(group, 1)


def token_quantized(x: torch.Tensor) -> torch.Tensor:
    """W8A8's inputs: each token's values rounded to int8 steps of its largest magnitude over 127.5, in float32 as the
    layer computes the steps, dequantized in float64."""
    step = x.abs().amax(-1, keepdim=True) / 127.5
    return (x / step).round().clamp(-128, 127).double() * step.double()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_quantized_layer_computes_its_stored_integers_and_scales(tmp_path, scheme):
    _, source = saved(tmp_path, "diff_v2")
    assert main(["quantize", str(source), "--scheme", scheme, "--output-dir", str(tmp_path / "q")]) == 0
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "q")
    seen = {}
    names = [
        "model.layers.0.self_attn.q_proj",
        "model.layers.1.mlp.down_proj",
        "model.layers.2.self_attn.o_proj",
    ]

    def keep(name: str):
        def hook(module, args, out) -> None:
            seen[name] = (args[0].detach(), out.detach())

        return hook

    hooks = [loaded.get_submodule(name).register_forward_hook(keep(name)) for name in names]
    with torch.no_grad():
        loaded(torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1)))
    for hook in hooks:
        hook.remove()
    for name in names:
        x, out = seen[name]
        inputs = token_quantized(x) if scheme == "w8a8" else x.double()
        expected = inputs @ stored_weight(tmp_path / "q", name, scheme).T
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_a_quantized_weight_that_is_not_finite_is_found():
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    model = torch.nn.Sequential(torch.nn.Linear(32, 8, bias=False))
    quantize_(model, Int8WeightOnlyConfig())
    assert nonfinite_tensors(model.state_dict().items()) == []
    model[0].weight.scale[3] = float("nan")
    assert nonfinite_tensors(model.state_dict().items()) == ["0.weight"]


def test_bad_requests_are_refused_before_any_work(tmp_path, capsys, monkeypatch):
    _, source = saved(tmp_path, "softmax", intermediate_size=48)
    out = tmp_path / "q"
    assert main(["quantize", str(source), "--scheme", "int4", "--output-dir", str(out)]) == 2
    assert (
        "quantizes in groups of 32 inputs; model.layers.0.mlp.down_proj takes 48" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit, match="2"):
        main(["quantize", str(source), "--scheme", "fp8", "--output-dir", str(out)])
    assert "invalid choice: 'fp8' (choose from 'int8', 'int4', 'w8a8')" in capsys.readouterr().err
    assert main(["quantize", str(source), "--scheme", "int8", "--output-dir", str(source / "inside")]) == 2
    assert "outside the source folder" in capsys.readouterr().err
    assert main(["quantize", str(source), "--output-dir", str(out)]) == 2
    assert "--scheme is required: one of int8, int4, w8a8" in capsys.readouterr().err
    real = quantize.importlib.util.find_spec
    monkeypatch.setattr(
        quantize.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "compressed_tensors" else real(name, *args),
    )
    assert main(["quantize", str(source), "--scheme", "w8a8", "--output-dir", str(out)]) == 2
    assert "needs compressed-tensors, which is not installed: pip install 'difftransformer[quant]'" in (
        capsys.readouterr().err
    )
    assert not out.exists()
