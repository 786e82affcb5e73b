"""MiniTx models: the layer stack, the headless model and the two language-model heads.

- `MiniTxModel`: a decoder-only stack, or encoder + decoder when `config.is_encoder_decoder`.
- `MiniTxForCausalLM`: decoder-only language model (GPT-style).
- `MiniTxForConditionalGeneration`: encoder-decoder sequence-to-sequence model (the paper's Transformer).
"""

import math
from functools import partial

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    CausalLMOutputWithPast,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.utils import logging

from .attention_minitx import cross_attention_mask, self_attention_mask
from .configuration_minitx import IGNORE_INDEX, MiniTxConfig

# The heads import the decoding machinery at the top, not inside generate(): generate(), its input preparation
# and the stack's decode-step padding all use it, and it imports only the layers (never this file), so nothing
# cycles; the layers themselves know nothing of it.
from .decoding_minitx import (
    CACHE_NAME,
    cache_argument,
    decode_step_inputs,
    decode_step_padding,
    generate_in_decode_layout,
    remember_padding,
)
from .layers_minitx import MiniTxDecoderLayer, MiniTxEncoderLayer, MiniTxRMSNorm, make_norm
from .positions_minitx import (
    POSITION_ENCODINGS,
    MiniTxPositionalEmbedding,
    MiniTxRotaryEmbedding,
    check_generation_fits,
    rope_inverse_frequencies,
    sinusoidal_table,
)

AUTO_MAP = {
    "AutoConfig": "configuration_minitx.MiniTxConfig",
    "AutoModel": "modeling_minitx.MiniTxModel",
    "AutoModelForCausalLM": "modeling_minitx.MiniTxForCausalLM",
    "AutoModelForSeq2SeqLM": "modeling_minitx.MiniTxForConditionalGeneration",
}

logger = logging.get_logger(__name__)

def resolve_output_flags(
    config: MiniTxConfig, output_attentions: bool | None, output_hidden_states: bool | None, return_dict: bool | None
) -> tuple[bool, bool, bool]:
    """A flag passed to forward wins; one left as None takes the config's value, as in every transformers model."""
    return (
        config.output_attentions if output_attentions is None else output_attentions,
        config.output_hidden_states if output_hidden_states is None else output_hidden_states,
        config.return_dict if return_dict is None else return_dict,
    )


def check_inputs(
    config: MiniTxConfig,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None = None,
    prefix: str = "",
    weights_device: torch.device | None = None,
) -> bool | None:
    """Raise one ValueError for ids, embeddings or a padding mask no model could use (meta-device inputs too, unless
    the weights, on ``weights_device``, are meta as well: shape tracing).

    input_ids: (batch, seq) integer ids in [0, vocab_size), batch and seq >= 1; inputs_embeds: (batch, seq, hidden).
    attention_mask: (batch, seq) of 0/1 or bool, or a ready 4-D mask (taken as is). `prefix` is "decoder_" for
    the seq2seq decoder's arguments. The value checks share one device-to-host copy per call.
    Returns whether the 2-D mask holds padding (None without a 2-D mask, or under torch.compile, where nothing
    is checked so that the graph has no host sync).
    """
    if torch.compiler.is_compiling():
        return None
    ids_name, mask_name = f"{prefix}input_ids", f"{prefix}attention_mask"
    if input_ids is not None:
        _check_id_tensor(input_ids, ids_name)
    elif inputs_embeds is not None and (inputs_embeds.dim() != 3 or 0 in inputs_embeds.shape[:2]
                                        or inputs_embeds.shape[-1] != config.hidden_size):
        raise ValueError(f"{prefix}inputs_embeds must be (batch, seq, hidden_size={config.hidden_size}) with batch, "
                         f"seq >= 1, got shape {tuple(inputs_embeds.shape)}.")
    if attention_mask is not None and attention_mask.dim() not in (2, 4):
        raise ValueError(f"{mask_name} must be (batch, seq) with 1 for tokens and 0 for padding, got shape "
                         f"{tuple(attention_mask.shape)}. Pass the mask the tokenizer returned.")
    if any(x is not None and x.device.type == "meta" for x in (input_ids, attention_mask, inputs_embeds)):
        if weights_device is not None and weights_device.type != "meta":
            raise ValueError(f"the inputs are on the meta device (shapes without values) but the model's weights are "
                             f"on {weights_device}; move the inputs there (.to({str(weights_device)!r}))")
        # meta tensors have shapes but no values (shape tracing): nothing to read, so assume a 2-D mask pads
        return True if attention_mask is not None and attention_mask.dim() == 2 else None
    checks = {}
    if input_ids is not None:
        checks["ids"] = ((input_ids < 0) | (input_ids >= config.vocab_size)).any()
    mask_2d = attention_mask is not None and attention_mask.dim() == 2
    if mask_2d and attention_mask.dtype != torch.bool:
        checks["mask"] = ((attention_mask != 0) & (attention_mask != 1)).any()
    if mask_2d:
        checks["padding"] = ~attention_mask.bool().all()
    if not checks:
        return None
    found = dict(zip(checks, torch.stack(list(checks.values())).tolist(), strict=True))  # the one host sync
    if found.get("ids"):
        low, high = int(input_ids.min()), int(input_ids.max())
        raise ValueError(
            f"Token ids must lie in [0, {config.vocab_size}) (config.vocab_size), got values in [{low}, {high}] in "
            f"{ids_name}. Was the input encoded with another tokenizer?"
        )
    if found.get("mask"):
        bad = attention_mask[(attention_mask != 0) & (attention_mask != 1)].unique()[:4].tolist()
        raise ValueError(f"{mask_name} must hold only 0 (padding) and 1 (token), or booleans; found {bad}. Pass the "
                         "mask the tokenizer returned, or (mask > 0).long().")
    return found.get("padding")


def _check_id_tensor(ids: torch.Tensor, name: str) -> None:
    """Shape and dtype of (batch, seq) token ids: 2-D, integer, not empty."""
    if ids.dim() != 2:
        raise ValueError(f"{name} must be 2-D (batch, seq), got shape {tuple(ids.shape)}. For one sequence add the "
                         f"batch dimension ({name}[None]) or use tokenizer(..., return_tensors='pt').")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}; use .long().")
    if 0 in ids.shape:
        raise ValueError(f"{name} has shape {tuple(ids.shape)}: the model needs at least one sequence of at least "
                         "one token (an empty prompt gives no ids; start it with the BOS token).")


class MiniTxPreTrainedModel(PreTrainedModel):
    """Weight initialisation and the Hugging Face class attributes shared by every MiniTx model."""

    config_class = MiniTxConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _can_compile_fullgraph = True  # forward has no host sync under torch.compile; transformers also reads it as
    # "supports cache_implementation='static'" and then compiles forward itself in generate() on GPUs
    _no_split_modules = ["MiniTxEncoderLayer", "MiniTxDecoderLayer"]
    _skip_keys_device_placement = ["cache", "past_key_values"]

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """`PreTrainedModel.save_pretrained`, with an `auto_map` naming every Auto class of MiniTx.

        The saved folder then loads with AutoConfig, AutoModel and either LM Auto class under
        `trust_remote_code=True`; the wrong LM class raises a clear error instead of a lookup failure.
        """
        self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **AUTO_MAP}
        super().save_pretrained(save_directory, *args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if module is getattr(self, "lm_head", None) and self.config.zero_init_head:
            init.zeros_(module.weight)  # every first prediction uniform: the loss starts at ln(vocab_size)
        elif isinstance(module, nn.Linear) and self.config.zero_init_projections and getattr(module, "residual_output", False):
            init.zeros_(module.weight)  # o_proj / fc2: each block starts as the identity
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, MiniTxRMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, MiniTxPositionalEmbedding):
            if module.learned:
                init.normal_(module.weight, mean=0.0, std=std)
            else:  # a fixed table, not stored in checkpoints: rebuild it
                init.copy_(module.weight, sinusoidal_table(*module.weight.shape))
        elif isinstance(module, MiniTxRotaryEmbedding):
            init.copy_(module.inv_freq, rope_inverse_frequencies(module.head_dim, module.theta))


class MiniTxStack(nn.Module):
    """Embeddings + positions + N encoder or decoder layers (+ a final LayerNorm with pre-LN).

    The token embedding lives in the first stack that reads token ids: the decoder of a decoder-only model,
    the encoder of a seq2seq model (whose decoder receives embeddings from `MiniTxModel`).
    """

    def __init__(self, config: MiniTxConfig, is_decoder: bool):
        super().__init__()
        self.config = config
        self.is_decoder = is_decoder
        if not (is_decoder and config.is_encoder_decoder):
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_scale = math.sqrt(config.hidden_size) if config.scale_embeddings else 1.0
        positions = POSITION_ENCODINGS[config.position_embedding_type]
        self.positions_attribute = positions.attribute  # "embed_positions" or "rotary_emb", as saved checkpoints name it
        setattr(self, positions.attribute, positions(config))
        self.dropout = nn.Dropout(config.hidden_dropout)
        layer_cls, num_layers = (
            (MiniTxDecoderLayer, config.num_hidden_layers) if is_decoder else (MiniTxEncoderLayer, config.num_encoder_layers)
        )
        self.layers = nn.ModuleList(layer_cls(config, layer_idx) for layer_idx in range(num_layers))
        # Post-LN ends every layer with a LayerNorm already; pre-LN needs one at the end of the stack.
        self.norm = make_norm(config) if config.norm_position == "pre" else None

    def embed(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """(batch, seq) token ids -> (batch, seq, hidden) scaled token embeddings (ids checked by `check_inputs`)."""
        return self.embed_tokens(input_ids) * self.embed_scale

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions | tuple:
        """Run the stack on ids (batch, seq) or embeddings (batch, seq, hidden); returns per-position states.

        Unset output flags come from the config; `return_dict=False` returns `output.to_tuple()`.
        """
        output_attentions, output_hidden_states, return_dict = resolve_output_flags(
            self.config, output_attentions, output_hidden_states, return_dict)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        prefix = "decoder_" if self.is_decoder and self.config.is_encoder_decoder else ""
        self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        remembered = decode_step_padding(self_cache, input_ids if inputs_embeds is None else inputs_embeds)
        if remembered is None:  # a call with what the user gave: check it
            has_padding = check_inputs(self.config, input_ids, attention_mask, inputs_embeds, prefix,
                                       weights_device=next(self.parameters()).device)
            cross_padding = None
        else:  # one generated token on a filled cache: the prompt's checks hold, no host sync
            has_padding, cross_padding = remembered
        if inputs_embeds is None:
            inputs_embeds = self.embed(input_ids)
        batch, q_len = inputs_embeds.shape[:2]
        # a static cache counts its positions in a tensor: keep it a tensor under compile (no host sync)
        past_len = self_cache.get_seq_length() if self_cache is not None else 0
        kv_len = self_cache.get_mask_sizes(q_len, 0)[0] if self_cache is not None else q_len
        if not torch.compiler.is_compiling():
            past_len = int(past_len)
            self._check_lengths(attention_mask, batch, q_len, past_len + q_len, kv_len)
        if position_ids is None:
            position_ids = positions_from_mask(attention_mask if has_padding is not False else None, q_len, past_len,
                                               inputs_embeds.device)

        hidden_states = inputs_embeds
        # absolute positions are added here; rotary ones come back as cos/sin for the attention layers
        hidden_states, position_embeddings = getattr(self, self.positions_attribute).add_positions(
            hidden_states, position_ids)
        hidden_states = self.dropout(hidden_states)

        mask = self_attention_mask(attention_mask, q_len, past_len, kv_len, causal=self.is_decoder,
                                   has_padding=has_padding, device=inputs_embeds.device)
        cross_mask = None
        if encoder_hidden_states is not None:
            cross_mask = cross_attention_mask(encoder_attention_mask, q_len, cross_padding)
        if remembered is None:
            remember_padding(self_cache, has_padding, cross_mask is not None)
        all_states = [hidden_states] if output_hidden_states else None
        all_attentions = [] if output_attentions else None
        all_cross = [] if output_attentions and encoder_hidden_states is not None else None
        for layer in self.layers:
            if self.is_decoder:
                hidden_states, weights, cross_weights = layer(
                    hidden_states, mask, position_embeddings, encoder_hidden_states, cross_mask,
                    cache=cache,
                )
            else:
                hidden_states, weights = layer(hidden_states, mask, position_embeddings)
                cross_weights = None
            if all_states is not None:
                all_states.append(hidden_states)
            if all_attentions is not None:
                all_attentions.append(weights)
            if all_cross is not None:
                all_cross.append(cross_weights)
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
            if all_states is not None:
                all_states[-1] = hidden_states
        output = BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            **{CACHE_NAME: cache if self.is_decoder else None},
            hidden_states=tuple(all_states) if all_states is not None else None,
            attentions=tuple(all_attentions) if all_attentions is not None else None,
            cross_attentions=tuple(all_cross) if all_cross is not None else None,
        )
        return output if return_dict else output.to_tuple()

    def _check_lengths(
        self, attention_mask: torch.Tensor | None, batch: int, q_len: int, total_len: int, kv_len: int
    ) -> None:
        """Positions within the table; a 2-D mask (batch, cached + new) or a 4-D one (batch|1, 1|heads, new, keys)."""
        if attention_mask is not None and attention_mask.dim() == 4:
            mask_batch, mask_heads, mask_q, mask_k = attention_mask.shape
            if (mask_batch not in (1, batch) or mask_heads not in (1, self.config.num_attention_heads)
                    or mask_q != q_len or mask_k != kv_len):
                raise ValueError(
                    f"a 4-D attention_mask must be (batch or 1, 1 or heads, query, keys) = ({batch}, 1, {q_len}, "
                    f"{kv_len}) for this input, got {tuple(attention_mask.shape)}; pass the 2-D (batch, seq) mask "
                    "the tokenizer returned and let the model build the 4-D one.")
        if self.config.position_table and total_len > self.config.max_position_embeddings:
            raise ValueError(
                f"Sequence of {total_len} positions is longer than max_position_embeddings="
                f"{self.config.max_position_embeddings} of this model ({self.config.position_embedding_type} "
                "positions). Truncate the input (e.g. tokenizer(..., truncation=True, max_length=...))."
            )
        if attention_mask is not None and attention_mask.dim() == 2 and (
            attention_mask.shape[0] != batch or attention_mask.shape[1] not in (total_len, kv_len)
        ):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but the input needs ({batch}, {total_len}) "
                "(batch, cached + new positions). Pass the mask the tokenizer returned with these input_ids."
            )


def positions_from_mask(
    attention_mask: torch.Tensor | None, q_len: int, past_len: int | torch.Tensor, device: torch.device
) -> torch.LongTensor:
    """Position ids of the new tokens: count only real tokens, so left padding does not shift positions.

    `past_len` is an int, or a 0-d tensor (a static cache under torch.compile). Returns (batch, q_len), or
    (1, q_len) when there is no padding mask.
    """
    new = torch.arange(q_len, device=device) + past_len  # (q_len,) absolute positions of the new tokens
    if attention_mask is None or attention_mask.dim() != 2:
        return new[None]  # (1, q_len)
    positions = attention_mask.long().cumsum(-1) - 1  # (batch, past + q_len)
    positions = positions.clamp(min=0)
    return positions.index_select(1, new.to(positions.device))  # (batch, q_len)


class MiniTxModel(MiniTxPreTrainedModel):
    """The headless Transformer: a causal decoder stack, or an encoder and a decoder with cross-attention."""

    def __init__(self, config: MiniTxConfig):
        super().__init__(config)
        if config.is_encoder_decoder:
            self.encoder = MiniTxStack(config, is_decoder=False)
        self.decoder = MiniTxStack(config, is_decoder=True)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens if self.config.is_encoder_decoder else self.decoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        (self.encoder if self.config.is_encoder_decoder else self.decoder).embed_tokens = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions | Seq2SeqModelOutput | tuple:
        """Decoder-only: (batch, seq) ids -> states. Seq2seq: source ids + decoder ids -> decoder states.

        Unset output flags come from the config; `return_dict=False` returns `output.to_tuple()`.
        `past_key_values` is the former name of `cache` (transformers before 5.24).
        """
        cache = cache_argument(cache, past_key_values)
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        output_attentions, output_hidden_states, return_dict = resolve_output_flags(
            self.config, output_attentions, output_hidden_states, return_dict)
        flags = {"output_attentions": output_attentions, "output_hidden_states": output_hidden_states,
                 "return_dict": True}
        if not self.config.is_encoder_decoder:
            if use_cache and cache is None:
                cache = DynamicCache(config=self.config)
            output = self.decoder(input_ids, attention_mask, position_ids, inputs_embeds,
                                  cache=cache if use_cache else None, **flags)
            return output if return_dict else output.to_tuple()

        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids, attention_mask, position_ids, inputs_embeds, **flags)
        elif isinstance(encoder_outputs, (tuple, list)):  # return_dict=False style
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        if decoder_input_ids is None and decoder_inputs_embeds is None:
            raise ValueError(
                "The seq2seq model needs decoder inputs: pass `labels` (decoder_input_ids are then made by shifting "
                "them right) or `decoder_input_ids`; generate() provides them itself."
            )
        if decoder_inputs_embeds is None:
            if decode_step_padding(cache.self_attention_cache if isinstance(
                    cache, EncoderDecoderCache) else None, decoder_input_ids) is None:
                check_inputs(self.config, decoder_input_ids, None, prefix="decoder_",
                             weights_device=self.encoder.embed_tokens.weight.device)
            decoder_inputs_embeds = self.encoder.embed(decoder_input_ids)
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        decoder_outputs = self.decoder(
            None, decoder_attention_mask, decoder_position_ids, decoder_inputs_embeds,
            encoder_hidden_states=encoder_outputs.last_hidden_state, encoder_attention_mask=attention_mask,
            cache=cache if use_cache else None, **flags,
        )
        output = Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **{CACHE_NAME: getattr(decoder_outputs, CACHE_NAME)},
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


class MiniTxLMHeadMixin:
    """Shared `lm_head` handling of the two language-model heads."""

    def _check_kind(self, config: MiniTxConfig, want_encoder_decoder: bool) -> None:
        if config.is_encoder_decoder != want_encoder_decoder:
            kind = "an encoder-decoder" if config.is_encoder_decoder else "a decoder-only"
            use = "AutoModelForSeq2SeqLM / MiniTxForConditionalGeneration" if config.is_encoder_decoder else (
                "AutoModelForCausalLM / MiniTxForCausalLM")
            raise ValueError(f"This checkpoint is {kind} MiniTx model (is_encoder_decoder={config.is_encoder_decoder}); "
                             f"load it with {use}.")

    def output_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(batch, seq, hidden) -> (batch, seq, vocab): `lm_head`, then c * tanh(logits / c) with a soft cap c."""
        logits = self.lm_head(hidden_states)  # (batch, seq, vocab)
        cap = self.config.final_logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def generate(self, *args, **kwargs):
        """transformers' `generate()`, after checking `num_beams` (0 beams otherwise fails deep inside it).

        It runs in the decode layout (`decoding_minitx.generate_in_decode_layout`): the decoder reads its weights
        as decoding reads them fastest, the dynamic cache grows in place and remembers the prompt's padding for
        the decode steps; none of it outlives the call.
        """
        config = kwargs.get("generation_config") or (args[1] if len(args) > 1 else None) or self.generation_config
        beams = kwargs.get("num_beams", getattr(config, "num_beams", None))
        if beams is not None and (not isinstance(beams, int) or isinstance(beams, bool) or beams < 1):
            raise ValueError(f"generate(num_beams={beams!r}): num_beams must be an integer >= 1 "
                             "(1 = greedy or sampling, more = beam search).")
        return generate_in_decode_layout(self, partial(super().generate, *args, **kwargs), config, kwargs)

    def _validate_generated_length(self, generation_config, input_ids_length: int, has_default_max_length: bool):
        """transformers' length checks, then the position table's: a `max_new_tokens` that would run past
        `max_position_embeddings` is refused before the first token, naming the largest that fits."""
        super()._validate_generated_length(generation_config, input_ids_length, has_default_max_length)
        check_generation_fits(self.config, input_ids_length, generation_config.max_length,
                              generation_config.max_new_tokens)

    def prepare_inputs_for_generation(
        self,
        input_ids: torch.LongTensor,
        next_sequence_length: int | None = None,
        cache: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        is_first_iteration: bool | None = False,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> dict:
        """transformers' input preparation; on a decode step with a dynamic cache, only what changes
        (`decoding_minitx.decode_step_inputs`).

        The cache comes as `cache` or, before transformers 5.24, as `past_key_values`, and goes on under the
        installed version's name (`CACHE_NAME`).
        """
        cache = cache_argument(cache, past_key_values)
        lean = (next_sequence_length == 1 and not is_first_iteration and input_ids.device == self.lm_head.weight.device)
        inputs = decode_step_inputs(cache, input_ids, lean, self.config.is_encoder_decoder, attention_mask, kwargs)
        if inputs is not None:
            return inputs
        return super().prepare_inputs_for_generation(
            input_ids, next_sequence_length, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
            is_first_iteration=is_first_iteration, **{CACHE_NAME: cache}, **kwargs)

    def lm_loss(self, logits: torch.Tensor, targets: torch.Tensor, aligned: bool, name: str, **kwargs) -> torch.Tensor:
        """Mean next-token cross-entropy, through transformers' `self.loss_function` (honours `num_items_in_batch`).

        logits (batch, seq, vocab); targets (batch, seq) are the inputs themselves (`aligned=False`: shifted
        inside by padding the labels, so the logits are never copied) or already aligned with the logits
        (`shift_labels`, seq2seq labels). `name` is the argument named in errors. IGNORE_INDEX marks ignored positions. With no labelled position at all the loss is 0 and a warning is
        logged (a plain mean would be NaN), matching what transformers' Trainer gets for such a micro-batch.
        """
        any_labelled = check_labels(targets, logits.shape[:-1], name, self.config.vocab_size, aligned=aligned)
        if any_labelled is False:
            logger.warning_once(f"Every position of `{name}` is {IGNORE_INDEX} (ignored): the loss is 0, not NaN. "
                                "Check the label masking (e.g. prompts longer than the block).")
            kwargs["num_items_in_batch"] = 1  # sum over no position (0) / 1
        targets = targets.contiguous()  # a slice of a larger tensor is fine (the loss views it flat)
        labels, shift_labels = (None, targets) if aligned else (targets, None)
        return self.loss_function(logits, labels, self.config.vocab_size, shift_labels=shift_labels,
                                  ignore_index=IGNORE_INDEX, **kwargs)


def check_labels(
    labels: torch.Tensor, positions: torch.Size, name: str, vocab_size: int, aligned: bool
) -> bool | None:
    """Raise ValueError for labels that do not fit the logits; return whether any position is labelled.

    labels (batch, seq) must match the logits' `positions` (batch, seq) and hold ids in [0, vocab_size) or IGNORE_INDEX. Labels
    not yet aligned lose their first position to the shift. One host sync; skipped (None) under torch.compile.
    """
    if torch.compiler.is_compiling():
        return None
    if labels.dim() != 2 or labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.shape != positions:
        raise ValueError(
            f"{name} must be integer ids shaped like the logits' positions {tuple(positions)} "
            f"(batch, seq), got {labels.dtype} {tuple(labels.shape)}. Use {IGNORE_INDEX} for ignored positions "
            "(and no logits_to_keep when computing a loss)."
        )
    labelled = labels != IGNORE_INDEX  # (batch, seq)
    if labels.device.type == "meta":
        return None  # shapes only, no values to check
    bad, used = torch.stack([(labelled & ((labels < 0) | (labels >= vocab_size))).any(),
                             (labelled if aligned else labelled[:, 1:]).any()]).tolist()
    if bad:
        values = labels[labelled & ((labels < 0) | (labels >= vocab_size))].unique()[:4].tolist()
        raise ValueError(f"{name} must hold token ids in [0, {vocab_size}) (config.vocab_size) or {IGNORE_INDEX} "
                         f"(ignored); found {values}.")
    return used


class MiniTxForCausalLM(MiniTxLMHeadMixin, MiniTxPreTrainedModel, GenerationMixin):
    """Decoder-only language model: next-token logits over the vocabulary."""

    _tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}

    def __init__(self, config: MiniTxConfig):
        self._check_kind(config, want_encoder_decoder=False)
        super().__init__(config)
        self.model = MiniTxModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        shift_labels: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        """(batch, seq) ids -> logits (batch, seq, vocab); with `labels` (batch, seq), the shifted LM loss.

        Labels are the input ids themselves (the shift happens here); or pass `shift_labels` (batch, seq), the
        targets already aligned with each position, which are used as they are. IGNORE_INDEX marks positions to ignore.
        Extra keyword arguments (e.g. Trainer's `num_items_in_batch`) go to the loss function.
        `return_dict=False` (or `config.return_dict=False`) returns `output.to_tuple()`.
        """
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            cache=cache_argument(cache, past_key_values), inputs_embeds=inputs_embeds, use_cache=use_cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True,
        )
        hidden_states = outputs.last_hidden_state
        if logits_to_keep:
            hidden_states = hidden_states[:, -logits_to_keep:]
        logits = self.output_logits(hidden_states)  # (batch, seq, vocab)
        loss = None
        if shift_labels is not None:
            loss = self.lm_loss(logits, shift_labels, True, "shift_labels", **kwargs)
        elif labels is not None:
            loss = self.lm_loss(logits, labels, False, "labels", **kwargs)
        output = CausalLMOutputWithPast(
            loss=loss, logits=logits, **{CACHE_NAME: getattr(outputs, CACHE_NAME)},
            hidden_states=outputs.hidden_states, attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


def shift_tokens_right(labels: torch.LongTensor, decoder_start_token_id: int, pad_token_id: int) -> torch.LongTensor:
    """Teacher forcing: decoder inputs are the labels moved one step right, starting with the start token.

    (batch, seq) -> (batch, seq); ignored labels (IGNORE_INDEX) become padding.
    """
    shifted = labels.new_full(labels.shape, decoder_start_token_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad_token_id)


class MiniTxForConditionalGeneration(MiniTxLMHeadMixin, MiniTxPreTrainedModel, GenerationMixin):
    """Encoder-decoder sequence-to-sequence model: target logits given a source sequence."""

    _tied_weights_keys = {"lm_head.weight": "model.encoder.embed_tokens.weight"}

    def __init__(self, config: MiniTxConfig):
        self._check_kind(config, want_encoder_decoder=True)
        super().__init__(config)
        self.model = MiniTxModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_encoder(self, modality: str | None = None) -> MiniTxStack:
        return self.model.encoder

    def prepare_decoder_input_ids_from_labels(self, labels: torch.LongTensor) -> torch.LongTensor:
        return shift_tokens_right(labels, self.config.decoder_start_token_id, self.config.pad_token_id)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput | tuple:
        """Source (batch, src) + decoder ids (batch, tgt) -> logits (batch, tgt, vocab).

        With `labels` (batch, tgt) and no decoder ids, the decoder input is `labels` shifted right; the loss is
        the cross-entropy of each label (IGNORE_INDEX ignored): labels are already aligned with the logits.
        `return_dict=False` (or `config.return_dict=False`) returns `output.to_tuple()`.
        """
        if "shift_labels" in kwargs:
            raise ValueError("shift_labels is for MiniTxForCausalLM; seq2seq labels are already aligned with the "
                             "decoder positions: pass them as labels.")
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if labels is not None and decoder_input_ids is None and decoder_inputs_embeds is None:
            check_labels(labels, labels.shape, "labels", self.config.vocab_size, aligned=True)  # before the shift
            decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, decoder_position_ids=decoder_position_ids,
            encoder_outputs=encoder_outputs, cache=cache_argument(cache, past_key_values), inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds, use_cache=use_cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True,
        )
        hidden_states = outputs.last_hidden_state
        if logits_to_keep:
            hidden_states = hidden_states[:, -logits_to_keep:]
        logits = self.output_logits(hidden_states)  # (batch, tgt, vocab)
        loss = self.lm_loss(logits, labels, True, "labels", **kwargs) if labels is not None else None
        output = Seq2SeqLMOutput(
            loss=loss, logits=logits, **{CACHE_NAME: getattr(outputs, CACHE_NAME)},
            decoder_hidden_states=outputs.decoder_hidden_states, decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions, encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states, encoder_attentions=outputs.encoder_attentions,
        )
        return output if return_dict else output.to_tuple()


__all__ = [
    "MiniTxPreTrainedModel",
    "MiniTxModel",
    "MiniTxForCausalLM",
    "MiniTxForConditionalGeneration",
    "shift_tokens_right",
]
