"""Grouped differential attention (GDA; Lim et al., "Grouped Differential Attention", arXiv 2510.06949, §2.2): DIFF
V1 with more heads for the signal maps than for the noise maps, each noise map shared by a group of signal heads as
GQA shares keys."""

from __future__ import annotations

import torch
from transformers import PreTrainedConfig

from difftransformer.layers.diff_attention import DiffAttention


class GroupedDiffAttention(DiffAttention):
    """DIFF V1's attention with h signal heads and n = h / G noise maps, G = ``gda_ratio``.

    q_proj's output is n groups of G signal sub-heads then one noise sub-head, each d wide (group j: Q1 of heads
    jG ... jG + G - 1, then Q2_j; the layout of Motif's GDA models), so at G = 1 it is DIFF V1's adjacent Q1 | Q2
    layout and the module computes DIFF V1 on the same weights. Signal head s subtracts noise map s // G (the GDA
    paper's controlled repetition of the noise heads), with the KV group g = s // (h / h_kv) of both:

        head_s = (softmax(Q1_s K1_g^T / sqrt(d)) - lambda softmax(Q2_{s // G} K2_g^T / sqrt(d))) V_g,

    then, as in DIFF V1 (Ye et al., arXiv 2410.05258, Eq. 1-3), one scalar lambda a layer, the per-head norm over the
    2d features and the (1 - lambda_init) scale; o_proj reads h heads of width 2d. The configuration checks that
    h_kv divides n, so a noise map and its G signal heads read one KV group.

    Every DIFF V1 operator serves it: :meth:`queries` gives the operator the paired layout (Q1_s | Q2_{s // G}, 2d
    wide a head), so a noise map is formed once for each of its G signal heads (the QK^T work of 2h maps where the
    paper's kernel forms h + n); the KV cache, the maps returned and the hooks are DIFF V1's.
    """

    def __init__(self, config: PreTrainedConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.noise_ratio = config.gda_ratio

    def queries(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """q (B, h, T, 2d) in the paired layout, unrotated: signal head s's Q1 | its noise map's Q2."""
        batch, q_len, _ = hidden_states.shape
        groups = self.q_proj(hidden_states).view(batch, q_len, -1, self.noise_ratio + 1, self.map_head_dim)
        signal, noise = groups[..., :-1, :], groups[..., -1:, :]
        return torch.cat((signal, noise.expand_as(signal)), dim=-1).flatten(2, 3).transpose(1, 2)
