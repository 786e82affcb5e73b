"""Scaled dot-product attention written by hand, and the masks it needs.

Masks are boolean, `True` where a query may attend to a key, shaped (batch, 1, q_len, kv_len) so they
broadcast over heads. Boolean masks follow any dtype and device, and torch's fused kernel takes them as is.
"""

import math
from collections.abc import Callable

import torch


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scaling: float | None = None,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q Kᵀ · scaling + mask) V, the paper's equation (1), on tensors of equal head counts.

    Args:
        query: (batch, heads, q_len, head_dim).
        key, value: (batch, heads, kv_len, head_dim).
        attention_mask: boolean (batch | 1, 1 | heads, q_len, kv_len), True = may attend; or an additive
            float mask of that shape (0 = attend, large negative = blocked).
        is_causal: with no mask, hide future keys (the last query sees the last key).
        scaling: multiplier of the scores, 1/sqrt(head_dim) by default.
        dropout: dropout probability on the attention weights (pass 0.0 at inference).

    Returns:
        output (batch, heads, q_len, head_dim) and weights (batch, heads, q_len, kv_len).
        A query row with no visible key gets zero weights and a zero output (as torch's fused kernel).
    """
    out, weights = eager_attention_forward(None, query, key, value, attention_mask, scaling, dropout,
                                           is_causal=is_causal)
    return out.transpose(1, 2), weights  # (batch, heads, q_len, head_dim)


def repeat_kv(states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Repeat each key/value head `n_rep` times for grouped-query attention.

    (batch, kv_heads, seq, head_dim) -> (batch, kv_heads * n_rep, seq, head_dim)
    """
    if n_rep == 1:
        return states
    batch, kv_heads, seq, head_dim = states.shape
    states = states[:, :, None].expand(batch, kv_heads, n_rep, seq, head_dim)  # a view: no copy yet
    return states.reshape(batch, kv_heads * n_rep, seq, head_dim)  # (batch, heads, seq, head_dim)


def eager_attention_forward(
    module: torch.nn.Module | None,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `eager` entry of transformers' attention interface: softmax(Q Kᵀ · scaling + mask) V, by hand.

    Takes (batch, heads, seq, head_dim) queries and (batch, kv_heads, seq, head_dim) keys and values, like every
    attention function of the interface, and returns the output as (batch, q_len, heads, head_dim) plus the
    weights (batch, heads, q_len, kv_len). Without a mask, `is_causal` (default: the module's, for more than
    one query) hides future keys. A query row with no visible key gets zero weights and a zero output.
    """
    n_rep = query.size(1) // key.size(1)
    key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)  # (batch, heads, kv_len, head_dim)
    if is_causal is None:
        is_causal = getattr(module, "is_causal", False) and query.size(-2) > 1
    scaling = 1.0 / math.sqrt(query.size(-1)) if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-2, -1)) * scaling  # (batch, heads, q_len, kv_len)
    if attention_mask is None and is_causal:
        attention_mask = causal_mask(query.size(-2), key.size(-2), device=query.device)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, float("-inf"))
    elif attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    if attention_mask is not None:
        weights = weights.nan_to_num(0.0)  # fully masked rows: softmax of all -inf is NaN, make it 0
    if dropout > 0.0:
        weights = torch.nn.functional.dropout(weights, p=dropout)
    out = torch.matmul(weights, value)  # (batch, heads, q_len, head_dim)
    return out.transpose(1, 2).contiguous(), weights  # (batch, q_len, heads, head_dim)


def in_float32(attention: Callable) -> Callable:
    """`attention` (an attention-interface function) run in float32 with CPU autocast off inside."""
    def attend(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               *args, **kwargs) -> tuple:
        with torch.autocast("cpu", enabled=False):
            return attention(module, query.float(), key.float(), value.float(), *args, **kwargs)
    return attend


def float32_under_cpu_autocast(attention: Callable, query: torch.Tensor) -> Callable:
    """The attention function to call for `query`: `attention` itself, or under a CPU autocast, `in_float32(attention)`.

    CPU autocast would run torch's fused attention in bf16, whose backward on a CPU is several times slower
    than float32's, while the linear maps around it gain from bf16. The output is then float32 (the next linear
    map casts it back). Outside a CPU autocast the function is returned unchanged: no extra call.
    """
    if query.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return attention
    return in_float32(attention)


def causal_mask(
    q_len: int, kv_len: int, device: torch.device | None = None, past_len: int | None = None
) -> torch.Tensor:
    """Lower-triangular mask: query i sits at absolute position past_len + i and sees keys up to it.

    `past_len` defaults to kv_len - q_len (the queries are the last positions). A static cache has more key
    slots than positions filled; those lie in the future of every query and stay hidden.
    Returns a boolean (1, 1, q_len, kv_len) tensor.
    """
    past_len = kv_len - q_len if past_len is None else past_len
    rows = torch.arange(q_len, device=device)[:, None] + past_len  # (q_len, 1)
    cols = torch.arange(kv_len, device=device)[None, :]  # (1, kv_len)
    return (cols <= rows)[None, None]  # (1, 1, q_len, kv_len)


def self_attention_mask(
    attention_mask: torch.Tensor | None,
    q_len: int,
    past_len: int,
    kv_len: int,
    causal: bool,
    has_padding: bool | None = None,
    device: torch.device | None = None,
) -> torch.Tensor | None:
    """The mask of a self-attention layer, or None where the fused kernel's own `is_causal` is exact.

    Args:
        attention_mask: (batch, past_len + q_len) 0/1 padding mask, a ready 4D mask (returned as is), or None.
        q_len: number of new query positions.
        past_len: positions already in the cache; an int, or a 0-d tensor (a static cache under torch.compile).
        kv_len: length of the keys the layer will see (past_len + q_len, or a static cache's size).
        causal: decoder (True) or encoder (False) attention.
        has_padding: whether the 2D mask holds a 0, if the caller knows; None = look (no look under compile,
            where a 2D mask is always applied, to keep host syncs out of the graph).
        device: where the hidden states are, for a mask built without a 2D mask (CPU if None).

    Returns:
        boolean (batch | 1, 1, q_len, kv_len) or None. Every query may see its own position, so a padded
        query never has an empty row.
    """
    if attention_mask is not None and attention_mask.dim() == 4:
        return attention_mask
    if attention_mask is None:
        has_padding = False
    elif has_padding is None:
        has_padding = torch.compiler.is_compiling() or not bool(attention_mask.all())
    plain = not isinstance(past_len, torch.Tensor) and kv_len == past_len + q_len and (q_len == 1 or past_len == 0)
    if not has_padding and (not causal or plain):
        return None
    if plain and q_len == 1:  # one decoded token sees every cached key that is not padding, and itself
        keys = attention_mask[:, :kv_len] != 0  # (batch, kv_len), a new tensor
        keys[:, -1] = True
        return keys[:, None, None, :]  # (batch, 1, 1, kv_len)
    device = attention_mask.device if attention_mask is not None else device
    if causal:
        mask = causal_mask(q_len, kv_len, device, past_len)
    else:
        mask = torch.ones(1, 1, q_len, kv_len, dtype=torch.bool, device=device)
    if has_padding:
        keys = attention_mask[:, :kv_len].bool()
        if keys.size(1) < kv_len:  # static cache: pad the 2D mask to the cache size
            keys = torch.nn.functional.pad(keys, (0, kv_len - keys.size(1)), value=False)
        # the diagonal: each query at its own position
        own = causal_mask(q_len, kv_len, device, past_len) & ~causal_mask(q_len, kv_len, device, past_len - 1)
        mask = (mask & keys[:, None, None, :]) | own  # (batch, 1, q_len, kv_len)
    return mask


def padding_mask(attention_mask: torch.Tensor, q_len: int) -> torch.Tensor:
    """Turn a (batch, kv_len) 0/1 padding mask into a boolean (batch, 1, q_len, kv_len) mask."""
    return attention_mask.bool()[:, None, None, :].expand(-1, 1, q_len, -1)  # (batch, 1, q_len, kv_len)


def cross_attention_mask(
    encoder_attention_mask: torch.Tensor | None, q_len: int, has_padding: bool | None = None
) -> torch.Tensor | None:
    """Mask of decoder queries over encoder keys: (batch, 1, q_len, src_len), or None without padding.

    `has_padding`: whether the source mask holds a 0, if the caller knows (None = look, one host sync).
    """
    if encoder_attention_mask is None or has_padding is False:
        return None
    if has_padding is None and not torch.compiler.is_compiling() and bool(encoder_attention_mask.all()):
        return None
    return padding_mask(encoder_attention_mask, q_len)


__all__ = [
    "scaled_dot_product_attention",
    "float32_under_cpu_autocast",
    "eager_attention_forward",
    "repeat_kv",
    "causal_mask",
    "padding_mask",
    "self_attention_mask",
    "cross_attention_mask",
]
