"""What the trainer optimises and reports: token cross-entropy sums, so that a loss can be normalised by
the real token count of a whole accumulation window (across micro-batches and processes) instead of
averaging per micro-batch means.

``token_cross_entropy`` is the trainer's one cross-entropy; the heads use transformers'
``self.loss_function`` (tests check they agree). ``summed_kl_divergence`` is the distillation term beside it
(``--distill_from``), summed over the same labelled positions. ``Objective`` says how a task lines labels up with logits
and what the model is called with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..data.corpus import TASKS
from ..models.configuration_minitx import IGNORE_INDEX, MiniTxConfig
from ..models.modeling_minitx import shift_tokens_right


def token_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0, reduction: str = "mean"
) -> torch.Tensor:
    """Cross-entropy of labelled positions; labels equal to IGNORE_INDEX (padding) are left out.

    logits (batch, seq, vocab) and labels (batch, seq) are already aligned (logits[t] predicts labels[t]).
    ``reduction``: "mean" over labelled tokens (a scalar), "sum" (a scalar), or "none" (batch, seq) with 0
    at ignored positions. The trainer's one cross-entropy; the heads use transformers' ``self.loss_function``,
    which agrees with it.
    """
    flat_logits = logits.float().reshape(-1, logits.size(-1))  # (batch * seq, vocab)
    losses = nn.functional.cross_entropy(
        flat_logits, labels.reshape(-1), ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing,  # (batch * seq,)
        reduction=reduction,
    )
    return losses.reshape(labels.shape) if reduction == "none" else losses  # (batch, seq) or scalar


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


def summed_kl_divergence(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor, *, shift: bool,
    temperature: float = 1.0,
) -> torch.Tensor:
    """KL(teacher_T || student_T) summed over the labelled positions (those ``sequence_cross_entropy`` scores):
    a scalar, so that the trainer normalises it by the window's label tokens as it does the cross-entropy.

    student_logits and teacher_logits (batch, seq, vocab), labels (batch, seq); both distributions are the
    softmax of logits / ``temperature``. Only labelled rows are softened, so padding costs nothing.
    """
    student_logits, labels = align_labels(student_logits, labels, shift)
    labelled = labels != IGNORE_INDEX  # (batch, seq)
    student = torch.log_softmax(student_logits[labelled].float() / temperature, dim=-1)  # (labelled, vocab)
    teacher = torch.log_softmax(teacher_logits[labelled].float() / temperature, dim=-1)  # (labelled, vocab)
    return nn.functional.kl_div(student, teacher, reduction="sum", log_target=True)


def replace_tokens(input_ids: torch.LongTensor, share: float) -> torch.LongTensor:
    """(batch, seq) ids with each replaced, with probability `share`, by a token drawn from the same batch: noise
    with the text's own unigram frequencies (Xie et al., 2017), which needs no vocabulary size.

    The draws come from torch's global generator, which checkpoints save and a resume restores, so a resumed run
    replaces the same tokens as an unbroken one.
    """
    replaced = torch.rand(input_ids.shape, device=input_ids.device) < share  # (batch, seq)
    flat = input_ids.reshape(-1)  # (batch * seq,)
    drawn = flat[torch.randint(flat.numel(), input_ids.shape, device=input_ids.device)]  # (batch, seq)
    return torch.where(replaced, drawn, input_ids)


@dataclass(frozen=True)
class Objective:
    """How a task is scored, decided once from ``--task`` and the model's config.

    ``shift``: causal LM predicts the next token (labels are the inputs); seq2seq labels are the targets,
    already aligned with the decoder's positions. ``decoder_start_token_id`` and ``pad_token_id``: the ids a
    seq2seq decoder input is built with (the labels moved one place right).
    """

    shift: bool
    label_smoothing: float = 0.0
    decoder_start_token_id: int | None = None
    pad_token_id: int | None = None
    input_noise: float = 0.0  # causal-lm: share of the input tokens replaced by others (--input_noise)

    @classmethod
    def for_task(cls, task: str, label_smoothing: float = 0.0, config: MiniTxConfig | None = None,
                 input_noise: float = 0.0) -> Objective:
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")
        if input_noise and task != "causal-lm":
            raise ValueError(f"--input_noise replaces causal-lm input tokens; with --task {task} leave it out")
        if task == "causal-lm":
            return cls(shift=True, label_smoothing=label_smoothing, input_noise=input_noise)
        if config is None:
            raise ValueError("a seq2seq objective needs the model's config for its decoder start and pad ids")
        return cls.for_seq2seq(config, label_smoothing)

    @classmethod
    def for_seq2seq(cls, config: MiniTxConfig, label_smoothing: float = 0.0) -> Objective:
        return cls(shift=False, label_smoothing=label_smoothing,
                   decoder_start_token_id=config.decoder_start_token_id, pad_token_id=config.pad_token_id)

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What the model is trained on: the batch without its labels, so the loss is computed once, here.
        A seq2seq decoder reads the labels moved one place right (teacher forcing); with ``input_noise``, a
        causal model reads some input tokens replaced (`replace_tokens`) and is still scored on the true ones."""
        inputs = {key: value for key, value in batch.items() if key != "labels"}
        if self.input_noise:
            inputs["input_ids"] = replace_tokens(inputs["input_ids"], self.input_noise)
        if not self.shift:
            if self.decoder_start_token_id is None or self.pad_token_id is None:
                raise ValueError("this seq2seq Objective has no decoder start or pad id: build it with "
                                 "Objective.for_seq2seq(config)")
            inputs["decoder_input_ids"] = shift_tokens_right(batch["labels"], self.decoder_start_token_id,
                                                             self.pad_token_id)  # (batch, tgt)
        return inputs

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
