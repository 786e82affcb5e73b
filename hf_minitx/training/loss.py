"""What the trainer optimises and reports: token cross-entropy sums, so that a loss can be normalised by
the real token count of a whole accumulation window (across micro-batches and processes) instead of
averaging per micro-batch means.

The cross-entropy itself is the model's (``token_cross_entropy`` in ``models/modeling_minitx.py``, the one
place it is written, as Hub custom code may import nothing outside ``models/``); ``Objective`` only says
how a task lines labels up with logits and what the model is called with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.modeling_minitx import IGNORE_INDEX, token_cross_entropy

TASKS = ("causal-lm", "seq2seq")


def align_labels(logits: torch.Tensor, labels: torch.Tensor, shift: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair each logit row with the label it predicts.

    logits (batch, seq, vocab), labels (batch, seq). Causal LM (``shift=True``): position t predicts
    label t+1, so the labels move one place left and the last position gets ``IGNORE_INDEX``. The logits are
    left whole: slicing off their last row would copy them, and its backward would write a zero-filled
    (batch, seq, vocab) gradient, the largest tensors of a small model's step. Seq2seq labels are already aligned.
    """
    if shift:
        return logits, torch.nn.functional.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)  # (batch, seq)
    return logits, labels


def count_label_tokens(labels: torch.Tensor, shift: bool) -> torch.Tensor:
    """Number of labelled (not IGNORE_INDEX) positions the loss is computed over; labels (batch, seq) -> scalar."""
    if shift:
        labels = labels[:, 1:]
    return (labels != IGNORE_INDEX).sum()


def sequence_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, *, shift: bool, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy (nats) and labelled-token count of each row: two (batch,) tensors.

    The trainer sums the rows of a micro-batch; evaluation gathers them across processes.
    """
    logits, labels = align_labels(logits, labels, shift)
    losses = token_cross_entropy(logits, labels, label_smoothing, reduction="none")  # (batch, seq)
    return losses.sum(dim=1), (labels != IGNORE_INDEX).sum(dim=1)


@dataclass(frozen=True)
class Objective:
    """How a task is scored, decided once from ``--task``.

    ``shift``: causal LM predicts the next token (labels are the inputs); seq2seq labels are the targets,
    already aligned with the decoder's positions.
    """

    shift: bool
    label_smoothing: float = 0.0

    @classmethod
    def for_task(cls, task: str, label_smoothing: float = 0.0) -> Objective:
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")
        return cls(shift=task == "causal-lm", label_smoothing=label_smoothing)

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What the model is called with: the whole batch for seq2seq (the model builds its decoder inputs
        from the labels), the batch without labels for causal LM (the loss is computed here, not twice)."""
        return {key: value for key, value in batch.items() if key != "labels" or not self.shift}

    def label_tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Positions the loss is computed over in one batch: a scalar tensor."""
        return count_label_tokens(batch["labels"], self.shift)

    def input_tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Real tokens the model read: labelled causal positions, or source + target tokens for seq2seq."""
        labelled = (batch["labels"] != IGNORE_INDEX).sum()
        return labelled if self.shift else batch["attention_mask"].sum() + labelled

    def summed_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Sum of the (optionally label-smoothed) cross-entropy over the batch's labelled positions: a scalar.

        logits (batch, seq, vocab), labels (batch, seq).
        """
        nats, _ = sequence_cross_entropy(logits, labels, shift=self.shift, label_smoothing=self.label_smoothing)
        return nats.sum()
