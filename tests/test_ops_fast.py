"""The blocked, decode and fused CPU backends and backend="auto" against the float64 reference, forward and
backward."""

from __future__ import annotations

import importlib
import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from difftransformer.ops import (
    QueryRotary,
    choose_backend,
    cpp_kernels,
    diff_attention,
    diff_attention_blocked,
    diff_attention_fused_cpu,
    diff_attention_reference,
    fused_cpu,
    lambda_full,
    rms_norm,
    rotate_queries,
)
from test_ops import TOL, diff_problems, grads, make_inputs


def check_against_reference(problem, run):
    batch, heads, kv_heads, d, q_len, kv_len, causal, mask_kind, dtype, seed = problem
    inputs, mask = make_inputs(batch, heads, kv_heads, d, q_len, kv_len, mask_kind, dtype, seed)
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    ref_mask = mask.double() if mask is not None and mask.dtype != torch.bool else mask
    expected, _ = diff_attention_reference(*ref_inputs, causal=causal, attn_mask=ref_mask)
    out = run(*inputs, causal=causal, attn_mask=mask)
    assert out.dtype == dtype and out.shape == (batch, heads, q_len, 2 * d)
    torch.testing.assert_close(out.double(), expected, **TOL[dtype])
    for got, want in zip(grads(out, inputs, seed), grads(expected, ref_inputs, seed)):
        torch.testing.assert_close(got.double(), want, **TOL[dtype])


@pytest.mark.parametrize("backend", ["blocked", "decode"])
@given(problem=diff_problems())
def test_backend_matches_reference_forward_backward(backend, problem):
    check_against_reference(problem, lambda *a, **kw: diff_attention(*a, backend=backend, **kw))


@given(problem=diff_problems(), block_queries=st.integers(1, 4))
def test_blocked_with_many_blocks_matches_reference(problem, block_queries):
    """Tiny blocks: causal key skipping, block edges and GQA rows sharing a block all get exercised."""
    check_against_reference(
        problem, lambda *a, **kw: diff_attention_blocked(*a, block_queries=block_queries, **kw)
    )


@pytest.mark.parametrize("backend", ["blocked", "decode"])
def test_fully_masked_rows_give_zero_and_finite_gradients(backend):
    (q, k, v, lam), _ = make_inputs(2, 4, 2, 4, 5, 7, "none", torch.float64, 3)
    mask = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    mask[0, :, 2] = False
    out = diff_attention(q, k, v, lam, causal=True, attn_mask=mask, backend=backend)
    assert torch.all(out[0, :, 2] == 0) and out[1, :, 2].abs().sum() > 0
    assert all(torch.isfinite(g).all() for g in grads(out, [q, k, v, lam], 0))


def test_blocked_output_is_laid_out_for_the_output_projection():
    (q, k, v, lam), _ = make_inputs(2, 4, 2, 8, 9, 9, "none", torch.float32, 5)
    out = diff_attention_blocked(q, k, v, lam, block_queries=4)
    assert out.transpose(1, 2).is_contiguous()


def test_float_lambda_and_no_grad_work():
    (q, k, v, lam), _ = make_inputs(1, 2, 1, 4, 6, 6, "none", torch.float64, 9)
    expected, _ = diff_attention_reference(q, k, v, 0.3)
    with torch.no_grad():
        for backend in ("blocked", "decode"):
            torch.testing.assert_close(diff_attention(q, k, v, 0.3, backend=backend), expected)


def test_auto_picks_by_shape_dtype_and_device():
    def pick(q_len, kv_len, dtype=torch.float32, mask=None):
        return choose_backend(
            torch.empty(1, 2, q_len, 8, dtype=dtype), torch.empty(1, 2, kv_len, 8, dtype=dtype), mask
        )

    padding = torch.ones(1, 1, 512, 512, dtype=torch.bool)
    assert pick(1, 4096) == "decode" and pick(16, 600) == "decode"
    assert pick(512, 512) == "fused_cpu" and pick(2048, 2048) == "fused_cpu"
    assert pick(512, 512, torch.float64) == "blocked" and pick(512, 512, mask=padding) == "blocked"
    assert pick(2048, 2048, torch.float64) == "sdpa"
    assert pick(512, 512, torch.bfloat16) == "sdpa"


def test_without_the_package_only_kernels_auto_runs_sdpa_and_a_request_is_refused(monkeypatch):
    """The code a saved folder carries has no fast path (each is None there): "auto" then runs SDPA, also for a
    decode step, and asking for one of them by name is refused in one line naming it."""
    dispatch = importlib.import_module("difftransformer.ops.diff_attention")

    for name in ("blocked", "decode", "flex"):
        monkeypatch.setitem(dispatch._MASKED_KERNELS, name, None)
    for name in ("diff_attention_blocked", "diff_attention_decode"):
        monkeypatch.setattr(dispatch, name, None)
    monkeypatch.setattr(dispatch, "cpu_kernels_for", lambda *tensors: None)
    for q_len, kv_len in ((1, 64), (16, 600), (512, 512)):
        q, k = torch.empty(1, 2, q_len, 8), torch.empty(1, 2, kv_len, 8)
        assert choose_backend(q, k) == "sdpa"
    q, k = torch.empty(1, 2, 4, 8), torch.empty(1, 2, 4, 8)
    assert choose_backend(q, k, implementation="eager") == "reference"
    with pytest.raises(ValueError, match="backend 'flex' \\(attn_implementation 'flex_attention'\\) runs in"):
        choose_backend(q, k, implementation="flex_attention")
    for backend in ("blocked", "decode"):
        with pytest.raises(ValueError, match=f"backend '{backend}'.*install difftransformer"):
            choose_backend(q, k, backend=backend)


@st.composite
def fused_problems(draw):
    """Unmasked float32 problems, long enough to span several blocks of the (shrunk) query block sizes."""
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 3))
    q_len = draw(st.integers(1, 40))
    kv_len = q_len + draw(st.sampled_from([0, 0, 1, 13]))
    return (
        draw(st.integers(1, 2)), heads, kv_heads, draw(st.sampled_from([2, 4, 8, 16])), q_len, kv_len,
        draw(st.booleans()), "none", torch.float32, draw(st.integers(0, 2**16)),
    )  # fmt: skip


@given(problem=fused_problems(), block=st.sampled_from([1, 3, 8, None]))
def test_fused_cpu_matches_reference_forward_backward(problem, block):
    """Small query blocks put causal edges on every block boundary; None keeps the budget's choice."""
    with pytest.MonkeyPatch.context() as patch:
        if block is not None:
            patch.setattr(fused_cpu, "query_block", lambda keys: block)
        check_against_reference(problem, lambda *a, attn_mask, **kw: diff_attention_fused_cpu(*a, **kw))


@given(problem=fused_problems())
def test_decode_cpu_kernel_matches_reference_at_inference(problem):
    """Generation's path: CPU float32, no grad, no mask -> the C++ decode kernel (K and V read once)."""
    batch, heads, kv_heads, d, q_len, kv_len, causal, _, _, seed = problem
    (q, k, v, lam), _ = make_inputs(
        batch, heads, kv_heads, d, min(q_len, 16), kv_len, "none", torch.float64, seed
    )
    expected, _ = diff_attention_reference(q, k, v, lam, causal=causal)
    with torch.no_grad():
        assert choose_backend(q.float(), k.float()) == "decode_cpu"
        direct = cpp_kernels().decode(q.float(), k.float(), v.float(), lam.float(), causal, None, None)
        dispatched = diff_attention(q.float(), k.float(), v.float(), lam.float(), causal=causal)
    for out in (direct, dispatched):
        torch.testing.assert_close(out.double(), expected, **TOL[torch.float32])


@given(
    rows=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    width=st.integers(1, 70),
    gain=st.booleans(),
    scale=st.sampled_from([1.0, 0.7]),
    transposed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rms_norm_inference_kernel_matches_the_definition(rows, width, gain, scale, transposed, seed):
    """At inference on CPU float32 rms_norm is one C++ call: the definition in float64, for any leading shape and
    for inputs whose rows are contiguous but whose heads are not (the attention output's layout)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*rows, width, generator=gen, dtype=torch.float64) * 3
    if transposed and len(rows) > 1:
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    weight = torch.rand(width, generator=gen, dtype=torch.float64) + 0.5 if gain else None
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * scale
    expected = expected * weight if gain else expected
    assert cpp_kernels() is not None
    with torch.no_grad():
        out = rms_norm(x.float(), None if weight is None else weight.float(), 1e-5, scale)
    assert out.dtype == torch.float32 and out.stride() == x.stride()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@given(d=st.integers(1, 64), seed=st.integers(0, 2**16))
def test_lambda_inference_kernel_matches_the_formula(d, seed):
    """lambda = exp(q1 . k1) - exp(q2 . k2) + lambda_init: the C++ value at inference equals the formula in float64
    and the autograd path's value."""
    gen = torch.Generator().manual_seed(seed)
    q1, k1, q2, k2 = (torch.randn(d, generator=gen, dtype=torch.float64) * 0.4 for _ in range(4))
    expected = float(torch.exp(q1 @ k1) - torch.exp(q2 @ k2) + 0.35)
    vectors = [t.float() for t in (q1, k1, q2, k2)]
    with torch.no_grad():
        fast = lambda_full(*vectors, 0.35)
    assert isinstance(fast, float)
    exact = lambda_full(*vectors, 0.35)
    assert isinstance(exact, torch.Tensor) and exact.dtype == torch.float32
    assert fast == pytest.approx(expected, rel=1e-6, abs=1e-6)
    assert float(exact) == pytest.approx(expected, rel=1e-5, abs=1e-5)


def rotated_by_definition(q, cos, sin, style):
    """Each d-wide half of q (B, h, T, 2d) rotated pair by pair, written out from the RoPE formula (cos and sin
    (B or 1, T, d/2)); shares no code with the library."""
    d = q.shape[-1] // 2
    out = q.clone()
    for b, head, t, j in itertools.product(*map(range, (q.shape[0], q.shape[1], q.shape[2], d // 2))):
        c, s = cos[b % cos.shape[0], t, j], sin[b % sin.shape[0], t, j]
        for offset in (0, d):
            i0, i1 = (
                (offset + j, offset + j + d // 2) if style == "half" else (offset + 2 * j, offset + 2 * j + 1)
            )
            x0, x1 = q[b, head, t, i0], q[b, head, t, i1]
            out[b, head, t, i0], out[b, head, t, i1] = x0 * c - x1 * s, x0 * s + x1 * c
    return out


@given(
    problem=fused_problems(),
    style=st.sampled_from(["interleaved", "half"]),
    shared_tables=st.booleans(),
)
def test_query_rotary_is_the_same_fused_or_applied_before(problem, style, shared_tables):
    """diff_attention(rotary=...) takes q unrotated: the C++ decode step rotates it in the kernel, every other
    kernel gets it rotated first (gradients included); each equals the float64 reference on q rotated by the RoPE
    formula. Tables of batch 1 serve every sequence."""
    batch, heads, kv_heads, d, q_len, kv_len, causal, _, _, seed = problem
    q_len = min(q_len, 16)
    (q, k, v, lam), _ = make_inputs(batch, heads, kv_heads, d, q_len, kv_len, "none", torch.float64, seed)
    gen = torch.Generator().manual_seed(seed + 2)
    angles = torch.rand(1 if shared_tables else batch, q_len, d // 2, generator=gen, dtype=torch.float64) * 6
    cos, sin = angles.cos(), angles.sin()
    ref_q = q.detach().requires_grad_()
    expected, _ = diff_attention_reference(
        rotated_by_definition(ref_q, cos, sin, style), k.detach(), v.detach(), lam.detach(), causal=causal
    )
    with torch.no_grad():
        inputs = [t.float() for t in (q, k, v, lam)]
        assert choose_backend(inputs[0], inputs[1]) == "decode_cpu"
        fused = diff_attention(*inputs, causal=causal, rotary=QueryRotary(cos.float(), sin.float(), style))
    torch.testing.assert_close(fused.double(), expected, **TOL[torch.float32])
    rotary = QueryRotary(cos, sin, style)
    (want,) = grads(expected, [ref_q], seed)
    for backend in ("reference", "decode", "blocked"):
        out = diff_attention(
            q, k.detach(), v.detach(), lam.detach(), causal=causal, backend=backend, rotary=rotary
        )
        torch.testing.assert_close(out, expected, **TOL[torch.float64])
        torch.testing.assert_close(grads(out, [q], seed)[0], want, **TOL[torch.float64])


@pytest.mark.parametrize("style", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotated_queries_stay_heads_merged(style, dtype):
    """The projection's layout survives the rotation on every path (complex product or plain ops)."""
    q = torch.randn(2, 7, 3, 16, dtype=dtype).transpose(1, 2)
    angles = torch.rand(2, 7, 4, dtype=dtype)
    rotated = rotate_queries(q, QueryRotary(angles.cos(), angles.sin(), style))
    assert rotated.shape == q.shape and rotated.transpose(1, 2).is_contiguous()


def test_the_decode_kernel_refuses_rotary_tables_of_the_wrong_shape():
    q, k = torch.randn(2, 2, 3, 8), torch.randn(2, 2, 9, 8)
    good = torch.randn(2, 3, 2)
    with torch.no_grad():
        for cos, sin, wrong in [
            (torch.randn(2, 3, 4), good, "rotary_cos"),
            (good, torch.randn(3, 3, 2), "rotary_sin"),
            (good, good.double(), "rotary_sin"),
        ]:
            with pytest.raises(ValueError, match=f"{wrong} must be a float32 CPU tensor \\(2 or 1, 3, 2\\)"):
                diff_attention(q, k, k, 0.5, rotary=QueryRotary(cos, sin, "half"))


def test_choose_backend_is_the_one_rule():
    """Requested "decode" runs the C++ step only at inference on CPU float32 without a mask; a mask keeps the
    SDPA one; a mask refuses "fused_cpu"; unknown names are refused."""
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 9, 8)
    mask = torch.ones(1, 1, 3, 9, dtype=torch.bool)
    assert choose_backend(q, k, backend="decode") == "decode"  # grad mode on
    with torch.no_grad():
        assert choose_backend(q, k, backend="decode") == "decode_cpu"
        assert choose_backend(q, k, mask, backend="decode") == "decode"
        assert choose_backend(q.double(), k.double(), backend="decode") == "decode"
        assert choose_backend(q, k, backend="sdpa") == "sdpa"
    with pytest.raises(ValueError, match="takes no attn_mask"):
        choose_backend(q, k, mask, backend="fused_cpu")
    with pytest.raises(ValueError, match="backend must be one of"):
        choose_backend(q, k, backend="flash")
    with pytest.raises(ValueError, match="no backward"):
        cpp_kernels().decode(q.requires_grad_(), k, k, 0.5, True, None, None)


def test_fused_cpu_reads_strided_inputs_and_merges_heads_in_memory():
    """q, k, v as the projections give them (heads interleaved in memory), out ready for o_proj as a view."""
    gen = torch.Generator().manual_seed(4)
    batch, heads, q_len, width = 2, 3, 150, 16
    q, k, v = (
        torch.randn(batch, q_len, heads, width, generator=gen).transpose(1, 2).requires_grad_()
        for _ in range(3)
    )
    lam = torch.tensor(0.4, requires_grad=True)
    out = diff_attention_fused_cpu(q, k, v, lam)
    assert out.transpose(1, 2).is_contiguous()
    expected, _ = diff_attention_reference(*(t.detach().double() for t in (q, k, v, lam)))
    torch.testing.assert_close(out.double(), expected, **TOL[torch.float32])
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0 for t in (q, k, v, lam))


def test_fused_cpu_refuses_what_it_cannot_run():
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="float32 CPU tensors; got q torch.float64"):
        diff_attention_fused_cpu(q.double(), q, q, 0.5)
    with pytest.raises(ValueError, match="takes no attn_mask"):
        diff_attention(q, q, q, 0.5, attn_mask=torch.ones(1, 1, 5, 5, dtype=torch.bool), backend="fused_cpu")


def test_bad_block_size_is_refused():
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="block_queries must be a positive integer"):
        diff_attention_blocked(q, q, q, 0.5, block_queries=0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape",
    [
        (2, 4, 2, 8, 40, 40, True, "none"),
        (1, 2, 1, 16, 7, 50, True, "bool"),
        (2, 2, 2, 4, 30, 30, False, "bool"),
    ],
)
def test_flex_matches_reference_forward(shape):
    """FlexAttention, forward only, as on the CPU it has no backward; among the shapes a causal 40-token one, which
    torch 2.13's compiled CPU kernel got wrong."""
    batch, heads, kv_heads, d, q_len, kv_len, causal, mask_kind = shape
    (q, k, v, lam), mask = make_inputs(batch, heads, kv_heads, d, q_len, kv_len, mask_kind, torch.float64, 11)
    expected, _ = diff_attention_reference(q, k, v, lam, causal=causal, attn_mask=mask)
    with torch.no_grad():
        out = diff_attention(
            *(t.float() for t in (q, k, v, lam)), causal=causal, attn_mask=mask, backend="flex"
        )
    torch.testing.assert_close(out.double(), expected, **TOL[torch.float32])


def test_flex_refuses_training_on_the_cpu():
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    with pytest.raises(ValueError, match="no backward on the CPU"):
        diff_attention(q, q, q, 0.5, backend="flex")
