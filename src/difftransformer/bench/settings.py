"""What `difftransformer bench` measures and how, declared once: :class:`BenchSettings`, whose fields are the
command's flags (:mod:`difftransformer.flags`) and whose values are checked when it is made, before anything is
built or timed. The model options carry the names ``train`` and the model config use (``hidden_size``,
``num_hidden_layers``, ``num_attention_heads``, ``vocab_size``)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Literal

import torch

from difftransformer.bench.workloads import BenchShape, bench_configs
from difftransformer.errors import UsageError, check_seed
from difftransformer.flags import torch_device
from difftransformer.models.compositions import composition_spec, parse_composition, split_top_level
from difftransformer.ops import BACKENDS

SECTIONS = ("op", "train", "decode", "memory")
# Every kind beside DIFF V1 and the baseline, which are always timed: GDA at 3 signal heads a noise map (at its
# kind's own ratio, 1, it is DIFF V1), the others at their declared points. tests/test_bench.py checks that each kind
# of layers/kinds.py is here.
DEFAULT_KINDS = ("gda(gda_ratio=3)", "diff_v2", "gated", "motif")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
OP_BACKENDS = tuple(
    b for b in BACKENDS if b != "reference"
)  # the float64-exact reference is too slow to time
# What --quick sets: op at 512 and 2048 tokens with batch 1, train at 512, decode batch 1 with 32 tokens.
QUICK = dict(
    op_lengths=(512, 2048), op_batch=1, train_lengths=(512,), decode_batches=(1,), new_tokens=32, warmup=1
)
# The longest sequence and the largest batch bench builds: beyond these a tensor's element count leaves the
# int32 indexing of CPU kernels long before any machine has the memory.
MAX_LENGTH = 2**20
MAX_BATCH = 2**16


def parse_kinds(text: str) -> list[str]:
    """``--kinds``' word: kinds or compositions of parts, comma-separated, in the one spelling compare and plan take
    (``motif,diff_v2(gda_ratio=4)``), each as the text that parses back to it."""
    specs = split_top_level(text)
    if not specs:
        raise UsageError(f"`kinds` must list at least one kind; got {text!r}")
    return [composition_spec(*parse_composition(spec, noun="kind")) for spec in specs]


def _help(text: str) -> dict:
    return {"help": text}


@dataclass(frozen=True)
class BenchSettings:
    """One benchmark run; each field is a ``bench`` flag."""

    _argument_group_name = "benchmark"

    device: str = field(default="cpu", metadata=_help("torch device to run on: cpu or cuda[:N]"))
    dtype: Literal[tuple(DTYPES)] = field(default="float32", metadata=_help("model and operator dtype"))
    sections: tuple[Literal[SECTIONS], ...] = field(default=SECTIONS, metadata=_help("what to measure"))
    op_lengths: tuple[int, ...] = field(
        default=(512, 2048, 8192), metadata=_help("sequence lengths of the op section")
    )
    op_batch: int = field(default=4, metadata=_help("batch size of the op section"))
    op_backends: tuple[Literal[OP_BACKENDS], ...] = field(
        default=("auto", "blocked", "sdpa"),
        metadata=_help(
            "DIFF backends timed in the op section (the float64-exact reference is left out: it is slow)"
        ),
    )
    train_lengths: tuple[int, ...] = field(default=(512, 2048), metadata=_help("train-step lengths"))
    decode_batches: tuple[int, ...] = field(default=(1, 8), metadata=_help("decode batch sizes"))
    prompt_len: int = field(default=512, metadata=_help("decode prompt length"))
    new_tokens: int = field(
        default=128,
        metadata=_help("tokens generated per decode run (the first from the prompt, the rest timed)"),
    )
    hidden_size: int = field(default=256, metadata=_help("model width (d_model)"))
    num_hidden_layers: int = field(default=4, metadata=_help("model depth"))
    num_attention_heads: int = field(
        default=4,
        metadata=_help("DIFF heads (the baseline gets twice as many), as train's models count them"),
    )
    vocab_size: int = field(default=4096, metadata=_help("vocabulary size"))
    kinds: tuple[str, ...] = field(
        default=DEFAULT_KINDS,
        metadata=dict(
            help="the other attention kinds timed beside DIFF and the baseline in the train, decode and memory "
            "sections, comma-separated, each matched to the baseline by the parts' rule: a kind, or a composition "
            "of parts as compare and plan spell it, KIND(FIELD=VALUE,...), e.g. "
            "'motif,diff_v2(output_gate=elementwise)'",
            parse=parse_kinds,
            show=",".join,
            metavar="KINDS",
        ),
    )
    diffllama: bool = field(
        default=True,
        metadata=_help("time transformers' DiffLlama (converted from the DIFF model) beside DIFF"),
    )
    batch: int = field(default=4, metadata=_help("train-step batch size"))
    repeats: int = field(default=5, metadata=_help("timed rounds per measurement (their median; at least 5)"))
    warmup: int = field(default=2, metadata=_help("untimed calls per contender before timing"))
    seed: int = field(default=0, metadata=_help("seed of the shared init and inputs"))
    threads: int | None = field(
        default=None, metadata=_help("torch.set_num_threads, at most the CPU count (unset: torch's)")
    )
    quick: bool = field(
        default=False,
        metadata=_help("a fast run: op at 512 and 2048 tokens with batch 1, train at 512, decode batch 1 with 32 "
                       "tokens (the defaults of those options; any of them given wins)"),
    )  # fmt: skip
    check: bool = field(
        default=False,
        metadata=_help("first check every backend against the float64 reference (forward and backward); exit 1 on "
                       "a miss"),
    )  # fmt: skip
    check_only: bool = field(default=False, metadata=_help("run the check and stop"))
    output: str = field(
        default="bench_results.json", metadata=_help("JSON results file (a PNG goes beside it)")
    )

    def __post_init__(self) -> None:
        if self.quick:  # --quick sets the defaults of its options; an option given beside it wins
            for name, value in QUICK.items():
                if getattr(self, name) == BenchSettings.__dataclass_fields__[name].default:
                    object.__setattr__(self, name, value)
        for name in ("sections", "op_backends", "op_lengths", "train_lengths", "decode_batches"):
            if not getattr(self, name):
                raise UsageError(f"`{name}` must list at least one value; got none")
        for name in ("op_lengths", "train_lengths"):
            values = getattr(self, name)
            if any(not 1 <= value <= MAX_LENGTH for value in values):
                raise UsageError(f"`{name}` must lie in [1, {MAX_LENGTH}]; got {list(values)}")
        if any(not 1 <= value <= MAX_BATCH for value in self.decode_batches):
            raise UsageError(
                f"`decode_batches` must lie in [1, {MAX_BATCH}]; got {list(self.decode_batches)}"
            )
        for name, lowest, highest in (("op_batch", 1, MAX_BATCH), ("batch", 1, MAX_BATCH),
                                      ("prompt_len", 1, MAX_LENGTH), ("new_tokens", 2, MAX_LENGTH),
                                      ("num_hidden_layers", 1, 1024), ("vocab_size", 4, 2**24),
                                      ("warmup", 0, 1000), ("repeats", 5, 1000)):  # fmt: skip
            value = getattr(self, name)
            if not lowest <= value <= highest:
                why = {"repeats": " (a median of at least 5 rounds)", "new_tokens": " (the first comes from the "
                       "prompt, the rest are timed)"}.get(name, "")  # fmt: skip
                raise UsageError(f"`{name}` must lie in [{lowest}, {highest}]{why}; got {value}")
        if not 1 <= self.num_attention_heads <= self.hidden_size // 2 or self.hidden_size % (
            2 * self.num_attention_heads
        ):
            raise UsageError(
                f"`hidden_size` ({self.hidden_size}) must be a positive multiple of 2 x `num_attention_heads` "
                f"({self.num_attention_heads})"
            )
        if self.threads is not None and not 1 <= self.threads <= (os.cpu_count() or 1):
            raise UsageError(
                f"`threads` must lie in [1, {os.cpu_count()}] (the CPU count); got {self.threads}"
            )
        specs = [composition_spec(*parse_composition(kind, noun="kind")) for kind in self.kinds]
        if len(set(specs)) != len(specs) or {"diff", "softmax"} & set(specs):
            raise UsageError(
                "`kinds` must list distinct kinds other than plain diff and softmax (DIFF V1 and the baseline are "
                f"always timed); got {','.join(self.kinds)}"
            )
        # a kind the matching rule cannot match at this shape, refused before any work
        bench_configs(self.shape, self.longest, self.kinds)
        check_seed(self.seed)
        torch_device(self.device)

    @property
    def longest(self) -> int:
        """The longest sequence a model of this run holds: a train row or a decode's prompt and new tokens."""
        return max(*self.train_lengths, self.prompt_len + self.new_tokens)

    @property
    def shape(self) -> BenchShape:
        """The benchmarked model's shape."""
        return BenchShape(
            self.hidden_size, self.num_hidden_layers, self.num_attention_heads, self.vocab_size, self.batch
        )

    def to_json(self) -> dict:
        """The settings as JSON data, as the results file records them."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, values: dict) -> BenchSettings:
        """The settings :meth:`to_json` wrote; a UsageError naming a field this version does not have."""
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise UsageError(
                f"benchmark settings hold fields this version does not take: {', '.join(unknown)}"
            )
        read = {name: tuple(value) if isinstance(value, list) else value for name, value in values.items()}
        # the values are --quick's already, where it was given: applying it again could move a value given beside it
        return cls(**{**read, "quick": False})
