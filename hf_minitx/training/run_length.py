"""How long a run trains, in optimizer steps, and what hangs on that length.

    run_length              --max_steps, --num_epochs, or a time budget's provisional or recorded plan
    schedule_changes        resumes that laid the schedule over another length, carried in every checkpoint
    lay_plan                a time budget's plan, once its probe timed the steps: the schedule is laid over it
    keep_pace               the plan laid again where the steps' pace would end it well past or before the budget
    evaluation_passed       an evaluation a shorter final plan placed before the step where it was made
    refuse_unplanned_budget a budget that ran out inside its probe made no plan: one error, no model
    late_dropout_plan       the step where --late_dropout switches the hidden dropout on (a number of passes)

``budget.py`` holds the time budget's arithmetic (``TimeBudget``, ``Probe``); this module applies it to a run.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import torch
from accelerate.utils import broadcast_object_list
from torch import nn

from ..launch import process_count
from .arguments import TrainArguments
from .budget import LENGTH_FREE_SCHEDULES, Probe, TimeBudget, every, length_cap
from .optim import describe_schedule, relay_schedule, schedule_factor
from .run_plan import RunPlan
from .shape_plan import PHASES, SHAPE_PLAN
from .state import FitOutcome, LoopSettings, RunState, TrainingRun

logger = logging.getLogger(__name__)


def run_length(plan: RunPlan, batches_per_epoch: int | None) -> tuple[int, TimeBudget | None]:
    """(optimizer steps the schedule spans, the time budget's plan or None without --max_minutes).

    Without a budget: --max_steps, else --num_epochs (default 1). With one: the plan the resumed checkpoint
    recorded, else a provisional length until the probe fixes the plan (``budget``), bounded by --max_steps or
    a given --num_epochs.
    """
    args, k = plan.train_args, plan.train_args.gradient_accumulation_steps

    if args.max_minutes is None:
        return length_cap(args.max_steps, args.num_epochs or 1.0, batches_per_epoch, k), None
    saved = plan.resume_state or {}
    timing = saved.get("plan_timing") or {}
    cap = length_cap(args.max_steps, args.num_epochs, batches_per_epoch, k) or timing.get("step_cap")
    stable = args.lr_scheduler_type in LENGTH_FREE_SCHEDULES and args.decay_ratio < 1
    fractions = [v for v in (args.eval_steps, args.checkpointing_steps) if v and v < 1]
    planned_for = timing.get("budget_minutes") if saved.get("planned_steps") else None  # see resumed_budget
    budget = TimeBudget((planned_for or args.max_minutes) * 60, step_cap=cap, eval_steps=args.eval_steps or None,
                        decay_ratio=(args.decay_ratio if args.lr_scheduler_type == "warmup_stable_decay" else 0.0)
                        if stable else None, first_fraction=min(fractions, default=None),
                        one_process=process_count() == 1)
    if saved.get("planned_steps"):  # a resumed run continues its plan; a longer budget only moves the clock
        budget.planned_steps, budget.final = saved["planned_steps"], bool(saved.get("plan_final", True))
        if planned_for and not math.isclose(planned_for, args.max_minutes):
            budget.planned_for_minutes, budget.clock_seconds = planned_for, args.max_minutes * 60
        budget.seconds_per_step = timing.get("seconds_per_step")
        budget.seconds_per_evaluation = timing.get("seconds_per_evaluation")
        replanned = timing.get("replanned_at") or []  # (one step, in a checkpoint of an earlier version)
        budget.replanned_at = replanned if isinstance(replanned, list) else [replanned]
        budget.span_ratio = timing.get("span_ratio") or 1.0
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


def lay_plan(run: TrainingRun, state: RunState, fitting: int, step_seconds: float, eval_seconds: float) -> None:
    """Fix the time budget's plan from the timed figures (every process's mean; ``fitting``: the steps that fit in
    the time left): the state records it, the schedule is laid over the planned steps, and the evaluation and
    checkpoint intervals given as fractions of the run follow."""
    budget, args = run.budget, run.schedule_args
    planned = budget.plan(state.step, fitting, step_seconds, eval_seconds)
    state.planned_steps, state.plan_final = planned, budget.final
    state.plan_timing = budget.timing()
    relay_schedule(run.scheduler, args, planned)
    run.settings = replace(run.settings, total_steps=planned, eval_steps=every(args.eval_steps, planned),
                           checkpointing_steps=every(args.checkpointing_steps, planned))
    run.recipe["schedule"] = describe_schedule(args, planned)
    run.accelerator.print(f"time budget of {budget.seconds / 60:g} min: {step_seconds * 1000:.0f} ms per step"
                          + (f", {eval_seconds:.1f} s per evaluation" if eval_seconds else "")
                          + f"; the schedule is laid over {planned} steps"
                          + ("" if budget.final else f" (timed again at step {budget.replan_step(planned)})"))


def keep_pace(run: TrainingRun, state: RunState, window: Probe, elapsed: float) -> bool:
    """After a window of steps timed against the plan (``TimeBudget.guard_window``): the pace every process saw
    (their mean, one reduce), and where the plan would end well past the budget or well before it at that pace,
    the plan laid again from this step (``lay_plan``), so that its decay ends by the budget. Returns whether it
    changed."""
    budget = run.budget
    figures = torch.tensor([window.seconds_per_step, elapsed], dtype=torch.float64, device=run.accelerator.device)
    span, elapsed = run.accelerator.reduce(figures, "mean").tolist()
    step_seconds = span / budget.span_ratio  # what the plan's timing would have measured
    paced = budget.paced_plan(state.step, elapsed, step_seconds)
    if paced is None:
        return False
    run.accelerator.print(f"steps now take {step_seconds * 1000:.0f} ms, not the {budget.seconds_per_step * 1000:.0f} "
                          f"ms timed: the plan of {budget.planned_steps} steps would end "
                          f"{'past' if paced < budget.planned_steps else 'well before'} the budget")
    budget.replanned_at.append(state.step)
    lay_plan(run, state, paced, step_seconds, budget.seconds_per_evaluation or 0.0)
    return True


def evaluation_passed(settings: LoopSettings, step: int, evaluated_at: int) -> bool:
    """Whether an evaluation the (final) plan places at or before ``step`` has not run: a fraction of the run
    that a shorter final plan put before the step where the plan was made."""
    if not settings.eval_steps or step >= settings.total_steps:
        return False
    due = step // settings.eval_steps * settings.eval_steps
    return due > 0 and evaluated_at < due


ADVICE_SLACK = 1.25  # the budget advised after a probe ran out plans for steps this much slower than it timed


def ran_out_in_probe(run: TrainingRun, outcome: FitOutcome) -> bool:
    """Whether a time budget ran out inside its timing probe, before any plan was laid."""
    return outcome.stopped_by_time_budget and run.budget is not None and run.budget.planned_steps is None


def refuse_unplanned_budget(run: TrainingRun, state: RunState, outcome: FitOutcome, *, old_back: bool = False
                            ) -> None:
    """A time budget that ran out inside its timing probe made no plan: its steps ran the warmup of a provisional
    schedule that never decayed. That model is not the run's result: one error says what a step costs and what
    budget would do, and the checkpoint saved at the stop (``stop_early``) can be resumed with a longer one; where
    the run replaced a folder, its old contents are back instead (``old_back``: nothing was replaced)."""
    budget = run.budget
    if not ran_out_in_probe(run, outcome):
        return
    if run.accelerator.num_processes > 1:  # only the first process kept the old contents aside: its answer for all
        old_back = broadcast_object_list([old_back])[0]
    shape_plan = run.checkpoint_fields.get(SHAPE_PLAN) or {}  # its timing is on the clock, but is no step's
    timing = min(shape_plan.get("timing_seconds", 0.0), state.train_seconds)
    step_seconds = (state.train_seconds - timing) / max(state.step, 1)
    share = shape_plan.get(PHASES)
    whose = (f" (the teacher's share of a {share['minutes']:g}-minute budget split in two)"
             if share and math.isclose(budget.seconds / 60, share["teacher_minutes"]) else "")
    evaluation = budget.seconds_per_evaluation or 0.0  # timed by the probe (fix_plan), on the clock of no step
    made = f" and an evaluation of {evaluation:.1f} s" if evaluation else ""
    # a new process starts up again (its first steps), evaluates in its probe and at its end, and a resumed budget
    # counts the seconds trained so far (not that evaluation), then times a probe of its own; never the budget that
    # just ran out, nor less; its steps may be a little slower than these were (ADVICE_SLACK)

    def advised(spent: float) -> str:
        minutes = budget.shortest_budget(step_seconds * ADVICE_SLACK, spent + 2 * evaluation + budget.startup_seconds)
        return f"--max_minutes {max(minutes, math.floor(budget.seconds / 60 * 100 + 1) / 100):g} or more"

    resume = (f"{run.output_dir} holds its old contents again, as nothing was replaced: run again with "
              f"{advised(timing)}" if old_back else f"{outcome.checkpoint} holds them: resume it with "
              f"--resume_from_checkpoint latest {advised(state.train_seconds)}"
              if outcome.checkpoint else f"nothing was saved: run again with {advised(timing)}")
    raise ValueError(f"--max_minutes {budget.seconds / 60:g} ({budget.seconds:.1f} s){whose} ran out after "
                     f"{state.step} step(s) of about {step_seconds:.2f} s{made}, inside the timing probe that "
                     f"makes the plan (the {budget.probe_steps} steps after a start or a resume): the schedule "
                     f"never decayed, so no model is saved as the run's result; {resume} (the probe and as many "
                     "steps again), or train a number of steps with --max_steps")


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
