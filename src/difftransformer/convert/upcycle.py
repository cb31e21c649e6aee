"""Upcycling: a pretrained softmax model (a Llama-family folder, or our own softmax model) turned into DIFF V2 or
DIFF V1 that computes the same function at step 0 and whose differential parts all train from the first steps.

Notation: the source has H query heads of width D in H_kv KV groups; head i's output is ``a_i V_g`` with
``a_i = softmax(q_i k_g^T / sqrt(D))``, g its group, and o_proj's columns [iD, (i+1)D) (``o_i``) take it to the
residual stream. Every other tensor (embeddings, norms, MLPs, lm_head) is copied unchanged.

DIFF V2 (``attention="diff_v2"``, h = H heads, the source's K/V): each source head i becomes the query pair
(2i, 2i+1) with both rows equal to q_i, so both maps are a_i (the pair sits in group g: 2i // (2H / H_kv) =
i // (H / H_kv)); ``lambda_proj`` is zero, so lambda = sigmoid(0) = 1/2 for every token; o_proj is doubled. The
head's output is ``2 o_i (a_i V - a_i V / 2) = o_i a_i V``: the halving and doubling are exact in floating point,
so only the kernels' summation order separates the logits from the source's. Trainable: the loss gradient G
reaching a_i arrives as G on the first query and -G/2 on the second (they separate at the first step), and
lambda_proj gets ``-sigmoid'(0) <dL/dout_i, a_i V> x``, nonzero.

DIFF V1 (``attention="diff"``, h = H heads, h_kv = H_kv, ``map_dim`` d = D so heads are 2D wide): Q1 = Q2 = q_i,
K1 = K2 = k_g, V = [v_g | v_g] (2D wide), o_proj's columns [o_i | 0]; ``lambda_init`` = 0 and the lambda vectors
``lambda_q1 = lambda_q2 = u``, ``lambda_k1 = lambda_k2 = w`` (u, w random), so lambda = exp(u.w) - exp(u.w) + 0 = 0
exactly; no per-head norm (``subln="none"``: an RMSNorm of the head's output would change the function). The
head's output is ``o_i (a_i - 0 a_i) v_g = o_i a_i v_g``. Trainable: lambda gets ``dL/dlambda =
-<dL/dO, a_i V>``, nonzero, and through it all four vectors (+-exp(u.w) w and +-exp(u.w) u); o_proj's zero
columns get ``dL/dy (a_i v_g)``. V1 cannot give the second map a gradient at the first backward: any lambda making
the output exact for every input is 0 (the second map multiplies the same V as the first), and the second map's
gradient is lambda times the first's. It gets one from the second backward on, once the first step has moved
lambda; so do the value half behind o_proj's new columns. A matched-size V1 (H/2 heads of width 2D) cannot be
exact: one combined map would have to serve two source heads' values.

Costs: DIFF V2 adds H*D*d_model query rows and H*d_model lambda weights per layer; DIFF V1 doubles q, k, v and
o_proj (2x the attention parameters and the attention FLOPs of the source).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from difftransformer.convert.folders import ConversionError, model_type
from difftransformer.convert.llama import from_llama
from difftransformer.errors import UsageError
from difftransformer.models import DiffTransformerConfig, DiffTransformerForCausalLM
from difftransformer.models.folders import load_model_folder

UPCYCLE_KINDS: tuple[str, ...] = ("softmax", "diff_v2", "diff")


def load_softmax(
    source: str | Path | LlamaForCausalLM | DiffTransformerForCausalLM, *, rope_style: str = "half"
) -> DiffTransformerForCausalLM:
    """Our softmax model from ``source``: a Llama-family model or folder (imported exactly by
    :func:`~difftransformer.convert.llama.from_llama` with ``rope_style``) or our own softmax model or folder (as
    it is)."""
    if isinstance(source, LlamaForCausalLM):
        return from_llama(source, rope_style=rope_style)
    if not isinstance(source, DiffTransformerForCausalLM):
        found = model_type(source)
        if found == "llama":
            return from_llama(source, rope_style=rope_style)
        if found != DiffTransformerConfig.model_type:
            raise ConversionError(
                f"source must be a Llama-family folder (model_type 'llama') or our softmax model; {source} holds "
                f"model_type {found!r}"
            )
        source = load_model_folder(source, DiffTransformerForCausalLM, what="source", dtype="auto")
    if source.config.attention != "softmax":
        raise ConversionError(
            f"source must be a softmax model to upcycle; got attention={source.config.attention!r} (already "
            "differential: train it with --init-from as it is)"
        )
    return source.eval()


def upcycle(
    model: DiffTransformerForCausalLM, attention: str, *, seed: int = 0
) -> DiffTransformerForCausalLM:
    """The ``attention`` model ("softmax": ``model`` itself; "diff_v2"; "diff") computing what the softmax
    ``model`` computes, with every differential parameter trainable (module docstring). ``seed`` draws DIFF V1's
    lambda vectors. The result keeps ``model``'s dtype (DIFF V1's lambda vectors stay float32) and generation
    config."""
    if attention not in UPCYCLE_KINDS:
        raise UsageError(f"attention must be one of {UPCYCLE_KINDS}; got {attention!r}")
    config = model.config
    if config.attention != "softmax":
        raise ConversionError(
            f"the model to upcycle must be a softmax model; got attention={config.attention!r}"
        )
    if attention == "softmax":
        return model
    heads, kv_heads, width = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    if attention == "diff_v2":
        target = dataclasses.replace(config, attention="diff_v2")
    else:
        # lambda = 0 at every depth needs a constant lambda_init of 0; no per-head norm (module docstring).
        target = dataclasses.replace(config, attention="diff", map_dim=width, lambda_init=0.0, subln="none")
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        if ".self_attn." not in name:
            state[name] = tensor
            continue
        prefix, _, kind = name.rpartition(".self_attn.")
        if attention == "diff_v2":
            state.update(_diff_v2_layer(prefix + ".self_attn.", kind, tensor, heads))
        else:
            state.update(_diff_v1_layer(prefix + ".self_attn.", kind, tensor, heads, kv_heads, width))
    if attention == "diff":
        for layer in range(config.num_hidden_layers):
            prefix = f"model.layers.{layer}.self_attn.lambda_vectors."
            # Equal pairs give lambda = exp(u.w) - exp(u.w) = 0 exactly; distinct random u, w give every vector a
            # gradient (a zero vector would leave its partner's gradient zero).
            u, w = (torch.randn(width, generator=generator) * target.lambda_std for _ in range(2))
            state.update(
                {prefix + "q1": u, prefix + "q2": u.clone(), prefix + "k1": w, prefix + "k2": w.clone()}
            )
    upcycled = DiffTransformerForCausalLM._from_config(target, dtype=model.dtype)
    upcycled.load_state_dict(state, strict=True)
    upcycled.generation_config = model.generation_config
    return upcycled.eval()


def _diff_v2_layer(prefix: str, kind: str, tensor: torch.Tensor, heads: int) -> dict[str, torch.Tensor]:
    """One softmax attention tensor as DIFF V2's: each query head's rows twice, o_proj doubled, lambda_proj zero
    (added beside o_proj); K and V unchanged."""
    if kind == "q_proj.weight":
        return {prefix + kind: tensor.unflatten(0, (heads, -1)).repeat_interleave(2, dim=0).flatten(0, 1)}
    if kind == "o_proj.weight":
        lambda_proj = tensor.new_zeros(heads, tensor.shape[0])
        return {prefix + kind: tensor * 2, prefix + "lambda_proj.weight": lambda_proj}
    return {prefix + kind: tensor}


def _diff_v1_layer(
    prefix: str, kind: str, tensor: torch.Tensor, heads: int, kv_heads: int, width: int
) -> dict[str, torch.Tensor]:
    """One softmax attention tensor as DIFF V1's (map width = the source's head width): Q1 = Q2 = the head's query
    rows, K1 = K2 and V = [v | v] per KV group, o_proj's columns [o_i | 0] per head."""
    if kind == "o_proj.weight":
        columns = tensor.unflatten(1, (heads, width))
        return {prefix + kind: torch.cat([columns, torch.zeros_like(columns)], dim=2).flatten(1)}
    groups = heads if kind == "q_proj.weight" else kv_heads
    rows = tensor.unflatten(0, (groups, width))
    return {prefix + kind: torch.cat([rows, rows], dim=1).flatten(0, 1)}


def initial_model(
    source: str | Path, attention: str | None = None, *, seed: int = 0
) -> DiffTransformerForCausalLM:
    """The model a run continues from (``train`` / ``compare --init-from``), in float32 for training: the folder's
    own model when ``attention`` is None or its kind, else a softmax or Llama-family source upcycled to
    ``attention`` (``seed`` draws DIFF V1's lambda vectors)."""
    if model_type(source) == DiffTransformerConfig.model_type:
        ours = load_model_folder(source, DiffTransformerForCausalLM, what="init_from", dtype=torch.float32)
        if attention is None or attention == ours.config.attention:
            return ours
        return upcycle(load_softmax(ours), attention, seed=seed)
    return upcycle(load_softmax(source), attention or "softmax", seed=seed).to(torch.float32)
