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
MIN_CHOOSING_TOKENS = 1000  # below this, the loss of a token varies ~3 nats and the mean moves by ~0.1 by chance


def too_few_to_choose(coverage: dict) -> str | None:
    """Why the validation split an evaluation covered (``Evaluator.coverage``: its scored ``tokens``) is too small
    to choose a model by (fewer than ``MIN_CHOOSING_TOKENS``: chance moves its loss more than training does late
    in a run); None when it is large enough, or does not say how large it is."""
    tokens = coverage.get("tokens")
    if tokens is None or tokens >= MIN_CHOOSING_TOKENS:
        return None
    return (f"the validation split scores {int(tokens):,} token(s), fewer than {MIN_CHOOSING_TOKENS:,}: too few to "
            "choose a model by")


@dataclass
class BestWeights:
    """The lowest ``eval_loss`` so far, its step and metrics, and a CPU copy of the weights at that step."""

    step: int | None = None
    metrics: dict[str, float] | None = None
    weights: dict[str, torch.Tensor] | None = None

    @property
    def loss(self) -> float:
        return (self.metrics or {}).get(METRIC, math.inf)

    def beaten_by(self, metrics: dict[str, float]) -> bool:
        """Whether ``metrics`` beat the best so far (NaN never does)."""
        return metrics.get(METRIC, math.nan) < self.loss

    def offer(self, model: nn.Module, step: int, metrics: dict[str, float],
              weights: dict[str, torch.Tensor] | None = None) -> None:
        """Keep ``model``'s weights (unwrapped; or ``weights``, a sharded model's gathered ones) if ``metrics``
        beat the best so far."""
        if not self.beaten_by(metrics):
            return
        self.step, self.metrics = step, dict(metrics)
        source = model.state_dict() if weights is None else weights
        self.weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in source.items()}

    def better_than(self, metrics: dict[str, float], step: int) -> bool:
        """Whether the kept weights are better than the model of ``step`` scored ``metrics``."""
        return self.weights is not None and self.step != step and self.loss < metrics.get(METRIC, math.inf)

    def restore_into(self, model: nn.Module, sharded: bool = False) -> None:
        """Put the kept weights back into ``model`` (unwrapped). ``sharded`` (FSDP, every process calls it): the
        first process holds the whole weights and sends each process its shards."""
        if not sharded:
            model.load_state_dict(self.weights)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, self.weights,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))

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
