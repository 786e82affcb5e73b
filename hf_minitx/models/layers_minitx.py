"""Building blocks: norms, the scaled token embedding, multi-head attention, the position-wise feed-forward
network, encoder and decoder layers.

This file is the architecture only: each linear map is called as the module it is (`self.fc1(x)`). For the
length of a `generate()` call, `decoding_minitx.py` may swap in forwards that read the same weights in the
layout decoding reads fastest; nothing here knows about it.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .attention_minitx import eager_attention_forward, float32_under_cpu_autocast
from .configuration_minitx import MiniTxConfig
from .positions_minitx import apply_rotary


def rms_normalize(states: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalised states, 1 / rms) of ``states`` (..., size), in float32 or wider: x / sqrt(mean(x²) + eps), and
    the (..., 1) factor."""
    states = states.to(torch.promote_types(states.dtype, torch.float32))
    inverse_rms = torch.rsqrt(states.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1)
    return states * inverse_rms, inverse_rms


class RMSNormFunction(torch.autograd.Function):
    """RMSNorm with its gradient written out, so that backward is 5 tensor operations instead of autograd's
    chain through pow, mean, rsqrt and two products (faster on a CPU; docs/performance.md).

    With n = x / rms and g the gradient of y = n * w: dx = (g w - n mean(g w n)) / rms, dw = sum of g n over
    every position. Computed in float32 (float64 stays float64); x's and w's dtypes are kept. torch.func's
    grad and vmap work through it; the backward is differentiable once (a second derivative, as for a
    gradient penalty, raises instead of being wrong) and forward-mode AD is not provided: for those, compute
    RMSNorm with the plain formula (``rms_normalize``).
    """

    generate_vmap_rule = True  # torch.func.vmap / grad work through setup_context

    @staticmethod
    def forward(hidden_states: torch.Tensor, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(output, normalised states, 1 / rms): the last two are for backward only (not differentiable)."""
        normalised, inverse_rms = rms_normalize(hidden_states, eps)
        return (normalised * weight.to(normalised.dtype)).to(hidden_states.dtype), normalised, inverse_rms

    @staticmethod
    def setup_context(ctx, inputs: tuple, outputs: tuple) -> None:
        _, normalised, inverse_rms = outputs
        ctx.mark_non_differentiable(normalised, inverse_rms)
        ctx.save_for_backward(normalised, inverse_rms, inputs[1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: torch.Tensor, *_) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        normalised, inverse_rms, weight = ctx.saved_tensors
        grad = grad_output.to(normalised.dtype)
        grad_normalised = grad * weight.to(normalised.dtype)
        grad_input = grad_weight = None
        if ctx.needs_input_grad[0]:
            projection = (grad_normalised * normalised).mean(-1, keepdim=True)  # (..., 1)
            grad_input = ((grad_normalised - normalised * projection) * inverse_rms).to(grad_output.dtype)
        if ctx.needs_input_grad[1]:
            # (..., size) -> (rows, size), summed over every row into the (size,) weight's gradient
            grad_weight = (grad * normalised).reshape(-1, normalised.size(-1)).sum(0).to(weight.dtype)
        return grad_input, grad_weight, None


class MiniTxRMSNorm(nn.Module):
    """Root-mean-square norm: x / sqrt(mean(x²) + eps) * weight, over the last dimension.

    Unlike LayerNorm it subtracts no mean and adds no bias: one reduction instead of two, and one vector of
    parameters. Computed in float32 and returned in the input's dtype; with gradients, through
    ``RMSNormFunction``'s written-out backward.
    """

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(..., size) -> (..., size) with unit root mean square, times `weight`."""
        if torch.is_grad_enabled() and (hidden_states.requires_grad or self.weight.requires_grad):
            return RMSNormFunction.apply(hidden_states, self.weight, self.eps)[0]
        return RMSNormFunction.forward(hidden_states, self.weight, self.eps)[0]  # the same formula, no autograd


# The one seam of norms: config.norm_type -> (size, eps) -> module.
NORMS: dict[str, Callable[[int, float], nn.Module]] = {
    "layernorm": lambda size, eps: nn.LayerNorm(size, eps=eps),
    "rmsnorm": MiniTxRMSNorm,
}


def make_norm(config: MiniTxConfig, size: int | None = None) -> nn.Module:
    """The config's norm over `size` features (default hidden_size)."""
    return NORMS[config.norm_type](size or config.hidden_size, config.layer_norm_eps)


class MiniTxScaledEmbedding(nn.Embedding):
    """The token embedding, times sqrt(hidden_size) with `config.scale_embeddings` (the paper's scale), else 1.

    The scale lives in the module, not in the stack that calls it, so `get_input_embeddings()(ids)` gives the
    embeddings the model itself reads (as `inputs_embeds=`), and `resize_token_embeddings` keeps it.
    """

    def __init__(self, config: MiniTxConfig):
        super().__init__(config.vocab_size, config.hidden_size)
        self.embed_scale = math.sqrt(config.hidden_size) if config.scale_embeddings else 1.0

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(batch, seq) token ids -> (batch, seq, hidden) scaled embeddings."""
        embeddings = super().forward(input_ids)
        return embeddings * self.embed_scale if self.embed_scale != 1.0 else embeddings


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """relu(x)², the ReLU² activation: zero for x <= 0, x² above."""
    return nn.functional.relu(x).square()


class Activation(NamedTuple):
    """A feed-forward activation; a gated one multiplies act(gate_proj(x)) with fc1(x)."""

    fn: Callable[[torch.Tensor], torch.Tensor]
    gated: bool = False


# The one seam of feed-forward activations: config.hidden_act -> Activation.
ACTIVATIONS: dict[str, Activation] = {
    "gelu": Activation(nn.functional.gelu),
    "relu": Activation(nn.functional.relu),
    "relu2": Activation(relu_squared),
    "swiglu": Activation(nn.functional.silu, gated=True),
}


class MiniTxAttention(nn.Module):
    """Multi-head (or grouped-query) attention: self-attention, causal or not, or cross-attention.

    The projections are named like Hugging Face's (`q_proj`, `k_proj`, `v_proj`, `o_proj`) so PEFT and device
    maps find them. The attention itself comes from transformers' interface: `eager` is ours
    (`attention_minitx.eager_attention_forward`), `sdpa` is torch's fused kernel. The paper's steps, in order:
    project to queries, keys and values, split the heads, add positions (rotary), attend, merge the heads and
    project the output.
    """

    def __init__(self, config: MiniTxConfig, layer_idx: int, is_causal: bool = False, is_cross_attention: bool = False):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = is_causal
        self.is_cross_attention = is_cross_attention
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=bias)
        self.o_proj.residual_output = True  # writes into the residual stream (see config.zero_init_projections)
        # QK-norm: per-head norms of queries and keys (None when off: no parameters, no saved keys, no call)
        self.q_norm = make_norm(config, self.head_dim) if config.qk_norm else None
        self.k_norm = make_norm(config, self.head_dim) if config.qk_norm else None
        # the optional pieces (config.EXTRA_PIECES); None when off
        self.head_gate = (nn.Linear(config.hidden_size, config.num_attention_heads, bias=bias)
                          if config.attention_gate else None)
        self.value_embed_proj = (nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=False)
                                 if config.value_embeddings and not is_cross_attention else None)

    def _split_heads(self, projected: torch.Tensor, norm: nn.Module | None = None) -> torch.Tensor:
        """(batch, seq, heads * head_dim) projections -> (batch, heads, seq, head_dim); `norm` (QK-norm) acts on
        each head."""
        batch, seq, _ = projected.shape
        heads = projected.view(batch, seq, -1, self.head_dim)  # (batch, seq, heads, head_dim)
        if norm is not None:
            heads = norm(heads)
        return heads.transpose(1, 2)  # (batch, heads, seq, head_dim)

    def _heads(self, projection: nn.Linear, states: torch.Tensor, norm: nn.Module | None = None) -> torch.Tensor:
        """Project (batch, seq, hidden) states and split the heads: (batch, heads, seq, head_dim)."""
        return self._split_heads(projection(states), norm)

    def query_key_value(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(batch, seq, hidden) -> the query, key and value projections, each (batch, seq, heads * head_dim).

        A method of its own so that `generate()` can read the three weights as one for the length of a call
        (`decoding_minitx.set_decode_layout`); the three maps are the same either way.
        """
        return self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        key_value_states: torch.Tensor | None = None,
        cache: Cache | None = None,
        token_embeddings: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from `hidden_states` (batch, q_len, hidden) to itself or to `key_value_states` (batch, src, hidden).

        `token_embeddings` (batch, q_len, hidden): the normalised token embeddings of the new positions, which
        `config.value_embeddings` adds to the values through `value_embed_proj`.
        Returns the output (batch, q_len, hidden) and the attention weights (eager only, else None).
        """
        batch, q_len, _ = hidden_states.shape
        if self.is_cross_attention:
            query = self._heads(self.q_proj, hidden_states, self.q_norm)  # (batch, heads, q_len, head_dim)
            key, value = self._cross_key_value(key_value_states, cache)
        else:
            query, key, value = self.query_key_value(hidden_states)  # each (batch, q_len, heads * head_dim)
            if self.value_embed_proj is not None:
                value = value + self.value_embed_proj(token_embeddings)  # (batch, q_len, kv_heads * head_dim)
            query, key = self._split_heads(query, self.q_norm), self._split_heads(key, self.k_norm)
            value = self._split_heads(value)  # query (batch, heads, q_len, head_dim), key and value with kv_heads
            if position_embeddings is not None:
                cos, sin = position_embeddings
                query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
            if cache is not None:
                self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
                key, value = self_cache.update(key, value, self.layer_idx)  # (batch, kv_heads, kv_len, head_dim)

        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        attention = float32_under_cpu_autocast(attention, query)  # bf16 attention backward is slow on a CPU
        output, weights = attention(
            self, query, key, value, attention_mask,
            scaling=self.scaling, dropout=self.config.attention_dropout if self.training else 0.0,
        )
        if self.head_gate is not None:  # one gate per head and position, from the layer's input
            output = output * torch.sigmoid(self.head_gate(hidden_states))[..., None]  # (batch, q_len, heads, head_dim)
        output = output.reshape(batch, q_len, -1)  # (batch, q_len, heads * head_dim)
        return self.o_proj(output), weights

    def _cross_key_value(
        self, encoder_states: torch.Tensor, cache: Cache | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values of the encoder output, computed once per generation and then read from the cache."""
        if not isinstance(cache, EncoderDecoderCache):
            return self._heads(self.k_proj, encoder_states, self.k_norm), self._heads(self.v_proj, encoder_states)
        cross_cache = cache.cross_attention_cache
        if cache.is_updated.get(self.layer_idx):
            layer = cross_cache.layers[self.layer_idx]
            return layer.keys, layer.values
        key = self._heads(self.k_proj, encoder_states, self.k_norm)  # (batch, kv_heads, src_len, head_dim)
        value = self._heads(self.v_proj, encoder_states)
        key, value = cross_cache.update(key, value, self.layer_idx)
        cache.is_updated[self.layer_idx] = True
        return key, value


class MiniTxMLP(nn.Module):
    """The position-wise feed-forward network, applied to every position alike.

    fc2(act(fc1(x))); a gated activation (swiglu) adds `gate_proj`: fc2(act(gate_proj(x)) * fc1(x)).
    """

    def __init__(self, config: MiniTxConfig):
        super().__init__()
        activation = ACTIVATIONS[config.hidden_act]
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.attention_bias)
        if activation.gated:
            self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.attention_bias)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.attention_bias)
        self.fc2.residual_output = True  # writes into the residual stream (see config.zero_init_projections)
        self.act = activation.fn
        self.gated = activation.gated

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(batch, seq, hidden) -> (batch, seq, hidden)."""
        if self.gated:
            inner = self.act(self.gate_proj(hidden_states)) * self.fc1(hidden_states)
        else:
            inner = self.act(self.fc1(hidden_states))  # (batch, seq, intermediate)
        return self.fc2(inner)


class MiniTxUNetSkips(nn.Module):
    """`config.unet_skips`: layer i of the first half hands its output, times a learned weight, to the input of its
    mirror n - 1 - i in the second half, so the last layers read the first layers' states directly."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.num_layers = num_layers
        self.weight = nn.Parameter(torch.ones(num_layers // 2))  # one per skip, the first layer's first

    def add_skip(self, layer_idx: int, hidden_states: torch.Tensor, kept: list[torch.Tensor]) -> torch.Tensor:
        """The input (batch, seq, hidden) of layer `layer_idx`, plus its mirror's weighted output if it has one."""
        mirror = self.num_layers - 1 - layer_idx
        if mirror < self.weight.numel():
            hidden_states = hidden_states + self.weight[mirror] * kept[mirror]
        return hidden_states

    def keep(self, layer_idx: int, hidden_states: torch.Tensor, kept: list[torch.Tensor]) -> None:
        """Keep the output of a first-half layer for its mirror."""
        if layer_idx < self.weight.numel():
            kept.append(hidden_states)


class MiniTxLayerBase(GradientCheckpointingLayer):
    """Residual + norm around each sub-layer, pre-LN (x + f(LN(x))) or post-LN (LN(x + f(x))).

    A layer's forward reads as the paper's sub-layer: `norm_input`, the sub-layer, then `add_residual`.
    """

    def __init__(self, config: MiniTxConfig):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.dropout = nn.Dropout(config.hidden_dropout)

    def norm_input(self, hidden_states: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """The sub-layer's input: LN(x) with pre-LN, x itself with post-LN."""
        return norm(hidden_states) if self.pre_norm else hidden_states

    def add_residual(self, residual: torch.Tensor, output: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """x + dropout(f(...)), then LN of the sum with post-LN."""
        if self.training:  # dropout is the identity at inference: skip its call on every decoded token
            output = self.dropout(output)
        hidden_states = residual + output
        return hidden_states if self.pre_norm else norm(hidden_states)


class MiniTxEncoderLayer(MiniTxLayerBase):
    """Bidirectional self-attention, then the feed-forward network."""

    def __init__(self, config: MiniTxConfig, layer_idx: int):
        super().__init__(config)
        self.self_attn = MiniTxAttention(config, layer_idx)
        self.self_attn_layer_norm = make_norm(config)
        self.mlp = MiniTxMLP(config)
        self.mlp_layer_norm = make_norm(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        token_embeddings: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(batch, seq, hidden) -> (batch, seq, hidden), and the self-attention weights (eager only)."""
        attended, weights = self.self_attn(
            self.norm_input(hidden_states, self.self_attn_layer_norm), attention_mask, position_embeddings,
            token_embeddings=token_embeddings)
        hidden_states = self.add_residual(hidden_states, attended, self.self_attn_layer_norm)
        hidden_states = self.add_residual(
            hidden_states, self.mlp(self.norm_input(hidden_states, self.mlp_layer_norm)), self.mlp_layer_norm)
        return hidden_states, weights


class MiniTxDecoderLayer(MiniTxLayerBase):
    """Causal self-attention, cross-attention to the encoder (seq2seq only), then the feed-forward network."""

    def __init__(self, config: MiniTxConfig, layer_idx: int):
        super().__init__(config)
        self.self_attn = MiniTxAttention(config, layer_idx, is_causal=True)
        self.self_attn_layer_norm = make_norm(config)
        if config.is_encoder_decoder:
            self.cross_attn = MiniTxAttention(config, layer_idx, is_cross_attention=True)
            self.cross_attn_layer_norm = make_norm(config)
        self.mlp = MiniTxMLP(config)
        self.mlp_layer_norm = make_norm(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        token_embeddings: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(batch, q_len, hidden) -> (batch, q_len, hidden), self-attention and cross-attention weights."""
        attended, self_weights = self.self_attn(
            self.norm_input(hidden_states, self.self_attn_layer_norm), attention_mask, position_embeddings,
            cache=cache, token_embeddings=token_embeddings)
        hidden_states = self.add_residual(hidden_states, attended, self.self_attn_layer_norm)
        cross_weights = None
        if encoder_hidden_states is not None:
            attended, cross_weights = self.cross_attn(
                self.norm_input(hidden_states, self.cross_attn_layer_norm), encoder_attention_mask,
                key_value_states=encoder_hidden_states, cache=cache)
            hidden_states = self.add_residual(hidden_states, attended, self.cross_attn_layer_norm)
        hidden_states = self.add_residual(
            hidden_states, self.mlp(self.norm_input(hidden_states, self.mlp_layer_norm)), self.mlp_layer_norm)
        return hidden_states, self_weights, cross_weights


__all__ = ["NORMS", "ACTIVATIONS", "MiniTxRMSNorm", "make_norm", "relu_squared", "MiniTxAttention", "MiniTxMLP",
           "MiniTxUNetSkips", "MiniTxEncoderLayer", "MiniTxDecoderLayer"]
