"""Fast decoding on a CPU: how `generate()` reads the weights, remembers the prompt's checks and grows the cache.

None of this is the architecture (that is `layers_minitx.py` and `modeling_minitx.py`, which this file stands
above): for full-precision weights it changes how fast tokens come out, never which tokens. Int8 weight-only
weights are multiplied with bf16-rounded activations (torchao's own call expands the weights to the activations'
dtype), so their tokens may part from torchao's own at near-ties, the same way at every length. The models reach
it from `generate()` (`generate_in_decode_layout`) and its input preparation (`decode_step_inputs`); the
decoder stack's forward does not know of it.

- The decode layout: for the length of a `generate()` call, each decoder linear map gets a forward through a copy
  of its weight in the layout single-row products read fastest, and self-attention one q/k/v product
  (`set_decode_layout`); they are taken off when the call ends. Int8 weight-only weights (torchao's) are read as
  int8 by one fused kernel instead of expanded on every product.
- The remembered padding: for the length of a `generate()` call the decoder stack's `input_padding` is one
  that answers a decode step with the prompt's checks instead of reading tensors back (`set_remembered_padding`;
  `DECODE_STEPS`, the one place that state lives).
- The growing cache (`cache_minitx.py`): each step writes its keys and values in place instead of concatenating
  the whole cache.
"""

import warnings
import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn
from transformers import GenerationConfig
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .cache_minitx import MiniTxGrowingLayer, grow_in_place
from .layers_minitx import MiniTxAttention, MiniTxMLP

# The key/value cache's name in transformers' outputs and in generate()'s model inputs: `cache` from transformers
# 5.24 on, `past_key_values` before. The models take either name (`cache_argument`) and return it under this one.
CACHE_NAME = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"

# Below this many new tokens a `generate()` call reads the weights as stored: copying them into the decode
# layout costs about what that many decode steps save (docs/performance.md).
DECODE_LAYOUT_MIN_NEW_TOKENS = 16


def cache_argument(cache: Cache | None, past_key_values: Cache | None) -> Cache | None:
    """The cache a caller passed as `cache` or, by its name before transformers 5.24, as `past_key_values`
    (where `cache` is the name, the old one gets the FutureWarning transformers' own models give)."""
    if past_key_values is None:
        return cache
    if cache is not None:
        raise ValueError("Pass the cache once: as `cache` or as `past_key_values` (its former name), not both.")
    if CACHE_NAME == "cache":
        warnings.warn("`past_key_values` is deprecated: pass the cache as `cache`.", FutureWarning, stacklevel=3)
    return past_key_values


# --- the decode layout of the weights ---------------------------------------------------------------------


class GenerationWeight(NamedTuple):
    """A linear layer's weight as `generate()` reads it: `weight` (out, in) as stored (or fused), and on a CPU
    `by_input`, a (parts, in, out / parts) copy of a wide weight for single-row products. For int8 weight-only
    weights, `weight` holds the (out, in) int8 values and `scale` their (out,) bf16 scales."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    by_input: torch.Tensor | None
    scale: torch.Tensor | None = None


def _plain_linear(linear: nn.Module) -> bool:
    """An `nn.Linear` whose call is its own: no hooks (PEFT and accelerate wrap theirs), no replaced forward."""
    return (type(linear) is nn.Linear and not linear._forward_hooks and not linear._forward_pre_hooks
            and "forward" not in vars(linear))  # accelerate's hooks replace the instance's forward


def _joined_bias(linears: tuple[nn.Module, ...]) -> torch.Tensor | None:
    """The biases of `linears`, concatenated as their outputs are (None: they have none)."""
    if linears[0].bias is None:
        return None
    return torch.cat([p.bias.detach() for p in linears]) if len(linears) > 1 else linears[0].bias.detach()


def decode_layout_applies(linear: nn.Module) -> bool:
    """Whether `generation_weight` may copy `linear`: a plain `nn.Linear` whose weight is a dense tensor. A
    quantized weight (a tensor subclass, as torchao's int8) keeps its own call: copying it would expand it back to
    full precision or fail."""
    return _plain_linear(linear) and type(linear.weight) is nn.Parameter and type(linear.weight.data) is torch.Tensor


def generation_weight(linears: tuple[nn.Linear, ...], parts: int = 1, dense: bool = True) -> GenerationWeight | None:
    """One weight for `linears` (their outputs concatenated), laid out for the products of decoding.

    On a CPU a weight with at least as many outputs as inputs also gets a copy for one row at a time (batch 1):
    (in, out) split by outputs into `parts` (one per thread; 1 when `out` does not divide), (parts, in,
    out / parts). The matrix-vector product then streams rows of outputs instead of taking one short dot product
    per output, and a batched product gives each thread its own part (BLAS runs a single matrix-vector product
    on one thread): faster than the stored layout for the same values (docs/performance.md). A single weight
    is otherwise not copied. None where the decode layout does not apply (`decode_layout_applies`): those
    linears keep their own call. Int8 weight-only weights get their int8 copy
    (`int8_generation_weight`) whatever `dense` says; dense ones are copied only when `dense`.
    """
    if not all(map(decode_layout_applies, linears)):
        return int8_generation_weight(linears)
    if not dense:
        return None
    weights = [p.weight.detach() for p in linears]
    weight = torch.cat(weights) if len(weights) > 1 else weights[0]  # (out, in)
    by_input = None
    if weight.device.type == "cpu" and weight.shape[0] >= weight.shape[1]:
        parts = parts if parts > 1 and weight.shape[0] % parts == 0 else 1
        by_input = weight.t().reshape(weight.shape[1], parts, -1).transpose(0, 1).contiguous()  # (parts, in, out/parts)
    return GenerationWeight(weight, _joined_bias(linears), by_input)


INT8_KERNEL_INPUT_MULTIPLE = 16  # torch 2.13's AVX-512 `_weight_int8pack_mm` crashes or errs on other widths


def int8_rows(linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(out, in) int8 values and (out,) scales of a weight quantized weight-only, symmetric, one scale per output
    row (torchao's `Int8WeightOnlyConfig`, as `TorchAoConfig` loads it), on a CPU; None for any other weight, and
    for one whose input width is not a multiple of 16: the int8 kernel's AVX-512 form reads the inputs 16 at a
    time and crashes (or gives wrong values) on the rest, so such a weight keeps torchao's own call."""
    weight = getattr(linear, "weight", None)
    values, scale = getattr(weight, "qdata", None), getattr(weight, "scale", None)
    if (not _plain_linear(linear) or not isinstance(values, torch.Tensor) or values.dtype != torch.int8
            or values.dim() != 2 or values.device.type != "cpu"
            or not isinstance(scale, torch.Tensor) or scale.numel() != values.shape[0]
            or values.shape[1] % INT8_KERNEL_INPUT_MULTIPLE or not hasattr(torch, "_weight_int8pack_mm")):
        return None
    zero_point = getattr(weight, "zero_point", None)
    if (getattr(weight, "act_quant_kwargs", None) is not None or getattr(weight, "act_pre_scale", None) is not None
            or list(getattr(weight, "block_size", ())) != [1, values.shape[1]]
            or (zero_point is not None and bool(zero_point.any()))):
        return None  # activations quantized too, pre-scaled, per group, or asymmetric: torchao's own call
    return values, scale.reshape(-1)  # one scale per output row, (out, 1) or (out,) -> (out,)


def int8_generation_weight(linears: tuple[nn.Module, ...]) -> GenerationWeight | None:
    """One int8 weight for `linears` quantized per output row (`int8_rows`), their outputs concatenated, for
    `torch._weight_int8pack_mm`: (out, in) int8 values and (out,) bf16 scales. None where one is not such a
    weight: it keeps its own call.

    The int8 weights are read as int8: a quarter of the bytes of fp32, which is what decoding on a CPU waits for.
    torchao's own call expands each weight to the activations' dtype on every product. The kernel multiplies bf16
    rows (the activations are rounded to bf16 for the product only; the rest of the network stays in its dtype).
    """
    rows = [int8_rows(linear) for linear in linears]
    if any(r is None for r in rows):
        return None
    values = torch.cat([v for v, _ in rows]) if len(rows) > 1 else rows[0][0].contiguous()  # (out, in) int8
    scale = torch.cat([s for _, s in rows]).to(torch.bfloat16)  # (out,)
    return GenerationWeight(values, _joined_bias(linears), None, scale)


def project_with(copy: GenerationWeight, states: torch.Tensor) -> torch.Tensor:
    """(..., in) -> (..., out): the linear map of a `GenerationWeight`, with its bias.

    On a CPU, one row goes through the split (in, out) copy where there is one, one part per thread; several
    rows (a batch of decode steps, or a prompt) are computed as weight @ states^T, (out, in) @ (in, rows), and
    read transposed (a caller that needs unit-stride features makes them contiguous): BLAS splits that product
    over the weight's rows, where states @ weight^T would not (docs/performance.md).
    """
    if copy.weight.device.type != "cpu":
        return nn.functional.linear(states, copy.weight, copy.bias)
    flat = states.reshape(-1, states.shape[-1])  # (rows, in)
    if copy.scale is not None:  # int8 values, bf16 rows: (rows, in) @ (out, in)^T * scale
        out = torch._weight_int8pack_mm(flat.to(torch.bfloat16).contiguous(), copy.weight, copy.scale).to(states.dtype)
        if copy.bias is not None:
            out = out + copy.bias
    elif flat.shape[0] == 1:
        if copy.by_input is None:
            return nn.functional.linear(states, copy.weight, copy.bias)
        parts = copy.by_input.shape[0]
        if parts == 1:  # one (in, out) product (and what torch.compile keeps as BLAS's, not its own loop)
            out = flat @ copy.by_input[0] if copy.bias is None else torch.addmm(copy.bias, flat, copy.by_input[0])
        else:
            row = flat.expand(parts, 1, flat.shape[-1])  # (parts, 1, in)
            bias = None if copy.bias is None else copy.bias.view(parts, 1, -1)  # (out,) -> (parts, 1, out/parts)
            out = torch.bmm(row, copy.by_input) if bias is None else torch.baddbmm(bias, row, copy.by_input)
            out = out.view(1, -1)  # (parts, 1, out/parts) -> (1, out): the parts in order
    elif copy.bias is None:
        out = (copy.weight @ flat.T).T  # (rows, out), strides (1, rows)
    else:
        out = torch.addmm(copy.bias.unsqueeze(-1), copy.weight, flat.T).T  # (rows, out), strides (1, rows)
    return out.view(*states.shape[:-1], out.shape[-1])  # (..., out)


# The decode-layout weight of each module that has a decode forward on (`decode_copy`), for the length of a call.
DECODE_COPIES: "weakref.WeakKeyDictionary[nn.Module, GenerationWeight]" = weakref.WeakKeyDictionary()

# The instance attribute each module kind's decode forward goes in: nn.Linear's `forward`, attention's method.
SWAPPED = ("forward", "query_key_value")


def decode_forward(linear: nn.Linear, copy: GenerationWeight, contiguous: bool = False) -> Callable:
    """A linear map's forward for the length of a `generate()` call: the same map, through `copy`.

    `set_generation_weight` puts it on as the linear's instance `forward` (nn.Module's call finds it first) and
    takes it off afterwards; the module, its parameters and its state-dict keys stay as they are. With grad
    enabled (training) the module's own forward runs. `contiguous`: the output gets unit-stride features (a
    projection whose heads are split by a view). A closure rather than an object: torch.compile guards on
    its code, not on its identity, so a later call compiles nothing new.
    """
    def forward(states: torch.Tensor) -> torch.Tensor:
        """(..., in) -> (..., out), as `linear(states)`."""
        if torch.is_grad_enabled():
            return nn.Linear.forward(linear, states)
        out = project_with(copy, states)
        return out.contiguous() if contiguous else out
    return forward


def decode_query_key_value(attention: MiniTxAttention, copy: GenerationWeight) -> Callable:
    """Self-attention's `query_key_value` for the length of a `generate()` call: one product over the three
    weights (`copy`, their outputs concatenated), split into query, key and value.

    Decoding is bound by reading the weights, and one matrix-vector product reads the three faster than three.
    With grad enabled the attention's own three projections run.
    """
    sizes = (attention.q_proj.out_features, attention.k_proj.out_features, attention.v_proj.out_features)

    def query_key_value(states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(batch, seq, hidden) -> query, key and value, each (batch, seq, out) with unit-stride features."""
        if torch.is_grad_enabled():
            return MiniTxAttention.query_key_value(attention, states)
        projected = project_with(copy, states).contiguous()  # (batch, seq, out): attention reads unit-stride heads
        return projected.split(sizes, dim=-1)  # q, k, v: (batch, seq, out)
    return query_key_value


def decode_copy(module: nn.Module) -> GenerationWeight | None:
    """The decode-layout weight `module` reads while `generate()` runs (a linear map's, or self-attention's fused
    q/k/v), or None when it reads its weights as stored."""
    return DECODE_COPIES.get(module)


def put_on(module: nn.Module, name: str, forward: Callable, copy: GenerationWeight) -> None:
    """Give `module` the decode forward `forward` (through `copy`) as its instance attribute `name`."""
    setattr(module, name, forward)
    DECODE_COPIES[module] = copy


def take_off(module: nn.Module) -> None:
    """Remove the decode forward `put_on` gave `module`, if any: it calls its own again."""
    if DECODE_COPIES.pop(module, None) is not None:
        for name in SWAPPED:
            module.__dict__.pop(name, None)


def set_generation_weight(linear: nn.Module, on: bool, parts: int = 1, dense: bool = True,
                          contiguous: bool = False) -> None:
    """Give a linear layer its `generate()` forward through a copy of the weight (`generation_weight`), or drop it."""
    take_off(linear)
    copy = generation_weight((linear,), parts, dense) if on and isinstance(linear, nn.Linear) else None
    if copy is not None:
        put_on(linear, "forward", decode_forward(linear, copy, contiguous), copy)


def fuse_attention(attention: MiniTxAttention, fuse: bool, parts: int = 1, dense: bool = True) -> None:
    """Give an attention layer its `generate()` forwards, or drop them.

    Self-attention gets one q/k/v product (`decode_query_key_value`); cross-attention a copy of q_proj only (the
    keys and values of the source are projected once per call); both a copy of o_proj. The copies are never
    parameters: the state dict, PEFT's targets and training are untouched, and they are made only where the
    projections are plain `nn.Linear`s without hooks.
    """
    take_off(attention)
    set_generation_weight(attention.o_proj, fuse, parts, dense)
    if attention.is_cross_attention:
        set_generation_weight(attention.q_proj, fuse, parts, dense, contiguous=True)
    elif fuse:
        fused = generation_weight((attention.q_proj, attention.k_proj, attention.v_proj), parts, dense)
        if fused is not None:
            put_on(attention, "query_key_value", decode_query_key_value(attention, fused), fused)


def set_decode_layout(model: nn.Module, fuse: bool, parts: int = 1, dense: bool = True) -> None:
    """For the length of a `generate()` call, the decoder's weights as decoding reads them fastest (or back).

    `model` is a language model with `model.model.decoder` and `lm_head`. Every attention layer of the decoder
    goes through `fuse_attention`; each feed-forward network's linear maps and the head get a forward through a
    copy in the layout of `generation_weight` (single-row copies in `parts`; with `dense` False only the int8
    weights), and the decoder stack its remembered padding (`set_remembered_padding`). The encoder (run once
    per call) keeps its own.
    """
    for module in model.model.decoder.modules():
        if isinstance(module, MiniTxAttention):
            fuse_attention(module, fuse, parts, dense)
        elif isinstance(module, MiniTxMLP):
            for linear in (module.fc1, getattr(module, "gate_proj", None), module.fc2):
                if linear is not None:
                    set_generation_weight(linear, fuse, parts, dense)
    set_generation_weight(model.lm_head, fuse, parts, dense)
    set_remembered_padding(model.model.decoder, fuse)


# --- the remembered padding of the decode steps -------------------------------------------------------------


# The decode-step state of every cache a `generate()` call drives: the cache -> the prompt's padding flags
# (None until the prompt's call stored them). Weak keys: a cache dropped by its owner leaves no entry.
DECODE_STEPS: "weakref.WeakKeyDictionary[Cache, tuple[bool | None, bool | None] | None]" = weakref.WeakKeyDictionary()


def decode_step_padding(cache: Cache | None, inputs: torch.Tensor | None) -> tuple[bool | None, bool | None] | None:
    """On a decode step, the padding flags stored at the prompt's call (`remembering_padding`); else None.

    A decode step is one new position (`inputs`: ids (batch, 1) or embeddings (batch, 1, hidden)) on a dynamic cache
    that `generate()` drives and that already holds positions: every token after the first. Its mask is the
    prompt's mask extended with ones, so the prompt's checks and padding flags still hold and nothing is read back
    from the tensors. Calls outside `generate()`, and torch.compile (static cache), are checked as always.
    """
    if (cache is None or inputs is None or inputs.dim() not in (2, 3) or inputs.shape[1] != 1
            or torch.compiler.is_compiling()):
        return None
    flags = DECODE_STEPS.get(cache)
    if flags is None or cache.is_compileable or cache.get_seq_length() == 0:
        return None
    return flags


def remembering_padding(stack: nn.Module) -> Callable:
    """The decoder stack's `input_padding` for the length of a `generate()` call: a decode step gets the flags
    its cache's prompt call found (`decode_step_padding`); any other call runs the stack's own checks, whose
    flags are stored for the decode steps when `generate()` drives its cache (`DECODE_STEPS`).

    Flags: whether the attention mask and the encoder's mask pad. The stack's own method is taken as it is
    now (`set_remembered_padding` first takes off an earlier one).
    """
    own = stack.input_padding

    def input_padding(input_ids, attention_mask, inputs_embeds, encoder_attention_mask, cache):
        """As the stack's `input_padding`, with the prompt's flags on a decode step."""
        flags = decode_step_padding(cache, input_ids if inputs_embeds is None else inputs_embeds)
        if flags is None:
            flags = own(input_ids, attention_mask, inputs_embeds, encoder_attention_mask, cache)
            if cache is not None and not torch.compiler.is_compiling() and cache in DECODE_STEPS:
                DECODE_STEPS[cache] = flags
        return flags
    return input_padding


def set_remembered_padding(stack: nn.Module, on: bool) -> None:
    """Put the decoder stack's `remembering_padding` on as its instance `input_padding` (nn.Module's lookup finds
    it before the class's method), or take it off: the stack then checks every call again."""
    stack.__dict__.pop("input_padding", None)
    if on:
        stack.input_padding = remembering_padding(stack)


def forget_generation(cache: Cache | None) -> None:
    """After `generate()`: a cache handed back to the caller is checked again on its next call."""
    self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
    if self_cache is not None:
        DECODE_STEPS.pop(self_cache, None)


# --- generate(): when to use all of the above ---------------------------------------------------------------


def decodes_long_enough(config: GenerationConfig | None, kwargs: dict) -> bool:
    """Whether a `generate()` asks for enough new tokens (`max_new_tokens`, or at most `max_length`) to repay it."""
    asked = {key: kwargs.get(key, getattr(config, key, None)) for key in ("max_new_tokens", "max_length")}
    new_tokens = asked["max_new_tokens"] or asked["max_length"]
    return new_tokens is None or new_tokens >= DECODE_LAYOUT_MIN_NEW_TOKENS


def weight_parts(config: GenerationConfig | None, kwargs: dict) -> int:
    """Parts of the single-row weight copies (`generation_weight`): one per CPU thread, or 1 for a call with
    a static cache (asked for, or passed in), which `generate()` may compile (torch.compile turns the batched
    product of the parts into its own loop, slower than BLAS's single product)."""
    cache_implementation = kwargs.get("cache_implementation", getattr(config, "cache_implementation", None))
    given = cache_argument(kwargs.get("cache"), kwargs.get("past_key_values"))
    static = cache_implementation not in (None, "dynamic") or (isinstance(given, Cache) and given.is_compileable)
    return 1 if static else max(1, torch.get_num_threads())


def generate_in_decode_layout(model: nn.Module, generate: Callable[[], object], config: GenerationConfig | None,
                              kwargs: dict) -> object:
    """Run `generate()` (the `generate` callable, called with no argument) in the decode layout, then undo it.

    The weights take the decode layout (`set_decode_layout`) for calls long enough to repay it
    (`decodes_long_enough`), int8 weight-only weights for every call (their copy costs little, and one kernel
    for any length keeps a call's first tokens the same whatever `max_new_tokens` says); the decoder stack
    remembers the prompt's padding for every call. Afterwards, in a `finally`, the decode forwards are taken
    off, and a cache passed in or handed back forgets the remembered padding (`forget_generation`), so later
    calls on it are checked as any other call.
    `config` is the call's generation config and `kwargs` its keyword arguments.
    """
    set_decode_layout(model, True, weight_parts(config, kwargs), dense=decodes_long_enough(config, kwargs))
    try:
        out = generate()
    finally:
        set_decode_layout(model, False)
        forget_generation(kwargs.get("cache", kwargs.get("past_key_values")))  # a cache the caller passed in
    forget_generation(getattr(out, CACHE_NAME, None))  # or the one handed back
    return out


def decode_step_inputs(
    cache: Cache | None,
    input_ids: torch.LongTensor,
    lean: bool,
    is_encoder_decoder: bool,
    attention_mask: torch.Tensor | None,
    kwargs: dict,
) -> dict | None:
    """The model inputs of a decode step with a dynamic cache, or None where transformers' own preparation applies.

    Marks a dynamic cache as driven by `generate()` (so the decoder's `remembering_padding` keeps the prompt's
    padding flags for the decode steps) and, while it is empty, gives it layers that grow in place
    (`grow_in_place`). When `lean` (one new token after the first iteration, ids on the model's device), a
    decode step gets the last token (batch, 1), the cache, the masks as they are and every other keyword
    argument of `kwargs`: the generic
    preparation would also inspect `forward`'s signature on every token (custom code) and copy the ids.
    """
    self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
    dynamic = isinstance(self_cache, Cache) and not self_cache.is_compileable
    if dynamic:
        DECODE_STEPS.setdefault(self_cache, None)  # driven by generate(): remembering_padding stores its flags
        if self_cache.get_seq_length() == 0 and isinstance(self_cache, DynamicCache):
            grow_in_place(self_cache)
    if not (dynamic and lean):
        return None
    prefix = "decoder_" if is_encoder_decoder else ""
    inputs = {f"{prefix}input_ids": input_ids[:, -1:], CACHE_NAME: cache}  # (batch, 1)
    position_ids = kwargs.pop(f"{prefix}position_ids", None)
    if position_ids is not None:
        inputs[f"{prefix}position_ids"] = position_ids[..., -1:]
    if prefix and kwargs.get("decoder_attention_mask") is not None:
        inputs["decoder_attention_mask"] = kwargs.pop("decoder_attention_mask")
    if attention_mask is not None:
        inputs["attention_mask"] = attention_mask  # the decoder-only mask, or the seq2seq source mask
    for key, value in kwargs.items():
        if key not in ("labels", "next_sequence_length", "decoder_attention_mask") and key not in inputs:
            inputs[key] = value
    return inputs


__all__ = [
    "decode_layout_applies",
    "CACHE_NAME", "DECODE_LAYOUT_MIN_NEW_TOKENS", "GenerationWeight", "MiniTxGrowingLayer", "cache_argument",
    "decode_step_inputs", "decode_step_padding", "forget_generation", "generate_in_decode_layout",
    "remembering_padding", "set_remembered_padding",
    "generation_weight", "grow_in_place", "project_with", "decode_forward", "decode_query_key_value", "decode_copy",
    "DECODE_STEPS", "DECODE_COPIES",
    "set_decode_layout", "set_generation_weight",
]
