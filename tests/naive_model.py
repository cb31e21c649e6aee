"""An independent float64 implementation of every point of the space of attention parts (layers/parts.py: DIFF V1,
GDA, DIFF V2, gated attention, Motif's attention, their compositions and the baseline), written from the papers'
formulas with loops over heads.

It reads only weights by their checkpoint names (the Llama-family names of docs/architecture.md) and a handful of
config numbers, so it checks our names and layouts as much as our arithmetic. :func:`attention_reference` is one
layer on one sequence and takes any weights, the module's own parameters included (so autograd gives the reference's
gradients); :func:`naive_causal_lm` is the whole model.
"""

from __future__ import annotations

import math

import torch
from transformers.core_model_loading import revert_weight_conversion


def rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float, style: str) -> torch.Tensor:
    """x: (T, d) rotated pair by pair."""
    d = x.shape[-1]
    out = x.clone()
    for j in range(d // 2):
        angle = positions.double() * theta ** (-2.0 * j / d)
        a, b = (2 * j, 2 * j + 1) if style == "interleaved" else (j, j + d // 2)
        out[:, a] = x[:, a] * torch.cos(angle) - x[:, b] * torch.sin(angle)
        out[:, b] = x[:, a] * torch.sin(angle) + x[:, b] * torch.cos(angle)
    return out


def softmax_rows(logits: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Softmax over the visible keys of each row; a row without one is all zeros."""
    probs = torch.softmax(logits.masked_fill(~visible, -math.inf), dim=-1)
    return torch.nan_to_num(probs, nan=0.0)


def visible_keys(
    q_len: int, causal: bool, window: int | None, keys: torch.Tensor | None = None
) -> torch.Tensor:
    """(T, T) bool: key j visible to query i: j <= i when causal, i - j < window within a window (the query and the
    window - 1 keys before it), and ``keys[j]`` (a padding mask) when given."""
    i, j = torch.arange(q_len)[:, None], torch.arange(q_len)[None]
    visible = torch.ones(q_len, q_len, dtype=torch.bool)
    if causal:
        visible &= j <= i
    if window is not None:
        visible &= i - j < window
    if keys is not None:
        visible &= keys[None, :]
    return visible


def attention_reference(
    cfg, w: dict, h: torch.Tensor, layer: int, positions: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """One layer's attention (T, d_model) on one sequence ``h`` (T, d_model), head by head.

    ``w`` holds the layer's weights under ``self_attn.``: ``q_proj.weight``, ``k_proj.weight``, ``v_proj.weight``,
    ``o_proj.weight``, the scalar lambda's ``lambda_q1`` ... ``lambda_k2`` or ``lambda_proj.weight``, and
    ``subln.weight`` with a gained norm. q_proj's rows: per noise map (per head without noise maps) its G signal
    queries, its noise query, then G gate blocks. Head s of a group of G shares the group's noise map (Lim et al.
    §2.2); the split layout (Ye et al. §2.1) forms two d-wide maps over a 2d-wide value, K1 | K2 a KV group; the whole
    layout forms whole query heads over d-wide K and V (DIFF V2; Motif's GDLA). Head s's output is
    ``A_s V - lambda_s A_noise(s) V``: lambda the scalar exp(q1.k1) - exp(q2.k2) + lambda_init (Eq. 2) or
    sigmoid(x W_lambda)_s per token; then the per-head norm (Eq. 3), the 1 - lambda_init scale with the scalar lambda,
    and the gate, sigmoid(x W_gate_s) (Qiu et al. Eq. 5, G1)."""
    heads, kv_heads, t = cfg.num_attention_heads, cfg.num_key_value_heads, h.shape[0]
    differential = cfg.gda_ratio is not None
    ratio = cfg.gda_ratio or 1
    groups = heads // ratio if differential else heads
    split = cfg.map_layout == "split"
    d = cfg.map_dim or cfg.hidden_size // (heads + groups if split else heads)
    width = 2 * d if split else d
    blocks = ratio + (1 if differential else 0)
    gated = cfg.output_gate == "elementwise"
    theta = cfg.rope_parameters["rope_theta"]
    q = (h @ w["q_proj.weight"].T).view(t, groups, blocks * d + (ratio * width if gated else 0))
    k, v = h @ w["k_proj.weight"].T, h @ w["v_proj.weight"].T
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * layer) if cfg.lambda_init == "depth" else float(cfg.lambda_init)
    if cfg.lambda_mode == "scalar":
        a = w["lambda_q1"] @ w["lambda_k1"]
        b = w["lambda_q2"] @ w["lambda_k2"]
        lambdas = [torch.exp(a) - torch.exp(b) + lam_init] * heads
    elif cfg.lambda_mode == "token":
        weights = torch.sigmoid(h @ w["lambda_proj.weight"].T)  # (T, h)
        lambdas = [weights[:, s : s + 1] for s in range(heads)]

    def query(group: int, block: int) -> torch.Tensor:
        return rope(q[:, group, block * d : (block + 1) * d], positions, theta, cfg.rope_style)

    def attend(qi: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        key = rope(key, positions, theta, cfg.rope_style)
        return softmax_rows(qi @ key.T / math.sqrt(d), visible) @ value

    outs = []
    for s in range(heads):
        group, member = divmod(s, ratio)
        if split:
            g = s // (heads // kv_heads)
            k1, k2 = k.view(t, 2 * kv_heads, d)[:, 2 * g], k.view(t, 2 * kv_heads, d)[:, 2 * g + 1]
            value = v.view(t, kv_heads, 2 * d)[:, g]
            o = attend(query(group, member), k1, value) - lambdas[s] * attend(query(group, ratio), k2, value)
        else:
            # query heads a KV head, the query heads ordered group by group
            per_kv = (groups * blocks) // kv_heads
            attended = []
            for block in (member, ratio) if differential else (member,):
                g = (group * blocks + block) // per_kv
                keys, values = k.view(t, kv_heads, d)[:, g], v.view(t, kv_heads, d)[:, g]
                attended.append(attend(query(group, block), keys, values))
            o = attended[0] - lambdas[s] * attended[1] if differential else attended[0]
        if cfg.subln != "none":
            o = rms(o, w["subln.weight"] if cfg.subln == "affine" else None, cfg.subln_eps)
        if cfg.lambda_mode == "scalar":
            o = o * (1 - lam_init)
        if gated:
            gate = q[:, group, blocks * d + member * width : blocks * d + (member + 1) * width]
            o = o * torch.sigmoid(gate)
        outs.append(o)
    return torch.cat(outs, dim=-1) @ w["o_proj.weight"].T


def checkpoint_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict under the names ``save_pretrained`` writes (the checkpoint names)."""
    return revert_weight_conversion(model, model.state_dict())


def naive_causal_lm(sd: dict[str, torch.Tensor], cfg, ids: torch.Tensor) -> torch.Tensor:
    """Logits (T, V) of one sequence ``ids`` (T,) with positions 0..T-1."""
    sd = {k: v.double() for k, v in sd.items()}
    t = ids.shape[0]
    pos = torch.arange(t)
    x = sd["model.embed_tokens.weight"][ids]
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        h = rms(x, sd[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        window = cfg.sliding_window if cfg.layer_types[layer] == "sliding_attention" else None
        weights = {
            k.removeprefix(p + "self_attn."): v for k, v in sd.items() if k.startswith(p + "self_attn.")
        }
        x = x + attention_reference(cfg, weights, h, layer, pos, visible_keys(t, cfg.causal, window))
        h = rms(x, sd[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate = h @ sd[p + "mlp.gate_proj.weight"].T
        x = (
            x
            + (gate * torch.sigmoid(gate) * (h @ sd[p + "mlp.up_proj.weight"].T))
            @ sd[p + "mlp.down_proj.weight"].T
        )
    x = rms(x, sd["model.norm.weight"], cfg.rms_norm_eps)
    head = sd["model.embed_tokens.weight"] if cfg.tie_word_embeddings else sd["lm_head.weight"]
    return x @ head.T
