"""Measure the data path at scale: peak memory and tokens/s of ``prepare``, and of a 3-step ``train --preset
micro``, on random-word JSONL of the sizes asked for (generated into a scratch folder, never committed).

    python scripts/bench_data.py --sizes-mb 25 100 400 --workdir /tmp/difftransformer-bench

Each command runs in a child process, sampled every 50 ms: "peak" is the largest sum over the process and its
children (the tokenising workers) of their proportional set size (PSS: resident memory, pages shared between
processes divided among them, so forked workers are not counted twice), and "main RSS" the largest resident set of
the command's own process, which is what ``/usr/bin/time -v`` reports. Both include file-backed pages (shared
libraries, the memory-mapped blocks: page cache the kernel can reclaim).
``train`` reuses the blocks and tokenizer that ``prepare`` cached; its time runs from start to the saved model.
Throughput depends on what else runs on the machine: say so beside any number taken while it was busy.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

_WORDS = 20_000


def generate_jsonl(path: Path, megabytes: float, seed: int = 0) -> None:
    """Random-word documents of 50-400 words from a 20,000-word vocabulary of random letters, one JSON object
    (``{"text": ...}``) per line, until the file holds ``megabytes`` MB."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(_WORDS)]
    target, size = int(megabytes * 1e6), 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        while size < target:
            line = json.dumps({"text": " ".join(rng.choices(words, k=rng.randint(50, 400))) + "."}) + "\n"
            handle.write(line)
            size += len(line)
    tmp.replace(path)


def measure(command: list[str]) -> dict[str, float]:
    """Run ``command``; its wall seconds, peak PSS of its process tree and peak RSS of its own process (MB), and
    its output."""
    start = time.perf_counter()
    # Output to a file, not a pipe: a full pipe would stall the command while this loop samples.
    log = tempfile.TemporaryFile(mode="w+")
    child = psutil.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
    peak = main_rss = 0
    while child.poll() is None:
        pss = 0
        try:
            main_rss = max(main_rss, child.memory_info().rss)
            for proc in [child, *child.children(recursive=True)]:
                pss += proc.memory_full_info().pss
        except psutil.Error:
            pass  # a process ended between listing and reading
        peak = max(peak, pss)
        time.sleep(0.05)
    log.seek(0)
    output = log.read()
    seconds = time.perf_counter() - start
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({child.returncode}):\n{output[-3000:]}")
    return {"seconds": seconds, "peak_mb": peak / 1e6, "main_rss_mb": main_rss / 1e6, "output": output}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[25, 100], help="JSONL sizes (MB)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/difftransformer-bench"))
    parser.add_argument("--num-proc", type=int, help="prepare's --num-proc (default: its own, the CPU count)")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument(
        "--needle-fraction",
        type=float,
        default=0.25,
        help="train's --needle-fraction (default: 0.25, the micro preset's share, which --data leaves out unless "
        "asked; its retrieval rows are drawn as the Trainer asks for them)",
    )
    args = parser.parse_args()
    python = [sys.executable, "-m", "difftransformer"]
    print(
        "| JSONL | tokens | prepare: s | tokens/s | peak MB (main RSS) | train 3 steps: s | peak MB (main RSS) |"
    )
    print("|---|---|---|---|---|---|---|")
    for mb in args.sizes_mb:
        folder = args.workdir / f"{mb:g}mb"
        folder.mkdir(parents=True, exist_ok=True)
        data = folder / "data.jsonl"
        if not data.is_file():
            generate_jsonl(data, mb)
        cache, tokenizer, run = folder / "cache", folder / "tokenizer", folder / "run"
        for old in (cache, run):
            subprocess.run(["rm", "-rf", str(old)], check=True)
        prepare = [*python, "prepare", "--data", str(data), "--vocab-size", str(args.vocab_size)]
        prepare += ["--cache-dir", str(cache), "--output-dir", str(tokenizer)]
        if args.num_proc:
            prepare += ["--num-proc", str(args.num_proc)]
        prepared = measure(prepare)
        tokens = sum(
            int(line.split()[3].replace(",", ""))
            for line in prepared["output"].splitlines()
            if line.split()[:1] in (["train"], ["validation"], ["test"]) and len(line.split()) == 5
        )
        train = [*python, "train", "--preset", "micro", "--data", str(data), "--tokenizer", str(tokenizer)]
        train += ["--cache-dir", str(cache), "--max-steps", "3", "--output-dir", str(run)]
        train += ["--needle-fraction", str(args.needle_fraction)]
        trained = measure(train)
        print(
            f"| {mb:g} MB | {tokens / 1e6:.1f}M | {prepared['seconds']:.1f} | {tokens / prepared['seconds']:,.0f} | "
            f"{prepared['peak_mb']:,.0f} ({prepared['main_rss_mb']:,.0f}) | {trained['seconds']:.1f} | "
            f"{trained['peak_mb']:,.0f} ({trained['main_rss_mb']:,.0f}) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
