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

import argparse
import importlib.util
import os
import re
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from difftransformer.errors import MissingInputError, UsageError

INSTALL_HINT = "lm-eval is not installed: pip install 'difftransformer[lmeval]'"
LM_EVAL_SUBCOMMANDS = ("run", "ls", "validate")  # lm-eval's own; its legacy form (no subcommand) means run


def require_lm_eval() -> None:
    """Refuse, with an ImportError carrying the install hint, to go on without lm-eval (found without importing
    it: its import takes seconds)."""
    if importlib.util.find_spec("lm_eval") is None:
        raise ImportError(INSTALL_HINT)


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


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers (a TCP connection to huggingface.co:443 within ``timeout`` seconds);
    False without trying when ``HF_HUB_OFFLINE`` is set."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def lm_eval_task_names(include_path: str | os.PathLike | None = None) -> set[str]:
    """The task, group and tag names lm-eval's YAML files declare on a line of their own (``task: NAME``), under
    lm-eval's own task folder and ``include_path``: read in about a second, where indexing them as lm-eval's
    ``TaskManager`` does takes about 20. It misses names declared otherwise (lists of tags, generated names), so a
    name it does not find is looked up in the full index (:func:`unknown_lm_eval_tasks`)."""
    package = Path(importlib.util.find_spec("lm_eval").origin).parent
    roots = [package / "tasks"] + ([Path(include_path)] if include_path else [])
    names: set[str] = set()
    for root in roots:
        for path in root.rglob("*.yaml"):
            names.update(_DECLARED_NAME.findall(path.read_text(encoding="utf-8", errors="replace")))
    return names


_DECLARED_NAME = re.compile(r"^\s*(?:task|group|tag)\s*:\s*([^\s#'\"]+)\s*$", re.MULTILINE)


def unknown_lm_eval_tasks(tasks: Sequence[str], include_path: str | os.PathLike | None = None) -> list[str]:
    """The names among ``tasks`` that lm-eval knows neither as a task, group or tag (built in or under
    ``include_path``) nor as a YAML file or folder."""
    candidates = [task for task in tasks if not Path(task).exists()]
    quick = lm_eval_task_names(include_path)
    candidates = [task for task in candidates if task not in quick]
    if not candidates:
        return []
    from lm_eval.tasks import TaskManager

    known = TaskManager(include_path=str(include_path) if include_path else None).all_tasks
    return [task for task in candidates if task not in known]


def _lm_eval_run_options(argv: Sequence[str]) -> dict[str, Any]:
    """The options of lm-eval's ``run`` that are checked before it starts (the rest are lm-eval's to check)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--model", default="hf")
    parser.add_argument("--model_args", action="append", nargs="*", default=[])
    parser.add_argument("--tasks", action="append", nargs="*", default=[])
    parser.add_argument("--include_path", default=None)
    known, _ = parser.parse_known_args(list(argv)[1:])
    return vars(known)


def check_lm_eval_run(argv: Sequence[str]) -> None:
    """Refuse, before lm-eval starts, what would otherwise fail after minutes or with a traceback: a
    ``pretrained=`` model folder that does not exist (or a hub name while the hub is not reachable), an
    ``--include_path`` that is not a folder, task names lm-eval does not know. ``argv``: lm-eval's arguments
    (:func:`lm_eval_argv`)."""
    options = _lm_eval_run_options(argv)
    include_path = options["include_path"]
    if include_path is not None and not Path(include_path).is_dir():
        raise MissingInputError(f"--include_path: {include_path} is not a folder of task YAML files")
    model_args = dict(
        item.split("=", 1)
        for words in options["model_args"]
        for word in words
        for item in word.split(",")
        if "=" in item
    )
    pretrained = model_args.get("pretrained")
    if options["model"] in ("hf", "hf-auto", "huggingface") and pretrained is not None:
        path = Path(pretrained).expanduser()
        if path.exists() and not (path / "config.json").is_file():
            raise UsageError(
                f"--model_args pretrained={pretrained}: not a saved model folder (no config.json)"
            )
        local = path.is_absolute() or pretrained.startswith((".", "~")) or path.exists()
        if not path.exists() and (local or not hub_reachable()):
            where = "" if local else " nor a model on the hub, which is not reachable from here"
            raise MissingInputError(f"--model_args pretrained={pretrained}: no such model folder{where}")
    tasks = [task for words in options["tasks"] for word in words for task in word.split(",") if task]
    if not tasks:
        return  # lm-eval says what is missing
    unknown = unknown_lm_eval_tasks(tasks, include_path)
    if unknown:
        where = f" (built in or under {include_path})" if include_path else ""
        raise UsageError(
            f"--tasks: lm-eval knows no task {', '.join(unknown)}{where}; `lm-eval ls tasks` lists them"
        )


def run_lm_eval_command(argv: Sequence[str]) -> int:
    """Run lm-eval's own command line on ``argv`` as ``difftransformer lm-eval`` forwards it (:func:`lm_eval_argv`)
    and return its exit status (that of its argparse errors and ``--help`` included). An ImportError carrying the
    install hint when lm-eval is missing. What :func:`check_lm_eval_run` refuses is refused before lm-eval starts;
    when the hub is not reachable, lm-eval runs offline (datasets and models from the local cache only), so a task
    whose data is not cached fails at once, in one line, instead of after the hub client's retries."""
    require_lm_eval()
    forwarded = lm_eval_argv(argv)
    if forwarded and forwarded[0] == "run" and not {"-h", "--help"} & set(forwarded):
        check_lm_eval_run(forwarded)
    offline = not hub_reachable()
    from lm_eval.__main__ import cli_evaluate

    offline_switches = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    saved_argv, saved_switches = sys.argv, {name: os.environ.get(name) for name in offline_switches}
    sys.argv = ["lm-eval", *forwarded]
    if offline:
        os.environ.update(dict.fromkeys(offline_switches, "1"))
    try:
        cli_evaluate()
    except SystemExit as done:  # argparse's errors and --help
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except (ConnectionError, OSError) as err:
        if not offline:
            raise
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(
            f"lm-eval needs data or a model from the hub, which is not reachable from here, and the local cache "
            f"does not hold it: {first_line}"
        ) from err
    finally:
        sys.argv = saved_argv
        for name, value in saved_switches.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
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
