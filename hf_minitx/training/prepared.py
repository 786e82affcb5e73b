"""``PreparedData``: what setup hands to the training loop, one typed object instead of a dict read by string."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class PreparedData:
    """What setup hands to the loop: the model-ready splits, their collator, and the texts generation is shown
    (``prompts``) or scored on (seq2seq ``sources`` and ``references``)."""

    train: Any  # packed blocks or encoded pairs (a Dataset); --streaming: the raw rows of the train stream
    validation: Any  # the scored validation rows (blocks or pairs)
    collate: Callable[[list[dict]], dict[str, torch.Tensor]]
    prompts: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    num_bytes: int | None = None  # causal LM: UTF-8 bytes of the validation text the loss covers
