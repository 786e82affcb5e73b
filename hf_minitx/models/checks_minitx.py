"""The input checks of the models: each refuses, with the reason and the fix, what no model could use.

Ids, embeddings and padding masks (`check_inputs`), their lengths against the cache and the position table
(`check_lengths`), labels against the logits (`check_labels`), whether an encoder mask pads
(`encoder_padding`), the model class against the checkpoint's kind (`check_model_kind`), and the output
flags of a call against the config (`resolve_output_flags`). They run before
any layer so that a bad input fails with a message naming the argument instead of an index error deep inside;
the value checks of one call share one device-to-host copy, and under torch.compile they check nothing (no host
sync in the graph).
"""

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.utils import logging

from .configuration_minitx import IGNORE_INDEX, MiniTxConfig

logger = logging.get_logger(__name__)


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


def check_lengths(
    config: MiniTxConfig, attention_mask: torch.Tensor | None, batch: int, q_len: int, total_len: int, kv_len: int
) -> None:
    """Positions within the table; a 2-D mask (batch, cached + new) or a 4-D one (batch|1, 1|heads, new, keys).

    `q_len` new positions after the cache's, `total_len` cached + new, `kv_len` the keys attention reads (a
    static cache reads its whole length).
    """
    if attention_mask is not None and attention_mask.dim() == 4:
        mask_batch, mask_heads, mask_q, mask_k = attention_mask.shape
        if (mask_batch not in (1, batch) or mask_heads not in (1, config.num_attention_heads)
                or mask_q != q_len or mask_k != kv_len):
            raise ValueError(
                f"a 4-D attention_mask must be (batch or 1, 1 or heads, query, keys) = ({batch}, 1, {q_len}, "
                f"{kv_len}) for this input, got {tuple(attention_mask.shape)}; pass the 2-D (batch, seq) mask "
                "the tokenizer returned and let the model build the 4-D one.")
    if config.position_table and total_len > config.max_position_embeddings:
        raise ValueError(
            f"Sequence of {total_len} positions is longer than max_position_embeddings="
            f"{config.max_position_embeddings} of this model ({config.position_embedding_type} "
            "positions). Truncate the input (e.g. tokenizer(..., truncation=True, max_length=...))."
        )
    if attention_mask is not None and attention_mask.dim() == 2 and (
        attention_mask.shape[0] != batch or attention_mask.shape[1] not in (total_len, kv_len)
    ):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but the input needs ({batch}, {total_len}) "
            "(batch, cached + new positions). Pass the mask the tokenizer returned with these input_ids."
        )


def check_labels(
    labels: torch.Tensor, positions: torch.Size, name: str, vocab_size: int, aligned: bool
) -> bool | None:
    """Raise ValueError for labels that do not fit the logits; return whether any position is labelled.

    labels (batch, seq) must match the logits' `positions` (batch, seq) and hold ids in [0, vocab_size) or
    IGNORE_INDEX. Labels not yet aligned lose their first position to the shift. One host sync; skipped (None)
    under torch.compile.
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


def encoder_padding(encoder_attention_mask: torch.Tensor | None) -> bool | None:
    """Whether the source mask (batch, src) holds padding: False without a mask, None under torch.compile
    (no host sync: the cross-attention mask is then built as if it padded)."""
    if encoder_attention_mask is None:
        return False
    if torch.compiler.is_compiling():
        return None
    return not bool(encoder_attention_mask.all())


def check_model_kind(config: MiniTxConfig, want_encoder_decoder: bool) -> None:
    """Refuse a checkpoint of the other kind (decoder-only vs encoder-decoder), naming the class that loads it."""
    if config.is_encoder_decoder != want_encoder_decoder:
        kind = "an encoder-decoder" if config.is_encoder_decoder else "a decoder-only"
        use = "AutoModelForSeq2SeqLM / MiniTxForConditionalGeneration" if config.is_encoder_decoder else (
            "AutoModelForCausalLM / MiniTxForCausalLM")
        raise ValueError(f"This checkpoint is {kind} MiniTx model (is_encoder_decoder={config.is_encoder_decoder}); "
                         f"load it with {use}.")


def resolve_output_flags(
    config: MiniTxConfig, output_attentions: bool | None, output_hidden_states: bool | None, return_dict: bool | None
) -> tuple[bool, bool, bool]:
    """A flag passed to forward wins; one left as None takes the config's value, as in every transformers model.

    Attention weights come from `eager` only: under another implementation `output_attentions` gives empty tuples
    and a warning that names the fix, as transformers' own models do.
    """
    output_attentions = config.output_attentions if output_attentions is None else output_attentions
    if output_attentions and config._attn_implementation != "eager":
        logger.warning_once(f"{config._attn_implementation} attention returns no attention weights, so "
                            "output_attentions=True gives empty tuples; load the model with "
                            "attn_implementation='eager' (or call model.set_attn_implementation('eager')) for them")
    return (
        output_attentions,
        config.output_hidden_states if output_hidden_states is None else output_hidden_states,
        config.return_dict if return_dict is None else return_dict,
    )


def cache_under_checkpointing(cache: Cache | None, layers: nn.ModuleList) -> Cache | None:
    """The cache a stack's layers may write: none while gradient checkpointing recomputes them in a backward (the
    recompute would write every key and value again), with transformers' warning; `cache` otherwise."""
    checkpointing = len(layers) > 0 and layers[0].gradient_checkpointing and layers[0].training
    if cache is None or not (checkpointing and torch.is_grad_enabled()):
        return cache
    logger.warning_once("Caching is incompatible with gradient checkpointing: the model runs without a cache "
                        "(use_cache=False)")
    return None


__all__ = [
    "cache_under_checkpointing", "check_inputs", "check_labels", "check_lengths", "check_model_kind",
    "encoder_padding", "resolve_output_flags",
]
