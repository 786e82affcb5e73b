"""Positional information: sinusoidal (the paper), learned (GPT-2) and rotary (RoPE).

Also the position ids of new tokens under left padding (`positions_from_mask`) and the refusal of a
`generate()` that would outgrow the position table (`check_generation_fits`).
"""

import torch
from torch import nn

from .configuration_minitx import MiniTxConfig


def sinusoidal_table(num_positions: int, dim: int) -> torch.Tensor:
    """The paper's table: PE[pos, 2i] = sin(pos / 10000^(2i/dim)), PE[pos, 2i+1] = cos(...).

    Returns a float32 (num_positions, dim) tensor.
    """
    position = torch.arange(num_positions, dtype=torch.float32)[:, None]  # (positions, 1)
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-torch.log(torch.tensor(10000.0)) / dim))
    table = torch.zeros(num_positions, dim)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


def rope_inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """Rotation speed of each pair of channels: theta^(-2i/head_dim), a float32 (head_dim // 2,) tensor."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)


class MiniTxPositionalEmbedding(nn.Module):
    """Absolute positions added to the token embeddings: a learned table or the fixed sinusoidal one.

    The sinusoidal table is a non-persistent buffer: it is not stored in checkpoints and is rebuilt by
    `MiniTxPreTrainedModel._init_weights` on load.
    """

    attribute = "embed_positions"  # the stack's attribute (and state-dict prefix) holding this module

    def __init__(self, config: MiniTxConfig):
        super().__init__()
        self.learned = config.position_embedding_type == "learned"
        if self.learned:
            self.weight = nn.Parameter(torch.empty(config.max_position_embeddings, config.hidden_size))
        else:
            table = sinusoidal_table(config.max_position_embeddings, config.hidden_size)
            self.register_buffer("weight", table, persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        """(batch | 1, seq) position ids -> (batch | 1, seq, hidden) position vectors."""
        return nn.functional.embedding(position_ids, self.weight)

    def add_positions(self, hidden_states: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Add the position vectors to (batch, seq, hidden) embeddings; nothing for the attention layers."""
        return hidden_states + self(position_ids).to(hidden_states.dtype), None


class MiniTxRotaryEmbedding(nn.Module):
    """cos/sin of the rotary angles for given positions; `apply_rotary` rotates queries and keys with them."""

    attribute = "rotary_emb"  # the stack's attribute (and state-dict prefix) holding this module

    def __init__(self, config: MiniTxConfig):
        super().__init__()
        self.theta = config.rope_theta
        self.head_dim = config.head_dim
        self.register_buffer("inv_freq", rope_inverse_frequencies(self.head_dim, self.theta), persistent=False)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(batch | 1, seq) positions -> cos, sin, each (batch | 1, 1, seq, head_dim) in `dtype`."""
        angles = position_ids[..., None].float() * self.inv_freq.float()  # (batch, seq, head_dim / 2)
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # (batch, 1, seq, head_dim)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def add_positions(
        self, hidden_states: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Leave the embeddings as they are; give the attention layers cos/sin to rotate queries and keys."""
        return hidden_states, self(position_ids, hidden_states.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (i, i + head_dim/2) of x (batch, heads, seq, head_dim) by the given angles."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)  # (batch, heads, seq, head_dim)
    return x * cos + rotated * sin


# The one seam of position encodings: config.position_embedding_type -> module. Each module has `attribute`
# (where the stack keeps it) and `add_positions(hidden_states, position_ids) -> (hidden_states, position_embeddings)`.
POSITION_ENCODINGS: dict[str, type[nn.Module]] = {
    "sinusoidal": MiniTxPositionalEmbedding,
    "learned": MiniTxPositionalEmbedding,
    "rope": MiniTxRotaryEmbedding,
}


def room_for_new_tokens(config: MiniTxConfig, used: int) -> int | None:
    """How many new tokens fit after `used` decoder positions; None where rotary positions have no table. The last
    new token is never fed back, so it needs no position: a sequence may be one longer than the table."""
    return config.max_position_embeddings + 1 - used if config.position_table else None


def check_generation_fits(config: MiniTxConfig, used: int, max_length: int, max_new_tokens: int | None) -> None:
    """Refuse, before any token is generated, a `generate()` whose sequence would outgrow the position table.

    `used` is the positions the decoder starts with (the prompt; the start token of an encoder-decoder),
    `max_length` the total length generate() will stop at. The last generated token is never fed back, so
    a sequence may be one longer than the table. Rotary positions have no table: nothing to refuse.
    """
    limit, fit = config.max_position_embeddings, room_for_new_tokens(config, used)
    if fit is None or max_length <= limit + 1:
        return
    start = "the decoder's start takes" if config.is_encoder_decoder else "the prompt takes"
    asked = f"max_new_tokens={max_new_tokens}" if max_new_tokens is not None else f"max_length={max_length}"
    fix = ("shorten the prompt" if fit < 1 else f"pass max_new_tokens={fit} or less" if max_new_tokens is not None
           else f"pass max_length={limit + 1} or less")
    raise ValueError(f"generate({asked}) does not fit: the model has max_position_embeddings={limit} "
                     f"({config.position_embedding_type} positions) and {start} {used}, so at most "
                     f"{max(fit, 0)} new tokens fit; {fix}.")


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


__all__ = [
    "check_generation_fits",
    "room_for_new_tokens",
    "positions_from_mask",
    "POSITION_ENCODINGS",
    "sinusoidal_table",
    "rope_inverse_frequencies",
    "MiniTxPositionalEmbedding",
    "MiniTxRotaryEmbedding",
    "apply_rotary",
]
