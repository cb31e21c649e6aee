"""User errors and bugs stay apart: a :class:`UsageError` (bad input the user can fix) ends a command in one line with
exit 2; any other exception is a bug and leaves ``difftransformer.cli.main`` with its traceback."""

from __future__ import annotations

import pytest

from difftransformer.cli import main
from difftransformer.convert.folders import ConversionError
from difftransformer.data.corpus import CorpusError
from difftransformer.data.packages import PackageFetchError
from difftransformer.errors import MissingInputError, UsageError
from difftransformer.eval.registry import get_task
from difftransformer.eval.suite import SuiteSettings, suite_options
from difftransformer.train.lock import RunDirectoryLocked, RunDirectoryTaken


def convert_argv(tmp_path) -> list[str]:
    (tmp_path / "source").mkdir(exist_ok=True)
    return ["convert", "--to-llama", str(tmp_path / "source"), "--output-dir", str(tmp_path / "out")]


@pytest.mark.parametrize(
    "bug", [ValueError("an internal check fired"), KeyError("missing_key"), FileNotFoundError("internal.bin")]
)
def test_a_bug_in_a_command_keeps_its_traceback(bug, tmp_path, monkeypatch, capsys):
    def broken(source, output):
        raise bug

    monkeypatch.setattr("difftransformer.convert.cli.check_output", broken)
    with pytest.raises(type(bug)) as raised:
        main(convert_argv(tmp_path))
    assert raised.value is bug
    assert "error:" not in capsys.readouterr().err  # not reported as bad input


def test_a_usage_error_ends_the_command_in_one_line_with_exit_2(tmp_path, monkeypatch, capsys):
    def refuse(source, output):
        raise UsageError("--output-dir must be a new or empty folder; got taken")

    monkeypatch.setattr("difftransformer.convert.cli.check_output", refuse)
    capsys.readouterr()
    assert main(convert_argv(tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert err == "difftransformer convert: error: --output-dir must be a new or empty folder; got taken"


def test_a_missing_input_folder_is_a_one_line_refusal(tmp_path, capsys):
    capsys.readouterr()
    argv = ["convert", "--to-llama", str(tmp_path / "nowhere"), "--output-dir", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("difftransformer convert: error: ")
    assert "nowhere" in err and "Traceback" not in err


def test_missing_input_is_a_usage_error_and_a_file_not_found_error():
    err = MissingInputError("--model 'runs/x' does not exist")
    assert isinstance(err, UsageError) and isinstance(err, FileNotFoundError)
    assert isinstance(err, ValueError)  # callers that catch ValueError keep working
    assert str(err) == "--model 'runs/x' does not exist"


@pytest.mark.parametrize(
    "refusal", [ConversionError, CorpusError, PackageFetchError, RunDirectoryLocked, RunDirectoryTaken]
)
def test_the_refusals_of_each_package_are_usage_errors(refusal):
    assert issubclass(refusal, UsageError)


@pytest.mark.parametrize(
    "flags, message",
    [
        # The preset options' bounds, checked where the flags are read.
        (["--vocab-size", "0"], "--vocab-size must be at least 258; got 0"),
        (["--max-position-embeddings", "8"], "--max-position-embeddings must be at least --block-size (256)"),
    ],
)
def test_bad_train_flags_are_refused_in_one_line_before_any_work(flags, message, tmp_path, capsys):
    argv = ["train", "--output-dir", str(tmp_path / "run"), "--preset", "micro", *flags]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not (tmp_path / "run").exists()


class _Tokenizer:
    eos_token_id = 0

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [list(range(1, len(t.split()) + 1)) for t in texts]}


def test_a_task_that_breaks_is_not_left_out_as_if_its_settings_were_bad(monkeypatch):
    task = get_task("longctx")
    settings = SuiteSettings(tasks=("longctx",), context_length=8)
    texts = ["one two three four five six seven eight nine ten"] * 4

    def refused(light, suite):
        raise UsageError("longctx needs a longer context")

    monkeypatch.setattr(task, "light_options", refused)
    skipped: dict[str, str] = {}
    assert suite_options(settings, _Tokenizer(), texts, skipped) == {}
    assert skipped == {"longctx": "longctx needs a longer context"}

    def broken(light, suite):
        raise ValueError("an internal check fired")

    monkeypatch.setattr(task, "light_options", broken)
    with pytest.raises(ValueError, match="an internal check fired"):
        suite_options(settings, _Tokenizer(), texts, {})
