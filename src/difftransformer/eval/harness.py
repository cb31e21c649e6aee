"""lm-evaluation-harness on our model folders: :func:`run_lm_eval_command` (``difftransformer lm-eval``, whose
command module is :mod:`difftransformer.eval.harness_cli`) and :func:`run_harness`.

Every folder we save carries its model code (docs/sharing.md), so lm-eval's own ``hf`` model opens it with
``trust_remote_code=True``; nothing here re-implements the harness. ``difftransformer lm-eval ARGS`` is
lm-eval's command line with ``trust_remote_code=True`` added to its model arguments; :func:`run_harness` runs
tasks on a folder through lm-eval's ``HFLM`` and returns the metrics per task. lm-eval is an optional
dependency (``pip install 'difftransformer[lmeval]'``). The harness scores windows of up to the model's
``max_position_embeddings`` tokens (docs/evaluation.md, "lm-evaluation-harness").
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from difftransformer.errors import MissingInputError, UsageError

INSTALL_HINT = "lm-eval is not installed: pip install 'difftransformer[lmeval]'"
LM_EVAL_SUBCOMMANDS = ("run", "ls", "validate")  # lm-eval's own; its legacy form (no subcommand) means run


def require_lm_eval() -> None:
    """Refuse, with an ImportError carrying the install hint, to go on without lm-eval."""
    try:
        import lm_eval  # noqa: F401
    except ImportError as err:
        raise ImportError(INSTALL_HINT) from err


def check_harness(include_path: str | os.PathLike | None, batch_size: int) -> None:
    """Refuse, before any long work, what :func:`harness_results` cannot run: lm-eval missing, a non-positive
    ``batch_size``, an ``include_path`` that is not a folder."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"`batch_size` must be a positive integer; got {batch_size!r}")
    if include_path is not None and not Path(include_path).is_dir():
        raise MissingInputError(f"`include_path`: {include_path} is not a folder of task YAML files")
    require_lm_eval()


def lm_eval_argv(argv: Sequence[str]) -> list[str]:
    """lm-eval's arguments for a ``difftransformer lm-eval`` command line: ``run`` made explicit and
    ``trust_remote_code=True`` added to its ``--model_args`` (our folders carry their code; lm-eval's own
    ``--trust_remote_code`` flag would also let dataset scripts run), unless the arguments already say
    something about it; ``ls``, ``validate`` and help as given."""
    args = list(argv)
    if not args or args[0] in ("-h", "--help") or args[0] in LM_EVAL_SUBCOMMANDS[1:]:
        return args
    if args[0] != "run":
        args.insert(0, "run")
    if len(args) > 1 and not any("trust_remote_code" in arg for arg in args):
        args += ["--model_args", "trust_remote_code=True"]  # merged with the user's --model_args
    return args


def run_lm_eval_command(argv: Sequence[str]) -> int:
    """Run lm-eval's own command line on ``argv`` as ``difftransformer lm-eval`` forwards it (:func:`lm_eval_argv`)
    and return its exit status (that of its argparse errors and ``--help`` included). An ImportError carrying the
    install hint when lm-eval is missing."""
    require_lm_eval()
    from lm_eval.__main__ import cli_evaluate

    saved_argv = sys.argv
    sys.argv = ["lm-eval", *lm_eval_argv(argv)]
    try:
        cli_evaluate()
    except SystemExit as done:  # argparse's errors and --help
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    finally:
        sys.argv = saved_argv
    return 0


def harness_results(
    model_dir: str | os.PathLike,
    tasks: Sequence[str],
    *,
    include_path: str | os.PathLike | None = None,
    include_defaults: bool = True,
    batch_size: int = 1,
    num_fewshot: int | None = None,
    limit: int | float | None = None,
    device: str = "cpu",
    dtype: str = "auto",
    max_length: int | None = None,
    seed: int = 0,
    bootstrap_iters: int = 100_000,
    log_samples: bool = False,
) -> dict[str, Any]:
    """lm-eval's ``simple_evaluate`` result for ``tasks`` on the saved model folder ``model_dir`` (weights,
    config and tokenizer, as ``train`` writes them), loaded by lm-eval's ``HFLM`` with ``trust_remote_code=True``.

    Args:
        model_dir: a saved model folder holding its tokenizer.
        tasks: lm-eval task, group or tag names (built-in, or from YAML files under ``include_path``), or paths
            of task YAML files.
        include_path: a folder of task YAML files (local tasks, e.g. ``dataset_path: json``).
        include_defaults: also index lm-eval's built-in tasks (about 20 s); False where every task is local.
        batch_size, num_fewshot, limit, device, dtype: as lm-eval's options of the same names.
        max_length: longest window the harness scores; None: the model's ``max_position_embeddings``.
        seed: every seed lm-eval takes (Python, NumPy, torch, few-shot sampling).
        bootstrap_iters: resamples for the standard errors of metrics that are not means (0: none).
        log_samples: keep each document's requests and responses under "samples".
    """
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise MissingInputError(f"`model_dir`: {path} is not a saved model folder (no config.json)")
    if isinstance(tasks, str) or not tasks or not all(isinstance(task, str) and task for task in tasks):
        raise UsageError(f"`tasks` must be a non-empty list of task names; got {tasks!r}")
    check_harness(include_path, batch_size)
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path, include_defaults=include_defaults)
    unknown = [task for task in tasks if task not in manager.all_tasks and not Path(task).is_file()]
    if unknown:
        where = f" or under {include_path}" if include_path else ""
        raise UsageError(f"`tasks`: lm-eval knows no task {unknown}{where}")
    model = HFLM(
        pretrained=str(path),
        trust_remote_code=True,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        max_length=max_length,
    )
    return lm_eval.simple_evaluate(
        model=model,
        tasks=list(tasks),
        task_manager=manager,
        num_fewshot=num_fewshot,
        limit=limit,
        log_samples=log_samples,
        bootstrap_iters=bootstrap_iters,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )


def task_metrics(results: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """``{task: {metric: value}}`` from lm-eval's results: its "acc,none" keys become "acc", "acc_stderr,none"
    "acc_stderr"; a value lm-eval could not compute ("N/A") becomes None."""
    metrics = {}
    for task, values in results["results"].items():
        metrics[task] = {
            key.removesuffix(",none"): (float(value) if isinstance(value, (int, float)) else None)
            for key, value in values.items()
            if "," in key
        }
    return metrics


def run_harness(model_dir: str | os.PathLike, tasks: Sequence[str], **options: Any) -> dict[str, dict]:
    """Run lm-evaluation-harness ``tasks`` on a saved model folder; returns ``{task: {metric: value}}``
    (:func:`task_metrics`). ``options`` are :func:`harness_results`'s (include_path, batch_size, limit, ...)."""
    return task_metrics(harness_results(model_dir, tasks, **options))
