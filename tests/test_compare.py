"""`compare` end to end on the micro preset with synthetic text, and the scaling fit."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from difftransformer.train import compare
from difftransformer.train.cli import resolved_preset
from difftransformer.train.pipeline import PreparedData
from difftransformer.train.presets import get_preset
from difftransformer.train.retrieval import mix_in, needle_training_blocks
from difftransformer.train.scaling import fit_power_law, matching_ratio
from test_train_support import pack, small_tokenizer, synthetic_texts


def micro_data(block_size: int) -> PreparedData:
    texts = synthetic_texts(count=80)
    tokenizer = small_tokenizer(texts, vocab_size=400)
    train = pack(texts[:60], tokenizer, block_size)
    needles = needle_training_blocks(train.flatten(), tokenizer, block_size, 4, seed=0)
    return PreparedData(
        tokenizer=tokenizer,
        train_blocks=mix_in(train, needles),
        validation_blocks=pack(texts[60:70], tokenizer, block_size),
        test_blocks=pack(texts[70:], tokenizer, block_size),
        test_texts=texts[70:],
        needle_blocks=4,
        corpus_name="synthetic",
    )


def compare_args(tmp_path, **overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    compare.configure(parser)
    args = parser.parse_args(
        ["--preset", "micro", "--output-dir", str(tmp_path), "--needle-samples", "1", "--report-to", "none"]
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_compare_writes_report_and_plots(tmp_path):
    preset = get_preset("micro")
    data = micro_data(preset.block_size)
    args = compare_args(tmp_path, seeds=[0, 1], max_steps=3, needles=[(1, 1), (2, 1)])
    markdown = compare.run_comparison(data, resolved_preset(args), args)
    assert markdown == tmp_path / "report.md"
    text = markdown.read_text()
    for needle in ("DIFF", "Transformer", "test perplexity", "needle N:R=2:1", "loss_curves.png", " ± "):
        assert needle in text, needle
    assert "<table>" in (tmp_path / "report.html").read_text()
    for png in ("loss_curves.png", "needle_accuracy.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert sorted((r["variant"], r["seed"]) for r in runs) == [
        ("diff", 0),
        ("diff", 1),
        ("softmax", 0),
        ("softmax", 1),
    ]
    diff, base = (next(r for r in runs if r["variant"] == v and r["seed"] == 0) for v in ("diff", "softmax"))
    # Matched baseline: same size up to DIFF's lambda vectors and per-head norm gains.
    assert 0 < diff["parameters"] - base["parameters"] < 0.02 * base["parameters"]
    # A second call reuses the finished runs instead of training again.
    before = (tmp_path / "runs" / "micro-diff-seed0" / "train_summary.json").stat().st_mtime_ns
    compare.run_comparison(data, resolved_preset(args), args)
    assert (tmp_path / "runs" / "micro-diff-seed0" / "train_summary.json").stat().st_mtime_ns == before


@pytest.mark.slow
def test_compare_over_sizes_fits_scaling(tmp_path):
    preset = get_preset("micro")
    data = micro_data(preset.block_size)
    args = compare_args(tmp_path, sizes=[16, 32, 48], max_steps=2, needle_samples=0)
    text = compare.run_comparison(data, resolved_preset(args), args).read_text()
    assert "Scaling with parameters" in text and "DIFF reaches the Transformer's loss with" in text
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
