"""The benchmark command's parts: timing, workloads, memory measurement, reports, the CLI end to end, and
`make bench-check` (scripts/bench_check.py, bench.regression): its comparison on planted figures and a tiny run of
what it measures (no assertion on speed: time is not a unit test)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from difftransformer.bench import cli, regression
from difftransformer.bench.check import CASES, check_backends
from difftransformer.bench.machine import cpu_model
from difftransformer.bench.report import format_table, load_json, ratio_row
from difftransformer.bench.settings import DEFAULT_KINDS, BenchSettings
from difftransformer.bench.timing import interleaved_medians, interleaved_steps
from difftransformer.bench.workloads import (
    BenchShape,
    GreedyDecode,
    build_models,
    random_ids,
    step_peak_bytes,
)
from difftransformer.errors import UsageError
from difftransformer.models import KINDS, decode_flops, matched_config, training_flops
from difftransformer.models.compositions import composition_spec, parse_composition
from difftransformer.storage import read_json, write_json

TINY = BenchShape(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=64, batch=2)
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_check.py"
_spec = importlib.util.spec_from_file_location("bench_check", SCRIPT)
bench_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_check)


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


def test_ratio_rows_put_each_kinds_flop_ratio_beside_its_measured_one():
    values = {"diff": 110.0, "baseline": 100.0, "motif": 90.0, "diff_v2(gda_ratio=4)": 130.0}
    flops = {"diff": 2.0, "baseline": 2.0, "motif": 1.5, "diff_v2(gda_ratio=4)": 2.2}
    row = ratio_row("train", "T=512 B=4", "ms/step", values, flops=flops)
    assert row["kinds_over_baseline"] == pytest.approx({"motif": 0.9, "diff_v2(gda_ratio=4)": 1.3})
    assert row["flops_over_baseline"] == pytest.approx(
        {"diff": 1.0, "motif": 0.75, "diff_v2(gda_ratio=4)": 1.1}
    )
    lines = format_table([row, ratio_row("memory", "T=512 B=4", "MiB peak", values)]).splitlines()
    kind_line = next(line for line in lines if line.startswith("train") and " diff_v2(gda_ratio=4) " in line)
    assert kind_line.split()[-3:] == ["1.300", "1.100", "1.182"]  # measured, FLOPs, measured over FLOPs
    assert next(line for line in lines if line.startswith("memory") and " motif " in line).split()[-2:] == [
        "-",
        "-",
    ]


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
    kinds = ("gda(gda_ratio=3)", "gated")
    models = build_models(TINY, 24, torch.device("cpu"), torch.float64, seed=3, kinds=kinds)
    gda = models["gda(gda_ratio=3)"].config
    assert (gda.num_attention_heads, gda.gda_ratio) == (3, 3)
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
        "--op-batch 1 --kinds motif,diff_v2(output_gate=elementwise) "
        f"--train-lengths 24 --decode-batches 1 2 --prompt-len 8 --new-tokens 4 --warmup 0 --output {out}".split()
    )
    assert cli.run(args) == 0
    payload = json.loads(out.read_text())
    sections = [r["section"] for r in payload["rows"]]
    assert sections == ["op"] * 3 + ["train", "decode", "decode", "memory"]
    assert all(r["diff_over_baseline"] > 0 for r in payload["rows"])
    assert payload["settings"]["kinds"] == ["motif", "diff_v2(output_gate=elementwise)"]
    kinds = {"motif", "diff_v2(output_gate=elementwise)"}
    # the kinds beside DIFF, each against the baseline, where whole models are timed; their FLOP ratios (and DIFF's)
    # where a section counts FLOPs
    for row in payload["rows"]:
        assert set(row["kinds_over_baseline"]) == (kinds if row["section"] != "op" else set())
        assert all(v > 0 for v in row["kinds_over_baseline"].values())
        counted = {"train", "decode"}
        assert set(row["flops_over_baseline"]) == (kinds | {"diff"} if row["section"] in counted else set())
    assert out.with_suffix(".png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert (
        "DIFF/base" in printed and "meas/FLOPs" in printed and "diff_v2(output_gate=elementwise)" in printed
    )


def test_bench_times_every_kind_by_default_and_counts_flops_from_the_configuration():
    assert {parse_composition(kind)[0] for kind in DEFAULT_KINDS} | {"diff", "softmax"} == set(KINDS)
    settings = BenchSettings()
    assert settings.kinds == ("gda(gda_ratio=3)", "diff_v2", "gated", "motif")
    assert set(DEFAULT_KINDS) == {composition_spec(*parse_composition(kind)) for kind in DEFAULT_KINDS}
    assert BenchSettings.from_json(json.loads(json.dumps(settings.to_json()))) == settings
    models = build_models(TINY, 40, torch.device("cpu"), torch.float32, 0, ("motif",), diffllama=False)
    baseline = models["baseline"].config
    motif = matched_config(baseline, "motif")
    from difftransformer.bench.workloads import decode_step_flops, train_flops

    assert train_flops(models, 32)["motif"] == training_flops(motif, 32).total
    assert decode_step_flops(models, 8, 3)["baseline"] == sum(
        decode_flops(baseline, n).total for n in (8, 9, 10)
    )


def test_bench_command_refuses_bad_options():
    with pytest.raises(UsageError, match=r"`repeats` must lie in \[5, 1000\]"):
        cli.run(parse(["--repeats", "3"]))
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="CUDA is not available"):
            cli.run(parse(["--device", "cuda"]))
    with pytest.raises(
        UsageError, match="`kinds` must list distinct kinds other than plain diff and softmax"
    ):
        cli.run(parse(["--kinds", "motif,diff"]))
    # the whole layout keeps the baseline's 8 heads as signal heads: a ratio must divide them
    with pytest.raises(UsageError, match=r"`kinds`: diff_v2\(gda_ratio=3\) cannot be matched .* 8 heads"):
        cli.run(parse(["--kinds", "diff_v2(gda_ratio=3)"]))
    with pytest.raises(SystemExit):
        parse(["--kinds", "bogus(x=1)"])


# ---- make bench-check ------------------------------------------------------------------------------------------

TINY_SETTINGS = dict(
    hidden_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=64, batch=2, sections=("train", "decode"),
    train_lengths=(24,), decode_batches=(1,), prompt_len=8, new_tokens=4, warmup=0, kinds=("motif",),
    diffllama=False,
)  # fmt: skip


def planted_rows(diff: float, motif: float) -> list[dict]:
    """A run's rows whose DIFF and motif cost ``diff`` and ``motif`` times the baseline's, in train and decode."""
    train = ratio_row("train", "T=24 B=2", "ms/step", {"diff": diff, "baseline": 1.0, "motif": motif})
    decode = ratio_row("decode", "B=1 prompt=8", "tok/s", {"diff": 1 / diff, "baseline": 1.0, "motif": 1 / motif},
                       lower_is_better=False)  # fmt: skip
    return [train, decode]


def plant_figures(path: Path, cpu: str, ratios: dict[str, float], band: float = 0.05) -> None:
    machine = dict(cpu=cpu, date="2026-12-07 06:00 UTC", command="python scripts/bench_check.py --write")
    settings = BenchSettings(**TINY_SETTINGS).to_json()
    entry = dict(
        machine=machine, band=band, settings=settings, ratios={k: dict(ratio=v) for k, v in ratios.items()}
    )
    write_json(path, dict(figures=[entry]))


COMMITTED = {"train T=24 B=2 diff": 1.0, "train T=24 B=2 motif": 0.8, "decode B=1 prompt=8 diff": 1.0,
             "decode B=1 prompt=8 motif": 0.8}  # fmt: skip


@pytest.fixture
def measured(monkeypatch):
    """bench-check measures planted rows (DIFF at 1.03, inside a 5% band; motif at 0.9 against 0.8 committed:
    12.5% slower), the machine idle."""
    calls = []

    def measure(settings):
        calls.append(settings)
        return planted_rows(1.03, 0.9)

    monkeypatch.setattr(regression, "measure", measure)
    monkeypatch.setattr(regression.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    return calls


def test_bench_check_names_every_ratio_that_moved_past_the_band_and_passes_one_within_it(tmp_path, measured):
    figures = tmp_path / "figures.json"
    plant_figures(figures, cpu_model(), COMMITTED)
    lines = regression.check(figures, say=lambda line: None)
    assert [line.split(":")[0] for line in lines] == ["train T=24 B=2 motif", "decode B=1 prompt=8 motif"]
    assert "0.900 against 0.800 committed (+12.5%, past ±5%; slower" in lines[0]
    assert measured[0] == BenchSettings(**TINY_SETTINGS)  # the figures' own settings, measured again
    assert regression.check(figures, band=0.2, say=lambda line: None) == []  # a band that holds them all
    # a ratio the figures hold and the run did not measure, and one the run measured that they do not hold
    plant_figures(
        figures, cpu_model(), {**COMMITTED, "train T=24 B=2 gated": 1.0, "decode B=1 prompt=8 motif": 0.9}
    )
    lines = regression.check(figures, say=lambda line: None)
    assert lines == ["train T=24 B=2 motif: 0.900 against 0.800 committed (+12.5%, past ±5%; slower: find why)",
                     "train T=24 B=2 gated: committed 1.000, not measured"]  # fmt: skip
    assert regression.moved({"a": 1.0}, {"b": 1.0}, 0.05) == [
        "a: committed 1.000, not measured",
        "b: measured 1.000, not in the committed figures",
    ]
    assert regression.moved({"a": 1.0}, {"a": 0.9}, 0.05) == [
        "a: 0.900 against 1.000 committed (-10.0%, past ±5%; faster: commit new figures with --write)"
    ]


def test_bench_check_refuses_figures_from_another_cpu_unless_named(tmp_path, measured):
    figures = tmp_path / "figures.json"
    plant_figures(figures, "Another Vendor CPU 9000", COMMITTED)
    with pytest.raises(
        UsageError, match=f"holds no figures taken on {cpu_model()!r} .*'Another Vendor CPU 9000'"
    ):
        regression.check(figures)
    assert measured == []  # refused before anything was timed
    said = []
    assert len(regression.check(figures, cpu="Another Vendor CPU 9000", say=said.append)) == 2
    assert "comparing this" in said[0] and "as asked" in said[0]


def test_bench_check_refuses_a_busy_machine_a_missing_file_and_settings_it_no_longer_takes(tmp_path, measured,
                                                                                           monkeypatch):  # fmt: skip
    figures = tmp_path / "figures.json"
    with pytest.raises(UsageError, match="does not exist: `python scripts/bench_check.py --write` measures"):
        regression.check(figures)
    plant_figures(figures, cpu_model(), COMMITTED)
    monkeypatch.setattr(regression.os, "getloadavg", lambda: (3.5, 2.0, 1.0))
    with pytest.raises(UsageError, match="busy: its 1-minute load average is 3.50"):
        regression.check(figures)
    assert measured == []
    assert len(regression.check(figures, ignore_load=True, say=lambda line: None)) == 2
    document = read_json(figures)
    document["figures"][0]["settings"]["gda_ratio"] = 3  # a field bench has since dropped
    write_json(figures, document)
    with pytest.raises(
        UsageError,
        match="settings do not run with this version on this machine .*gda_ratio.*write them again",
    ):
        regression.check(figures)


def test_bench_check_write_keeps_agreeing_passes_and_refuses_disagreeing_ones(tmp_path, monkeypatch):
    figures = tmp_path / "figures.json"
    plant_figures(figures, "Another Vendor CPU 9000", COMMITTED)
    passes = iter([planted_rows(1.00, 0.80), planted_rows(1.02, 0.81), planted_rows(1.00, 0.80),
                   planted_rows(1.00, 0.90)])  # fmt: skip
    monkeypatch.setattr(regression, "measure", lambda settings: next(passes))
    settings = BenchSettings(**TINY_SETTINGS)
    say = lambda line: None  # noqa: E731
    assert regression.write(figures, "cmd", settings=settings, ignore_load=True, say=say) == []
    entries = read_json(figures)["figures"]
    assert [e["machine"]["cpu"] for e in entries] == [
        "Another Vendor CPU 9000",
        cpu_model(),
    ]  # the other kept
    mine = entries[1]
    assert mine["machine"]["command"] == "cmd" and mine["machine"]["versions"]["torch"] == torch.__version__
    assert (
        mine["machine"]["date"]
        and mine["band"] == regression.BAND
        and mine["settings"] == json.loads(json.dumps(settings.to_json()))
    )
    assert mine["ratios"]["train T=24 B=2 diff"]["ratio"] == pytest.approx(1.01)
    assert mine["ratios"]["train T=24 B=2 diff"]["passes"] == pytest.approx([1.0, 1.02])
    found = regression.write(figures, "cmd", settings=settings, ignore_load=True, say=say)
    assert found == ["train T=24 B=2 motif: passes read 0.800, 0.900", "decode B=1 prompt=8 motif: passes read 0.800, "
                     "0.900"]  # fmt: skip
    assert read_json(figures)["figures"][1] == mine  # nothing written


def test_bench_check_script_refuses_in_one_line_and_exits_1_on_a_moved_ratio(tmp_path, measured, capsys):
    figures = tmp_path / "figures.json"
    assert bench_check.main(["--figures", str(figures)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench-check: error: --figures ") and "--write" in err[0]
    assert bench_check.main(["--figures", str(figures), "--write", "--cpu", "X"]) == 2
    assert "error: --cpu names the figures a check compares with" in capsys.readouterr().err
    plant_figures(figures, cpu_model(), COMMITTED)
    assert bench_check.main(["--figures", str(figures)]) == 1
    err = capsys.readouterr().err
    assert (
        "bench-check: train T=24 B=2 motif: 0.900 against 0.800" in err
        and "2 ratios moved past the band" in err
    )
    assert bench_check.main(["--figures", str(figures), "--band", "0.2"]) == 0


def test_bench_check_measures_its_figures_settings_for_real(tmp_path, monkeypatch):
    """A tiny run of what bench-check measures, every ratio of the figures measured again (no assertion on speed)."""
    figures = tmp_path / "figures.json"
    plant_figures(figures, cpu_model(), COMMITTED, band=0.99)
    lines = regression.check(figures, ignore_load=True, say=lambda line: None)
    assert not [line for line in lines if "not measured" in line or "not in the committed" in line], lines


def test_the_cpu_model_names_the_vector_instructions_beside_the_name(tmp_path, monkeypatch):
    """Two machines /proc/cpuinfo names alike ("AMD EPYC") with other vector units keep separate figures."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2\n")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert cpu_model(cpuinfo) == "AMD EPYC, AVX2"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert cpu_model(cpuinfo) == "AMD EPYC, AVX512"
    assert cpu_model(tmp_path / "missing").endswith(", AVX512")
