"""Every differential-attention backend against the float64 reference, forward and backward."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from difftransformer.ops import (
    build_attend_mask,
    diff_attention,
    diff_attention_reference,
    softmax_attention_reference,
)

TOL = {
    torch.bfloat16: dict(atol=4e-2, rtol=4e-2),
    torch.float32: dict(atol=2e-5, rtol=2e-4),
    torch.float64: dict(atol=1e-10, rtol=1e-9),
}


@st.composite
def diff_problems(draw):
    batch = draw(st.integers(1, 2))
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 3))
    d = draw(st.sampled_from([2, 4, 8, 16]))
    q_len = draw(st.integers(1, 9))
    kv_len = q_len + draw(st.sampled_from([0, 0, 1, 5]))  # below the key length: a KV cache
    causal = draw(st.booleans())
    mask_kind = draw(st.sampled_from(["none", "bool", "additive"]))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
    seed = draw(st.integers(0, 2**16))
    return batch, heads, kv_heads, d, q_len, kv_len, causal, mask_kind, dtype, seed


def make_inputs(batch, heads, kv_heads, d, q_len, kv_len, mask_kind, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, 2 * d, generator=gen, dtype=torch.float64) * 1.5
    k = torch.randn(batch, kv_heads, kv_len, 2 * d, generator=gen, dtype=torch.float64) * 1.5
    v = torch.randn(batch, kv_heads, kv_len, 2 * d, generator=gen, dtype=torch.float64)
    lam = torch.tensor(
        0.2 + 0.6 * torch.rand((), generator=gen, dtype=torch.float64).item(), dtype=torch.float64
    )
    mask = None
    if mask_kind != "none":
        keep = torch.rand(batch, 1, q_len, kv_len, generator=gen) > 0.3
        mask = (
            keep
            if mask_kind == "bool"
            else torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, -math.inf)
        )
    return [t.to(dtype).requires_grad_() for t in (q, k, v, lam)], mask


def grads(out, inputs, seed):
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    return torch.autograd.grad(out, inputs, upstream.to(out.dtype))


def loop_reference(q, k, v, lam, causal, mask):
    """Head by head, straight from the paper's definition (no shared code with the library)."""
    batch, heads, q_len, width = q.shape
    kv_heads, kv_len, d = k.shape[1], k.shape[2], width // 2
    out = torch.zeros(batch, heads, q_len, width, dtype=torch.float64)
    for b in range(batch):
        for i in range(heads):
            g = i // (heads // kv_heads)
            visible = torch.ones(q_len, kv_len, dtype=torch.bool)
            if causal:
                visible &= torch.arange(kv_len)[None, :] <= torch.arange(q_len)[:, None] + kv_len - q_len
            if mask is not None:
                visible &= mask[b, 0] if mask.dtype == torch.bool else mask[b, 0] == 0
            maps = []
            for c in range(2):
                logits = q[b, i, :, c * d : (c + 1) * d] @ k[b, g, :, c * d : (c + 1) * d].T / math.sqrt(d)
                probs = torch.softmax(logits.masked_fill(~visible, -math.inf), -1)
                maps.append(torch.nan_to_num(probs, nan=0.0))
            out[b, i] = (maps[0] - lam * maps[1]) @ v[b, g]
    return out


@given(diff_problems())
def test_reference_matches_loops(problem):
    batch, heads, kv_heads, d, q_len, kv_len, causal, mask_kind, _, seed = problem
    (q, k, v, lam), mask = make_inputs(
        batch, heads, kv_heads, d, q_len, kv_len, mask_kind, torch.float64, seed
    )
    out, _ = diff_attention_reference(q, k, v, lam, causal=causal, attn_mask=mask)
    expected = loop_reference(q.detach(), k.detach(), v.detach(), lam.detach(), causal, mask)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("backend", ["sdpa", "auto"])
@given(problem=diff_problems())
def test_backend_matches_reference_forward_backward(backend, problem):
    batch, heads, kv_heads, d, q_len, kv_len, causal, mask_kind, dtype, seed = problem
    inputs, mask = make_inputs(batch, heads, kv_heads, d, q_len, kv_len, mask_kind, dtype, seed)
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    ref_mask = mask.double() if mask is not None and mask.dtype != torch.bool else mask
    expected, _ = diff_attention_reference(*ref_inputs, causal=causal, attn_mask=ref_mask)
    out = diff_attention(*inputs, causal=causal, attn_mask=mask, backend=backend)
    assert out.dtype == dtype and out.shape == (batch, heads, q_len, 2 * d)
    torch.testing.assert_close(out.double(), expected, **TOL[dtype])
    for got, want in zip(grads(out, inputs, seed), grads(expected, ref_inputs, seed)):
        torch.testing.assert_close(got.double(), want, **TOL[dtype])


@given(diff_problems())
def test_the_baselines_sdpa_matches_the_softmax_reference(problem):
    """The baseline's default path, transformers' sdpa attention function, against the float64 reference with the
    masks transformers builds (bool, or None for plain causal over as many keys as queries), GQA included."""
    batch, heads, kv_heads, d, q_len, kv_len, causal, mask_kind, dtype, seed = problem
    (q, k, v, _), mask = make_inputs(batch, heads, kv_heads, d, q_len, kv_len, mask_kind, dtype, seed)
    if mask is not None or (causal and q_len != kv_len):
        mask = build_attend_mask(batch, q_len, kv_len, causal=causal, attn_mask=mask, device=q.device)
        causal = causal and mask is None
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected, probs = softmax_attention_reference(*ref, causal=causal, attn_mask=mask)
    module = SimpleNamespace(
        is_causal=causal, num_key_value_groups=heads // kv_heads, layer_idx=0, training=False
    )
    out, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=q.shape[-1] ** -0.5)
    out = out.transpose(1, 2)  # transformers' functions return (B, T, H, d)
    torch.testing.assert_close(out.double(), expected, **TOL[dtype])
    for got, want in zip(grads(out, [q, k, v], seed), grads(expected, ref, seed)):
        torch.testing.assert_close(got.double(), want, **TOL[dtype])
    visible_rows = probs.sum(-1)
    assert torch.all(((visible_rows - 1).abs() < 1e-9) | (visible_rows == 0))


def test_maps_are_the_difference_of_two_softmaxes():
    (q, k, v, lam), _ = make_inputs(2, 4, 2, 8, 6, 6, "none", torch.float64, 3)
    out, (combined, map1, map2) = diff_attention_reference(q, k, v, lam, return_maps=True)
    torch.testing.assert_close(map1.sum(-1), torch.ones_like(map1.sum(-1)))
    torch.testing.assert_close(combined, map1 - lam * map2)
    assert torch.all(map1.triu(1) == 0), "causal maps must not look ahead"
    assert (combined < 0).any(), "a differential map has negative entries"
    torch.testing.assert_close(out, combined @ v.repeat_interleave(2, dim=1))


def test_fully_masked_rows_give_zero_output_and_finite_gradients():
    (q, k, v, lam), _ = make_inputs(1, 2, 1, 4, 3, 3, "none", torch.float64, 7)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    mask[..., 1, :] = False
    for backend in ("reference", "sdpa"):
        out = diff_attention(q, k, v, lam, causal=False, attn_mask=mask, backend=backend)
        assert torch.all(out[:, :, 1] == 0)
        assert all(torch.isfinite(g).all() for g in grads(out, [q, k, v, lam], 0))


def test_causal_alignment_is_bottom_right_for_a_cache():
    """The last query of a shorter query block sees every key: decode steps equal the full pass."""
    (q, k, v, lam), _ = make_inputs(1, 2, 2, 4, 7, 7, "none", torch.float64, 11)
    full = diff_attention(q, k, v, lam, backend="sdpa")
    tail = diff_attention(q[:, :, -2:], k, v, lam, backend="sdpa")
    torch.testing.assert_close(tail, full[:, :, -2:])


@pytest.mark.parametrize(
    "shapes, message",
    [
        (((1, 2, 3, 8), (1, 2, 3, 6), (1, 2, 3, 8)), "k must be"),
        (((1, 3, 3, 8), (1, 2, 3, 8), (1, 2, 3, 8)), "multiple of KV heads"),
        (((1, 2, 3, 7), (1, 2, 3, 7), (1, 2, 3, 7)), "even"),
        (((1, 2, 5, 8), (1, 2, 3, 8), (1, 2, 3, 8)), "cannot exceed"),
        (((1, 2, 3, 8), (1, 2, 3, 8), (1, 1, 3, 8)), "v must be"),
    ],
)
def test_bad_shapes_are_refused(shapes, message):
    """With autograd on, the Python decode path checks; under no_grad the C++ decode step checks itself."""
    q, k, v = (torch.randn(s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        diff_attention(q, k, v, 0.5)
    with torch.no_grad(), pytest.raises(ValueError, match=message):
        diff_attention(q, k, v, 0.5)


def test_bad_mask_and_backend_are_refused():
    q, k, v = (torch.randn(2, 2, 3, 8) for _ in range(3))
    with pytest.raises(ValueError, match="attn_mask must have shape"):
        diff_attention(q, k, v, 0.5, attn_mask=torch.ones(2, 1, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bias"):
        diff_attention(q, k, v, 0.5, attn_mask=torch.randn(2, 1, 3, 3))
    with pytest.raises(ValueError, match="backend must be one of"):
        diff_attention(q, k, v, 0.5, backend="flash")
