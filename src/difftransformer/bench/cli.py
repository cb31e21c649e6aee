"""`difftransformer bench`: DIFF against its matched baseline and transformers' DiffLlama, side by side, with the
other attention kinds (GDA, gated attention) against the same baseline.

Every measurement interleaves the contenders in one process (one call each per round) and reports the
median of ``--repeats`` rounds after ``--warmup`` calls each. Sections: the attention operator forward +
backward (DIFF per backend vs the baseline's SDPA); a full train step (forward, backward, AdamW);
greedy decode with the KV cache (tokens/s, prefill excluded); peak memory of a train step.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

import torch

from difftransformer.bench.check import check_backends
from difftransformer.bench.report import format_table, plot_ratios, ratio_row
from difftransformer.bench.settings import DTYPES, BenchSettings
from difftransformer.bench.timing import interleaved_medians, interleaved_steps
from difftransformer.bench.workloads import (
    GreedyDecode,
    build_models,
    op_contenders,
    random_ids,
    state_bytes,
    step_peak_bytes,
    train_step_fn,
)
from difftransformer.flags import add_flags, given
from difftransformer.storage import check_output_file, versions, write_json


def configure(parser: argparse.ArgumentParser) -> None:
    """``bench``'s options: :class:`~difftransformer.bench.settings.BenchSettings`' fields."""
    add_flags(parser, BenchSettings, only_given=True, list_items=True)


def run_check(device: torch.device, dtype: torch.dtype) -> bool:
    rows = check_backends(device, dtype)
    for row in rows:
        case = row["case"]
        shape = f"B{case['batch']} h{case['heads']}/{case['kv_heads']} d{case['head_dim']} T{case['q_len']} S{case['kv_len']}"
        flags = ("causal " if case["causal"] else "full ") + ("padded" if case["padding"] else "")
        print(f"check {row['backend']:<10} {shape:<28} {flags:<14} rel.err {row['max_rel_error']:.2e} "
              f"{'ok' if row['ok'] else 'FAIL'}")  # fmt: skip
    failed = [r for r in rows if not r["ok"]]
    print(f"check: {len(rows) - len(failed)}/{len(rows)} passed on {device} ({dtype})")
    return not failed


def bench_op(settings: BenchSettings, shape, device, dtype) -> list[dict]:
    rows = []
    for length in settings.op_lengths:
        contenders = op_contenders(
            shape, length, settings.op_batch, settings.op_backends, device, dtype, settings.seed
        )
        times = interleaved_medians(
            contenders, repeats=settings.repeats, warmup=settings.warmup, device=device, desc=f"op T={length}"
        )
        base = times["baseline"]["median_s"]
        for backend in settings.op_backends:
            diff = times[f"diff[{backend}]"]["median_s"]
            rows.append(ratio_row("op", f"T={length} B={settings.op_batch} {backend}", "ms", dict(
                diff=diff * 1e3, baseline=base * 1e3)))  # fmt: skip
    return rows


def bench_train(settings: BenchSettings, shape, device, dtype) -> list[dict]:
    rows = []
    for length in settings.train_lengths:
        models = build_models(shape, length, device, dtype, settings.seed, settings.kinds, settings.gda_ratio)
        ids = random_ids(shape, length, device, settings.seed)
        steps = {name: train_step_fn(model, ids) for name, model in models.items()}
        times = interleaved_medians(
            steps, repeats=settings.repeats, warmup=settings.warmup, device=device, desc=f"train T={length}"
        )
        values = {name: t["median_s"] * 1e3 for name, t in times.items()}
        rows.append(ratio_row("train", f"T={length} B={shape.batch}", "ms/step", values))
    return rows


def bench_decode(settings: BenchSettings, shape, device, dtype) -> list[dict]:
    rows = []
    models = build_models(
        shape, settings.prompt_len + settings.new_tokens, device, dtype, settings.seed, settings.kinds,
        settings.gda_ratio,
    )  # fmt: skip
    for batch in settings.decode_batches:
        prompt = random_ids(shape, settings.prompt_len, device, settings.seed, batch=batch)
        runs = {name: GreedyDecode(model, prompt, settings.new_tokens) for name, model in models.items()}
        times = interleaved_steps(
            {name: (run.prefill, run.step) for name, run in runs.items()},
            steps=settings.new_tokens - 1,
            repeats=settings.repeats,
            warmup=settings.warmup,
            device=device,
            desc=f"decode B={batch}",
        )
        values = {name: batch * (settings.new_tokens - 1) / t["median_s"] for name, t in times.items()}
        setting = f"B={batch} prompt={settings.prompt_len}"
        rows.append(ratio_row("decode", setting, "tok/s", values, lower_is_better=False))
    return rows


def bench_memory(settings: BenchSettings, shape, device, dtype) -> list[dict]:
    rows = []
    for length in settings.train_lengths:
        models = build_models(shape, length, device, dtype, settings.seed, settings.kinds, settings.gda_ratio)
        ids = random_ids(shape, length, device, settings.seed)
        values = {}
        for name, model in models.items():
            step = train_step_fn(model, ids)
            step()  # optimizer state exists from here on
            values[name] = (step_peak_bytes(step, device) + state_bytes(model, step.optimizer)) / 2**20
        rows.append(ratio_row("memory", f"T={length} B={shape.batch}", "MiB peak", values))
    return rows


def environment(device: torch.device) -> dict:
    """Where the benchmark ran: the command line, the versions, the device, threads, CPU and load."""
    env = dict(
        command="difftransformer bench "
        + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
        versions=versions(),
        device=str(device),
        threads=torch.get_num_threads(),
        cpu=platform.processor() or platform.machine(),
    )
    if hasattr(os, "getloadavg"):
        env["load_average_1_5_15"] = list(os.getloadavg())
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def run(args: argparse.Namespace) -> int:
    """Check every option and the output file, optionally check the backends, measure the sections, write the
    results (with the settings and versions) and their plot."""
    settings = BenchSettings(**given(vars(args), BenchSettings))
    output = check_output_file(settings.output, "output")
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    device, dtype = torch.device(settings.device), DTYPES[settings.dtype]
    if settings.check or settings.check_only:
        if not run_check(device, dtype):
            print("bench: the check failed; not benchmarking a wrong operator", file=sys.stderr)
            return 1
        if settings.check_only:
            return 0
    shape = settings.shape
    sections = {"op": bench_op, "train": bench_train, "decode": bench_decode, "memory": bench_memory}
    rows: list[dict] = []
    for name in settings.sections:
        rows += sections[name](settings, shape, device, dtype)
        print(format_table(rows), flush=True)  # partial results stay visible on a long run
    env = environment(device)
    write_json(output, dict(environment=env, settings=settings.to_json(), shape=vars(shape), rows=rows))
    plot_ratios(
        output.with_suffix(".png"),
        rows,
        f"DIFF vs baseline and DiffLlama ({env['device']}, {settings.dtype})",
    )
    print(f"\nwrote {output} and {output.with_suffix('.png')}")
    return 0
