"""MiniTx models: the layer stack, the headless model and the two language-model heads.

- `MiniTxModel`: a decoder-only stack, or encoder + decoder when `config.is_encoder_decoder`.
- `MiniTxForCausalLM`: decoder-only language model (GPT-style).
- `MiniTxForConditionalGeneration`: encoder-decoder sequence-to-sequence model (the paper's Transformer).
"""

import math

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
from .configuration_minitx import MiniTxConfig
from .layers_minitx import MiniTxDecoderLayer, MiniTxEncoderLayer
from .positions_minitx import (
    MiniTxPositionalEmbedding,
    MiniTxRotaryEmbedding,
    rope_inverse_frequencies,
    sinusoidal_table,
)

IGNORE_INDEX = -100  # label of a position the loss skips (padding): the one place this number is written

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
    _no_split_modules = ["MiniTxEncoderLayer", "MiniTxDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]

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
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
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
        if config.position_embedding_type == "rope":
            self.rotary_emb = MiniTxRotaryEmbedding(config)
        else:
            self.embed_positions = MiniTxPositionalEmbedding(config)
        self.dropout = nn.Dropout(config.hidden_dropout)
        layer_cls, num_layers = (
            (MiniTxDecoderLayer, config.num_hidden_layers) if is_decoder else (MiniTxEncoderLayer, config.num_encoder_layers)
        )
        self.layers = nn.ModuleList(layer_cls(config, layer_idx) for layer_idx in range(num_layers))
        # Post-LN ends every layer with a LayerNorm already; pre-LN needs one at the end of the stack.
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.norm_position == "pre" else None

    def embed(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """(batch, seq) token ids -> (batch, seq, hidden) scaled token embeddings; checks the ids."""
        if not torch.compiler.is_compiling() and input_ids.numel():
            low, high = int(input_ids.min()), int(input_ids.max())
            if low < 0 or high >= self.config.vocab_size:
                raise ValueError(
                    f"Token ids must lie in [0, {self.config.vocab_size}) (config.vocab_size), got values in "
                    f"[{low}, {high}]. Was the input encoded with another tokenizer?"
                )
        return self.embed_tokens(input_ids) * self.embed_scale

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = True,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """Run the stack on ids (batch, seq) or embeddings (batch, seq, hidden); returns per-position states."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if inputs_embeds is None:
            inputs_embeds = self.embed(input_ids)
        batch, q_len = inputs_embeds.shape[:2]
        self_cache = past_key_values.self_attention_cache if isinstance(past_key_values, EncoderDecoderCache) else past_key_values
        past_len = self_cache.get_seq_length() if self_cache is not None else 0
        kv_len = self_cache.get_mask_sizes(q_len, 0)[0] if self_cache is not None else q_len
        self._check_lengths(attention_mask, batch, past_len + q_len, kv_len)
        if position_ids is None:
            position_ids = positions_from_mask(attention_mask, q_len, past_len, inputs_embeds.device)

        hidden_states = inputs_embeds
        position_embeddings = None
        if self.config.position_embedding_type == "rope":
            position_embeddings = self.rotary_emb(position_ids, hidden_states.dtype)
        else:
            hidden_states = hidden_states + self.embed_positions(position_ids).to(hidden_states.dtype)
        hidden_states = self.dropout(hidden_states)

        mask = self_attention_mask(attention_mask, q_len, past_len, kv_len, causal=self.is_decoder)
        cross_mask = cross_attention_mask(encoder_attention_mask, q_len) if encoder_hidden_states is not None else None
        all_states = [hidden_states] if output_hidden_states else None
        all_attentions = [] if output_attentions else None
        all_cross = [] if output_attentions and encoder_hidden_states is not None else None
        for layer in self.layers:
            if self.is_decoder:
                hidden_states, weights, cross_weights = layer(
                    hidden_states, mask, position_embeddings, encoder_hidden_states, cross_mask,
                    past_key_values=past_key_values,
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
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            past_key_values=past_key_values if self.is_decoder else None,
            hidden_states=tuple(all_states) if all_states is not None else None,
            attentions=tuple(all_attentions) if all_attentions is not None else None,
            cross_attentions=tuple(all_cross) if all_cross is not None else None,
        )

    def _check_lengths(self, attention_mask: torch.Tensor | None, batch: int, total_len: int, kv_len: int) -> None:
        if self.config.position_embedding_type != "rope" and total_len > self.config.max_position_embeddings:
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
    attention_mask: torch.Tensor | None, q_len: int, past_len: int, device: torch.device
) -> torch.LongTensor:
    """Position ids of the new tokens: count only real tokens, so left padding does not shift positions.

    Returns (batch, q_len), or (1, q_len) when there is no padding mask.
    """
    if attention_mask is None or attention_mask.dim() != 2:
        return torch.arange(past_len, past_len + q_len, device=device)[None]  # (1, q_len)
    positions = attention_mask.long().cumsum(-1) - 1  # (batch, past + q_len)
    positions = positions.clamp(min=0)
    return positions[:, past_len : past_len + q_len]


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
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions | Seq2SeqModelOutput:
        """Decoder-only: (batch, seq) ids -> states. Seq2seq: source ids + decoder ids -> decoder states."""
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        flags = {"output_attentions": output_attentions, "output_hidden_states": output_hidden_states}
        if not self.config.is_encoder_decoder:
            if use_cache and past_key_values is None:
                past_key_values = DynamicCache(config=self.config)
            return self.decoder(input_ids, attention_mask, position_ids, inputs_embeds,
                                past_key_values=past_key_values if use_cache else None, **flags)

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
            decoder_inputs_embeds = self.encoder.embed(decoder_input_ids)
        if use_cache and past_key_values is None:
            past_key_values = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        decoder_outputs = self.decoder(
            None, decoder_attention_mask, decoder_position_ids, decoder_inputs_embeds,
            encoder_hidden_states=encoder_outputs.last_hidden_state, encoder_attention_mask=attention_mask,
            past_key_values=past_key_values if use_cache else None, **flags,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            past_key_values=decoder_outputs.past_key_values,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class MiniTxLMHeadMixin:
    """Shared `lm_head` handling of the two language-model heads."""

    def _check_kind(self, config: MiniTxConfig, want_encoder_decoder: bool) -> None:
        if config.is_encoder_decoder != want_encoder_decoder:
            kind = "an encoder-decoder" if config.is_encoder_decoder else "a decoder-only"
            use = "AutoModelForSeq2SeqLM / MiniTxForConditionalGeneration" if config.is_encoder_decoder else (
                "AutoModelForCausalLM / MiniTxForCausalLM")
            raise ValueError(f"This checkpoint is {kind} MiniTx model (is_encoder_decoder={config.is_encoder_decoder}); "
                             f"load it with {use}.")

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value


def token_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0, reduction: str = "mean"
) -> torch.Tensor:
    """Cross-entropy of labelled positions; labels equal to IGNORE_INDEX (padding) are left out.

    logits (batch, seq, vocab) and labels (batch, seq) are already aligned (logits[t] predicts labels[t]).
    ``reduction``: "mean" over labelled tokens (a scalar), "sum" (a scalar), or "none" (batch, seq) with 0
    at ignored positions. The package's one cross-entropy: the heads and the trainer both call it.
    """
    flat_logits = logits.float().reshape(-1, logits.size(-1))  # (batch * seq, vocab)
    losses = nn.functional.cross_entropy(
        flat_logits, labels.reshape(-1), ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing,  # (batch * seq,)
        reduction=reduction,
    )
    return losses.reshape(labels.shape) if reduction == "none" else losses  # (batch, seq) or scalar


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
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """(batch, seq) ids -> logits (batch, seq, vocab); with `labels` (batch, seq), the shifted LM loss.

        Labels are the input ids themselves (the shift happens here); IGNORE_INDEX marks positions to ignore.
        """
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
        )
        hidden_states = outputs.last_hidden_state
        if logits_to_keep:
            hidden_states = hidden_states[:, -logits_to_keep:]
        logits = self.lm_head(hidden_states)  # (batch, seq, vocab)
        loss = None
        if labels is not None:
            # Shift the labels, not the logits: slicing the (batch, seq, vocab) logits would copy them forward
            # and backward. The padded last position is ignored (IGNORE_INDEX), so the mean is over the same positions.
            shifted = nn.functional.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)  # (batch, seq)
            loss = token_cross_entropy(logits, shifted)
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states, attentions=outputs.attentions,
        )


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
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        """Source (batch, src) + decoder ids (batch, tgt) -> logits (batch, tgt, vocab).

        With `labels` (batch, tgt) and no decoder ids, the decoder input is `labels` shifted right; the loss is
        the cross-entropy of each label (IGNORE_INDEX ignored).
        """
        if labels is not None and decoder_input_ids is None and decoder_inputs_embeds is None:
            decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, decoder_position_ids=decoder_position_ids,
            encoder_outputs=encoder_outputs, past_key_values=past_key_values, inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds, use_cache=use_cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
        )
        hidden_states = outputs.last_hidden_state
        if logits_to_keep:
            hidden_states = hidden_states[:, -logits_to_keep:]
        logits = self.lm_head(hidden_states)  # (batch, tgt, vocab)
        loss = token_cross_entropy(logits, labels) if labels is not None else None
        return Seq2SeqLMOutput(
            loss=loss, logits=logits, past_key_values=outputs.past_key_values,
            decoder_hidden_states=outputs.decoder_hidden_states, decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions, encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states, encoder_attentions=outputs.encoder_attentions,
        )


__all__ = [
    "MiniTxPreTrainedModel",
    "MiniTxModel",
    "MiniTxForCausalLM",
    "MiniTxForConditionalGeneration",
    "shift_tokens_right",
]
