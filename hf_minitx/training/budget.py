"""A time budget as a plan in steps: ``--max_minutes T`` becomes the step count the schedule is laid over.

A schedule (warmup, the stable phase, the decay) is defined in optimizer steps, so a budget in minutes has to
become a number of steps before the decay can be placed. The run's own steps are timed, in two stages:

    steps 1..PROBE_STEPS        warmup: the learning rate does not depend on the run's length yet
                                (steps after TIMED_FROM are timed: the first ones allocate optimizer state)
    at PROBE_STEPS              a first plan; one evaluation is timed too if the run evaluates along the way
    REPLAN_FROM..REPLAN_AT      the stable phase of warmup_stable_decay (or constant_with_warmup), whose rate does
    of the first plan           not depend on the length either: timed again, over many more steps, once the
                                machine has settled (the first hundred steps of a run are often the slowest)
    at REPLAN_AT                the final plan, fixed once

Every process measures and the mean is taken (one reduce), so all agree. The plan is recorded in every
checkpoint (``RunState.planned_steps``) and in training_summary.json: a resumed run continues the same plan, and
``--max_steps planned_steps`` repeats the run without a clock, bit for bit (the rates of the steps timed before
the plan was final do not depend on the length). Schedules whose rate depends on the length from the first step
after warmup (cosine, linear) keep the first plan. The plan ends ``MARGIN`` before the budget; the clock stays a
safety cap ``GRACE`` after it: a machine that slows down more than that mid-run is stopped there, and the summary
says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PROBE_STEPS = 20  # the first plan after this many steps (the default 20 warmup steps: their rates need no length)
TIMED_FROM = 4  # steps 1..TIMED_FROM are not timed: they allocate optimizer state and warm caches
REPLAN_FROM, REPLAN_AT = 0.2, 0.5  # the second timing: from/to these fractions of the first plan (before the decay)
MARGIN = 0.04  # of the budget, kept for what the timing cannot see (checkpoints, logging, jitter)
GRACE = 0.02  # of the budget: the clock's cap lies this far past it, so that a slower end still finishes the decay
LENGTH_FREE_SCHEDULES = ("warmup_stable_decay", "constant_with_warmup")  # their rate before the decay needs no length


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
    final: bool = False  # the plan no longer changes
    planned_for_minutes: float | None = None  # a resume under another budget: the one the plan was made for

    @property
    def fixed(self) -> bool:
        return self.final

    @property
    def cap_seconds(self) -> float:
        """Where the clock stops a run whose steps ran slower than timed: the planned end is 4% before the budget,
        the cap 2% after it, so a machine up to ~6% slower than its timing still ends on its plan."""
        return self.seconds * (1.0 + GRACE)

    def provisional_steps(self) -> int:
        """The schedule's length before a plan: the cap, or a length whose first steps are warmup and peak for
        every transformers schedule."""
        return self.step_cap or 10**9

    def evaluations(self, steps: int) -> int:
        """How many evaluations a run of ``steps`` makes along the way."""
        if not self.eval_steps:
            return 0
        return math.floor(1 / self.eval_steps) if self.eval_steps < 1 else steps // int(self.eval_steps)

    def steps_that_fit(self, done: int, elapsed: float, step_seconds: float, eval_seconds: float) -> int:
        """The ``done`` steps plus those that fit in the budget left after ``elapsed`` seconds, each costing
        ``step_seconds``, with the evaluations to come costing ``eval_seconds`` each."""
        left, per_step = self.seconds * (1.0 - MARGIN) - elapsed, step_seconds
        if self.eval_steps and self.eval_steps < 1:  # a fixed number of evaluations, whatever the length
            left -= self.evaluations(0) * eval_seconds
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
        self.final = second or self.decay_ratio is None or self.replan_step(steps) <= done
        self.planned_steps = steps
        return steps

    def replan_step(self, planned: int) -> int:
        """The step of the final plan after a first plan of ``planned`` steps."""
        return max(self.probe_steps + 20, round(REPLAN_AT * planned))

    def second_window(self, step: int) -> Probe:
        """The steps timed for the final plan, of a run at ``step`` with a first plan."""
        last = self.replan_step(self.planned_steps)
        return Probe(first_timed=min(max(step + TIMED_FROM, round(REPLAN_FROM * self.planned_steps)), last - 10),
                     last=last)

    def record(self, steps_run: int, train_seconds: float, stopped_by_clock: bool) -> dict:
        """What was planned and what ran, for training_summary.json and the card."""
        return {"budget_minutes": round(self.seconds / 60, 4), "probe_steps": self.probe_steps,
                "seconds_per_step": _round(self.seconds_per_step),
                "seconds_per_evaluation": _round(self.seconds_per_evaluation), "step_cap": self.step_cap,
                "planned_steps": self.planned_steps, "steps_run": steps_run, "train_seconds": round(train_seconds, 2),
                "ended_by": "clock" if stopped_by_clock else "plan",
                **({"planned_for_minutes": round(self.planned_for_minutes, 4)} if self.planned_for_minutes else {})}


@dataclass
class Probe:
    """A window of timed steps of a run whose plan is not final yet."""

    first_timed: int  # steps after this one are timed
    last: int  # the plan is made after this step
    seconds: float = 0.0

    @classmethod
    def window(cls, budget: TimeBudget, step: int) -> Probe | None:
        """The next window of a run at ``step`` (None once its plan is final): the probe, or the second timing."""
        if budget.fixed:
            return None
        if budget.planned_steps is None or budget.replan_step(budget.planned_steps) <= step + TIMED_FROM + 10:
            return cls(first_timed=step + TIMED_FROM, last=step + budget.probe_steps)
        return budget.second_window(step)

    def timed(self, step: int, seconds: float) -> bool:
        """Count the ``seconds`` of ``step``; True once the window's last step is done."""
        if step > self.first_timed:
            self.seconds += seconds
        return step >= self.last

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / max(1, self.last - self.first_timed)


def every(value: float | None, total_steps: int) -> int | None:
    """Steps between evaluations (or checkpoints): a whole number as given, a fraction in (0, 1) of
    ``total_steps``; None for None or 0 (never)."""
    if not value:
        return None
    return max(1, round(value * total_steps)) if value < 1 else int(value)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 5)
