"""The best model by validation (``--load_best_model_at_end``): the weights of the evaluation with the lowest
``eval_loss`` so far, kept on the CPU, saved with every checkpoint so that a resumed run keeps them too, and
put back into the model before the final save when the last evaluation is worse.

A time budget that covers a small corpus many times over can overfit before the decay ends; then the final
model is the best one seen, not the last one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

BEST_WEIGHTS_FILE = "best_weights.safetensors"
METRIC = "eval_loss"  # lower is better


@dataclass
class BestWeights:
    """The lowest ``eval_loss`` so far, its step and metrics, and a CPU copy of the weights at that step."""

    step: int | None = None
    metrics: dict[str, float] | None = None
    weights: dict[str, torch.Tensor] | None = None

    @property
    def loss(self) -> float:
        return (self.metrics or {}).get(METRIC, math.inf)

    def offer(self, model: nn.Module, step: int, metrics: dict[str, float]) -> None:
        """Keep ``model``'s weights (unwrapped) if ``metrics`` beat the best so far."""
        loss = metrics.get(METRIC, math.nan)
        if not loss < self.loss:  # NaN never wins
            return
        self.step, self.metrics = step, dict(metrics)
        self.weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()}

    def better_than(self, metrics: dict[str, float], step: int) -> bool:
        """Whether the kept weights are better than the model of ``step`` scored ``metrics``."""
        return self.weights is not None and self.step != step and self.loss < metrics.get(METRIC, math.inf)

    def restore_into(self, model: nn.Module) -> None:
        """Put the kept weights back into ``model`` (unwrapped)."""
        model.load_state_dict(self.weights)

    def save(self, folder: Path) -> None:
        """The kept weights into ``folder`` (a checkpoint being written); nothing when there are none."""
        if self.weights is not None:
            save_file({k: v.contiguous() for k, v in self.weights.items()}, str(folder / BEST_WEIGHTS_FILE))

    @classmethod
    def load(cls, folder: Path, step: int | None, metrics: dict[str, float] | None) -> BestWeights:
        """The best weights a checkpoint holds (with its run state's step and metrics); empty when it has none."""
        path = folder / BEST_WEIGHTS_FILE
        if step is None or not path.is_file():
            return cls()
        return cls(step, metrics, load_file(str(path)))
