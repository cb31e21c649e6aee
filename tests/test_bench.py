"""The benchmark command's parts: timing, workloads, memory measurement, reports and the CLI end to end."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from difftransformer.bench import cli
from difftransformer.bench.check import CASES, check_backends
from difftransformer.bench.report import format_table, load_json, ratio_row
from difftransformer.bench.timing import interleaved_medians, interleaved_steps
from difftransformer.bench.workloads import (
    BenchShape,
    GreedyDecode,
    build_models,
    random_ids,
    step_peak_bytes,
)
from difftransformer.errors import UsageError
from difftransformer.storage import write_json

TINY = BenchShape(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=64, batch=2)


def test_interleaved_steps_takes_turns_step_by_step_and_drops_warmup():
    calls: list[str] = []
    contenders = {
        name: (lambda name=name: calls.append(f"{name}:setup"), lambda name=name: calls.append(name))
        for name in ("a", "b")
    }
    result = interleaved_steps(contenders, steps=3, repeats=2, warmup=1, device=torch.device("cpu"), desc="t")
    one_round = ["a:setup", "b:setup", "a", "b", "b", "a", "a", "b"]  # the order turns step by step
    assert calls == one_round * 3
    assert all(len(r["runs_s"]) == 2 and r["median_s"] >= 0 for r in result.values())
    with pytest.raises(ValueError, match="steps"):
        interleaved_steps(contenders, steps=0, repeats=5, warmup=0, device=torch.device("cpu"), desc="t")


def test_interleaved_medians_runs_each_contender_in_turn_in_a_rotating_order():
    calls = []
    result = interleaved_medians(
        {name: (lambda name=name: calls.append(name)) for name in "abc"},
        repeats=5,
        warmup=1,
        device=torch.device("cpu"),
        desc="t",
    )
    assert calls == list("abc") + [*"abc", *"bca", *"cab", *"abc", *"bca"]  # warm-up, then 5 rotating rounds
    assert len(result["a"]["runs_s"]) == 5 and result["a"]["median_s"] >= 0
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        interleaved_medians({}, repeats=0, warmup=0, device=torch.device("cpu"), desc="t")


def test_ratio_rows_express_diff_cost_and_targets():
    row = ratio_row("train", "T=512 B=4", "ms/step", dict(diff=130.0, baseline=100.0, diffllama=260.0))
    assert row["diff_over_baseline"] == pytest.approx(1.3) and row["diff_over_diffllama"] == pytest.approx(
        0.5
    )
    assert row["target"] == 1.05 and row["met"] is False
    # tokens/s: higher is better, so the cost ratio inverts
    fast = ratio_row("decode", "B=1", "tok/s", dict(diff=104.0, baseline=100.0), lower_is_better=False)
    assert fast["diff_over_baseline"] == pytest.approx(1 / 1.04) and fast["met"] is True
    table = format_table([row, fast])
    assert "MISS" in table and " ok" in table and "1.300" in table


def test_results_are_written_atomically_and_corrupt_files_refused(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"rows": [1]})
    assert load_json(path) == {"rows": [1]} and [p.name for p in tmp_path.iterdir()] == ["r.json"]
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read benchmark results"):
        load_json(path)


def test_step_peak_bytes_sees_a_transient_allocation():
    def step():
        big = torch.ones(1 << 20)  # 4 MiB, freed at once
        return float(big.sum())

    peak = step_peak_bytes(step, torch.device("cpu"))
    assert 4 << 20 <= peak < 6 << 20


def test_contenders_share_one_function_and_decode_greedily():
    models = build_models(TINY, 24, torch.device("cpu"), torch.float64, seed=3, kinds=("gda", "gated"))
    assert (models["gda"].config.num_attention_heads, models["gda"].config.gda_ratio) == (3, 3)
    assert models["gated"].config.num_attention_heads == models["baseline"].config.num_attention_heads
    ids = random_ids(TINY, 10, torch.device("cpu"), seed=3)
    diff_logits = models["diff"](ids).logits
    torch.testing.assert_close(models["diffllama"](ids).logits, diff_logits)
    assert not torch.allclose(models["baseline"](ids).logits, diff_logits)  # a different model, same seed
    run = GreedyDecode(models["diff"], ids, new_tokens=5)
    expected = models["diff"].generate(ids, max_new_tokens=5, do_sample=False, eos_token_id=None)
    for _ in range(2):  # a second prefill starts afresh
        run.prefill()
        for _ in range(run.steps):
            run.step()
        assert torch.equal(run.tokens, expected[:, 10:])


def test_check_passes_on_cpu_for_the_fast_paths():
    small = tuple(c for c in CASES if c.q_len * c.kv_len < 50_000)
    rows = check_backends(
        torch.device("cpu"), torch.float32, backends=("blocked", "decode", "fused_cpu"), cases=small
    )
    assert rows and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    fused = [r for r in rows if r["backend"] == "fused_cpu"]
    assert fused and not any(r["case"]["padding"] for r in fused)  # it takes no mask: padded cases skipped


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return parser.parse_args(argv)


def test_bench_command_end_to_end(tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = parse(
        "--hidden-size 32 --num-hidden-layers 1 --num-attention-heads 2 --vocab-size 64 --batch 2 --op-lengths 24 "
        "--op-batch 1 "
        f"--train-lengths 24 --decode-batches 1 2 --prompt-len 8 --new-tokens 4 --warmup 0 --output {out}".split()
    )
    assert cli.run(args) == 0
    payload = json.loads(out.read_text())
    sections = [r["section"] for r in payload["rows"]]
    assert sections == ["op"] * 3 + ["train", "decode", "decode", "memory"]
    assert all(r["diff_over_baseline"] > 0 for r in payload["rows"])
    # GDA and gated attention beside DIFF, each against the baseline, where whole models are timed
    for row in payload["rows"]:
        expected = {"gda", "gated"} if row["section"] != "op" else set()
        assert set(row["kinds_over_baseline"]) == expected and all(
            v > 0 for v in row["kinds_over_baseline"].values()
        )
    assert out.with_suffix(".png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "DIFF/base" in printed and "GDA/base" in printed and "Gated/base" in printed


def test_bench_command_refuses_bad_options():
    with pytest.raises(UsageError, match=r"`repeats` must lie in \[5, 1000\]"):
        cli.run(parse(["--repeats", "3"]))
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="CUDA is not available"):
            cli.run(parse(["--device", "cuda"]))
