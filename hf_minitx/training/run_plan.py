"""The plan of a `minitx train` run (``RunPlan``): its arguments checked before any work, and what follows from
them, each computed once: the model's settings and config, the objective, the output folder and, resuming, the
checkpoint with its recorded state.

A resumed run must share its checkpoint's identity (the model, the data and how it splits, the input files'
fingerprints, the optimizer's recipe): checked here, before anything is read or written.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ..data.corpus import dataset_key, local_inputs
from ..data.streaming import load_stream_state, stream_state_path
from ..data.tokenizer import check_training_tokenizer
from ..folders import check_apart, check_not_locked, check_output_folder, output_path, read_summary
from ..launch import process_count
from ..models import MiniTxConfig
from .argument_checks import (
    check_data_arguments,
    check_stream_length,
    check_streaming_arguments,
    check_training_arguments,
    parse_trackers,
)
from .arguments import DEFAULT_PRESET, DataArguments, ModelArguments, TrainArguments
from .budget import resumed_budget
from .checkpoints import (
    INPUT_FILES,
    PAIR_LENGTHS,
    RECIPE,
    check_checkpoint_files,
    check_compatible,
    check_same_inputs,
    check_same_run,
    read_run_state,
    resolve_checkpoint,
)
from .distill import check_distill_arguments, teacher_identity, teacher_record
from .loss import Objective
from .model_presets import load_preset, parse_config_overrides, preset_path
from .shape_plan import (
    SHAPE_PLAN,
    check_phase_budget,
    feed_forward_size,
    planned_split,
    plans_shape,
    shape_given,
)

DISTILLATION = "distillation"  # run identity key: the teacher's weights digest, alpha and T (None: no teacher)
TOKENIZER_IDS = ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


@dataclass
class RunPlan:
    """The checked arguments of one run and what is derived from them, each computed once."""

    model_args: ModelArguments
    data_args: DataArguments
    train_args: TrainArguments
    settings: dict[str, Any]  # preset + overrides: what a checkpoint must share with the run resuming it
    config: MiniTxConfig  # built (and checked) once; build_model adds the tokenizer's ids
    objective: Objective
    output_dir: Path
    trackers: list[str]
    checkpoint: Path | None = None
    resume_state: dict[str, Any] | None = None  # run_state.json of the checkpoint, read once
    claimed: str | None = None  # how claim_output_folder found output_dir: "missing", "empty", "replaced", "resumed"
    made_folder: bool = False  # lock_output_folder created output_dir to hold its lock
    set_aside: Path | None = None  # a replaced folder's old contents, kept until the run ends (settle_replaced)
    plans_shape: bool = False  # a new run whose time budget chooses the shape (setup times the candidates)
    shape_plan: dict[str, Any] | None = None  # what it chose and why (a resumed one: its checkpoint's record)

    @cached_property
    def identity(self) -> dict[str, Any]:
        """What a checkpoint must share with the run that resumes it, the local input files' fingerprints too."""
        return {**run_identity(self.settings, self.data_args, self.train_args.seed),
                INPUT_FILES: fingerprint_inputs(self.data_args), RECIPE: optimizer_recipe(self.train_args),
                DISTILLATION: teacher_identity(self.teacher)}

    @cached_property
    def teacher(self) -> dict[str, Any] | None:
        """--distill_from: the teacher's path and weights digest, alpha and T (read once: the digest hashes it)."""
        return teacher_record(self.train_args)


class AlreadyComplete(Exception):
    """A resumed run has nothing left to do: its folder already holds the final model of that many steps."""


def plan_run(model_args: ModelArguments, data_args: DataArguments, train_args: TrainArguments) -> RunPlan:
    """Every check that needs no data, in one place; nothing is written. The result drives the whole run.

    The output folder: a new run needs it missing or empty (or --overwrite_output_dir); a resumed run needs a
    readable checkpoint of this folder's own run.
    """
    settings = resolve_model_settings(model_args, data_args)
    config = build_config(settings, model_args.preset or DEFAULT_PRESET)
    if train_args.late_dropout is None:  # the task's default (see TrainArguments.late_dropout)
        train_args.late_dropout = LATE_DROPOUT if data_args.task == "causal-lm" else 0.0
    if train_args.calibrate_temperature is None:  # the task's default (see TrainArguments.calibrate_temperature)
        train_args.calibrate_temperature = data_args.task == "causal-lm"
    check_training_arguments(train_args)
    check_data_arguments(config, data_args)
    check_streaming_arguments(data_args, train_args)
    check_distill_arguments(train_args, data_args.task)
    plan = RunPlan(
        model_args, data_args, train_args, settings, config,
        objective=Objective.for_task(data_args.task, train_args.label_smoothing, config, train_args.input_noise),
        output_dir=output_path(train_args.output_dir), trackers=parse_trackers(train_args.report_to),
        plans_shape=plans_shape(model_args, data_args, train_args),
    )
    inputs = run_inputs(model_args, data_args, train_args)  # a missing dataset file is named here
    if train_args.resume_from_checkpoint is None:
        check_output_folder(plan.output_dir, flag="--overwrite_output_dir", overwrite=train_args.overwrite_output_dir,
                            inputs=inputs, any_flag="--overwrite_any_folder",
                            overwrite_any=train_args.overwrite_any_folder,
                            resume_flag="--resume_from_checkpoint latest")
        if data_args.tokenizer:  # before the corpus is read (a resumed run's tokenizer is checked as an input)
            check_training_tokenizer(data_args.tokenizer)
        default_eval_steps(train_args)
        return plan
    check_apart(plan.output_dir, inputs, option="--output_dir")
    if plan.output_dir.is_dir():
        check_not_locked(plan.output_dir)
    plan.checkpoint = resolve_checkpoint(train_args.resume_from_checkpoint, plan.output_dir)
    plan.resume_state = read_run_state(plan.checkpoint)
    take_planned_shape(plan)
    keep_recorded_feed_forward(plan)
    check_compatible(plan.checkpoint, plan.resume_state, plan.identity)
    check_same_run(plan.output_dir, plan.checkpoint, plan.resume_state)
    check_same_inputs(plan.checkpoint, plan.resume_state, plan.identity, accept_edits=data_args.accept_changed_inputs,
                      tokenizer=data_args.tokenizer)
    check_checkpoint_files(plan.checkpoint, streaming=data_args.streaming, step=plan.resume_state["step"])
    resumed_budget(train_args, plan.resume_state, plan.checkpoint)  # the checkpoint's budget, kept or refused here
    default_eval_steps(train_args)  # once the budget is known (a resume may take up its checkpoint's)
    if data_args.streaming:
        check_stream_length(train_args, plan.resume_state.get("total_steps"))
        check_stream_resume(plan.checkpoint, data_args, train_args.seed,  # the launcher says how many processes
                            num_processes=process_count())
    if train_args.max_steps is not None:  # runs of num_epochs are checked once their length is known
        check_not_complete(plan, train_args.max_steps)
    return plan


def default_eval_steps(train_args: TrainArguments) -> None:
    """--eval_steps left out: every EVAL_STEPS steps, or with a time budget every BUDGET_EVAL_STEPS of the plan
    (each evaluation of the whole validation split costs the steps it replaces)."""
    if train_args.eval_steps is None:
        train_args.eval_steps = BUDGET_EVAL_STEPS if train_args.max_minutes is not None else EVAL_STEPS


def take_planned_shape(plan: RunPlan) -> None:
    """A resumed run that names no shape takes the one its checkpoint's run chose, if it chose one (timing again
    could choose another; the recorded budget may be taken up without --max_minutes): the recorded settings,
    before the checkpoint's identity is compared."""
    recorded = plan.resume_state.get(SHAPE_PLAN)
    if shape_given(plan.model_args) or not recorded:
        return
    plan.plans_shape, plan.shape_plan = False, recorded
    plan.settings.update(recorded["settings"])
    plan.config = build_config(plan.settings, DEFAULT_PRESET)
    split, args = planned_split(recorded), plan.train_args
    if split and args.max_steps is None:
        check_phase_budget(split, args.max_minutes, "teacher")
    if split and args.max_minutes in (None, split["minutes"]) and args.max_steps is None and args.num_epochs is None:
        args.max_minutes = split["teacher_minutes"]  # the whole budget names the teacher's share of it


def keep_recorded_feed_forward(plan: RunPlan) -> None:
    """A resumed run whose feed-forward size was derived from a width given by hand (``resolve_model_settings``)
    takes the checkpoint's: a run started before that derivation trained the preset's own, and the same command
    must resume it."""
    recorded = (plan.resume_state.get("model_settings") or {}).get("intermediate_size")
    derived = derives_feed_forward(plan.model_args, parse_config_overrides(plan.model_args.config_overrides))
    if derived and recorded is not None and recorded != plan.settings["intermediate_size"]:
        plan.settings["intermediate_size"] = recorded
        plan.config = build_config(plan.settings, DEFAULT_PRESET)


def derives_feed_forward(model_args: ModelArguments, overrides: dict[str, Any]) -> bool:
    """Whether the feed-forward size follows a width given by hand: the default blocks (no --preset), a
    hidden_size override and no intermediate_size one (the preset's is that of its own width)."""
    return model_args.preset is None and "hidden_size" in overrides and "intermediate_size" not in overrides


def resolve_model_settings(model_args: ModelArguments, data_args: DataArguments) -> dict[str, Any]:
    """MiniTxConfig fields from the preset (none given: ``DEFAULT_PRESET``) and the overrides;
    ``is_encoder_decoder`` follows the task."""
    settings = load_preset(model_args.preset or DEFAULT_PRESET)
    overrides = parse_config_overrides(model_args.config_overrides)
    from_tokenizer = [key for key in TOKENIZER_IDS if key in overrides]
    if from_tokenizer:
        raise ValueError(f"--config_overrides {from_tokenizer[0]}=... cannot be set: the vocabulary size and special "
                         "token ids come from the tokenizer. Remove it; for another vocabulary size pass "
                         "--tokenizer_vocab_size N (a fresh tokenizer) or a --tokenizer of that size")
    wants_seq2seq = data_args.task == "seq2seq"
    if "is_encoder_decoder" in overrides and bool(overrides["is_encoder_decoder"]) != wants_seq2seq:
        raise ValueError(f"--config_overrides is_encoder_decoder={str(overrides['is_encoder_decoder']).lower()} "
                         f"contradicts --task {data_args.task}: the task decides the kind of model; remove "
                         f"is_encoder_decoder from --config_overrides (and pass --task "
                         f"{'seq2seq' if overrides['is_encoder_decoder'] else 'causal-lm'} for "
                         f"{'an encoder-decoder' if overrides['is_encoder_decoder'] else 'a decoder-only'} model)")
    settings.update(overrides)
    if derives_feed_forward(model_args, overrides):
        settings["intermediate_size"] = feed_forward_size(settings["hidden_size"], settings["hidden_act"])
    if "is_encoder_decoder" in settings and bool(settings["is_encoder_decoder"]) != wants_seq2seq:
        kind = "an encoder-decoder" if settings["is_encoder_decoder"] else "a decoder-only"
        raise ValueError(
            f"preset {model_args.preset or DEFAULT_PRESET!r} describes {kind} model but --task is {data_args.task!r}; "
            f"use --task {'seq2seq' if settings['is_encoder_decoder'] else 'causal-lm'} or another preset"
        )
    settings["is_encoder_decoder"] = wants_seq2seq
    for key in TOKENIZER_IDS:
        settings.pop(key, None)  # these come from the tokenizer
    return settings


def build_config(settings: dict[str, Any], preset: str) -> MiniTxConfig:
    """The run's one MiniTxConfig; a bad field is a ValueError naming the preset."""
    try:
        return MiniTxConfig(**settings)
    except (TypeError, ValueError) as err:
        raise ValueError(f"invalid model settings from preset {preset!r} + overrides: {err}") from err


def run_identity(model_settings: dict[str, Any], data_args: DataArguments, seed: int) -> dict[str, Any]:
    """What a checkpoint must share with the run that resumes it: the model, the data, and what defines the
    validation split (seed, validation_split, streaming), so that validation never holds trained text; and the
    lengths the text is cut to (causal-lm's blocks, seq2seq's pairs)."""
    identity = {
        "model_settings": model_settings, "task": data_args.task, "dataset": dataset_key(data_args.dataset),
        "dataset_config": data_args.dataset_config, "sample_by": data_args.sample_by, "seed": seed,
        "validation_split": data_args.validation_split, "streaming": data_args.streaming,
        "shift_windows": shifts_windows(data_args),
    }
    lengths = PAIR_LENGTHS if data_args.task == "seq2seq" else ("block_size",)
    return {**identity, **{key: getattr(data_args, key) for key in lengths}}


def shifts_windows(data_args: DataArguments) -> bool:
    """Whether training samples start at new offsets each epoch: --shift_windows, by default on for map-style
    causal-lm data (a stream is read once, seq2seq pairs are not cut)."""
    return data_args.shift_windows is not False and data_args.task == "causal-lm" and not data_args.streaming


def shift_window(plan: RunPlan) -> int:
    """Offsets drawn per sample and epoch (``--shift_windows``): in [0, block_size), or 0 for samples as packed."""
    return plan.data_args.block_size if shifts_windows(plan.data_args) else 0


LATE_DROPOUT = 0.1  # causal-lm's default --late_dropout (docs/recipe-log.md: the screen that chose it)
EVAL_STEPS, BUDGET_EVAL_STEPS = 200, 0.25  # default --eval_steps without and with --max_minutes
RECIPE_FIELDS = ("optimizer", "learning_rate", "weight_decay", "embedding_weight_decay", "adam_beta1", "adam_beta2",
                 "adam_epsilon", "lr_scheduler_type", "warmup_steps", "max_grad_norm", "label_smoothing",
                 "late_dropout", "input_noise")
RECIPE_FIELDS_OF = {"muon": ("muon_learning_rate", "muon_weight_decay", "muon_momentum", "cautious_weight_decay"),
                    "warmup_stable_decay": ("decay_ratio", "min_lr_ratio"), "late_dropout": ("late_dropout_passes",)}


def optimizer_recipe(train_args: TrainArguments) -> dict[str, Any]:
    """How the run optimizes (the optimizer, its rates and decays, the schedule): a resumed run loads these from
    its checkpoint, so one that asks for others is refused (``check_compatible`` names the field) rather than
    going on with the old ones without a word."""
    names = [*RECIPE_FIELDS, *RECIPE_FIELDS_OF.get(train_args.optimizer, ()),
             *RECIPE_FIELDS_OF.get(train_args.lr_scheduler_type, ()),
             *(RECIPE_FIELDS_OF["late_dropout"] if train_args.late_dropout else ())]
    return {name: getattr(train_args, name) for name in names}


def run_inputs(model_args: ModelArguments, data_args: DataArguments,
               train_args: TrainArguments) -> list[tuple[str, Path]]:
    """(option, path) of every local file or folder the run reads: dataset files (or folder), the tokenizer
    folder, a preset file, the arguments file."""
    inputs = [("--dataset", path) for path in local_inputs(data_args.dataset)]
    if data_args.tokenizer:
        inputs.append(("--tokenizer", Path(data_args.tokenizer)))
    if model_args.preset and preset_path(model_args.preset) is not None:
        inputs.append(("--preset", Path(model_args.preset)))
    if train_args.arguments_file:
        inputs.append(("arguments file", Path(train_args.arguments_file)))
    if train_args.distill_from:
        inputs.append(("--distill_from", Path(train_args.distill_from)))
    return inputs


FINGERPRINT_BYTES = 1 << 20  # the first and the last MB of each file are hashed (cheap on large corpora)


def fingerprint_inputs(data_args: DataArguments) -> dict[str, str]:
    """{real path: "size:hash of the first and last MB"} of the local dataset and tokenizer files (builtin and Hub
    datasets have none: their name and config are in the run identity). Real paths: a file named another way
    (./corpus.txt, its absolute path) is the same input."""
    roots = local_inputs(data_args.dataset) + ([Path(data_args.tokenizer)] if data_args.tokenizer else [])
    files = [f for root in roots for f in (sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir()
                                           else [root])]
    # datasets writes its own cache-*.arrow files beside a save_to_disk folder's data: not the user's input
    return {os.path.realpath(f): _fingerprint(f) for f in files if not fnmatch.fnmatch(f.name, "cache-*.arrow")}


def _fingerprint(path: Path) -> str:
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        digest.update(handle.read(FINGERPRINT_BYTES))
        if size > FINGERPRINT_BYTES:
            handle.seek(max(FINGERPRINT_BYTES, size - FINGERPRINT_BYTES))
            digest.update(handle.read())
    return f"{size}:{digest.hexdigest()[:16]}"


def check_stream_resume(checkpoint: Path, data_args: DataArguments, seed: int, num_processes: int | None = None
                        ) -> None:
    """A streaming checkpoint resumes only with the settings its stream position was saved with (the shuffle
    buffer's blocks are in it, and each process's position is its own): checked before any work."""
    saved = load_stream_state(stream_state_path(checkpoint, 0)).get("settings") or {}
    asked = {"shuffle_buffer": data_args.shuffle_buffer, "block_size": data_args.block_size, "seed": seed}
    for name, value in asked.items():
        if name in saved and saved[name] != value:
            raise ValueError(f"checkpoint {checkpoint} was streamed with --{name} {saved[name]}, this run asks for "
                             f"{value}: its saved stream position holds that run's blocks; resume with --{name} "
                             f"{saved[name]}, or start a new run in another --output_dir")
    if num_processes is not None and saved.get("num_processes", num_processes) != num_processes:
        raise ValueError(f"checkpoint {checkpoint} was streamed by {saved['num_processes']} process(es), this launch "
                         f"has {num_processes}: each saved its own stream position; resume it with --num_processes "
                         f"{saved['num_processes']}, or start a new run in another --output_dir")


def check_not_complete(plan: RunPlan, total_steps: int) -> None:
    """A resumed run whose folder already holds the final model of ``total_steps`` (or more) steps, saved
    after its checkpoint, raises AlreadyComplete: nothing is to be done or written."""
    if plan.checkpoint is None:
        return
    steps = (read_summary(plan.output_dir) or {}).get("steps")  # none (readable): the run goes on and finishes
    complete = (plan.output_dir / "config.json").is_file() and any(plan.output_dir.glob("*.safetensors"))
    if isinstance(steps, int) and steps >= total_steps and steps >= plan.resume_state["step"] and complete:
        raise AlreadyComplete(f"{plan.output_dir} is already complete at step {steps}; nothing to do (raise "
                              "--max_steps to train further)")
    if plan.resume_state["step"] > total_steps:
        raise ValueError(f"checkpoint {plan.checkpoint} is at step {plan.resume_state['step']}, past the "
                         f"{total_steps} steps this run asks for; resume with --max_steps "
                         f"{plan.resume_state['step']} or more, or start a new run in another --output_dir")


def check_global_batch(plan: RunPlan, global_batch_size: int) -> None:
    """A resumed run must read as many rows per step as its checkpoint did, to continue at the same data."""
    if plan.resume_state is None:
        return
    stored = plan.resume_state.get("global_batch_size")
    if stored != global_batch_size:
        raise ValueError(
            f"checkpoint {plan.checkpoint} was trained with a global batch of {stored} rows per step, this run "
            f"uses {global_batch_size} (batch x processes x accumulation); keep them equal to resume at the exact "
            "data position"
        )
