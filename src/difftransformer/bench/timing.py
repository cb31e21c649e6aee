"""Interleaved timing: every contender runs once per round, so load from other processes hits all alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from tqdm.auto import tqdm


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels (a no-op on CPU), so wall time covers the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_medians(
    contenders: dict[str, Callable[[], object]],
    *,
    repeats: int,
    warmup: int,
    device: torch.device,
    desc: str,
) -> dict[str, dict[str, float | list[float]]]:
    """Run each callable ``warmup`` times, then ``repeats`` rounds of one call each, in turn.

    Returns, per contender, ``{"median_s": ..., "runs_s": [...]}`` (seconds of wall time per call).
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0; got repeats={repeats}, warmup={warmup}")
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    runs: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in tqdm(range(repeats), desc=desc, unit="round", leave=False):
        for name, fn in contenders.items():
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            runs[name].append(time.perf_counter() - start)
    return {name: {"median_s": statistics.median(r), "runs_s": r} for name, r in runs.items()}
