"""``difftransformer plan``: parameter counts against real models, the activation estimate against a measured
forward, and the memory arithmetic's response to world size, sharding, bf16 and checkpointing."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from difftransformer import DiffTransformerConfig, DiffTransformerForCausalLM
from difftransformer.cli import main
from difftransformer.models import KINDS, training_flops
from difftransformer.train import plan as plan_module
from difftransformer.train.plan import (
    ADAMW_STATE_BYTES,
    FLOAT32_BYTES,
    ParallelSetup,
    activation_bytes,
    activation_rates,
    count_parameters,
    ddp_memory,
    fsdp_memory,
    make_plan,
    saved_bytes,
)
from difftransformer.train.presets import get_preset


def small_config(attention: str, **fields) -> DiffTransformerConfig:
    values = dict(
        vocab_size=211, hidden_size=48, intermediate_size=72, num_hidden_layers=3, num_attention_heads=2,
        attention=attention,
    )  # fmt: skip
    values.update(fields)
    return DiffTransformerConfig(**values)


@pytest.mark.parametrize(
    "fields",
    [
        dict(attention="diff"),
        dict(attention="diff", num_attention_heads=4, num_key_value_heads=2),
        dict(attention="softmax", tie_word_embeddings=True),
        dict(attention="diff_v2", num_attention_heads=4),
        dict(attention="diff", subln="none"),
        dict(attention="gda", num_attention_heads=3, gda_ratio=3, num_key_value_heads=1),
        dict(attention="gda", num_attention_heads=4, gda_ratio=4, num_key_value_heads=1, map_dim=10),
        dict(attention="gated", num_attention_heads=4, num_key_value_heads=2),
    ],
)
def test_meta_count_equals_a_real_model(fields):
    config = small_config(**fields)
    counts = count_parameters(config)
    model = DiffTransformerForCausalLM(config)
    assert counts.total == sum(p.numel() for p in model.parameters())
    assert counts.per_layer == sum(p.numel() for p in model.model.layers[1].parameters())
    assert counts.outside_layers == counts.total - 3 * counts.per_layer
    assert counts.in_linear == sum(
        m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)
    )


def test_baseline_count_follows_the_llama_formula():
    config = small_config("softmax", num_attention_heads=4)
    h, f, v, layers = (
        config.hidden_size,
        config.intermediate_size,
        config.vocab_size,
        config.num_hidden_layers,
    )
    assert count_parameters(config).total == 2 * v * h + layers * (4 * h * h + 3 * h * f + 2 * h) + h


@pytest.mark.parametrize(
    "attention, fields",
    [
        ("diff", {}),
        ("softmax", {}),
        ("diff_v2", {}),
        ("gated", {}),
        ("gda", dict(gda_ratio=2, num_key_value_heads=2)),
        ("gda", dict(gda_ratio=4, num_key_value_heads=1, map_dim=12)),
    ],
)
@pytest.mark.parametrize("bf16", [False, True])
def test_extrapolated_activations_match_a_measured_forward(attention, fields, bf16):
    """The rates come from narrow copies; a model of other widths and depth keeps what they predict."""
    config = small_config(attention, hidden_size=96, intermediate_size=200, num_attention_heads=4, **fields)
    rates = activation_rates(config, bf16=bf16)
    tokens = 96
    backend = "sdpa" if config.differential_heads else "auto"  # the others take transformers' sdpa
    measured = saved_bytes(dataclasses.replace(config, attention_backend=backend), tokens, bf16=bf16)
    predicted = activation_bytes(rates, config.num_hidden_layers, tokens, gradient_checkpointing=False)
    assert predicted == pytest.approx(measured, rel=2e-3)


def test_saved_bytes_grow_with_tokens_and_width():
    config = dataclasses.replace(small_config("diff"), attention_backend="sdpa")
    assert saved_bytes(config, 128, bf16=False) > 1.9 * saved_bytes(config, 64, bf16=False)
    wider = dataclasses.replace(config, intermediate_size=4 * config.intermediate_size)
    assert saved_bytes(wider, 64, bf16=False) > saved_bytes(config, 64, bf16=False)
    assert saved_bytes(config, 64, bf16=True) < 0.8 * saved_bytes(config, 64, bf16=False)


@pytest.fixture(scope="module")
def parts():
    config = small_config("diff", num_hidden_layers=6)
    return count_parameters(config), activation_rates(config, bf16=False), config.num_hidden_layers


def test_fsdp_divides_the_sharded_state_by_the_world_size(parts):
    counts, rates, layers = parts
    one = fsdp_memory(counts, rates, ParallelSetup(world_size=1), layers, 512)
    four = fsdp_memory(counts, rates, ParallelSetup(world_size=4), layers, 512)
    shard = math.ceil(counts.total / 4)
    assert four.optimizer_state == ADAMW_STATE_BYTES * shard
    assert one.optimizer_state == ADAMW_STATE_BYTES * counts.total
    # weights and gradients: the float32 shard plus gathered copies that do not depend on the world size
    assert one.weights - four.weights == FLOAT32_BYTES * (counts.total - shard)
    assert one.gradients - four.gradients == FLOAT32_BYTES * (counts.total - shard)
    assert four.activations == one.activations
    ddp_one = ddp_memory(counts, rates, ParallelSetup(world_size=1), layers, 512)
    ddp_four = ddp_memory(counts, rates, ParallelSetup(world_size=4), layers, 512)
    assert ddp_four.weights == ddp_one.weights == FLOAT32_BYTES * counts.total
    assert ddp_four.optimizer_state == ddp_one.optimizer_state
    assert ddp_four.gradients == 2 * ddp_one.gradients  # DDP's buckets
    assert four.total < ddp_four.total


def test_sharding_options_move_memory_as_fsdp_does(parts):
    counts, rates, layers = parts
    full = fsdp_memory(counts, rates, ParallelSetup(world_size=4), layers, 512)
    grad_op = fsdp_memory(counts, rates, ParallelSetup(world_size=4, fsdp=("shard_grad_op",)), layers, 512)
    offload = fsdp_memory(
        counts, rates, ParallelSetup(world_size=4, fsdp=("full_shard", "offload")), layers, 512
    )
    assert grad_op.weights - full.weights == FLOAT32_BYTES * (layers - 2) * counts.per_layer
    assert offload.optimizer_state == 0
    assert offload.weights == full.weights - FLOAT32_BYTES * math.ceil(counts.total / 4)


def test_bf16_halves_gathered_copies_and_adds_autocast_copies_under_ddp(parts):
    counts, rates, layers = parts
    fp32 = ParallelSetup(world_size=2)
    bf16 = ParallelSetup(world_size=2, bf16=True)
    shard = FLOAT32_BYTES * math.ceil(counts.total / 2)
    fsdp32, fsdp16 = (fsdp_memory(counts, rates, s, layers, 512) for s in (fp32, bf16))
    assert fsdp16.weights - shard == (fsdp32.weights - shard) // 2
    ddp32, ddp16 = (ddp_memory(counts, rates, s, layers, 512) for s in (fp32, bf16))
    assert ddp16.weights - ddp32.weights == 2 * counts.in_linear  # autocast's bfloat16 copies
    assert ddp16.optimizer_state == ddp32.optimizer_state  # float32 masters either way


def test_bf16_and_checkpointing_shrink_activations(parts):
    counts, _, layers = parts
    config = small_config("diff", num_hidden_layers=layers)
    fp32, bf16 = activation_rates(config, bf16=False), activation_rates(config, bf16=True)
    tokens = 1024
    full = activation_bytes(fp32, layers, tokens, gradient_checkpointing=False)
    assert activation_bytes(bf16, layers, tokens, gradient_checkpointing=False) < 0.8 * full
    checkpointed = activation_bytes(fp32, layers, tokens, gradient_checkpointing=True)
    assert checkpointed == math.ceil(
        tokens * (layers * fp32.layer_input + fp32.per_layer + fp32.outside_layers)
    )
    assert checkpointed < full / 2


def test_plan_uses_the_preset_batch_and_world_size():
    preset = get_preset("micro")
    plan = make_plan(preset, ParallelSetup(world_size=3), kinds=("diff",))
    batch, accumulation = (
        preset.training[k] for k in ("per_device_train_batch_size", "gradient_accumulation_steps")
    )
    assert plan.tokens_per_device == preset.block_size * batch
    assert plan.tokens_per_step == 3 * preset.block_size * batch * accumulation
    assert plan.kinds[0].counts.total == sum(
        p.numel() for p in DiffTransformerForCausalLM(preset.model_config("diff")).parameters()
    )


def test_a_run_is_cut_into_stretches_of_its_row_lengths():
    def stretches(preset):
        return preset.recall.stretches(0, preset.training["max_steps"], preset.block_size)

    long = get_preset("retrieval-long")  # 64-token rows until step 4,500 of 5,100, then 256
    assert long.length_schedule == ((0, 64), (4500, 256)) and long.training["max_steps"] == 5100
    assert stretches(long) == ((4500, 64), (600, 256))
    # Cut before the later length is reached: one stretch.
    assert stretches(long.with_training(max_steps=3000)) == ((3000, 64),)
    assert stretches(long.with_training(max_steps=4501)) == ((4500, 64), (1, 256))
    micro = get_preset("micro")
    assert stretches(micro) == ((micro.training["max_steps"], micro.block_size),)


def test_the_memory_table_keeps_each_title_over_its_column(capsys):
    assert main(["plan", "--preset", "retrieval-long"]) == 0
    lines = capsys.readouterr().out.split("memory per device")[1].splitlines()[1:7]
    header, rows = lines[0], lines[1:]
    ends = [found.end() for found in re.finditer(r"\S+ (?:DDP|FSDP)", header)]
    assert len(ends) == 4
    for row in rows:
        assert [found.end() for found in re.finditer(r"\d+\.\d\d", row)] == ends, (header, row)


def test_bad_setups_are_refused():
    with pytest.raises(ValueError, match="world_size"):
        ParallelSetup(world_size=0)
    with pytest.raises(ValueError, match="hybrid_shard"):
        ParallelSetup(fsdp=("hybrid_shard",))


def test_plan_command_prints_counts_and_memory(capsys):
    assert (
        main(["plan", "--preset", "13.1b", "--world-size", "8", "--fsdp", "full_shard auto_wrap", "--bf16"])
        == 0
    )
    out = capsys.readouterr().out
    total = count_parameters(get_preset("13.1b").model_config("diff")).total
    assert f"{total:,}" in out
    assert "2,097,152" in out  # 2048 tokens x 8 blocks x 16 accumulated x 8 processes
    assert "--gradient-accumulation-steps 2" in out
    for row in ("weights", "gradients", "optimizer state", "activations", "total"):
        assert row in out


@pytest.mark.parametrize(
    "flags, message",
    [
        # What train would refuse, the plan refuses (transformers' own check of the FSDP words included).
        (["--fsdp", "hybrid_shard"], "hybrid_shard"),
        (["--per_device_train_batch_size", "0"], "--per-device-train-batch-size must be >= 1; got 0"),
        (["--block_size", "0"], "--block-size must be at least 2; got 0"),
        (["--gradient_accumulation_steps", "0"], "--gradient-accumulation-steps must be >= 1; got 0"),
        (["--bf16", "true", "--fp16", "true"], "At most one of fp16 and bf16"),
        (["--world-size", "0"], "--world-size must be a positive integer; got 0"),
        (["--time-steps", "-1"], "--time-steps must be >= 0; got -1"),
        (["--threads", "0"], "--threads must be >= 1; got 0"),
        (["--time-steps", "2", "--world-size", "2"], "--time-steps times one process"),
    ],
)
def test_plan_command_refuses_bad_input(flags, message, capsys):
    capsys.readouterr()
    assert main(["plan", "--preset", "micro", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("difftransformer plan: error: ") and message in err and len(err.splitlines()) == 1


def test_plan_says_which_optimizer_it_does_not_model(capsys):
    assert main(["plan", "--preset", "micro", "--optim", "adafactor"]) == 0
    assert "--optim adafactor is not modelled" in capsys.readouterr().out
    assert main(["plan", "--preset", "micro", "--optim", "adamw_torch_fused"]) == 0
    assert "not modelled" not in capsys.readouterr().out


def test_plan_times_each_models_steps_on_this_machine(capsys):
    assert (
        main(["plan", "--preset", "micro", "--time-steps", "2", "--threads", "1", "--max-steps", "6000"]) == 0
    )
    out = capsys.readouterr().out
    assert "training time of one run on this machine (6,000 steps, 1 threads, timed over 2 steps" in out
    lines = out.split("training time of one run")[1].splitlines()[1 : 1 + len(KINDS)]
    names = []
    for line in lines:
        found = re.fullmatch(r"  (\S+(?: \S+)?) +([0-9.]+) min  \(([0-9.]+) s a step\)", line)
        assert found and float(found[2]) > 0, line
        assert float(found[3]) * 6000 / 60 == pytest.approx(float(found[2]), abs=0.06)
        names.append(found[1])
    assert names == [kind.label for kind in KINDS.values()]
    assert len({line.index(" min") for line in lines}) == 1  # one column


def test_plan_times_each_stretch_of_a_length_schedule_at_its_row_length(capsys, monkeypatch):
    timed = []

    def fake_step_seconds(config, batch, block_size, steps, threads):
        timed.append((config.attention, batch, block_size, steps, threads))
        return block_size / 1000  # a step's seconds stand for its row length: each stretch must use its own

    monkeypatch.setattr(plan_module, "step_seconds", fake_step_seconds)
    flags = ["--preset", "micro", "--needle-fraction", "0", "--length-schedule", "0:16,1000:256",
             "--max-steps", "3000"]  # fmt: skip
    assert main(["plan", *flags, "--time-steps", "2", "--threads", "1"]) == 0
    batch = get_preset("micro").training["per_device_train_batch_size"]
    assert sorted({call[1:] for call in timed}) == [(batch, 16, 2, 1), (batch, 256, 2, 1)]
    lines = capsys.readouterr().out.split("training time of one run")[1].splitlines()[1:6]
    for line in lines:
        assert line.endswith(
            f"{(1000 * 0.016 + 2000 * 0.256) / 60:.1f} min  "
            "(1,000 steps of 16-token rows at 0.016 s, 2,000 steps of 256-token rows at 0.256 s)"
        ), line


def test_plan_takes_compositions_and_counts_their_training_flops(capsys):
    """--kinds takes compare's spelling; each model's FLOPs a token come from its shapes (models/flops.py), beside
    the Transformer's, and a run's from its steps."""
    assert (
        main(["plan", "--preset", "micro", "--kinds", "softmax,motif(output_gate=none),diff_v2(gda_ratio=2)"])
        == 0
    )
    out = capsys.readouterr().out
    preset = get_preset("micro")
    flops = {
        label: training_flops(preset.model_config(kind, **fields), preset.block_size).total
        for label, kind, fields in (
            ("Transformer", "softmax", {}),
            ("Motif (output_gate=none)", "motif", dict(output_gate="none")),
            ("DIFF V2 (gda_ratio=2)", "diff_v2", dict(gda_ratio=2)),
        )
    }
    compute = out.split("training compute")[1]
    for label, value in flops.items():
        found = re.search(rf"  {re.escape(label)} +([0-9,]+)  \(([0-9.]+)x\)   a run: ([0-9.e+]+)", compute)
        assert found, label
        assert int(found[1].replace(",", "")) == round(value)
        assert float(found[2]) == pytest.approx(value / flops["Transformer"], abs=5e-4)
        steps, rows = preset.training.max_steps, preset.training.per_device_train_batch_size
        assert float(found[3]) == pytest.approx(steps * rows * preset.block_size * value, rel=1e-3)
    assert main(["plan", "--preset", "micro", "--kinds", "softmax,foo(bar=1)"]) == 2
    assert "a model is KIND or KIND(FIELD=VALUE,...)" in capsys.readouterr().err
