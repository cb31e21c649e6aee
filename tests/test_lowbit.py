"""The lowbit task without the quant extra: the cache procedure is the plain forward in full precision, one pass over
the continuation is token-by-token decoding, degradations are paired, windowed models are recorded as skipped, and
bad requests are refused before any work. (tests/test_lowbit_quant.py runs hqq and the weight schemes.)"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
from torch import nn
from transformers import DynamicCache

from difftransformer.data.mqar import MqarSettings, make_mqar_batch
from difftransformer.errors import UsageError
from difftransformer.eval import lowbit
from difftransformer.eval.recall import key_vocabulary
from difftransformer.eval.task import interval_at
from difftransformer.stats import mean
from helpers import random_model, tiny_config
from kind_table import ALL_FIELDS, KIND_FIELDS

LENGTH, CONTINUATION = 40, 12


def windows(model, count: int = 3, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (count, LENGTH), generator=generator)


def plain_nll(model, ids: torch.Tensor) -> list[float]:
    """Each window's mean NLL of its last CONTINUATION tokens from one forward pass without a cache."""
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[:, -CONTINUATION - 1 : -1].float()
    return [
        float(nn.functional.cross_entropy(row, target)) for row, target in zip(logits, ids[:, -CONTINUATION:])
    ]


@pytest.mark.parametrize("kind", list(ALL_FIELDS))
def test_full_precision_through_the_cache_is_the_plain_forward(kind):
    model = random_model(seed=2, dtype=torch.float32, **ALL_FIELDS[kind])
    ids = windows(model)
    got = lowbit._continuation_nll(model, ids, CONTINUATION, lambda: DynamicCache(config=model.config))
    np.testing.assert_allclose(got, plain_nll(model, ids), atol=1e-5, rtol=1e-5)
    batch = make_mqar_batch(np.random.default_rng(0), 6, MqarSettings(3), key_vocabulary(97, None, None, 3))
    accuracies = lowbit._mqar_accuracies(model, batch, 3, lambda: DynamicCache(config=model.config))
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(batch.input_ids), use_cache=False).logits
    predicted = np.take_along_axis(logits.argmax(-1).numpy(), batch.query_positions, axis=1)
    assert accuracies == pytest.approx([float(row.mean()) for row in predicted == batch.targets])


# transformers' QuantizedCache holds full-attention layers only
FULL_ATTENTION = [
    name
    for name, fields in ALL_FIELDS.items()
    if set(tiny_config(**fields).layer_types) == {"full_attention"}
]


@pytest.mark.parametrize("kind", FULL_ATTENTION)
def test_one_pass_over_the_continuation_is_decoding_it_token_by_token(kind):
    model = random_model(seed=4, dtype=torch.float32, **ALL_FIELDS[kind])
    ids = windows(model, count=2)
    fp8 = lambda: lowbit.KV_CACHES["fp8"].cache(model, 64)  # noqa: E731
    got = lowbit._continuation_nll(model, ids, CONTINUATION, fp8)
    split = LENGTH - CONTINUATION - 1
    decoded = []
    with torch.no_grad():
        for window in ids:
            cache = fp8()
            model(input_ids=window[None, :split], past_key_values=cache, use_cache=True)
            steps = [model(input_ids=window[None, [t]], past_key_values=cache, use_cache=True).logits[0, -1]
                     for t in range(split, LENGTH - 1)]  # fmt: skip
            decoded.append(float(nn.functional.cross_entropy(torch.stack(steps), window[split + 1 :])))
    np.testing.assert_allclose(got, decoded, atol=2e-5, rtol=2e-5)
    assert got != plain_nll(model, ids)  # the cache did quantize


def test_degradations_are_paired_on_the_same_windows_and_summarised_for_compare():
    model = random_model(seed=5, dtype=torch.float32, **KIND_FIELDS["diff"])
    ids = windows(model, count=4).reshape(-1).tolist()
    options = lowbit.LowbitOptions(length=LENGTH, num_sequences=4, continuation=CONTINUATION, kv_caches=["fp8"],
                                   weights=["none"], mqar_pairs=3)  # fmt: skip
    results = lowbit.run_lowbit(model, None, ids, options, progress=False)
    full, fp8 = results["rows"]
    assert (full["quantizer"], fp8["quantizer"], results["weights"]) == ("full", "kv fp8", [])
    differences = [q - f for q, f in zip(fp8["losses"], full["losses"])]
    assert fp8["loss_increase"] == pytest.approx(mean(differences)) and any(d != 0 for d in differences)
    low, high = fp8["loss_increase_interval"]
    assert low <= fp8["loss_increase"] <= high
    assert len(fp8["mqar_accuracies"]) == lowbit.MQAR_SEQUENCES
    assert (
        set(results["outliers"]) == {"keys", "values", "linear_inputs"}
        and min(results["outliers"].values()) > 1
    )
    task = lowbit.TASK
    summary = task.summarise(results)
    headers = [column.header for column in task.columns(summary)]
    assert {"loss full", "loss +kv fp8", "mqar Δkv fp8", "keys top-1/median"} <= set(headers)
    for panel in task.chart(summary).panels:
        assert set(panel.columns) <= set(headers)
    measures = {measure.name: measure for measure in task.measures(summary)}
    loss = measures["loss increase with kv fp8"]
    assert loss.value(summary) == fp8["loss_increase"] and not loss.higher_is_better and loss.paper
    assert interval_at(summary["quantizers"]["kv fp8"], "loss_increase") == (low, high)
    assert measures["MQAR accuracy change with kv fp8"].value(summary) == fp8["mqar_change"]


def test_a_model_with_sliding_windows_records_the_kv_caches_as_skipped():
    model = random_model(seed=6, dtype=torch.float32, **ALL_FIELDS["motif-window-3"])
    ids = windows(model, count=2).reshape(-1).tolist()
    options = lowbit.LowbitOptions(length=LENGTH, num_sequences=2, continuation=CONTINUATION, kv_caches=["fp8"],
                                   weights=["none"])  # fmt: skip
    results = lowbit.run_lowbit(model, None, ids, options, progress=False)
    (row,) = results["rows"][1:]
    assert "sliding windows" in row["skipped"] and "loss" not in row
    summary = lowbit.TASK.summarise(results)
    (measure,) = lowbit.TASK.measures(summary)
    assert measure.value(summary) is None  # compare's verdict leaves it out


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        (dict(kv_caches=["fp4"]), r"`kv_caches` must be among fp8, hqq-8, hqq-4, hqq-3, hqq-2; got fp4"),
        (dict(weights=["int2"]), r"`weights` must be among int8, int4, w8a8; got int2"),
        (
            dict(continuation=39),
            r"`continuation` must leave a prompt in the window: at most `length` - 2 = 38",
        ),
        (dict(kv_caches=["none"], weights=["none"]), r"both none"),
        (dict(num_sequences=0), r"`num_sequences` must be >= 1"),
        (dict(kv_caches=["fp8", "fp8"]), r"`kv_caches`"),
    ],
)
def test_bad_options_are_refused_naming_the_field(fields, says):
    with pytest.raises(UsageError, match=says):
        lowbit.LowbitOptions(**{"length": LENGTH, "continuation": CONTINUATION, **fields})


def test_missing_packages_are_refused_before_any_work_and_untileable_schemes_skipped(monkeypatch):
    model = random_model(seed=7, dtype=torch.float32, **KIND_FIELDS["softmax"])
    ids = windows(model).reshape(-1).tolist()
    options = lowbit.LowbitOptions(length=LENGTH, num_sequences=3, continuation=CONTINUATION, kv_caches=["hqq-4"],
                                   weights=["int4"])  # fmt: skip
    monkeypatch.setattr(lowbit, "_continuation_nll", lambda *args: pytest.fail("measured before refusing"))
    monkeypatch.setattr(lowbit, "_installed", lambda package: package is None)
    with pytest.raises(UsageError, match=r"`kv_caches hqq-4` needs hqq; `weights int4` needs torchao, which is not "
                       r"installed: pip install 'difftransformer\[quant\]'"):  # fmt: skip
        lowbit.run_lowbit(model, None, ids, options, progress=False)
    assert lowbit.LowbitOptions().resolved().kv_caches == ["fp8"]  # unset: what is installed
    with pytest.raises(
        UsageError, match=r"`continuation` must be < 127 with `kv_caches` hqq-4, whose newest 128"
    ):
        lowbit.LowbitOptions(length=512, continuation=127, kv_caches=["hqq-4"]).resolved()
    monkeypatch.undo()
    monkeypatch.setattr(
        lowbit, "_installed", lambda package: True
    )  # int4 is skipped before torchao is imported
    results = lowbit.run_lowbit(
        model, None, ids, dataclasses.replace(options, kv_caches=["fp8"]), progress=False
    )
    assert re.fullmatch(r"int4 quantizes in groups of 32 inputs; model\.layers\.0\.\S+ takes \d+",
                        results["rows"][-1]["skipped"])  # fmt: skip
    assert lowbit.TASK.summarise(results)["fewest_bits"] == {"kv hqq": None, "weights": None}


def test_hqq_groups_tile_one_tokens_keys_and_values_of_every_layer():
    unset = lowbit.LowbitOptions(length=LENGTH, continuation=CONTINUATION)
    assert lowbit.hqq_group_size(unset, {144}) == 16 and lowbit.hqq_group_size(unset, {128, 256}) == 64
    assert lowbit.hqq_group_size(unset, {96, 40}) == 8
    model = random_model(seed=8, dtype=torch.float32, **KIND_FIELDS["diff"])
    assert lowbit.cached_widths(model, torch.tensor(3)) == {
        model.config.num_key_value_heads * model.config.head_dim
    }
    with pytest.raises(UsageError, match=r"`q_group_size` must divide the values one token takes in each layer's "
                       r"cache, \[144\]; got 64"):  # fmt: skip
        lowbit.hqq_group_size(dataclasses.replace(unset, q_group_size=64), {144})
