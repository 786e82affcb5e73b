"""The model a time budget buys: with ``--max_minutes`` and no ``--preset`` or shape override, the run chooses its
width and depth from the budget, this machine's step time and the corpus size.

A larger model learns more from each token but makes fewer steps in the same minutes, and a token seen again
teaches less than a new one: after R passes over U unique tokens a model has seen about
U * (1 + R* * (1 - exp(-(R - 1) / R*))) tokens' worth, R* = 15.4 (Muennighoff et al. 2023, "Scaling
Data-Constrained Language Models"). So each candidate of ``SHAPES`` is timed for a few steps of the run's own
batch on this machine, the tokens it would see in the budget are planned and discounted for repetition, and
the largest candidate with at least ``TOKENS_PER_PARAMETER`` effective tokens per non-embedding parameter is
taken (the smallest when none has): a longer budget, a faster machine or a larger corpus buys a larger model.
The ratio is this project's own, measured on a grid of fixed shapes (docs/recipe-log.md,
"The model a budget buys"). The candidates, their timings and the choice are recorded in the summary and the card.

    plans_shape(model_args, data_args, train_args)   whether this run chooses its shape
    plan_shape(...)                                   time the candidates, choose one: a ``ShapePlan``
    plan_phases(passes, steps, minutes)               past PASSES_PER_MODEL passes, the budget is split between a
                                                      teacher and a student that learns from it (``phases.py``)
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..launch import process_count
from ..models import MiniTxConfig, MiniTxForCausalLM
from ..models.layers_minitx import ACTIVATIONS
from .arguments import DataArguments, ModelArguments, TrainArguments
from .budget import MARGIN, length_cap
from .model_presets import parse_config_overrides
from .optim import build_optimizer, partition_parameters

SHAPE_PLAN = "shape_plan"  # run state and summary key: the shape a time budget chose, the candidates and why
SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size")  # an override of any of these is a shape given by hand: no plan
TOKENS_PER_PARAMETER = 4.0  # effective training tokens per non-embedding parameter of the largest candidate taken
REPEAT_HALF_LIFE = 15.4  # R*: passes after which repeated tokens are worth 1/e less (Muennighoff et al. 2023)
TIMED_STEPS, WARM_STEPS = 5, 3  # per candidate: untimed steps (allocation, caches), then timed ones (the median)
PHASES = "phases"  # key of the split in the shape plan's record, and of what was done in the final summary
PASSES_PER_MODEL = 10.0  # more passes than this, planned for one model, split the budget between two (measured)
TEACHER_SHARE = 0.5  # of the budget, for the teacher; the student gets the rest
MANY_PASSES = 100.0  # planned passes past which a budget is said to be longer than its corpus can use
MIN_PHASE_STEPS = 200  # a split leaves each model at least these steps, the student's at its own pace
STUDENT_STEP_COST = 1.4  # a student's step against one model's: the teacher's forward adds about 40% (recipe log)


@dataclass(frozen=True)
class Shape:
    """One candidate: depth x width and heads; the feed-forward has the parameters of an ungated one as wide as the
    model (ReLU^2's best at a fixed wall time; SwiGLU's too: docs/recipe-log.md)."""

    layers: int
    hidden: int
    heads: int

    @property
    def name(self) -> str:
        return f"{self.layers} x {self.hidden}"

    def settings(self, hidden_act: str) -> dict[str, int]:
        """The MiniTxConfig fields of this shape, with a feed-forward of `hidden_act`: as wide as the model, or for a
        gated one (three matrices instead of two) two thirds of it, rounded to an even size."""
        return {"num_hidden_layers": self.layers, "hidden_size": self.hidden, "num_attention_heads": self.heads,
                "intermediate_size": feed_forward_size(self.hidden, hidden_act)}


def feed_forward_size(hidden: int, hidden_act: str) -> int:
    """The default blocks' feed-forward at width ``hidden``: as wide as the model, or for a gated one (three
    matrices instead of two) two thirds of it, rounded to an even size: the same parameters."""
    activation = ACTIVATIONS.get(hidden_act)  # an unknown one is refused with the config
    return 2 * round(hidden / 3) if activation is not None and activation.gated else hidden


SHAPES = (Shape(2, 64, 2), Shape(3, 96, 3), Shape(4, 128, 4), Shape(4, 160, 5), Shape(4, 192, 6), Shape(6, 192, 6),
          Shape(6, 256, 4), Shape(8, 384, 6), Shape(12, 512, 8))  # in the order of their cost; heads of 32 or 64


@dataclass
class ShapePlan:
    """The candidates timed, the one chosen and why; ``seconds``: what the timing cost (spent from the budget)."""

    chosen: Shape
    hidden_act: str  # the blocks' feed-forward, which sets the shape's feed-forward size
    candidates: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    met_rule: bool = True  # False: no candidate reached TOKENS_PER_PARAMETER, the smallest was taken

    @property
    def planned(self) -> dict[str, Any]:
        """The chosen candidate's timing: its planned steps and passes over the corpus in the budget."""
        return next(c for c in self.candidates if c["shape"] == self.chosen.name)

    def record(self) -> dict[str, Any]:
        """For training_summary.json, the run state and the card."""
        return {"chosen": self.chosen.name, "settings": self.chosen.settings(self.hidden_act),
                "timing_seconds": round(self.seconds, 2), "candidates": self.candidates,
                "rule": self.rule()}

    def rule(self) -> str:
        """Why the chosen shape: the rule it met, or that no candidate met it."""
        wanted = (f"at least {TOKENS_PER_PARAMETER:g} effective tokens per non-embedding parameter (repeated tokens "
                  "discounted)")
        if self.met_rule:
            return f"the largest candidate planned to see {wanted}"
        return f"the smallest candidate: none was planned to see {wanted}"


def shape_given(model_args: ModelArguments) -> bool:
    """Whether the run names its shape: a --preset, or a shape field in --config_overrides."""
    overrides = parse_config_overrides(model_args.config_overrides)
    return model_args.preset is not None or any(name in overrides for name in SHAPE_FIELDS)


def plans_shape(model_args: ModelArguments, data_args: DataArguments, train_args: TrainArguments) -> bool:
    """A new causal-lm run with a time budget, no --preset and no shape in --config_overrides chooses its shape
    (a resumed one takes the shape its checkpoint recorded, with or without --max_minutes)."""
    return (not shape_given(model_args) and train_args.max_minutes is not None and data_args.task == "causal-lm"
            and not data_args.streaming)


def effective_tokens(passes: float, corpus_tokens: int) -> float:
    """Tokens' worth of ``passes`` over ``corpus_tokens`` unique tokens: each pass after the first is worth less
    (Muennighoff et al.'s D' = U (1 + R* (1 - exp(-(R - 1) / R*))), with R the passes made; one pass or less: as
    many tokens as were seen)."""
    if passes <= 1.0:
        return passes * corpus_tokens
    return corpus_tokens * (1.0 + REPEAT_HALF_LIFE * (1.0 - math.exp(-(passes - 1.0) / REPEAT_HALF_LIFE)))


def choose_shape(timings: list[dict[str, Any]]) -> Shape:
    """The largest timed candidate with at least TOKENS_PER_PARAMETER effective tokens per parameter, or the
    smallest when none has."""
    fitting = [t for t in timings if meets_rule(t)]
    return (fitting[-1] if fitting else timings[0])["shape"]


def meets_rule(timing: dict[str, Any]) -> bool:
    """Whether a timed candidate is planned to see TOKENS_PER_PARAMETER effective tokens per parameter."""
    return timing["tokens_per_parameter"] >= TOKENS_PER_PARAMETER


def plan_shape(settings: dict[str, Any], train_args: TrainArguments, block_size: int, batches_per_epoch: int,
               corpus_tokens: int, device: torch.device, reduce: Any = None) -> ShapePlan:
    """Time each candidate (``settings`` with its shape: the run's blocks and vocabulary) for a few optimizer steps
    of the run's micro-batches (``per_device_train_batch_size`` rows of ``block_size``, accumulated
    ``gradient_accumulation_steps`` times) on ``device``, and choose one for ``train_args.max_minutes``; a pass
    over the corpus (``corpus_tokens``) is ``batches_per_epoch`` micro-batches.

    Candidates are timed from the smallest up, and the timing stops at the first one below the ratio (every larger
    one sees fewer tokens for more parameters). ``reduce``: a mean over the processes, so that all choose alike
    (accelerate's ``reduce``)."""
    started, budget = time.perf_counter(), train_args.max_minutes * 60
    cap = length_cap(train_args.max_steps, train_args.num_epochs, batches_per_epoch,
                     train_args.gradient_accumulation_steps) or math.inf  # --max_steps or --num_epochs bound it
    timings: list[dict[str, Any]] = []
    for shape in SHAPES:
        step_seconds, parameters = time_shape(settings, shape, train_args, block_size, device)
        if reduce is not None:
            step_seconds = float(reduce(torch.tensor(step_seconds, device=device), "mean").item())
        left = budget * (1.0 - MARGIN) - (time.perf_counter() - started)  # the time plan keeps the same margin
        steps = min(max(0, math.floor(left / step_seconds)), cap)
        passes = steps * train_args.gradient_accumulation_steps / max(batches_per_epoch, 1)
        tokens = effective_tokens(passes, corpus_tokens)
        timings.append({"shape": shape, "seconds_per_step": step_seconds, "planned_steps": steps,
                        "planned_passes": passes, "parameters": parameters,
                        "tokens_per_parameter": tokens / parameters})
        if not meets_rule(timings[-1]):
            break
    chosen = choose_shape(timings)
    candidates = [{"shape": t["shape"].name, "seconds_per_step": round(t["seconds_per_step"], 5),
                   "planned_steps": t["planned_steps"], "planned_passes": round(t["planned_passes"], 2),
                   "parameters": t["parameters"], "tokens_per_parameter": round(t["tokens_per_parameter"], 2)}
                  for t in timings]
    return ShapePlan(chosen, settings["hidden_act"], candidates, time.perf_counter() - started,
                     met_rule=any(map(meets_rule, timings)))


def non_embedding_parameters(model: nn.Module) -> int:
    """Parameters outside the embedding tables (Kaplan et al. 2020's N: the tables' rows are looked up, not
    multiplied, and a tied head shares the token table)."""
    return sum(p.numel() for kind, params in partition_parameters(model).items() if kind != "embeddings"
               for p in params)


def time_shape(settings: dict[str, Any], shape: Shape, train_args: TrainArguments, block_size: int,
               device: torch.device) -> tuple[float, int]:
    """(seconds, non-embedding parameters): seconds of one optimizer step (forward and backward of each accumulated
    micro-batch, then the run's optimizer) of a model of ``settings`` at ``shape``, on random tokens: the median of
    TIMED_STEPS after WARM_STEPS. The global RNG is restored after, so that the run's own initialisation does not
    depend on the timing."""
    rng = torch.get_rng_state()
    try:
        candidate = MiniTxConfig(**{**settings, **shape.settings(settings["hidden_act"])})
        model: nn.Module = MiniTxForCausalLM(candidate).to(device).train()
        optimizer = build_optimizer(model, train_args)
        ids = torch.randint(0, candidate.vocab_size, (train_args.per_device_train_batch_size, block_size),
                            device=device)  # (rows, block)
        times = []
        for _ in range(WARM_STEPS + TIMED_STEPS):
            begin = time.perf_counter()
            for _ in range(train_args.gradient_accumulation_steps):
                model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - begin)
        return statistics.median(times[WARM_STEPS:]), non_embedding_parameters(model)
    finally:
        torch.set_rng_state(rng)


def plan_phases(passes: float, steps: int, minutes: float) -> dict[str, Any] | None:
    """The split of a budget of ``minutes`` whose one model would make ``passes`` over the corpus in ``steps``, or
    None: one model for few passes, or for a budget too short to time and decay two runs of MIN_PHASE_STEPS (the
    student's steps, each with the teacher's forward, are the fewer)."""
    if passes <= PASSES_PER_MODEL or not phases_fit(steps):
        return None
    return {"passes_of_one_model": round(passes, 2), "passes_per_model": PASSES_PER_MODEL, "minutes": minutes,
            "teacher_minutes": minutes * TEACHER_SHARE, "student_minutes": minutes * (1.0 - TEACHER_SHARE)}


def unsplit_reason(passes: float, steps: int) -> str | None:
    """Why a budget past PASSES_PER_MODEL passes trains one model all the same (None: it is not past them, or it
    splits)."""
    if passes <= PASSES_PER_MODEL or phases_fit(steps):
        return None
    return (f"{passes:g} passes over the data are more than one model learns from ({PASSES_PER_MODEL:g}), but "
            f"{steps:,} steps of it are too few for a teacher and a student of {MIN_PHASE_STEPS} steps each (a "
            f"student's step costs {STUDENT_STEP_COST:g} of one model's): one model trains")


def phases_fit(steps: int) -> bool:
    """Whether ``steps`` of one model, split, leave each phase MIN_PHASE_STEPS (the student's at its pace)."""
    return steps * min(TEACHER_SHARE, 1.0 - TEACHER_SHARE) / STUDENT_STEP_COST >= MIN_PHASE_STEPS


def too_many_passes(passes: float) -> str | None:
    """A warning for a budget that would pass over its corpus far more often than anything measured here (None for
    one that does not): two models learn from about 2 x PASSES_PER_MODEL passes, not from thousands."""
    if passes <= MANY_PASSES:
        return None
    return (f"the budget passes over the data {passes:,.0f} times, where two models learn from about "
            f"{2 * PASSES_PER_MODEL:g}: a corpus this small gains little from it; a shorter --max_minutes gives about "
            "the same model sooner, a larger corpus a better one")


def may_split(train_args: TrainArguments) -> bool:
    """Only a run whose length is the budget alone, without a teacher of its own, in one process (the phases'
    folders are copied by one writer), is split."""
    return (train_args.distill_from is None and train_args.max_steps is None and train_args.num_epochs is None
            and process_count() == 1)


def planned_split(shape_plan: dict[str, Any] | None) -> dict[str, Any] | None:
    """The split a shape plan's record holds (None: one model)."""
    return (shape_plan or {}).get(PHASES)


def check_phase_budget(split: dict[str, Any], given: float | None, phase: str) -> None:
    """A resume of a run in two phases given a --max_minutes shorter than the ``phase``'s share (and not the whole
    budget) is refused in the budget the user typed: the phase's plan would stop before its decay ends."""
    share = split[f"{phase}_minutes"]
    if given is None or given >= share or math.isclose(given, share):  # the whole budget is longer than a share
        return
    raise ValueError(f"the run was planned for --max_minutes {split['minutes']:g} in two phases (a teacher for "
                     f"{split['teacher_minutes']:.3g} min, then a student for {split['student_minutes']:.3g}); "
                     f"--max_minutes {given:g} would stop the {phase}'s plan before its decay ends: resume with "
                     f"--max_minutes {split['minutes']:g} (or leave it out), or lay the {phase}'s schedule over "
                     "another length with --max_steps N and no --max_minutes")
