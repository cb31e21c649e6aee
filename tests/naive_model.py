"""An independent float64 implementation of DIFF V1, GDA, DIFF V2, gated attention and the baseline, written from
the papers with loops over heads.

It reads only a state dict (the Llama-family checkpoint names of docs/architecture.md) and a handful of config numbers, so it checks
our names and layouts as much as our arithmetic.
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


def softmax_rows(logits: torch.Tensor, causal: bool) -> torch.Tensor:
    if causal:
        t = logits.shape[0]
        logits = logits.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(logits, dim=-1)


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
        q, k, v = (h @ sd[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        outs = []
        theta = cfg.rope_parameters["rope_theta"]
        if cfg.attention in ("diff", "gda"):
            # GDA (Lim et al. §2.2): h signal heads, one noise map a group of G of them; DIFF V1 is G = 1.
            ratio = cfg.gda_ratio if cfg.attention == "gda" else 1
            noise = heads // ratio
            d = cfg.map_dim or cfg.hidden_size // (heads + noise)
            qs, ks, vs = (
                q.view(t, noise, ratio + 1, d),
                k.view(t, 2 * kv_heads, d),
                v.view(t, kv_heads, 2 * d),
            )
            lam_init = (
                0.8 - 0.6 * math.exp(-0.3 * layer) if cfg.lambda_init == "depth" else float(cfg.lambda_init)
            )
            a = sd[p + "self_attn.lambda_q1"] @ sd[p + "self_attn.lambda_k1"]
            b = sd[p + "self_attn.lambda_q2"] @ sd[p + "self_attn.lambda_k2"]
            lam = torch.exp(a) - torch.exp(b) + lam_init
            for i in range(heads):
                g = i // (heads // kv_heads)
                group, member = divmod(i, ratio)
                maps = []
                for c, query in enumerate((qs[:, group, member], qs[:, group, ratio])):
                    qi = rope(query, pos, theta, cfg.rope_style)
                    kg = rope(ks[:, 2 * g + c], pos, theta, cfg.rope_style)
                    maps.append(softmax_rows(qi @ kg.T / math.sqrt(d), cfg.causal))
                o = (maps[0] - lam * maps[1]) @ vs[:, g]
                if cfg.subln != "none":
                    gain = sd[p + "self_attn.subln.weight"] if cfg.subln == "affine" else None
                    o = rms(o, gain, cfg.subln_eps)
                outs.append(o * (1 - lam_init))
        elif cfg.attention == "gated":
            # Qiu et al. Eq. 5 at G1: each head's output times sigmoid of its gate, q_proj holding query | gate.
            d = cfg.hidden_size // heads
            qs, ks, vs = q.view(t, heads, 2 * d), k.view(t, kv_heads, d), v.view(t, kv_heads, d)
            for i in range(heads):
                g = i // (heads // kv_heads)
                qi = rope(qs[:, i, :d], pos, theta, cfg.rope_style)
                kg = rope(ks[:, g], pos, theta, cfg.rope_style)
                attn = softmax_rows(qi @ kg.T / math.sqrt(d), cfg.causal) @ vs[:, g]
                outs.append(attn * torch.sigmoid(qs[:, i, d:]))
        else:
            q_heads = 2 * heads if cfg.attention == "diff_v2" else heads
            d = cfg.hidden_size // heads
            qs, ks, vs = q.view(t, q_heads, d), k.view(t, kv_heads, d), v.view(t, kv_heads, d)
            per_head = []
            for j in range(q_heads):
                g = j // (q_heads // kv_heads)
                qj = rope(qs[:, j], pos, theta, cfg.rope_style)
                kg = rope(ks[:, g], pos, theta, cfg.rope_style)
                per_head.append(softmax_rows(qj @ kg.T / math.sqrt(d), cfg.causal) @ vs[:, g])
            if cfg.attention == "diff_v2":
                gate = torch.sigmoid(h @ sd[p + "self_attn.lambda_proj.weight"].T)  # (T, h)
                outs = [per_head[2 * i] - gate[:, i : i + 1] * per_head[2 * i + 1] for i in range(heads)]
            else:
                outs = per_head
        x = x + torch.cat(outs, dim=-1) @ sd[p + "self_attn.o_proj.weight"].T
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
