"""`compare` end to end on the micro preset with synthetic text, its evaluation suite and report, and the scaling
fit."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from difftransformer.cli import main
from difftransformer.compare import cli as compare_cli
from difftransformer.compare.comparison import run_comparison
from difftransformer.compare.report.document import Report
from difftransformer.compare.report.scaling import fit_power_law, matching_ratio
from difftransformer.compare.report.suite import suite_sections, task_table
from difftransformer.eval import suite
from difftransformer.eval.registry import TASKS, get_task, parse_tasks
from difftransformer.models import DiffTransformerForCausalLM
from difftransformer.train.cli import resolved_preset, training_options
from difftransformer.train.mixture import RecallMix
from difftransformer.train.pipeline import PreparedData
from difftransformer.train.presets import get_preset
from test_train_support import pack, small_tokenizer, synthetic_texts

PNG = b"\x89PNG\r\n\x1a\n"


def micro_data(block_size: int) -> PreparedData:
    texts = synthetic_texts(count=80)
    tokenizer = small_tokenizer(texts, vocab_size=400)
    train = pack(texts[:60], tokenizer, block_size)
    return PreparedData(
        tokenizer=tokenizer,
        train_blocks=train,
        validation_blocks=pack(texts[60:70], tokenizer, block_size),
        test_blocks=pack(texts[70:], tokenizer, block_size),
        test_texts=texts[70:],
        corpus_name="synthetic",
        recall=RecallMix(needle_fraction=0.1),
    )


def compare_args(tmp_path, **overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    compare_cli.configure(parser)
    args = parser.parse_args(
        ["--preset", "micro", "--output-dir", str(tmp_path), "--needle-samples", "1", "--report-to", "none"]
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def compare(data: PreparedData, args: argparse.Namespace):
    return run_comparison(
        data, resolved_preset(args), compare_cli.comparison_settings(args), training_options(args)
    )


@pytest.mark.slow
def test_compare_writes_report_and_plots(tmp_path):
    preset = get_preset("micro")
    data = micro_data(preset.block_size)
    args = compare_args(tmp_path, seeds=[0, 1], max_steps=3, needles=[(1, 1), (2, 1)])
    markdown = compare(data, args)
    assert markdown == tmp_path / "report.md"
    text = markdown.read_text()
    for needle in ("DIFF", "Transformer", "test perplexity", "loss_curves.png", " ± ", "| N:R=2:1 |"):
        assert needle in text, needle
    # A section, a table and a plot per task of the suite, and a verdict sentence on each task's measures.
    sections = text.split("\n## ")
    for task in TASKS:
        section = next((s for s in sections if s.split("\n")[0].endswith(f"({task})")), None)
        assert section is not None, task
        assert "| DIFF |" in section and "| Transformer |" in section and f"suite_{task}.png" in section, task
        assert (tmp_path / f"suite_{task}.png").read_bytes()[:8] == PNG, task
    for measure in ("(test loss): DIFF", "retrieval accuracy", "noise", "top-1/median", "4-bit", "mean NLL",
                    "order spread", "MQAR accuracy"):  # fmt: skip
        assert measure.lower() in text.split("## Evaluation suite")[0].lower(), measure
    assert "<table>" in (tmp_path / "report.html").read_text()
    assert (tmp_path / "loss_curves.png").read_bytes()[:8] == PNG
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    for run in runs:
        assert list(run["suite"]["summary"]) == list(TASKS)
        needle = run["suite"]["summary"]["needle"]
        assert list(needle) == ["1:1", "2:1", "intervals"]  # each accuracy's 95% sampling interval beside it
        assert all(low <= needle[config] <= high for config, (low, high) in needle["intervals"].items())
        assert json.loads((tmp_path / "runs" / f"micro-{run['variant']}-seed{run['seed']}" / "evaluation.json")
                          .read_text())["suite"] == run["suite"]  # fmt: skip
    assert sorted((r["variant"], r["seed"]) for r in runs) == [
        ("diff", 0),
        ("diff", 1),
        ("softmax", 0),
        ("softmax", 1),
    ]
    diff, base = (next(r for r in runs if r["variant"] == v and r["seed"] == 0) for v in ("diff", "softmax"))
    # Matched baseline: same size up to DIFF's lambda vectors and per-head norm gains.
    assert 0 < diff["parameters"] - base["parameters"] < 0.02 * base["parameters"]
    # A second call reuses the finished runs and their evaluations instead of training and evaluating again;
    # only the task whose settings changed is run again.
    run0 = tmp_path / "runs" / "micro-diff-seed0"
    before = [(run0 / name).stat().st_mtime_ns for name in ("train_summary.json", "eval/icl/icl.json")]
    args.needle_samples = 2
    compare(data, args)
    assert [
        (run0 / name).stat().st_mtime_ns for name in ("train_summary.json", "eval/icl/icl.json")
    ] == before
    needle = json.loads((run0 / "eval" / "needle" / "needle.json").read_text())
    assert needle["samples"] == 2


def micro_model(attention: str, tokenizer) -> DiffTransformerForCausalLM:
    config = get_preset("micro").model_config(
        attention, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id
    )
    return DiffTransformerForCausalLM(config).eval()


def light(light: dict | None = None, **fields) -> suite.SuiteSettings:
    """The micro preset's suite with fewer needle samples, so that the test takes seconds; ``light`` adds
    overrides of the tasks' light settings."""
    preset = get_preset("micro")
    overrides = {"needle": {"samples": 1}, "quant": {"samples": 1}, **(light or {})}
    fields = {"context_length": preset.block_size, **fields}
    return suite.SuiteSettings(needle=preset.needle, needles=((1, 1), (2, 2)), light=overrides, **fields)


def test_suite_runs_every_task_with_numbers_in_range(tmp_path):
    texts = synthetic_texts(count=80)
    tokenizer = small_tokenizer(texts, vocab_size=400)
    model = micro_model("diff", tokenizer)
    result = suite.run_suite(model, tokenizer, texts[70:], light(), tmp_path, progress=False)
    assert list(result["summary"]) == list(TASKS) and list(result["seconds"]) == list(TASKS)
    assert all(seconds > 0 for seconds in result["seconds"].values())
    for task in TASKS:
        assert (tmp_path / task / f"{task}.json").is_file(), task
    s = result["summary"]
    needle = {config: v for config, v in s["needle"].items() if config != "intervals"}
    assert list(needle) == ["1:1", "2:2"] and all(0 <= v <= 1 for v in needle.values())
    # Every accuracy and share a measure reads carries its 95% sampling interval, around the value.
    with_interval = 0
    for task in TASKS:
        for measure in get_task(task).measures(s[task]):
            value, interval = measure.value(s[task]), measure.interval and measure.interval(s[task])
            if interval is not None:
                assert (
                    interval[0] - 1e-9 <= value <= interval[1] + 1e-9
                    and interval[0] < interval[1]
                    or (interval[0] == interval[1] == value)
                ), (task, measure.name, value, interval)
                with_interval += 1
    assert with_interval >= 10
    # An untrained model spreads attention: the 200-token haystack outweighs the one needle.
    assert 0 < s["attention"]["answer"] < s["attention"]["context"] <= 1
    for key in ("attention_logits", "hidden_states"):
        stats = s["outliers"][key]
        assert stats["top1"] > stats["median"] > 0
        assert stats["ratio"] == pytest.approx(stats["top1"] / stats["median"])
    assert list(s["quant"]) == ["unquantised", "16", "8", "6", "4"]
    # 16-bit logits are nearly lossless; every loss is near log(vocabulary) for an untrained model.
    assert s["quant"]["16"]["loss"] == pytest.approx(s["quant"]["unquantised"]["loss"], abs=1e-3)
    assert all(4 < row["loss"] < 8 and 0 <= row["needle_accuracy"] <= 1 for row in s["quant"].values())
    assert all(0 <= row["mqar_accuracy"] <= 1 for row in s["quant"].values())
    assert list(s["longctx"]["cumulative_nll"]) == ["1", "4", "16", "64", "255"]
    assert s["longctx"]["cumulative_nll"]["255"] == pytest.approx(s["longctx"]["mean_nll"])
    assert 4 < s["longctx"]["mean_nll"] < 8
    # The micro tokenizer spends many tokens per demonstration: only up to two fit 256 tokens.
    assert list(s["icl"]["accuracy"]) == ["0", "1", "2"] and set(s["icl"]["spread"]) == {"random", "grouped"}
    assert all(0 <= v <= 1 for v in [*s["icl"]["accuracy"].values(), *s["icl"]["spread"].values()])
    assert result["options"]["icl"]["test_size"] == 20
    assert all(v * 20 == pytest.approx(round(v * 20)) for v in s["icl"]["accuracy"].values())
    accuracy = s["mqar"]["accuracy"]
    assert list(accuracy) == ["4", "8", "16", "32", "64"] and all(0 <= v <= 1 for v in accuracy.values())
    assert -1 <= s["mqar"]["answer_share"] <= 1 and -1 <= s["mqar"]["context_share"] <= 1
    # The test split holds about 2,000 tokens: longctx gets the 7 whole windows there are, not the 8 asked for.
    assert result["options"]["longctx"]["num_sequences"] == 7

    # Unchanged options reuse the earlier numbers; a changed one reruns only its task.
    ran = []
    real = suite.run_task

    def counting(task, *args, **kwargs):
        ran.append(task)
        return real(task, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(suite, "run_task", counting)
        again = suite.run_suite(
            model, tokenizer, texts[70:], light({"mqar": {"sequences": 4}}), tmp_path, previous=result
        )
    assert ran == ["mqar"]
    assert {t: again["summary"][t] for t in TASKS if t != "mqar"} == {
        t: result["summary"][t] for t in TASKS if t != "mqar"
    }
    assert again["options"]["mqar"]["sequences"] == 4


def test_suite_refuses_bad_tasks_and_short_text():
    assert parse_tasks(" mqar,needle ") == ("needle", "mqar")
    for text, problem in (("needle,bogus", "unknown bogus"), ("needle,needle", "repeated"), ("", "empty")):
        with pytest.raises(ValueError, match="`tasks` must be distinct") as err:
            parse_tasks(text)
        assert problem in str(
            err.value
        ) and "needle, attention, outliers, quant, lowbit, longctx, icl, mqar" in str(err.value)
    with pytest.raises(ValueError, match="`samples` must be >= 1; got 0"):
        suite.SuiteSettings(light={"needle": {"samples": 0}})
    texts = synthetic_texts(count=12)
    tokenizer = small_tokenizer(texts, vocab_size=400)
    short = [texts[0][:200]]
    with pytest.raises(
        ValueError, match=r"give \d+ tokens; needle needs at least one window of `context_length` 256"
    ):
        suite.suite_options(light(), tokenizer, short)
    # Tasks that read no held-out text do not need any.
    assert list(suite.suite_options(light(tasks=("icl", "mqar")), tokenizer, short)) == ["icl", "mqar"]
    # A block too short for needles: asked for, refused; not asked for (compare's default), left out with why.
    texts = synthetic_texts(count=80)
    with pytest.raises(ValueError, match=r"`needles` 1:1 needs about \d+ tokens .* context length 48"):
        suite.suite_options(light(tasks=("needle", "mqar"), context_length=48), tokenizer, texts)
    skipped = {}
    options = suite.suite_options(light(context_length=48), tokenizer, texts, skipped)
    assert {"needle", "attention"} <= set(skipped) and "context length 48" in skipped["needle"]
    assert {"mqar", "quant", "outliers", "longctx"} <= set(options) and not set(options) & set(skipped)
    assert options["quant"].needle is False and options["quant"].mqar_pairs == 4  # its needle check left out


def test_compare_flags_are_checked_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--tasks", "needle,bogus", "--output-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --tasks" in err and "got 'needle,bogus' (unknown bogus)" in err and "mqar" in err
    assert main(["compare", "--needle-samples", "0", "--output-dir", str(tmp_path)]) == 2
    assert (
        "--needle-samples must be >= 1 (leave needle out of --tasks to skip it); got 0"
        in capsys.readouterr().err
    )
    assert not any(tmp_path.iterdir())


def planted_suite(level: float) -> dict:
    """A suite result whose every number is ``level`` times a known constant."""
    summary = {
        "needle": {"1:1": level, "4:2": level / 5},
        "attention": {"answer": level / 4, "context": 1 - level},
        "outliers": {
            "attention_logits": {"top1": 10 * level, "median": 0.5, "ratio": 20 * level},
            "hidden_states": {"top1": 30 * level, "median": 1.5, "ratio": 20 * level},
        },
        "quant": {
            k: {"loss": 3 + level, "needle_accuracy": level, "mqar_accuracy": level / 2}
            for k in ("unquantised", "16", "8", "6", "4")
        },
        "longctx": {
            "mean_nll": 4 + level,
            "cumulative_nll": {"1": 6 + level, "4": 5 + level, "16": 4 + level},
        },
        "icl": {
            "accuracy": {"0": level / 2, "2": level},
            "spread": {"random": level / 10, "grouped": 3 * level / 10},
            "chance": 0.2,
        },
        "mqar": {
            "accuracy": {"4": level, "8": level / 5},
            "answer_share": level / 2,
            "context_share": 1 - level,
        },
    }
    options = {
        "needle": {"needle_digits": 3, "context_lengths": [256], "samples": 4, "depths": [0.0, 1.0]},
        "attention": {
            "needles": ["4:1"],
            "context_lengths": [256],
            "samples": 2,
            "depths": [0.5],
        },
        "outliers": {"tokens": 1024, "length": 256},
        "quant": {"num_sequences": 4, "length": 256, "samples": 2, "bits": [16, 8, 6, 4], "mqar_pairs": 4},
        "longctx": {"num_sequences": 8, "length": 256},
        "icl": {"test_size": 16, "shots": [0, 2], "orderings": 3},
        "mqar": {"sequences": 16},
    }
    return {"summary": summary, "options": options, "seconds": {task: 1.0 for task in summary}}


def test_report_tables_carry_each_tasks_numbers(tmp_path):
    # DIFF's two seeds at levels 0.2 and 0.4 (mean 0.3, sample spread 0.141); the Transformer at 0.8.
    groups = [("DIFF", [planted_suite(0.2), planted_suite(0.4)]), ("Transformer", [planted_suite(0.8)])]
    expected = {
        "needle": (["N:R=1:1", "N:R=4:2"], ["0.30 ± 0.14", "0.06 ± 0.03"], ["0.80", "0.16"]),
        "attention": (["answer share", "context share (noise)"], ["0.075 ± 0.035", "0.700 ± 0.141"],
                      ["0.200", "0.200"]),
        "outliers": (["logits top-1", "logits median", "logits top-1/median", "hidden states top-1"],
                     ["3.00 ± 1.41", "0.500 ± 0.000", "6.0 ± 2.8", "9.00 ± 4.24"], ["8.00", "0.500", "16.0", "24.00"]),
        "quant": (["loss full", "loss 4-bit", "needle 4-bit", "mqar 6-bit"],
                  ["3.300 ± 0.141", "3.300 ± 0.141", "0.30 ± 0.14", "0.15 ± 0.07"], ["3.800", "3.800", "0.80", "0.40"]),
        "longctx": (["mean NLL", "cumulative NLL to 1", "cumulative NLL to 4"],
                    ["4.300 ± 0.141", "6.300 ± 0.141", "5.300 ± 0.141"], ["4.800", "6.800", "5.800"]),
        "icl": (["0-shot", "2-shot", "order spread (random)", "order spread (grouped)"],
                ["0.15 ± 0.07", "0.30 ± 0.14", "0.03 ± 0.01", "0.09 ± 0.04"], ["0.40", "0.80", "0.08", "0.24"]),
        "mqar": (["4 pairs", "8 pairs", "attention on the pair", "attention on the rest"],
                 ["0.30 ± 0.14", "0.06 ± 0.03", "0.150 ± 0.071", "0.700 ± 0.141"], ["0.80", "0.16", "0.400", "0.200"]),
    }  # fmt: skip
    for task, (columns, diff_cells, base_cells) in expected.items():
        header, rows = task_table(task, groups)
        assert rows[0][0] == "DIFF" and rows[1][0] == "Transformer"
        for column, diff_cell, base_cell in zip(columns, diff_cells, base_cells):
            index = header.index(column)
            assert (rows[0][index], rows[1][index]) == (diff_cell, base_cell), (task, column)
    report = Report("planted")
    suite_sections(report, groups, tmp_path)
    text = report.markdown()
    assert "| variant | N:R=1:1 | N:R=4:2 |" in text and "| DIFF | 0.30 ± 0.14 | 0.06 ± 0.03 |" in text
    for task in expected:
        assert (tmp_path / f"suite_{task}.png").read_bytes()[:8] == PNG


@pytest.mark.slow
def test_compare_over_sizes_fits_scaling(tmp_path):
    preset = get_preset("micro")
    data = micro_data(preset.block_size)
    args = compare_args(tmp_path, sizes=[16, 32, 48], max_steps=2, tasks=("mqar",))
    text = compare(data, args).read_text()
    assert (
        "Scaling with parameters" in text
        and "Transformer's loss with this share of the parameters in the decoder layers: DIFF" in text
    )
    assert "| parameters in the decoder layers DIFF needs for the baseline's loss" in text
    # The fits' x: each run's parameters in its decoder layers, the embeddings, final norm and head left out.
    for record in json.loads((tmp_path / "results.json").read_text())["runs"]:
        model = DiffTransformerForCausalLM.from_pretrained(tmp_path / record["folder"])  # relative
        outside = sum(p.numel() for name, p in model.named_parameters() if ".layers." not in name)
        assert record["layer_parameters"] == record["parameters"] - outside > 0
    # The suite's rows are per variant and scale.
    mqar = text.split("(mqar)")[1]
    assert all(f"| {label} d{width} |" in mqar for label in ("DIFF", "Transformer") for width in (16, 32, 48))
    assert (tmp_path / "scaling_parameters.png").is_file()


def test_power_law_fit_recovers_a_known_law():
    x = np.array([1e6, 3e6, 1e7, 3e7, 1e8])
    rng = np.random.default_rng(0)
    loss = 12.0 * x**-0.07 * np.exp(rng.normal(0, 1e-4, x.shape))
    fit = fit_power_law(x, loss)
    assert fit.coefficient == pytest.approx(12.0, rel=2e-2) and fit.exponent == pytest.approx(-0.07, abs=1e-3)
    better = fit_power_law(x, 0.95 * 12.0 * x**-0.07)
    # 5% lower loss everywhere: DIFF needs 0.95^(1/0.07) of the parameters.
    assert matching_ratio(better, fit, 1e8) == pytest.approx(0.95 ** (1 / 0.07), rel=2e-2)
    with pytest.raises(ValueError, match="two distinct"):
        fit_power_law([1.0, 1.0], [2.0, 3.0])
