"""The training loop, read top to bottom: ``train()`` is setup -> fit -> finish.

    setup            accelerator, data, model, optimizer, schedule, resume   -> a TrainingRun and a RunState
    fit              the loop: one optimizer step per accumulation window, until a stop
      train_step       forward, token-summed loss, backward, clipping, the NaN guard, the optimizer step
      log_train        a train record in metrics.jsonl every logging_steps
      validate         the run's evaluation, an eval record
      save_checkpoint  accelerator state + run_state.json (the RunState) in checkpoint-STEP/
    finish           the summary, the model folder, the loss curve, the model card (and the push)

Runs as ``minitx train ...`` or ``accelerate launch --num_processes N -m hf_minitx train ...``. The toy
experiments (``minitx experiment``) build a TrainingRun from in-memory token ids and call the same
``fit()`` and ``finish()``: one loop, one metrics format.

The loop knows nothing of the model's internals: it feeds batches, takes the logits and computes the token
cross-entropy itself (the ``Objective``), so that the loss of an optimizer step is the mean over the labelled
tokens of the whole accumulation window, on every process together.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from safetensors import SafetensorError
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from ..cli import EXIT_INTERRUPTED, Interrupted
from ..data.corpus import REPLACED_BYTES, SKIPPED_ROWS, UndecodableText
from ..data.streaming import PackedBlockStream
from ..device import describe_hardware
from ..folders import PARTIAL_SUFFIX, move_files_into, output_path, unlock_folder
from ..inference import non_finite_weights
from .arguments import DataArguments, ModelArguments, TrainArguments, parse_training_args
from .best import BestWeights, too_few_to_choose
from .budget import LENGTH_FREE_SCHEDULES, Probe, TimeBudget, every
from .checkpoints import (
    CHECKPOINT_PREFIX,
    check_checkpoint_fits,
    list_checkpoints,
    rotate_checkpoints,
    write_failure,
    write_run_state,
)
from .data_order import ShiftedWindows, StepIndexedBatchSampler
from .evaluation import TextEvaluation, chance_note
from .loss import Objective
from .optim import (
    build_optimizer,
    build_scheduler,
    describe_optimizer,
    describe_schedule,
    relay_schedule,
    schedule_factor,
    warmup_cut_warning,
)
from .outputs import LOSS_CURVE_FILE, SUMMARY_FILE, append_metrics, save_final_model, truncate_metrics
from .prepare import (
    AlreadyComplete,
    RunPlan,
    abandon_setup,
    build_model,
    check_global_batch,
    check_not_complete,
    claim_output_folder,
    effective_precision,
    get_tokenizer,
    is_hub_dataset,
    load_training_corpus,
    lock_output_folder,
    make_accelerator,
    plan_run,
    prepare_data,
    release_unclaimed,
    shifts_windows,
)
from .prepared import PreparedData
from .rescue import check_room, final_save_bytes, rescue_final_model
from .stream_data import save_stream_position, streaming_train_batches

logger = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError, ValueError):  # a ValueError: the CLI prints it as one line, exit 2
    """The training loss or the gradients became NaN/inf; training stopped before the optimizer step."""


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


class WindowCounts(NamedTuple):
    """One accumulation window, summed over every process."""

    label_tokens: int
    input_tokens: int
    time_up: bool
    interrupted: bool


class StopSignals:
    """SIGINT and SIGTERM ask ``fit`` to stop after the current step (and save); a second one quits at once.

    Installed only in the main thread (signal handlers cannot be set elsewhere); the previous handlers
    come back when ``fit`` ends.
    """

    def __init__(self, then: str = "finishing this step, then saving a checkpoint", *, quit_on_second: bool = True
                 ) -> None:
        self.received: int | None = None
        self.previous: dict[int, Any] = {}
        self.then = then  # what happens before the stop, said when a signal arrives
        self.quit_on_second = quit_on_second  # False: the work in progress is the only copy of the run (final save)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def handle(self, signum: int, frame: object) -> None:
        if self.received is not None and self.quit_on_second:
            os._exit(128 + signum)  # the second signal: nothing half-written is left by design, so quit now
        again = "press Ctrl-C again to quit at once" if self.quit_on_second else "it takes seconds; quitting now would lose the run"
        self.received = self.received or signum
        print(f"\n{signal.Signals(signum).name}: {self.then} ({again})", file=sys.stderr, flush=True)


class TermDuringSetup:
    """SIGTERM before the first step stops like Ctrl-C (a KeyboardInterrupt), so that setup is abandoned cleanly
    instead of the process dying with half-written staging folders."""

    def __init__(self) -> None:
        self.received = False
        self.previous: Any = None

    def __enter__(self) -> TermDuringSetup:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self.handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)

    def handle(self, signum: int, frame: object) -> None:
        self.received = True
        raise KeyboardInterrupt


@dataclass
class Interval:
    """Loss and token counts since the last train record."""

    nats: float = 0.0
    tokens: int = 0
    input_tokens: int = 0
    start: float = field(default_factory=time.perf_counter)

    def add(self, loss: float, label_tokens: int, input_tokens: int) -> None:
        self.nats += loss * label_tokens
        self.tokens += label_tokens
        self.input_tokens += input_tokens


# --- train(): setup -> fit -> finish ---------------------------------------------------------------


def train(model_args: ModelArguments, data_args: DataArguments, train_args: TrainArguments) -> Path:
    """Run one training job end to end; returns the output folder holding the final model.

    Ctrl-C before the first step (imports, data, tokenizer) leaves nothing half-written; a resumed run that
    is already complete writes nothing."""
    plan, terminated = None, TermDuringSetup()
    try:
        with terminated:
            plan = plan_run(model_args, data_args, train_args)  # every check that needs no data
            lock_output_folder(plan)  # before any work: a second run on this folder stops here
            run, tokenizer, state = setup(plan)
    except AlreadyComplete as done:
        print(done)
        return Path(train_args.output_dir)
    except KeyboardInterrupt:
        raise Interrupted(abandon_setup(plan), 128 + signal.SIGTERM if terminated.received else EXIT_INTERRUPTED) from None
    except BaseException:
        if plan is not None:  # a failure before the first step leaves no staging folder, no folder made for the lock
            release_unclaimed(plan)
        raise
    outcome = fit(run, state)
    refuse_unplanned_budget(run, state, outcome)
    if outcome.interrupted_by is not None:
        saved = f"saved {outcome.checkpoint}" if outcome.checkpoint else "nothing could be saved"
        raise Interrupted(
            f"training stopped by {signal.Signals(outcome.interrupted_by).name} after step {state.step}; {saved}. "
            "Resume with the same command plus --resume_from_checkpoint latest", 128 + outcome.interrupted_by)
    summary = {
        "task": data_args.task, "dataset": data_args.dataset, "dataset_config": data_args.dataset_config,
        "hub_dataset": is_hub_dataset(data_args.dataset), **run_summary(run, state, outcome),
        "evaluation": run.evaluation.coverage,
        "preset": model_args.preset, "seed": train_args.seed, "config_overrides": model_args.config_overrides,
        **({"bad_bytes_replaced": dict(REPLACED_BYTES), "rows_without_text_skipped": dict(SKIPPED_ROWS)}
           if data_args.skip_bad_rows else {}),
    }
    at_chance = chance_note(outcome.final_metrics, len(tokenizer))
    if at_chance:
        summary["warning"] = at_chance
    received = finish(run, tokenizer, summary,
                      max_new_tokens=data_args.max_target_length if not plan.objective.shift else 128,
                      push_to=train_args.hub_model_id if train_args.push_to_hub else None)
    if received is not None:
        raise Interrupted(f"{signal.Signals(received).name} arrived during the final save, which was completed first: "
                          f"{plan.output_dir} holds the finished model of {state.step} steps (not pushed)",
                          128 + received)
    if at_chance and run.accelerator.is_main_process:
        print(at_chance)  # the last line, where it is seen
    return plan.output_dir


def setup(plan: RunPlan) -> tuple[TrainingRun, PreTrainedTokenizerBase, RunState]:
    """Accelerator, data, model, optimizer and schedule of a planned run, resumed if it asks to be."""
    train_args = plan.train_args
    accelerator = make_accelerator(train_args, plan.trackers)
    k = train_args.gradient_accumulation_steps
    check_global_batch(plan, train_args.per_device_train_batch_size * accelerator.num_processes * k)
    set_seed(train_args.seed)
    with accelerator.main_process_first():
        corpus = load_training_corpus(plan)
    tokenizer = get_tokenizer(plan, corpus, accelerator)
    with accelerator.main_process_first():
        data = prepare_data(corpus, tokenizer, plan)

    set_seed(train_args.seed)
    model = build_model(plan.config, tokenizer)
    optimizer = build_optimizer(model, train_args)
    batches_per_epoch = None if plan.data_args.streaming else StepIndexedBatchSampler(
        len(data.train), train_args.per_device_train_batch_size, num_processes=accelerator.num_processes,
        window=shift_window(plan),
    ).batches_per_epoch
    total_steps, budget = run_length(plan, batches_per_epoch)
    check_not_complete(plan, total_steps)  # before the first write
    changes = schedule_changes(plan, total_steps, budget)
    scheduler = build_scheduler(optimizer, train_args, total_steps)
    eval_loader = DataLoader(data.validation, batch_size=train_args.per_device_eval_batch_size,
                             collate_fn=data.collate)
    model, optimizer, eval_loader = accelerator.prepare(model, optimizer, eval_loader)
    accelerator.register_for_checkpointing(scheduler)  # stepped by us, once per optimizer step

    run_id = claim_output_folder(plan) if accelerator.is_main_process else None  # the first write of the run
    accelerator.wait_for_everyone()
    state = resume(plan, accelerator, model)
    if changes:  # the optimizer came back with the checkpoint's rate: the new length applies from this step on
        relay_schedule(scheduler, train_args, total_steps)
    best = BestWeights.load(plan.checkpoint, state.best_step, state.best_metrics) if plan.checkpoint else BestWeights()
    evaluation = TextEvaluation(
        eval_loader, plan.objective, tokenizer, prompts=data.prompts, sources=data.sources,
        references=data.references, num_samples=train_args.num_sample_generations, seed=train_args.seed,
        num_bytes=data.num_bytes, whole_split=plan.data_args.max_eval_samples is None and not plan.data_args.streaming,
        rows=len(data.validation),
        generation={"max_new_tokens": plan.data_args.max_target_length, "num_beams": train_args.generation_num_beams,
                    "do_sample": False, "max_source_length": plan.data_args.max_source_length,
                    "batch_size": train_args.per_device_eval_batch_size * 4},
    )
    settings = LoopSettings(
        total_steps=total_steps, batches_per_epoch=batches_per_epoch, accumulation_steps=k,
        logging_steps=train_args.logging_steps, eval_steps=every(train_args.eval_steps, total_steps),
        checkpointing_steps=every(train_args.checkpointing_steps, total_steps), save_total_limit=train_args.save_total_limit,
        max_grad_norm=train_args.max_grad_norm or None, show_progress=not train_args.disable_tqdm,
        max_seconds=budget.cap_seconds if budget is not None else None,
        late_dropout=late_dropout_plan(train_args, plan.config, batches_per_epoch, k),
    )
    stream = None
    if plan.data_args.streaming:  # this process's rows, tokenized and packed on the fly, from the saved position
        batches, stream = streaming_train_batches(data, tokenizer, plan.data_args, train_args, accelerator,
                                                  plan.checkpoint)
    else:
        batches = iter(training_loader(data, train_args, accelerator, start=state.step * k, window=shift_window(plan)))
    run = TrainingRun(accelerator, model, optimizer, scheduler, batches, plan.objective, evaluation, settings,
                      plan.output_dir, checkpoint_fields={
                          **plan.identity, "run_id": run_id, SCHEDULE_CHANGES: changes,
                          "global_batch_size": train_args.per_device_train_batch_size * accelerator.num_processes * k},
                      stream=stream, recipe=training_recipe(plan, total_steps, accelerator.num_processes),
                      budget=budget, schedule_args=train_args,
                      best=best if train_args.load_best_model_at_end else None)
    if changes:
        run.recipe["schedule"][SCHEDULE_CHANGES] = changes
    if settings.late_dropout is not None:
        run.recipe["late_dropout"] = {"probability": settings.late_dropout[1], "from_step": settings.late_dropout[0],
                                      "after_passes": train_args.late_dropout_passes}
    cut = warmup_cut_warning(run.recipe["schedule"])
    if cut and budget is None:
        logger.warning(cut)
    start_trackers(plan, accelerator)
    return run, tokenizer, state


def run_length(plan: RunPlan, batches_per_epoch: int | None) -> tuple[int, TimeBudget | None]:
    """(optimizer steps the schedule spans, the time budget's plan or None without --max_minutes).

    Without a budget: --max_steps, else --num_epochs (default 1). With one: the plan the resumed checkpoint
    recorded, else a provisional length until the probe fixes the plan (``budget``), bounded by --max_steps or
    a given --num_epochs.
    """
    args, k = plan.train_args, plan.train_args.gradient_accumulation_steps

    def epochs(count: float) -> int:
        return max(1, math.ceil(count * batches_per_epoch / k))

    if args.max_minutes is None:
        return args.max_steps or epochs(args.num_epochs or 1.0), None
    saved = plan.resume_state or {}
    timing = saved.get("plan_timing") or {}
    cap = (args.max_steps or (epochs(args.num_epochs) if args.num_epochs and batches_per_epoch else None)
           or timing.get("step_cap"))
    stable = args.lr_scheduler_type in LENGTH_FREE_SCHEDULES and args.decay_ratio < 1
    fractions = [v for v in (args.eval_steps, args.checkpointing_steps) if v and v < 1]
    planned_for = timing.get("budget_minutes") if saved.get("planned_steps") else None  # see resumed_budget
    budget = TimeBudget((planned_for or args.max_minutes) * 60, step_cap=cap, eval_steps=args.eval_steps or None,
                        decay_ratio=(args.decay_ratio if args.lr_scheduler_type == "warmup_stable_decay" else 0.0)
                        if stable else None, first_fraction=min(fractions, default=None))
    if saved.get("planned_steps"):  # a resumed run continues its plan; a longer budget only moves the clock
        budget.planned_steps, budget.final = saved["planned_steps"], bool(saved.get("plan_final", True))
        if planned_for and not math.isclose(planned_for, args.max_minutes):
            budget.planned_for_minutes, budget.clock_seconds = planned_for, args.max_minutes * 60
        budget.seconds_per_step = timing.get("seconds_per_step")
        budget.seconds_per_evaluation = timing.get("seconds_per_evaluation")
    elif cap is not None and cap <= budget.probe_steps:  # too short to need a probe
        budget.planned_steps, budget.final = cap, True
    return budget.planned_steps or budget.provisional_steps(), budget


SCHEDULE_CHANGES = "schedule_changes"  # run state and recipe: resumes that laid the schedule over other steps


def schedule_changes(plan: RunPlan, total_steps: int, budget: TimeBudget | None) -> list[dict[str, int]]:
    """The resumes that laid the schedule over another number of steps (another --max_steps or --num_epochs),
    carried from checkpoint to checkpoint, this one's added: the new length applies from the step resumed at, and
    a rate that jumps there is warned of. A time budget keeps its recorded plan, so it never adds one."""
    saved = plan.resume_state or {}
    changes = list(saved.get(SCHEDULE_CHANGES) or [])
    before, step = saved.get("total_steps"), saved.get("step", 0)
    if budget is not None or not before or before == total_steps:
        return changes
    changes.append({"step": step, "total_steps_before": before, "total_steps": total_steps})
    old, new = schedule_factor(plan.train_args, before)(step), schedule_factor(plan.train_args, total_steps)(step)
    if not math.isclose(old, new, rel_tol=1e-9, abs_tol=1e-12):
        logger.warning("the %s schedule was laid over %d steps and is now laid over %d: from step %d on, the learning "
                       "rate goes from %.3g to %.3g of its peak (recorded in the summary's recipe.schedule)",
                       plan.train_args.lr_scheduler_type, before, total_steps, step, old, new)
    return changes


def training_recipe(plan: RunPlan, total_steps: int, num_processes: int) -> dict[str, Any]:
    """How the run trains, for training_summary.json and the card: optimizer, schedule, clipping, batch, lengths."""
    train_args, data_args = plan.train_args, plan.data_args
    batch = train_args.per_device_train_batch_size
    causal = {"block_size": data_args.block_size, "shift_windows": bool(shift_window(plan))}
    lengths = (causal if plan.objective.shift else
               {"max_source_length": data_args.max_source_length, "max_target_length": data_args.max_target_length})
    return {"optimizer": train_args.optimizer, "schedule": describe_schedule(train_args, total_steps),
            "max_grad_norm": train_args.max_grad_norm or None, "label_smoothing": train_args.label_smoothing,
            "per_device_train_batch_size": batch, "gradient_accumulation_steps": train_args.gradient_accumulation_steps,
            "global_batch_size": batch * num_processes * train_args.gradient_accumulation_steps, **lengths}


def late_dropout_plan(train_args: TrainArguments, config: Any, batches_per_epoch: int | None,
                      accumulation_steps: int) -> tuple[int, float] | None:
    """(step, probability) at which --late_dropout switches the hidden dropout on: after --late_dropout_passes
    passes over the training data. None: off, a stream (read once), or a model with its own hidden_dropout."""
    if not train_args.late_dropout or batches_per_epoch is None or getattr(config, "hidden_dropout", 0.0):
        return None
    step = math.ceil(train_args.late_dropout_passes * batches_per_epoch / accumulation_steps)
    return step, train_args.late_dropout


def switch_on_late_dropout(run: TrainingRun, step: int) -> None:
    """From the planned step on (a resumed run too), every hidden dropout of the model drops with the planned
    probability; before it, they keep the model's own (0)."""
    late = run.settings.late_dropout
    if late is None or step < late[0]:
        return
    model = run.accelerator.unwrap_model(run.model, keep_torch_compile=False)
    switched = [module for module in model.modules() if isinstance(module, nn.Dropout) and module.p != late[1]]
    for module in switched:
        module.p = late[1]
    if switched and step == late[0]:
        logger.info("step %d: the run starts another pass over its training data with hidden dropout %.2g "
                    "(--late_dropout)", step, late[1])


def shift_window(plan: RunPlan) -> int:
    """Offsets drawn per sample and epoch (``--shift_windows``): in [0, block_size), or 0 for samples as packed."""
    return plan.data_args.block_size if shifts_windows(plan.data_args) else 0


def training_loader(data: PreparedData, train_args: TrainArguments, accelerator: Accelerator, start: int,
                    window: int = 0) -> DataLoader:
    """This process's endless training batches, from global micro-batch ``start`` on (see data_order)."""
    return DataLoader(  # its own generator: iterating must not draw from the global (dropout) RNG
        ShiftedWindows(data.train) if window else data.train, collate_fn=data.collate,
        generator=torch.Generator().manual_seed(train_args.seed),
        batch_sampler=StepIndexedBatchSampler(
            len(data.train), train_args.per_device_train_batch_size, num_processes=accelerator.num_processes,
            process_index=accelerator.process_index, seed=train_args.seed, start=start, window=window,
        ),
    )


def resume(plan: RunPlan, accelerator: Accelerator, model: nn.Module) -> RunState:
    """Load the checkpoint's model, optimizer, scheduler and RNG states; a fresh RunState when not resuming."""
    if plan.checkpoint is None:
        return RunState()
    check_checkpoint_fits(plan.checkpoint, accelerator.unwrap_model(model, keep_torch_compile=False))
    accelerator.load_state(str(plan.checkpoint))
    check_resumed_weights(accelerator, model, plan.checkpoint)
    state = RunState.from_saved(plan.resume_state)
    if accelerator.is_main_process:
        truncate_metrics(plan.output_dir, state.step)
    accelerator.print(f"resumed from {plan.checkpoint} at step {state.step}")
    return state


def check_resumed_weights(accelerator: Accelerator, model: nn.Module, checkpoint: Path) -> None:
    """Refuse a checkpoint whose weights hold NaN or inf (damaged on disk: training never saves them), on every
    process at once (each counts its own shards), naming the first such tensor a process holds."""
    count, first, _ = non_finite_weights(accelerator.unwrap_model(model, keep_torch_compile=False))
    if accelerator.num_processes > 1:
        count = int(accelerator.reduce(torch.tensor(count, device=accelerator.device), "sum").item())
    if count:
        where = f" (the first in {first})" if first else ""
        raise ValueError(f"checkpoint {checkpoint} holds {count} non-finite weight(s) (NaN or inf){where}: it is "
                         f"damaged. Resume from an earlier one (--resume_from_checkpoint {checkpoint.parent}/"
                         "checkpoint-N), or start again with --overwrite_output_dir")


def start_trackers(plan: RunPlan, accelerator: Accelerator) -> None:
    """Accelerate trackers (--report_to) with every argument as the run's config."""
    if accelerator.trackers:
        config = {**asdict(plan.model_args), **asdict(plan.data_args), **asdict(plan.train_args)}
        accelerator.init_trackers("hf_minitx", config={k: v for k, v in config.items() if v is not None})


# --- fit: the loop ---------------------------------------------------------------------------------


def fit(run: TrainingRun, state: RunState) -> FitOutcome:
    """Optimizer steps until ``total_steps``, the time budget, the target metric or a stop signal; logs,
    evaluates and checkpoints on schedule, and evaluates at the end unless the last step was just evaluated.
    A stop signal ends the loop after the current step with a checkpoint (when the run has a folder)."""
    settings, accelerator = run.settings, run.accelerator
    run.model.train()
    unplanned = run.budget is not None and run.budget.planned_steps is None  # no total to show until the plan
    progress = tqdm(total=None if unplanned else settings.total_steps, initial=state.step, unit="step",
                    desc=f"training {run.output_dir.name if run.output_dir else ''}".strip(),
                    disable=not (accelerator.is_local_main_process and settings.show_progress))
    outcome, interval, evaluated_at = FitOutcome(), Interval(), -1
    start, cpu_start = time.perf_counter() - state.train_seconds, time.process_time()
    untrained: dict[str, Any] | None = None
    probe = None if run.budget is None else Probe.window(run.budget, state.step)
    if run.budget is not None and run.budget.fixed:
        state.planned_steps, state.plan_final = run.budget.planned_steps, True
    if run.budget is not None and state.plan_timing is None:  # every checkpoint says what budget it runs under
        state.plan_timing = run.budget.timing()
    switch_on_late_dropout(run, state.step)  # a resumed run past the switch
    with StopSignals() as signals:
        while state.step < settings.total_steps:
            if settings.late_dropout is not None and state.step == settings.late_dropout[0]:
                switch_on_late_dropout(run, state.step)
            step_start = time.perf_counter()
            untrained = run.stream.state_dict() if run.stream is not None else None  # before the window is drawn
            window = draw_window(run, state, untrained)
            window = [{k: v.to(accelerator.device) for k, v in batch.items()} for batch in window]
            time_up = (settings.max_seconds is not None and state.step > 0  # a first step, timed, whatever the budget
                       and time.perf_counter() - start > settings.max_seconds)
            counts = count_window(run, window, time_up=time_up, interrupted=signals.received is not None)
            if counts.interrupted or counts.time_up:
                stop_early(run, state, outcome, counts, signals.received, untrained)
                break
            untrained = None
            loss, learning_rate = train_step(run, state, window, counts.label_tokens)
            state.step += 1
            state.tokens_seen += counts.input_tokens
            state.train_seconds = time.perf_counter() - start
            interval.add(loss, counts.label_tokens, counts.input_tokens)
            progress.update(1)
            if state.step % settings.logging_steps == 0 or state.step == settings.total_steps:
                log_train(run, state, interval, learning_rate, progress)
                interval = Interval()
            evaluation_seconds = 0.0
            if settings.eval_steps and state.step % settings.eval_steps == 0:
                evaluated_at, begin = state.step, time.perf_counter()
                if evaluate_and_check_target(run, state, outcome):
                    break
                evaluation_seconds = time.perf_counter() - begin
            if settings.checkpointing_steps and state.step % settings.checkpointing_steps == 0:
                save_checkpoint(run, state)
            if probe is not None and probe.timed(state.step, time.perf_counter() - step_start - evaluation_seconds):
                probe, made = fix_plan(run, state, probe, time.perf_counter() - start)  # may evaluate once
                evaluated_at, settings = max(evaluated_at, made), run.settings
                progress.total = settings.total_steps
                progress.refresh()
                if evaluation_passed(settings, state.step, evaluated_at):  # the final plan put one before this step
                    evaluated_at = state.step
                    if evaluate_and_check_target(run, state, outcome):
                        break
        progress.close()
        # a budget stopped inside its probe is refused (refuse_unplanned_budget): no final evaluation
        refused = outcome.stopped_by_time_budget and run.budget is not None and run.budget.planned_steps is None
        if evaluated_at != state.step and outcome.interrupted_by is None and not refused:  # protected like the steps
            evaluate_and_check_target(run, state, outcome)
            if stop_wished(run, signals.received):
                outcome.interrupted_by = signals.received or signal.SIGTERM
                outcome.checkpoint = checkpoint_of_last_step(run, state, untrained)
        if outcome.interrupted_by is None:
            keep_best(run, state, outcome)
    outcome.cpu_seconds = time.process_time() - cpu_start
    return outcome


def evaluation_passed(settings: LoopSettings, step: int, evaluated_at: int) -> bool:
    """Whether an evaluation the (final) plan places at or before ``step`` has not run: a fraction of the run
    that a shorter final plan put before the step where the plan was made."""
    if not settings.eval_steps or step >= settings.total_steps:
        return False
    due = step // settings.eval_steps * settings.eval_steps
    return due > 0 and evaluated_at < due


def refuse_unplanned_budget(run: TrainingRun, state: RunState, outcome: FitOutcome) -> None:
    """A time budget that ran out inside its timing probe made no plan: its steps ran the warmup of a provisional
    schedule that never decayed. That model is not the run's result: one error says what a step costs and what
    budget would do, and the checkpoint saved at the stop (``stop_early``) can be resumed with a longer one."""
    budget = run.budget
    if budget is None or budget.planned_steps is not None or not outcome.stopped_by_time_budget:
        return
    step_seconds = state.train_seconds / max(state.step, 1)
    resume = (f"{outcome.checkpoint} holds them: resume it with --resume_from_checkpoint latest --max_minutes "
              f"{budget.shortest_budget(step_seconds):g}" if outcome.checkpoint else "nothing was saved")
    raise ValueError(f"--max_minutes {budget.seconds / 60:g} ({budget.seconds:.1f} s) ran out after {state.step} "
                     f"step(s) of about {step_seconds:.2f} s, inside the {budget.probe_steps}-step timing probe that "
                     "makes the plan: the schedule never decayed, so no model is saved as the run's result; "
                     f"{resume} (the probe and as many steps again), or train a number of steps with --max_steps")


def keep_best(run: TrainingRun, state: RunState, outcome: FitOutcome) -> None:
    """--load_best_model_at_end: the best evaluation's weights go back into the model when the last evaluation
    is worse; ``outcome`` then reports the kept model's metrics, and records which step it is."""
    best = run.best
    if best is None or best.step is None:
        return
    last = outcome.final_metrics
    outcome.kept = {"step": state.step, "eval_loss": last.get("eval_loss"), "last_step": state.step,
                    "last_eval_loss": last.get("eval_loss")}
    small = too_few_to_choose(last)
    if small and best.better_than(last, state.step):
        outcome.kept["not_chosen"] = small
        logger.warning("kept the last weights, not those of step %d (eval_loss %.4f against %.4f): %s; give a larger "
                       "--validation_split (or --max_eval_samples)", best.step, best.loss,
                       last.get("eval_loss", math.nan), small)
    elif best.better_than(last, state.step):
        best.restore_into(run.accelerator.unwrap_model(run.model, keep_torch_compile=False),
                          sharded=run.accelerator.distributed_type == DistributedType.FSDP)
        outcome.kept.update(step=best.step, eval_loss=best.loss)
        outcome.final_metrics = dict(best.metrics)
        run.accelerator.print(f"kept the weights of step {best.step} (eval_loss {best.loss:.4f}): the last "
                              f"evaluation, at step {state.step}, scored {last.get('eval_loss', math.nan):.4f}")


def fix_plan(run: TrainingRun, state: RunState, probe: Probe, elapsed: float) -> tuple[Probe | None, int]:
    """Plan the time budget from the timed window: the figures agreed by every process (their mean); the first
    time, one evaluation is timed when the run will evaluate along the way. The schedule is laid over the
    planned steps. Returns (the next timing window or None once the plan is final, the step of an evaluation
    made here or -1)."""
    budget, accelerator, args = run.budget, run.accelerator, run.schedule_args
    figures = torch.tensor([probe.seconds_per_step, elapsed], dtype=torch.float64,
                           device=accelerator.device)
    step_seconds, elapsed = accelerator.reduce(figures, "mean").tolist()
    evaluated_at, eval_seconds = -1, budget.seconds_per_evaluation or 0.0
    if budget.planned_steps is None and budget.evaluations(budget.steps_that_fit(state.step, elapsed, step_seconds, 0)):
        begin = time.perf_counter()
        validate(run, state)
        spent = torch.tensor(time.perf_counter() - begin, dtype=torch.float64, device=accelerator.device)
        evaluated_at, eval_seconds = state.step, accelerator.reduce(spent, "mean").item()
        elapsed += eval_seconds
    planned = budget.plan(state.step, budget.steps_that_fit(state.step, elapsed, step_seconds, eval_seconds),
                          step_seconds, eval_seconds)
    state.planned_steps, state.plan_final = planned, budget.final
    state.plan_timing = budget.timing()
    relay_schedule(run.scheduler, args, planned)
    run.settings = replace(run.settings, total_steps=planned, eval_steps=every(args.eval_steps, planned),
                           checkpointing_steps=every(args.checkpointing_steps, planned))
    run.recipe["schedule"] = describe_schedule(args, planned)
    accelerator.print(f"time budget of {budget.seconds / 60:g} min: {step_seconds * 1000:.0f} ms per step"
                      + (f", {eval_seconds:.1f} s per evaluation" if eval_seconds else "")
                      + f"; the schedule is laid over {planned} steps"
                      + ("" if budget.final else f" (timed again at step {budget.replan_step(planned)})"))
    return (None if budget.final else budget.second_window(state.step)), evaluated_at


def draw_window(run: TrainingRun, state: RunState, untrained: dict[str, Any] | None) -> list[dict[str, torch.Tensor]]:
    """The next accumulation window of micro-batches. Text that cannot be decoded (a streamed file) saves the
    checkpoint of the last trained step first, and the error says how to go on from there."""
    try:
        return [next(run.batches) for _ in range(run.settings.accumulation_steps)]
    except UndecodableText as error:
        checkpoint = checkpoint_of_last_step(run, state, untrained)
        if checkpoint is None:
            raise
        raise UndecodableText(f"{error}. Training stopped after step {state.step} and saved {checkpoint}: resume it "
                              "with the same command plus --skip_bad_rows --resume_from_checkpoint latest (or, once "
                              "the file is converted, --accept_changed_inputs --resume_from_checkpoint latest)") from None


def stop_wished(run: TrainingRun, received: int | None) -> bool:
    """Whether any process got a stop signal (one reduce, so that every process agrees)."""
    flag = torch.tensor(int(received is not None), device=run.accelerator.device)
    return run.accelerator.reduce(flag, "sum").item() > 0


def checkpoint_of_last_step(run: TrainingRun, state: RunState, stream_state: dict[str, Any] | None) -> Path | None:
    """The checkpoint of the last trained step, saved now unless it exists (None: the run writes nothing)."""
    if run.output_dir is None or not run.checkpoint_fields:
        return None
    existing = run.output_dir / f"{CHECKPOINT_PREFIX}{state.step}"
    return existing if existing in list_checkpoints(run.output_dir) else save_checkpoint(run, state, stream_state)


def count_window(
    run: TrainingRun, window: list[dict[str, torch.Tensor]], *, time_up: bool, interrupted: bool
) -> WindowCounts:
    """Token counts and stop wishes of the window on every process together: one reduce per step.

    A process's wish to stop (time budget, a signal) is summed with the others', so every process stops
    at the same step and none is left waiting in a collective call (saving a checkpoint is one).
    """
    objective, device = run.objective, run.accelerator.device
    counts = torch.stack([
        sum(objective.label_tokens(batch) for batch in window),
        sum(objective.input_tokens(batch) for batch in window),
        torch.tensor(int(time_up), device=device),
        torch.tensor(int(interrupted), device=device),
    ]).long()
    label_tokens, input_tokens, time_flags, stop_flags = run.accelerator.reduce(counts, "sum").tolist()
    return WindowCounts(label_tokens, input_tokens, time_flags > 0, stop_flags > 0)


def stop_early(
    run: TrainingRun, state: RunState, outcome: FitOutcome, counts: WindowCounts, received: int | None,
    untrained: dict[str, Any] | None,
) -> None:
    """Note why the loop stops before ``total_steps``; on a signal, save a checkpoint to resume from (streaming:
    at the stream position ``untrained`` from before the window that was drawn but not trained)."""
    if counts.interrupted:
        outcome.interrupted_by = received or signal.SIGTERM  # another process got the signal
        outcome.checkpoint = checkpoint_of_last_step(run, state, untrained)
        return
    outcome.stopped_by_time_budget = True
    if run.budget is not None and run.budget.planned_steps is None:  # inside the probe: kept to resume, see
        outcome.checkpoint = checkpoint_of_last_step(run, state, untrained)  # refuse_unplanned_budget
        return
    minutes = run.budget.minutes if run.budget is not None else run.settings.max_seconds / 60
    run.accelerator.print(f"time budget of {minutes:g} min reached at step {state.step} of {run.settings.total_steps}")


def train_step(
    run: TrainingRun, state: RunState, window: list[dict[str, torch.Tensor]], label_tokens: int
) -> tuple[float, float]:
    """One optimizer step on a window of micro-batches; returns (mean loss per label token, learning rate).

    Each micro-batch's summed loss is divided by the window's global token count; backward divides by the
    accumulation steps and DDP averages over processes, so both factors are put back here.
    """
    accelerator, model, objective = run.accelerator, run.model, run.objective
    scale = accelerator.num_processes * len(window) / max(label_tokens, 1)
    window_nats = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    for batch in window:
        with accelerator.accumulate(model):
            logits = model(**objective.model_inputs(batch)).logits  # (batch, seq, vocab)
            summed = objective.summed_loss(logits, batch["labels"])
            accelerator.backward(summed * scale)
        window_nats += summed.detach().double()
    loss = accelerator.reduce(window_nats, "sum").item() / max(label_tokens, 1)
    grad_norm = accelerator.clip_grad_norm_(model.parameters(), run.settings.max_grad_norm or float("inf"))
    check_finite(run, state.step + 1, loss, float(grad_norm))
    learning_rate = run.scheduler.get_last_lr()[0]
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return loss, learning_rate


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


def log_train(run: TrainingRun, state: RunState, interval: Interval, learning_rate: float, progress: tqdm) -> None:
    """A train record (loss since the last record, throughput, position) to metrics.jsonl and the trackers."""
    seconds = max(time.perf_counter() - interval.start, 1e-9)
    loss = interval.nats / max(interval.tokens, 1)
    record = {"type": "train", "step": state.step,
              "epoch": run.stream.epoch if run.stream is not None
              else state.step * run.settings.accumulation_steps / run.settings.batches_per_epoch,
              "loss": loss, "learning_rate": learning_rate, "tokens_per_second": interval.input_tokens / seconds,
              "tokens_seen": state.tokens_seen, "elapsed_seconds": state.train_seconds}
    if run.accelerator.is_main_process:
        if run.output_dir is not None:
            append_metrics(run.output_dir, record)
        progress.set_postfix(loss=f"{loss:.3f}", lr=f"{learning_rate:.2e}", tok_s=f"{record['tokens_per_second']:.0f}")
    run.accelerator.log({"train_loss": loss, "learning_rate": learning_rate}, step=state.step)


def validate(run: TrainingRun, state: RunState) -> dict[str, float]:
    """Run the evaluation, keep its samples in the state, write an eval record; returns the metrics."""
    metrics, state.last_samples = run.evaluation(run.model, run.accelerator)
    run.model.train()
    if run.best is not None:
        if run.best.beaten_by(metrics):  # the same on every process: the metrics are reduced
            run.best.offer(run.accelerator.unwrap_model(run.model, keep_torch_compile=False), state.step, metrics,
                           weights=gathered_weights(run.accelerator, run.model))
        state.best_step, state.best_metrics = run.best.step, run.best.metrics
    if run.accelerator.is_main_process:
        if run.output_dir is not None:
            append_metrics(run.output_dir, {"type": "eval", "step": state.step, **metrics})
        shown = ", ".join(f"{k.removeprefix('eval_')} {v:.4g}" for k, v in metrics.items())
        tqdm.write(f"[eval step {state.step}] {shown}")
        for sample in state.last_samples:
            tqdm.write(f"  {sample['prompt']!r} -> {sample['output']!r}")
    run.accelerator.log(metrics, step=state.step)
    return metrics


def evaluate_and_check_target(run: TrainingRun, state: RunState, outcome: FitOutcome) -> bool:
    """Validate into ``outcome``; True (and the time noted) the first time the target metric is reached."""
    outcome.final_metrics = validate(run, state)
    target = run.settings.stop_when
    if target is None or outcome.target_seconds is not None:
        return False
    reached = outcome.final_metrics.get(target[0], -math.inf) >= target[1]
    if reached:
        outcome.target_seconds = state.train_seconds
    return reached


def save_checkpoint(run: TrainingRun, state: RunState, stream_state: dict[str, Any] | None = None) -> Path:
    """Accelerator state (model, optimizer, scheduler, every process's RNG), the RunState and, streaming, the
    stream position (``stream_state``, or where the stream stands now); the oldest checkpoints are rotated.

    Everything is written into a hidden ``.checkpoint-STEP.partial`` folder that is renamed once complete,
    so a kill at any moment leaves no half-written ``checkpoint-STEP``; a full disk removes it and is one
    error naming the folder and its free space.
    """
    accelerator, path = run.accelerator, run.output_dir / f"{CHECKPOINT_PREFIX}{state.step}"
    partial = path.with_name(f".{path.name}{PARTIAL_SUFFIX}")
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state(str(partial), safe_serialization=False)  # every process saves its RNG state
        if run.stream is not None:  # and, streaming, its position in the stream
            save_stream_position(stream_state or run.stream.state_dict(), partial, accelerator.process_index)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            if run.best is not None:
                run.best.save(partial)
            write_run_state(partial, {**run.checkpoint_fields, "total_steps": run.settings.total_steps,
                                      **asdict(state)})
    except (OSError, RuntimeError) as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise write_failure(error, partial, run.output_dir) from None
    if accelerator.is_main_process:
        if path.exists():  # a checkpoint of an earlier session at the same step
            shutil.rmtree(path)
        partial.rename(path)
        rotate_checkpoints(run.output_dir, run.settings.save_total_limit)
    accelerator.wait_for_everyone()
    return path


# --- finish ----------------------------------------------------------------------------------------


def run_summary(run: TrainingRun, state: RunState, outcome: FitOutcome) -> dict[str, Any]:
    """The part of training_summary.json every run has, whatever trained it."""
    model = run.accelerator.unwrap_model(run.model, keep_torch_compile=False)
    passes = (None if not run.settings.batches_per_epoch else
              round(state.step * run.settings.accumulation_steps / run.settings.batches_per_epoch, 3))
    return {
        "run_id": run.checkpoint_fields.get("run_id"),
        "steps": state.step, "tokens_seen": state.tokens_seen, "train_seconds": round(state.train_seconds, 2),
        "epochs": passes,  # a stream has no length: None, and the whole passes it completed beside
        **({"stream_passes_completed": run.stream.epoch} if run.stream is not None else {}),
        **({"time_budget": run.budget.record(state.step, state.train_seconds, outcome.stopped_by_time_budget)}
           if run.budget is not None else {}),
        **({"kept": outcome.kept} if outcome.kept else {}),
        "hardware": describe_hardware(run.accelerator.device, run.accelerator.num_processes),
        "mixed_precision": effective_precision(run.accelerator), "num_processes": run.accelerator.num_processes,
        "final_metrics": outcome.final_metrics,
        "sample_generations": [{"prompt": s["prompt"], "output": s["output"]} for s in state.last_samples],
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "stopped_by_time_budget": outcome.stopped_by_time_budget,
        "tokens_per_second": round(state.tokens_seen / max(state.train_seconds, 1e-9), 1),
        "train_cpu_seconds": round(outcome.cpu_seconds, 2),
        "recipe": {**run.recipe, "parameter_groups": describe_optimizer(run.optimizer)},
    }


def finish(
    run: TrainingRun, tokenizer: PreTrainedTokenizerBase | None, summary: dict[str, Any], *, max_new_tokens: int,
    card: bool = True, push_to: str | None = None,
) -> int | None:
    """Write the final folder (main process), draw its loss curve, render its card, push it if asked.

    The files are written into a hidden folder first and renamed into place with training_summary.json last:
    a folder with a summary holds a complete model. A stop signal during the save lets it complete (and skips
    the push); it is returned (None: no signal). A full disk leaves no hidden folder and is one error.
    """
    accelerator = run.accelerator
    accelerator.wait_for_everyone()
    with StopSignals(then="completing the final save, then stopping", quit_on_second=False) as signals:
        state_dict = gathered_weights(accelerator, run.model)
        if accelerator.is_main_process and run.output_dir is not None:
            save_final_folder(run, tokenizer, summary, max_new_tokens=max_new_tokens, card=card,
                              state_dict=state_dict)
        accelerator.wait_for_everyone()
    if push_to and signals.received is None and accelerator.is_main_process:
        from ..hub.push import push_to_hub

        push_to_hub(run.output_dir, push_to)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return signals.received


def gathered_weights(accelerator: Accelerator, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """A sharded (FSDP) model's full weights, gathered on the CPU; every process must call it. None for the other
    kinds of run, whose model holds its whole weights and is saved as it is."""
    if accelerator.distributed_type != DistributedType.FSDP:
        return None
    return accelerator.get_state_dict(model)


def save_final_folder(
    run: TrainingRun, tokenizer: PreTrainedTokenizerBase | None, summary: dict[str, Any], *, max_new_tokens: int,
    card: bool, state_dict: dict[str, torch.Tensor] | None = None,
) -> None:
    """The model (``state_dict``: its gathered weights, FSDP), tokenizer, summary and loss curve written into
    ``.final.partial``, renamed into place (the summary last), then the card. The space it needs is checked
    first; a disk that cannot hold it gets the model written on another disk instead (``rescue``)."""
    model = run.accelerator.unwrap_model(run.model, keep_torch_compile=False)
    partial = run.output_dir / f".final{PARTIAL_SUFFIX}"  # written whole, then renamed file by file
    shutil.rmtree(partial, ignore_errors=True)

    def write(folder: Path) -> None:
        save_final_model(model, tokenizer, folder, summary, max_new_tokens=max_new_tokens, state_dict=state_dict)

    need = final_save_bytes(model, tokenizer, state_dict)
    try:
        check_room(run.output_dir, need)
        write(partial)
        draw_loss_curve(run.output_dir, partial / LOSS_CURVE_FILE)
    except (OSError, RuntimeError, SafetensorError) as error:
        shutil.rmtree(partial, ignore_errors=True)
        failure = write_failure(error, partial, run.output_dir)
        if failure is error:
            raise
        raise rescue_final_model(write, run.output_dir, need, summary.get("steps", 0), summary.get("run_id"),
                                 error, failure) from None
    move_files_into(partial, run.output_dir, last=SUMMARY_FILE)  # the summary marks a finished run
    if card:
        write_card(run.output_dir)


def draw_loss_curve(output_dir: Path, out: Path) -> Path | None:
    """The loss curve of output_dir/metrics.jsonl into ``out`` (skipped with a warning when it cannot be drawn:
    no matplotlib, or no train record yet)."""
    try:
        from .curves import plot_training

        plot_training(output_dir, out, title=f"Training curves: {output_dir.name}")
    except (ImportError, ValueError) as err:
        logger.warning("no loss curve: %s", err)
        return None
    return out


def write_card(output_dir: Path) -> Path | None:
    """README.md model card (skipped with a warning when it cannot be rendered: the model is saved already)."""
    try:
        from ..hub.card import write_model_card

        return write_model_card(output_dir)
    except Exception as err:  # noqa: BLE001  a card problem must not lose the run
        logger.warning("the model card could not be rendered: %s", err)
        return None


def main(argv: list[str] | None = None) -> Path:
    """`minitx train [ARGS.json|yaml] --name value ...`."""
    model_args, data_args, train_args = parse_training_args(argv)
    try:
        return train(model_args, data_args, train_args)
    finally:  # the folder's lock, taken when the run claimed it
        if train_args.output_dir:
            unlock_folder(output_path(train_args.output_dir))
