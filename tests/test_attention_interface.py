"""The three kinds in transformers' attention machinery: every implementation transformers registers that runs on
the CPU, a kernel registered with ``AttentionInterface``, continuous batching (``generate_batch``), ``transformers
serve``, and forwards that never read a device tensor back to the host."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AttentionInterface, DynamicCache, GenerationConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from difftransformer.layers import WholeHeadAttention
from helpers import completion_from_server, free_port, random_model, tiny_config
from kind_table import COMPOSITION_FIELDS, KIND_FIELDS

# every kind, and the compositions that window layers (windows through each implementation's masks and caches)
KINDS = {
    **KIND_FIELDS,
    **{name: fields for name, fields in COMPOSITION_FIELDS.items() if "sliding_window" in fields},
}
WHOLE = [name for name, fields in KINDS.items() if tiny_config(**fields).map_layout == "whole"]
SPLIT = [name for name in KINDS if name not in WHOLE]
# What transformers 5.23 registers and runs on a CPU: the flash-attention ones need CUDA and a flash package, and
# "paged|eager" takes continuous batching's paged cache (test_continuous_batching_equals_greedy_generation).
CPU_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")


def test_the_cpu_implementations_are_all_transformers_registers_but_flash_and_paged():
    registered = set(ALL_ATTENTION_FUNCTIONS.valid_keys()) | {"eager"}
    assert registered - set(CPU_IMPLEMENTATIONS) == {
        name for name in registered if "flash" in name or name.startswith("paged|")
    }


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 97, (3, 11), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :4], mask[2, :1] = 0, 0  # left padding of two lengths
    return ids, mask


# Every kind under every implementation. FlexAttention runs uncompiled on the CPU (7-14 s a kind): DIFF V1's own
# operator and the whole-head window's refusal by default, the other kinds' (transformers' own FlexAttention call)
# with the slow tests.
FLEX_BY_DEFAULT = {"diff", "motif-window-3"}
CPU_CASES = [
    pytest.param(kind, implementation, id=f"{kind}-{implementation}",
                 marks=pytest.mark.slow if implementation == "flex_attention" and kind not in FLEX_BY_DEFAULT else ())
    for kind in KINDS
    for implementation in CPU_IMPLEMENTATIONS
]  # fmt: skip


@pytest.mark.parametrize(("kind", "implementation"), CPU_CASES)
def test_every_cpu_implementation_gives_the_same_logits_and_generation(kind, implementation):
    """Padded logits and greedy generation (a KV cache, one token a step) under each implementation equal the
    default (sdpa) model's. FlexAttention generates without padding: torch 2.13's CPU inductor fails to compile the
    padded one-token step (transformers' own Llama fails the same way). It fails to compile a whole-head layer's
    sliding window too, so there FlexAttention is refused on the CPU in one line."""
    model = random_model(seed=1, dtype=torch.float32, **KINDS[kind])
    ids, mask = padded_batch()
    windowed_whole = any(
        isinstance(layer.self_attn, WholeHeadAttention) and layer.self_attn.sliding_window is not None
        for layer in model.model.layers
    )
    if implementation == "flex_attention" and windowed_whole:
        model.set_attn_implementation(implementation)
        with (
            torch.no_grad(),
            pytest.raises(ValueError, match="'flex_attention' cannot run a sliding-window layer"),
        ):
            model(ids)
        return
    generation_mask = None if implementation == "flex_attention" else mask
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        expected_tokens = model.generate(
            ids, attention_mask=generation_mask, max_new_tokens=5, do_sample=False
        )
    model.set_attn_implementation(implementation)
    assert model.config._attn_implementation == implementation
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
        tokens = model.generate(ids, attention_mask=generation_mask, max_new_tokens=5, do_sample=False)
    real = mask.bool()
    torch.testing.assert_close(logits[real], expected[real], atol=2e-5, rtol=2e-5)
    assert torch.equal(tokens, expected_tokens)


@pytest.mark.parametrize("kind", WHOLE)
def test_a_kernel_registered_with_the_attention_interface_runs_every_layer(kind):
    """A user's attention function registered with transformers (here sdpa behind a counter) is what every
    whole-layout point (the baseline, gated attention, DIFF V2, Motif) calls, once per layer and forward, as in
    Llama. As in transformers' windowed models (Mistral, Gemma), a function registered without a mask function gets
    no mask, only ``sliding_window=``: sdpa's needs its mask registered beside it."""
    calls = []

    def counted(module, *args, **kwargs):
        calls.append(module.layer_idx)
        return sdpa_attention_forward(module, *args, **kwargs)

    AttentionInterface.register("counted_sdpa", counted)
    AttentionMaskInterface.register("counted_sdpa", sdpa_mask)
    model = random_model(seed=2, dtype=torch.float32, **KINDS[kind])
    ids = torch.randint(3, 97, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
        model.set_attn_implementation("counted_sdpa")
        logits = model(ids).logits
    assert calls == list(range(model.config.num_hidden_layers))
    torch.testing.assert_close(logits, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kind", SPLIT)
def test_the_split_layout_refuses_a_registered_kernel_saying_why(kind):
    AttentionInterface.register("counted_sdpa", sdpa_attention_forward)
    model = random_model(seed=2, dtype=torch.float32, **KINDS[kind])
    with pytest.raises(ValueError, match="subtracts two before multiplying the value"):
        model.set_attn_implementation("counted_sdpa")


# Every kind and implementation; a windowed Motif paged and DIFF V1 with sdpa by default (each case costs about 12 s
# of set-up), the rest with the slow tests.
CONTINUOUS_BATCHING = [
    pytest.param(kind, implementation, id=f"{kind}-{implementation}",
                 marks=() if (kind, implementation) in {("motif-window-3", "paged|eager"), ("diff", "sdpa")}
                 else pytest.mark.slow)
    for kind in KINDS
    for implementation in ("sdpa", "paged|eager")
]  # fmt: skip


@pytest.mark.parametrize(("kind", "implementation"), CONTINUOUS_BATCHING)
def test_continuous_batching_equals_greedy_generation(kind, implementation):
    """``generate_batch`` (continuous batching on a paged cache, prompts of different lengths packed in one batch)
    gives each prompt the tokens plain greedy ``generate`` gives it alone."""
    model = random_model(seed=3, dtype=torch.float32, **KINDS[kind])
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 97, (n,), generator=gen).tolist() for n in (5, 9, 3)]
    with torch.no_grad():
        expected = [
            model.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False)[0, len(p) :].tolist()
            for p in prompts
        ]
    model.set_attn_implementation("eager" if implementation == "paged|eager" else implementation)
    config = GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    outputs = model.generate_batch(inputs=prompts, generation_config=config, progress_bar=False)
    assert [outputs[key].generated_tokens for key in sorted(outputs)] == expected


class HostReads(TorchDispatchMode):
    """Records every op that copies a device value to the host (a sync on an accelerator)."""

    READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default)

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", list(KINDS))
def test_no_forward_reads_a_device_tensor_back(kind):
    """A training step and a decode step on a device that is not the CPU (the meta device: shapes only, where
    reading a value would raise) read nothing back, as transformers' models do; the CPU-only checks (token ids in
    the vocabulary, whether a padding mask hides anything) are skipped there."""
    model = random_model(seed=1, dtype=torch.float32, **KINDS[kind]).to("meta")
    ids = torch.randint(0, 97, (2, 12), device="meta")
    model.train()
    with HostReads() as training:
        model(input_ids=ids, labels=ids).loss.backward()
    model.eval()
    with torch.no_grad():
        prefill = model(
            input_ids=ids,
            attention_mask=torch.ones(2, 12, dtype=torch.long, device="meta"),
            past_key_values=DynamicCache(config=model.config),
            use_cache=True,
        )
        with HostReads() as decoding:
            model(
                input_ids=ids[:, :1],
                attention_mask=torch.ones(2, 13, dtype=torch.long, device="meta"),
                past_key_values=prefill.past_key_values,
                use_cache=True,
            )
    assert training.reads == [] and decoding.reads == []


@pytest.mark.slow
def test_transformers_serve_answers_with_the_baselines_tokens(tmp_path):
    """``transformers serve`` with continuous batching on 127.0.0.1 answers ``/v1/completions`` with the tokens our
    baseline generates greedily. transformers 5.23's server takes only transformers' own classes (it looks the
    model class up by name in transformers), so it serves the baseline as the Llama it converts to exactly
    (docs/sharing.md)."""
    from difftransformer.convert.llama import to_llama
    from difftransformer.data.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["to be or not to be, that is the question. whether tis nobler " * 20], 300)
    model = random_model(seed=4, dtype=torch.float32, vocab_size=len(tokenizer), **KINDS["softmax"])
    prompt = tokenizer("to be or not", return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    expected = generated[0, prompt["input_ids"].shape[1] :]
    to_llama(model).save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    port = free_port()
    serve = os.path.join(os.path.dirname(sys.executable), "transformers")
    command = [serve, "serve", str(tmp_path / "llama"), "--continuous-batching", "--host", "127.0.0.1"]
    command += ["--port", str(port)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    body = {"model": str(tmp_path / "llama"), "prompt": "to be or not", "max_tokens": 8, "temperature": 0}
    answer = completion_from_server(command, env, port, body, timeout=120)
    assert answer["usage"]["completion_tokens"] == 8
    assert answer["choices"][0]["text"] == tokenizer.decode(expected)
