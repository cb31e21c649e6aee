"""Runs model folders in vLLM for tests/test_serving_vllm.py, in the vLLM environment (``make test-serving`` builds it;
vLLM pins an older transformers than the package, so the two never share a process).

Usage: ``python vllm_runner.py JOBS.json RESULTS.json``. JOBS is a list of runs: ``{"folder", "prompts" (lists of
token ids), "max_tokens", "logprobs" (top-k), "prompt_logprobs" (top-k of every prompt position), "dtype",
"prefix_caching", "kv_cache_dtype"}``. RESULTS holds, per run, each prompt's generated ids, each step's top-k ``{id: logprob}`` and, when
asked, each prompt position's after the first, or the error vLLM raised (``{"error": "Type: message"}``).
The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), one engine at a time.
"""

from __future__ import annotations

import gc
import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402


def run(job: dict) -> dict:
    try:
        llm = LLM(
            job["folder"],
            dtype=job.get("dtype", "float32"),
            max_model_len=job.get("max_model_len", 256),
            enable_prefix_caching=job.get("prefix_caching", True),
            skip_tokenizer_init=True,
            seed=0,
            tensor_parallel_size=job.get("tensor_parallel_size", 1),
            kv_cache_dtype=job.get("kv_cache_dtype", "auto"),
        )
    except Exception as error:  # noqa: BLE001 - the test reads the refusal
        return {"error": f"{type(error).__name__}: {error}"}
    params = SamplingParams(
        temperature=0.0,
        max_tokens=job["max_tokens"],
        logprobs=job.get("logprobs", 0),
        prompt_logprobs=job.get("prompt_logprobs"),
    )
    rounds = []
    for _ in range(job.get("rounds", 1)):  # a second round reads the first one's cached prefixes
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]], params)
        rounds.append(
            [
                {
                    "ids": list(output.outputs[0].token_ids),
                    "logprobs": [
                        {str(token): entry.logprob for token, entry in step.items()}
                        for step in (output.outputs[0].logprobs or [])
                    ],
                    "prompt_logprobs": [
                        {str(token): entry.logprob for token, entry in step.items()}
                        for step in (output.prompt_logprobs or [])[1:]
                    ],
                }
                for output in outputs
            ]
        )
    del llm
    gc.collect()
    return {"rounds": rounds}


if __name__ == "__main__":
    jobs = json.loads(open(sys.argv[1]).read())
    results = [run(job) for job in jobs]
    with open(sys.argv[2], "w") as out:
        json.dump(results, out)
