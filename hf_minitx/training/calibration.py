"""Temperature calibration at the end of a run: one number, fitted on the validation split, folded into the weights.

A run that passes over a small corpus many times, with dropout on in training and off at inference, ends
over-confident: its validation loss falls if every logit is divided by a temperature a little above 1. The
scale s = 1 / T that minimises the validation loss is found by a golden-section search over cached logits, and
folded into the norm `lm_head` reads (`MiniTxLMHeadMixin.scale_output_logits`): the saved model is an ordinary
one, with the same config, the same export, and the calibrated probabilities in `generate()` and in every score.

    cached_logits     `lm_head`'s outputs and the labels of the first validation batches (bounded in memory)
    real_rows         which rows of a batch are the split's, not the repeats that even out the processes' batches
    validation_nats   the summed cross-entropy and token count of those logits at a scale, over every process
    golden_section    the minimum of a function of one variable that falls then rises, in a bracket
    calibrate         the whole step, on a finished run; returns what the summary records
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

from ..models.lm_head_minitx import soft_cap
from .loss import Objective, sequence_cross_entropy

logger = logging.getLogger(__name__)

CACHED_LOGITS = 1 << 26  # logit elements (tokens x vocabulary) kept per process: 256 MB in float32
SCALE_BRACKET = (0.5, 2.0)  # the scales searched: temperatures from 0.5 to 2
MIN_GAIN = 1e-4  # a fitted scale that lowers the loss by less than this share leaves the weights alone
SEARCH_STEPS = 14  # golden-section steps: the bracket narrowed 0.618^14 times, to about 0.2% of a scale


@torch.no_grad()
def cached_logits(
    model: torch.nn.Module, loader: Iterable[dict], objective: Objective, accelerator: Accelerator,
    max_elements: int = CACHED_LOGITS,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[(logits before any soft cap (rows, seq, vocab), labels (rows, seq))] of the loader's first batches on
    this process, as many as fit in ``max_elements`` logits (at least one batch). ``model`` is the unwrapped
    model; its logits are caught from `lm_head` by a hook.

    Every process takes the same number of batches (decided from the first batch's size, the largest over the
    processes), and keeps only its real rows: a prepared loader pads the last batch of a split that does not
    divide evenly with repeated rows, which ``gather_for_metrics`` drops, as the evaluation does.
    """
    caught: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda _module, _inputs, output: caught.append(output.float()))
    was_training, cache, batches = model.training, [], None
    model.eval()
    try:
        for batch in loader:
            model(**objective.model_inputs(batch))
            logits = caught.pop()  # (batch, seq, vocab)
            if batches is None:  # one decision for every process: they must call gather_for_metrics alike
                first = torch.tensor([logits.numel()], device=accelerator.device)
                batches = max(1, max_elements // int(accelerator.gather(first).max().item()))
            real = real_rows(accelerator, len(logits))  # (batch,) bool
            cache.append((logits[real], batch["labels"][real]))
            if len(cache) == batches:
                if hasattr(loader, "end"):  # a prepared loader left early: unregistered as a finished one is
                    loader.end()
                break
    finally:
        hook.remove()
        model.train(was_training)
    return cache


def real_rows(accelerator: Accelerator, rows: int) -> torch.Tensor:
    """(rows,) mask of this process's rows of the current batch that ``gather_for_metrics`` keeps: all of them,
    except the repeats a prepared loader pads an uneven last batch with."""
    ids = torch.arange(rows, device=accelerator.device) + accelerator.process_index * rows  # (rows,)
    return torch.isin(ids, accelerator.gather_for_metrics(ids))


def validation_nats(
    cache: list[tuple[torch.Tensor, torch.Tensor]], scale: float, cap: float | None, shift: bool,
    accelerator: Accelerator,
) -> tuple[float, int]:
    """(summed cross-entropy in nats, labelled tokens) of the cached logits multiplied by ``scale`` (then
    soft-capped as the model caps them), summed over every process, so that all of them agree."""
    totals = torch.zeros(2, dtype=torch.float64, device=accelerator.device)  # nats, tokens
    for logits, labels in cache:
        nats, counts = sequence_cross_entropy(soft_cap(logits * scale, cap), labels, shift=shift)  # (batch,) each
        totals += torch.stack([nats.sum().double(), counts.sum().double()])
    nats, tokens = accelerator.reduce(totals, "sum").tolist()
    return nats, int(tokens)


def golden_section(f: Callable[[float], float], low: float, high: float, steps: int) -> float:
    """The x in [low, high] where ``f`` is least, for an f that falls then rises there (or only falls, or only
    rises: the bracket's end is found). Each step evaluates f once and keeps 0.618 of the bracket."""
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc <= fd:  # the minimum lies in [a, d]
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:  # in [c, b]
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return c if fc <= fd else d


def calibrate(
    model: torch.nn.Module, loader: Iterable[dict], objective: Objective, accelerator: Accelerator
) -> dict[str, Any] | None:
    """Fit the temperature of the prepared ``model`` on the validation ``loader`` and fold it into the weights;
    returns the record for training_summary.json, or None when there is nothing to fit it on.

    The search runs on the scale's logarithm (a temperature of 2 is as far from 1 as one of 0.5). The weights
    change only if the fitted scale lowers the cached tokens' loss by at least ``MIN_GAIN`` of it. A sharded
    (FSDP) model is left as it is: its norm's weight is spread over the processes.
    """
    if accelerator.distributed_type == DistributedType.FSDP:
        logger.warning("the temperature is not calibrated in an FSDP run (--calibrate_temperature false hides this)")
        return None
    unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
    objective = replace(objective, input_noise=0.0)  # fitted on the text as it is read at inference
    cache = cached_logits(unwrapped, loader, objective, accelerator)
    cap = unwrapped.config.final_logit_softcap
    before, tokens = validation_nats(cache, 1.0, cap, objective.shift, accelerator)
    if tokens == 0:
        return None

    def loss_at(log_scale: float) -> float:
        return validation_nats(cache, math.exp(log_scale), cap, objective.shift, accelerator)[0]

    scale = math.exp(golden_section(loss_at, *map(math.log, SCALE_BRACKET), SEARCH_STEPS))
    after = validation_nats(cache, scale, cap, objective.shift, accelerator)[0]
    if not after < before * (1.0 - MIN_GAIN):
        scale, after = 1.0, before
    else:
        unwrapped.scale_output_logits(scale)
    return {"temperature": round(1.0 / scale, 4), "logit_scale": scale, "fitted_on_tokens": tokens,
            "fitted_loss_before": before / tokens, "fitted_loss_after": after / tokens}


__all__ = ["calibrate", "cached_logits", "golden_section", "real_rows", "validation_nats"]
