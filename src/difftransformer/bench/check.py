"""Every differential-attention backend against the float64 reference, forward and backward, on a device.

This is the device-side twin of tests/test_ops.py, for machines where pytest is not at hand (the GPU check):
random shapes with causal and full masks, padding masks, GQA and queries shorter than keys.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from difftransformer.ops import BACKENDS, diff_attention, diff_attention_reference

TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2, torch.float64: 1e-9}


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    q_len: int
    kv_len: int
    causal: bool
    padding: bool


CASES = (
    Case(2, 4, 4, 32, 64, 64, True, False),
    Case(2, 4, 2, 32, 40, 40, True, True),
    Case(1, 6, 2, 16, 7, 300, True, False),
    Case(2, 2, 1, 64, 1, 129, True, True),
    Case(1, 4, 4, 32, 96, 96, False, True),
    Case(1, 4, 4, 32, 600, 1100, True, False),
)


def _inputs(case: Case, seed: int):
    gen = torch.Generator().manual_seed(seed)
    d = case.head_dim
    q = torch.randn(case.batch, case.heads, case.q_len, 2 * d, generator=gen, dtype=torch.float64) * 1.5
    k = torch.randn(case.batch, case.kv_heads, case.kv_len, 2 * d, generator=gen, dtype=torch.float64) * 1.5
    v = torch.randn(case.batch, case.kv_heads, case.kv_len, 2 * d, generator=gen, dtype=torch.float64)
    lam = torch.tensor(0.2 + 0.6 * torch.rand((), generator=gen).item(), dtype=torch.float64)
    mask = None
    if case.padding:  # left padding of a random length per sequence
        pad = torch.randint(0, case.kv_len // 3 + 1, (case.batch,), generator=gen)
        mask = (torch.arange(case.kv_len)[None, :] >= pad[:, None])[:, None, None, :]
        mask = mask.expand(case.batch, 1, case.q_len, case.kv_len)
    upstream = torch.randn(case.batch, case.heads, case.q_len, 2 * d, generator=gen, dtype=torch.float64)
    return (q, k, v, lam), mask, upstream


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / (max |want| + tiny), in float64."""
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).abs().max() / (want.abs().max() + 1e-12))


def runs_backward(backend: str, device: torch.device) -> bool:
    """FlexAttention has no CPU backward (torch 2.13): there "flex" is checked forward only."""
    return not (backend == "flex" and device.type == "cpu")


def applies(backend: str, device: torch.device, dtype: torch.dtype, padded: bool) -> bool:
    """Whether ``backend`` takes this device, dtype and mask at all ("fused_cpu": CPU float32, no mask)."""
    if backend == "fused_cpu":
        return device.type == "cpu" and dtype == torch.float32 and not padded
    return True


def check_backends(
    device: torch.device,
    dtype: torch.dtype,
    backends: tuple[str, ...] = BACKENDS,
    seed: int = 0,
    cases: tuple[Case, ...] = CASES,
) -> list[dict]:
    """Compare each backend on ``device``/``dtype`` with the float64 CPU reference; one row per (backend, case).

    Rows carry the worst relative error over the output and the gradients of q, k, v, lambda (output only
    where the backend has no backward on the device), and ``ok``; backends that do not take a case's device,
    dtype or mask (see :func:`applies`) are skipped.
    """
    rows = []
    for index, case in enumerate(cases):
        inputs, mask, upstream = _inputs(case, seed + index)
        ref_in = [t.clone().requires_grad_() for t in inputs]
        want = diff_attention_reference(*ref_in, causal=case.causal, attn_mask=mask)[0]
        want_grads = torch.autograd.grad(want, ref_in, upstream)
        for backend in backends:
            if not applies(backend, device, dtype, mask is not None):
                continue
            backward = runs_backward(backend, device)
            dev_in = [t.to(device=device, dtype=dtype).requires_grad_(backward) for t in inputs[:3]]
            dev_in.append(inputs[3].to(device=device, dtype=torch.float32).requires_grad_(backward))
            dev_mask = None if mask is None else mask.to(device)
            got = diff_attention(*dev_in, causal=case.causal, attn_mask=dev_mask, backend=backend)
            errors = [relative_error(got.cpu(), want)]
            if backward:
                got_grads = torch.autograd.grad(got, dev_in, upstream.to(device=device, dtype=dtype))
                errors += [relative_error(g.cpu(), w) for g, w in zip(got_grads, want_grads)]
            worst = max(errors)
            rows.append(
                dict(
                    backend=backend,
                    case=dataclasses.asdict(case),
                    max_rel_error=worst,
                    ok=math.isfinite(worst) and worst <= TOLERANCE[dtype],
                )
            )
    return rows
