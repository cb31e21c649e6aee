"""vLLM serving throughput of every attention kind (DIFF V2, motif, DIFF V1, GDA, gated attention, or any
composition of parts) and the matched softmax Transformer, and vLLM against transformers' ``generate``, in one run
(docs/performance.md, "Serving with vLLM").

Run from the package's environment after ``make test-serving`` has built the vLLM one:
``.venv/bin/python scripts/bench_vllm.py [--kinds "diff_v2,motif"] [--batches 1 32] [--new-tokens 128]
[--repeats 3]``. ``--kinds`` takes the spelling compare and plan take (``diff_v2(output_gate=elementwise)``). The
models have the benchmark's shape (``difftransformer bench``: d_model 256, 4 layers, the baseline's 8 heads of width
32), each kind matched to that baseline by the parts' rule (models/matching.py), with random weights; each generates
``--new-tokens`` tokens greedily (no stop) after the same 64-token prompts, in float32 on the CPU. transformers'
side runs here; vLLM's runs this file again in the vLLM environment (``--vllm-worker``: vLLM pins an older
transformers), one in-process engine per model, all held at once, prefix caching off so that every round generates
from scratch. On each side the models take turns round by round in a rotating order, so that the machine's drift
reaches them alike. Prints tokens/s (median of ``--repeats`` rounds after a warm-up round each) and each kind's time
over the baseline's beside its FLOPs over the baseline's (prefill and decode of one request, models/flops.py: the
floor a kind can reach); ``--output`` writes them as JSON.

``--precisions`` serves every model at other precisions too, each against the baseline at the same precision and
against its own float32 folder: ``bfloat16`` (the weights and activations; ``generate`` runs it too), ``fp8-kv``
(float32 weights, vLLM's fp8 KV cache: keys and values stored as float8 e4m3; x86 CPUs with AVX-512 or AMX) and
``w8a8`` (the folder ``difftransformer quantize --scheme w8a8`` writes: int8 weights and per-token int8 inputs; needs
the ``quant`` extra here, and on the CPU an int8 GEMM with VNNI). transformers' ``generate`` has no counterpart of
the last two and is left out there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

# Served beside the baseline unless --kinds says otherwise; DIFF V2 first (issue 47's vLLM target is its ratio).
KINDS = "diff_v2,motif,diff,gda(gda_ratio=3),gated"
BASELINE = "softmax"
MAX_POSITIONS = 1024
PROMPT_TOKENS = 64
# --precisions: how vLLM serves a folder at each (its dtype and its KV cache's dtype; w8a8 serves quantize's folder)
PRECISIONS = {
    "float32": dict(dtype="float32", kv_cache_dtype="auto"),
    "bfloat16": dict(dtype="bfloat16", kv_cache_dtype="auto"),
    "fp8-kv": dict(dtype="float32", kv_cache_dtype="fp8"),
    "w8a8": dict(dtype="float32", kv_cache_dtype="auto"),
}
# the precisions transformers' generate runs as vLLM does, in the same dtype (the others: vLLM alone)
GENERATE_PRECISIONS = ("float32", "bfloat16")


def prompts(batch: int) -> list[list[int]]:
    return [[(31 * row + 7 * i) % 4000 + 50 for i in range(PROMPT_TOKENS)] for row in range(batch)]


def time_in_turns(runs: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median seconds of ``repeats`` calls of each of ``runs``, after one untimed call each, the contenders taking
    turns call by call in a rotating order, so that drift of the machine reaches all of them alike."""
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for round_ in range(repeats):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def vllm_worker(served: dict[str, dict], batches: list[int], new_tokens: int, repeats: int) -> dict:
    """tokens/s of vLLM for each served model and batch size (runs in the vLLM environment): ``served`` maps a name
    to its folder and precision (:data:`PRECISIONS`); one in-process engine per model, all held at once, taking
    turns."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    engines = {
        name: LLM(
            model["folder"],
            dtype=PRECISIONS[model["precision"]]["dtype"],
            kv_cache_dtype=PRECISIONS[model["precision"]]["kv_cache_dtype"],
            max_model_len=512,
            enable_prefix_caching=False,
            skip_tokenizer_init=True,
        )
        for name, model in served.items()
    }
    results = {}
    for batch in batches:
        requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompts(batch)]
        runs = {
            kind: partial(llm.generate, requests, params, use_tqdm=False) for kind, llm in engines.items()
        }
        for kind, seconds in time_in_turns(runs, repeats).items():
            results[f"{kind}/{batch}"] = batch * new_tokens / seconds
    return results


def generate_greedily(model, ids, new_tokens: int) -> None:
    import torch

    with torch.no_grad():
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)


def transformers_side(served: dict[str, dict], batches: list[int], new_tokens: int, repeats: int) -> dict:
    """tokens/s of the package's models with transformers' ``generate`` (a KV cache, one token a step), taking
    turns, for the served models whose precision it runs (:data:`GENERATE_PRECISIONS`)."""
    import torch

    from difftransformer import DiffTransformerForCausalLM

    models = {
        name: DiffTransformerForCausalLM.from_pretrained(
            model["folder"], dtype=PRECISIONS[model["precision"]]["dtype"]
        ).eval()
        for name, model in served.items()
        if model["precision"] in GENERATE_PRECISIONS
    }
    results = {}
    for batch in batches:
        ids = torch.tensor(prompts(batch))
        runs = {name: partial(generate_greedily, model, ids, new_tokens) for name, model in models.items()}
        for name, seconds in time_in_turns(runs, repeats).items():
            results[f"{name}/{batch}"] = batch * new_tokens / seconds
    return results


def served_name(kind: str, precision: str) -> str:
    """A served model's name: the kind, then its precision unless float32 ("diff_v2 fp8-kv")."""
    return kind if precision == "float32" else f"{kind} {precision}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--kinds",
        default=KINDS,
        help="the kinds served beside the softmax baseline, comma-separated, spelled as compare and plan take them "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=list(PRECISIONS),
        default=["float32"],
        help="serve every model at these precisions, each against the baseline at the same one (default: float32)",
    )
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--vllm-worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vllm_worker is not None:  # in the vLLM environment
        job = json.loads(args.vllm_worker.read_text())
        results = vllm_worker(job["served"], args.batches, args.new_tokens, args.repeats)
        args.vllm_worker.write_text(json.dumps(results))
        return 0

    import torch
    import transformers

    from difftransformer import DiffTransformerForCausalLM
    from difftransformer.bench.machine import cpu_model
    from difftransformer.bench.settings import parse_kinds
    from difftransformer.bench.workloads import BASELINE as BENCH_BASELINE
    from difftransformer.bench.workloads import DIFF, BenchShape, bench_configs
    from difftransformer.errors import UsageError
    from difftransformer.models import decode_flops

    try:
        kinds = [spec for spec in parse_kinds(args.kinds) if spec != BASELINE]
        # bench's configurations: DIFF V1, the baseline and the other kinds, each matched to that baseline
        built = bench_configs(BenchShape(), MAX_POSITIONS, [spec for spec in kinds if spec != DIFF])
    except UsageError as err:
        parser.error(str(err).replace("`kinds`", "--kinds"))
    if "float32" not in args.precisions:
        parser.error("--precisions must hold float32: every precision is read against the float32 folder")
    if "w8a8" in args.precisions:
        from difftransformer.models.quantization import SCHEMES

        try:
            SCHEMES["w8a8"].check_available()
        except UsageError as err:
            parser.error(f"--precisions w8a8: {err}")
    configs = {spec: built[spec] for spec in kinds}
    configs[BASELINE] = built[BENCH_BASELINE]
    # one request's work, prefill and decode: a token at position t attends to t + 1 keys, as a decode step does
    positions = range(PROMPT_TOKENS + args.new_tokens - 1)
    flops = {kind: sum(decode_flops(config, t).total for t in positions) for kind, config in configs.items()}
    with tempfile.TemporaryDirectory() as work:
        folders = {}
        for kind, config in configs.items():
            torch.manual_seed(0)
            model = DiffTransformerForCausalLM(config)
            # a folder named after the kind's text: diff_v2(gda_ratio=4) -> diff_v2-gda_ratio-4-
            folders[kind] = str(Path(work) / re.sub(r"[^A-Za-z0-9_.-]+", "-", kind))
            model.save_pretrained(folders[kind])
        served = {}
        for precision in args.precisions:
            for kind, folder in folders.items():
                if precision == "w8a8":  # the folder `difftransformer quantize --scheme w8a8` writes
                    quantized = folder + "-w8a8"
                    subprocess.run(
                        [sys.executable, "-m", "difftransformer", "quantize", folder, "--scheme", "w8a8",
                         "--output-dir", quantized],
                        check=True,
                    )  # fmt: skip
                    folder = quantized
                served[served_name(kind, precision)] = dict(folder=folder, precision=precision)
        hf = transformers_side(served, args.batches, args.new_tokens, args.repeats)
        job = Path(work) / "vllm.json"
        job.write_text(json.dumps({"served": served}))
        command = [
            args.vllm_python,
            __file__,
            "--vllm-worker",
            str(job),
            "--new-tokens",
            str(args.new_tokens),
        ]
        command += ["--repeats", str(args.repeats), "--batches", *map(str, args.batches)]
        subprocess.run(command, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        vllm = json.loads(job.read_text())
    rows = []
    width = max(22, *(len(name) + 8 for name in served))

    def cell(value: float | None, spec: str, size: int) -> str:
        return f"{'-' if value is None else format(value, spec):>{size}}"

    print(
        f"{'setting':<{width}}{'vLLM tok/s':>12}{'generate tok/s':>16}{'vLLM/generate':>15}"
        f"{'time/base (vLLM)':>18}{'time/base (generate)':>22}{'time/fp32 (vLLM)':>18}{'FLOPs/base':>12}"
    )
    for batch in args.batches:
        for precision in args.precisions:
            for kind in configs:
                name = served_name(kind, precision)
                key, base = f"{name}/{batch}", f"{served_name(BASELINE, precision)}/{batch}"
                generated = hf.get(key)
                row = dict(
                    kind=kind,
                    precision=precision,
                    batch=batch,
                    vllm_tokens_per_s=vllm[key],
                    generate_tokens_per_s=generated,
                    vllm_over_generate=None if generated is None else vllm[key] / generated,
                    # time per token of the kind over the baseline's at the same precision: above 1 is slower
                    time_over_baseline_vllm=vllm[base] / vllm[key],
                    time_over_baseline_generate=None if generated is None else hf[base] / generated,
                    # time per token over the same kind's float32 folder in vLLM: below 1 is faster
                    time_over_float32_vllm=vllm[f"{kind}/{batch}"] / vllm[key],
                    flops_over_baseline=flops[kind] / flops[BASELINE],
                )
                rows.append(row)
                print(
                    f"{name + ' B=' + str(batch):<{width}}{row['vllm_tokens_per_s']:>12.0f}"
                    f"{cell(generated, '.0f', 16)}{cell(row['vllm_over_generate'], '.2f', 15)}"
                    f"{row['time_over_baseline_vllm']:>18.3f}{cell(row['time_over_baseline_generate'], '.3f', 22)}"
                    f"{row['time_over_float32_vllm']:>18.3f}{row['flops_over_baseline']:>12.3f}"
                )
    if args.output is not None:
        record = dict(
            command=" ".join(sys.argv),
            date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            machine=cpu_model(),
            cpus=os.cpu_count(),
            torch=torch.__version__,
            transformers=transformers.__version__,
            shape=vars(BenchShape()),
            kinds={kind: config.to_diff_dict() for kind, config in configs.items()},
            prompt_tokens=PROMPT_TOKENS,
            new_tokens=args.new_tokens,
            precisions=args.precisions,
            rows=rows,
        )
        args.output.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
