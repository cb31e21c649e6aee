"""Attention maps of any causal LM and what the tasks read from them: the combined map of every layer, the shares
of attention on an answer and on the rest of the context (the ``attention`` and ``mqar`` tasks), and the panels of
the ``attention`` task's heatmaps (a DIFF layer's two maps beside their difference).

Our models return their combined map with ``output_attentions``: each signal head's map minus lambda times its noise
map's (A1 - lambda A2 for DIFF V1 and GDA, A_s - sigmoid(lambda_s) A_noise(s) for DIFF V2 and Motif), the softmax
map for kinds without noise maps (the baseline, gated attention, whose gate scales the heads' outputs, not their
maps); the parts declare which (layers/parts.py), and the layers give the two maps beside their difference
(``output_component_maps``). A transformers DiffLlama returns its 2h component maps, combined here as head j minus
lambda times head j + h (its pairing); any other model its softmax maps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from difftransformer.errors import UsageError
from difftransformer.eval.common import is_difftransformer
from difftransformer.eval.logits import attention_logits


def _diffllama_lambdas(model: nn.Module) -> list[torch.Tensor]:
    """Each DiffLlama layer's lambda, exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init."""
    modules = [m for m in model.modules() if hasattr(m, "lambda_q1") and hasattr(m, "lambda_init")]
    return [
        torch.exp(torch.sum(m.lambda_q1 * m.lambda_k1))
        - torch.exp(torch.sum(m.lambda_q2 * m.lambda_k2))
        + m.lambda_init
        for m in modules
    ]


def _is_diffllama(model: nn.Module) -> bool:
    return getattr(model.config, "model_type", "") == "diffllama"


@torch.no_grad()
def attention_maps(model: nn.Module, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """Per layer the (B, H, T, S) attention maps; for DIFF models the combined map (the module docstring)."""
    if is_difftransformer(model):
        return list(model(input_ids=input_ids, output_attentions=True, use_cache=False).attentions)
    with attention_logits(model, None):
        maps = list(model(input_ids=input_ids, output_attentions=True, use_cache=False).attentions)
    if _is_diffllama(model):
        half = maps[0].shape[1] // 2
        maps = [full[:, :half].float() - lam.float() * full[:, half:].float() for full, lam in
                zip(maps, _diffllama_lambdas(model))]  # fmt: skip
    if any(m is None for m in maps):
        raise TypeError(f"{type(model).__name__} returned no attention maps with output_attentions=True")
    return maps


def allocation(
    maps: Sequence[torch.Tensor], rows: slice, answer_span: tuple[int, int], context_end: int
) -> dict[str, np.ndarray]:
    """Per-layer attention shares for one sequence (batch 0).

    Args:
        maps: per layer (1, H, T, S).
        rows: the answer-producing query positions.
        answer_span: [start, end) of the answer.
        context_end: the question starts here.

    Returns:
        "answer", "context", "answer_abs", "context_abs": arrays of shape (num_layers,), averaged over
        the rows and heads: the signed (and absolute) attention on the answer and on the rest of what precedes
        ``context_end``, each over the row's absolute mass (a DIFF map's negative entries count with their sign).
    """
    start, end = answer_span
    out: dict[str, list[float]] = {"answer": [], "context": [], "answer_abs": [], "context_abs": []}
    for layer_map in maps:
        a = layer_map[0, :, rows].double()  # (H, rows, S)
        total = a.abs().sum(-1).clamp_min(1e-30)
        context = torch.zeros(a.shape[-1], dtype=torch.bool, device=a.device)
        context[:context_end] = True
        context[start:end] = False
        for key, values in (("", a), ("_abs", a.abs())):
            out["answer" + key].append(float((values[..., start:end].sum(-1) / total).mean()))
            out["context" + key].append(float((values[..., context].sum(-1) / total).mean()))
    return {k: np.array(v) for k, v in out.items()}


def combined_heads(model: nn.Module) -> int:
    """Heads of a layer's combined map: the config's attention heads (a DiffLlama counts both maps of a head)."""
    heads = int(model.config.num_attention_heads)
    return heads // 2 if _is_diffllama(model) else heads


def check_head(model: nn.Module, head: int | None) -> None:
    """Refuse a ``heatmap_head`` the model's combined maps do not have (None, the mean over heads, passes)."""
    if head is not None and not 0 <= head < combined_heads(model):
        raise UsageError(
            f"`heatmap_head` must lie in [0, {combined_heads(model) - 1}] (the model's heads); got {head}"
        )


# One layer's heatmap panels: (title, (T, S) map) in the order they are drawn.
Panels = list[tuple[str, np.ndarray]]


@torch.no_grad()
def heatmap_panels(model: nn.Module, input_ids: torch.Tensor, head: int | None = None) -> list[Panels]:
    """Per layer the maps of one prompt (``input_ids`` (1, T)) that the paper's figure of attention scores shows,
    averaged over heads (``head`` None) or of one head (of the combined map's heads, :func:`combined_heads`).

    Ours with noise maps (the layers' ``output_component_maps``) or a DiffLlama: each signal head's map A1, its
    noise map A2 and A1 - lambda A2, lambda in the title with the scalar lambda; with the per-token lambda (DIFF V2,
    Motif) A(s), A(noise(s)) and A(s) - sigmoid(lambda_s) A(noise(s)) (lambda differs by token, so no single value
    is shown). Any other model: its softmax map. The difference is the map the layer computes its output from
    (``output_attentions``), not recomputed here.
    """
    check_head(model, head)

    def pick(maps: torch.Tensor) -> np.ndarray:  # (1, H, T, S) -> (T, S)
        chosen = maps[0].float().mean(0) if head is None else maps[0, head].float()
        return chosen.cpu().numpy()

    # the layers' own maps, as the model's parts declare them; a model without parts (its maps only) as softmax
    parts = getattr(model.config, "parts", None) if is_difftransformer(model) else None
    if parts is not None and parts.differential:
        out = model(input_ids=input_ids, output_attentions=True, output_component_maps=True, use_cache=False)
        modules = [m for m in model.modules() if hasattr(m, "logits_hook")]
        panels = []
        for module, (difference, first, second) in zip(modules, out.attentions):
            if parts.lambda_mode == "scalar":
                titles = ("A1", "A2", f"A1 - {float(module.lambda_full()):.3f} A2")
            else:
                titles = ("A(s)", "A(noise(s))", "A(s) - sigmoid(lambda_s) A(noise(s))")
            panels.append(list(zip(titles, (pick(first), pick(second), pick(difference)))))
        return panels
    if _is_diffllama(model):
        with attention_logits(model, None):
            full = model(input_ids=input_ids, output_attentions=True, use_cache=False).attentions
        panels = []
        for layer_maps, lam in zip(full, _diffllama_lambdas(model)):
            half = layer_maps.shape[1] // 2
            first, second = layer_maps[:, :half].float(), layer_maps[:, half:].float()
            difference = first - lam.float() * second
            titles = ("A1", "A2", f"A1 - {float(lam):.3f} A2")
            panels.append(list(zip(titles, (pick(first), pick(second), pick(difference)))))
        return panels
    return [[("A", pick(layer_maps))] for layer_maps in attention_maps(model, input_ids)]
