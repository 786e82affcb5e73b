"""MiniTx models: the layer stack, the headless model and the two language-model heads.

- `MiniTxPreTrainedModel`: weight initialisation, the transformers class attributes, `save_pretrained` with
  the `auto_map` of every Auto class (`AUTO_MAP`).
- `MiniTxStack`: embeddings + positions + encoder or decoder layers (+ the final norm of pre-LN).
- `MiniTxModel`: a decoder-only stack, or encoder + decoder when `config.is_encoder_decoder`.
- `MiniTxForCausalLM`: decoder-only language model (GPT-style).
- `MiniTxForConditionalGeneration`: encoder-decoder sequence-to-sequence model (the paper's Transformer), and
  `shift_tokens_right`, which makes its decoder inputs from the labels.

The input checks are in `checks_minitx.py`; what both heads share (logits, loss, generate()) in
`lm_head_minitx.py`.
"""


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

from .attention_minitx import cross_attention_mask, self_attention_mask
from .checks_minitx import (
    cache_under_checkpointing,
    check_inputs,
    check_labels,
    check_lengths,
    check_model_kind,
    encoder_padding,
    resolve_output_flags,
)
from .configuration_minitx import IGNORE_INDEX, MiniTxConfig
from .decoding_minitx import CACHE_NAME, cache_argument
from .layers_minitx import (
    MiniTxDecoderLayer,
    MiniTxEncoderLayer,
    MiniTxRMSNorm,
    MiniTxScaledEmbedding,
    MiniTxUNetSkips,
    make_norm,
)
from .lm_head_minitx import MiniTxLMHeadMixin
from .positions_minitx import (
    POSITION_ENCODINGS,
    MiniTxPositionalEmbedding,
    MiniTxRotaryEmbedding,
    positions_from_mask,
    rope_inverse_frequencies,
    sinusoidal_table,
)

AUTO_MAP = {
    "AutoConfig": "configuration_minitx.MiniTxConfig",
    "AutoModel": "modeling_minitx.MiniTxModel",
    "AutoModelForCausalLM": "modeling_minitx.MiniTxForCausalLM",
    "AutoModelForSeq2SeqLM": "modeling_minitx.MiniTxForConditionalGeneration",
}


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

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """transformers' count; ``exclude_embeddings`` leaves out a learned position table too, as GPT-2's `wpe`."""
        count = super().num_parameters(only_trainable, exclude_embeddings)
        if not exclude_embeddings:
            return count
        tables = {id(module.weight): module.weight for module in self.modules()
                  if isinstance(module, MiniTxPositionalEmbedding) and module.learned}
        return count - sum(t.numel() for t in tables.values() if t.requires_grad or not only_trainable)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if module is getattr(self, "lm_head", None) and self.config.zero_init_head:
            init.zeros_(module.weight)  # every first prediction uniform: the loss starts at ln(vocab_size)
        elif (isinstance(module, nn.Linear) and self.config.zero_init_projections
              and getattr(module, "residual_output", False)):
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
        elif isinstance(module, (MiniTxRMSNorm, MiniTxUNetSkips)):
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
    the encoder of a seq2seq model (whose decoder embeds its ids with it: `MiniTxModel` points its `embed` there).
    """

    def __init__(self, config: MiniTxConfig, is_decoder: bool):
        super().__init__()
        self.config = config
        self.is_decoder = is_decoder
        if not (is_decoder and config.is_encoder_decoder):
            self.embed_tokens = MiniTxScaledEmbedding(config)
        positions = POSITION_ENCODINGS[config.position_embedding_type]
        # "embed_positions" or "rotary_emb", as saved checkpoints name it
        self.positions_attribute = positions.attribute
        setattr(self, positions.attribute, positions(config))
        self.dropout = nn.Dropout(config.hidden_dropout)
        layer_cls, num_layers = ((MiniTxDecoderLayer, config.num_hidden_layers) if is_decoder
                                 else (MiniTxEncoderLayer, config.num_encoder_layers))
        self.layers = nn.ModuleList(layer_cls(config, layer_idx) for layer_idx in range(num_layers))
        self.unet_skips = MiniTxUNetSkips(num_layers) if config.unet_skips else None
        # Post-LN ends every layer with a LayerNorm already; pre-LN needs one at the end of the stack.
        self.norm = make_norm(config) if config.norm_position == "pre" else None

    def embed(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """(batch, seq) token ids -> (batch, seq, hidden) scaled token embeddings (ids checked by `check_inputs`)."""
        return self.embed_tokens(input_ids)

    def input_padding(self, input_ids: torch.LongTensor | None, attention_mask: torch.Tensor | None,
                      inputs_embeds: torch.Tensor | None, encoder_attention_mask: torch.Tensor | None,
                      cache: Cache | None) -> tuple[bool | None, bool | None]:
        """Check the inputs (`check_inputs`); return whether the attention mask and the encoder's mask pad
        (None: not known, under torch.compile, and the masks are built as if they padded).

        `cache` is the self-attention cache of the call, unused here: for the length of a `generate()` call the
        decoder gets its own `input_padding` (`decoding_minitx.set_remembered_padding`), which answers a decode
        step with the prompt's flags instead of reading the tensors back.
        """
        prefix = "decoder_" if self.is_decoder and self.config.is_encoder_decoder else ""
        has_padding = check_inputs(self.config, input_ids, attention_mask, inputs_embeds, prefix,
                                   weights_device=next(self.parameters()).device)
        return has_padding, encoder_padding(encoder_attention_mask)

    def positions_and_masks(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None,
                            position_ids: torch.LongTensor | None, padding: tuple[bool | None, bool | None],
                            encoder_attention_mask: torch.Tensor | None, cross: bool, cache: Cache | None
                            ) -> tuple[torch.LongTensor, torch.Tensor | None, torch.Tensor | None]:
        """The new tokens' position ids, (batch or 1, q_len), and the self-attention and cross-attention masks
        (`cross`: the stack attends to an encoder), after checking the lengths against the cache and the table.

        `padding` is `input_padding`'s answer; `cache` the self-attention cache, whose filled length comes first.
        """
        has_padding, cross_padding = padding
        batch, q_len = inputs_embeds.shape[:2]
        # a static cache counts its positions in a tensor: keep it a tensor under compile (no host sync)
        past_len = cache.get_seq_length() if cache is not None else 0
        kv_len = cache.get_mask_sizes(q_len, 0)[0] if cache is not None else q_len
        if not torch.compiler.is_compiling():
            past_len = int(past_len)
            check_lengths(self.config, attention_mask, batch, q_len, past_len + q_len, kv_len)
        if position_ids is None:
            position_ids = positions_from_mask(attention_mask if has_padding is not False else None, q_len, past_len,
                                               inputs_embeds.device)
        mask = self_attention_mask(attention_mask, q_len, past_len, kv_len, causal=self.is_decoder,
                                   has_padding=has_padding, device=inputs_embeds.device)
        cross_mask = cross_attention_mask(encoder_attention_mask, q_len, cross_padding) if cross else None
        return position_ids, mask, cross_mask

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

        Checks the inputs (`input_padding`), embeds the ids (`embed`: a seq2seq decoder's reads the encoder's table),
        adds positions, then runs the layers.
        Unset output flags come from the config; `return_dict=False` returns `output.to_tuple()`.
        """
        output_attentions, output_hidden_states, return_dict = resolve_output_flags(
            self.config, output_attentions, output_hidden_states, return_dict)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        cache = cache_under_checkpointing(cache, self.layers)
        self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        padding = self.input_padding(input_ids, attention_mask, inputs_embeds, encoder_attention_mask, self_cache)
        if inputs_embeds is None:
            inputs_embeds = self.embed(input_ids)  # (batch, seq, hidden)
        position_ids, mask, cross_mask = self.positions_and_masks(
            inputs_embeds, attention_mask, position_ids, padding, encoder_attention_mask,
            encoder_hidden_states is not None, self_cache)
        # absolute positions are added here; rotary ones come back as cos/sin for the attention layers
        hidden_states, position_embeddings = getattr(self, self.positions_attribute).add_positions(
            inputs_embeds, position_ids)
        hidden_states = self.dropout(hidden_states)
        # config.value_embeddings: every layer's values read the normalised token embeddings too
        config = self.config
        token_embeddings = nn.functional.rms_norm(inputs_embeds, (config.hidden_size,), eps=config.layer_norm_eps) \
            if config.value_embeddings else None
        first_half = []  # config.unet_skips: the first half's outputs

        all_states = [hidden_states] if output_hidden_states else None
        all_attentions = [] if output_attentions else None
        all_cross = [] if output_attentions and encoder_hidden_states is not None else None
        for layer_idx, layer in enumerate(self.layers):
            if self.unet_skips is not None:
                hidden_states = self.unet_skips.add_skip(layer_idx, hidden_states, first_half)
            if self.is_decoder:
                hidden_states, weights, cross_weights = layer(hidden_states, mask, position_embeddings,
                                                              encoder_hidden_states, cross_mask, cache,
                                                              token_embeddings)
            else:
                (hidden_states, weights), cross_weights = layer(
                    hidden_states, mask, position_embeddings, token_embeddings), None
            if self.unet_skips is not None:
                self.unet_skips.keep(layer_idx, hidden_states, first_half)
            for kept, value in ((all_states, hidden_states), (all_attentions, weights), (all_cross, cross_weights)):
                if kept is not None and value is not None:  # no weights but eager's
                    kept.append(value)
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


class MiniTxModel(MiniTxPreTrainedModel):
    """The headless Transformer: a causal decoder stack, or an encoder and a decoder with cross-attention."""

    def __init__(self, config: MiniTxConfig):
        super().__init__(config)
        if config.is_encoder_decoder:
            self.encoder = MiniTxStack(config, is_decoder=False)
        self.decoder = MiniTxStack(config, is_decoder=True)
        if config.is_encoder_decoder:  # the decoder embeds with the encoder's table, also alone (`get_decoder()`)
            self.decoder.embed = self.encoder.embed
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
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        decoder_outputs = self.decoder(  # decoder ids are embedded with the encoder's embedding (shared)
            decoder_input_ids if decoder_inputs_embeds is None else None, decoder_attention_mask,
            decoder_position_ids, decoder_inputs_embeds, encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask, cache=cache if use_cache else None, **flags,
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


class MiniTxForCausalLM(MiniTxLMHeadMixin, MiniTxPreTrainedModel, GenerationMixin):
    """Decoder-only language model: next-token logits over the vocabulary."""

    _tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}

    def __init__(self, config: MiniTxConfig):
        check_model_kind(config, want_encoder_decoder=False)
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
        logits_to_keep: int | torch.Tensor = 0,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        """(batch, seq) ids -> logits (batch, seq, vocab); with `labels` (batch, seq), the shifted LM loss.

        Labels are the input ids themselves (the shift happens here); or pass `shift_labels` (batch, seq), the
        targets already aligned with each position, which are used as they are: a keyword of ``**kwargs``, as in
        transformers' models (Trainer takes every named argument with "label" in it for a label it must be given).
        IGNORE_INDEX marks positions to ignore.
        Extra keyword arguments (e.g. Trainer's `num_items_in_batch`) go to the loss function.
        `return_dict=False` (or `config.return_dict=False`) returns `output.to_tuple()`.
        """
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            cache=cache_argument(cache, past_key_values), inputs_embeds=inputs_embeds, use_cache=use_cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True,
        )
        logits = self.output_logits(outputs.last_hidden_state, logits_to_keep)  # (batch, seq or kept, vocab)
        loss, shift_labels = None, kwargs.pop("shift_labels", None)
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
        check_model_kind(config, want_encoder_decoder=True)
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
        logits_to_keep: int | torch.Tensor = 0,
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
        if labels is not None and use_cache is None:  # as BART: a scored batch keeps no cache (nor tuple slot for it)
            use_cache = False
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, decoder_position_ids=decoder_position_ids,
            encoder_outputs=encoder_outputs, cache=cache_argument(cache, past_key_values), inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds, use_cache=use_cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True,
        )
        logits = self.output_logits(outputs.last_hidden_state, logits_to_keep)  # (batch, tgt or kept, vocab)
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
