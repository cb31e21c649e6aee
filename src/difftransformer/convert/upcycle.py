"""Upcycling: a pretrained softmax model (a Llama-family folder, or our own softmax model) turned into a model of
another kind, or any composition of parts (layers/parts.py), that computes the same function at step 0 and whose
new parts all train from the first steps. The construction is read off the target's parts, one rule each.

Notation: the source has H query heads of width D in H_kv KV groups; head i's output is ``a_i V_g`` with
``a_i = softmax(q_i k_g^T / sqrt(D))``, g its group, and o_proj's columns [iD, (i+1)D) (``o_i``) take it to the
residual stream. Every other tensor (embeddings, norms, MLPs, lm_head) is copied unchanged. The target keeps the
source's H heads as its signal heads, d = D, and its H_kv KV groups.

- **Noise maps** (G signal heads a noise map): each signal head's query is q_i; each noise map's query is a copy of
  its group's first signal query (at G = 1, the head's own). A noise map and its G signal heads must read one KV
  group, so G divides the source's query heads per KV head (H / H_kv): G = 1, 2, 4 for Llama's 4 query heads a KV
  head; for a source without GQA only G = 1.
- **Map layout**. Whole: the source's K and V as they are. Split: K1 = K2 = k_g and V = [v_g | v_g] (2D wide,
  ``map_dim`` = D), o_proj's columns [o_i | 0]: head i's two maps read q_i and its noise query against k_g.
- **lambda**. Scalar: ``lambda_init`` = 0 and the lambda vectors ``q1 = q2 = u``, ``k1 = k2 = w`` (u, w random), so
  lambda = exp(u.w) - exp(u.w) + 0 = 0 exactly and each head's output is a_i V, whatever its noise map. Per token:
  ``lambda_proj`` zero, so lambda = sigmoid(0) = 1/2 for every token; with G = 1 the noise map equals its signal
  map and the head's output is a_i V / 2, o_proj doubled. With G > 1 a noise map would take half of another head's
  output from G - 1 of its signal heads: no per-token construction is exact, and upcycling refuses it.
- **Per-head norm**: none (an RMSNorm of a head's output would change the function), whatever the kind declares.
- **Output gate**: its rows of q_proj zero, so the gate is sigmoid(0) = 1/2, o_proj doubled once more.
- **Window**: none may window a layer (the source attends to every earlier key); upcycling refuses a windowed target.

The halvings and doublings are exact in floating point, so only the kernels' summation order separates the logits
from the source's. Trainable from the first steps: with the per-token lambda the loss gradient G reaching a_i
arrives as G on the signal query and -G/2 on the noise one (they separate at the first step), and lambda_proj gets
``-sigmoid'(0) <dL/dout_i, a_i V> x``; with the scalar lambda, lambda gets ``dL/dlambda = -<dL/dO, a_noise V>``,
nonzero, and through it all four vectors, and the noise queries (and a split head's value half behind o_proj's new
columns) from the second backward on, once the first step has moved lambda (any lambda exact for every input is 0,
and a noise map's gradient is lambda times its signal's); the gate rows get ``sigmoid'(0) <dL/dgate_out, out> x``.
A matched-size split model (H/2 heads of width 2D) cannot be exact: one combined map would have to serve two source
heads' values.

Costs: the noise maps add n D d_model query rows a layer (n = H / G), the split layout doubles k, v and o_proj, the
per-token lambda adds H d_model weights, the gate H D d_model rows.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from difftransformer.convert.folders import ConversionError, model_type
from difftransformer.convert.llama import from_llama
from difftransformer.errors import UsageError
from difftransformer.models import KINDS, PART_FIELDS, DiffTransformerConfig, DiffTransformerForCausalLM
from difftransformer.models.configuration import parts_of
from difftransformer.models.folders import load_model_folder


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
    model: DiffTransformerForCausalLM, attention: str, *, seed: int = 0, **parts
) -> DiffTransformerForCausalLM:
    """The ``attention`` model (a kind of :data:`~difftransformer.models.KINDS`, moved along any part by ``parts``:
    the configuration's part fields, e.g. ``gda_ratio=2``, ``output_gate="elementwise"``) computing what the softmax
    ``model`` computes, with every new parameter trainable (module docstring); "softmax" gives ``model`` itself.
    ``seed`` draws the scalar lambda's vectors. The result keeps ``model``'s dtype (the lambda vectors stay float32)
    and generation config. A target no construction serves exactly is refused, saying why."""
    if attention not in KINDS:
        raise UsageError(f"`attention` must be one of {tuple(KINDS)}; got {attention!r}")
    unknown = sorted(set(parts) - set(PART_FIELDS))
    if unknown:
        raise UsageError(f"upcycle takes the part fields {sorted(PART_FIELDS)}; got {unknown}")
    config = model.config
    if config.attention != "softmax":
        raise ConversionError(
            f"the model to upcycle must be a softmax model; got attention={config.attention!r}"
        )
    if attention == "softmax" and not parts:
        return model
    heads, kv_heads, width = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    # no per-head norm: a norm of a head's output would change the function (module docstring)
    fields = {**parts, "subln": "none"}
    shape = parts_of(attention, **fields)
    ratio = shape.noise_ratio or 1
    if any(shape.windowed(layer) for layer in range(config.num_hidden_layers)):
        raise ConversionError(
            f"the {attention} target windows layers (sliding_window={shape.window}) where the source attends to "
            "every earlier key: no construction is exact; upcycle with sliding_window_period=1"
        )
    if shape.lambda_mode == "token" and ratio > 1:
        raise ConversionError(
            f"a per-token lambda at `gda_ratio` {ratio} has no exact construction: at zero weights it subtracts half "
            "of a noise map from each of its signal heads, which differ from it (module docstring); upcycle at "
            "gda_ratio 1, or with lambda_mode scalar"
        )
    if shape.differential and (heads // kv_heads) % ratio:
        raise ConversionError(
            "upcycling is exact when `gda_ratio` divides the source's query heads per KV head "
            f"({heads} / {kv_heads} = {heads // kv_heads}): a noise map and its signal heads must read one KV "
            f"group; got `gda_ratio` {ratio!r}"
        )
    fields.update(num_attention_heads=heads, num_key_value_heads=kv_heads)
    if shape.lambda_mode == "scalar":
        fields["lambda_init"] = 0.0  # lambda = 0 at every depth needs a constant lambda_init of 0
    if shape.layout == "split":
        fields["map_dim"] = width
    try:
        target = config.with_attention(attention, **fields)
    except ValueError as err:
        raise UsageError(f"`attention` {attention} with {parts}: {err}") from err
    factor = (2 if shape.lambda_mode == "token" else 1) * (2 if shape.gate == "elementwise" else 1)
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        if ".self_attn." not in name:
            state[name] = tensor
            continue
        prefix, _, kind = name.rpartition(".self_attn.")
        prefix += ".self_attn."
        state.update(_attention_tensor(prefix, kind, tensor, target, factor))
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}.self_attn."
        if shape.lambda_mode == "scalar":
            # Equal pairs give lambda = exp(u.w) - exp(u.w) = 0 exactly; distinct random u, w give every vector a
            # gradient (a zero vector would leave its partner's gradient zero).
            u, w = (torch.randn(width, generator=generator) * target.lambda_std for _ in range(2))
            state.update(
                {
                    f"{prefix}lambda_vectors.{k}": t
                    for k, t in (("q1", u), ("q2", u.clone()), ("k1", w), ("k2", w.clone()))
                }
            )
        elif shape.lambda_mode == "token":
            state[f"{prefix}lambda_proj.weight"] = torch.zeros(heads, config.hidden_size, dtype=model.dtype)
    upcycled = DiffTransformerForCausalLM._from_config(target, dtype=model.dtype)
    upcycled.load_state_dict(state, strict=True)
    upcycled.generation_config = model.generation_config
    return upcycled.eval()


def _attention_tensor(
    prefix: str, kind: str, tensor: torch.Tensor, target: DiffTransformerConfig, factor: int
) -> dict[str, torch.Tensor]:
    """One softmax attention tensor as the target's (module docstring): q_proj's groups of signal rows, the noise
    map's copy of the first and zero gate rows; K1 = K2 and V = [v | v] for the split layout; o_proj times
    ``factor`` (and [o_i | 0] for the split layout)."""
    parts, width = target.parts, target.map_head_dim
    heads, ratio = target.num_attention_heads, target.parts.noise_ratio or 1
    split = parts.layout == "split"
    if kind == "q_proj.weight":
        groups = [tensor.unflatten(0, (heads // ratio, ratio, width))]  # (n, G, D, d_model): the signal rows
        if parts.differential:
            groups.append(groups[0][:, :1])  # the noise map: its group's first signal query
        if parts.gate == "elementwise":
            gate_width = 2 * width if split else width
            groups.append(
                tensor.new_zeros(heads // ratio, ratio * gate_width // width, width, tensor.shape[1])
            )
        return {prefix + kind: torch.cat(groups, dim=1).flatten(0, 2)}
    if kind == "o_proj.weight":
        if split:
            columns = tensor.unflatten(1, (heads, width))
            tensor = torch.cat([columns, torch.zeros_like(columns)], dim=2).flatten(1)
        return {prefix + kind: tensor * factor}
    if split:  # k_proj, v_proj: K1 = K2, V = [v | v] per KV group
        rows = tensor.unflatten(0, (target.num_key_value_heads, width))
        tensor = torch.cat([rows, rows], dim=1).flatten(0, 1)
    return {prefix + kind: tensor}


def initial_model(
    source: str | Path, attention: str | None = None, *, seed: int = 0, **parts
) -> DiffTransformerForCausalLM:
    """The model a run continues from (``train`` / ``compare --init-from``), in float32 for training: the folder's
    own model when ``attention`` is None or its kind with those ``parts`` (part fields, e.g. ``gda_ratio``), else a
    softmax or Llama-family source upcycled to ``attention`` with ``parts`` (``seed`` draws the scalar lambda's
    vectors)."""
    if model_type(source) == DiffTransformerConfig.model_type:
        ours = load_model_folder(source, DiffTransformerForCausalLM, what="init_from", dtype=torch.float32)
        if attention is None or (
            attention == ours.config.attention
            and all(getattr(ours.config, name) == value for name, value in parts.items())
        ):
            return ours
        return upcycle(load_softmax(ours), attention, seed=seed, **parts)
    upcycled = upcycle(load_softmax(source), attention or "softmax", seed=seed, **parts)
    return upcycled.to(torch.float32)
