"""``difftransformer plan``: what a training run of a preset needs, printed before it starts.

Options: ``--world-size``, then ``train``'s preset and training options (``--output-dir`` excepted). The estimate
itself (parameter counts, memory per device under DDP and FSDP, tokens per step) is
:mod:`difftransformer.train.plan`; this module reads the command line into its :class:`~.plan.ParallelSetup` and
prints the :class:`~.plan.Plan`.
"""

from __future__ import annotations

import argparse

from transformers.trainer_utils import FSDPOption

from difftransformer.errors import UsageError
from difftransformer.flags import add_flags, given
from difftransformer.train.cli import checked_training_settings, resolved_preset, training_options
from difftransformer.train.plan import GIB, ParallelSetup, Plan, PlannedModels, StepTiming, make_plan
from difftransformer.train.presets import PRESETS, RECIPE
from difftransformer.train.settings import PresetOptions, TrainingSettings


def format_plan(plan: Plan) -> str:
    """The plan as the ``plan`` command prints it."""
    preset, setup = plan.preset, plan.setup
    batch = preset.training.per_device_train_batch_size
    accumulation = preset.training.gradient_accumulation_steps
    lines = [
        f"preset {preset.name}: {preset.description}",
        f"tokens per optimizer step: {preset.block_size} x {batch} blocks x {accumulation} accumulated x "
        f"{setup.world_size} processes = {plan.tokens_per_step:,}",
        "",
        "parameters:",
    ]
    width = max(15, *(len(kind.label) for kind in plan.kinds))
    for kind in plan.kinds:
        config = kind.config
        lines.append(
            f"  {kind.label:<{width}} {kind.counts.total:>15,}  ({config.num_attention_heads} heads, "
            f"{kind.counts.per_layer:,} per layer, {kind.counts.outside_layers:,} in embeddings, norm and head)"
        )
    baseline = next((k for k in plan.kinds if k.kind == "softmax"), None)
    lines += [
        "",
        f"training compute (FLOPs a token, forward and backward, at {preset.block_size}-token rows, counted from each "
        "model's shapes; the run's FLOPs at its steps" + ("; x the Transformer's" if baseline else "") + "):",
    ]
    for kind in plan.kinds:
        ratio = f"  ({kind.flops_per_token / baseline.flops_per_token:.3f}x)" if baseline else ""
        lines.append(
            f"  {kind.label:<{width}} {kind.flops_per_token:>15,.0f}{ratio}   a run: {kind.run_flops:.3e}"
        )
    precision = "bf16 mixed precision" if setup.bf16 else "float32"
    checkpointing = "gradient checkpointing" if setup.gradient_checkpointing else "no gradient checkpointing"
    lines += [
        "",
        f"memory per device, GiB ({setup.world_size} processes, {precision}, {checkpointing}, AdamW, micro-batch "
        f"{batch} x {preset.block_size} tokens; FSDP: {' '.join(setup.fsdp)}):",
    ]
    shown = [k for k in plan.kinds if k.kind in ("diff", "softmax")] or list(plan.kinds[:2])
    titles = [f"{k.label} {engine}" for k in shown for engine in ("DDP", "FSDP")]
    column = max(16, *(len(title) + 2 for title in titles))
    lines.append(f"  {'':<16}" + "".join(f"{title:>{column}}" for title in titles))
    for label in ("weights", "gradients", "optimizer_state", "activations", "total"):
        cells = "".join(
            f"{getattr(getattr(k, engine), label) / GIB:>{column}.2f}"
            for k in shown
            for engine in ("ddp", "fsdp")
        )
        lines.append(f"  {label.replace('_', ' '):<16}{cells}")
    if not setup.bf16:
        lines.append(
            "  (train turns --bf16 on by itself on a GPU that supports it: add --bf16 to plan for that)"
        )
    timed = [k for k in plan.kinds if k.timed]
    if timed:
        steps = preset.training.max_steps
        threads = plan.timing.threads or "torch's default"
        lines += ["", f"training time of one run on this machine ({steps:,} steps, {threads} threads, timed over "
                  f"{plan.timing.time_steps} steps; evaluation and start-up not included):"]  # fmt: skip
        width = max(len(kind.label) for kind in timed)
        for kind in timed:
            if len(kind.timed) == 1:
                stretches = f"{kind.timed[0].seconds:.3f} s a step"
            else:  # a length schedule: each stretch of row lengths timed apart
                stretches = ", ".join(
                    f"{stretch.steps:,} steps of {stretch.tokens}-token rows at {stretch.seconds:.3f} s"
                    for stretch in kind.timed
                )
            lines.append(f"  {kind.label:<{width}} {kind.training_seconds / 60:>10.1f} min  ({stretches})")
    if setup.world_size > 1 and accumulation % setup.world_size == 0:
        lines.append(
            f"batch flags are per process: --gradient-accumulation-steps {accumulation // setup.world_size} keeps "
            f"the preset's {plan.tokens_per_step // setup.world_size:,} tokens per step on {setup.world_size} processes"
        )
    return "\n".join(lines)


# ParallelSetup's fields that the training options of the same names set.
FROM_TRAINING = frozenset({"fsdp", "bf16", "gradient_checkpointing"})


def configure(parser: argparse.ArgumentParser) -> None:
    """``plan``'s options: the world size, then ``train``'s preset and training options (output dir excepted)."""
    parser.epilog = "presets: " + ", ".join(PRESETS)
    add_flags(parser, ParallelSetup, exclude=FROM_TRAINING, only_given=True)
    add_flags(parser, PlannedModels)
    add_flags(parser, StepTiming)
    add_flags(parser, PresetOptions)
    add_flags(parser, TrainingSettings, preset_fields=frozenset(RECIPE), exclude=frozenset({"output_dir"}))


def parallel_setup(args: argparse.Namespace) -> ParallelSetup:
    """The :class:`ParallelSetup` of a command line (``--fsdp`` bare or absent: full_shard)."""
    options = given(vars(args), TrainingSettings)
    fsdp = options.get("fsdp")
    words = tuple(fsdp.split()) if isinstance(fsdp, str) else (FSDPOption.FULL_SHARD.value,)
    checkpointing = options.get("activation_checkpointing") or options.get("gradient_checkpointing")
    return ParallelSetup(
        **{
            name: value
            for name, value in given(vars(args), ParallelSetup).items()
            if name not in FROM_TRAINING
        },
        fsdp=words,
        bf16=bool(options.get("bf16")),
        gradient_checkpointing=bool(checkpointing),
    )


def run(args: argparse.Namespace) -> int:
    """Check the options as ``train`` does (a batch, block size or accumulation of 0, --bf16 with --fp16 are
    refused), print the plan, and a note when the optimizer is not the AdamW the estimate models."""
    preset = resolved_preset(args)
    # The run's TrainingArguments, built to check them as train would; "plan" is a placeholder folder, never made.
    checked_training_settings(preset, output_dir="plan", **training_options(args))
    timing = StepTiming(**given(vars(args), StepTiming))
    if timing.time_steps and parallel_setup(args).world_size > 1:
        raise UsageError("`time_steps` times one process; leave `world_size` at 1 to time steps")
    models = PlannedModels(**given(vars(args), PlannedModels))
    print(format_plan(make_plan(preset, parallel_setup(args), kinds=models.specs, timing=timing)))
    optimizer = str(given(vars(args), TrainingSettings).get("optim", "adamw_torch"))
    if not optimizer.startswith("adamw") or "8bit" in optimizer:
        print(
            f"(--optim {optimizer} is not modelled: the optimizer state above is AdamW's 8 bytes per parameter)"
        )
    return 0
