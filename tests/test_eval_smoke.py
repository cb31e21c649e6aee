"""Every eval task end to end through ``difftransformer eval`` on tiny checkpoints (ours of every kind and a
Llama)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from difftransformer import DiffTransformerConfig, DiffTransformerForCausalLM
from difftransformer.cli import main
from difftransformer.storage import read_json
from test_eval import generated_text, train_tokenizer

TASK_OPTIONS = {
    "needle": "--context-lengths 96 --needles 2:2 --depths 0.5 --samples 1 --needle-digits 3",
    "attention": "--context-lengths 96 --needles 2:1 --depths 0,0.5,1 --samples 1 --per-layer --needle-digits 3",
    "outliers": "--tokens 256 --length 64",
    "quant": "--length 32 --num-sequences 2 --bits 4 --context-lengths 96 --needles 1:1 --depths 0.5 --samples 1",
    "longctx": "--length 64 --num-sequences 2",
    "icl": "--shots 2 --test-size 2 --orderings 2",
    "mqar": "--num-pairs 2,4 --sequences 4",
    "lowbit": "--length 48 --num-sequences 2 --continuation 16 --kv-caches fp8 --mqar-pairs 2",
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_smoke")
    tokenizer = train_tokenizer(400)
    special = dict(bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.eos_token_id)  # fmt: skip
    torch.manual_seed(0)
    ours = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                max_position_embeddings=256, **special)  # fmt: skip
    models = {
        "difftransformer": DiffTransformerForCausalLM(
            DiffTransformerConfig(num_attention_heads=2, num_key_value_heads=2, **ours)
        ),
        "gda": DiffTransformerForCausalLM(
            DiffTransformerConfig(attention="gda", num_attention_heads=3, gda_ratio=3, num_key_value_heads=1, **ours)
        ),
        "gated": DiffTransformerForCausalLM(
            DiffTransformerConfig(attention="gated", num_attention_heads=4, num_key_value_heads=2, **ours)
        ),
        "llama": LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **special,
        )),
    }  # fmt: skip
    paths = {}
    for name, model in models.items():
        paths[name] = root / name
        model.save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    bare = root / "no_tokenizer"
    models["llama"].save_pretrained(bare)
    paths["no_tokenizer"] = bare
    text = root / "heldout.txt"
    text.write_text("\n".join(generated_text(300, seed=1)))
    return paths, text


@pytest.mark.parametrize("family", ["difftransformer", "gda", "gated", "llama"])
@pytest.mark.parametrize("task", list(TASK_OPTIONS))
def test_every_task_runs(checkpoints, tmp_path, task, family):
    paths, text = checkpoints
    argv = ["eval", task, "--model", str(paths[family]), "--output-dir", str(tmp_path), "--no-progress"]
    argv += ["--text-file", str(text), *TASK_OPTIONS[task].split()]
    assert main(argv) == 0
    results = read_json(tmp_path / f"{task}.json")
    assert results["task"] == task
    assert list(tmp_path.glob("*.png")), "every task draws a plot"
    if task == "quant":
        assert [r["bits"] for r in results["rows"]] == [None, 4]
        assert all(0.0 <= r["needle_accuracy"] <= 1.0 for r in results["rows"])
    if task == "attention":
        assert len(results["by_depth"]) == 3 and len(results["by_depth"][0]["answer_per_layer"]) == 2


def test_same_seed_same_results(checkpoints, tmp_path):
    paths, text = checkpoints
    runs = []
    for out in ("a", "b"):
        argv = ["eval", "attention", "--model", str(paths["llama"]), "--output-dir", str(tmp_path / out),
                "--no-progress", "--text-file", str(text), *TASK_OPTIONS["attention"].split()]  # fmt: skip
        main(argv)
        runs.append(read_json(tmp_path / out / "attention.json"))
    assert runs[0] == runs[1]


def test_bad_input_is_refused_before_work(checkpoints, tmp_path, capsys):
    paths, text = checkpoints
    base = ["--output-dir", str(tmp_path), "--text-file", str(text), "--no-progress"]
    cases = [
        (["needle", "--model", str(paths["no_tokenizer"])], "has no tokenizer"),
        (
            ["needle", "--model", str(paths["llama"]), "--context-lengths", "512"],
            "max_position_embeddings = 256",
        ),
        (
            ["needle", "--model", str(paths["llama"]), "--context-lengths", "96", "--needles", "8:1"],
            "needs about",
        ),
        (["needle", "--model", str(paths["llama"]), "--needles", "2:3"], "1 <= R <= N"),
        (
            ["attention", "--model", str(paths["llama"]), "--needle-digits", "0"],
            "--needle-digits must lie in [1, 18] (a magic number is drawn as a 64-bit integer); got 0",
        ),
        (["longctx", "--model", str(tmp_path)], "config.json"),
        (["outliers", "--model", str(paths["llama"]), "--length", "1000"], "max_position_embeddings"),
    ]
    for argv, message in cases:
        assert main(["eval", *argv, *base]) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "perplexity", "--model", str(paths["llama"])])
    assert "invalid choice: 'perplexity'" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))
