"""The hand-written attention and its masks, checked against torch's fused kernel."""

import pytest
import torch
import torch.nn.functional as F

from hf_minitx.models.attention_minitx import (
    causal_mask,
    cross_attention_mask,
    repeat_kv,
    scaled_dot_product_attention,
    self_attention_mask,
)


def _qkv(batch=2, heads=3, q_len=5, kv_len=5, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, q_len, dim, generator=g), torch.randn(batch, heads, kv_len, dim, generator=g),
            torch.randn(batch, heads, kv_len, dim, generator=g))


def test_unmasked_matches_torch():
    q, k, v = _qkv(q_len=4, kv_len=7)
    out, weights = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 4))


def test_causal_matches_torch_and_hides_the_future():
    q, k, v = _qkv(q_len=6, kv_len=6)
    out, weights = scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6, rtol=1e-5)
    assert torch.all(weights.triu(diagonal=1) == 0)


def test_boolean_and_additive_masks_match_torch():
    q, k, v = _qkv(q_len=3, kv_len=6)
    mask = torch.rand(2, 1, 3, 6, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[..., 0] = True  # every row sees something
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask)[0], expected, atol=1e-6, rtol=1e-5)
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, additive)[0], expected, atol=1e-6, rtol=1e-5)


def test_fully_masked_row_gives_zeros_not_nan():
    q, k, v = _qkv(batch=1, heads=1, q_len=2, kv_len=3)
    mask = torch.tensor([[[[False, False, False], [True, True, False]]]])
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert not torch.isnan(out).any()
    assert torch.all(out[0, 0, 0] == 0) and torch.all(weights[0, 0, 0] == 0)


def test_scaling_is_one_over_sqrt_head_dim():
    q, k, v = _qkv(dim=16)
    out, _ = scaled_dot_product_attention(q, k, v, scaling=0.5)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.5), atol=1e-6, rtol=1e-5)
    assert not torch.allclose(out, scaled_dot_product_attention(q, k, v)[0])


def test_repeat_kv_matches_repeat_interleave():
    kv = torch.randn(2, 2, 5, 4)
    assert torch.equal(repeat_kv(kv, 3), kv.repeat_interleave(3, dim=1))
    assert repeat_kv(kv, 1) is kv


def test_causal_mask_with_cache_offset_is_bottom_right_aligned():
    mask = causal_mask(2, 5)[0, 0]
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    # a static cache with 7 slots, 3 filled, 2 new queries: slots 5 and 6 are in the future
    static = causal_mask(2, 7, past_len=3)[0, 0]
    assert static.tolist() == [[True] * 4 + [False] * 3, [True] * 5 + [False] * 2]


def test_self_attention_mask_is_none_when_the_fused_kernel_is_exact():
    assert self_attention_mask(None, 5, 0, 5, causal=True) is None
    assert self_attention_mask(torch.ones(2, 5), 5, 0, 5, causal=True) is None
    assert self_attention_mask(torch.ones(2, 8), 1, 7, 8, causal=True) is None  # one new token, no padding
    assert self_attention_mask(None, 4, 0, 4, causal=False) is None
    # several new tokens after a cache: torch's is_causal would align top-left, so a mask is needed
    assert self_attention_mask(None, 3, 4, 7, causal=True) is not None


def test_a_mask_built_without_a_2d_mask_is_made_where_the_hidden_states_are():
    # several new tokens over a cache, no attention_mask (assisted decoding, a static cache): on CUDA a mask
    # left on the CPU fails in the attention kernel. The meta device stands in for an accelerator here.
    meta = torch.device("meta")
    assert self_attention_mask(None, 3, 4, 7, causal=True, device=meta).device == meta
    assert self_attention_mask(None, 1, 4, 9, causal=True, device=meta).device == meta  # a static cache
    assert self_attention_mask(torch.ones(1, 7, device=meta), 3, 4, 7, causal=True, has_padding=True,
                               device=torch.device("cpu")).device == meta  # a 2D mask decides


def test_self_attention_mask_with_left_padding():
    attention_mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    mask = self_attention_mask(attention_mask, 4, 0, 4, causal=True)
    assert mask.shape == (2, 1, 4, 4)
    row0 = mask[0, 0]
    # real tokens (positions 2, 3) see only real tokens at or before them
    assert row0[2].tolist() == [False, False, True, False]
    assert row0[3].tolist() == [False, False, True, True]
    # padded queries see only themselves, so no row is empty
    assert row0[0].tolist() == [True, False, False, False]
    assert torch.equal(mask[1, 0], torch.ones(4, 4, dtype=torch.bool).tril())


def test_cross_attention_mask_shape_and_padding():
    assert cross_attention_mask(torch.ones(2, 6), 3) is None
    mask = cross_attention_mask(torch.tensor([[1, 1, 0], [1, 1, 1]]), 4)
    assert mask.shape == (2, 1, 4, 3)
    assert mask[0, 0, :, 2].tolist() == [False] * 4 and mask[1].all()


@pytest.mark.parametrize("q_len,past", [(1, 4), (3, 2)])
def test_padded_cache_step_matches_full_recompute(q_len, past):
    """Attention of new queries after a cache equals the same rows of a full causal pass."""
    total = past + q_len
    q, k, v = _qkv(q_len=total, kv_len=total)
    attention_mask = torch.tensor([[0] + [1] * (total - 1), [1] * total])
    full_mask = self_attention_mask(attention_mask, total, 0, total, causal=True)
    full, _ = scaled_dot_product_attention(q, k, v, full_mask)
    step_mask = self_attention_mask(attention_mask, q_len, past, total, causal=True)
    step, _ = scaled_dot_product_attention(q[:, :, past:], k, v, step_mask)
    torch.testing.assert_close(step, full[:, :, past:], atol=1e-6, rtol=1e-5)
