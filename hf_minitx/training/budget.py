"""A time budget as a plan in steps: ``--max_minutes T`` becomes the step count the schedule is laid over.

A schedule (warmup, the stable phase, the decay) is defined in optimizer steps, so a budget in minutes has to
become a number of steps before the decay can be placed. The run's own steps are timed, in two stages:

    steps 1..PROBE_STEPS        warmup: the learning rate does not depend on the run's length yet
                                (steps after TIMED_FROM are timed: the first ones allocate optimizer state)
    at PROBE_STEPS              a first plan; one evaluation is timed too if the run evaluates along the way
    REPLAN_FROM..REPLAN_AT      the stable phase of warmup_stable_decay (or constant_with_warmup), whose rate does
    of the first plan           not depend on the length either: timed again, over many more steps, once the
                                machine has settled (the first hundred steps of a run are often the slowest);
                                after the step from which steps cost more (``slower_from``: late dropout) when
                                that step lies before the decay, so the plan prices the steps it has left
    at REPLAN_AT                the final plan: no more timings of the probe (the guard below may lay it again)
    every GUARD_FRACTION        from the first plan until its decay begins, the pace is checked: where the plan
    of the plan (or the time    would end past the budget at it (a busy machine), or well before (the machine is
    planned for it)             free again), it is laid again at that pace (``paced_plan``), so the decay still
                                ends by the budget and a slowdown that passed costs no steps

Every process measures and the mean is taken (one reduce), so all agree. The plan is recorded in every
checkpoint (``RunState.planned_steps``) and in training_summary.json: a resumed run continues the same plan (see
``resumed_budget``: with or without --max_minutes; a longer one only moves the clock's stop), and
``--max_steps planned_steps`` repeats the run without a clock, bit for bit (the rates of the steps timed before
the plan was final do not depend on the length). Schedules whose rate depends on the length from the first step
after warmup (cosine, linear) keep the first plan. The plan ends ``MARGIN`` before the budget; the clock stays a
safety cap ``GRACE`` after it: a machine that slows down more than that during the decay (which is never
moved) is stopped there, and the summary says so.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

PROBE_STEPS = 20  # the first plan after this many steps (the default 20 warmup steps: their rates need no length)
TIMED_FROM = 4  # steps 1..TIMED_FROM are not timed: they allocate optimizer state and warm caches
REPLAN_FROM, REPLAN_AT = 0.2, 0.5  # the second timing: from/to these fractions of the first plan (before the decay)
MARGIN = 0.04  # of the budget, kept for what the timing cannot see (checkpoints, logging, jitter)
GRACE = 0.02  # of the budget: the clock's cap lies this far past it, so that a slower end still finishes the decay
LENGTH_FREE_SCHEDULES = ("warmup_stable_decay", "constant_with_warmup")  # their rate before the decay needs no length
MIN_WINDOW = 50  # steps: a second timing after ``slower_from`` needs at least these before the decay
SHORTER = 0.25  # a second timing after ``slower_from`` ends early enough for a final plan this much shorter
GUARD_FRACTION = 0.1  # of the plan: the pace is checked over windows this long (at least probe_steps) until the decay
MIN_OVERDUE = 5  # steps: a guard's window that spent its planned time closes early after at least these
EARLY_END = 3 * MARGIN  # of the budget: a plan laid again when it would end this far before it (or past the cap)


def length_cap(max_steps: int | None, num_epochs: float | None, batches_per_epoch: int | None,
               accumulation_steps: int) -> int | None:
    """The steps --max_steps (which wins) or --num_epochs bound a run to; None: neither (or epochs of a stream,
    whose length is unknown)."""
    if max_steps:
        return max_steps
    if num_epochs and batches_per_epoch:
        return max(1, math.ceil(num_epochs * batches_per_epoch / accumulation_steps))
    return None


@dataclass
class TimeBudget:
    """The plan of a run with ``--max_minutes``: the budget, the length bound from --max_steps/--num_epochs, the
    measurements and, once fixed, ``planned_steps``."""

    seconds: float
    step_cap: int | None = None  # --max_steps, or --num_epochs given with the budget; None: the time alone
    eval_steps: float | None = None  # evaluations along the way cost time too (a value < 1: a fraction of the run)
    decay_ratio: float | None = None  # a stable phase before a decay of this fraction: the plan is timed twice
    probe_steps: int = PROBE_STEPS
    seconds_per_step: float | None = None
    seconds_per_evaluation: float | None = None
    planned_steps: int | None = None
    final: bool = False  # the probe's timings are done (only the guard, ``paced_plan``, lays the plan again)
    planned_for_minutes: float | None = None  # a resume under another budget: the one the plan was made for
    clock_seconds: float | None = None  # a resume with a longer --max_minutes: the clock's (the plan's: seconds)
    first_fraction: float | None = None  # the smallest of --eval_steps/--checkpointing_steps in (0, 1): placed on
    # the final plan, so the second timing ends before that fraction of the run (unless it waits for slower_from)
    slower_from: int | None = None  # the step from which steps cost more (--late_dropout switches dropout on)
    startup_seconds: float = 0.0  # this process's untimed first steps (``Probe.untimed``), for a refusal's advice
    replanned_at: list[int] = field(default_factory=list)  # the steps where the plan was laid again at the steps'
    # pace (paced_plan)
    span_ratio: float = 1.0  # what the guard times of a step (``Probe.spans``) over what the plan times of it
    one_process: bool = True  # False in a launch of several processes (``guard_window``)

    @property
    def fixed(self) -> bool:
        return self.final

    @property
    def minutes(self) -> float:
        """The budget the clock runs to: --max_minutes (after a resume with a longer one, that one)."""
        return max(self.seconds, self.clock_seconds or 0.0) / 60

    @property
    def cap_seconds(self) -> float:
        """Where the clock stops a run whose steps ran slower than timed: the planned end is 4% before the budget,
        the cap 2% after it, so a machine up to ~6% slower than its timing still ends on its plan. A resume with a
        longer --max_minutes moves it there (``clock_seconds``)."""
        return self.minutes * 60 * (1.0 + GRACE)

    def provisional_steps(self) -> int:
        """The schedule's length before a plan: the cap, or a length whose first steps are warmup and peak for
        every transformers schedule."""
        return self.step_cap or 10**9

    def shortest_budget(self, step_seconds: float, spent: float = 0.0) -> float:
        """Minutes a budget needs at ``step_seconds`` a step to make a plan and decay: the timing probe and as many
        steps again, before the margin, after ``spent`` seconds on the clock that no step took (a shape's timing)."""
        return math.ceil((spent + 2 * self.probe_steps * step_seconds) / (1.0 - MARGIN) / 60 * 100) / 100

    def evaluations(self, steps: int) -> int:
        """How many evaluations a run of ``steps`` makes along the way."""
        if not self.eval_steps:
            return 0
        return math.floor(1 / self.eval_steps) if self.eval_steps < 1 else steps // int(self.eval_steps)

    def steps_that_fit(self, done: int, elapsed: float, step_seconds: float, eval_seconds: float,
                       margin: float = MARGIN, evaluated: int = 0) -> int:
        """The ``done`` steps plus those that fit in the budget, less ``margin`` of it, left after ``elapsed``
        seconds, each costing ``step_seconds``, with the evaluations to come costing ``eval_seconds`` each
        (``evaluated``: how many of a fixed number were made already)."""
        left, per_step = self.seconds * (1.0 - margin) - elapsed, step_seconds
        if self.eval_steps and self.eval_steps < 1:  # a fixed number of evaluations, whatever the length
            left -= max(0, self.evaluations(0) - evaluated) * eval_seconds
        elif self.eval_steps:  # one every eval_steps steps
            per_step += eval_seconds / self.eval_steps
        steps = done + max(0, math.floor(left / max(per_step, 1e-9)))
        return min(steps, self.step_cap) if self.step_cap else steps

    def plan(self, done: int, steps: int, step_seconds: float, eval_seconds: float) -> int:
        """Record a plan of ``steps`` made after ``done`` steps. The first plan of a schedule with a stable phase
        waits for a second timing (``replan_step``); the second one keeps the decay ahead of ``done``."""
        second = self.planned_steps is not None
        if second and self.decay_ratio is not None:  # the decay must not have started at the old plan's pace
            steps = max(steps, math.ceil((done + 1) / (1.0 - self.decay_ratio)))
        self.seconds_per_step, self.seconds_per_evaluation = step_seconds, eval_seconds
        capped = self.step_cap is not None and steps >= self.step_cap  # --max_steps binds: no second timing changes it
        decay_from = steps * (1.0 - (self.decay_ratio or 0.0))  # a second timing must end before the decay starts
        self.final = (second or self.decay_ratio is None or capped or self.replan_step(steps) <= done
                      or self.replan_step(steps) >= decay_from)
        self.planned_steps = steps
        return steps

    def replan_step(self, planned: int) -> int:
        """The step of the final plan after a first plan of ``planned`` steps (see ``final_window``)."""
        return self.final_window(planned)[1]

    def final_window(self, planned: int) -> tuple[int, int]:
        """(first, last): the steps after ``first`` up to ``last`` are timed for the final plan, after a first plan
        of ``planned`` steps. Half of it, from a fifth on, or earlier when an evaluation or checkpoint is placed at
        a fraction of the run (laid on the final plan, which may be shorter). When steps cost more from
        ``slower_from`` on, a window as long is timed after it instead (steps timed before it would plan more steps
        than the budget holds), if at least MIN_WINDOW steps of it fit before the decay of a final plan up to
        SHORTER shorter than the first (a final plan does not move a decay that has begun)."""
        at = min(REPLAN_AT, 0.7 * self.first_fraction) if self.first_fraction else REPLAN_AT
        last = max(self.probe_steps + 20, round(at * planned))
        first = round(last * REPLAN_FROM / REPLAN_AT)
        if self.slower_from is not None and self.slower_from + TIMED_FROM > first:
            later = self.slower_from + TIMED_FROM
            room = math.floor((1.0 - SHORTER) * planned * (1.0 - (self.decay_ratio or 0.0)))
            end = min(later + max(last - first, MIN_WINDOW), room)
            if end - later >= MIN_WINDOW:
                first, last = later, end
        return first, last

    def guard_window(self, step: int, settle: int = 0) -> Probe | None:
        """The next window of steps whose pace checks the plan (after ``settle`` untimed steps: a start or a
        resume); None without a plan, for a schedule whose rate depends on the length from the start (a shorter
        plan would change rates already trained with), or where the window would reach the decay (never moved).
        It ends early once its steps took the time planned for all of them (in one process: the processes of a
        launch must close it at the same step, so they keep its length)."""
        if self.planned_steps is None or self.decay_ratio is None:
            return None
        last = step + settle + max(self.probe_steps, round(GUARD_FRACTION * self.planned_steps))
        if last >= self.decay_from:
            return None
        due = (last - step - settle) * self.seconds_per_step * self.span_ratio if self.seconds_per_step else None
        return Probe(first_timed=step + settle, last=last, due=due if self.one_process else None)

    @property
    def decay_from(self) -> float:
        """The step the plan's decay begins at (the end, for a schedule without one)."""
        return self.planned_steps * (1.0 - (self.decay_ratio or 0.0))

    def paced_plan(self, done: int, elapsed: float, step_seconds: float) -> int | None:
        """The plan laid again for steps that now cost ``step_seconds``, where at that pace the clock would stop it
        (it would end past GRACE after the budget the clock runs to: a resume with a longer --max_minutes has that
        much more) or it would end EARLY_END before the budget it was planned for (a longer clock only moves the
        stop): the steps that fit at that pace, before the margin, as a new plan laid from ``done`` would take them
        (``plan`` keeps the decay ahead of ``done``). None: the plan stands (a step's pace jitters by a few percent
        from window to window on a quiet machine)."""
        eval_seconds, clock = self.seconds_per_evaluation or 0.0, self.minutes * 60 / self.seconds
        fraction = self.eval_steps is not None and self.eval_steps < 1  # evaluations at fractions of the plan
        evaluated = done // every(self.eval_steps, self.planned_steps) if fraction else 0

        def fitting(end: float) -> int:  # the steps of a run that ends at ``end`` of the budget planned for
            return self.steps_that_fit(done, elapsed, step_seconds, eval_seconds, 1.0 - end, evaluated)

        if self.planned_steps > fitting(clock * (1.0 + GRACE)):  # the clock would stop it: fit the clock's budget
            steps = fitting(clock * (1.0 - MARGIN))
        elif self.planned_steps < fitting(1.0 - EARLY_END):  # room again, in the budget it was planned for
            steps = fitting(1.0 - MARGIN)
        else:
            return None
        return None if steps == self.planned_steps else steps

    def second_window(self, step: int) -> Probe:
        """The steps timed for the final plan, of a run at ``step`` with a first plan."""
        first, last = self.final_window(self.planned_steps)
        return Probe(first_timed=min(max(step + TIMED_FROM, first), last - 10), last=last)

    def record(self, steps_run: int, train_seconds: float, stopped_by_clock: bool) -> dict:
        """What was planned and what ran, for training_summary.json and the card."""
        return {"budget_minutes": round(self.minutes, 4), "probe_steps": self.probe_steps,
                "seconds_per_step": _round(self.seconds_per_step),
                "seconds_per_evaluation": _round(self.seconds_per_evaluation), "step_cap": self.step_cap,
                "planned_steps": self.planned_steps, "steps_run": steps_run, "train_seconds": round(train_seconds, 2),
                "ended_by": "clock" if stopped_by_clock else "plan",
                **({"replanned_at_steps": list(self.replanned_at)} if self.replanned_at else {}),
                **({"planned_for_minutes": round(self.planned_for_minutes, 4)} if self.planned_for_minutes else {})}

    def timing(self) -> dict[str, Any]:
        """What a checkpoint records of the budget (``RunState.plan_timing``), from the first step on: a resume
        without --max_minutes goes on with it, one with another --max_minutes is checked against it."""
        return {"budget_minutes": self.seconds / 60, "seconds_per_step": self.seconds_per_step,
                "seconds_per_evaluation": self.seconds_per_evaluation, "step_cap": self.step_cap,
                "replanned_at": list(self.replanned_at), "span_ratio": self.span_ratio}


def resumed_budget(args: Any, saved: dict[str, Any], checkpoint: Any) -> None:
    """One story for the time budget of a resumed run, told before any work: the checkpoint's plan goes on.

    Without --max_minutes (and without --max_steps/--num_epochs) the recorded budget is taken up again
    (``args.max_minutes`` is set), never an epoch. The same budget goes on silently; a longer one only moves the
    clock's stop (room for a slower restart); a shorter one, or another --max_steps beside it, is refused: it
    would stop the plan before its decay or contradict it. --max_steps or --num_epochs without --max_minutes lay
    the schedule over that length instead, without a clock, said here. A checkpoint saved before its plan was
    made takes the new budget; a run planned over a number of steps takes none. ``saved``: the checkpoint's run
    state (its ``plan_timing``)."""
    timing = saved.get("plan_timing") or {}
    recorded, planned = timing.get("budget_minutes"), saved.get("planned_steps")
    if recorded is None:  # not a timed run: its schedule over a number of steps goes on, as a timed one's plan does
        if args.max_minutes is not None and saved.get("total_steps"):
            raise ValueError(
                f"checkpoint {checkpoint} goes on with its schedule over {saved['total_steps']} steps, planned without "
                f"a time budget; --max_minutes {args.max_minutes:g} would lay it over a timed plan from step "
                f"{saved.get('step', 0)} on: leave --max_minutes out (with --max_steps N to train another length), "
                "or start a timed run in another --output_dir")
        return
    plan = f"the plan of {planned} steps" if planned else "a plan not made yet"
    if args.max_minutes is None:
        if args.max_steps is not None or args.num_epochs is not None:
            length = (f"--max_steps {args.max_steps}" if args.max_steps is not None
                      else f"--num_epochs {args.num_epochs:g}")
            logger.warning("the time budget of %g min and %s are replaced by %s without a clock, from step %d on "
                           "(recorded in the summary's recipe.schedule.schedule_changes)", recorded, plan, length,
                           saved.get("step", 0))
            return
        args.max_minutes = recorded
        logger.warning("resumed without --max_minutes: the checkpoint's time budget of %g min goes on, with %s (to "
                       "train another length, resume with --max_steps N and no --max_minutes)", recorded, plan)
        return
    if not planned:
        if not math.isclose(args.max_minutes, recorded):
            logger.warning("the checkpoint was saved before its plan was made: the plan is made for --max_minutes %g "
                           "(not %g), the minutes already trained counted", args.max_minutes, recorded)
        return
    cap = timing.get("step_cap")
    if args.max_steps is not None and args.max_steps != cap:
        raise ValueError(f"checkpoint {checkpoint} goes on with {plan} made for --max_minutes {recorded:g}; "
                         f"--max_steps {args.max_steps} beside --max_minutes would contradict it: leave --max_steps "
                         "out, or lay the schedule over another length with --max_steps N and no --max_minutes")
    if math.isclose(args.max_minutes, recorded):
        return
    if args.max_minutes < recorded:
        raise ValueError(f"checkpoint {checkpoint} goes on with {plan} made for --max_minutes {recorded:g}; "
                         f"--max_minutes {args.max_minutes:g} would stop it by the clock before its decay ends: "
                         f"resume with --max_minutes {recorded:g} (or leave it out), or lay the schedule over "
                         "another length with --max_steps N and no --max_minutes")
    logger.warning("the plan of %d steps made for --max_minutes %g goes on; --max_minutes %g only moves the clock's "
                   "stop, for a slower restart (to train longer, resume with --max_steps N and no --max_minutes)",
                   planned, recorded, args.max_minutes)


@dataclass
class Probe:
    """A window of timed steps of a run whose plan is not final yet."""

    first_timed: int  # steps after this one are timed
    last: int  # the plan is made after this step
    seconds: float = 0.0
    spans: float = 0.0  # the same steps as the guard times them (``TimeBudget.span_ratio``)
    untimed: float = 0.0  # the steps before ``first_timed``: a process's start-up (a refusal's advice pays it again)
    due: float | None = None  # a guard's window (which counts its steps' spans as ``seconds``): the spans they were
    # planned to take; it closes once they are spent (a machine many times slower would otherwise be stopped by the
    # clock before the window ends)

    @classmethod
    def window(cls, budget: TimeBudget, step: int) -> Probe | None:
        """The next window of a run at ``step`` (None once its plan is final): the probe, or the second timing."""
        if budget.fixed:
            return None
        if budget.planned_steps is None or budget.replan_step(budget.planned_steps) <= step + TIMED_FROM + 10:
            return cls(first_timed=step + TIMED_FROM, last=step + budget.probe_steps)
        return budget.second_window(step)

    def timed(self, step: int, seconds: float, span: float = 0.0) -> bool:
        """Count the ``seconds`` (and the guard's ``span``) of ``step``; True once the window's last step is done,
        or a guard's window has spent its ``due`` on at least MIN_OVERDUE steps (it then ends at ``step``)."""
        if step > self.first_timed:
            self.seconds += seconds
            self.spans += span
        else:
            self.untimed += seconds
        if self.due is not None and self.seconds > self.due and step - self.first_timed >= MIN_OVERDUE:
            self.last = min(self.last, step)
        return step >= self.last

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / max(1, self.last - self.first_timed)

    @property
    def span_per_step(self) -> float:
        return self.spans / max(1, self.last - self.first_timed)


def every(value: float | None, total_steps: int) -> int | None:
    """Steps between evaluations (or checkpoints): a whole number as given, a fraction in (0, 1) of
    ``total_steps`` rounded up (so that 0.25 of 1,289 steps evaluates at 323, 646, 969 and the end, not also one
    step before the end); None for None or 0 (never)."""
    if not value:
        return None
    return max(1, math.ceil(value * total_steps - 1e-9)) if value < 1 else int(value)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 5)
