"""`difftransformer bench`: DIFF against its matched baseline and transformers' DiffLlama, side by side, with every
other attention kind (or a composition of parts) against the same baseline.

Every measurement interleaves the contenders in one process (one call each per round) and reports the
median of ``--repeats`` rounds after ``--warmup`` calls each. Sections: the attention operator forward +
backward (DIFF per backend vs the baseline's SDPA); a full train step (forward, backward, AdamW);
greedy decode with the KV cache (tokens/s, prefill excluded); peak memory of a train step. The train and decode
rows print each kind's FLOP ratio to the baseline beside its measured ratio.
"""

from __future__ import annotations

import argparse
import sys

import torch

from difftransformer.bench.check import check_backends
from difftransformer.bench.machine import environment
from difftransformer.bench.report import format_table, plot_ratios
from difftransformer.bench.sections import bench_decode, bench_memory, bench_op, bench_train
from difftransformer.bench.settings import DTYPES, BenchSettings
from difftransformer.flags import add_flags, given
from difftransformer.storage import check_output_file, write_json


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
    # The sections one by one (as sections.measure runs them), each named here: test_cli_robustness stops a
    # command where its work begins, at these names.
    sections = {"op": bench_op, "train": bench_train, "decode": bench_decode, "memory": bench_memory}
    rows: list[dict] = []
    for name in settings.sections:
        rows += sections[name](settings, device, dtype)
        print(format_table(rows), flush=True)  # partial results stay visible on a long run
    args_given = sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]
    env = environment(device, "difftransformer bench " + " ".join(args_given))
    write_json(
        output, dict(environment=env, settings=settings.to_json(), shape=vars(settings.shape), rows=rows)
    )
    plot_ratios(
        output.with_suffix(".png"),
        rows,
        f"DIFF vs baseline and DiffLlama ({env['device']}, {settings.dtype})",
    )
    print(f"\nwrote {output} and {output.with_suffix('.png')}")
    return 0
