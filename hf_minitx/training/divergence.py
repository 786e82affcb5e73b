"""A run whose loss or gradients stopped being finite ends before its optimizer step, in one error that says
where the last good checkpoint is and what to change."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .checkpoints import list_checkpoints

if TYPE_CHECKING:
    from .state import TrainingRun


class NonFiniteLossError(RuntimeError, ValueError):  # a ValueError: the CLI prints it as one line, exit 2
    """The training loss or the gradients became NaN/inf; training stopped before the optimizer step."""


def check_finite(run: TrainingRun, step: int, loss: float, grad_norm: float) -> None:
    """Stop before the optimizer step when the loss or (without a loss scaler) the gradient norm is NaN/inf."""
    if math.isfinite(loss) and (run.accelerator.scaler is not None or math.isfinite(grad_norm)):
        return
    last = list_checkpoints(run.output_dir) if run.output_dir else []
    where = f"the last good checkpoint is {last[-1]}" if last else "no checkpoint was saved"
    raise NonFiniteLossError(
        f"training stopped at step {step}: the loss is {loss} and the gradient norm {grad_norm}; the weights "
        f"were not updated and {where}. Resuming with the same settings would diverge again (a resumed run keeps "
        "its recipe): start again with --overwrite_output_dir and a lower --learning_rate (or --muon_learning_rate), "
        "a longer --warmup_steps, --max_grad_norm 1.0 or --mixed_precision no."
    )
