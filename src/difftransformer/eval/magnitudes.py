"""Streaming magnitudes: the k largest of |x| exactly and its median from a histogram of log10|x|, for tensors far
too many to keep (every attention logit of 0.4M tokens, every key a cache stores).

The median is approximate: with the default 4096 bins over [1e-6, 1e6] it is within 0.34 % of a value in the true
median's bin; values below 1e-6, zeros included, fall into the lowest bin.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

TOP_KS: tuple[int, ...] = (1, 2, 3, 10, 100)


class RunningStats:
    """Streaming top-k (exact) and median (histogram of log10 |x|) of absolute values."""

    def __init__(self, max_k: int = max(TOP_KS), low: float = 1e-6, high: float = 1e6, bins: int = 4096):
        if not 0 < low < high:
            raise ValueError(f"need 0 < low < high; got low={low}, high={high}")
        self.max_k, self.bins = max_k, bins
        self.log_low, self.log_high = float(np.log10(low)), float(np.log10(high))
        self.top = torch.empty(0, dtype=torch.float64)
        self.counts = torch.zeros(bins, dtype=torch.float64)
        self.count = 0

    def update(self, values: torch.Tensor) -> None:
        """Add any tensor of values (their absolute values count)."""
        flat = values.detach().reshape(-1).abs().float()
        if flat.numel() == 0:
            return
        k = min(self.max_k, flat.numel())
        self.top = torch.topk(torch.cat([self.top, torch.topk(flat, k).values.double().cpu()]), min(
            self.max_k, self.top.numel() + k
        )).values  # fmt: skip
        logs = torch.log10(flat.clamp_min(10**self.log_low)).clamp_max(self.log_high)
        self.counts += torch.histc(logs, self.bins, self.log_low, self.log_high).double().cpu()
        self.count += flat.numel()

    def top_k(self, k: int) -> float:
        """The k-th largest absolute value seen (k = 1: the maximum)."""
        if k > self.top.numel():
            raise ValueError(f"top-{k} needs at least {k} values; {self.top.numel()} seen")
        return float(self.top[k - 1])

    def median(self) -> float:
        """Approximate median: the geometric centre of the histogram bin holding the middle value."""
        if self.count == 0:
            raise ValueError("no values seen")
        cumulative = torch.cumsum(self.counts, 0)
        index = int(torch.searchsorted(cumulative, torch.tensor(self.count / 2, dtype=torch.float64)))
        width = (self.log_high - self.log_low) / self.bins
        return float(10 ** (self.log_low + (index + 0.5) * width))

    def summary(self, top_ks: Sequence[int] = TOP_KS) -> dict:
        """{"topK": K-th largest |x| for each K seen, "median": approximate median, "count": values seen}."""
        out = {f"top{k}": self.top_k(k) for k in top_ks if k <= self.top.numel()}
        out.update(median=self.median(), count=self.count)
        return out
