"""DIFF's lambda traces in metrics.csv and TensorBoard: the columns each attention kind logs, V1's lambda as the
weights hold it at every logged step, V2's gate statistics as the training forwards computed them."""

from __future__ import annotations

import csv
import math

import pytest
import torch
from transformers import TrainerCallback

from difftransformer.compare.document import Report
from difftransformer.compare.records import RunRecord
from difftransformer.compare.report import lambda_section
from difftransformer.compare.variants import parse_variants
from difftransformer.errors import UsageError
from difftransformer.models import KINDS, DiffTransformerForCausalLM
from difftransformer.train.callbacks import CSV_FIELDS, column, read_metrics
from difftransformer.train.presets import RECIPE, get_preset
from difftransformer.train.runner import METRICS_CSV, train_model
from difftransformer.train.settings import TrainingSettings
from difftransformer.train.traces import LambdaTraces, is_trace_column, trace_columns
from test_train_support import pack, small_tokenizer, synthetic_texts


@pytest.fixture(scope="module")
def data():
    texts = synthetic_texts()
    tokenizer = small_tokenizer(texts)
    blocks = pack(texts, tokenizer, 32)
    return tokenizer, blocks[:-8], blocks[-8:]


def settings(output_dir, **overrides) -> TrainingSettings:
    fields = dict(RECIPE, output_dir=str(output_dir), max_steps=5, per_device_train_batch_size=4, logging_steps=1,
                  eval_steps=5, save_steps=5, learning_rate=1e-2, warmup_steps=1, report_to="none")  # fmt: skip
    fields.update(overrides)
    return TrainingSettings(**fields)


def micro(tokenizer, attention: str):
    return get_preset("micro").model_config(
        attention, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id
    )


class RecordLambda(TrainerCallback):
    """Reads every V1 layer's lambda_full() after each optimizer step, before that step's row is logged."""

    def __init__(self) -> None:
        self.seen: dict[int, list[float]] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        layers = [layer.self_attn for layer in model.model.layers]
        self.seen[state.global_step] = [float(attn.lambda_full().detach()) for attn in layers]
        return control


def test_columns_per_attention_kind(data):
    """One column a layer with the scalar lambda, a mean and a standard deviation with the per-token one, none
    without noise maps: for every kind, as its parts declare."""
    tokenizer = data[0]
    columns = {kind: trace_columns(DiffTransformerForCausalLM(micro(tokenizer, kind))) for kind in KINDS}
    for kind, found in columns.items():
        layers = range(micro(tokenizer, kind).num_hidden_layers)
        expected = {
            "scalar": tuple(f"lambda_layer_{i}" for i in layers),
            "token": tuple(f"lambda_{s}_layer_{i}" for i in layers for s in ("mean", "std")),
            None: (),
        }[KINDS[kind].parts.lambda_mode]
        assert found == expected, kind
    assert all(is_trace_column(name) for name in columns["diff"] + columns["diff_v2"])
    assert not any(
        is_trace_column(name) for name in ("lambda", "lambda_layer_", "loss", "lambda_max_layer_0")
    )


def test_v1_lambda_column_is_the_models_lambda_at_each_step(tmp_path, data):
    tokenizer, train, val = data
    recorder = RecordLambda()
    train_model(micro(tokenizer, "diff"), train, val, tokenizer, settings(tmp_path, report_to="tensorboard"),
                callbacks=[recorder])  # fmt: skip
    rows = read_metrics(tmp_path / METRICS_CSV)
    for layer in (0, 1):
        steps, values = column(rows, f"lambda_layer_{layer}")
        assert steps == [1, 2, 3, 4, 5]
        assert values == pytest.approx([recorder.seen[step][layer] for step in steps], abs=1e-6)
        # Training moved lambda: the column follows the weights, not the initial value.
        assert max(values) - min(values) > 1e-4
    final = DiffTransformerForCausalLM.from_pretrained(tmp_path)
    assert column(rows, "lambda_layer_1")[1][-1] == pytest.approx(
        float(final.model.layers[1].self_attn.lambda_full().detach()), abs=1e-6
    )
    # The same values reach TensorBoard (Trainer prefixes training scalars with "train/").
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = {path.parent for path in (tmp_path / "runs").rglob("events.out.tfevents*")}
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    logged = [event.value for event in accumulator.Scalars("train/lambda_layer_0")]
    assert logged == pytest.approx(column(rows, "lambda_layer_0")[1], abs=1e-6)


def test_v2_gate_statistics_are_those_of_the_training_forwards(data):
    tokenizer, train, _ = data
    torch.manual_seed(0)
    model = DiffTransformerForCausalLM(micro(tokenizer, "diff_v2"))
    with torch.no_grad():  # gates well away from 1/2 and different per head, so a wrong reduction shows
        for layer in model.model.layers:
            layer.self_attn.lambda_proj.weight.normal_(0.0, 0.5)
    traces = LambdaTraces(model)
    model.train()
    batches = [train[:3], train[3:8]]
    expected: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    for batch in batches:
        hidden = model(input_ids=batch, output_hidden_states=True).hidden_states
        with torch.no_grad():
            for index, layer in enumerate(model.model.layers):
                x = layer.input_layernorm(hidden[index])
                expected[index].append(torch.sigmoid(layer.self_attn.lambda_proj(x).double()).flatten())
    model.eval()
    model(input_ids=train[8:12])  # an evaluation forward does not count
    row = traces.values()
    for index in (0, 1):
        gates = torch.cat(expected[index])
        assert row[f"lambda_mean_layer_{index}"] == pytest.approx(float(gates.mean()), abs=1e-6)
        assert row[f"lambda_std_layer_{index}"] == pytest.approx(float(gates.std(unbiased=False)), abs=1e-6)
        assert float(gates.std()) > 0.05
    # values() starts the next window: nothing trained since, nothing to report.
    assert all(math.isnan(value) for value in traces.values().values())
    traces.remove()
    model.train()
    model(input_ids=train[:2])
    assert all(math.isnan(value) for value in traces.values().values())


def test_v2_run_logs_its_gates_and_the_baseline_logs_none(tmp_path, data):
    tokenizer, train, val = data
    train_model(micro(tokenizer, "diff_v2"), train, val, tokenizer, settings(tmp_path / "v2"))
    rows = read_metrics(tmp_path / "v2" / METRICS_CSV)
    for layer in (0, 1):
        steps, means = column(rows, f"lambda_mean_layer_{layer}")
        _, stds = column(rows, f"lambda_std_layer_{layer}")
        assert steps == [1, 2, 3, 4, 5]
        assert all(0.0 < m < 1.0 for m in means) and all(0.0 < s < 0.5 for s in stds)
    train_model(micro(tokenizer, "softmax"), train, val, tokenizer, settings(tmp_path / "softmax"))
    with open(tmp_path / "softmax" / METRICS_CSV) as handle:
        assert handle.readline().strip() == ",".join(CSV_FIELDS)


def test_metrics_with_unknown_columns_are_refused(tmp_path):
    path = tmp_path / METRICS_CSV
    path.write_text(",".join(CSV_FIELDS) + ",lambda_layer_0\n1,,2.0,,,,,,,,0.5\n")
    assert column(read_metrics(path), "lambda_layer_0") == ([1], [0.5])
    path.write_text(",".join(CSV_FIELDS) + ",lambda_layer_0,attention_sink\n")
    with pytest.raises(UsageError, match="not a metrics file"):
        read_metrics(path)


def planted_run(folder, variant: str, seed: int, traces: dict[str, list[float]]) -> RunRecord:
    """A run whose metrics.csv logged ``traces`` (column -> values) with a training loss at steps 10, 20, ..."""
    folder.mkdir(parents=True)
    fields = CSV_FIELDS + tuple(traces)
    with open(folder / METRICS_CSV, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for i in range(3):
            writer.writerow({"step": 10 * (i + 1), "loss": 3.0 - i, **{k: v[i] for k, v in traces.items()}})
    return RunRecord(variant=variant, seed=seed, scale="micro", folder=folder, parameters=1000, tokens=3000,
                     tokens_per_second=1.0, train_seconds=1.0, validation_loss=2.0, test_loss=2.0, suite={})  # fmt: skip


def test_report_plots_the_traces_and_tables_their_last_values(tmp_path):
    records = [
        planted_run(tmp_path / "d0", "diff", 0, {"lambda_layer_0": [0.2, 0.3, 0.40], "lambda_layer_1": [0.5, 0.6, 0.7]}),
        planted_run(tmp_path / "d1", "diff", 1, {"lambda_layer_0": [0.2, 0.3, 0.50], "lambda_layer_1": [0.5, 0.6, 0.9]}),
        planted_run(tmp_path / "v0", "diff_v2", 0, {"lambda_mean_layer_0": [0.5, 0.6, 0.7], "lambda_std_layer_0": [0.1] * 3,
                                                   "lambda_mean_layer_1": [0.5, 0.4, 0.3], "lambda_std_layer_1": [0.1] * 3}),
        planted_run(tmp_path / "v1", "diff_v2", 1, {"lambda_mean_layer_0": [0.5, 0.6, 0.9], "lambda_std_layer_0": [0.1] * 3,
                                                   "lambda_mean_layer_1": [0.5, 0.4, 0.1], "lambda_std_layer_1": [0.1] * 3}),
        planted_run(tmp_path / "s0", "softmax", 0, {}),
        planted_run(tmp_path / "s1", "softmax", 1, {}),
    ]  # fmt: skip
    report = Report("traces")
    lambda_section(report, records, parse_variants("diff,diff_v2,softmax"), tmp_path)
    text = report.markdown()
    assert "| DIFF | 0.450 ± 0.071 | 0.800 ± 0.141 |" in text
    assert "| DIFF V2 (mean sigmoid(lambda)) | 0.800 ± 0.141 | 0.200 ± 0.141 |" in text
    assert "Transformer" not in text.split("| variant |")[1]
    assert (tmp_path / "lambda_traces.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    untraced = Report("none")
    lambda_section(untraced, records[4:], parse_variants("softmax"), tmp_path / "none")
    assert "lambda" not in untraced.markdown()
