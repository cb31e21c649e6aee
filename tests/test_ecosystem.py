"""DIFF V1 with the Hugging Face tools around transformers, used as a user would: accelerate's empty-weight
loading and dispatch, disk offload, and PEFT with the lambda vectors trained in full (``modules_to_save``)."""

from __future__ import annotations

import copy

import pytest
import safetensors.torch
import torch
from accelerate import init_empty_weights, load_checkpoint_and_dispatch

from difftransformer import DiffTransformerForCausalLM
from helpers import random_model

peft = pytest.importorskip("peft")

LAMBDA_NAMES = ("q1", "k1", "q2", "k2")
IDS = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38]])


def logits(model: torch.nn.Module, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def lambda_vectors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if ".lambda_vectors." in n}


def test_checkpoint_names_are_the_in_memory_names(tmp_path):
    model = random_model(dtype=torch.float32)
    model.save_pretrained(tmp_path)
    on_disk = set(safetensors.torch.load_file(tmp_path / "model.safetensors"))
    assert "model.layers.0.self_attn.lambda_vectors.q1" in on_disk
    assert not any(".self_attn.lambda_q" in name or ".self_attn.lambda_k" in name for name in on_disk)
    assert on_disk <= set(model.state_dict())


def test_init_empty_weights_and_load_checkpoint_and_dispatch(tmp_path):
    model = random_model(dtype=torch.float32)
    model.save_pretrained(tmp_path)
    with init_empty_weights():
        empty = DiffTransformerForCausalLM(model.config)
    dispatched = load_checkpoint_and_dispatch(empty, str(tmp_path / "model.safetensors"), device_map="auto")
    dispatched.eval()
    loaded = lambda_vectors(dispatched)
    assert loaded.keys() == lambda_vectors(model).keys() and len(loaded) == 4 * model.config.num_hidden_layers
    for name, value in lambda_vectors(model).items():
        assert torch.equal(loaded[name], value), name
    torch.testing.assert_close(logits(dispatched), logits(model), atol=1e-5, rtol=0)


def test_folders_with_the_llama_family_lambda_names_still_load(tmp_path):
    """Folders written before the lambda vectors took their in-memory names on disk (``self_attn.lambda_q1``, the
    paper's code's and DiffLlama's names) load through ``from_pretrained`` and ``load_state_dict``."""
    model = random_model(dtype=torch.float32)
    model.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    state = safetensors.torch.load_file(path)
    old = {name.replace(".lambda_vectors.", ".lambda_"): tensor for name, tensor in state.items()}
    assert "model.layers.1.self_attn.lambda_k2" in old
    safetensors.torch.save_file(old, path, metadata={"format": "pt"})

    loaded = DiffTransformerForCausalLM.from_pretrained(tmp_path).eval()
    for name, value in lambda_vectors(model).items():
        assert torch.equal(lambda_vectors(loaded)[name], value), name
    torch.testing.assert_close(logits(loaded), logits(model), atol=1e-5, rtol=0)

    fresh = DiffTransformerForCausalLM(model.config).eval()
    fresh.load_state_dict(old, strict=False)  # lm_head is tied and not on disk
    for name, value in lambda_vectors(model).items():
        assert torch.equal(lambda_vectors(fresh)[name], value), name

    loaded.save_pretrained(tmp_path / "resaved")
    resaved = set(safetensors.torch.load_file(tmp_path / "resaved" / "model.safetensors"))
    assert "model.layers.1.self_attn.lambda_vectors.k2" in resaved


def test_disk_offload_runs_every_parameter_through_its_module(tmp_path):
    """With most layers offloaded to disk, accelerate loads a module's weights only around its forward: the
    per-head norm's gain (fused into the C++ decode step otherwise) and the lambda vectors must be read there."""
    model = random_model(dtype=torch.float32, hidden_size=64, intermediate_size=96, num_hidden_layers=4)
    model.save_pretrained(tmp_path / "model")
    offloaded = DiffTransformerForCausalLM.from_pretrained(
        tmp_path / "model",
        device_map="auto",
        max_memory={"cpu": "250KB"},
        offload_folder=str(tmp_path / "offload"),
    ).eval()
    assert "disk" in set(offloaded.hf_device_map.values())
    torch.testing.assert_close(logits(offloaded), logits(model), atol=1e-5, rtol=0)
    with torch.no_grad():
        expected = model.generate(IDS, max_new_tokens=6, do_sample=False)
        generated = offloaded.generate(IDS, max_new_tokens=6, do_sample=False)
    assert torch.equal(generated, expected)


def test_peft_lora_with_trained_lambda_vectors():
    """LoRA on the projections with the lambda vectors trained in full: inference after an optimizer step uses the
    updated vectors, and ``disable_adapter()`` gives the base model's logits."""
    torch.manual_seed(0)
    base = random_model(dtype=torch.float32, **{"tie_word_embeddings": False})
    base_logits = logits(base)
    model = peft.get_peft_model(
        copy.deepcopy(base),
        peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lambda_vectors"]),
    )
    model.eval()
    torch.testing.assert_close(logits(model), base_logits, atol=1e-5, rtol=0)  # LoRA starts at zero

    model.train()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    loss = model(input_ids=IDS, labels=IDS).loss
    loss.backward()
    optimizer.step()
    model.eval()
    trained = {n: p for n, p in model.named_parameters() if "modules_to_save" in n and ".q1" in n}
    assert trained and all(p.requires_grad for p in trained.values())

    with torch.no_grad():
        inference = logits(model)
    with torch.enable_grad():  # the exact path: lambda recomputed from the vectors, never remembered
        exact = model(input_ids=IDS, use_cache=False).logits.detach()
    torch.testing.assert_close(inference, exact, atol=1e-5, rtol=0)
    assert (inference - base_logits).abs().max() > 1e-3  # the step changed the model

    with torch.no_grad():  # a second update outside training mode (no train/eval switch)
        for vector in trained.values():
            vector.add_(0.25)
    with torch.enable_grad():
        exact = model(input_ids=IDS, use_cache=False).logits.detach()
    torch.testing.assert_close(logits(model), exact, atol=1e-5, rtol=0)

    with model.disable_adapter():
        torch.testing.assert_close(logits(model), base_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits(model), exact, atol=1e-5, rtol=0)


def test_peft_adapter_saves_and_reloads_the_lambda_vectors(tmp_path):
    base = random_model(dtype=torch.float32, **{"tie_word_embeddings": False})
    model = peft.get_peft_model(
        copy.deepcopy(base),
        peft.LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lambda_vectors"]),
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "modules_to_save" in name or "lora_B" in name:
                param.add_(0.1)
    model.eval()
    expected = logits(model)
    model.save_pretrained(tmp_path)
    reloaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path).eval()
    torch.testing.assert_close(logits(reloaded), expected, atol=1e-5, rtol=0)
