"""Building blocks: rotary pairings, RMSNorm, and the attention modules used on their own."""

from __future__ import annotations

import math

import pytest
import torch

from difftransformer import DiffTransformerConfig
from difftransformer.layers import (
    RMSNorm,
    RotaryEmbedding,
    SplitHeadAttention,
    WholeHeadAttention,
    apply_rotary,
    interleaved_to_half_permutation,
)


def layer_config(**fields) -> DiffTransformerConfig:
    """A configuration for one attention module used on its own (d_model 64)."""
    return DiffTransformerConfig(hidden_size=64, vocab_size=97, num_hidden_layers=4, **fields)


@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_rotary_is_a_rotation_that_depends_on_relative_position_only(style):
    d, t = 16, 12
    cos, sin = RotaryEmbedding(dim=d)(torch.zeros((), dtype=torch.float64), torch.arange(t)[None])
    q, k = torch.randn(1, t, d, dtype=torch.float64), torch.randn(1, t, d, dtype=torch.float64)
    torch.testing.assert_close(apply_rotary(q, cos, sin, style).norm(dim=-1), q.norm(dim=-1))
    # same q and k at positions (3, 1) and (9, 7): the logits agree
    same = torch.randn(2, d, dtype=torch.float64)
    q2 = q.clone()
    k2 = k.clone()
    q2[0, 3], k2[0, 1], q2[0, 9], k2[0, 7] = same[0], same[1], same[0], same[1]
    rq2, rk2 = apply_rotary(q2, cos, sin, style), apply_rotary(k2, cos, sin, style)
    torch.testing.assert_close(rq2[0, 3] @ rk2[0, 1], rq2[0, 9] @ rk2[0, 7])


def test_rotary_styles_differ_by_a_fixed_permutation():
    d = 8
    cos, sin = RotaryEmbedding(dim=d, rope_parameters={"rope_theta": 500.0})(
        torch.zeros((), dtype=torch.float64), torch.arange(5)[None]
    )
    x = torch.randn(1, 5, d, dtype=torch.float64)
    perm = interleaved_to_half_permutation(d)
    interleaved = apply_rotary(x, cos, sin, "interleaved")
    half = apply_rotary(x[..., perm], cos, sin, "half")
    torch.testing.assert_close(half, interleaved[..., perm])
    angle = 4 * 500.0 ** (-2 * 1 / d)  # position 4, pair 1 = dims (2, 3)
    expected = x[0, 4, 2] * math.cos(angle) - x[0, 4, 3] * math.sin(angle)
    assert interleaved[0, 4, 2].item() == pytest.approx(expected.item(), abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "odd offset"])
def test_interleaved_rotary_fast_path_matches_the_pairwise_formula(dtype, layout):
    """fp32/fp64 interleaved rotary runs as one complex product where the memory allows (else the pairwise
    ops): both must give the textbook rotation, forward and backward, whatever the input's layout."""
    d, t = 8, 6
    cos, sin = RotaryEmbedding(dim=d)(torch.zeros((), dtype=dtype), torch.arange(3, 3 + t)[None])
    cos, sin = cos[:, :, None], sin[:, :, None]  # (1, T, 1, d/2)
    base = torch.randn(1, t, 3, d + 1, dtype=dtype)
    x = {
        "contiguous": base[..., :d].contiguous(),
        "transposed": base[..., :d].contiguous().transpose(1, 2).contiguous().transpose(1, 2),
        "odd offset": base[..., 1:],  # odd storage offset: cannot be viewed as complex
    }[layout].requires_grad_()
    grad = torch.randn(1, t, 3, d, dtype=dtype)
    out = apply_rotary(x, cos, sin, "interleaved")
    (dx,) = torch.autograd.grad(out, x, grad)
    x0, x1 = x.detach()[..., 0::2], x.detach()[..., 1::2]
    expected = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    g0, g1 = grad[..., 0::2], grad[..., 1::2]  # the transpose rotation takes the gradient back
    expected_dx = torch.stack((g0 * cos + g1 * sin, -g0 * sin + g1 * cos), dim=-1).flatten(-2)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(dx, expected_dx)


def test_rotary_rejects_odd_width():
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(dim=7)


def test_rms_norm_matches_its_definition():
    x = torch.randn(3, 10, dtype=torch.float64) * 4
    norm = RMSNorm(10, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 10))
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * torch.linspace(0.5, 1.5, 10)
    torch.testing.assert_close(norm(x), expected)
    assert RMSNorm(10, elementwise_affine=False).weight is None


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("scale", [1.0, 0.7])
def test_rms_norm_backward_matches_autograd_of_the_definition(affine, scale):
    """The norm's own backward (it keeps x and 1/rms, not the normalised copy) against autograd through the
    formula, in float64; then gradcheck, and what it keeps for the backward."""
    torch.manual_seed(2)
    norm = RMSNorm(12, eps=1e-5, elementwise_affine=affine).double()
    if affine:
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
    x = (torch.randn(2, 5, 12, dtype=torch.float64) * 3).requires_grad_()
    params = [x] + ([norm.weight] if affine else [])
    gain = (norm.weight if affine else torch.ones(12, dtype=torch.float64)) * scale
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gain
    grad = torch.randn_like(expected)
    saved: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = norm(x, scale)
    torch.testing.assert_close(out, expected)
    for got, want in zip(torch.autograd.grad(out, params, grad), torch.autograd.grad(expected, params, grad)):
        torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(lambda *p: norm(p[0], scale), tuple(params))
    assert saved.count(x.numel()) == 1  # x itself, and no normalised copy beside it


def test_rms_norm_in_bfloat16_normalises_in_float32_then_casts():
    x = torch.randn(4, 16, dtype=torch.bfloat16, requires_grad=True)
    norm = RMSNorm(16).to(torch.bfloat16)
    expected = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).bfloat16()
    out = norm(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected)
    out.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.bfloat16 and norm.weight.grad.dtype == torch.bfloat16


def test_diff_attention_module_standalone_with_padding_mask():
    torch.manual_seed(0)
    attn = SplitHeadAttention(
        layer_config(num_attention_heads=2, num_key_value_heads=1, subln="plain"), 3
    ).double()
    assert attn.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * 3))  # the schedule at layer 3
    x = torch.randn(2, 6, 64, dtype=torch.float64)
    cos, sin = RotaryEmbedding(dim=attn.map_head_dim)(x, torch.arange(6)[None].expand(2, -1))
    causal = torch.ones(6, 6, dtype=torch.bool).tril()[None, None].expand(2, 1, 6, 6).clone()
    causal[1, ..., :2] = False  # the second sequence's first two tokens are padding
    out_masked, maps = attn(x, (cos, sin), attention_mask=causal, output_component_maps=True)
    combined, map1, map2 = maps
    assert torch.all(map1[1, :, 2:, :2] == 0) and torch.all(map2[1, :, 2:, :2] == 0)
    torch.testing.assert_close(combined, map1 - attn.lambda_full() * map2)
    out_fast, none = attn(x, (cos, sin), attention_mask=causal)
    assert none is None
    torch.testing.assert_close(out_fast[:, 2:], out_masked[:, 2:])


def test_diff_v2_component_maps_combine_with_a_per_token_sigmoid_lambda():
    torch.manual_seed(1)
    attn = WholeHeadAttention(
        layer_config(attention="diff_v2", num_attention_heads=4, num_key_value_heads=2), 0
    ).double()
    x = torch.randn(2, 5, 64, dtype=torch.float64)
    cos, sin = RotaryEmbedding(dim=attn.head_dim)(x, torch.arange(5)[None].expand(2, -1))
    out, (combined, first, second) = attn(x, (cos, sin), output_component_maps=True)
    gate = torch.sigmoid(attn.lambda_proj(x)).transpose(1, 2).unsqueeze(-1)
    torch.testing.assert_close(combined, first - gate * second)
    torch.testing.assert_close(first.sum(-1), torch.ones(2, 4, 5, dtype=torch.float64))
    fast, _ = attn(x, (cos, sin))
    torch.testing.assert_close(fast, out)


def test_inference_lambda_follows_the_weights():
    """Without grad the layer computes lambda in the C++ kernel at every call: an in-place update, even one through
    .data (which bumps no version), is used at once, as on the autograd path."""
    torch.manual_seed(1)
    attn = SplitHeadAttention(layer_config(num_attention_heads=2, num_key_value_heads=2), 1).eval()
    x = torch.randn(1, 5, 64)
    cos, sin = RotaryEmbedding(dim=attn.map_head_dim)(x, torch.arange(5)[None])

    def run() -> torch.Tensor:
        with torch.no_grad():
            return attn(x, (cos, sin))[0]

    before = run()
    with torch.no_grad():
        attn.lambda_vectors.q1.add_(0.5)
    after_update = run()
    assert not torch.allclose(before, after_update)
    torch.testing.assert_close(after_update, attn(x, (cos, sin))[0].detach())
    attn.lambda_vectors.k1.data.mul_(-1.0)
    torch.testing.assert_close(run(), attn(x, (cos, sin))[0].detach())


@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_rotary_keeps_the_input_dtype_with_wider_tables(style):
    x = torch.randn(2, 5, 3, 8, dtype=torch.bfloat16)
    cos, sin = RotaryEmbedding(dim=8)(torch.zeros(()), torch.arange(5)[None])  # float32 tables
    out = apply_rotary(x, cos[:, :, None], sin[:, :, None], style)
    assert out.dtype == torch.bfloat16
    wide = apply_rotary(x.float(), cos[:, :, None], sin[:, :, None], style)
    torch.testing.assert_close(out, wide.bfloat16())


@pytest.mark.parametrize("queries", [1, 5])
def test_hooks_on_the_norm_and_lambda_modules_see_every_call(queries):
    """The layer calls its per-head norm and its lambda module as modules (accelerate's offload loads their weights
    in hooks; PEFT wraps the lambda vectors): forward hooks on both see the decode step and the prefill."""
    torch.manual_seed(2)
    attn = SplitHeadAttention(layer_config(num_attention_heads=2, num_key_value_heads=2), 2).eval()
    with torch.no_grad():
        attn.subln.weight.uniform_(0.5, 1.5)
    x = torch.randn(1, queries, 64)
    cos, sin = RotaryEmbedding(dim=attn.map_head_dim)(x, torch.arange(queries)[None])
    expected_lambda = float(attn.lambda_full())
    calls = []
    attn.subln.register_forward_hook(lambda module, args, out: calls.append(("norm", tuple(out.shape))))
    attn.lambda_vectors.register_forward_hook(lambda module, args, out: calls.append(("lambda", float(out))))
    with torch.no_grad():
        attn(x, (cos, sin))
    assert calls == [("lambda", pytest.approx(expected_lambda, rel=1e-5)), ("norm", (1, queries, 2, 32))]
