"""``difftransformer eval TASK --model PATH``: run one of the paper's experiments on a causal LM checkpoint.

One sub-command per registered task (:mod:`difftransformer.eval.registry`), each with the options every task
shares (:class:`TaskRunOptions`: model, output, seed, device, dtype; :class:`TextOptions`: held-out text) and its own,
generated from the task's options dataclass. Every option, the model folder, the text files and the output folder
are checked before the model is loaded. Defaults the model cannot take are fitted to it (one printed line says so);
values given on the command line are never changed. Results go to OUTPUT_DIR/TASK.json with PNG plots beside, the
JSON recording the options, the model and the versions that produced it (``"provenance"``); see
docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from difftransformer.errors import MissingInputError, UsageError, check_seed
from difftransformer.eval.options import to_json
from difftransformer.eval.registry import all_tasks, get_task
from difftransformer.flags import add_flags, flag, given, torch_device
from difftransformer.storage import check_input_dir, check_output_dir, read_json, versions, write_json

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class TaskRunOptions:
    """What every task's command line names: the model, where results go, the seed, the device and dtype."""

    _argument_group_name = "model and run"

    model: str = field(metadata={"help": "checkpoint directory (config.json, weights, tokenizer)"})
    output_dir: str | None = field(
        default=None, metadata={"help": "where results go (unset: runs/eval/TASK)"}
    )
    seed: int = field(default=0, metadata={"help": "seed for every random draw"})
    device: str = field(default="cpu", metadata={"help": "torch device, e.g. cpu or cuda"})
    dtype: Literal[DTYPES] = field(default="float32", metadata={"help": "weights dtype"})
    no_progress: bool = field(default=False, metadata={"help": "hide the progress bars"})

    def __post_init__(self) -> None:
        check_seed(self.seed)
        torch_device(self.device)

    def output(self, task: str) -> Path:
        """The results folder of ``task``."""
        return Path(self.output_dir or Path("runs") / "eval" / task)


@dataclass(frozen=True)
class TextOptions:
    """Held-out text. Every task accepts these (one command line serves several tasks); those that read no text
    ignore them."""

    _argument_group_name = "held-out text"

    text_file: list[str] | None = field(
        default=None,
        metadata={"help": "a UTF-8 text file, one document (repeatable; unset: the built-in corpus)",
                  "parse": lambda word: [word]},
    )  # fmt: skip
    data: str | None = field(
        default=None,
        metadata={"help": "corpus for difftransformer.data.load_corpus (unset: the built-in one)"},
    )
    split: Literal["test", "validation"] = field(default="test", metadata={"help": "corpus split"})

    def check_locations(self) -> None:
        """Refuse, before the model is loaded, a text file that does not exist or is a folder."""
        for name in self.text_file or ():
            if not Path(name).is_file():
                problem = "is a folder" if Path(name).is_dir() else "does not exist"
                raise MissingInputError(f"`text_file` {name!r} {problem}")


# Options fields that a shared flag sets rather than a flag of their own.
SHARED_FIELDS = ("seed",)


def configure(parser: argparse.ArgumentParser) -> None:
    """One sub-command per registered task: the shared options, then the task's own (with help and default)."""
    parser.description = __doc__.split("\n\n")[0]
    commands = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    for task in all_tasks():
        sub = commands.add_parser(task.name, help=task.help, description=task.help)
        add_flags(sub, TaskRunOptions, only_given=True)
        add_flags(sub, TextOptions, only_given=True)
        add_flags(
            sub,
            task.Options,
            exclude=SHARED_FIELDS,
            only_given=True,
            list_items=True,
            title=f"{task.name} options" + ("" if task.reads_text else " (this task reads no held-out text)"),
        )


def fitted_line(before, after, limit: int | None) -> str | None:
    """The line saying which defaults were fitted to the model (None when none was)."""
    old, new = to_json(before), to_json(after)
    changed = [f"{flag(name)} {old[name]} -> {new[name]}" for name in old if old[name] != new[name]]
    if not changed:
        return None
    return f"defaults fitted to the model's max_position_embeddings = {limit}: {'; '.join(changed)}"


def check_model_folder(path: str, needs_tokenizer: bool) -> None:
    """Refuse, before anything is loaded, a model folder that does not exist, has no config.json, or (when the
    task needs one) no tokenizer."""
    from difftransformer.data.tokenizer import TOKENIZER_FILES

    folder = check_input_dir(path, "model", "a checkpoint (config.json, weights, tokenizer)")
    if not (folder / "config.json").is_file():
        raise MissingInputError(f"`model` must be a checkpoint directory with a config.json; got {path!r}")
    if needs_tokenizer and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise UsageError(
            f"`model` {path!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save the tokenizer next "
            "to the weights (tokenizer.save_pretrained(path))"
        )


def record_provenance(results_file: Path, options, run: TaskRunOptions, text: TextOptions) -> None:
    """Add to the task's results file the options it ran with, the model it read and the versions."""
    results = read_json(results_file) if results_file.is_file() else {}
    results["provenance"] = {
        "options": to_json(options),
        "model": os.path.abspath(run.model),
        "dtype": run.dtype,
        "device": run.device,
        "text": dataclasses.asdict(text),
        "versions": versions(),
    }
    write_json(results_file, results)


def run(args: argparse.Namespace) -> int:
    """Check every option and folder, load the model (and held-out text), run the task with its full settings,
    print its summary."""
    task = get_task(args.task)
    run_options = TaskRunOptions(**given(vars(args), TaskRunOptions))
    text = TextOptions(**given(vars(args), TextOptions))
    settings = given(vars(args), task.Options)
    names = {f.name for f in dataclasses.fields(task.Options)}
    settings.update({name: getattr(run_options, name) for name in SHARED_FIELDS if name in names})
    options = task.Options(**settings)  # checks every value before the model is loaded
    check_model_folder(run_options.model, task.needs_tokenizer)
    text.check_locations()
    output_dir = check_output_dir(run_options.output(task.name), "output_dir")
    for name, value in dataclasses.asdict(
        options
    ).items():  # a task's own folders to write (a download cache)
        if name.endswith("_dir") and value is not None:
            check_output_dir(value, name)

    from difftransformer.eval import common

    common.seed_everything(run_options.seed)
    model, tokenizer = common.load_model_and_tokenizer(
        run_options.model,
        dtype=run_options.dtype,
        device=run_options.device,
        need_tokenizer=task.needs_tokenizer,
    )
    texts = common.load_texts(text.text_file, text.data, text.split) if task.reads_text else None
    fitted = task.fit(options, model, tokenizer, frozenset(settings))
    line = fitted_line(options, fitted, common.max_context(model))
    if line:
        print(line)
    results = task.run(model, tokenizer, texts, fitted, output_dir, not run_options.no_progress)
    record_provenance(output_dir / f"{task.name}.json", fitted, run_options, text)
    print(f"{task.name}: {task.summarise(results)}")
    print(f"results written to {output_dir}")
    return 0
