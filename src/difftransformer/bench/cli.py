"""`difftransformer bench`: DIFF against its matched baseline and transformers' DiffLlama, side by side.

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
from pathlib import Path

import torch

from difftransformer.bench.check import check_backends
from difftransformer.bench.report import format_table, plot_ratios, ratio_row
from difftransformer.bench.timing import interleaved_medians, interleaved_steps
from difftransformer.bench.workloads import (
    BenchShape,
    GreedyDecode,
    build_models,
    op_contenders,
    random_ids,
    state_bytes,
    step_peak_bytes,
    train_step_fn,
)
from difftransformer.errors import UsageError
from difftransformer.ops import BACKENDS
from difftransformer.storage import write_json

SECTIONS = ("op", "train", "decode", "memory")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUICK = dict(
    op_lengths=[512, 2048], op_batch=1, train_lengths=[512], decode_batches=[1], new_tokens=32, warmup=1
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="torch device to run on: cpu (default) or cuda[:N]")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32", help="model and operator dtype")
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=SECTIONS,
        default=list(SECTIONS),
        help="what to measure (default: all)",
    )
    parser.add_argument(
        "--op-lengths",
        type=int,
        nargs="+",
        default=[512, 2048, 8192],
        help="sequence lengths of the op section",
    )
    parser.add_argument("--op-batch", type=int, default=4, help="batch size of the op section")
    parser.add_argument(
        "--op-backends",
        nargs="+",
        choices=[b for b in BACKENDS if b != "reference"],
        default=["auto", "blocked", "sdpa"],
        help="DIFF backends timed in the op section (the float64-exact 'reference' is left out: it is slow)",
    )
    parser.add_argument(
        "--train-lengths", type=int, nargs="+", default=[512, 2048], help="train-step lengths"
    )
    parser.add_argument("--decode-batches", type=int, nargs="+", default=[1, 8], help="decode batch sizes")
    parser.add_argument("--prompt-len", type=int, default=512, help="decode prompt length")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated per decode run")
    parser.add_argument("--d-model", type=int, default=256, help="model width")
    parser.add_argument("--layers", type=int, default=4, help="model depth")
    parser.add_argument("--heads", type=int, default=4, help="DIFF heads (the baseline gets twice as many)")
    parser.add_argument("--vocab", type=int, default=4096, help="vocabulary size")
    parser.add_argument("--batch", type=int, default=4, help="train-step batch size")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per measurement (median; >= 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per contender before timing")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shared init and inputs")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a fast run: op at 512 and 2048 tokens with batch 1, train at 512, decode batch 1 with 32 tokens",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="first check every backend against the float64 reference (forward and backward); exit 1 on a miss",
    )
    parser.add_argument("--check-only", action="store_true", help="run the check and stop")
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("bench_results.json"),
        help="JSON results file (a PNG goes beside it)",
    )


def _validate(args: argparse.Namespace) -> None:
    if args.repeats < 5:
        raise UsageError(f"--repeats must be at least 5 (a median of 5 runs); got {args.repeats}")
    for name in ("op_lengths", "train_lengths", "decode_batches"):
        if any(n < 1 for n in getattr(args, name)):
            raise UsageError(
                f"--{name.replace('_', '-')} must be positive integers; got {getattr(args, name)}"
            )
    if args.new_tokens < 2 or args.prompt_len < 1:
        raise UsageError(
            f"--new-tokens must be >= 2 (the first comes from the prompt, the rest are timed) and --prompt-len >= 1; "
            f"got {args.new_tokens} and {args.prompt_len}"
        )
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"--device {args.device}: CUDA is not available on this machine (torch {torch.__version__})"
        )
    if args.heads < 1 or args.d_model % (2 * args.heads):
        raise UsageError(f"--d-model ({args.d_model}) must be divisible by 2 * --heads ({args.heads})")


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


def bench_op(args, shape, device, dtype) -> list[dict]:
    rows = []
    for length in args.op_lengths:
        contenders = op_contenders(shape, length, args.op_batch, args.op_backends, device, dtype, args.seed)
        times = interleaved_medians(
            contenders, repeats=args.repeats, warmup=args.warmup, device=device, desc=f"op T={length}"
        )
        base = times["baseline"]["median_s"]
        for backend in args.op_backends:
            diff = times[f"diff[{backend}]"]["median_s"]
            rows.append(ratio_row("op", f"T={length} B={args.op_batch} {backend}", "ms", dict(
                diff=diff * 1e3, baseline=base * 1e3)))  # fmt: skip
    return rows


def bench_train(args, shape, device, dtype) -> list[dict]:
    rows = []
    for length in args.train_lengths:
        models = build_models(shape, length, device, dtype, args.seed)
        ids = random_ids(shape, length, device, args.seed)
        steps = {name: train_step_fn(model, ids) for name, model in models.items()}
        times = interleaved_medians(
            steps, repeats=args.repeats, warmup=args.warmup, device=device, desc=f"train T={length}"
        )
        values = {name: t["median_s"] * 1e3 for name, t in times.items()}
        rows.append(ratio_row("train", f"T={length} B={shape.batch}", "ms/step", values))
    return rows


def bench_decode(args, shape, device, dtype) -> list[dict]:
    rows = []
    models = build_models(shape, args.prompt_len + args.new_tokens, device, dtype, args.seed)
    for batch in args.decode_batches:
        prompt = random_ids(shape, args.prompt_len, device, args.seed, batch=batch)
        runs = {name: GreedyDecode(model, prompt, args.new_tokens) for name, model in models.items()}
        times = interleaved_steps(
            {name: (run.prefill, run.step) for name, run in runs.items()},
            steps=args.new_tokens - 1,
            repeats=args.repeats,
            warmup=args.warmup,
            device=device,
            desc=f"decode B={batch}",
        )
        values = {name: batch * (args.new_tokens - 1) / t["median_s"] for name, t in times.items()}
        setting = f"B={batch} prompt={args.prompt_len}"
        rows.append(ratio_row("decode", setting, "tok/s", values, lower_is_better=False))
    return rows


def bench_memory(args, shape, device, dtype) -> list[dict]:
    rows = []
    for length in args.train_lengths:
        models = build_models(shape, length, device, dtype, args.seed)
        ids = random_ids(shape, length, device, args.seed)
        values = {}
        for name, model in models.items():
            step = train_step_fn(model, ids)
            step()  # optimizer state exists from here on
            values[name] = (step_peak_bytes(step, device) + state_bytes(model, step.optimizer)) / 2**20
        rows.append(ratio_row("memory", f"T={length} B={shape.batch}", "MiB peak", values))
    return rows


def environment(args: argparse.Namespace, device: torch.device) -> dict:
    env = dict(
        command="difftransformer bench "
        + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
        torch=torch.__version__,
        python=platform.python_version(),
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
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    _validate(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if args.check or args.check_only:
        if not run_check(device, dtype):
            print("bench: the check failed; not benchmarking a wrong operator", file=sys.stderr)
            return 1
        if args.check_only:
            return 0
    shape = BenchShape(args.d_model, args.layers, args.heads, args.vocab, args.batch)
    sections = {"op": bench_op, "train": bench_train, "decode": bench_decode, "memory": bench_memory}
    rows: list[dict] = []
    for name in args.sections:
        rows += sections[name](args, shape, device, dtype)
        print(format_table(rows), flush=True)  # partial results stay visible on a long run
    env = environment(args, device)
    write_json(args.output, dict(environment=env, shape=vars(shape), rows=rows))
    plot_ratios(
        args.output.with_suffix(".png"),
        rows,
        f"DIFF vs baseline and DiffLlama ({env['device']}, {args.dtype})",
    )
    print(f"\nwrote {args.output} and {args.output.with_suffix('.png')}")
    return 0
