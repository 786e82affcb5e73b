"""Distillation from a finished model (``--distill_from FOLDER``): the trained model (the student) learns from
its usual cross-entropy plus ``alpha * T^2 * KL(teacher_T || student_T)``, the distributions at temperature T.

The teacher is checked before anything is written (a model folder of the same kind, with the run's tokenizer),
recorded by the digest of its weights (a resumed run with another teacher is refused by the run identity) and
loaded frozen, on the student's device and dtype; its forward runs without gradients inside each step.
The train records' loss is the whole objective (cross-entropy + the KL term); evaluations score the cross-entropy
alone, so eval figures compare with those of runs trained without a teacher.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from ..data.tokenizer import load_tokenizer
from ..folders import weights_digest
from ..inference import TOKENIZER_FILES, load_model_folder
from ..model_files import WEIGHTS_FILE, read_folder_config
from .arguments import TrainArguments
from .loss import summed_kl_divergence


@dataclass(frozen=True)
class Distillation:
    """A frozen teacher and how much its distributions count in the student's loss."""

    teacher: nn.Module
    weight: float  # alpha
    temperature: float  # T

    def summed_loss(self, inputs: dict[str, torch.Tensor], student_logits: torch.Tensor, labels: torch.Tensor,
                    shift: bool) -> torch.Tensor:
        """``alpha * T^2 * KL`` summed over the labelled positions: a scalar added to the summed cross-entropy.

        inputs: what the student was called with; student_logits (batch, seq, vocab); labels (batch, seq).
        T^2 keeps the gradient's scale independent of T (the softened gradients shrink by 1/T^2).
        """
        with torch.no_grad():
            teacher_logits = self.teacher(**inputs).logits  # (batch, seq, vocab)
        kl = summed_kl_divergence(student_logits, teacher_logits, labels, shift=shift, temperature=self.temperature)
        return self.weight * self.temperature ** 2 * kl


def check_distill_arguments(train_args: TrainArguments, task: str) -> None:
    """--distill_weight and --distill_temperature in range; the --distill_from folder holds a model of the
    task's kind with its weights and tokenizer. Read only: said before any work."""
    if not train_args.distill_weight >= 0:
        raise ValueError(f"--distill_weight must be >= 0 (0 trains on the cross-entropy alone), got "
                         f"{train_args.distill_weight}")
    if not train_args.distill_temperature > 0:
        raise ValueError(f"--distill_temperature must be > 0 (1 leaves the distributions as they are), got "
                         f"{train_args.distill_temperature}")
    if train_args.distill_from is None:
        return
    folder = Path(train_args.distill_from)
    if not folder.is_dir():
        how = "is a file, not a folder" if folder.exists() else "does not exist"
        raise ValueError(f"--distill_from {folder} {how}; pass the output folder of a finished minitx train run")
    try:
        config = read_folder_config(folder)
    except (OSError, ValueError) as error:
        raise ValueError(f"--distill_from: {error}") from None
    wanted = task == "seq2seq"
    if bool(config.get("is_encoder_decoder")) != wanted:
        kind = "an encoder-decoder" if config.get("is_encoder_decoder") else "a decoder-only"
        raise ValueError(f"--distill_from {folder} holds {kind} model and this run trains a {task} one; pass a "
                         f"teacher trained with --task {task}")
    missing = [name for name in (WEIGHTS_FILE, *TOKENIZER_FILES) if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"--distill_from {folder} has no {missing[0]}; pass the output folder of a finished "
                         "minitx train run")


def check_teacher_vocabulary(folder: str | Path, tokenizer: PreTrainedTokenizerBase) -> None:
    """The teacher reads and predicts the run's token ids: the same vocabulary size and the same token -> id
    map (KL compares the two distributions id by id). Called once the run's tokenizer is known, before the
    run folder is claimed."""
    vocab_size = read_folder_config(Path(folder)).get("vocab_size")
    same = vocab_size == len(tokenizer) and load_tokenizer(folder).get_vocab() == tokenizer.get_vocab()
    if not same:
        raise ValueError(f"--distill_from {folder} uses another vocabulary ({vocab_size} tokens) than this run's "
                         f"tokenizer ({len(tokenizer)} tokens, or other ids); train with its tokenizer: "
                         f"--tokenizer {folder}")


def teacher_record(train_args: TrainArguments) -> dict[str, Any] | None:
    """The teacher in training_summary.json and the card: its path, the SHA-256 of its weights, alpha and T."""
    if train_args.distill_from is None:
        return None
    return {"path": os.path.realpath(train_args.distill_from),
            "weights_digest": weights_digest(Path(train_args.distill_from)),
            "weight": train_args.distill_weight, "temperature": train_args.distill_temperature}


def teacher_identity(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a checkpoint must share with the run resuming it: the teacher's weights, alpha and T (not its path:
    a teacher moved whole is the same teacher)."""
    return None if record is None else {key: value for key, value in record.items() if key != "path"}


def load_distillation(train_args: TrainArguments, student: nn.Module, device: torch.device) -> Distillation | None:
    """The frozen teacher (eval mode, no gradients) on the student's device and dtype, or None without
    --distill_from."""
    if train_args.distill_from is None:
        return None
    dtype = next(student.parameters()).dtype
    teacher, _ = load_model_folder(train_args.distill_from, device=device, dtype=dtype, need_tokenizer=False)
    teacher.requires_grad_(False)
    return Distillation(teacher.eval(), train_args.distill_weight, train_args.distill_temperature)
