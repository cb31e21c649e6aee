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


def vllm_worker(folders: dict[str, str], batches: list[int], new_tokens: int, repeats: int) -> dict:
    """tokens/s of vLLM for each folder and batch size (runs in the vLLM environment): one in-process engine per
    folder, all held at once, taking turns."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    engines = {
        kind: LLM(
            folder, dtype="float32", max_model_len=512, enable_prefix_caching=False, skip_tokenizer_init=True
        )
        for kind, folder in folders.items()
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


def transformers_side(folders: dict[str, str], batches: list[int], new_tokens: int, repeats: int) -> dict:
    """tokens/s of the package's models with transformers' ``generate`` (a KV cache, one token a step), taking
    turns."""
    import torch

    from difftransformer import DiffTransformerForCausalLM

    models = {
        kind: DiffTransformerForCausalLM.from_pretrained(folder).eval() for kind, folder in folders.items()
    }
    results = {}
    for batch in batches:
        ids = torch.tensor(prompts(batch))
        runs = {kind: partial(generate_greedily, model, ids, new_tokens) for kind, model in models.items()}
        for kind, seconds in time_in_turns(runs, repeats).items():
            results[f"{kind}/{batch}"] = batch * new_tokens / seconds
    return results


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
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--vllm-worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vllm_worker is not None:  # in the vLLM environment
        job = json.loads(args.vllm_worker.read_text())
        results = vllm_worker(job["folders"], args.batches, args.new_tokens, args.repeats)
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
        hf = transformers_side(folders, args.batches, args.new_tokens, args.repeats)
        job = Path(work) / "vllm.json"
        job.write_text(json.dumps({"folders": folders}))
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
        served = json.loads(job.read_text())
    rows = []
    width = max(22, *(len(kind) + 8 for kind in configs))
    print(
        f"{'setting':<{width}}{'vLLM tok/s':>12}{'generate tok/s':>16}{'vLLM/generate':>15}"
        f"{'time/base (vLLM)':>18}{'time/base (generate)':>22}{'FLOPs/base':>12}"
    )
    for batch in args.batches:
        for kind in configs:
            key, base = f"{kind}/{batch}", f"{BASELINE}/{batch}"
            row = dict(
                kind=kind,
                batch=batch,
                vllm_tokens_per_s=served[key],
                generate_tokens_per_s=hf[key],
                vllm_over_generate=served[key] / hf[key],
                # time per token of the kind over the baseline's: above 1 is slower
                time_over_baseline_vllm=served[base] / served[key],
                time_over_baseline_generate=hf[base] / hf[key],
                flops_over_baseline=flops[kind] / flops[BASELINE],
            )
            rows.append(row)
            print(
                f"{kind + ' B=' + str(batch):<{width}}{row['vllm_tokens_per_s']:>12.0f}"
                f"{row['generate_tokens_per_s']:>16.0f}{row['vllm_over_generate']:>15.2f}"
                f"{row['time_over_baseline_vllm']:>18.3f}{row['time_over_baseline_generate']:>22.3f}"
                f"{row['flops_over_baseline']:>12.3f}"
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
            rows=rows,
        )
        args.output.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
