"""Upcycling a pretrained softmax model to DIFF V2, DIFF V1, GDA, gated attention and the compositions of parts
where an exact construction exists: the same logits at step 0 (relative 1e-5, float32), every new parameter
trainable, a one-line refusal where none exists, and ``train --init-from`` continuing the result."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from difftransformer import DiffTransformerForCausalLM
from difftransformer.cli import main as cli_main
from difftransformer.convert import ConversionError, initial_model, load_softmax, upcycle
from difftransformer.models import PART_FIELDS, matched_config
from kind_table import ALL_FIELDS
from test_convert_llama import assert_same_logits, random_llama
from test_train_support import small_tokenizer, synthetic_texts

KINDS = ("diff_v2", "diff", "gated")


def llama_folder(tmp_path, **overrides):
    """A tiny random LlamaForCausalLM (GQA: 4 heads over 2 KV heads, untied) saved by transformers with a
    tokenizer; returns (folder, model)."""
    llama = random_llama(2, vocab_size=320, **overrides).float()
    folder = tmp_path / "llama"
    llama.save_pretrained(folder)
    small_tokenizer(synthetic_texts(), vocab_size=320).save_pretrained(folder)
    return folder, llama


def convert(source, output, attention: str, *flags: str) -> DiffTransformerForCausalLM:
    argv = [
        "convert",
        "--from-llama",
        str(source),
        "--attention",
        attention,
        "--output-dir",
        str(output),
        *flags,
    ]
    assert cli_main(argv) == 0
    return DiffTransformerForCausalLM.from_pretrained(output).eval()


def lambda_parameters(model: DiffTransformerForCausalLM) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if "lambda" in name}


@pytest.mark.parametrize("attention", KINDS)
def test_a_saved_llama_upcycles_with_the_same_logits(tmp_path, attention):
    folder, llama = llama_folder(tmp_path)
    ours = convert(folder, tmp_path / attention, attention)
    assert ours.config.attention == attention and ours.dtype == torch.float32
    assert (tmp_path / attention / "tokenizer.json").is_file()
    assert (tmp_path / attention / "generation_config.json").is_file()
    ids = torch.randint(0, 320, (2, 23))
    with torch.no_grad():
        assert_same_logits(ours(ids).logits, llama(ids).logits)


@pytest.mark.parametrize("attention", [*KINDS, "gda"])
@pytest.mark.parametrize(
    "overrides",
    [
        dict(tie_word_embeddings=True, rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}),
        dict(
            rope_parameters={
                "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
            }
        ),
    ],
)  # fmt: skip
def test_tied_and_rope_scaled_llamas_upcycle_exactly(attention, overrides):
    llama = random_llama(1, **overrides).float()
    ids = torch.randint(0, 101, (2, 90))  # past original_max_position_embeddings
    fields = (
        dict(gda_ratio=4) if attention == "gda" else {}
    )  # 4 query heads on the one KV head: ratio 4 is exact
    with torch.no_grad():
        assert_same_logits(upcycle(load_softmax(llama), attention, **fields)(ids).logits, llama(ids).logits)


@pytest.mark.parametrize("name", list(ALL_FIELDS))
def test_every_kind_and_composition_upcycles_exactly_or_is_refused_saying_why(name):
    """The construction is read off the parts (convert/upcycle.py): exact unless a layer is windowed, a per-token
    lambda serves more than one signal head a noise map, or a noise map's group spans the source's KV groups (4
    query heads over 2 KV heads here: G = 1 or 2)."""
    fields = ALL_FIELDS[name]
    parts = {key: value for key, value in fields.items() if key in PART_FIELDS}
    llama = random_llama(2).float()
    source = load_softmax(llama)
    target = matched_config(source.config, fields["attention"], **parts).parts
    windowed = any(target.windowed(layer) for layer in range(source.config.num_hidden_layers))
    ratio = target.noise_ratio or 1
    reason = (
        "windows layers" if windowed
        else "has no exact construction" if target.lambda_mode == "token" and ratio > 1
        else "divides the source's query heads per KV head" if 2 % ratio
        else None
    )  # fmt: skip
    if reason is not None:
        with pytest.raises(ConversionError, match=reason) as refused:
            upcycle(source, fields["attention"], **parts)
        assert "\n" not in str(refused.value)
        return
    model = upcycle(source, fields["attention"], **parts)
    assert model.config.parts == dataclasses.replace(target, norm="none")
    ids = torch.randint(0, 101, (2, 23))
    with torch.no_grad():
        assert_same_logits(model(ids).logits, llama(ids).logits)
    backward(model, ids)
    assert all(param.grad is not None for param in model.parameters())
    lambdas = [param.grad for n, param in model.named_parameters() if "lambda" in n]
    assert all(grad.abs().max() > 0 for grad in lambdas)  # lambda trains at the first backward


def test_upcycling_keeps_bf16_and_our_own_softmax_folders_upcycle_too(tmp_path):
    llama = random_llama(2).to(torch.bfloat16)
    v1 = upcycle(load_softmax(llama), "diff")
    assert v1.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in lambda_parameters(v1).values())

    ours = load_softmax(random_llama(2).float())
    ours.save_pretrained(tmp_path / "ours")
    v2 = initial_model(tmp_path / "ours", "diff_v2")
    ids = torch.randint(0, 101, (1, 17))
    with torch.no_grad():
        assert_same_logits(v2(ids).logits, ours(ids).logits)
    with pytest.raises(ConversionError, match="must be a softmax model"):
        load_softmax(v2)


def backward(model: DiffTransformerForCausalLM, ids: torch.Tensor) -> None:
    model.train()
    model.zero_grad()
    model(ids, labels=ids).loss.backward()


def test_diff_v2_pairs_separate_and_lambda_trains_at_the_first_backward():
    llama = random_llama(2).float()
    model = upcycle(load_softmax(llama), "diff_v2")
    backward(model, torch.randint(0, 101, (2, 19)))
    for layer in model.model.layers:
        attn = layer.self_attn
        assert attn.lambda_proj.weight.grad.abs().min() > 0
        grad = attn.q_proj.weight.grad.unflatten(0, (attn.lambda_proj.out_features, 2, -1))
        first, second = grad[:, 0], grad[:, 1]
        # lambda = 1/2: the second map's query gets minus half the first's gradient, so the pair separates.
        assert first.abs().max() > 0 and second.abs().max() > 0
        torch.testing.assert_close(second, -0.5 * first, atol=1e-6 * float(first.abs().max()), rtol=1e-4)


def test_diff_v1_lambda_trains_at_the_first_backward_and_the_second_map_after_one_step():
    llama = random_llama(2).float()
    model = upcycle(load_softmax(llama), "diff", seed=3)
    ids = torch.randint(0, 101, (2, 19))
    for layer in model.model.layers:
        assert float(layer.self_attn.lambda_full().detach()) == 0.0
    backward(model, ids)
    for name, param in lambda_parameters(model).items():
        assert param.grad is not None and param.grad.abs().min() > 0, name

    def second_map_grads() -> list[torch.Tensor]:
        grads = []
        for layer in model.model.layers:
            attn, d = layer.self_attn, layer.self_attn.map_head_dim
            for proj in (attn.q_proj, attn.k_proj):
                grads.append(proj.weight.grad.unflatten(0, (-1, 2, d))[:, 1])  # Q2 / K2 rows
            grads.append(
                attn.o_proj.weight.grad.unflatten(1, (-1, 2, d))[:, :, 1]
            )  # the new value half's columns
        return grads

    grads = second_map_grads()
    # lambda = 0 is what makes V1 exact, and it multiplies the second map's gradient: none yet (module docstring).
    assert all(g.abs().max() == 0 for g in grads[0::3] + grads[1::3])
    assert all(g.abs().max() > 0 for g in grads[2::3])  # o_proj's zero columns do train at once
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert all(float(layer.self_attn.lambda_full().detach()) != 0.0 for layer in model.model.layers)
    backward(model, ids)
    assert all(g.abs().max() > 0 for g in second_map_grads())


def test_gda_upcycles_exactly_where_its_ratio_divides_the_query_heads_of_a_kv_head(tmp_path, capsys):
    """4 query heads on 2 KV heads: GDA 2:1 (two signal heads and their noise map in each KV group) is exact, 4:1
    is refused saying why; lambda trains at the first backward, the noise queries after one step (DIFF V1's
    construction)."""
    folder, llama = llama_folder(tmp_path)
    ours = convert(folder, tmp_path / "gda", "gda", "--gda-ratio", "2")
    assert (ours.config.num_attention_heads, ours.config.noise_heads, ours.config.num_key_value_heads) == (
        4,
        2,
        2,
    )
    ids = torch.randint(0, 320, (2, 23))
    with torch.no_grad():
        assert_same_logits(ours(ids).logits, llama(ids).logits)
    argv = ["convert", "--from-llama", str(folder), "--attention", "gda", "--gda-ratio", "4"]
    assert cli_main([*argv, "--output-dir", str(tmp_path / "gda4")]) == 2
    assert "--gda-ratio divides the source's query heads per KV head (4 / 2 = 2)" in capsys.readouterr().err
    assert cli_main([*argv[:-4], "--gda-ratio", "2", "--output-dir", str(tmp_path / "x")]) == 2
    assert (
        "--gda-ratio moves an upcycled kind with noise maps; got --attention softmax"
        in capsys.readouterr().err
    )
    backward(ours, ids)
    for name, param in lambda_parameters(ours).items():
        assert param.grad.abs().min() > 0, name
    noise_rows = [
        layer.self_attn.q_proj.weight.grad.unflatten(0, (2, 3, -1))[:, 2] for layer in ours.model.layers
    ]
    assert all(rows.abs().max() == 0 for rows in noise_rows)
    torch.optim.SGD(ours.parameters(), lr=0.1).step()
    backward(ours, ids)
    assert all(layer.self_attn.q_proj.weight.grad.unflatten(0, (2, 3, -1))[:, 2].abs().max() > 0
               for layer in ours.model.layers)  # fmt: skip


def test_gated_gate_trains_at_the_first_backward():
    model = upcycle(load_softmax(random_llama(2).float()), "gated")
    backward(model, torch.randint(0, 101, (2, 19)))
    for layer in model.model.layers:
        attention = layer.self_attn
        gate_rows = attention.q_proj.weight.unflatten(0, (4, 2, -1))[:, 1]
        assert gate_rows.abs().max() == 0  # sigmoid(0) = 1/2, doubled by o_proj
        assert attention.q_proj.weight.grad.unflatten(0, (4, 2, -1))[:, 1].abs().min() > 0


def test_train_init_from_an_upcycled_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DIFFTRANSFORMER_CACHE", str(tmp_path / "cache"))
    folder, _ = llama_folder(tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(synthetic_texts()))
    for attention in KINDS:
        upcycled = tmp_path / f"up-{attention}"
        convert(folder, upcycled, attention)
        run = tmp_path / f"run-{attention}"
        argv = [
            "train", "--init-from", str(upcycled), "--preset", "micro", "--data", str(corpus), "--block-size", "64",
            "--needle-fraction", "0", "--max-steps", "3", "--report-to", "none", "--output-dir", str(run),
        ]  # fmt: skip
        assert cli_main(argv) == 0
        assert capsys.readouterr().out.strip().splitlines()[-1].startswith(f"{attention}: ")
        trained = DiffTransformerForCausalLM.from_pretrained(run)
        assert trained.config.attention == attention and trained.config.hidden_size == 64
        summary = json.loads((run / "train_summary.json").read_text())
        assert summary["global_step"] == 3
        start = DiffTransformerForCausalLM.from_pretrained(upcycled)
        moved = (
            trained.model.layers[0].self_attn.q_proj.weight - start.model.layers[0].self_attn.q_proj.weight
        )
        assert moved.abs().max() > 0


def test_train_init_from_refuses_a_diff_folder_to_upcycle_and_a_second_tokenizer(tmp_path, capsys):
    folder, _ = llama_folder(tmp_path)
    convert(folder, tmp_path / "v1", "diff")
    base = ["train", "--preset", "micro", "--output-dir", str(tmp_path / "run"), "--report-to", "none"]
    assert cli_main([*base, "--init-from", str(tmp_path / "v1"), "--attention", "diff_v2"]) == 2
    assert "must be a softmax model" in capsys.readouterr().err
    assert cli_main([*base, "--init-from", str(folder), "--tokenizer", str(folder)]) == 2
    assert "--tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_compare_init_from_continues_and_upcycles_the_same_model(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFTRANSFORMER_CACHE", str(tmp_path / "cache"))
    folder, _ = llama_folder(tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(synthetic_texts()))
    argv = [
        "compare", "--init-from", str(folder), "--variants", "softmax,diff_v2,diff", "--preset", "micro",
        "--data", str(corpus), "--block-size", "64", "--needle-fraction", "0", "--max-steps", "2", "--tasks", "mqar",
        "--report-to", "none", "--output-dir", str(tmp_path / "compare"),
    ]  # fmt: skip
    assert cli_main(argv) == 0
    runs = json.loads((tmp_path / "compare" / "results.json").read_text())["runs"]
    assert [run["variant"] for run in runs] == ["softmax", "diff_v2", "diff"]
    for run in runs:
        folder = tmp_path / "compare" / run["folder"]  # results.json keys runs relative to the comparison
        assert DiffTransformerForCausalLM.from_pretrained(folder).config.hidden_size == 64
    assert "DIFF V2" in (tmp_path / "compare" / "report.md").read_text()
