"""Building blocks: multi-head attention, the position-wise feed-forward network, encoder and decoder layers."""

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .attention_minitx import eager_attention_forward
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
    chain through pow, mean, rsqrt and two products (about 2.5x faster on a CPU at (8, 128, 128)).

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


class GenerationWeight(NamedTuple):
    """A linear layer's weight as `generate()` reads it: `weight` (out, in) as stored (or fused), and on a CPU
    `by_input`, a (parts, in, out / parts) copy of a wide weight for single-row products."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    by_input: torch.Tensor | None


def decode_layout_applies(linear: nn.Module) -> bool:
    """Whether `generation_weight` may copy `linear`: a plain `nn.Linear` without hooks (PEFT and accelerate wrap
    theirs) whose weight is a dense tensor. A quantized weight (a tensor subclass, as torchao's int8) keeps its own
    call: copying it would expand it back to full precision or fail."""
    return (type(linear) is nn.Linear and not linear._forward_hooks and not linear._forward_pre_hooks
            and type(linear.weight) is nn.Parameter and type(linear.weight.data) is torch.Tensor)


def generation_weight(linears: tuple[nn.Linear, ...], parts: int = 1) -> GenerationWeight | None:
    """One weight for `linears` (their outputs concatenated), laid out for the products of decoding.

    On a CPU a weight with at least as many outputs as inputs also gets a copy for one row at a time (batch 1):
    (in, out) split by outputs into `parts` (one per thread; 1 when `out` does not divide), (parts, in,
    out / parts). The matrix-vector product then streams rows of outputs instead of taking one short dot product
    per output, and a batched product gives each thread its own part (BLAS runs a single matrix-vector product
    on one thread): about 1.6x faster than the stored layout over the benchmark's weights on 2 cores, same
    values. A single weight is otherwise not copied. None where the decode layout does not apply
    (`decode_layout_applies`): those linears keep their own call.
    """
    if not all(map(decode_layout_applies, linears)):
        return None
    weights = [p.weight.detach() for p in linears]
    weight = torch.cat(weights) if len(weights) > 1 else weights[0]  # (out, in)
    bias = None
    if linears[0].bias is not None:
        bias = torch.cat([p.bias.detach() for p in linears]) if len(linears) > 1 else linears[0].bias.detach()
    by_input = None
    if weight.device.type == "cpu" and weight.shape[0] >= weight.shape[1]:
        parts = parts if parts > 1 and weight.shape[0] % parts == 0 else 1
        by_input = weight.t().reshape(weight.shape[1], parts, -1).transpose(0, 1).contiguous()  # (parts, in, out/parts)
    return GenerationWeight(weight, bias, by_input)


def project_with(copy: GenerationWeight, states: torch.Tensor) -> torch.Tensor:
    """(..., in) -> (..., out): the linear map of a `GenerationWeight`, with its bias.

    On a CPU, one row goes through the split (in, out) copy where there is one, one part per thread; several
    rows (a batch of decode steps, or a prompt) are computed as weight @ states^T, (out, in) @ (in, rows), and
    read transposed (a caller that needs unit-stride features makes them contiguous): BLAS splits that product
    over the weight's rows, about 2x faster than states @ weight^T for 2 to 64 rows on 2 cores (measured over
    the benchmark's weights; still 1.3x at 256 rows).
    """
    if copy.weight.device.type != "cpu":
        return nn.functional.linear(states, copy.weight, copy.bias)
    flat = states.reshape(-1, states.shape[-1])  # (rows, in)
    if flat.shape[0] == 1:
        if copy.by_input is None:
            return nn.functional.linear(states, copy.weight, copy.bias)
        parts = copy.by_input.shape[0]
        if parts == 1:  # one (in, out) product (and what torch.compile keeps as BLAS's, not its own loop)
            out = flat @ copy.by_input[0] if copy.bias is None else torch.addmm(copy.bias, flat, copy.by_input[0])
        else:
            row = flat.expand(parts, 1, flat.shape[-1])  # (parts, 1, in)
            bias = None if copy.bias is None else copy.bias.view(parts, 1, -1)
            out = torch.bmm(row, copy.by_input) if bias is None else torch.baddbmm(bias, row, copy.by_input)
            out = out.view(1, -1)  # (parts, 1, out/parts) -> (1, out): the parts in order
    elif copy.bias is None:
        out = (copy.weight @ flat.T).T  # (rows, out), strides (1, rows)
    else:
        out = torch.addmm(copy.bias.unsqueeze(-1), copy.weight, flat.T).T  # (rows, out), strides (1, rows)
    return out.view(*states.shape[:-1], out.shape[-1])  # (..., out)


def project(linear: nn.Module, states: torch.Tensor) -> torch.Tensor:
    """`linear(states)`, through its `generate()` copy (`set_generation_weight`) while one is set and no grad."""
    copy = linear.__dict__.get("generation_weight")
    if copy is None or torch.is_grad_enabled():
        return linear(states)
    return project_with(copy, states)


def set_generation_weight(linear: nn.Module, on: bool, parts: int = 1) -> None:
    """Give a linear layer its `generate()` copy of the weight (`generation_weight`), or drop it."""
    linear.__dict__.pop("generation_weight", None)
    copy = generation_weight((linear,), parts) if on and isinstance(linear, nn.Linear) else None
    if copy is not None:
        linear.__dict__["generation_weight"] = copy


class MiniTxAttention(nn.Module):
    """Multi-head (or grouped-query) attention: self-attention, causal or not, or cross-attention.

    The projections are named like Hugging Face's (`q_proj`, `k_proj`, `v_proj`, `o_proj`) so PEFT and device
    maps find them. The attention itself comes from transformers' interface: `eager` is ours
    (`attention_minitx.eager_attention_forward`), `sdpa` is torch's fused kernel.
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

    def _heads(self, projection: nn.Linear, states: torch.Tensor, norm: nn.Module | None = None) -> torch.Tensor:
        """Project (batch, seq, hidden) states and split the heads; `norm` (QK-norm) acts on each head."""
        batch, seq, _ = states.shape
        heads = project(projection, states).contiguous()  # (batch, seq, out): unit-stride heads for the kernels
        heads = heads.view(batch, seq, -1, self.head_dim)  # (batch, seq, heads, head_dim)
        if norm is not None:
            heads = norm(heads)
        return heads.transpose(1, 2)  # (batch, heads, seq, head_dim)

    def fuse_projections(self, fuse: bool, parts: int = 1) -> None:
        """Give self-attention one q/k/v weight for the length of a `generate()` call (or drop it).

        One matrix-vector product over the three weights reads them faster than three (decoding is bound by
        reading the weights). The copy (`generation_weight`) is a plain attribute, never a parameter: the state
        dict, PEFT's targets and training are untouched, and it is made only where q/k/v are plain `nn.Linear`s
        without hooks.
        """
        self.__dict__.pop("fused_qkv", None)
        set_generation_weight(self.o_proj, fuse, parts)
        if self.is_cross_attention:  # the keys and values of the source are projected once per call
            set_generation_weight(self.q_proj, fuse, parts)
        elif fuse:
            fused = generation_weight((self.q_proj, self.k_proj, self.v_proj), parts)
            if fused is not None:
                self.fused_qkv = fused

    def _self_query_key_value(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(batch, seq, hidden) -> query (batch, heads, seq, head_dim), key and value (batch, kv_heads, seq, head_dim)."""
        fused = self.__dict__.get("fused_qkv")
        if fused is None or torch.is_grad_enabled():
            return (self._heads(self.q_proj, states, self.q_norm), self._heads(self.k_proj, states, self.k_norm),
                    self._heads(self.v_proj, states))
        batch, seq, _ = states.shape
        sizes = (self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features)
        projected = project_with(fused, states).contiguous()  # (batch, seq, out): attention reads unit-stride heads
        projected = projected.split(sizes, dim=-1)  # q, k, v: (batch, seq, out)
        query, key, value = (x.view(batch, seq, -1, self.head_dim) for x in projected)  # (batch, seq, heads, head_dim)
        if self.q_norm is not None:
            query, key = self.q_norm(query), self.k_norm(key)
        return query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # (batch, heads, seq, head_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        key_value_states: torch.Tensor | None = None,
        cache: Cache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from `hidden_states` (batch, q_len, hidden) to itself or to `key_value_states` (batch, src, hidden).

        Returns the output (batch, q_len, hidden) and the attention weights (eager only, else None).
        """
        batch, q_len, _ = hidden_states.shape
        if self.is_cross_attention:
            query = self._heads(self.q_proj, hidden_states, self.q_norm)  # (batch, heads, q_len, head_dim)
            key, value = self._cross_key_value(key_value_states, cache)
        else:
            query, key, value = self._self_query_key_value(hidden_states)  # key, value: (batch, kv_heads, q_len, head_dim)
            if position_embeddings is not None:
                cos, sin = position_embeddings
                query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
            if cache is not None:
                self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
                key, value = self_cache.update(key, value, self.layer_idx)  # (batch, kv_heads, kv_len, head_dim)

        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        output, weights = attention(
            self, query, key, value, attention_mask,
            scaling=self.scaling, dropout=self.config.attention_dropout if self.training else 0.0,
        )
        output = output.reshape(batch, q_len, -1)  # (batch, q_len, heads * head_dim)
        return project(self.o_proj, output), weights

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

    def fuse_projections(self, fuse: bool, parts: int = 1) -> None:
        """Give fc1, gate_proj and fc2 their `generate()` weights (`set_generation_weight`), or drop them."""
        for linear in (self.fc1, getattr(self, "gate_proj", None), self.fc2):
            if linear is not None:
                set_generation_weight(linear, fuse, parts)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(batch, seq, hidden) -> (batch, seq, hidden)."""
        if self.gated:
            inner = self.act(project(self.gate_proj, hidden_states)) * project(self.fc1, hidden_states)
        else:
            inner = self.act(project(self.fc1, hidden_states))  # (batch, seq, intermediate)
        return project(self.fc2, inner)


class MiniTxLayerBase(GradientCheckpointingLayer):
    """Residual + norm around a sub-layer, pre-LN (x + f(LN(x))) or post-LN (LN(x + f(x)))."""

    def __init__(self, config: MiniTxConfig):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.dropout = nn.Dropout(config.hidden_dropout)

    def sublayer(self, hidden_states: torch.Tensor, norm: nn.Module, fn: Callable) -> tuple[torch.Tensor, object]:
        """Apply `fn` (returning an output or an (output, extra) pair) with residual and norm; return (states, extra)."""
        out = fn(norm(hidden_states) if self.pre_norm else hidden_states)
        out, extra = out if isinstance(out, tuple) else (out, None)
        if self.training:  # dropout is the identity at inference: skip its call on every decoded token
            out = self.dropout(out)
        hidden_states = hidden_states + out
        return (hidden_states if self.pre_norm else norm(hidden_states)), extra


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
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(batch, seq, hidden) -> (batch, seq, hidden), and the self-attention weights (eager only)."""
        hidden_states, weights = self.sublayer(
            hidden_states, self.self_attn_layer_norm,
            lambda x: self.self_attn(x, attention_mask, position_embeddings),
        )
        hidden_states, _ = self.sublayer(hidden_states, self.mlp_layer_norm, self.mlp)
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
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(batch, q_len, hidden) -> (batch, q_len, hidden), self-attention and cross-attention weights."""
        hidden_states, self_weights = self.sublayer(
            hidden_states, self.self_attn_layer_norm,
            lambda x: self.self_attn(x, attention_mask, position_embeddings, cache=cache),
        )
        cross_weights = None
        if encoder_hidden_states is not None:
            hidden_states, cross_weights = self.sublayer(
                hidden_states, self.cross_attn_layer_norm,
                lambda x: self.cross_attn(
                    x, encoder_attention_mask, key_value_states=encoder_hidden_states, cache=cache
                ),
            )
        hidden_states, _ = self.sublayer(hidden_states, self.mlp_layer_norm, self.mlp)
        return hidden_states, self_weights, cross_weights


__all__ = ["GenerationWeight", "decode_layout_applies", "generation_weight", "project_with", "project", "set_generation_weight", "NORMS", "ACTIVATIONS", "MiniTxRMSNorm", "make_norm", "relu_squared", "MiniTxAttention", "MiniTxMLP", "MiniTxEncoderLayer", "MiniTxDecoderLayer"]
