"""The training loop, read top to bottom: ``train()`` is setup -> fit -> finish.

    setup            (setup.py) accelerator, data, model, optimizer, schedule, resume -> a TrainingRun, a RunState
    fit              the loop: one optimizer step per accumulation window, until a stop
      train_step       forward, token-summed loss, backward, clipping, the NaN guard, the optimizer step
      log_train        a train record in metrics.jsonl every logging_steps
      validate         the run's evaluation, an eval record
      save_checkpoint  (checkpoints.py) accelerator state + run_state.json (the RunState) in checkpoint-STEP/
    finish           (end_of_run.py) the summary, the model folder, the loss curve, the model card (and the push)

Runs as ``minitx train ...`` or ``accelerate launch --num_processes N -m hf_minitx train ...``. The toy experiments
(``minitx experiment``) build a TrainingRun from in-memory token ids and call the same ``fit()`` and ``finish()``.

The loop knows nothing of the model's internals: it feeds batches, takes the logits and computes the token
cross-entropy itself (the ``Objective``), so that the loss of an optimizer step is the mean over the labelled
tokens of the whole accumulation window, on every process together. The state it drives is in ``state.py``, the
stop signals in ``signals.py``, the run's length and time-budget plan in ``run_length.py``.
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch
from tqdm.auto import tqdm

from ..cli import EXIT_INTERRUPTED, Interrupted
from ..data.corpus import UndecodableText
from ..device import random_state_kept
from ..folders import lock_folder, output_path, unlock_folder
from .arguments import DataArguments, ModelArguments, TrainArguments, parse_training_args
from .budget import TIMED_FROM, Probe
from .calibration import calibrate
from .checkpoints import CHECKPOINT_PREFIX, list_checkpoints, save_checkpoint
from .divergence import check_finite
from .end_of_run import finish, gathered_weights, keep_best, train_summary
from .evaluation import chance_note
from .outputs import CALIBRATED, append_metrics
from .phases import continue_phases, past_first_phase
from .run_folder import abandon_setup, lock_output_folder, settle_replaced
from .run_length import (
    evaluation_passed,
    keep_pace,
    lay_plan,
    ran_out_in_probe,
    refuse_unplanned_budget,
    switch_on_late_dropout,
)
from .run_plan import AlreadyComplete, plan_run
from .setup import setup
from .shape_plan import planned_split
from .signals import StopSignals, TermDuringSetup
from .state import FitOutcome, RunState, TrainingRun


class WindowCounts(NamedTuple):
    """One accumulation window, summed over every process."""

    label_tokens: int
    input_tokens: int
    time_up: bool
    interrupted: bool


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

    def saved(self) -> dict[str, float] | None:
        """The window as a checkpoint keeps it (``RunState.log_window``); None when it is empty."""
        if not self.tokens:
            return None
        return {"nats": self.nats, "tokens": self.tokens, "input_tokens": self.input_tokens,
                "seconds": time.perf_counter() - self.start}

    @classmethod
    def resumed(cls, saved: dict[str, float] | None) -> Interval:
        """The window a checkpoint kept, so that a resumed run's first record averages the steps a straight
        run's does (its rate counts the seconds the steps took, not the restart)."""
        if not saved:
            return cls()
        return cls(saved["nats"], int(saved["tokens"]), int(saved["input_tokens"]),
                   time.perf_counter() - saved["seconds"])


# --- train(): setup -> fit -> finish ---------------------------------------------------------------


def train(model_args: ModelArguments, data_args: DataArguments, train_args: TrainArguments) -> Path:
    """Run one training job end to end; returns the output folder holding the final model.

    Ctrl-C before the first step (imports, data, tokenizer) leaves nothing half-written; a resumed run that
    is already complete writes nothing."""
    if train_args.resume_from_checkpoint is not None and past_first_phase(train_args.output_dir):
        lock_folder(output_path(train_args.output_dir), command="train")
        return continue_phases(model_args, data_args, train_args, output_path(train_args.output_dir), train)
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
        code = 128 + signal.SIGTERM if terminated.received else EXIT_INTERRUPTED
        raise Interrupted(abandon_setup(plan), code) from None
    except BaseException:  # a failure before the first step leaves the folder as it found it
        abandon_setup(plan)
        raise
    try:
        outcome = fit(run, state)
    except BaseException:  # nothing trained yet (bad data at the first batch): as a failed setup, else old contents go
        abandon_setup(plan) if state.step == 0 else settle_replaced(plan, restore=False)
        raise
    old_back = settle_replaced(plan, restore=ran_out_in_probe(run, outcome))  # back where a budget ran out in its probe
    refuse_unplanned_budget(run, state, outcome, old_back=old_back)
    if outcome.interrupted_by is not None:
        saved = f"saved {outcome.checkpoint}" if outcome.checkpoint else "nothing could be saved"
        raise Interrupted(
            f"training stopped by {signal.Signals(outcome.interrupted_by).name} after step {state.step}; {saved}. "
            "Resume with the same command plus --resume_from_checkpoint latest", 128 + outcome.interrupted_by)
    summary = train_summary(plan, run, state, outcome)
    at_chance = chance_note(outcome.final_metrics, len(tokenizer))
    if at_chance:
        summary["warning"] = at_chance
    split = planned_split(plan.shape_plan)  # this run is a teacher: the student's folder is pushed, at the end
    push = train_args.push_to_hub and not split and outcome.late_signal is None
    received = finish(run, tokenizer, summary,
                      max_new_tokens=data_args.max_target_length if not plan.objective.shift else 128,
                      push_to=train_args.hub_model_id if push else None)
    if received is not None or outcome.late_signal is not None:
        received, during = ((received, "the final save") if received is not None
                            else (outcome.late_signal, "the temperature fit"))
        raise Interrupted(f"{signal.Signals(received).name} arrived during {during}, which was completed first: "
                          f"{plan.output_dir} holds the finished model of {state.step} steps (not pushed)",
                          128 + received)
    if at_chance and run.accelerator.is_main_process:
        print(at_chance)  # the last line, where it is seen
    if split:
        return continue_phases(model_args, data_args, train_args, plan.output_dir, train)
    return plan.output_dir


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
    outcome, interval, evaluated_at = FitOutcome(), Interval.resumed(state.log_window), -1
    start, cpu_start = time.perf_counter() - state.train_seconds, time.process_time()
    untrained: dict[str, Any] | None = None
    timing = PlanTiming.begin(run, state)
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
            state.log_window = interval.saved()  # what a checkpoint of this step keeps of the window
            evaluation_seconds = 0.0
            if settings.eval_steps and state.step % settings.eval_steps == 0:
                evaluated_at, begin = state.step, time.perf_counter()
                if evaluate_and_check_target(run, state, outcome):
                    break
                evaluation_seconds = time.perf_counter() - begin
            if settings.checkpointing_steps and state.step % settings.checkpointing_steps == 0:
                save_checkpoint(run, state)
            made, relaid = timing.after_step(run, state, (step_start, start), evaluation_seconds, evaluated_at)
            if relaid:
                evaluated_at, settings = max(evaluated_at, made), run.settings
                progress.total = settings.total_steps if run.budget.planned_steps else None  # none: the probe spent it
                progress.refresh()
                if evaluation_passed(settings, state.step, evaluated_at):  # the final plan put one before this step
                    evaluated_at = state.step
                    if evaluate_and_check_target(run, state, outcome):
                        break
        progress.close()
        refused = ran_out_in_probe(run, outcome)  # refused (refuse_unplanned_budget): no final evaluation
        if evaluated_at != state.step and outcome.interrupted_by is None and not refused:  # protected like the steps
            evaluate_and_check_target(run, state, outcome)
            if stop_wished(run, signals.received):
                outcome.interrupted_by = signals.received or signal.SIGTERM
                outcome.checkpoint = checkpoint_of_last_step(run, state, untrained)
        if outcome.interrupted_by is None and not refused:
            keep_best(run, state, outcome)
    if outcome.interrupted_by is None and settings.calibrate and not refused:  # seconds, then the final save
        with StopSignals(then="completing the temperature fit and the final save, then stopping",
                         quit_on_second=False) as late:
            calibrate_temperature(run, state, outcome)
        # every process stops alike, as after a step: one that got no signal must not push and exit 0
        outcome.late_signal = late.received or (signal.SIGTERM if stop_wished(run, late.received) else None)
    outcome.cpu_seconds = time.process_time() - cpu_start
    return outcome


def train_step(
    run: TrainingRun, state: RunState, window: list[dict[str, torch.Tensor]], label_tokens: int
) -> tuple[float, float]:
    """One optimizer step on a window of micro-batches; returns (mean loss per label token, learning rate).

    The loss is the cross-entropy, plus the teacher's KL term with ``--distill_from`` (``distill.py``).
    Each micro-batch's summed loss is divided by the window's global token count; backward divides by the
    accumulation steps and DDP averages over processes, so both factors are put back here.
    """
    accelerator, model, objective = run.accelerator, run.model, run.objective
    scale = accelerator.num_processes * len(window) / max(label_tokens, 1)
    window_nats = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    for batch in window:
        with accelerator.accumulate(model):
            inputs = objective.model_inputs(batch)
            logits = model(**inputs).logits  # (batch, seq, vocab)
            summed = objective.summed_loss(logits, batch["labels"])
            if run.distillation is not None:  # the teacher runs in the step's precision, without gradients
                with accelerator.autocast():
                    summed = summed + run.distillation.summed_loss(inputs, logits, batch["labels"], objective.shift)
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


def draw_window(run: TrainingRun, state: RunState, untrained: dict[str, Any] | None) -> list[dict[str, torch.Tensor]]:
    """The next accumulation window of micro-batches. Text that cannot be decoded (a streamed file) saves the
    checkpoint of the last trained step first (none before step 1: nothing to keep), and the error says how to go
    on from there."""
    try:
        return [next(run.batches) for _ in range(run.settings.accumulation_steps)]
    except UndecodableText as error:
        checkpoint = None if state.step == 0 else checkpoint_of_last_step(run, state, untrained)
        if checkpoint is None:
            raise
        raise UndecodableText(f"{error}. Training stopped after step {state.step} and saved {checkpoint}: resume it "
                              "with the same command plus --skip_bad_rows --resume_from_checkpoint latest (or, once "
                              "the file is converted, --accept_changed_inputs --resume_from_checkpoint latest)"
                              ) from None


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


def validate(run: TrainingRun, state: RunState, **record: Any) -> dict[str, float]:
    """Run the evaluation, keep its samples in the state, write an eval record (with ``record``'s fields
    beside the metrics); returns the metrics."""
    with random_state_kept(run.accelerator.device):  # how often a run evaluates changes no dropout mask
        metrics, state.last_samples = run.evaluation(run.model, run.accelerator)
    run.model.train()
    if run.best is not None and not record:  # a record's evaluation (the temperature's) is of weights already kept
        if run.best.beaten_by(metrics):  # the same on every process: the metrics are reduced
            run.best.offer(run.accelerator.unwrap_model(run.model, keep_torch_compile=False), state.step, metrics,
                           weights=gathered_weights(run.accelerator, run.model))
        state.best_step, state.best_metrics = run.best.step, run.best.metrics
    if run.accelerator.is_main_process:
        if run.output_dir is not None:
            append_metrics(run.output_dir, {"type": "eval", "step": state.step, **record, **metrics})
        shown = ", ".join(f"{k.removeprefix('eval_')} {v:.4g}" for k, v in metrics.items())
        tqdm.write(f"[eval step {state.step}{''.join(f', {k} {v:g}' for k, v in record.items())}] {shown}")
        for sample in state.last_samples:
            tqdm.write(f"  {sample['prompt']!r} -> {sample['output']!r}")
    run.accelerator.log(metrics, step=state.step)
    return metrics


def calibrate_temperature(run: TrainingRun, state: RunState, outcome: FitOutcome) -> None:
    """--calibrate_temperature: fit the temperature on the validation split and fold it into the weights
    (``calibration.py``), then evaluate the model as it will be saved: its metrics are the final ones."""
    outcome.calibration = calibrate(run.model, run.evaluation.loader, run.objective, run.accelerator)
    if outcome.calibration is not None and outcome.calibration["logit_scale"] != 1.0:
        outcome.final_metrics = validate(run, state, **{CALIBRATED: outcome.calibration["temperature"]})


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


@dataclass
class PlanTiming:
    """A time budget's timing windows: the probe's (the first and the final plan, ``fix_plan``), which times a step
    from its start to its end, less its evaluation, and the guard's (a shorter plan where the steps slowed down,
    ``keep_pace``). The guard reads no clock of its own: it times each step's span between the two readings every
    step makes (its start, and the run's clock after the optimizer step), which the probe times too, so that the
    guard's pace converts to the plan's (``TimeBudget.span_ratio``)."""

    probe: Probe | None = None
    guard: Probe | None = None

    @classmethod
    def begin(cls, run: TrainingRun, state: RunState) -> PlanTiming:
        if run.budget is None:
            return cls()
        return cls(Probe.window(run.budget, state.step), run.budget.guard_window(state.step, settle=TIMED_FROM))

    def after_step(self, run: TrainingRun, state: RunState, starts: tuple[float, float], evaluation_seconds: float,
                   evaluated_at: int) -> tuple[int, bool]:
        """Count the step just made (``starts``: its start and the run's, on the clock) in the open windows, and
        plan where one closes. Returns (the step of an evaluation the plan made here or -1, whether it changed)."""
        if self.probe is None and self.guard is None:
            return -1, False
        step_start, start = starts
        span = state.train_seconds - (step_start - start)  # drawing the window and the optimizer step
        probe = self.probe
        if probe is not None and probe.timed(state.step, time.perf_counter() - step_start - evaluation_seconds, span):
            self.probe, made = fix_plan(run, state, self.probe, time.perf_counter() - start,  # may evaluate once
                                        evaluation_seconds if evaluated_at == state.step else None)
            self.guard = run.budget.guard_window(state.step)
            return made, True
        if probe is not None:  # its first steps, untimed: a process's start-up, which a refusal's advice pays again
            run.budget.startup_seconds = probe.untimed
        if self.guard is not None and self.guard.timed(state.step, span):
            relaid = keep_pace(run, state, self.guard, time.perf_counter() - start)
            if relaid and self.probe is not None and self.probe.last >= run.budget.decay_from:
                self.probe = None  # the second timing would end in the new plan's decay: this plan is the last
            self.guard = run.budget.guard_window(state.step)
            return -1, relaid
        return -1, False


def fix_plan(run: TrainingRun, state: RunState, probe: Probe, elapsed: float,
             evaluated: float | None = None) -> tuple[Probe | None, int]:
    """Plan the time budget from the timed window: the figures agreed by every process (their mean); the first
    time, one evaluation is timed when the run will evaluate along the way (``evaluated``: the seconds of one
    made at this step already, timed instead of a second). The schedule is laid over the planned steps
    (``lay_plan``). Returns (the next timing window or None once the plan is final, the step of an evaluation
    made here or -1)."""
    budget, accelerator = run.budget, run.accelerator
    figures = torch.tensor([probe.seconds_per_step, elapsed, probe.span_per_step], dtype=torch.float64,
                           device=accelerator.device)
    step_seconds, elapsed, span = accelerator.reduce(figures, "mean").tolist()
    budget.span_ratio = span / step_seconds if step_seconds > 0 and span > 0 else 1.0  # the guard's pace to the plan's
    evaluated_at, eval_seconds = -1, budget.seconds_per_evaluation or 0.0
    if budget.planned_steps is None and budget.evaluations(budget.steps_that_fit(state.step, elapsed, step_seconds, 0)):
        made_here = evaluated is None  # after ``elapsed`` was read (one made before it is in it)
        if made_here:
            begin = time.perf_counter()
            validate(run, state)
            evaluated = time.perf_counter() - begin
        spent = torch.tensor(evaluated, dtype=torch.float64, device=accelerator.device)
        evaluated_at, eval_seconds = state.step, accelerator.reduce(spent, "mean").item()
        if made_here:
            elapsed += eval_seconds
    fitting = budget.steps_that_fit(state.step, elapsed, step_seconds, eval_seconds)
    if budget.planned_steps is None and fitting <= state.step and fitting != budget.step_cap:
        # the probe spent the budget: no step is left to decay in, so no plan is laid and the clock stops the
        # run at once, as one that ran out inside its probe (refuse_unplanned_budget: a checkpoint to resume)
        run.settings = replace(run.settings, max_seconds=0.0)
        budget.seconds_per_evaluation = eval_seconds  # for the refusal's advice
        return None, evaluated_at
    lay_plan(run, state, fitting, step_seconds, eval_seconds)
    return (None if budget.final else budget.second_window(state.step)), evaluated_at


def main(argv: list[str] | None = None) -> Path:
    """`minitx train [ARGS.json|yaml] --name value ...`."""
    model_args, data_args, train_args = parse_training_args(argv)
    try:
        return train(model_args, data_args, train_args)
    finally:  # the folder's lock, taken when the run claimed it
        if train_args.output_dir:
            unlock_folder(output_path(train_args.output_dir))
