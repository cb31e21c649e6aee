"""What a training run of a preset needs, estimated before it starts (``difftransformer plan`` prints it:
:mod:`difftransformer.train.plan_cli`).

Exact parameter counts of every attention kind's model (each built on the meta device: no memory used), an estimate of the memory per device under DDP and under FSDP (weights, gradients, optimizer state,
activations at the preset's block size and batch), and the tokens of one optimizer step.

Activations are measured rather than modelled: the bytes autograd keeps for backward, per token, are read off
narrow copies of the model (same heads, vocabulary and code; one and two layers; two widths of d_model and two of
the FFN) run on the CPU through the fused attention kernels, and extrapolated to the preset's widths. That
extrapolation is exact while every saved tensor is as wide as d_model, the FFN, a head or a constant, which holds
for every layer of this package. docs/training.md lists the assumptions of the rest of the arithmetic.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers.trainer_utils import FSDPOption

from difftransformer.errors import UsageError
from difftransformer.models import KINDS, DiffTransformerConfig, DiffTransformerForCausalLM, training_flops
from difftransformer.models.compositions import composition_label, parse_composition, split_top_level
from difftransformer.train.presets import Preset
from difftransformer.train.settings import step_tokens

FLOAT32_BYTES = (
    4  # master weights and their gradients: Trainer's --bf16 is mixed precision over float32 weights
)
BFLOAT16_BYTES = 2
ADAMW_STATE_BYTES = 8  # AdamW (Trainer's default optimizer) keeps two float32 moments per parameter
GIB = 2**30
# The FSDP sharding words of Trainer's --fsdp this estimate models (auto_wrap: one unit per decoder layer).
MODELED_FSDP_OPTIONS = frozenset(
    {FSDPOption.FULL_SHARD, FSDPOption.SHARD_GRAD_OP, FSDPOption.OFFLOAD, FSDPOption.AUTO_WRAP}
)
PLANNED_KINDS = tuple(KINDS)  # every attention kind, each by its matching rule against the baseline
_PROXY_TOKENS = 64  # tokens of a measuring run: above the decode path's query count, cheap at any vocabulary


@dataclass(frozen=True)
class ParallelSetup:
    """How a run spreads over devices: ``world_size`` processes (one per device), ``fsdp`` Trainer's sharding
    words for the FSDP estimate, bfloat16 mixed precision, activation (gradient) checkpointing. ``plan``'s
    ``--world-size`` is the ``world_size`` field; the others come from the training options of the same names."""

    _argument_group_name = "plan"

    world_size: int = field(default=1, metadata={"help": "processes (one per device) the run is planned for"})
    fsdp: tuple[str, ...] = (FSDPOption.FULL_SHARD,)
    bf16: bool = False
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise UsageError(f"`world_size` must be a positive integer; got {self.world_size!r}")
        unknown = set(self.fsdp) - {option.value for option in MODELED_FSDP_OPTIONS}
        if unknown:
            raise UsageError(
                f"`fsdp`: the plan models {sorted(o.value for o in MODELED_FSDP_OPTIONS)}; got {sorted(unknown)}"
            )
        if FSDPOption.FULL_SHARD in self.fsdp and FSDPOption.SHARD_GRAD_OP in self.fsdp:
            raise UsageError("`fsdp`: choose one of full_shard and shard_grad_op; got both")

    @property
    def compute_bytes(self) -> int:
        """Bytes of one element of the compute copy of a weight (bfloat16 under --bf16)."""
        return BFLOAT16_BYTES if self.bf16 else FLOAT32_BYTES


@dataclass(frozen=True)
class PlannedModels:
    """``plan --kinds``: the models planned, each a kind or a composition of parts in compare's spelling."""

    _argument_group_name = "models"

    kinds: str = field(
        default=",".join(PLANNED_KINDS),
        metadata={"help": "the models planned, comma-separated: kinds or compositions, KIND(FIELD=VALUE,...), e.g. "
                  "diff_v2(output_gate=elementwise) (default: every kind)"},
    )  # fmt: skip

    def __post_init__(self) -> None:
        if not self.specs:
            raise UsageError(f"`kinds` must name at least one model; got {self.kinds!r}")
        for spec in self.specs:
            parse_composition(spec, noun="model")

    @property
    def specs(self) -> tuple[str, ...]:
        """Each model's text."""
        return tuple(split_top_level(self.kinds))


@dataclass(frozen=True)
class StepTiming:
    """``plan --time-steps N``: training steps of each kind timed on this machine, from which a run's training time
    is estimated (its evaluations, data preparation and start-up are not in it)."""

    _argument_group_name = "timing"

    time_steps: int = field(
        default=0,
        metadata={"help": "time this many training steps of each model on this machine, after one warm-up step, and "
                  "estimate a run's training time from them (default 0: no timing)"},
    )  # fmt: skip
    threads: int | None = field(
        default=None,
        metadata={
            "help": "torch threads of the timed steps: a run's cores (default: torch's, the machine's)"
        },
    )

    def __post_init__(self) -> None:
        if self.time_steps < 0:
            raise UsageError(f"`time_steps` must be >= 0; got {self.time_steps}")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"`threads` must be >= 1; got {self.threads}")


def step_seconds(
    config: DiffTransformerConfig, batch: int, block_size: int, steps: int, threads: int | None
) -> float:
    """Seconds of one training step (forward, backward and AdamW on a micro-batch of ``batch`` random rows of
    ``block_size`` ids), the mean of ``steps`` after one warm-up step, with ``threads`` torch threads."""
    from difftransformer.ops import fused_cpu_available

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        fused_cpu_available()  # every kind's norms use the kernels: compiled (first use only) before the clock starts
        model = DiffTransformerForCausalLM(config).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(
            0, config.vocab_size, (batch, block_size), generator=torch.Generator().manual_seed(0)
        )

        def step() -> None:
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()

        step()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - start) / steps
    finally:
        torch.set_num_threads(previous)


@dataclass(frozen=True)
class ParameterCounts:
    """Parameters of one model: all of them, one decoder layer's (an FSDP unit), those outside the decoder layers
    (embeddings, final norm, LM head: the root FSDP unit), and those in ``nn.Linear`` weights (what autocast
    copies to bfloat16)."""

    total: int
    per_layer: int
    outside_layers: int
    in_linear: int


def count_parameters(config: DiffTransformerConfig) -> ParameterCounts:
    """Count the parameters of ``DiffTransformerForCausalLM(config)``, built on the meta device."""
    with torch.device("meta"):
        model = DiffTransformerForCausalLM(config)
    total = sum(p.numel() for p in model.parameters())
    per_layer = sum(p.numel() for p in model.model.layers[0].parameters())
    in_linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return ParameterCounts(
        total=total,
        per_layer=per_layer,
        outside_layers=total - config.num_hidden_layers * per_layer,
        in_linear=in_linear,
    )


@dataclass(frozen=True)
class ActivationRates:
    """Bytes per token kept for backward: by one decoder layer, outside the layers (embeddings, final norm, LM
    head, loss), and a layer's input (all that a checkpointed layer keeps)."""

    per_layer: float
    outside_layers: float
    layer_input: float


_VIEW_NODES = frozenset(
    {"TBackward0", "ViewBackward0", "TransposeBackward0", "PermuteBackward0", "ExpandBackward0"}
)


def _is_weight_copy(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is (a view of) autocast's low-precision copy of a parameter (counted with the
    weights, not the activations)."""
    node = tensor.grad_fn
    while node is not None and type(node).__name__ in _VIEW_NODES:
        node = node.next_functions[0][0]
    if node is None or type(node).__name__ != "ToCopyBackward0":
        return False
    return any(isinstance(getattr(fn, "variable", None), nn.Parameter) for fn, _ in node.next_functions if fn)


def saved_bytes(config: DiffTransformerConfig, tokens: int, *, bf16: bool) -> int:
    """Bytes of the tensors that one training forward of ``DiffTransformerForCausalLM(config)`` (one sequence of
    ``tokens`` tokens, next-token loss) keeps for backward on the CPU, parameters and their autocast copies
    excluded; every storage counted once."""
    model = DiffTransformerForCausalLM(config).train()
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters and not _is_weight_copy(tensor):
            kept[storage.data_ptr()] = storage.nbytes()  # saved tensors stay alive: addresses are unique
        return tensor

    ids = torch.arange(tokens).remainder(config.vocab_size)[None]
    with (
        torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16),
    ):
        model(input_ids=ids, labels=ids)
    return sum(kept.values())


def _proxy_widths(config: DiffTransformerConfig) -> tuple[int, int]:
    """Two small d_model values that keep ``config``'s heads and key-value heads valid."""
    widths = []
    for per_head in range(2, 66, 2):
        try:
            dataclasses.replace(config, hidden_size=config.num_attention_heads * per_head)
        except ValueError:
            continue
        widths.append(config.num_attention_heads * per_head)
        if len(widths) == 2:
            return widths[0], widths[1]
    raise UsageError(f"no small d_model fits {config.num_attention_heads} heads of kind {config.attention!r}")


def activation_rates(config: DiffTransformerConfig, *, bf16: bool) -> ActivationRates:
    """Bytes per token kept for backward by ``config``'s model, measured on narrow copies (see the module
    docstring) through the fused SDPA kernels, which keep no attention maps (as flash attention on a GPU)."""
    (h1, h2), (f1, f2) = _proxy_widths(config), (16, 32)

    def per_token(hidden: int, ffn: int) -> tuple[float, float]:
        one, two = (
            saved_bytes(
                dataclasses.replace(
                    config,
                    hidden_size=hidden,
                    intermediate_size=ffn,
                    num_hidden_layers=layers,
                    attention_backend="sdpa" if config.differential_heads else "auto",
                ),
                _PROXY_TOKENS,
                bf16=bf16,
            )
            for layers in (1, 2)
        )
        return (two - one) / _PROXY_TOKENS, (2 * one - two) / _PROXY_TOKENS  # per layer, outside the layers

    base, wider, longer_ffn = per_token(h1, f1), per_token(h2, f1), per_token(h1, f2)

    def extrapolate(part: int) -> float:
        per_width = (wider[part] - base[part]) / (h2 - h1)
        per_ffn = (longer_ffn[part] - base[part]) / (f2 - f1)
        return base[part] + per_width * (config.hidden_size - h1) + per_ffn * (config.intermediate_size - f1)

    # The residual stream stays float32 under autocast: a checkpointed layer keeps its float32 input.
    return ActivationRates(
        per_layer=extrapolate(0),
        outside_layers=extrapolate(1),
        layer_input=FLOAT32_BYTES * config.hidden_size,
    )


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device, by what holds them."""

    weights: int
    gradients: int
    optimizer_state: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer_state + self.activations


def activation_bytes(
    rates: ActivationRates, layers: int, tokens_per_device: int, *, gradient_checkpointing: bool
) -> int:
    """Activations of one micro-batch of ``tokens_per_device`` tokens at the peak (the start of backward). With
    checkpointing, every layer keeps its input and one layer at a time is recomputed in full."""
    if gradient_checkpointing:
        per_token = layers * rates.layer_input + rates.per_layer + rates.outside_layers
    else:
        per_token = layers * rates.per_layer + rates.outside_layers
    return math.ceil(tokens_per_device * per_token)


def ddp_memory(
    counts: ParameterCounts, rates: ActivationRates, setup: ParallelSetup, layers: int, tokens_per_device: int
) -> MemoryEstimate:
    """DDP: every device holds the whole model, its gradients (twice with more than one process: DDP's
    communication buckets are a second copy), the optimizer state, autocast's bfloat16 copies of the linear
    weights under --bf16, and its micro-batch's activations."""
    copies = BFLOAT16_BYTES * counts.in_linear if setup.bf16 else 0
    return MemoryEstimate(
        weights=FLOAT32_BYTES * counts.total + copies,
        gradients=FLOAT32_BYTES * counts.total * (2 if setup.world_size > 1 else 1),
        optimizer_state=ADAMW_STATE_BYTES * counts.total,
        activations=activation_bytes(
            rates, layers, tokens_per_device, gradient_checkpointing=setup.gradient_checkpointing
        ),
    )


def fsdp_memory(
    counts: ParameterCounts, rates: ActivationRates, setup: ParallelSetup, layers: int, tokens_per_device: int
) -> MemoryEstimate:
    """FSDP2, one unit per decoder layer plus the root (embeddings, norm, head): each device keeps 1/world_size of
    the float32 weights, gradients and optimizer state (on the CPU with ``offload``), plus the gathered compute
    copies in flight: the root's for the whole step and two layers' (the one running and the one prefetched), or
    every layer's between forward and backward with ``shard_grad_op``; the gathered gradients of the root and one
    layer before their reduce-scatter; and its micro-batch's activations."""
    shard = math.ceil(counts.total / setup.world_size)
    on_device = 0 if FSDPOption.OFFLOAD in setup.fsdp else 1
    gathered_layers = layers if FSDPOption.SHARD_GRAD_OP in setup.fsdp else min(2, layers)
    compute = setup.compute_bytes
    return MemoryEstimate(
        weights=on_device * FLOAT32_BYTES * shard
        + compute * (counts.outside_layers + gathered_layers * counts.per_layer),
        gradients=on_device * FLOAT32_BYTES * shard + compute * (counts.outside_layers + counts.per_layer),
        optimizer_state=on_device * ADAMW_STATE_BYTES * shard,
        activations=activation_bytes(
            rates, layers, tokens_per_device, gradient_checkpointing=setup.gradient_checkpointing
        ),
    )


@dataclass(frozen=True)
class TimedStretch:
    """A stretch of a run: ``steps`` training steps on rows of ``tokens``, each timed at ``seconds``."""

    steps: int
    tokens: int
    seconds: float


@dataclass(frozen=True)
class KindPlan:
    """One model (a kind or a composition of parts): its parameters, memory per device under DDP and FSDP, its
    training FLOPs (a token at the block size, and the run's, counted from its shapes: models/flops.py) and (when
    timed) the seconds of a training step in each stretch of the run's row lengths."""

    kind: str
    config: DiffTransformerConfig
    counts: ParameterCounts
    rates: ActivationRates
    ddp: MemoryEstimate
    fsdp: MemoryEstimate
    flops_per_token: float
    run_flops: float
    timed: tuple[TimedStretch, ...] = ()

    @property
    def label(self) -> str:
        """Its name in tables."""
        return composition_label(*parse_composition(self.kind))

    @property
    def training_seconds(self) -> float:
        """The run's training time from the timed steps (0 when not timed)."""
        return sum(stretch.steps * stretch.seconds for stretch in self.timed)


@dataclass(frozen=True)
class Plan:
    """What a run of ``preset`` needs under ``setup``."""

    preset: Preset
    setup: ParallelSetup
    tokens_per_device: int
    tokens_per_step: int
    kinds: tuple[KindPlan, ...]
    timing: StepTiming = StepTiming()


def make_plan(
    preset: Preset,
    setup: ParallelSetup,
    kinds: tuple[str, ...] = PLANNED_KINDS,
    timing: StepTiming = StepTiming(),
) -> Plan:
    """The plan of a run of ``preset`` (with its training settings) on ``setup``; with ``timing.time_steps``, each
    kind's training step timed on this machine at the preset's micro-batch, at every row length of its
    ``length_schedule`` (the block size without one)."""
    batch = preset.training.per_device_train_batch_size
    tokens_per_device = preset.block_size * batch
    plans = []
    stretches = preset.recall.stretches(0, preset.training.max_steps, preset.block_size)
    rows_per_step = step_tokens(
        1,
        per_device_batch=batch,
        accumulation=preset.training.gradient_accumulation_steps,
        world_size=setup.world_size,
    )
    for kind in kinds:
        name, fields = parse_composition(kind, noun="model")
        config = preset.model_config(name, **fields)
        counts = count_parameters(config)
        rates = activation_rates(config, bf16=setup.bf16)
        layers = config.num_hidden_layers
        plans.append(
            KindPlan(
                kind=kind,
                config=config,
                counts=counts,
                rates=rates,
                ddp=ddp_memory(counts, rates, setup, layers, tokens_per_device),
                fsdp=fsdp_memory(counts, rates, setup, layers, tokens_per_device),
                flops_per_token=training_flops(config, preset.block_size).total,
                run_flops=sum(
                    steps * rows_per_step * tokens * training_flops(config, tokens).total
                    for steps, tokens in stretches
                ),
                timed=tuple(
                    TimedStretch(
                        steps, tokens, step_seconds(config, batch, tokens, timing.time_steps, timing.threads)
                    )
                    for steps, tokens in stretches
                )
                if timing.time_steps
                else (),
            )
        )
    return Plan(
        preset=preset,
        setup=setup,
        tokens_per_device=tokens_per_device,
        tokens_per_step=step_tokens(
            preset.block_size,
            per_device_batch=batch,
            accumulation=preset.training.gradient_accumulation_steps,
            world_size=setup.world_size,
        ),
        kinds=tuple(plans),
        timing=timing,
    )
