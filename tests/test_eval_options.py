"""A task's options declared once (flags generated from its dataclass), and defaults fitted to the model."""

from __future__ import annotations

import argparse

import pytest

from difftransformer.cli import main
from difftransformer.data.needles import NeedleSpec
from difftransformer.eval import attention, icl, longctx, mqar, needle, outliers, quant
from difftransformer.eval.hallucination import HallucinationOptions
from difftransformer.eval.haystack import needle_tokens
from difftransformer.eval.registry import TASKS
from difftransformer.flags import add_flags, given
from difftransformer.storage import read_json
from test_eval import char_tokenizer  # noqa: F401  (a fixture: one token per character)
from test_eval_smoke import checkpoints  # noqa: F401  (the module-scoped tiny checkpoints, 256 positions)


def parse(options_type: type, *argv: str) -> dict:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_flags(parser, options_type, exclude=("seed",), only_given=True, list_items=True)
    return given(vars(parser.parse_args(list(argv))), options_type)


def test_mqar_options_round_trip_through_their_flags():
    parser = argparse.ArgumentParser()
    add_flags(parser, mqar.MqarOptions, exclude=("seed",), only_given=True, list_items=True)
    flags = {s for action in parser._actions for s in action.option_strings}
    assert {"--num-pairs", "--num-queries", "--sequences", "--batch-size", "--first-id"} <= flags
    assert "--seed" not in flags  # the eval command's shared --seed sets it
    assert "(default: [4, 8, 16, 32, 64])" in parser.format_help().replace("\n", " ").replace("  ", " ")
    assert parse(mqar.MqarOptions) == {} and mqar.MqarOptions(**parse(mqar.MqarOptions)) == mqar.MqarOptions()
    given = parse(mqar.MqarOptions, "--num-pairs", "2,4", "8", "--sequences", "3", "--first-id", "10")
    assert given == {"num_pairs": [2, 4, 8], "sequences": 3, "first_id": 10}
    options = mqar.MqarOptions(**given)
    assert (options.num_pairs, options.sequences, options.first_id, options.batch_size) == (
        [2, 4, 8],
        3,
        10,
        16,
    )
    with pytest.raises(ValueError, match="`sequences` must be >= 1; got 0"):
        mqar.MqarOptions(**parse(mqar.MqarOptions, "--sequences", "0"))
    with pytest.raises(ValueError, match=r"`num_pairs` must be >= 1; got \[4, 0\]"):
        mqar.MqarOptions(**parse(mqar.MqarOptions, "--num-pairs", "4,0"))


def test_needle_options_check_their_flags_and_the_needle_spec_they_carry():
    assert parse(needle.NeedleOptions, "--needles", "1:1", "4:2", "--needle-digits", "3") == {
        "needles": ["1:1", "4:2"],
        "needle_digits": 3,
    }
    for settings, message in (
        ({"needles": ["2:3"]}, "1 <= R <= N"),
        ({"needles": ["99:1"]}, "`needles`: N=99 exceeds the 60 cities"),
        ({"needle_digits": 19}, r"`needle_digits` must lie in \[1, 18\]"),
        ({"samples": 10**7}, "`samples` must be <= 1000000"),
        ({"seed": -1}, r"`seed` must lie in \[0, 2\*\*32 - 1\]; got -1"),
        ({"seed": 2**32}, r"`seed` must lie in \[0, 2\*\*32 - 1\]; got 4294967296"),
        ({"depths": [0.5, 0.5]}, "`depths` must hold distinct values"),
        ({"depths": [1.5]}, r"`depths` must lie in \[0, 1\]"),
        ({"needle_template": "no fields"}, "`needle_template` must contain {city}"),
        ({"context_lengths": []}, "`context_lengths` must hold at least one value"),
    ):
        with pytest.raises(ValueError, match=message):
            needle.NeedleOptions(**settings)
    options = needle.NeedleOptions(needle_digits=3, needle_template="{city}: {number}.")
    assert options.needle_spec == NeedleSpec(3, "{city}: {number}.", NeedleSpec().question_template)


class Sized:
    """A stand-in model whose config admits 256 positions."""

    config = argparse.Namespace(max_position_embeddings=256)


def test_defaults_are_fitted_to_the_model_and_given_lengths_are_not(char_tokenizer):  # noqa: F811
    task, model = needle.TASK, Sized()
    options = needle.NeedleOptions(context_lengths=[128, 1024, 2048])
    fitted = task.fit(options, model, None, frozenset({"needles"}))
    assert fitted.context_lengths == [128, 256]
    given = needle.NeedleOptions(context_lengths=[1024])
    assert task.fit(given, model, None, frozenset({"context_lengths", "needles"})) is given
    # N:R pairs not given are kept where their needles and question fit the shortest length.
    tokens = {pairs: needle_tokens(char_tokenizer, *pairs, NeedleSpec()) for pairs in ((1, 1), (4, 2))}
    fitted = task.fit(
        needle.NeedleOptions(context_lengths=[tokens[1, 1]]), model, char_tokenizer, frozenset()
    )
    assert fitted.needles == ["1:1"] and tokens[4, 2] > tokens[1, 1]
    assert longctx.TASK.fit(longctx.LongctxOptions(), model, None, frozenset()).length == 256
    pairs = mqar.TASK.fit(mqar.MqarOptions(num_pairs=[4, 64, 128]), model, None, frozenset()).num_pairs
    assert pairs == [4, 64]  # 128 pairs and their queries are 512 tokens


def test_the_eval_command_prints_what_it_fitted_and_refuses_a_given_length(checkpoints, tmp_path, capsys):  # noqa: F811
    paths, text = checkpoints
    base = [
        "eval",
        "longctx",
        "--model",
        str(paths["difftransformer"]),
        "--text-file",
        str(text),
        "--no-progress",
    ]
    assert main([*base, "--output-dir", str(tmp_path), "--num-sequences", "2"]) == 0
    out = capsys.readouterr().out
    assert "defaults fitted to the model's max_position_embeddings = 256: --length 2048 -> 256" in out
    assert read_json(tmp_path / "longctx.json")["length"] == 256
    assert main([*base, "--output-dir", str(tmp_path / "given"), "--length", "1024"]) == 2
    captured = capsys.readouterr()
    assert "--length: 1024 tokens exceeds the model's max_position_embeddings = 256" in captured.err
    assert "fitted" not in captured.out


# --- every task with no flag on a model `train --preset micro` made


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("micro") / "run"
    argv = ["train", "--preset", "micro", "--max-steps", "3", "--report-to", "none", "--output-dir", str(run)]
    assert main(argv) == 0
    return run


# needle and quant decode many greedy answers; hallucination downloads BBC News (once).
QUICK_TASKS = ("attention", "outliers", "longctx", "icl", "mqar")


@pytest.mark.parametrize(
    "task", [t if t in QUICK_TASKS else pytest.param(t, marks=pytest.mark.slow) for t in TASKS]
)
def test_every_task_runs_with_no_flag_on_a_micro_run(micro_run, tmp_path, task, capsys):
    assert (
        main(["eval", task, "--model", str(micro_run), "--output-dir", str(tmp_path), "--no-progress"]) == 0
    )
    assert read_json(tmp_path / f"{task}.json")["task"] == task
    if task != "mqar":  # mqar's default sequences fit 256 tokens
        assert "defaults fitted to the model's max_position_embeddings = 256" in capsys.readouterr().out


@pytest.mark.parametrize(
    "options, settings, message",
    [
        (quant.QuantOptions, {"bits": [8, 65]}, r"`bits` must be <= 24; got \[8, 65\]"),
        (quant.QuantOptions, {"bits": [1]}, r"`bits` must be >= 2"),
        (quant.QuantOptions, {"bits": []}, "`bits` must hold at least one value"),
        (quant.QuantOptions, {"mqar_pairs": -1}, "`mqar_pairs` must be >= 0"),
        (longctx.LongctxOptions, {"length": 1}, "`length` must be >= 2"),
        (longctx.LongctxOptions, {"num_sequences": 10**12}, "`num_sequences` must be <= 1000000"),
        (outliers.OutliersOptions, {"tokens": 10**10}, "`tokens` must be <= 1000000000"),
        (outliers.OutliersOptions, {"length": 0, "tokens": 8}, "`length` must be >= 1"),
        (icl.IclOptions, {"shots": [4, 4]}, "`shots` must hold distinct values"),
        (icl.IclOptions, {"orderings": 0}, "`orderings` must be >= 1"),
        (icl.IclOptions, {"text_column": " "}, "`text_column` must name a column"),
        (
            icl.IclOptions,
            {"data_file": "/nonexistent/labels.csv"},
            "`data_file` '/nonexistent/labels.csv' does not",
        ),
        (mqar.MqarOptions, {"seed": 2**32}, r"`seed` must lie in \[0, 2\*\*32 - 1\]"),
        (mqar.MqarOptions, {"allocation": -1}, "`allocation` must be >= 0"),
        (attention.AttentionOptions, {"heatmap_head": -1}, "`heatmap_head` must be >= 0"),
        (
            attention.AttentionOptions,
            {"needles": ["1:1", "2:1"]},
            "attention takes exactly one `needles` value",
        ),
        (HallucinationOptions, {"qa_max_new_tokens": 0}, "`qa_max_new_tokens` must be >= 1"),
        (HallucinationOptions, {"fit_context": 10**9}, "`fit_context` must be <= 1000000"),
        (HallucinationOptions, {"distractors": [1, 1]}, "`distractors` must hold distinct values"),
    ],
)
def test_every_task_refuses_what_its_options_cannot_mean(options, settings, message):
    with pytest.raises(ValueError, match=message):
        options(**settings)


def test_the_command_refuses_bad_options_in_one_line_before_any_model(tmp_path, capsys):
    missing = str(tmp_path / "no-model")  # never read: the options are refused first
    for argv, message in (
        (["quant", "--bits", "65"], "--bits must be <= 24; got [65]"),
        (["mqar", "--seed", "-1"], "--seed must lie in [0, 2**32 - 1]; got -1"),
        (["needle", "--samples", "0"], "--samples must be >= 1; got 0"),
        (
            ["mqar", "--lengths", "8", "--num-pairs", "4"],
            "no length of --lengths [8] holds any of --num-pairs [4] with its queries (4 tokens a pair when every key is queried)",
        ),
    ):
        assert main(["eval", *argv, "--model", missing, "--output-dir", str(tmp_path / "out")]) == 2
        (error,) = capsys.readouterr().err.strip().splitlines()
        assert error.endswith(message), error
    assert not (tmp_path / "out").exists()
