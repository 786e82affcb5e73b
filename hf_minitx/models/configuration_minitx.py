"""MiniTxConfig: the one configuration shared by the decoder-only and the encoder-decoder model."""

import contextlib
import contextvars
import difflib
import math
from typing import NamedTuple

from transformers import PretrainedConfig
from transformers.utils import logging

logger = logging.get_logger(__name__)
_LOADING = contextvars.ContextVar("minitx_config_loading", default=False)  # True while a saved config is read


@contextlib.contextmanager
def _loading():
    """Mark the configs built inside as read from a saved file (their extra keys are not typos)."""
    token = _LOADING.set(True)
    try:
        yield
    finally:
        _LOADING.reset(token)

HIDDEN_ACTS = ("gelu", "relu", "relu2", "swiglu")  # the feed-forwards of layers_minitx.ACTIVATIONS
NORM_POSITIONS = ("pre", "post")
NORM_TYPES = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}  # name -> how the card writes it; see layers_minitx.NORMS


class PositionKind(NamedTuple):
    """What the rest of the package needs to know of a position encoding, without building it."""

    description: str  # how the model card names it
    table: bool  # a table of max_position_embeddings rows (longer inputs are refused), or rotary (no limit)


# name -> kind; each name has its module in positions_minitx.POSITION_ENCODINGS
POSITION_KINDS = {
    "sinusoidal": PositionKind("sinusoidal (fixed)", table=True),
    "learned": PositionKind("learned absolute", table=True),
    "rope": PositionKind("rotary (RoPE)", table=False),
}
POSITION_EMBEDDING_TYPES = tuple(POSITION_KINDS)
IGNORE_INDEX = -100  # label value the loss skips (padding, prompt tokens)
# The optional pieces of the data-limited recipes: each a bool field, off by default, and how the card names it.
# Stock architectures have none of them (hub/export.py refuses a model that has one on).
EXTRA_PIECES = {
    "attention_gate": "a per-head sigmoid gate on each attention output",
    "value_embeddings": "values plus a projection of the token embeddings",
    "unet_skips": "U-net skips from the first half of the layers to the second",
}
BOOL_FIELDS = ("attention_bias", "scale_embeddings", "tie_word_embeddings", "is_encoder_decoder", "use_cache",
               "qk_norm", "zero_init_head", "zero_init_projections", *EXTRA_PIECES)
HF_KEYWORDS = ("tie_encoder_decoder",)  # PretrainedConfig keywords that look like one of our fields
# other architectures' names for our fields (GPT-2, T5/BART, Llama): a keyword of theirs is named with ours
OTHER_NAMES = {"n_layer": "num_hidden_layers", "num_layers": "num_hidden_layers", "n_head": "num_attention_heads",
               "num_heads": "num_attention_heads", "n_embd": "hidden_size", "d_model": "hidden_size",
               "n_inner": "intermediate_size", "d_ff": "intermediate_size", "ffn_dim": "intermediate_size",
               "n_positions": "max_position_embeddings", "layer_norm_epsilon": "layer_norm_eps",
               "rms_norm_eps": "layer_norm_eps", "activation_function": "hidden_act", "dropout": "hidden_dropout",
               "encoder_layers": "num_encoder_layers", "decoder_layers": "num_decoder_layers"}
FLOAT_FIELDS = ("rope_theta", "hidden_dropout", "attention_dropout", "layer_norm_eps", "initializer_range")


class MiniTxConfig(PretrainedConfig):
    r"""Configuration of a MiniTx model, decoder-only (`is_encoder_decoder=False`) or encoder-decoder.

    Field names follow Hugging Face conventions so that tools (PEFT, device maps, `generate()`) find them.

    Args:
        vocab_size: number of token ids.
        hidden_size: width of the residual stream (the paper's d_model).
        num_hidden_layers: decoder layers of a decoder-only model; for an encoder-decoder it is set to
            `num_decoder_layers` (the cache counts decoder layers).
        num_attention_heads: query heads per attention layer.
        num_key_value_heads: key/value heads (grouped-query attention); defaults to `num_attention_heads`.
        intermediate_size: hidden width of the feed-forward block; defaults to `4 * hidden_size`.
        max_position_embeddings: longest sequence the positional encoding supports.
        hidden_act: feed-forward activation: "gelu", "relu", "relu2" (relu(x)^2) or "swiglu" (a gated
            feed-forward fc2(silu(gate_proj(x)) * fc1(x)), with a third matrix `gate_proj`).
        norm_position: "pre" (norm before each sub-layer, GPT-2 style) or "post" (the paper's
            LayerNorm(x + sublayer(x))).
        norm_type: "layernorm" (subtract the mean, divide by the standard deviation, scale and shift) or
            "rmsnorm" (divide by the root mean square, scale; no mean, no bias).
        qk_norm: normalise each head's queries and keys (a `norm_type` norm over head_dim, `q_norm`/`k_norm`)
            right after their projections, before the rotary positions; in cross-attention too.
        zero_init_head: start the output projection (`lm_head`) at zero, so every first prediction is uniform;
            needs `tie_word_embeddings=False`.
        zero_init_projections: start the output projection of every sub-layer (attention `o_proj`, feed-forward
            `fc2`) at zero, so each block starts as the identity and the residual stream as the embeddings.
        final_logit_softcap: None, or a cap c > 0: logits = c * tanh(logits / c) stay inside (-c, c).
        attention_gate: multiply each head's attention output by sigmoid of a projection of the layer's input
            (`head_gate`, one value per head and position), before `o_proj`.
        value_embeddings: add to each self-attention layer's values a projection (`value_embed_proj`) of the
            token embeddings, normalised: every layer reads the tokens themselves as well as the residual stream.
        unet_skips: add the output of each layer of the first half to the input of its mirror in the second half
            (the first layer's to the last), times a learned weight per skip (`unet_skips.weight`, starting at 1).
        position_embedding_type: "sinusoidal" (the paper), "learned" (GPT-2) or "rope" (rotary).
        rope_theta: base of the rotary frequencies.
        hidden_dropout: dropout on embeddings and on each sub-layer output before the residual add.
        attention_dropout: dropout on the attention weights.
        layer_norm_eps: epsilon of every LayerNorm.
        initializer_range: standard deviation of the normal weight initialisation.
        attention_bias: whether q/k/v/o projections and the feed-forward layers carry biases.
        scale_embeddings: multiply token embeddings by sqrt(hidden_size), as in the paper.
        tie_word_embeddings: share the token embedding matrix with the output projection (`lm_head`).
        is_encoder_decoder: build the seq2seq model (encoder + decoder with cross-attention).
        num_encoder_layers / num_decoder_layers: layer counts of the seq2seq stacks (default
            `num_hidden_layers`).
        bos_token_id / eos_token_id / pad_token_id / decoder_start_token_id: special token ids;
            `decoder_start_token_id` defaults to `bos_token_id`.
    """

    model_type = "minitx"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]  # the cache, by its name from 5.24 and before

    vocab_size: int = 8192
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    intermediate_size: int | None = None
    max_position_embeddings: int = 512
    hidden_act: str = "gelu"
    norm_position: str = "pre"
    norm_type: str = "layernorm"
    qk_norm: bool = False
    zero_init_head: bool = False
    zero_init_projections: bool = False
    final_logit_softcap: float | None = None
    attention_gate: bool = False
    value_embeddings: bool = False
    unet_skips: bool = False
    position_embedding_type: str = "learned"
    rope_theta: float = 10000.0
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    attention_bias: bool = True
    scale_embeddings: bool = False
    tie_word_embeddings: bool = True
    is_encoder_decoder: bool = False
    num_encoder_layers: int | None = None
    num_decoder_layers: int | None = None
    use_cache: bool = True
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    pad_token_id: int | None = 0
    decoder_start_token_id: int | None = None

    def __post_init__(self, **kwargs):
        if not _LOADING.get():
            self._warn_misspelled(kwargs)
        self._check_types()
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.decoder_start_token_id is None:
            self.decoder_start_token_id = self.bos_token_id
        if self.is_encoder_decoder:
            if self.num_encoder_layers is None:
                self.num_encoder_layers = self.num_hidden_layers
            if self.num_decoder_layers is None:
                self.num_decoder_layers = self.num_hidden_layers
            self.num_hidden_layers = self.num_decoder_layers
        elif self.num_decoder_layers is not None:
            self.num_hidden_layers = self.num_decoder_layers
        super().__post_init__(**kwargs)
        self._check()

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """`PretrainedConfig.from_dict` (what `from_pretrained` uses), without the near-miss warning: a saved
        config's extra keys were set on purpose (by code, or by transformers' own tests) and come back as saved."""
        with _loading():
            return super().from_dict(config_dict, **kwargs)

    @classmethod
    def from_json_file(cls, json_file):
        """`PretrainedConfig.from_json_file`, quiet about saved extra keys as `from_dict` is."""
        with _loading():
            return super().from_json_file(json_file)

    @classmethod
    def _warn_misspelled(cls, kwargs: dict) -> None:
        """One warning line for unknown keywords close to one of MiniTx's own fields (``hiden_size``) or another
        architecture's name for one (``n_layer``), naming the field each stands for. Like every unknown keyword
        they are kept as PretrainedConfig keeps them (an extra attribute that round-trips through config.json)
        but change nothing in the model."""
        ours = list(cls.__annotations__)
        hints = []
        for key in kwargs:
            if key in ours or key.startswith("_") or key.endswith("_token_id") or key in HF_KEYWORDS:
                continue
            close = [OTHER_NAMES[key]] if key in OTHER_NAMES else difflib.get_close_matches(key, ours, n=1, cutoff=0.8)
            if close:
                hints.append(f"{key!r} (did you mean {close[0]!r}?)")
        if hints:
            many = len(hints) > 1
            logger.warning(f"MiniTxConfig got unknown keyword{'s' if many else ''} {', '.join(hints)}: kept as "
                           f"{'extra attributes; they change' if many else 'an extra attribute; it changes'} "
                           "nothing in the model.")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads

    @property
    def position_table(self) -> bool:
        """Whether positions come from a table of `max_position_embeddings` rows (False: rotary, no limit)."""
        return POSITION_KINDS[self.position_embedding_type].table

    def _check_types(self) -> None:
        """Raise ValueError for fields of the wrong type (e.g. the string "false" for a bool), before any use.

        Layer counts given explicitly are checked here too, so a bad one is reported under its own name rather
        than under `num_hidden_layers`, which it would overwrite.
        """
        for name in BOOL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"MiniTxConfig.{name} must be True or False, got {value!r} ({type(value).__name__}).")
        for name in FLOAT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"MiniTxConfig.{name} must be a number, got {value!r} ({type(value).__name__}).")
        for name in ("num_encoder_layers", "num_decoder_layers"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise ValueError(f"MiniTxConfig.{name} must be a positive integer (or None for num_hidden_layers), "
                                 f"got {value!r}.")

    def _check(self) -> None:
        """Raise ValueError for settings no model can be built from."""
        choices = {
            "hidden_act": HIDDEN_ACTS,
            "norm_position": NORM_POSITIONS,
            "norm_type": NORM_TYPES,
            "position_embedding_type": POSITION_EMBEDDING_TYPES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in tuple(allowed):
                raise ValueError(f"MiniTxConfig.{name}={getattr(self, name)!r} is not supported; choose one of "
                                 f"{tuple(allowed)}.")
        positive = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "intermediate_size", "max_position_embeddings"]
        if self.is_encoder_decoder:
            positive += ["num_encoder_layers", "num_decoder_layers"]
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"MiniTxConfig.{name} must be a positive integer, got {value!r}.")
        if not self.is_encoder_decoder and self.num_encoder_layers is not None:
            raise ValueError("MiniTxConfig.num_encoder_layers is only used with is_encoder_decoder=True; "
                             "leave it unset for a decoder-only model.")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"MiniTxConfig.hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                             f"({self.num_attention_heads}); e.g. hidden_size={self.num_attention_heads * 64}.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"MiniTxConfig.num_attention_heads ({self.num_attention_heads}) must be divisible by "
                             f"num_key_value_heads ({self.num_key_value_heads}).")
        if not self.position_table and self.head_dim % 2:
            raise ValueError(f"MiniTxConfig: rotary positions need an even head dimension, got {self.head_dim}.")
        if self.position_embedding_type == "sinusoidal" and self.hidden_size % 2:
            raise ValueError(f"MiniTxConfig: sinusoidal positions need an even hidden_size, got {self.hidden_size}.")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"MiniTxConfig.{name} must be in [0, 1), got {getattr(self, name)}.")
        for name, zero_ok in (("layer_norm_eps", False), ("rope_theta", False), ("initializer_range", True)):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
                raise ValueError(f"MiniTxConfig.{name} must be a finite number {'>= 0' if zero_ok else '> 0'}, "
                                 f"got {value}.")
        for name in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"MiniTxConfig.{name} must be an integer token id or None, got {value!r}.")
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"MiniTxConfig.{name}={value} is outside the vocabulary [0, {self.vocab_size}).")
        self._check_head()

    def _check_head(self) -> None:
        """The output head's options: a zero start needs an untied head; a soft cap is a finite number > 0."""
        if self.zero_init_head and self.tie_word_embeddings:
            raise ValueError("MiniTxConfig.zero_init_head=True would zero the token embeddings too, which the head "
                             "shares; set tie_word_embeddings=False with it.")
        cap = self.final_logit_softcap
        if cap is not None and (not isinstance(cap, (int, float)) or isinstance(cap, bool) or not math.isfinite(cap)
                                or cap <= 0):
            raise ValueError(f"MiniTxConfig.final_logit_softcap must be None (no cap) or a finite number > 0 "
                             f"(e.g. 30.0), got {cap!r}.")


__all__ = ["MiniTxConfig", "IGNORE_INDEX", "POSITION_KINDS", "EXTRA_PIECES"]
