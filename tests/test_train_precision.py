"""Mixed precision and activation memory: ``--bf16`` training on the CPU (one process and under FSDP) stays within
a stated tolerance of float32, and gradient checkpointing gives the gradients of a plain backward with every
attention backend that has one."""

from __future__ import annotations

import pytest
import torch

from difftransformer import DiffTransformerForCausalLM
from difftransformer.ops import BACKENDS
from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.runner import METRICS_CSV
from helpers import randomize, tiny_config
from test_train_fsdp import run_script, train_micro

# |loss(bf16) - loss(float32)| at every logged step of the micro run (4 steps at learning rate 3e-3); measured
# on this machine: <= 5e-4. docs/training.md states the same bound.
BF16_LOSS_TOLERANCE = 5e-3

# Backends without a backward on the CPU: FlexAttention is compiled for inference only there.
NO_BACKWARD = {"flex"}


def losses(output_dir, name="loss") -> list[float]:
    return column(read_metrics(output_dir / METRICS_CSV), name)[1]


def test_bf16_training_on_cpu_stays_close_to_float32(tmp_path):
    train_micro(tmp_path / "fp32", 8)
    train_micro(tmp_path / "bf16", 8, ["bf16"])
    assert len(losses(tmp_path / "bf16")) == 4
    assert losses(tmp_path / "bf16") == pytest.approx(losses(tmp_path / "fp32"), abs=BF16_LOSS_TOLERANCE)
    assert losses(tmp_path / "bf16") != losses(tmp_path / "fp32")  # bf16 really ran
    bf16_eval, fp32_eval = (losses(tmp_path / run, "eval_loss") for run in ("bf16", "fp32"))
    assert bf16_eval == pytest.approx(fp32_eval, abs=BF16_LOSS_TOLERANCE)


@pytest.mark.slow
def test_bf16_training_under_fsdp_stays_close_to_float32(tmp_path):
    train_micro(tmp_path / "fp32", 8)
    run_script(tmp_path, tmp_path / "bf16", 4, "fsdp", "bf16", processes=2)
    assert (tmp_path / "bf16" / "checkpoint-4" / "pytorch_model_fsdp.bin").is_file()
    assert losses(tmp_path / "bf16") == pytest.approx(losses(tmp_path / "fp32"), abs=BF16_LOSS_TOLERANCE)
    assert losses(tmp_path / "bf16") != losses(tmp_path / "fp32")


def gradients(model: DiffTransformerForCausalLM, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


# DIFF V1 by operator backend; the baseline and DIFF V2 by transformers' attention implementation.
CASES = [("diff", backend) for backend in BACKENDS] + [
    (kind, implementation) for kind in ("softmax", "diff_v2") for implementation in ("sdpa", "eager")
]


@pytest.mark.parametrize(("attention", "backend"), CASES)
def test_gradient_checkpointing_gives_the_same_gradients(attention, backend):
    heads = 2 if attention == "diff" else 4
    if attention == "diff":
        config = tiny_config(attention=attention, num_attention_heads=heads, attention_backend=backend)
    else:
        config = tiny_config(attention=attention, num_attention_heads=heads, attn_implementation=backend)
    model = randomize(DiffTransformerForCausalLM(config)).train()
    assert attention == "diff" or model.config._attn_implementation == backend
    ids = torch.randint(0, config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    if backend in NO_BACKWARD:
        with pytest.raises((RuntimeError, NotImplementedError, ValueError)):
            gradients(model, ids)
        return
    plain = gradients(model, ids)
    model.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing
    checkpointed = gradients(model, ids)
    assert plain.keys() == checkpointed.keys()
    for name, grad in plain.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-5, atol=1e-7, msg=name)
