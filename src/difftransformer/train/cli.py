"""``difftransformer train``: train one DIFF, DIFF V2 or softmax language model on the built-in corpus or your text.

Options: ours first (the run, the preset and model, the data), then every transformers ``TrainingArguments``
option under its own name (``--gradient-checkpointing``, ``--bf16``, ``--optim adafactor``, ``--fsdp ...``, ...).
A preset's values are the defaults of the options it sets; docs/training.md lists where ours differ from
transformers'. With ``--data`` the preset's synthetic recall rows are left out unless a ``--*-fraction`` flag asks
for them. Every option, the input folders and the output folders are checked before any data is read. Under
``torchrun --nproc_per_node=N -m difftransformer train ...`` Trainer/accelerate runs DDP (gloo on CPU, NCCL on
GPU); the batch flags are per process, as in ``TrainingArguments``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from tqdm.auto import tqdm

from difftransformer.convert.folders import model_type
from difftransformer.convert.upcycle import initial_model
from difftransformer.data import DataOptions
from difftransformer.errors import UsageError
from difftransformer.flags import add_flags, flag, given
from difftransformer.storage import check_input_dir
from difftransformer.train.callbacks import CtrlCAtStepEnd
from difftransformer.train.checkpoints import last_good_checkpoint
from difftransformer.train.pipeline import prepare_preset_data
from difftransformer.train.presets import PRESETS, RECIPE, Preset, get_preset
from difftransformer.train.provenance import (
    ProvenanceRecorder,
    differing_settings,
    recorded_settings,
    run_settings,
)
from difftransformer.train.runner import check_run_folder, is_main_process, train_model
from difftransformer.train.settings import RECALL_FRACTIONS, PresetOptions, RunOptions, TrainingSettings


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
    add_flags(parser, RunOptions)
    add_recipe_options(parser)


def data_options(args: argparse.Namespace, init_from: str | None) -> DataOptions:
    """The data options of the command line, checked with their folders; ``init_from`` (a pretrained folder)
    brings the tokenizer."""
    options = DataOptions(**given(vars(args), DataOptions))
    if init_from:
        if options.tokenizer:
            raise UsageError(
                "`tokenizer`: `init_from` brings the folder's own tokenizer; give one of the two"
            )
        options = dataclasses.replace(options, tokenizer=init_from)
    if options.tokenizer and vars(args).get("vocab_size") is not None:
        raise UsageError(
            "`vocab_size` sizes a tokenizer trained on the data; `tokenizer` (or `init_from`) brings its own: "
            "give one of the two"
        )
    options.check_locations()
    return options


def resolved_preset(args: argparse.Namespace) -> Preset:
    """The chosen preset with every preset option the user gave applied (training options included). With
    ``--data`` (the user's own text), the preset's shares of synthetic recall rows (needle, MQAR, induction) are
    0 unless the command line gives them."""
    options = PresetOptions(**given(vars(args), PresetOptions))
    preset = get_preset(options.preset)
    overrides = {
        name: value
        for name, value in dataclasses.asdict(options).items()
        if name not in ("preset", "hidden_size") and value is not None
    }
    if vars(args).get("data") is not None:
        overrides = {**{name: 0.0 for name in RECALL_FRACTIONS}, **overrides}
    training = {name: value for name, value in given(vars(args), TrainingSettings).items() if name in RECIPE}
    if options.hidden_size is not None:
        preset = preset.at_width(options.hidden_size)
    preset = dataclasses.replace(preset, **overrides).with_training(**training)
    context = preset.max_position_embeddings
    if options.max_position_embeddings is None and context is not None and context < preset.block_size:
        raise UsageError(
            f"`block_size` {preset.block_size} exceeds the longest sequence the {preset.name} preset's models admit "
            f"(its max_position_embeddings, {context}); give `max_position_embeddings` {preset.block_size} or more "
            f"with it, or a block size up to {context}"
        )
    preset.recall.check_schedule(preset.block_size)  # the recall mix checks its shares as it is made
    # The preset's own two shapes, checked now, before any work; each command checks the kinds it builds.
    for attention in ("diff", "softmax"):
        try:
            preset.model_config(attention)
        except UsageError:
            raise
        except ValueError as err:  # the model config's refusal of a shape the flags asked for
            raise UsageError(f"preset {preset.name} with the given model options: {err}") from err
    return preset


def recall_note(preset: Preset) -> str | None:
    """The line ``train`` and ``compare`` print when synthetic rows are drawn into the user's own ``--data``
    (None when none are)."""
    shares = [f"{getattr(preset, name):.0%} {name.removesuffix('_fraction')} ({flag(name)})"
              for name in RECALL_FRACTIONS if getattr(preset, name)]  # fmt: skip
    if not shares:
        return None
    return "synthetic rows drawn into the training rows of --data, as asked: " + ", ".join(shares)


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
    except (ValueError, ImportError) as err:  # ImportError: an option needs a package that is not installed
        raise UsageError(f"training options: {err}") from err


def resume_note(output_dir: str, settings: dict) -> str | None:
    """The line ``train --resume`` prints when the run in ``output_dir`` was trained so far with other settings
    than ``settings`` (:func:`~difftransformer.train.provenance.run_settings`' keywords), e.g. another
    ``--length-schedule``: the steps from here on follow the new ones. None when they agree or nothing is recorded."""
    before = recorded_settings(output_dir)
    differ = differing_settings(before, run_settings(**settings)) if before is not None else []
    if not differ:
        return None

    def shown(value) -> str:
        if isinstance(value, list) and value and all(isinstance(v, list) and len(v) == 2 for v in value):
            return ",".join(f"{first}:{second}" for first, second in value)  # STEP:TOKENS pairs
        return str(value)

    changes = "; ".join(f"{flag(name)} {shown(old)} then, {shown(new)} now" for name, old, new in differ)
    return (
        f"--resume: {output_dir} was trained so far with other settings ({changes}); the steps from here on follow "
        "the new ones"
    )


def run(args: argparse.Namespace) -> int:
    """Check every option and folder, prepare the data, train, print a one-line summary; Ctrl-C stops with a
    one-line note (exit 130)."""
    run_options = RunOptions(**given(vars(args), RunOptions))
    preset = resolved_preset(args)
    fields = run_options.model_fields()
    if (
        fields or not run_options.init_from
    ):  # the kind and its fields against the preset's shape, before any work
        preset.model_config(run_options.attention or "diff", **fields)
    settings = checked_training_settings(preset, **training_options(args))
    if run_options.init_from:
        check_input_dir(run_options.init_from, "init_from", "a saved model")
        model_type(run_options.init_from)  # a folder without a readable config.json is refused now
    data = data_options(args, run_options.init_from)
    check_run_folder(settings.output_dir, resume=run_options.resume)
    if data.data is not None and (note := recall_note(preset)):
        print(note)
    pretrained = None
    if run_options.init_from:
        pretrained = initial_model(run_options.init_from, run_options.attention, seed=settings.seed, **fields)
    prepared = prepare_preset_data(preset, data, settings.seed)
    # The mix checks its rows against the vocabulary as it is built: before anything is recorded.
    train_dataset = prepared.train_dataset
    model = (
        pretrained
        if pretrained is not None
        else preset.model_for(run_options.attention or "diff", prepared.tokenizer, **fields)
    )
    attention = (model.config if pretrained is not None else model).attention
    recorded = dict(
        preset=preset, training=settings, data=data, attention=attention, init_from=run_options.init_from
    )
    if run_options.resume and is_main_process() and (note := resume_note(settings.output_dir, recorded)):
        print(note)
    provenance = ProvenanceRecorder(settings.output_dir, **recorded)
    ctrl_c = CtrlCAtStepEnd()
    try:
        with ctrl_c.armed():
            result = train_model(
                model,
                train_dataset,
                prepared.validation_blocks[: preset.eval_blocks],
                prepared.tokenizer,
                settings,
                resume=run_options.resume,
                progress_desc=attention,
                callbacks=[provenance, ctrl_c],
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
