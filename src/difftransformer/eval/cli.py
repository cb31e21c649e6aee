"""``difftransformer eval TASK --model PATH``: run one of the paper's experiments on a causal LM checkpoint.

One sub-command per registered task (:mod:`difftransformer.eval.registry`), each with the options every task
shares (model, output, seed, device, dtype, held-out text) and its own, generated from the task's options
dataclass. Defaults the model cannot take are fitted to it (one printed line says so); values given on the
command line are never changed. Results go to OUTPUT_DIR/TASK.json with PNG plots beside; see
docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from difftransformer.eval.options import to_json
from difftransformer.eval.registry import all_tasks, get_task
from difftransformer.flags import add_flags, flag, given

# Options fields that a shared flag sets rather than a flag of their own.
SHARED_FIELDS = ("seed",)


def _shared_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help="checkpoint directory (config.json, weights, tokenizer)"
    )
    parser.add_argument("--output-dir", default=None, help="where results go (default: runs/eval/TASK)")
    parser.add_argument("--seed", type=int, default=0, help="seed for every random draw (default 0)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")
    parser.add_argument("--dtype", default="float32", help="weights dtype: float32, bfloat16, float16")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def _text_options(parser: argparse.ArgumentParser, read: bool) -> None:
    # Every task accepts them (one command line serves several tasks); those that read no text ignore them.
    text = parser.add_argument_group("held-out text" if read else "held-out text (this task reads none)")
    text.add_argument("--text-file", action="append", default=None, help="a UTF-8 text file (repeatable); "
                      "default: the built-in corpus")  # fmt: skip
    text.add_argument(
        "--data", default=None, help="corpus for difftransformer.data.load_corpus (default built-in)"
    )
    text.add_argument(
        "--split", default="test", choices=("test", "validation"), help="corpus split (default test)"
    )


def configure(parser: argparse.ArgumentParser) -> None:
    """One sub-command per registered task."""
    parser.description = __doc__.split("\n\n")[0]
    commands = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    for task in all_tasks():
        sub = commands.add_parser(task.name, help=task.help, description=task.help)
        _shared_options(sub)
        _text_options(sub, task.reads_text)
        add_flags(
            sub.add_argument_group(task.name),
            task.Options,
            exclude=SHARED_FIELDS,
            only_given=True,
            list_items=True,
        )


def fitted_line(before, after, limit: int | None) -> str | None:
    """The line saying which defaults were fitted to the model (None when none was)."""
    old, new = to_json(before), to_json(after)
    changed = [f"{flag(name)} {old[name]} -> {new[name]}" for name in old if old[name] != new[name]]
    if not changed:
        return None
    return f"defaults fitted to the model's max_position_embeddings = {limit}: {'; '.join(changed)}"


def run(args: argparse.Namespace) -> int:
    """Load the model (and held-out text), run the task with its full settings, print its summary."""
    from difftransformer.eval import common

    task = get_task(args.task)
    settings = given(vars(args), task.Options)
    names = {f.name for f in dataclasses.fields(task.Options)}
    settings.update({name: getattr(args, name) for name in SHARED_FIELDS if name in names})
    options = task.Options(**settings)  # checks every value before the model is loaded
    output_dir = Path(args.output_dir or Path("runs") / "eval" / task.name)
    common.seed_everything(args.seed)
    model, tokenizer = common.load_model_and_tokenizer(
        args.model, dtype=args.dtype, device=args.device, need_tokenizer=task.needs_tokenizer
    )
    texts = common.load_texts(args.text_file, args.data, args.split) if task.reads_text else None
    fitted = task.fit(options, model, tokenizer, frozenset(settings))
    line = fitted_line(options, fitted, common.max_context(model))
    if line:
        print(line)
    results = task.run(model, tokenizer, texts, fitted, output_dir, not args.no_progress)
    print(f"{task.name}: {task.summarise(results)}")
    print(f"results written to {output_dir}")
    return 0
