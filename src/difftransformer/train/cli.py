"""``difftransformer train``: train one DIFF, DIFF V2 or softmax language model on the built-in corpus or your text.

Options: ours first (the run, the preset and model, the data), then every transformers ``TrainingArguments``
option under its own name (``--gradient-checkpointing``, ``--bf16``, ``--optim adafactor``, ``--fsdp ...``, ...).
A preset's values are the defaults of the options it sets; docs/training.md lists where ours differ from
transformers'. Under ``torchrun --nproc_per_node=N -m difftransformer train ...`` Trainer/accelerate runs DDP (gloo
on CPU, NCCL on GPU); the batch flags are per process, as in ``TrainingArguments``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from tqdm.auto import tqdm

from difftransformer.convert.upcycle import initial_model
from difftransformer.errors import UsageError
from difftransformer.flags import add_flags, given
from difftransformer.models import ATTENTION_KINDS
from difftransformer.train.checkpoints import last_good_checkpoint
from difftransformer.train.pipeline import prepare_preset_data
from difftransformer.train.presets import PRESETS, RECIPE, Preset, get_preset
from difftransformer.train.runner import is_main_process, train_model
from difftransformer.train.settings import DataOptions, PresetOptions, TrainingSettings


def preset_help() -> str:
    """The presets, one line each, for --help."""
    return "presets: " + "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values())


def add_recipe_options(parser: argparse.ArgumentParser, *, exclude: frozenset[str] = frozenset()) -> None:
    """The options ``train`` and ``compare`` share: preset and model, data, and every ``TrainingArguments`` option
    (the ones a preset sets default to the preset's value); ``exclude`` names training options a command sets
    itself."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = preset_help()
    add_flags(parser, PresetOptions)
    add_flags(parser, DataOptions)
    add_flags(parser, TrainingSettings, preset_fields=frozenset(RECIPE), exclude=exclude)


def configure(parser: argparse.ArgumentParser) -> None:
    """``train``'s own options, then the shared ones."""
    parser.usage = "%(prog)s --output-dir DIR [--preset NAME] [--attention KIND] [--resume] [OPTION ...]"
    run = parser.add_argument_group("run")
    run.add_argument(
        "--attention",
        choices=ATTENTION_KINDS,
        help="diff: DIFF V1 with the preset's h heads; softmax: the matched baseline (2h heads); diff_v2: DIFF V2 "
        "with the baseline's head count (default: diff; with --init-from, the folder's kind)",
    )
    run.add_argument(
        "--init-from",
        metavar="DIR",
        help="start from a saved model folder: its weights, config and tokenizer (a softmax or Llama-family model "
        "is upcycled when --attention names diff_v2 or diff; docs/training.md); the preset gives the recipe",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last finished checkpoint in --output-dir (unfinished ones are set aside)",
    )
    add_recipe_options(parser)


def resolved_preset(args: argparse.Namespace) -> Preset:
    """The chosen preset with every preset option the user gave applied (training options included)."""
    options = PresetOptions(**given(vars(args), PresetOptions))
    preset = get_preset(options.preset)
    overrides = {
        name: value
        for name, value in dataclasses.asdict(options).items()
        if name != "preset" and value is not None
    }
    training = {name: value for name, value in given(vars(args), TrainingSettings).items() if name in RECIPE}
    preset = dataclasses.replace(preset, **overrides).with_training(**training)
    for attention in ATTENTION_KINDS:  # the model options are checked now, before any work
        try:
            preset.model_config(attention)
        except UsageError:
            raise
        except ValueError as err:  # the model config's refusal of a shape the flags asked for
            raise UsageError(f"preset {preset.name} with the given model options: {err}") from err
    return preset


def training_options(args: argparse.Namespace) -> dict:
    """The ``TrainingArguments`` options of the command line that no preset sets (a preset's are in
    :func:`resolved_preset`)."""
    return {name: value for name, value in given(vars(args), TrainingSettings).items() if name not in RECIPE}


def checked_training_settings(preset: Preset, **fields) -> TrainingSettings:
    """``preset.training_settings(**fields)``, where a combination of flags that transformers'
    ``TrainingArguments`` refuses is a :class:`~difftransformer.errors.UsageError` like any other bad flag."""
    try:
        return preset.training_settings(**fields)
    except UsageError:
        raise
    except ValueError as err:
        raise UsageError(f"training options: {err}") from err


def run(args: argparse.Namespace) -> int:
    """Prepare the data, train, print a one-line summary; Ctrl-C stops with a one-line note (exit 130)."""
    preset = resolved_preset(args)
    settings = checked_training_settings(preset, **training_options(args))
    data_options = DataOptions(**given(vars(args), DataOptions))
    pretrained = None
    if args.init_from:
        if data_options.tokenizer:
            raise UsageError(
                "--tokenizer: --init-from brings the folder's own tokenizer; give one of the two"
            )
        data_options = dataclasses.replace(data_options, tokenizer=args.init_from)
        pretrained = initial_model(args.init_from, args.attention, seed=settings.seed)
    data = prepare_preset_data(preset, data_options, settings.seed)
    model = (
        pretrained if pretrained is not None else preset.model_for(args.attention or "diff", data.tokenizer)
    )
    attention = (model.config if pretrained is not None else model).attention
    try:
        result = train_model(
            model,
            data.train_dataset,
            data.validation_blocks[: preset.eval_blocks],
            data.tokenizer,
            settings,
            resume=args.resume,
            progress_desc=attention,
        )
    except KeyboardInterrupt:
        checkpoint = last_good_checkpoint(settings.output_dir, quarantine=False)
        where = f"from {checkpoint.name}" if checkpoint else "from step 0 (no checkpoint was finished)"
        # tqdm.write: on a line of its own, whatever the progress bar left on the current one.
        tqdm.write(f"difftransformer train: interrupted; `--resume` continues {where}", file=sys.stderr)
        return 130
    if is_main_process():
        print(
            f"{attention}: {result.parameters:,} parameters, {result.global_step} steps, validation loss "
            f"{result.final_eval_loss:.4f}, {result.tokens_per_second:,.0f} tokens/s; model in "
            f"{os.path.abspath(settings.output_dir)}"
        )
    return 0
