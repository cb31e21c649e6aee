"""Every command refuses bad input in one line, with exit status 2 and no traceback, before any work and without
writing anything; Ctrl-C ends every command in one line with exit status 130.

The cases are generated: every command's parser (every ``eval`` task's too) is walked, and every option is given
boundary values by its type: 0, -1, a number beyond int64 (or a float beyond the largest), a word of the wrong type,
an empty list, a choice that does not exist, a path that is a file and one that lies under a file. Each case either
is refused as above or reaches the command's work, which the test replaces with a stop (:class:`Reached`): what a
command accepts, it accepts before any work, and nothing is written before the work starts. A hypothesis-driven
test draws numeric combinations where the test knows the valid range and checks that exactly the invalid ones are
refused. Then every case issue 31 lists. The commands run in-process (``cli.main``), which behaves as the installed
command does (tests/test_refusals.py runs one in a subprocess)."""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from difftransformer import cli
from difftransformer.compare import cli as compare_cli
from difftransformer.compare.plan import plan_comparison
from difftransformer.convert import cli as convert_cli
from difftransformer.convert.upcycle import initial_model, load_softmax
from difftransformer.data.tokenizer import TOKENIZER_FILES
from difftransformer.eval.common import load_model_and_tokenizer
from difftransformer.flags import INT64
from difftransformer.generate import load_model
from difftransformer.train.cli import resolved_preset, training_options
from difftransformer.train.presets import PRESETS
from difftransformer.train.provenance import record_provenance
from helpers import random_model
from test_train_support import small_tokenizer, synthetic_texts


class Reached(Exception):
    """Raised where a command's work begins (the test's stop in place of the work)."""


# Where each command's work begins: after these are called, nothing may be refused any more.
WORK = {
    "prepare": ["difftransformer.data.options.DataOptions.open_corpus"],
    "train": ["difftransformer.train.cli.prepare_preset_data", "difftransformer.train.cli.initial_model"],
    "compare": ["difftransformer.compare.cli.connect"],
    "plan": ["difftransformer.train.plan_cli.make_plan"],
    "generate": ["difftransformer.generate_cli.load_model"],
    "eval": ["difftransformer.eval.common.load_model_and_tokenizer"],
    "convert": [
        "difftransformer.convert.cli.from_diffllama",
        "difftransformer.convert.cli.load_softmax",
        "difftransformer.convert.cli._ours",
    ],
    "bench": [
        "difftransformer.bench.cli.run_check",
        "difftransformer.bench.cli.bench_op",
        "difftransformer.bench.cli.bench_train",
        "difftransformer.bench.cli.bench_decode",
        "difftransformer.bench.cli.bench_memory",
        "torch.set_num_threads",
    ],
}
CONTEXT = 64  # the fixture model's max_position_embeddings
SET_THREADS = torch.set_num_threads  # the real one: the tests stop bench at its call
FILE = "a_file"  # a file in the working folder: "a path that is a file", and FILE/under "a path under a file"
# Options that name a folder or file (input or output), by their field names.
PATHS = {"output_dir", "output", "cache_dir", "tokenizer", "init_from", "model", "text_file", "lm_eval_include",
         "logging_dir", "from_diffllama", "to_diffllama", "from_llama", "to_llama", "data"}  # fmt: skip


def base_argv(command: str, task: str | None, models: dict[str, Path]) -> list[str]:
    """A command line of ``command`` that is valid and reaches its work (relative outputs: the working folder)."""
    return {
        "prepare": ["prepare", "--output-dir", "tokenizer_out"],
        "train": ["train", "--preset", "micro", "--output-dir", "run", "--report-to", "none"],
        "compare": ["compare", "--preset", "micro", "--output-dir", "cmp", "--report-to", "none"],
        "plan": ["plan", "--preset", "micro"],
        "generate": ["generate", str(models["diff"]), "--prompt", "the king", "--max-new-tokens", "8"],
        "eval": ["eval", str(task), "--model", str(models["diff"])],
        "convert": ["convert", "--to-llama", str(models["softmax"]), "--output-dir", "converted"],
        "bench": ["bench", "--output", "bench.json"],
    }[command]


def parsers() -> Iterator[tuple[str, str | None, argparse.ArgumentParser]]:
    """(command, eval task or None, the parser of its options) for every command and every eval task."""
    for command in WORK:
        top = cli.build_parser(command)
        sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
        if command != "eval":
            yield command, None, sub
            continue
        tasks = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices
        for task, task_parser in tasks.items():
            yield command, task, task_parser


def values_for(action: argparse.Action) -> list[str]:
    """The boundary values the option of ``action`` is given."""
    kind = getattr(action.type, "__name__", "")
    if action.nargs == 0:  # store_true/false flags take no value
        return []
    values: list[str] = []
    if kind == "integer":
        values += ["0", "-1", str(INT64[1] + 1), "one"]
    elif kind == "number":
        values += ["0", "-1", "1e400", "one"]
    elif kind == "string_to_bool":
        values += ["maybe"]
    elif kind == "choice" or action.choices:
        values += ["bogus"]
    if action.nargs in ("+", "*"):
        values += [""]  # an empty list (one empty word: a comma-separated list of nothing)
    if action.dest in PATHS:
        values += [FILE, f"{FILE}/under"]
    return values


# Values no option can take: a word of the wrong type, a choice that does not exist, numbers beyond what any
# number type holds. Folders that are files or lie under one, for the options that name folders.
IMPOSSIBLE = {"one", "maybe", "bogus", str(INT64[1] + 1), "1e400"}
FOLDERS = {"output_dir", "cache_dir", "tokenizer", "init_from", "model", "lm_eval_include", "logging_dir",
           "from_diffllama", "to_diffllama", "from_llama", "to_llama"}  # fmt: skip


def must_be_refused(flag: str, value: str) -> bool:
    """Whether ``value`` is one that ``flag`` can never take."""
    field = flag.removeprefix("--").replace("-", "_")
    return (
        value in IMPOSSIBLE
        or (field in FOLDERS and value in (FILE, f"{FILE}/under"))
        or (field == "output" and value == f"{FILE}/under")
    )


def generated_cases() -> list[tuple[str, str | None, str, str]]:
    """(command, task, flag, value) for every option of every command and every boundary value."""
    cases = []
    for command, task, parser in parsers():
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            flag = next((s for s in action.option_strings if "_" not in s), action.option_strings[0])
            cases += [(command, task, flag, value) for value in values_for(action)]
    return cases


CASES = generated_cases()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Saved tiny models with a tokenizer (DIFF V1 and softmax, 64 positions), outside the working folder."""
    root = tmp_path_factory.mktemp("models")
    tokenizer = small_tokenizer(synthetic_texts(count=20), vocab_size=300)
    folders = {}
    for kind, heads in (("diff", 2), ("softmax", 4)):
        model = random_model(
            attention=kind,
            num_attention_heads=heads,
            vocab_size=len(tokenizer),
            max_position_embeddings=CONTEXT,
        ).to(torch.float32)
        folders[kind] = root / kind
        model.save_pretrained(folders[kind])
        tokenizer.save_pretrained(folders[kind])
    return folders


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """The working folder of a command: relative outputs land here, the cache too; it holds :data:`FILE`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DIFFTRANSFORMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / FILE).write_text("the king and the queen\n")
    for targets in WORK.values():
        for target in targets:
            monkeypatch.setattr(target, _stop)
    # One parser per command for the whole module: argparse does not change a parser when it parses.
    monkeypatch.setattr(cli, "build_parser", _cached_parser)
    return tmp_path


@functools.cache
def _cached_parser(command: str | None = None) -> argparse.ArgumentParser:
    return _build_parser(command)


_build_parser = cli.build_parser


def _stop(*args, **kwargs):
    raise Reached


def snapshot(folder: Path) -> dict[str, str]:
    """Every file (and folder) under ``folder`` with a hash of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        if path.is_file()
        else "dir"
        for path in sorted(folder.rglob("*"))
    }


def run_command(argv: list[str], capsys) -> tuple[str, str]:
    """Run ``argv``: ("refused", its line) when it exits 2 with one line on stderr naming the command and no
    traceback, ("reached", "") when the command got to its work; anything else fails the test."""
    capsys.readouterr()
    threads = torch.get_num_threads()
    try:
        code = cli.main(argv)
    except Reached:
        return "reached", ""
    except SystemExit as exit_:
        code = exit_.code
    finally:
        SET_THREADS(threads)  # bench --threads sets it before its work
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, (argv, code, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("difftransformer") and "error: " in lines[0], (argv, err)
    assert "Traceback" not in err, (argv, err)
    return "refused", lines[0]


def outcome(argv: list[str], capsys) -> str:
    """ "refused" or "reached" (:func:`run_command`)."""
    return run_command(argv, capsys)[0]


def refused(argv: list[str], capsys) -> str:
    """The one line ``argv`` is refused with (the test fails if it is not refused)."""
    kind, line = run_command(argv, capsys)
    assert kind == "refused", argv
    return line


def test_the_generated_cases_cover_every_command_and_are_many():
    commands = {command for command, *_ in CASES}
    tasks = {task for _, task, *_ in CASES if task}
    assert commands == set(WORK) and len(tasks) == 9
    assert len(CASES) > 1000, len(CASES)  # reported in the closing note


@pytest.mark.parametrize(
    ("command", "task", "flag", "value"), CASES, ids=[f"{c}-{t or ''}{f}={v}" for c, t, f, v in CASES]
)
def test_every_option_at_its_boundaries_is_refused_in_one_line_or_accepted_before_work(
    command, task, flag, value, models, workdir, capsys
):
    before = snapshot(workdir)
    argv = [*base_argv(command, task, models), flag, value]
    result = outcome(argv, capsys)
    assert snapshot(workdir) == before, argv  # nothing written, refused or not
    if must_be_refused(flag, value):
        assert result == "refused", argv


@pytest.mark.parametrize(("command", "task"), [(c, t) for c, t, _ in parsers()], ids=lambda x: str(x))
def test_every_base_command_line_reaches_its_work_and_every_option_has_help(
    command, task, models, workdir, capsys
):
    assert outcome(base_argv(command, task, models), capsys) == "reached"
    parser = dict(((c, t), p) for c, t, p in parsers())[(command, task)]
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            assert action.help and action.help.strip(), (command, task, action.option_strings)


@pytest.mark.parametrize("command", list(WORK))
def test_ctrl_c_ends_every_command_in_one_line_with_status_130(command, models, workdir, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    for target in WORK[command]:
        monkeypatch.setattr(target, interrupted)
    capsys.readouterr()
    threads = torch.get_num_threads()
    try:
        assert cli.main(base_argv(command, "mqar", models)) == 130
    finally:
        SET_THREADS(threads)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"difftransformer {command}: interrupted"), err


# ---- numeric combinations: exactly the invalid ones are refused -----------------------------------------------

FIXTURES = settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # nothing is written: one folder
small_ints = st.integers(min_value=-3, max_value=6) | st.sampled_from([INT64[1], 2**40])


@FIXTURES
@given(batch=small_ints, accumulation=small_ints, block=small_ints, world=small_ints, steps=small_ints)
def test_plan_refuses_exactly_the_invalid_numeric_combinations(
    batch, accumulation, block, world, steps, workdir, capsys
):
    argv = ["plan", "--preset", "micro", "--per-device-train-batch-size", str(batch), "--gradient-accumulation-steps",
            str(accumulation), "--block-size", str(block), "--world-size", str(world), "--max-steps", str(steps)]  # fmt: skip
    valid = batch >= 1 and accumulation >= 1 and block >= 2 and world >= 1 and steps >= 1
    assert outcome(argv, capsys) == ("reached" if valid else "refused"), argv


@FIXTURES
@given(
    new_tokens=st.integers(-2, 80),
    temperature=st.floats(-1, 3, allow_nan=False),
    top_k=st.none() | st.integers(-1, 5),
    top_p=st.none() | st.floats(-0.5, 1.5, allow_nan=False),
    seed=st.integers(-2, 2**32 + 1),
)
def test_generate_refuses_exactly_the_invalid_numeric_combinations(
    new_tokens, temperature, top_k, top_p, seed, models, workdir, capsys
):
    argv = ["generate", str(models["diff"]), "--prompt", "the king", "--max-new-tokens", str(new_tokens),
            "--temperature", repr(temperature), "--seed", str(seed)]  # fmt: skip
    argv += ["--top-k", str(top_k)] if top_k is not None else []
    argv += ["--top-p", repr(top_p)] if top_p is not None else []
    prompt = len(
        AutoTokenizer.from_pretrained(models["diff"])("the king", add_special_tokens=False)["input_ids"]
    )
    sampling_options = (top_k is not None and top_k != 0) or (top_p is not None and top_p != 0)
    valid = (1 <= new_tokens <= CONTEXT - prompt and temperature >= 0 and (top_k is None or top_k >= 1)
             and (top_p is None or 0 < top_p <= 1) and 0 <= seed < 2**32
             and not (sampling_options and temperature == 0))  # top-k/top-p only sample  # fmt: skip
    assert outcome(argv, capsys) == ("reached" if valid else "refused"), argv


@FIXTURES
@given(
    threads=st.integers(-1, (os.cpu_count() or 1) + 1),
    repeats=st.integers(3, 6),
    warmup=st.integers(-1, 2),
    length=st.integers(-1, 3) | st.just(2**20 + 1),
)
def test_bench_refuses_exactly_the_invalid_numeric_combinations(
    threads, repeats, warmup, length, workdir, capsys
):
    argv = ["bench", "--output", "bench.json", "--threads", str(threads), "--repeats", str(repeats), "--warmup",
            str(warmup), "--op-lengths", str(length)]  # fmt: skip
    valid = 1 <= threads <= (os.cpu_count() or 1) and repeats >= 5 and warmup >= 0 and 1 <= length <= 2**20
    assert outcome(argv, capsys) == ("reached" if valid else "refused"), argv


# ---- the cases of issue 31 --------------------------------------------------------------------------------------


def earlier_comparison(argv: list[str], *, recorded: bool = True) -> None:
    """Leave in the comparison folder what a finished comparison of ``argv`` leaves in its run folders: the
    provenance of each run (unless not ``recorded``, as an earlier version left them) and a training summary."""
    parser = cli.build_parser("compare")
    args = parser.parse_args(argv)
    data = compare_cli.data_options(args, None)
    plan = plan_comparison(resolved_preset(args), compare_cli.comparison_settings(args),
                           {k: v for k, v in training_options(args).items() if k != "output_dir"}, data)  # fmt: skip
    for run in plan.all_runs():
        if recorded:
            record_provenance(run.folder, preset=run.preset, training=run.training_settings(), data=data,
                              attention=run.variant.spec(), init_from=None)  # fmt: skip
        run.folder.mkdir(parents=True, exist_ok=True)
        (run.folder / "train_summary.json").write_text("{}")


def test_compare_reuses_only_runs_trained_with_the_same_settings(models, workdir, capsys):
    argv = base_argv("compare", None, models)
    earlier_comparison(argv)
    before = snapshot(workdir)
    assert outcome(argv, capsys) == "reached"  # the same settings: the runs are continued or reused
    line = refused([*argv, "--learning-rate", "0.01"], capsys)
    assert "--learning-rate 0.003 then, 0.01 now" in line and "choose a new --output-dir" in line, line
    line = refused([*argv, "--max-steps", "10"], capsys)
    assert "--max-steps 6 then, 10 now" in line, line
    assert snapshot(workdir) == before


def test_compare_refuses_runs_that_record_no_settings(models, workdir, capsys):
    argv = base_argv("compare", None, models)
    earlier_comparison(argv, recorded=False)
    assert "records no settings" in refused(argv, capsys)


@pytest.mark.parametrize(("flags", "says"), [(["--seeds", "0,0"], "--seeds must be distinct"),
                                             (["--seeds", "0", "--seeds", "0"], "--seeds must be distinct"),
                                             (["--variants", "diff,diff"], "distinct variants"),
                                             (["--variants", "diff(subln=bogus)"], "subln"),
                                             (["--rate-choice", "learned_recall"],
                                              "--rate-choice applies to --learning-rates"),
                                             (["--rate-choice", "validation_loss"],
                                              "--rate-choice applies to --learning-rates"),
                                             (["--learning-rates", "1e-3", "--max-steps", "20", "--sweep-steps", "40"],
                                              "--sweep-steps must be at most --max-steps (20: "),
                                             (["--variants", "diff,diff_v2"], "no claim of the paper could be judged"),
                                             (["--variants", "softmax"], "give --allow-unjudged"),
                                             (["--sizes", "16,32", "--tokens-per-parameter", "1e-9"],
                                              "--tokens-per-parameter gives size 16 0 training step(s)"),
                                             (["--token-budgets", "5000"], "each scale needs at least 10 steps")])  # fmt: skip
def test_compare_refuses_repeated_seeds_and_bad_variants_before_writing_anything(
    flags, says, models, workdir, capsys
):
    before = snapshot(workdir)
    assert says in refused([*base_argv("compare", None, models), *flags], capsys)
    assert snapshot(workdir) == before and not (workdir / "cmp").exists()  # no tokenizer/ either


@pytest.mark.parametrize("command", ["eval", "compare", "prepare", "train", "convert"])
@pytest.mark.parametrize("where", ["file", "under a file", "unwritable"])
def test_output_folders_that_cannot_be_written_are_refused_before_any_work(
    command, where, models, workdir, capsys
):
    if where == "unwritable":
        if os.geteuid() == 0:
            pytest.skip("root writes anywhere: no folder is unwritable")
        (workdir / "locked").mkdir()
        (workdir / "locked").chmod(0o500)
    target = {"file": FILE, "under a file": f"{FILE}/out", "unwritable": "locked/out"}[where]
    line = refused([*base_argv(command, "mqar", models), "--output-dir", target], capsys)
    assert "--output-dir" in line and target.split("/")[0] in line, line


def test_bench_output_under_a_file_is_refused_before_benchmarking(workdir, capsys):
    assert "--output" in refused(["bench", "--output", f"{FILE}/bench.json"], capsys)
    assert "--threads must lie in" in refused(["bench", "--threads", "0"], capsys)


def test_generate_respects_the_model_context(models, workdir, capsys):
    model = str(models["diff"])
    line = refused(["generate", model, "--prompt", "the king", "--max-new-tokens", "100000"], capsys)
    assert "--max-new-tokens 100000" in line and f"max_position_embeddings = {CONTEXT}" in line, line
    long_prompt = " ".join(["the king"] * 800)  # about 1,600 tokens
    assert "the prompt (" in refused(
        ["generate", model, "--prompt", long_prompt, "--max-new-tokens", "1"], capsys
    )
    for seed in ("-1", "4294967296"):
        assert "--seed must lie in" in refused(["generate", model, "--prompt", "x", "--seed", seed], capsys)


def test_generate_refuses_truncated_weights_in_one_line(
    models, workdir, tmp_path_factory, monkeypatch, capsys
):
    broken = tmp_path_factory.mktemp("broken") / "diff"
    shutil.copytree(models["diff"], broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    monkeypatch.setattr("difftransformer.generate_cli.load_model", load_model)
    line = refused(["generate", str(broken), "--prompt", "the king", "--max-new-tokens", "8"], capsys)
    assert "cannot load the model" in line, line


@pytest.mark.parametrize("task", sorted({t for _, t, _ in parsers() if t}))
@pytest.mark.parametrize("seed", ["-1", "4294967296"])
def test_every_eval_task_refuses_a_seed_numpy_cannot_take(task, seed, models, workdir, capsys):
    assert "--seed must lie in" in refused([*base_argv("eval", task, models), "--seed", seed], capsys)


def test_eval_quant_refuses_bits_beyond_its_range(models, workdir, capsys):
    assert "--bits" in refused([*base_argv("eval", "quant", models), "--bits", "65"], capsys)


def test_eval_task_help_shows_every_option_with_its_help_and_default(capsys):
    with pytest.raises(SystemExit):
        cli.main(["eval", "mqar", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--sequences SEQUENCES sequences per setting (default: 64)" in text, text
    assert "mqar options" in text and "--model MODEL checkpoint directory" in text


def test_a_folder_without_a_tokenizer_is_refused_in_one_line(models, workdir, tmp_path_factory, capsys):
    bare = tmp_path_factory.mktemp("bare") / "diff"
    shutil.copytree(models["diff"], bare)
    for name in TOKENIZER_FILES:
        (bare / name).unlink(missing_ok=True)
    for argv in (["eval", "needle", "--model", str(bare)], ["generate", str(bare), "--prompt", "x"],
                 ["train", "--preset", "micro", "--output-dir", "run", "--tokenizer", str(bare)]):  # fmt: skip
        assert "no tokenizer" in refused(argv, capsys), argv


@pytest.mark.parametrize("data", [[], ["--data", FILE]])
def test_prepare_refuses_a_held_out_fraction_out_of_range_with_or_without_data(data, workdir, capsys):
    line = refused(["prepare", "--output-dir", "out", "--validation-fraction", "1.5", *data], capsys)
    assert "--validation-fraction" in line, line


def test_own_data_trains_on_that_data_unless_synthetic_rows_are_asked_for(workdir, capsys):
    parser = cli.build_parser("train")
    own = resolved_preset(
        parser.parse_args(["train", "--preset", "tiny", "--output-dir", "r", "--data", FILE])
    )
    assert (own.needle_fraction, own.mqar_fraction, own.induction_fraction) == (0, 0, 0)
    builtin = resolved_preset(parser.parse_args(["train", "--preset", "tiny", "--output-dir", "r"]))
    assert builtin.needle_fraction == 0.5  # the preset's mix stays on the built-in corpus
    argv = ["train", "--preset", "tiny", "--output-dir", "r", "--data", FILE, "--block-size", "64"]
    assert outcome(argv, capsys) == "reached"
    assert outcome([*argv, "--needle-fraction", "0.25"], capsys) == "reached"
    assert "25% needle (--needle-fraction)" in capsys.readouterr().out


def test_lm_eval_refuses_a_missing_model_before_it_starts(workdir, capsys):
    line = refused(
        ["lm-eval", "--model", "hf", "--model_args", "pretrained=./missing", "--tasks", "hellaswag"], capsys
    )
    assert "pretrained=./missing" in line and "no such model folder" in line, line
    line = refused(
        ["lm-eval", "--model", "hf", "--model_args", "pretrained=missing", "--tasks", "hellaswag"], capsys
    )
    assert "hub, which is not reachable" in line, line  # HF_HUB_OFFLINE: no hub


@pytest.mark.slow  # lm-eval's full task index (about 20 s) decides that a name is unknown
def test_lm_eval_refuses_an_unknown_task_before_it_starts(models, workdir, capsys):
    argv = [
        "lm-eval",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={models['diff']}",
        "--tasks",
        "no_such_task",
    ]
    assert "lm-eval knows no task no_such_task" in refused(argv, capsys)


@pytest.mark.slow  # lm-eval loads the model before it reads the task's data
def test_lm_eval_says_in_one_line_that_a_hub_task_needs_the_hub(models, workdir, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(workdir / "datasets"))  # nothing cached
    model_args = f"pretrained={models['diff']}"
    capsys.readouterr()
    assert cli.main(["lm-eval", "--model", "hf", "--model_args", model_args, "--tasks", "hellaswag"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    # lm-eval logs its progress above; the refusal is one line, with no traceback.
    assert (
        "Traceback" not in err
        and last.startswith("difftransformer lm-eval: error: ")
        and "not reachable" in last
    )


@pytest.mark.parametrize(
    ("argv", "names", "not_named"),
    [
        # The prompt's length depends on --distractors too; the refusal names the flag given with it.
        (["hallucination", "--qa-max-new-tokens", "100000"], "--qa-max-new-tokens 100000", "None"),
        (["mqar", "--first-id", "310"], "--first-id", "None"),
    ],
)
def test_eval_task_refusals_name_the_flag_given(argv, names, not_named, models, workdir, monkeypatch, capsys):
    # These depend on the model (its vocabulary, its context): they come once it is loaded, whose progress bar
    # stands above the one line.
    monkeypatch.setattr("difftransformer.eval.common.load_model_and_tokenizer", load_model_and_tokenizer)
    capsys.readouterr()
    assert cli.main(["eval", argv[0], "--model", str(models["diff"]), *argv[1:]]) == 2
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err and line.startswith("difftransformer eval: error: ")
    assert names in line and not_named not in line, line


# ---- issue 39: combinations of flags, and folders whose config was edited after saving ---------------------------


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--length-schedule", "0:3"], "--length-schedule 0:3: rows of 3 tokens cannot hold MQAR rows"),
        (["--length-schedule", "0:3"], "give every length at least 12 tokens"),
        (["--length-schedule", "-1:32"], "each STEP:TOKENS needs STEP >= 0"),
        (["--length-schedule", "0:32,10:128"], "beyond the block size 64 (--block-size)"),
        (["--length-schedule", "0:64,10:32"], "got 0:64,10:32"),  # STEP:TOKENS as given, not Python tuples
        (["--block-size", "256"], "give --max-position-embeddings 256 or more with it, or a block size up to 128"),
        (["--block-size", "16"], "--block-size 16: rows of 16 tokens cannot hold MQAR rows of 8 key-value pairs"),
        (["--block-size", "256", "--length-schedule", "0:32,10:512", "--max-position-embeddings", "256"],
         "beyond the block size 256"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["train", "compare"])
def test_schedules_block_sizes_and_a_presets_own_limits_combine_or_are_refused_naming_the_flags(
    command, flags, says, models, workdir, capsys
):
    before = snapshot(workdir)
    argv = [command, "--preset", "retrieval", "--output-dir", "out", "--report-to", "none", *flags]
    line = refused(argv, capsys)
    assert says in line and "`" not in line and "(0, " not in line, line
    assert snapshot(workdir) == before


@pytest.mark.parametrize(
    "flags",
    [
        ["--length-schedule", "0:12,10:64"],
        ["--block-size", "128"],
        ["--block-size", "256", "--max-position-embeddings", "256", "--length-schedule", "0:64,10:256"],
    ],
)
@pytest.mark.parametrize("command", ["train", "compare"])
def test_schedules_and_block_sizes_within_a_presets_limits_reach_the_work(
    command, flags, models, workdir, capsys
):
    argv = [command, "--preset", "retrieval", "--output-dir", "out", "--report-to", "none", *flags]
    assert outcome(argv, capsys) == "reached"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_takes_block_sizes_up_to_its_own_context_and_names_it_beyond(preset, workdir, capsys):
    limit = PRESETS[preset].max_position_embeddings
    argv = ["train", "--preset", preset, "--output-dir", "out", "--report-to", "none", "--max-steps", "1"]
    if limit is None:  # the saved model admits the block size it was trained on, whatever it is
        assert outcome([*argv, "--block-size", str(2 * PRESETS[preset].block_size)], capsys) == "reached"
        return
    assert outcome([*argv, "--block-size", str(limit)], capsys) == "reached"
    line = refused([*argv, "--block-size", str(limit + 1)], capsys)
    assert f"--block-size {limit + 1}" in line and f"--max-position-embeddings {limit + 1} or more" in line, (
        line
    )
    wider = [*argv, "--block-size", str(limit + 1), "--max-position-embeddings", str(limit + 1)]
    assert outcome(wider, capsys) == "reached"


def prompt_of(tokens: int, folder: Path) -> str:
    """A prompt of exactly ``tokens`` tokens for the tokenizer in ``folder``."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    for words in range(1, 4 * tokens):
        text = " ".join(["the"] * words)
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) == tokens:
            return text
    raise AssertionError(f"no prompt of {tokens} tokens")


def test_generate_with_a_prompt_at_the_context_limit_says_how_long_the_prompt_may_be(models, workdir, capsys):
    model = str(models["diff"])
    full = prompt_of(CONTEXT, models["diff"])
    line = refused(["generate", model, "--prompt", full, "--max-new-tokens", "1"], capsys)
    assert (
        f"the prompt ({CONTEXT} tokens)" in line
        and f"shorten the prompt to at most {CONTEXT - 1} tokens" in line
    )
    assert "at most 0" not in line, line
    line = refused(["generate", model, "--prompt", full, "--max-new-tokens", "8"], capsys)
    assert f"at most {CONTEXT - 8} tokens (at most {CONTEXT - 1} with --max-new-tokens 1)" in line, line
    nearly = prompt_of(CONTEXT - 1, models["diff"])
    assert outcome(["generate", model, "--prompt", nearly, "--max-new-tokens", "1"], capsys) == "reached"
    line = refused(["generate", model, "--prompt", nearly, "--max-new-tokens", "2"], capsys)
    assert "lower --max-new-tokens to at most 1" in line, line


@pytest.mark.parametrize("option", [["--top-k", "5"], ["--top-p", "0.9"]])
def test_generate_refuses_sampling_options_that_greedy_decoding_would_ignore(option, models, workdir, capsys):
    argv = ["generate", str(models["diff"]), "--prompt", "the king", "--max-new-tokens", "8", *option]
    line = refused(argv, capsys)
    assert f"{option[0]} {option[1]}" in line and "--temperature" in line, line
    assert outcome([*argv, "--temperature", "1"], capsys) == "reached"


def test_convert_names_an_output_folder_that_is_a_file(models, workdir, capsys):
    line = refused(["convert", "--to-llama", str(models["softmax"]), "--output-dir", FILE], capsys)
    assert "is a file" in line and "already holds files" not in line, line


# Config values no model can have (refused by the config class), and values that disagree with the saved weights
# (refused by the strict loading): (field, value), for the tiny DIFF V1 (2 heads, 3 layers, hidden 32,
# intermediate 48) and softmax (4 heads) folders of the fixture. Values that change the function without changing
# a tensor (rope_style, the rotary base, lambda_init, causal) cannot be told from the weights.
OUT_OF_RANGE = [("vocab_size", 0), ("vocab_size", -1), ("vocab_size", "x"), ("hidden_size", 0),
                ("intermediate_size", 0), ("num_hidden_layers", 0), ("num_attention_heads", 0),
                ("num_key_value_heads", 0), ("num_key_value_heads", 3), ("map_dim", 0), ("attention", "bogus"),
                ("rope_style", "bogus"), ("subln", "bogus"), ("subln_eps", 0), ("subln_eps", "x"),
                ("lambda_init", "x"), ("lambda_std", -1), ("lambda_std", "x"), ("rms_norm_eps", 0),
                ("rms_norm_eps", -1e-5), ("rope_parameters", {"rope_type": "bogus"}), ("max_position_embeddings", 0),
                ("max_position_embeddings", -1), ("initializer_range", -1), ("causal", "x"),
                ("attention_backend", "bogus"), ("use_cache", "x"), ("tie_word_embeddings", "x"),
                ("pad_token_id", -1), ("eos_token_id", 10**6), ("bos_token_id", "x")]  # fmt: skip
OUT_OF_STEP = {
    "diff": [("vocab_size", 400), ("hidden_size", 64), ("intermediate_size", 64), ("num_hidden_layers", 2),
             ("num_hidden_layers", 4), ("num_attention_heads", 1), ("num_attention_heads", 4),
             ("num_key_value_heads", 1), ("map_dim", 16), ("map_layout", "whole"),
             ("lambda_mode", "token"), ("subln", "plain"), ("subln", "none"), ("tie_word_embeddings", True)],
    "softmax": [("vocab_size", 400), ("hidden_size", 64), ("intermediate_size", 64), ("num_hidden_layers", 2),
                ("num_hidden_layers", 4), ("num_key_value_heads", 2), ("attention", "diff"),
                ("output_gate", "elementwise"), ("tie_word_embeddings", True)],
}  # fmt: skip
# Every command that opens a model folder, by the kind it takes: its command line (FOLDER stands for the folder)
# and the stop the test lifts so that the folder is really opened.
OPENERS = {
    "diff": [
        (["eval", "mqar", "--model", "FOLDER"], "difftransformer.eval.common.load_model_and_tokenizer",
         load_model_and_tokenizer),
        (["generate", "FOLDER", "--prompt", "the king", "--max-new-tokens", "2"],
         "difftransformer.generate_cli.load_model", load_model),
        (["convert", "--to-diffllama", "FOLDER", "--output-dir", "converted"], "difftransformer.convert.cli._ours",
         convert_cli._ours),
        (["train", "--preset", "micro", "--output-dir", "run", "--report-to", "none", "--init-from", "FOLDER"],
         "difftransformer.train.cli.initial_model", initial_model),
    ],
    "softmax": [
        (["convert", "--to-llama", "FOLDER", "--output-dir", "converted"], "difftransformer.convert.cli._ours",
         convert_cli._ours),
        (["convert", "--from-llama", "FOLDER", "--attention", "diff_v2", "--output-dir", "upcycled"],
         "difftransformer.convert.cli.load_softmax", load_softmax),
        (["train", "--preset", "micro", "--output-dir", "run", "--report-to", "none", "--init-from", "FOLDER",
          "--attention", "diff"], "difftransformer.train.cli.initial_model", initial_model),
    ],
}  # fmt: skip
MUTATED = [
    (kind, opener, field, value)
    for kind in OPENERS
    for opener in range(len(OPENERS[kind]))
    for field, value in [*OUT_OF_RANGE, *OUT_OF_STEP[kind]]
]


@pytest.fixture(scope="module")
def mutated_folders(models, tmp_path_factory) -> dict[tuple[str, str, str], Path]:
    """A copy of each fixture folder with one config.json field set to each value of OUT_OF_RANGE and OUT_OF_STEP."""
    folders = {}
    for kind in OPENERS:
        for field, value in [*OUT_OF_RANGE, *OUT_OF_STEP[kind]]:
            folder = tmp_path_factory.mktemp(f"{kind}-{field}")
            shutil.copytree(models[kind], folder, dirs_exist_ok=True)
            config = json.loads((folder / "config.json").read_text())
            config[field] = value
            (folder / "config.json").write_text(json.dumps(config))
            folders[kind, field, repr(value)] = folder
    return folders


@pytest.mark.parametrize(
    ("kind", "opener", "field", "value"),
    MUTATED,
    ids=[f"{k}-{' '.join(OPENERS[k][o][0][:2])}-{f}={v!r}" for k, o, f, v in MUTATED],
)
def test_a_folder_whose_config_was_edited_out_of_range_or_out_of_step_is_refused_by_every_command(
    kind, opener, field, value, mutated_folders, workdir, monkeypatch, capsys
):
    argv, stop, real = OPENERS[kind][opener]
    folder = str(mutated_folders[kind, field, repr(value)])
    monkeypatch.setattr(stop, real)  # the folder is really opened
    before = snapshot(workdir)
    capsys.readouterr()
    assert cli.main([folder if word == "FOLDER" else word for word in argv]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith("Loading weights")]
    assert "Traceback" not in err and len(lines) == 1, err  # transformers' loading table is not shown either
    assert lines[0].startswith(f"difftransformer {argv[0]}: error: ") and "cannot load the" in lines[0], lines
    assert snapshot(workdir) == before  # nothing converted, trained or evaluated
