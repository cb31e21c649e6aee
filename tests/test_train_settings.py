"""Every TrainingArguments option reaches the Trainer from the command line (and changes what it does), presets
give the defaults of the options they set, and saved configs are fit for inference."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import torch
from transformers import TrainerCallback, TrainingArguments
from transformers.optimization import Adafactor

from difftransformer.cli import main
from difftransformer.errors import MissingInputError
from difftransformer.layers.mlp import SwiGLU
from difftransformer.train import cli as train_cli
from difftransformer.train.presets import RECIPE, get_preset
from difftransformer.train.runner import train_model
from difftransformer.train.settings import tokens_per_step
from test_train_support import BLOCK


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train_cli.configure(parser)
    return parser.parse_args(list(flags))


def settings_from(*flags: str, output_dir) -> tuple:
    """(preset, TrainingSettings) as `train` builds them from ``flags`` (micro preset, 2 quiet steps)."""
    args = parse("--preset", "micro", "--output-dir", str(output_dir), "--max-steps", "2", "--report-to", "none",
                 "--block-size", str(BLOCK), *flags)  # fmt: skip
    preset = train_cli.resolved_preset(args)
    return preset, preset.training_settings(**train_cli.training_options(args))


class Watch(TrainerCallback):
    """Records what the Trainer built (its optimizer) and what each training step does: how often the layers'
    MLPs run (a class-level patch: a module hook would not see checkpointing's recomputation) and the dtype of
    their outputs."""

    def __init__(self, monkeypatch) -> None:
        self.optimizer, self.calls, self.dtypes, self.counting = None, [], set(), False
        forward = SwiGLU.forward

        def counted(module, x):
            if self.counting:  # counted on entry: checkpointing's recomputation stops early, inside the MLP
                self.calls[-1] += 1
            out = forward(module, x)
            if self.counting:
                self.dtypes.add(out.dtype)
            return out

        monkeypatch.setattr(SwiGLU, "forward", counted)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.optimizer, self.layers = optimizer, model.model.layers
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        self.calls.append(0)
        self.counting = True
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self.counting = False
        return control


def run(data, preset, settings, monkeypatch, attention: str = "diff") -> Watch:
    tokenizer, train, val = data
    watch = Watch(monkeypatch)
    config = preset.model_config(attention, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    train_model(config, train, val, tokenizer, settings, callbacks=[watch])
    return watch


def test_defaults_come_from_the_preset_then_transformers(tmp_path):
    preset, settings = settings_from(output_dir=tmp_path)
    micro = get_preset("micro").training
    assert (
        settings.learning_rate == micro["learning_rate"] and settings.max_steps == 2
    )  # a flag beats the preset
    assert settings.adam_beta2 == RECIPE["adam_beta2"] and str(settings.lr_scheduler_type.value) == "cosine"
    transformers_defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    for name in ("adam_epsilon", "optim", "label_smoothing_factor", "torch_compile"):  # no preset sets these
        assert getattr(settings, name) == transformers_defaults[name], name
    assert settings.data_seed == settings.seed == 0 and settings.use_cpu and not settings.bf16
    assert settings.report_to == [] and settings.save_total_limit == 3 and settings.disable_tqdm
    assert preset.block_size == BLOCK and tokens_per_step(preset.block_size, settings) == BLOCK * 4
    _, seeded = settings_from("--seed", "5", "--learning-rate", "1e-3", output_dir=tmp_path)
    assert (seeded.seed, seeded.data_seed, seeded.learning_rate) == (5, 5, 1e-3)


def test_plain_run_uses_adamw_without_checkpointing_in_float32(tmp_path, data, monkeypatch):
    watch = run(data, *settings_from(output_dir=tmp_path), monkeypatch)
    assert isinstance(watch.optimizer.optimizer, torch.optim.AdamW)
    layers = get_preset("micro").num_hidden_layers
    assert watch.calls == [layers, layers] and watch.dtypes == {torch.float32}


def test_gradient_checkpointing_recomputes_every_layer(tmp_path, data, monkeypatch):
    watch = run(data, *settings_from("--gradient-checkpointing", output_dir=tmp_path), monkeypatch)
    assert all(layer.gradient_checkpointing for layer in watch.layers)
    # The backward pass runs each checkpointed layer's forward again: two calls per step instead of one.
    layers = get_preset("micro").num_hidden_layers
    assert watch.calls == [2 * layers, 2 * layers]


def test_bf16_on_cpu_computes_in_bfloat16(tmp_path, data, monkeypatch):
    for attention in ("diff", "softmax"):
        preset, settings = settings_from("--bf16", output_dir=tmp_path / attention)
        assert settings.bf16 and settings.use_cpu
        watch = run(data, preset, settings, monkeypatch, attention=attention)
        assert watch.dtypes == {torch.bfloat16}, attention  # autocast: float32 weights, bfloat16 compute
        weights = json.loads((tmp_path / attention / "train_summary.json").read_text())
        assert weights["global_step"] == 2


def test_optim_adafactor_builds_adafactor(tmp_path, data, monkeypatch):
    watch = run(data, *settings_from("--optim", "adafactor", output_dir=tmp_path), monkeypatch)
    assert isinstance(watch.optimizer.optimizer, Adafactor)


@pytest.mark.slow
def test_torch_compile_compiles_the_model(tmp_path, data, monkeypatch):
    preset, settings = settings_from("--torch-compile", output_dir=tmp_path)
    assert settings.torch_compile
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    run(data, preset, settings, monkeypatch)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1


def test_bad_training_options_are_refused_before_any_work(tmp_path, capsys):
    for flags, message in (
        (["--max-steps", "0"], "--max-steps must be >= 1; got 0"),
        (["--save-total-limit", "1"], "--save-total-limit must be >= 2"),
        (["--preset", "huge"], "--preset must be one of"),
    ):
        assert main(["train", "--output-dir", str(tmp_path / "run"), *flags]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_help_lists_our_options_first_then_every_trainer_option(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    groups = ["run:", "preset and model:", "data:", "transformers TrainingArguments"]
    assert [text.index(g) for g in groups] == sorted(text.index(g) for g in groups)
    for flag in ("--gradient-checkpointing", "--bf16", "--optim", "--fsdp", "--torch-compile", "--push-to-hub", "--deepspeed", "--attention", "--needle-digits"):  # fmt: skip
        assert flag in text, flag
    assert "micro:" in text  # the presets are listed
    assert len(text.split("options:")[0].splitlines()) < 10  # a short usage line, not every flag


def test_saved_configs_are_fit_for_inference(tmp_path, data, monkeypatch):
    """use_cache as the model had it (Trainer trains with use_cache=False), and max_position_embeddings the block
    size trained on unless asked for another."""
    preset, settings = settings_from("--save-steps", "1", output_dir=tmp_path / "a")
    run(data, preset, settings, monkeypatch)
    for folder in (tmp_path / "a", tmp_path / "a" / "checkpoint-1", tmp_path / "a" / "checkpoint-2"):
        config = json.loads((folder / "config.json").read_text())
        assert config["use_cache"] is True and config["max_position_embeddings"] == BLOCK, folder
    preset, settings = settings_from("--max-position-embeddings", "128", output_dir=tmp_path / "b")
    run(data, preset, settings, monkeypatch)
    assert json.loads((tmp_path / "b" / "config.json").read_text())["max_position_embeddings"] == 128


@pytest.mark.parametrize("command", ["train", pytest.param("compare", marks=pytest.mark.slow)])
def test_data_is_prepared_with_the_seed_flag(command, tmp_path, monkeypatch):
    """train and compare draw the same data (corpus split, needle mix) for the same --seed."""
    seen = {}

    def stop(**kwargs):
        seen.update(kwargs)
        raise MissingInputError("stopped before any work")

    monkeypatch.setattr("difftransformer.train.pipeline.prepare_data", stop)
    assert main([command, "--output-dir", str(tmp_path), "--seed", "7", "--preset", "micro"]) == 2
    assert seen["seed"] == 7 and seen["needle"] == get_preset("micro").needle
