"""What the two language-model heads share (`MiniTxLMHeadMixin`): the output logits, the loss, and the entry
points of `generate()`.

The heads themselves (`MiniTxForCausalLM`, `MiniTxForConditionalGeneration`) live in `modeling_minitx.py`;
this file holds the part of them that does not depend on the kind: the logits through `lm_head` (with the
optional soft cap), the cross-entropy through transformers' `loss_function`, and `generate()` run in the decode
layout of `decoding_minitx.py`, with the position table's length check and the lean decode-step inputs.
"""

from functools import partial

import torch
from torch import nn
from transformers import GenerationConfig
from transformers.cache_utils import Cache
from transformers.utils import logging

from .checks_minitx import check_labels
from .configuration_minitx import IGNORE_INDEX
from .decoding_minitx import CACHE_NAME, cache_argument, decode_step_inputs, generate_in_decode_layout
from .positions_minitx import check_generation_fits

DEFAULT_MAX_LENGTH = GenerationConfig().max_length  # transformers' own, when nobody asked for a length

logger = logging.get_logger(__name__)


def soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """c * tanh(logits / c): the logits bounded to (-c, c), nearly unchanged well inside; None: unchanged."""
    return logits if cap is None else cap * torch.tanh(logits / cap)


class MiniTxLMHeadMixin:
    """What the two language-model heads share: `lm_head` and its logits, the loss, and generate()'s entry
    points. A mixin before `MiniTxPreTrainedModel` and `GenerationMixin`, whose methods it extends."""

    def output_logits(self, hidden_states: torch.Tensor, logits_to_keep: int | torch.Tensor = 0) -> torch.Tensor:
        """(batch, seq, hidden) -> (batch, kept, vocab): `lm_head`, then c * tanh(logits / c) with a soft cap c.

        `logits_to_keep`, as in transformers' heads: an int keeps the last that many positions (0: all), a 1-D
        tensor the positions it lists, so `generate()` computes the head for the last position only.
        """
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        return soft_cap(self.lm_head(hidden_states[:, kept]), self.config.final_logit_softcap)

    @torch.no_grad()
    def scale_output_logits(self, scale: float) -> None:
        """Multiply what `lm_head` computes by ``scale`` (before any soft cap), in the weights: those of the norm
        `lm_head` reads (the decoder's final norm with pre-LN, its last layer's with post-LN), weight and bias.

        `lm_head` has no bias, so scaling its input scales its logits exactly; a tied head stays tied, and the
        model keeps its config and its export. Temperature calibration (T = 1 / scale) is done this way.
        """
        decoder = self.model.decoder
        norm = decoder.norm if decoder.norm is not None else decoder.layers[-1].mlp_layer_norm
        norm.weight.mul_(scale)
        if getattr(norm, "bias", None) is not None:
            norm.bias.mul_(scale)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def generate(self, *args, **kwargs):
        """transformers' `generate()`, after checking `num_beams` (0 beams otherwise fails deep inside it). An asked
        `max_length` without `max_new_tokens` (a keyword, or a `generation_config` of the caller's) bounds the call,
        as with a stock model, over the `max_new_tokens` a trained folder's generation_config.json holds
        (transformers would keep that one, and warn or not).

        It runs in the decode layout (`decoding_minitx.generate_in_decode_layout`): the decoder reads its weights
        as decoding reads them fastest, the dynamic cache grows in place and remembers the prompt's padding for
        the decode steps; none of it outlives the call.
        """
        config = kwargs.get("generation_config") or (args[1] if len(args) > 1 else None) or self.generation_config
        beams = kwargs.get("num_beams", getattr(config, "num_beams", None))
        if beams is not None and (not isinstance(beams, int) or isinstance(beams, bool) or beams < 1):
            raise ValueError(f"generate(num_beams={beams!r}): num_beams must be an integer >= 1 "
                             "(1 = greedy or sampling, more = beam search).")
        own = config is self.generation_config
        theirs = not own and config.max_length != DEFAULT_MAX_LENGTH
        bounded = "max_new_tokens" not in kwargs and (own or config.max_new_tokens is None) and (
            kwargs.get("max_length") is not None or theirs)
        saved = self.generation_config.max_new_tokens
        if bounded and own:
            kwargs["max_new_tokens"] = None
        elif bounded:  # transformers fills a caller's unset fields from ours: no saved one for this call (a keyword
            self.generation_config.max_new_tokens = None  # beside a generation_config would be warned about)
        try:
            return generate_in_decode_layout(self, partial(super().generate, *args, **kwargs), config, kwargs)
        finally:
            self.generation_config.max_new_tokens = saved

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
        lean = (next_sequence_length == 1 and not is_first_iteration
                and input_ids.device == self.lm_head.weight.device)
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
        (`shift_labels`, seq2seq labels). `name` is the argument named in errors. IGNORE_INDEX marks ignored
        positions. With no labelled position at all the loss is 0 and a warning is logged (a plain mean would be
        NaN), matching what transformers' Trainer gets for such a micro-batch.
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


__all__ = ["MiniTxLMHeadMixin", "soft_cap"]
