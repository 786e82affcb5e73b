"""The growing cache: a dynamic cache layer that writes each decode step's keys and values in place.

`decoding_minitx.decode_step_inputs` swaps it in (`grow_in_place`) for the length of a `generate()` call; it changes
how fast tokens come out, never which tokens.
"""

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class MiniTxGrowingLayer(DynamicLayer):
    """A dynamic cache layer that writes each step's keys and values in place into room kept ahead.

    `DynamicLayer` concatenates the whole cache on every update: each decoded token copies every cached key and
    value (O(length) per step). This layer keeps (batch, kv_heads, capacity, head_dim) buffers, doubles them when
    full and writes the new positions into them; `keys` and `values` are views of the filled part, so everything
    `DynamicLayer` does with them (beam reordering, cropping, batch selection) works as before: where such an
    operation replaced the views, the next update starts new buffers from them.
    """

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (batch, kv_heads, new, head_dim) keys and values; return all of them,
        (batch, kv_heads, len, head_dim)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length, new = self.get_seq_length(), key_states.shape[-2]
        room = self.__dict__.get("_room")
        if room is None or not self._views_of(room, length) or length + new > room[0].shape[-2]:
            room = tuple(self._grown(old, fresh, length + new) for old, fresh in
                         ((self.keys, key_states), (self.values, value_states)))
            self._room = room
        room[0][:, :, length:length + new] = key_states
        room[1][:, :, length:length + new] = value_states
        self.keys, self.values = room[0][:, :, :length + new], room[1][:, :, :length + new]  # (batch, heads, len, dim)
        return self.keys, self.values

    def _views_of(self, room: tuple[torch.Tensor, torch.Tensor], length: int) -> bool:
        """Whether `keys` and `values` are still the first `length` positions of the buffers."""
        return length > 0 and all(
            view.data_ptr() == buffer.data_ptr() and view.shape[:2] == buffer.shape[:2]
            and view.stride() == buffer.stride()
            for view, buffer in zip((self.keys, self.values), room, strict=True))

    @staticmethod
    def _grown(old: torch.Tensor, fresh: torch.Tensor, needed: int) -> torch.Tensor:
        """A (batch, heads, 2 * needed, head_dim) buffer holding `old`'s positions (none if it is empty)."""
        batch, heads, _, dim = fresh.shape
        buffer = fresh.new_empty(batch, heads, 2 * needed, dim)  # (batch, heads, capacity, head_dim)
        if old.numel():
            buffer[:, :, :old.shape[-2]] = old
        return buffer


def grow_in_place(cache: DynamicCache) -> None:
    """Swap the empty plain `DynamicLayer`s of a dynamic cache for `MiniTxGrowingLayer`s (same contract)."""
    for index, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer and not layer.is_initialized:
            cache.layers[index] = MiniTxGrowingLayer()


__all__ = ["MiniTxGrowingLayer", "grow_in_place"]
