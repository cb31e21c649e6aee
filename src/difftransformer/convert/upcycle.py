"""Upcycling: a pretrained softmax model (a Llama-family folder, or our own softmax model) turned into DIFF V2, DIFF
V1, GDA or gated attention that computes the same function at step 0 and whose new parts all train from the first
steps.

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

GDA (``attention="gda"``, ratio G, h = H signal heads, n = H / G noise maps, the source's H_kv KV groups, d = D):
DIFF V1's construction for the signal heads (Q1 = q_i, K1 = K2 = k_g, V = [v_g | v_g], o_proj [o_i | 0], lambda =
0, no norm), and each noise map's query a copy of its group's first signal query (with lambda = 0 any query is exact;
this one starts the noise map where DIFF V1's starts). It exists when a noise map and its G signal heads can share
the source's KV group: G divides the source's query heads per KV head (H / H_kv), e.g. G = 1, 2, 4 for Llama's 4
query heads a KV head; for a source without GQA only G = 1 (DIFF V1's shape). Other ratios would need signal heads
of two KV groups to subtract one noise map, which reads one group's V: no construction is exact. Trainable as DIFF
V1: lambda and the lambda vectors from the first backward, the noise queries from the second.

Gated attention (``attention="gated"``, the source's heads): each head's q_proj rows become [q_i | 0], the gate rows
zero, so the gate is sigmoid(0) = 1/2 for every token, and o_proj is doubled: ``2 o_i (a_i V / 2) = o_i a_i V``, the
halving and doubling exact in floating point. Trainable: the gate rows get ``sigmoid'(0) <dL/dgate_out, a_i V> x``,
nonzero, at the first backward.

Costs: DIFF V2 adds H*D*d_model query rows and H*d_model lambda weights per layer; DIFF V1 doubles q, k, v and
o_proj (2x the attention parameters and the attention FLOPs of the source); GDA adds n*D*d_model noise query rows and
doubles k, v and o_proj; gated attention adds H*D*d_model gate rows.
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

UPCYCLE_KINDS: tuple[str, ...] = ("softmax", "diff_v2", "diff", "gda", "gated")


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
    model: DiffTransformerForCausalLM, attention: str, *, seed: int = 0, gda_ratio: int = 1
) -> DiffTransformerForCausalLM:
    """The ``attention`` model ("softmax": ``model`` itself; "diff_v2"; "diff"; "gda" with ``gda_ratio`` signal heads
    a noise map; "gated") computing what the softmax ``model`` computes, with every new parameter trainable (module
    docstring). ``seed`` draws DIFF V1's and GDA's lambda vectors. The result keeps ``model``'s dtype (the lambda
    vectors stay float32) and generation config."""
    if attention not in UPCYCLE_KINDS:
        raise UsageError(f"attention must be one of {UPCYCLE_KINDS}; got {attention!r}")
    if gda_ratio != 1 and attention != "gda":
        raise UsageError(f"`gda_ratio` is for `attention` gda; got `attention` {attention}")
    config = model.config
    if config.attention != "softmax":
        raise ConversionError(
            f"the model to upcycle must be a softmax model; got attention={config.attention!r}"
        )
    if attention == "softmax":
        return model
    heads, kv_heads, width = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    if attention == "gda" and (
        not isinstance(gda_ratio, int) or gda_ratio < 1 or (heads // kv_heads) % gda_ratio
    ):
        raise ConversionError(
            f"GDA upcycles exactly when `gda_ratio` divides the source's query heads per KV head "
            f"({heads} / {kv_heads} = {heads // kv_heads}): a noise map and its signal heads must read one KV group; "
            f"got `gda_ratio` {gda_ratio!r}"
        )
    if attention in ("diff_v2", "gated"):
        target = dataclasses.replace(config, attention=attention)
    else:
        # lambda = 0 at every depth needs a constant lambda_init of 0; no per-head norm (module docstring).
        target = dataclasses.replace(
            config, attention=attention, map_dim=width, lambda_init=0.0, subln="none", gda_ratio=gda_ratio
        )
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        if ".self_attn." not in name:
            state[name] = tensor
            continue
        prefix, _, kind = name.rpartition(".self_attn.")
        prefix += ".self_attn."
        if attention == "diff_v2":
            state.update(_diff_v2_layer(prefix, kind, tensor, heads))
        elif attention == "gated":
            state.update(_gated_layer(prefix, kind, tensor, heads))
        else:
            state.update(_grouped_diff_layer(prefix, kind, tensor, heads, kv_heads, width, gda_ratio))
    if target.differential_heads:
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


def _gated_layer(prefix: str, kind: str, tensor: torch.Tensor, heads: int) -> dict[str, torch.Tensor]:
    """One softmax attention tensor as gated attention's: each head's query rows then zero gate rows, o_proj
    doubled; K and V unchanged."""
    if kind == "q_proj.weight":
        rows = tensor.unflatten(0, (heads, -1))
        return {prefix + kind: torch.cat([rows, torch.zeros_like(rows)], dim=1).flatten(0, 1)}
    if kind == "o_proj.weight":
        return {prefix + kind: tensor * 2}
    return {prefix + kind: tensor}


def _grouped_diff_layer(
    prefix: str, kind: str, tensor: torch.Tensor, heads: int, kv_heads: int, width: int, ratio: int
) -> dict[str, torch.Tensor]:
    """One softmax attention tensor as GDA's at ``ratio`` (DIFF V1's at 1; map width = the source's head width):
    each group of ``ratio`` heads' query rows, then its first head's rows again for the noise map; K1 = K2 and V =
    [v | v] per KV group; o_proj's columns [o_i | 0] per head."""
    if kind == "o_proj.weight":
        columns = tensor.unflatten(1, (heads, width))
        return {prefix + kind: torch.cat([columns, torch.zeros_like(columns)], dim=2).flatten(1)}
    if kind == "q_proj.weight":
        groups = tensor.unflatten(0, (heads // ratio, ratio, width))
        return {prefix + kind: torch.cat([groups, groups[:, :1]], dim=1).flatten(0, 2)}
    rows = tensor.unflatten(0, (kv_heads, width))
    return {prefix + kind: torch.cat([rows, rows], dim=1).flatten(0, 1)}


def initial_model(
    source: str | Path, attention: str | None = None, *, seed: int = 0, gda_ratio: int = 1
) -> DiffTransformerForCausalLM:
    """The model a run continues from (``train`` / ``compare --init-from``), in float32 for training: the folder's
    own model when ``attention`` is None or its kind, else a softmax or Llama-family source upcycled to
    ``attention`` (``seed`` draws DIFF V1's and GDA's lambda vectors; ``gda_ratio`` is GDA's)."""
    if model_type(source) == DiffTransformerConfig.model_type:
        ours = load_model_folder(source, DiffTransformerForCausalLM, what="init_from", dtype=torch.float32)
        if attention is None or (attention == ours.config.attention and gda_ratio == ours.config.gda_ratio):
            return ours
        return upcycle(load_softmax(ours), attention, seed=seed, gda_ratio=gda_ratio)
    upcycled = upcycle(load_softmax(source), attention or "softmax", seed=seed, gda_ratio=gda_ratio)
    return upcycled.to(torch.float32)
