"""What `difftransformer bench` measures: the attention operator, a train step, greedy decode, peak memory.

Contenders share one random init: the baseline is built from the same seed, and DiffLlama is converted
from our DIFF model (:func:`difftransformer.convert.to_diffllama`), so it computes the same function. The other
attention kinds benchmarked beside them (any kind, or a composition of parts such as
``diff_v2(output_gate=elementwise)``) follow the baseline by the parts' matching rule (models/matching.py), each
built from the same seed. Each contender's FLOPs per token are counted from its configuration (models/flops.py), so
a measured ratio can be read against the ratio of the work.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from difftransformer import DiffTransformerConfig, DiffTransformerForCausalLM
from difftransformer.errors import UsageError
from difftransformer.models import decode_flops, matched_config, training_flops
from difftransformer.models.compositions import parse_composition
from difftransformer.ops import diff_attention

# The contenders' names in every measurement; each other kind is named by its text (``gda(gda_ratio=3)``).
DIFF, BASELINE, DIFFLLAMA = "diff", "baseline", "diffllama"


@dataclasses.dataclass(frozen=True)
class BenchShape:
    """The benchmark's model, in the config's names: DIFF with ``num_attention_heads`` heads = a baseline with
    twice as many; ``batch`` rows per train step."""

    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    vocab_size: int = 4096
    batch: int = 4

    @property
    def head_dim(self) -> int:
        return self.hidden_size // (2 * self.num_attention_heads)


def diff_config(shape: BenchShape, max_len: int) -> DiffTransformerConfig:
    return DiffTransformerConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        max_position_embeddings=max_len,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def bench_configs(
    shape: BenchShape, max_len: int, kinds: Sequence[str] = ()
) -> dict[str, DiffTransformerConfig]:
    """{"diff": DIFF V1, "baseline": its ``matched_baseline()``, and each of ``kinds`` (a kind or a composition,
    ``KIND(FIELD=VALUE,...)``) under its text, matched to that baseline by the parts' rule}; a UsageError naming
    ``kinds`` for one that does not parse or that the rule cannot match at this shape."""
    diff = diff_config(shape, max_len)
    baseline = diff.matched_baseline()
    configs = {DIFF: diff, BASELINE: baseline}
    for spec in kinds:
        kind, fields = parse_composition(spec, noun="kind")
        try:
            configs[spec] = matched_config(baseline, kind, **fields)
        except (TypeError, ValueError) as err:
            raise UsageError(
                f"`kinds`: {spec} cannot be matched to the bench's baseline ({baseline.num_attention_heads} "
                f"heads of width {baseline.head_dim} over {baseline.num_key_value_heads} KV heads): {err}"
            ) from err
    return configs


def build_models(
    shape: BenchShape,
    max_len: int,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    kinds: Sequence[str] = (),
    diffllama: bool = True,
) -> dict[str, nn.Module]:
    """The models of :func:`bench_configs`, each built from ``seed``, and (with ``diffllama``) transformers'
    DiffLlama converted from the DIFF model, on ``device`` in ``dtype``."""
    models = {}
    for name, config in bench_configs(shape, max_len, kinds).items():
        torch.manual_seed(seed)
        models[name] = DiffTransformerForCausalLM(config)
    if diffllama:
        from difftransformer.convert import to_diffllama  # transformers' DiffLlama only when benchmarked

        models[DIFFLLAMA] = to_diffllama(models[DIFF])
    return {name: model.to(device=device, dtype=dtype) for name, model in models.items()}


def train_flops(models: dict[str, nn.Module], length: int) -> dict[str, float]:
    """FLOPs per trained token of each of ``models`` built from our configuration (DiffLlama left out) on rows of
    ``length`` tokens."""
    return {
        name: training_flops(model.config, length).total
        for name, model in models.items()
        if isinstance(model.config, DiffTransformerConfig)
    }


def decode_step_flops(models: dict[str, nn.Module], prompt_len: int, steps: int) -> dict[str, float]:
    """FLOPs of the ``steps`` timed decode steps after a ``prompt_len``-token prefill (the first step attends to the
    prompt and its own token), summed per model as :class:`GreedyDecode` runs them; DiffLlama left out."""
    return {
        name: sum(
            decode_flops(model.config, cached).total for cached in range(prompt_len, prompt_len + steps)
        )
        for name, model in models.items()
        if isinstance(model.config, DiffTransformerConfig)
    }


def random_ids(shape: BenchShape, length: int, device: torch.device, seed: int, batch: int | None = None):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, shape.vocab_size, (shape.batch if batch is None else batch, length), generator=gen)
    return ids.to(device)


# ---- the attention operator ------------------------------------------------------------------------------


def op_contenders(
    shape: BenchShape,
    length: int,
    batch: int,
    backends: list[str],
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
) -> dict[str, Callable[[], None]]:
    """Causal attention forward + backward: the baseline's SDPA over 2h heads of width d, and DIFF per backend
    over h heads of width 2d (the layouts each model feeds its operator)."""
    gen = torch.Generator().manual_seed(seed)
    maps, d = 2 * shape.num_attention_heads, shape.head_dim

    def leaf(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen).to(device=device, dtype=dtype).requires_grad_()

    base_qkv = [leaf(batch, maps, length, d) for _ in range(3)]
    base_grad = torch.randn(batch, maps, length, d, generator=gen).to(device=device, dtype=dtype)
    diff_qkv = [leaf(batch, shape.num_attention_heads, length, 2 * d) for _ in range(3)]
    diff_grad = torch.randn(batch, shape.num_attention_heads, length, 2 * d, generator=gen).to(
        device=device, dtype=dtype
    )
    lam = torch.tensor(0.5, device=device, requires_grad=True)

    def baseline() -> None:
        out = F.scaled_dot_product_attention(*base_qkv, is_causal=True)
        torch.autograd.grad(out, base_qkv, base_grad)

    def diff(backend: str) -> Callable[[], None]:
        def run() -> None:
            out = diff_attention(*diff_qkv, lam, causal=True, backend=backend)
            torch.autograd.grad(out, [*diff_qkv, lam], diff_grad)

        return run

    return {"baseline": baseline, **{f"diff[{b}]": diff(b) for b in backends}}


# ---- a train step ------------------------------------------------------------------------------------------


def train_step_fn(model: nn.Module, ids: torch.Tensor, lr: float = 1e-4) -> Callable[[], None]:
    """Forward with the LM loss, backward, AdamW step (state is created on the first call: warm up first)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()

    def step() -> None:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step.optimizer = optimizer  # type: ignore[attr-defined]
    return step


# ---- greedy decode ----------------------------------------------------------------------------------------


class GreedyDecode:
    """Greedy decode with a DynamicCache, a step at a time: :meth:`prefill` the prompt, then :meth:`step` once per
    new token (``new_tokens - 1`` times: prefill yields the first). The caller times the steps (prefill excluded),
    so contenders can take turns token by token (:func:`~difftransformer.bench.timing.interleaved_steps`).
    """

    def __init__(self, model: nn.Module, prompt: torch.Tensor, new_tokens: int) -> None:
        self.model, self.prompt, self.steps = model.eval(), prompt, new_tokens - 1
        self.generated: list[torch.Tensor] = []
        self.cache = None

    @torch.inference_mode()
    def prefill(self) -> None:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=self.prompt, past_key_values=cache, use_cache=True)
        self.cache, self.generated = out.past_key_values, [out.logits[:, -1:].argmax(-1)]

    @torch.inference_mode()
    def step(self) -> None:
        out = self.model(input_ids=self.generated[-1], past_key_values=self.cache, use_cache=True)
        self.generated.append(out.logits[:, -1:].argmax(-1))

    @property
    def tokens(self) -> torch.Tensor:
        """(B, tokens generated so far)."""
        return torch.cat(self.generated, dim=1)


# ---- peak memory ------------------------------------------------------------------------------------------


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes held between steps: parameters and the optimizer's state tensors."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for state in optimizer.state.values():
        total += sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))
    return total


def step_peak_bytes(step: Callable[[], None], device: torch.device) -> int:
    """Peak bytes allocated by torch during one call of ``step``, above what was allocated when it began.

    CUDA: ``torch.cuda.max_memory_allocated``. CPU: the profiler's allocator events (``profile_memory``):
    each carries the running total of bytes allocated since profiling began, so their maximum is the step's
    peak. Both count tensor memory only (no allocator caching, no Python objects), the same way for everyone.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
    totals = [
        e["args"]["Total Allocated"]
        for e in events
        if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0
    ]
    return max(totals, default=0)
