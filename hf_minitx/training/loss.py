"""Token-level cross-entropy sums, so that a loss can be normalised by the real token count of a whole
accumulation window (across micro-batches and processes) instead of averaging per micro-batch means."""

from __future__ import annotations

import torch
from torch import nn

IGNORE_INDEX = -100


def align_labels(logits: torch.Tensor, labels: torch.Tensor, shift: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair each logit row with the label it predicts.

    logits (batch, seq, vocab), labels (batch, seq). Causal LM (``shift=True``): position t predicts
    label t+1, so logits lose their last row and labels their first; seq2seq labels are already aligned.
    """
    if shift:
        return logits[:, :-1], labels[:, 1:]
    return logits, labels


def count_label_tokens(labels: torch.Tensor, shift: bool) -> torch.Tensor:
    """Number of labelled (not -100) positions the loss is computed over; labels (batch, seq) -> scalar."""
    if shift:
        labels = labels[:, 1:]
    return (labels != IGNORE_INDEX).sum()


def per_sequence_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, *, shift: bool, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy (nats) and labelled-token count of each row: two (batch,) tensors."""
    logits, labels = align_labels(logits, labels, shift)
    batch, length = labels.shape
    losses = nn.functional.cross_entropy(
        logits.float().reshape(batch * length, -1), labels.reshape(-1),  # (batch * seq, vocab)
        ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing, reduction="none",
    ).reshape(batch, length)  # (batch, seq)
    return losses.sum(dim=1), (labels != IGNORE_INDEX).sum(dim=1)


def summed_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, *, shift: bool, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Sum over every labelled position of the (optionally label-smoothed) cross-entropy: a scalar."""
    logits, labels = align_labels(logits, labels, shift)
    return nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1),  # (batch * seq, vocab)
        ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing, reduction="sum",
    )
