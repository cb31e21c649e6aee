"""The mqar task across sequence lengths: a grid of lengths by pair counts scored on an oracle, cells that cannot
hold their pairs listed as skipped, the attention allocation read at every length, and what compare's report makes
of it."""

from __future__ import annotations

import pytest
import torch

from difftransformer.cli import main
from difftransformer.compare.suite_report import plot_task, task_table
from difftransformer.data.mqar import mqar_vocabulary
from difftransformer.eval import mqar, suite
from difftransformer.storage import read_json
from test_eval import RecallOracle, char_tokenizer  # noqa: F401  (a fixture: one token per character)
from test_eval_smoke import checkpoints  # noqa: F401  (the module-scoped tiny checkpoints, 256 positions)

TEXTS = ["held-out text the suite counts tokens of"]
GRID = dict(lengths=[16, 32, 64], num_pairs=[2, 4, 8, 16], sequences=3, batch_size=2)


def test_a_grid_scores_every_cell_that_holds_its_pairs_and_lists_the_others(tmp_path):
    options = mqar.MqarOptions(**GRID, allocation=0)
    right = mqar.run_mqar(RecallOracle(500), None, options, output_dir=tmp_path, progress=False)
    scored = [(r["tokens"], r["num_pairs"]) for r in right["rows"]]
    # 4 tokens a pair with every key queried: 16 tokens hold 4 pairs, 32 hold 8, 64 hold 16.
    assert scored == [(16, 2), (16, 4), (32, 2), (32, 4), (32, 8), (64, 2), (64, 4), (64, 8), (64, 16)]
    assert all(r["accuracy"] == 1.0 for r in right["rows"])
    assert [(s["tokens"], s["num_pairs"]) for s in right["skipped"]] == [(16, 8), (16, 16), (32, 16)]
    assert right["skipped"][0]["reason"] == "8 pairs and 8 queries need 32 tokens"
    assert read_json(tmp_path / "mqar.json")["skipped"] == right["skipped"]
    assert (tmp_path / "mqar.png").stat().st_size > 0
    wrong = mqar.run_mqar(RecallOracle(500, wrong=True), None, options, progress=False)
    assert [r["accuracy"] for r in wrong["rows"]] == [0.0] * len(scored)


def test_each_cell_draws_its_own_sequences():
    """A cell's score does not depend on the other cells asked for (its generator is its own)."""

    class HalfOracle(RecallOracle):  # recalls only keys with an even id: accuracy depends on the draws
        def forward(self, input_ids, **kwargs):
            out = super().forward(input_ids)
            out.logits[(input_ids % 2 == 1)] = 0.0
            return out

    grid = mqar.run_mqar(HalfOracle(500), None, mqar.MqarOptions(**GRID, allocation=0), progress=False)
    alone = mqar.run_mqar(
        HalfOracle(500), None, mqar.MqarOptions(lengths=[64], num_pairs=[8], sequences=3, allocation=0),
        progress=False,
    )  # fmt: skip
    cell = next(r for r in grid["rows"] if (r["tokens"], r["num_pairs"]) == (64, 8))
    assert cell["accuracy"] == pytest.approx(alone["rows"][0]["accuracy"]) and 0.0 < cell["accuracy"] < 1.0


def test_allocation_is_read_at_every_length_at_the_fewest_pairs_it_holds(monkeypatch):
    """Planted maps: every query puts 0.5 on its pair, 0.3 on another pair's key and 0.2 on itself."""
    filler = mqar_vocabulary(500).filler

    def planted(model, input_ids):
        batch, length = input_ids.shape
        maps = torch.zeros(batch, 2, length, length)
        for row, ids in enumerate(input_ids.tolist()):
            keys: dict[int, int] = {}  # each key's first position: its pair in the block before any filler
            for p in range(0, ids.index(filler), 2):
                keys.setdefault(ids[p], p)
            for t in range(length):
                if ids[t] in keys and keys[ids[t]] < t:
                    pair = keys[ids[t]]
                    maps[row, :, t, pair : pair + 2] = 0.25
                    maps[row, :, t, 2 if pair == 0 else 0] = 0.3
                    maps[row, :, t, t] = 0.2
        return [maps, maps]

    monkeypatch.setattr(mqar, "attention_maps", planted)
    options = mqar.MqarOptions(lengths=[16, 64], num_pairs=[8, 4], sequences=2, allocation=3)
    shares = mqar.run_mqar(RecallOracle(500), None, options, progress=False)["allocation"]
    assert [(e["tokens"], e["num_pairs"]) for e in shares] == [(16, 4), (64, 4)]
    for entry in shares:
        assert entry["answer"] == pytest.approx(0.5) and entry["context"] == pytest.approx(0.3)
    # One length per pair count (no lengths): read once, at the fewest pairs, as before.
    default = mqar.run_mqar(
        RecallOracle(500), None, mqar.MqarOptions(num_pairs=[8, 4], sequences=2), progress=False
    )
    assert [(e["tokens"], e["num_pairs"]) for e in default["allocation"]] == [(16, 4)]
    assert [r["tokens"] for r in default["rows"]] == [32, 16]


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(lengths=[]), "`lengths` must hold at least one value"),
        (dict(lengths=[0, 64]), r"`lengths` must be >= 1; got \[0, 64\]"),
        (dict(lengths=[64, 64]), r"`lengths` must hold distinct values; got \[64, 64\]"),
        (dict(num_pairs=[4, 4]), r"`num_pairs` must hold distinct values"),
        (
            dict(lengths=[8, 12], num_pairs=[4, 8]),
            r"no length of `lengths` \[8, 12\] holds any of `num_pairs`",
        ),
    ],
)
def test_grid_options_are_refused_with_the_field_named(settings, message):
    with pytest.raises(ValueError, match=message):
        mqar.MqarOptions(**settings)


def test_pairs_the_vocabulary_cannot_hold_name_first_id_not_a_length():
    # 500 ids from first_id 310: keys 310-404, values 405-499, 95 of each.
    options = mqar.MqarOptions(num_pairs=[4, 128], first_id=310)
    with pytest.raises(
        ValueError, match=r"`num_pairs` 128 needs 128 distinct keys and values; ids from 310"
    ) as err:
        mqar.run_mqar(RecallOracle(500), None, options, progress=False)
    assert "None" not in str(err.value) and "`first_id`" in str(err.value)
    too_long = mqar.MqarOptions(lengths=[64, 8192], num_pairs=[4])
    with pytest.raises(
        ValueError, match="`lengths`: 8192 tokens exceeds the model's max_position_embeddings = 4096"
    ):
        mqar.run_mqar(RecallOracle(500), None, too_long, progress=False)


def test_the_suite_runs_a_grid_from_its_light_settings(char_tokenizer):  # noqa: F811
    tokenizer = char_tokenizer  # 257 ids, <eos> special: keys from 64
    grid = {"mqar": {"lengths": [64, 256], "num_pairs": [4, 64]}}
    settings = suite.SuiteSettings(tasks=("mqar",), context_length=128, seed=7, max_positions=256, light=grid)
    (options,) = suite.suite_options(settings, tokenizer, TEXTS).values()
    assert (options.lengths, options.num_pairs, options.seed) == ([64, 256], [4, 64], 7)
    beyond = suite.SuiteSettings(tasks=("mqar",), context_length=128, max_positions=128, light=grid)
    with pytest.raises(
        ValueError, match=r"`lengths` \[64, 256\] reach 256 tokens, beyond the models' max_position"
    ):
        suite.suite_options(beyond, tokenizer, TEXTS)
    many = suite.SuiteSettings(
        tasks=("mqar",), context_length=128, light={"mqar": {"lengths": [128], "num_pairs": [4, 128]}}
    )
    with pytest.raises(
        ValueError, match="`num_pairs` 128 needs 128 distinct keys and values; ids from 64 of the model's 257"
    ):
        suite.suite_options(many, tokenizer, TEXTS)
    # Without lengths the light settings keep fitting the pair counts to the context, as before.
    (plain,) = suite.suite_options(
        suite.SuiteSettings(tasks=("mqar",), context_length=64), tokenizer, TEXTS
    ).values()
    assert (plain.lengths, plain.num_pairs) == (None, [4, 8, 16])


def grid_summary(level: float) -> dict:
    rows = [
        dict(num_pairs=n, num_queries=n, tokens=length, accuracy=level / n)
        for length in (16, 64)
        for n in (2, 4, 16)
        if 4 * n <= length
    ]
    shares = [dict(tokens=length, num_pairs=2, answer=level / 2, context=1 - level) for length in (16, 64)]
    return mqar.TASK.summarise(
        dict(task="mqar", sequences=64, lengths=[16, 64], rows=rows, skipped=[], allocation=shares)
    )


def test_the_grid_summary_table_chart_and_measures_agree():
    summary = grid_summary(0.9)
    assert summary["by_length"] == {
        "16": {"2": 0.45, "4": 0.225},
        "64": {"2": 0.45, "4": 0.225, "16": 0.05625},
    }
    headers = [c.header for c in mqar.TASK.columns(summary)]
    chart = mqar.TASK.chart(summary)
    for panel in chart.panels:  # every panel's columns are table columns, one x label each
        assert set(panel.columns) <= set(headers) and len(panel.xticks) == len(panel.columns)
    assert [p.ylabel for p in chart.panels][:3] == ["recall accuracy, 2 pairs", "recall accuracy, 4 pairs",
                                                     "recall accuracy, 16 pairs"]  # fmt: skip
    assert chart.panels[2].xticks == ["64"]  # 16 pairs only fit 64 tokens
    measures = {m.name: m for m in mqar.TASK.measures(summary)}
    assert len(measures) == len(mqar.TASK.measures(summary))  # distinct names
    claims = [m for m in measures.values() if m.paper]
    assert [m.name for m in claims] == [
        "MQAR accuracy at 16 tokens (2-4 key-value pairs, averaged)",
        "attention on the queried pair (MQAR, 16 tokens, 2 pairs)",
        "attention on the rest of the context (MQAR, 16 tokens, 2 pairs)",
        "MQAR accuracy at 64 tokens (2-16 key-value pairs, averaged)",
        "attention on the queried pair (MQAR, 64 tokens, 2 pairs)",
        "attention on the rest of the context (MQAR, 64 tokens, 2 pairs)",
    ]
    at_64 = measures["MQAR accuracy at 64 tokens (2-16 key-value pairs, averaged)"]
    assert at_64.value(summary) == pytest.approx((0.45 + 0.225 + 0.05625) / 3)
    assert measures["MQAR accuracy, 16 key-value pairs at 64 tokens"].at_chance(grid_summary(0.5))
    assert not measures["MQAR accuracy, 2 key-value pairs at 16 tokens"].at_chance(summary)


def test_compare_draws_the_grid_per_pair_count_with_seed_spreads(tmp_path):
    def run(level: float) -> dict:
        return {"summary": {"mqar": grid_summary(level)}, "options": {"mqar": {}}}

    groups = [("DIFF", [run(0.9), run(0.7)]), ("Transformer", [run(0.5), run(0.6)])]
    header, rows = task_table("mqar", groups)
    assert header[1:4] == ["16 tokens, 2 pairs", "16 tokens, 4 pairs", "64 tokens, 2 pairs"]
    assert rows[0][1] == "0.40 ± 0.07"  # 0.45 and 0.35
    plot_task("mqar", groups, tmp_path / "suite_mqar.png")  # 5 panels: wrapped, each with its own x labels
    assert (tmp_path / "suite_mqar.png").stat().st_size > 0


def test_the_eval_command_runs_a_grid_and_refuses_lengths_beyond_the_model(checkpoints, tmp_path, capsys):  # noqa: F811
    paths, _ = checkpoints
    base = ["eval", "mqar", "--model", str(paths["difftransformer"]), "--no-progress", "--sequences", "2"]
    argv = [
        *base,
        "--output-dir",
        str(tmp_path),
        "--lengths",
        "32,128",
        "--num-pairs",
        "4,16",
        "--allocation",
        "2",
    ]
    assert main(argv) == 0
    results = read_json(tmp_path / "mqar.json")
    assert [(r["tokens"], r["num_pairs"]) for r in results["rows"]] == [(32, 4), (128, 4), (128, 16)]
    assert results["skipped"] == [
        dict(tokens=32, num_pairs=16, reason="16 pairs and 16 queries need 64 tokens")
    ]
    assert [(e["tokens"], e["num_pairs"]) for e in results["allocation"]] == [(32, 4), (128, 4)]
    for entry in results["allocation"]:  # a DIFF map's shares, signed, of its absolute mass
        assert (
            -1 <= entry["context"] <= 1 and -1 <= entry["answer"] <= 1 and entry["answer"] != entry["context"]
        )
    capsys.readouterr()
    assert main([*base, "--output-dir", str(tmp_path / "long"), "--lengths", "64,512"]) == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert error.endswith("error: --lengths: 512 tokens exceeds the model's max_position_embeddings = 256; choose a shorter "
                          "length or a model trained (or extended) for longer contexts")  # fmt: skip
    assert not (tmp_path / "long").exists()


class SmallVocabulary:
    """A stand-in tokenizer of 80 ids (keys from 20: 30 keys and 30 values) that the suite can count text with."""

    all_special_ids: list[int] = []
    eos_token_id = None

    def __len__(self) -> int:
        return 80

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[1, 2, 3] for _ in texts]}


def test_the_light_pair_counts_are_fitted_before_the_vocabulary_is_asked_for_them():
    small = SmallVocabulary()
    plain = suite.SuiteSettings(tasks=("mqar",), context_length=64)
    (options,) = suite.suite_options(plain, small, TEXTS).values()
    assert options.num_pairs == [
        4,
        8,
        16,
    ]  # 64 pairs (the light default's largest) do not fit 64 tokens anyway
    longer = suite.SuiteSettings(
        tasks=("mqar",), context_length=256
    )  # 32 and 64 pairs fit: 30 keys do not hold them
    with pytest.raises(
        ValueError, match="`num_pairs` 64 needs 64 distinct keys and values; ids from 20 of the model's 80"
    ):
        suite.suite_options(longer, small, TEXTS)
