"""The benchmark's sections, each a list of table rows (:func:`~difftransformer.bench.report.ratio_row`): the
attention operator, a train step, greedy decode and a train step's peak memory. :func:`measure` runs those a
:class:`~difftransformer.bench.settings.BenchSettings` asks for (``scripts/bench_check.py``); ``bench`` runs them
one by one, printing the table after each. The train and decode rows carry each contender's FLOPs (models/flops.py)
beside its time."""

from __future__ import annotations

from collections.abc import Callable

import torch

from difftransformer.bench.report import ratio_row
from difftransformer.bench.settings import DTYPES, BenchSettings
from difftransformer.bench.timing import interleaved_medians, interleaved_steps
from difftransformer.bench.workloads import (
    BASELINE,
    GreedyDecode,
    build_models,
    decode_step_flops,
    op_contenders,
    random_ids,
    state_bytes,
    step_peak_bytes,
    train_flops,
    train_step_fn,
)


def bench_op(settings: BenchSettings, device: torch.device, dtype: torch.dtype) -> list[dict]:
    """Causal attention forward + backward: DIFF per backend against the baseline's SDPA, one row a length and
    backend."""
    rows = []
    for length in settings.op_lengths:
        contenders = op_contenders(
            settings.shape, length, settings.op_batch, settings.op_backends, device, dtype, settings.seed
        )
        times = interleaved_medians(
            contenders, repeats=settings.repeats, warmup=settings.warmup, device=device, desc=f"op T={length}"
        )
        base = times[BASELINE]["median_s"]
        for backend in settings.op_backends:
            diff = times[f"diff[{backend}]"]["median_s"]
            rows.append(ratio_row("op", f"T={length} B={settings.op_batch} {backend}", "ms", dict(
                diff=diff * 1e3, baseline=base * 1e3)))  # fmt: skip
    return rows


def bench_train(settings: BenchSettings, device: torch.device, dtype: torch.dtype) -> list[dict]:
    """A train step (forward with the LM loss, backward, AdamW) of every contender, one row a length."""
    shape, rows = settings.shape, []
    for length in settings.train_lengths:
        models = build_models(shape, length, device, dtype, settings.seed, settings.kinds, settings.diffllama)
        ids = random_ids(shape, length, device, settings.seed)
        steps = {name: train_step_fn(model, ids) for name, model in models.items()}
        times = interleaved_medians(
            steps, repeats=settings.repeats, warmup=settings.warmup, device=device, desc=f"train T={length}"
        )
        values = {name: t["median_s"] * 1e3 for name, t in times.items()}
        rows.append(ratio_row("train", f"T={length} B={shape.batch}", "ms/step", values,
                              flops=train_flops(models, length)))  # fmt: skip
    return rows


def bench_decode(settings: BenchSettings, device: torch.device, dtype: torch.dtype) -> list[dict]:
    """Greedy decode with the KV cache after ``prompt_len`` tokens, the contenders taking turns step by step; one
    row a batch size (tokens/s over the timed steps, prefill excluded)."""
    shape, rows, steps = settings.shape, [], settings.new_tokens - 1
    models = build_models(
        shape, settings.prompt_len + settings.new_tokens, device, dtype, settings.seed, settings.kinds,
        settings.diffllama,
    )  # fmt: skip
    flops = decode_step_flops(models, settings.prompt_len, steps)
    for batch in settings.decode_batches:
        prompt = random_ids(shape, settings.prompt_len, device, settings.seed, batch=batch)
        runs = {name: GreedyDecode(model, prompt, settings.new_tokens) for name, model in models.items()}
        times = interleaved_steps(
            {name: (run.prefill, run.step) for name, run in runs.items()},
            steps=steps,
            repeats=settings.repeats,
            warmup=settings.warmup,
            device=device,
            desc=f"decode B={batch}",
        )
        values = {name: batch * steps / t["median_s"] for name, t in times.items()}
        setting = f"B={batch} prompt={settings.prompt_len}"
        rows.append(ratio_row("decode", setting, "tok/s", values, lower_is_better=False, flops=flops))
    return rows


def bench_memory(settings: BenchSettings, device: torch.device, dtype: torch.dtype) -> list[dict]:
    """Peak memory of one train step after a warm-up step (parameters and AdamW state added), one row a length."""
    shape, rows = settings.shape, []
    for length in settings.train_lengths:
        models = build_models(shape, length, device, dtype, settings.seed, settings.kinds, settings.diffllama)
        ids = random_ids(shape, length, device, settings.seed)
        values = {}
        for name, model in models.items():
            step = train_step_fn(model, ids)
            step()  # optimizer state exists from here on
            values[name] = (step_peak_bytes(step, device) + state_bytes(model, step.optimizer)) / 2**20
        rows.append(ratio_row("memory", f"T={length} B={shape.batch}", "MiB peak", values))
    return rows


SECTION_RUNS: dict[str, Callable[[BenchSettings, torch.device, torch.dtype], list[dict]]] = {
    "op": bench_op,
    "train": bench_train,
    "decode": bench_decode,
    "memory": bench_memory,
}


def measure(settings: BenchSettings) -> list[dict]:
    """The rows of every section ``settings`` asks for, in its order, on its device and dtype and with its
    threads."""
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    device, dtype = torch.device(settings.device), DTYPES[settings.dtype]
    return [row for name in settings.sections for row in SECTION_RUNS[name](settings, device, dtype)]
