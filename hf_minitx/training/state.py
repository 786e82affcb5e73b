"""The state types of a training run: the pieces ``fit`` drives (``TrainingRun`` and its ``LoopSettings``), where
the run stands (``RunState``, saved with every checkpoint so that a resumed run goes on exactly) and how ``fit``
ended (``FitOutcome``).

Plain dataclasses, shared by setup, the loop and the end of the run, and by the toy experiments, which build a
``TrainingRun`` of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import torch
from accelerate import Accelerator
from torch import nn

from ..data.streaming import PackedBlockStream
from .best import BestWeights
from .budget import TimeBudget
from .distill import Distillation
from .loss import Objective


class Evaluation(Protocol):
    """What ``validate`` runs: (metrics, a few samples for a human) of the prepared model, on every process."""

    def __call__(self, model: nn.Module, accelerator: Accelerator) -> tuple[dict[str, float], list[dict]]: ...


@dataclass
class RunState:
    """Where a run stands; saved with every checkpoint (run_state.json) so that a resumed run goes on exactly."""

    step: int = 0
    tokens_seen: int = 0
    train_seconds: float = 0.0
    last_samples: list[dict[str, str]] = field(default_factory=list)
    planned_steps: int | None = None  # a time budget's plan, once its first timing made one
    plan_final: bool = False  # the plan no longer changes
    plan_timing: dict[str, float | None] | None = None  # the budget (minutes) and timings the plan was made from
    best_step: int | None = None  # --load_best_model_at_end: the step of the best evaluation so far
    best_metrics: dict[str, float] | None = None
    log_window: dict[str, float] | None = None  # the loss window since the last train record (``loop.Interval``)

    @classmethod
    def from_saved(cls, saved: dict[str, Any] | None) -> RunState:
        """The state stored in a checkpoint's run_state.json (a fresh state for None)."""
        return cls(**{f.name: saved[f.name] for f in fields(cls) if f.name in saved}) if saved else cls()


@dataclass(frozen=True)
class LoopSettings:
    """How long ``fit`` runs and what it does on the way (every count is in optimizer steps)."""

    total_steps: int
    batches_per_epoch: int | None  # micro-batches (of every process together) in one pass; None: a stream
    accumulation_steps: int = 1
    logging_steps: int = 10
    eval_steps: int | None = None
    checkpointing_steps: int | None = None
    save_total_limit: int = 2
    max_grad_norm: float | None = None
    max_seconds: float | None = None  # time budget of the training steps
    stop_when: tuple[str, float] | None = None  # (eval metric, target): stop once an evaluation reaches it
    show_progress: bool = True
    late_dropout: tuple[int, float] | None = None  # (from step, probability): hidden dropout switched on there
    calibrate: bool = False  # --calibrate_temperature: fit the temperature on the validation split at the end


@dataclass
class TrainingRun:
    """The pieces ``fit`` drives; made by ``setup`` (or by an experiment). ``model`` is the prepared one."""

    accelerator: Accelerator
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    batches: Iterator[dict[str, torch.Tensor]]  # endless training micro-batches of this process
    objective: Objective
    evaluation: Evaluation
    settings: LoopSettings
    output_dir: Path | None  # None: nothing is written (an experiment without --output_dir)
    checkpoint_fields: dict[str, Any] = field(default_factory=dict)  # saved next to the RunState
    stream: PackedBlockStream | None = None  # --streaming: where ``batches`` come from; its position is saved too
    recipe: dict[str, Any] = field(default_factory=dict)  # optimizer name, schedule, batch, block size: for the record
    budget: TimeBudget | None = None  # --max_minutes: the plan in steps, fixed after a probe
    schedule_args: Any = None  # what the schedule is built from (re-laid once a time budget's plan is fixed)
    best: BestWeights | None = None  # --load_best_model_at_end: the best evaluation's weights
    distillation: Distillation | None = None  # --distill_from: the frozen teacher whose KL joins the loss


@dataclass
class FitOutcome:
    """How ``fit`` ended."""

    final_metrics: dict[str, float] = field(default_factory=dict)
    stopped_by_time_budget: bool = False
    target_seconds: float | None = None  # training seconds when ``stop_when`` was reached
    cpu_seconds: float = 0.0  # this process, this session
    interrupted_by: int | None = None  # the signal (SIGINT, SIGTERM) that stopped the run
    checkpoint: Path | None = None  # saved on interruption
    kept: dict[str, Any] | None = None  # --load_best_model_at_end: which evaluation's weights the folder holds
    calibration: dict[str, Any] | None = None  # --calibrate_temperature: the temperature folded into the weights
    late_signal: int | None = None  # a stop signal during the temperature fit: the run finishes, then says so
