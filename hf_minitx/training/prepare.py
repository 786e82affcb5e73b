"""What `minitx train` checks and builds before the first step: the checked arguments (a ``RunPlan``),
the Accelerator, the tokenizer, the model-ready data (``PreparedData``) and the model.

Everything here runs once per run; the loop itself (``loop.py``) never looks back at the arguments.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import uuid
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from datasets import DatasetDict
from torch import nn
from transformers import PreTrainedTokenizerBase

from ..data.corpus import (
    corpus_task,
    dataset_key,
    iter_training_texts,
    load_corpus,
    local_inputs,
    preprocess_seq2seq,
    seq2seq_collator,
    tokenize_and_pack,
)
from ..data.preprocessing import block_collator
from ..data.tokenizer import MIN_VOCAB_SIZE, check_training_tokenizer, load_tokenizer, train_bpe_tokenizer
from ..device import keep_freed_memory, pick_device
from ..folders import (
    PARTIAL_SUFFIX,
    check_apart,
    check_not_locked,
    check_output_folder,
    describe_contents,
    launch_id,
    lock_folder,
    move_files_into,
    output_path,
    read_marker,
    replace_folder,
    unlock_folder,
    write_marker,
)
from ..models import MiniTxConfig, MiniTxForCausalLM, MiniTxForConditionalGeneration
from .arguments import (
    DataArguments,
    ModelArguments,
    TrainArguments,
    load_preset,
    parse_config_overrides,
    preset_path,
    validation_split_value,
)
from .budget import resumed_budget
from .checkpoints import (
    INPUT_FILES,
    RECIPE,
    check_checkpoint_files,
    check_compatible,
    check_same_inputs,
    check_same_run,
    read_run_state,
    resolve_checkpoint,
    write_failure,
)
from .evaluation import predicted_bytes, text_bytes
from .loss import Objective
from .optim import check_optimizer_arguments
from .outputs import SUMMARY_FILE
from .prepared import PreparedData
from .stream_data import (
    STREAMING_EVAL_BLOCKS,
    check_stream_length,
    check_stream_resume,
    check_streaming_arguments,
    prepare_streaming_data,
)

TRACKERS = {  # Accelerate's trackers (--report_to) and the pip package that brings each
    "tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb", "aim": "aim", "comet_ml": "comet-ml",
    "mlflow": "mlflow", "clearml": "clearml", "dvclive": "dvclive", "swanlab": "swanlab",
}
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

    @cached_property
    def identity(self) -> dict[str, Any]:
        """What a checkpoint must share with the run that resumes it, the local input files' fingerprints too."""
        return {**run_identity(self.settings, self.data_args, self.train_args.seed), INPUT_FILES: fingerprint_inputs(self.data_args),
                RECIPE: optimizer_recipe(self.train_args)}


class AlreadyComplete(Exception):
    """A resumed run has nothing left to do: its folder already holds the final model of that many steps."""


# --- checks done before any work ------------------------------------------------------------------


def resolve_model_settings(model_args: ModelArguments, data_args: DataArguments) -> dict[str, Any]:
    """MiniTxConfig fields from the preset and the overrides; ``is_encoder_decoder`` follows the task."""
    settings = load_preset(model_args.preset)
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
    if "is_encoder_decoder" in settings and bool(settings["is_encoder_decoder"]) != wants_seq2seq:
        kind = "an encoder-decoder" if settings["is_encoder_decoder"] else "a decoder-only"
        raise ValueError(
            f"preset {model_args.preset!r} describes {kind} model but --task is {data_args.task!r}; "
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
    validation split (seed, validation_split, streaming), so that validation never holds trained text."""
    return {
        "model_settings": model_settings, "task": data_args.task, "dataset": dataset_key(data_args.dataset),
        "dataset_config": data_args.dataset_config, "block_size": data_args.block_size,
        "sample_by": data_args.sample_by, "seed": seed, "validation_split": data_args.validation_split,
        "streaming": data_args.streaming, "shift_windows": shifts_windows(data_args),
    }


def shifts_windows(data_args: DataArguments) -> bool:
    """Whether training samples start at new offsets each epoch: --shift_windows, by default on for map-style
    causal-lm data (a stream is read once, seq2seq pairs are not cut)."""
    return data_args.shift_windows is not False and data_args.task == "causal-lm" and not data_args.streaming


LATE_DROPOUT = 0.1  # causal-lm's default --late_dropout (docs/training.md: the screen that chose it)
RECIPE_FIELDS = ("optimizer", "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
                 "lr_scheduler_type", "warmup_steps", "max_grad_norm", "label_smoothing", "late_dropout")
RECIPE_FIELDS_OF = {"muon": ("muon_learning_rate", "muon_weight_decay", "muon_momentum"),
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
    if preset_path(model_args.preset) is not None:
        inputs.append(("--preset", Path(model_args.preset)))
    if train_args.arguments_file:
        inputs.append(("arguments file", Path(train_args.arguments_file)))
    return inputs


FINGERPRINT_BYTES = 1 << 20  # the first and the last MB of each file are hashed (cheap on large corpora)


def fingerprint_inputs(data_args: DataArguments) -> dict[str, str]:
    """{real path: "size:hash of the first and last MB"} of the local dataset and tokenizer files (builtin and Hub
    datasets have none: their name and config are in the run identity). Real paths: a file named another way
    (./corpus.txt, its absolute path) is the same input."""
    roots = local_inputs(data_args.dataset) + ([Path(data_args.tokenizer)] if data_args.tokenizer else [])
    files = [f for root in roots for f in (sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir()
                                           else [root])]
    return {os.path.realpath(f): _fingerprint(f) for f in files}


def _fingerprint(path: Path) -> str:
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        digest.update(handle.read(FINGERPRINT_BYTES))
        if size > FINGERPRINT_BYTES:
            handle.seek(max(FINGERPRINT_BYTES, size - FINGERPRINT_BYTES))
            digest.update(handle.read())
    return f"{size}:{digest.hexdigest()[:16]}"


def parse_trackers(report_to: str) -> list[str]:
    """``--report_to`` as a list of Accelerate tracker names (``none`` is the empty list)."""
    trackers = [t.strip() for t in report_to.split(",") if t.strip() and t.strip() != "none"]
    unknown = sorted(set(trackers) - set(TRACKERS))
    if unknown:
        raise ValueError(f"--report_to {unknown} is not supported; choose none or from {sorted(TRACKERS)}")
    import accelerate.utils

    missing = [t for t in trackers if not getattr(accelerate.utils, f"is_{t}_available")()]
    if missing:  # Accelerate would only warn, and the run would log nothing
        raise ImportError(f"--report_to {','.join(missing)}: not installed; pip install "
                          f"{' '.join(TRACKERS[t] for t in missing)} (or leave --report_to out)")
    return trackers


def check_data_arguments(config: MiniTxConfig, data_args: DataArguments) -> None:
    """The dataset fits the task, and sequence lengths fit the position table."""
    builtin_task = corpus_task(data_args.dataset) if data_args.dataset.startswith("builtin:") else None
    if builtin_task is not None and builtin_task != data_args.task:
        raise ValueError(
            f"task/dataset mismatch: {data_args.dataset} is a {builtin_task} corpus but --task is {data_args.task!r}; "
            f"use --task {builtin_task} or a {data_args.task} dataset"
        )
    lengths = {"block_size": data_args.block_size} if data_args.task == "causal-lm" else {
        "max_source_length": data_args.max_source_length, "max_target_length": data_args.max_target_length}
    counts = {  # at least 1 (None: the default)
        "max_eval_samples": data_args.max_eval_samples, "num_examples": data_args.num_examples,
        "num_proc": data_args.num_proc, "max_source_length": data_args.max_source_length,
        "max_target_length": data_args.max_target_length,
        **({} if data_args.tokenizer else {"tokenizer_max_texts": data_args.tokenizer_max_texts,
                                          "tokenizer_max_chars": data_args.tokenizer_max_chars}),
    }
    for name, value in counts.items():
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be >= 1 (or left out for the default), got {value}")
    if data_args.task == "seq2seq":
        for name in ("max_source_length", "max_target_length"):
            if getattr(data_args, name) < 2:
                raise ValueError(f"--{name} must be >= 2 (at least one token and <eos>), got {getattr(data_args, name)}")
    if data_args.block_size < 2:
        raise ValueError(f"--block_size must be >= 2 (a token and the next one to predict), got {data_args.block_size}")
    if data_args.shift_windows and (data_args.task != "causal-lm" or data_args.streaming):
        where = "--streaming (a stream is read once, in order)" if data_args.streaming else "--task seq2seq (pairs)"
        raise ValueError(f"--shift_windows cuts packed causal-lm text and does not apply with {where}; leave it out")
    if data_args.shuffle_buffer < 0:
        raise ValueError(f"--shuffle_buffer must be >= 0 (0 keeps stream order), got {data_args.shuffle_buffer}")
    if not data_args.tokenizer and data_args.tokenizer_vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"--tokenizer_vocab_size must be >= {MIN_VOCAB_SIZE} (256 bytes + 4 special tokens), got "
                         f"{data_args.tokenizer_vocab_size}")
    for name, value in lengths.items():
        if value > config.max_position_embeddings:
            raise ValueError(
                f"--{name} {value} is larger than the model's max_position_embeddings ({config.max_position_embeddings}); "
                f"lower it, or raise the limit with --config_overrides max_position_embeddings={value}"
            )
    if data_args.tokenizer and not Path(data_args.tokenizer).is_dir():
        how = "is not a folder" if Path(data_args.tokenizer).exists() else "does not exist"
        raise FileNotFoundError(
            f"--tokenizer {data_args.tokenizer} {how}; give a saved tokenizer folder (e.g. tokenizer/) "
            "or leave it out to train one on the corpus"
        )
    if data_args.task == "seq2seq":
        try:
            import sacrebleu  # noqa: F401
        except ImportError as err:
            raise ImportError("seq2seq evaluation needs sacrebleu: pip install 'hf_minitx[demo]'") from err


def check_training_arguments(train_args: TrainArguments) -> None:
    """Counts are positive, the length of the run is defined, smoothing is a probability."""
    if not train_args.output_dir:
        raise ValueError("--output_dir is required: the folder for checkpoints and the final model")
    positive = {
        "per_device_train_batch_size": train_args.per_device_train_batch_size,
        "per_device_eval_batch_size": train_args.per_device_eval_batch_size,
        "gradient_accumulation_steps": train_args.gradient_accumulation_steps,
        "logging_steps": train_args.logging_steps,
    }
    for name, value in positive.items():
        if value < 1:
            raise ValueError(f"--{name} must be >= 1, got {value}")
    at_least = {  # None: the default; 0 for the *_steps: never
        "generation_eval_samples": (train_args.generation_eval_samples, 1),
        "generation_num_beams": (train_args.generation_num_beams, 1),
        "num_threads": (train_args.num_threads, 1),
        "num_sample_generations": (train_args.num_sample_generations, 0),
        "eval_steps": (train_args.eval_steps, 0), "checkpointing_steps": (train_args.checkpointing_steps, 0),
        "warmup_steps": (train_args.warmup_steps, 0), "save_total_limit": (train_args.save_total_limit, 1),
    }
    for name, (value, least) in at_least.items():
        if value is not None and value < least:
            raise ValueError(f"--{name} must be >= {least}, got {value}")
    for name in ("eval_steps", "checkpointing_steps"):
        value = getattr(train_args, name)
        if value is not None and value > 1 and not float(value).is_integer():
            raise ValueError(f"--{name} is a whole number of steps or a fraction of the run in (0, 1), got {value}")
    if train_args.max_steps is not None and train_args.max_steps < 1:
        raise ValueError(f"--max_steps must be >= 1, got {train_args.max_steps}")
    if train_args.num_epochs is not None and not train_args.num_epochs > 0:
        raise ValueError(f"--num_epochs must be > 0 (or give --max_steps), got {train_args.num_epochs}")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(train_args, name) < 1.0:
            raise ValueError(f"--{name} must be in [0, 1), got {getattr(train_args, name)}")
    if not 0 < train_args.adam_epsilon < math.inf:
        raise ValueError(f"--adam_epsilon must be > 0 and finite, got {train_args.adam_epsilon}")
    for name in ("weight_decay", "max_grad_norm"):  # max_grad_norm inf: no clipping, like 0
        if not getattr(train_args, name) >= 0 or (name == "weight_decay" and math.isinf(train_args.weight_decay)):
            raise ValueError(f"--{name} must be >= 0{' and finite' if name == 'weight_decay' else ''}, got "
                             f"{getattr(train_args, name)}")
    if not 0.0 <= train_args.label_smoothing < 1.0:
        raise ValueError(f"--label_smoothing must be in [0, 1), got {train_args.label_smoothing}")
    if not 0.0 <= train_args.late_dropout < 1.0:
        raise ValueError(f"--late_dropout must be in [0, 1) (0: off), got {train_args.late_dropout}")
    if not train_args.late_dropout_passes > 0:
        raise ValueError(f"--late_dropout_passes must be > 0, got {train_args.late_dropout_passes}")
    check_optimizer_arguments(train_args)
    if train_args.max_minutes is not None and train_args.max_minutes <= 0:
        raise ValueError(f"--max_minutes must be > 0 (or left out for no time budget), got {train_args.max_minutes}")
    for name, value in vars(train_args).items():  # NaN passes the comparisons above; inf only as no clipping
        if isinstance(value, float) and not math.isfinite(value) and not (name == "max_grad_norm" and value > 0):
            raise ValueError(f"--{name} must be a finite number, got {value}")
    if train_args.push_to_hub:
        if not train_args.hub_model_id:
            raise ValueError("--push_to_hub needs --hub_model_id USER/NAME")
        from ..hub.push import check_upload_ready

        check_upload_ready(train_args.hub_model_id)  # repo id, token, online: before any training


def plan_run(model_args: ModelArguments, data_args: DataArguments, train_args: TrainArguments) -> RunPlan:
    """Every check that needs no data, in one place; nothing is written. The result drives the whole run.

    The output folder: a new run needs it missing or empty (or --overwrite_output_dir); a resumed run needs a
    readable checkpoint of this folder's own run.
    """
    settings = resolve_model_settings(model_args, data_args)
    config = build_config(settings, model_args.preset)
    if train_args.late_dropout is None:  # the task's default (see TrainArguments.late_dropout)
        train_args.late_dropout = LATE_DROPOUT if data_args.task == "causal-lm" else 0.0
    check_training_arguments(train_args)
    check_data_arguments(config, data_args)
    check_streaming_arguments(data_args, train_args)
    plan = RunPlan(
        model_args, data_args, train_args, settings, config,
        objective=Objective.for_task(data_args.task, train_args.label_smoothing, config),
        output_dir=output_path(train_args.output_dir), trackers=parse_trackers(train_args.report_to),
    )
    inputs = run_inputs(model_args, data_args, train_args)  # a missing dataset file is named here
    if train_args.resume_from_checkpoint is None:
        check_output_folder(plan.output_dir, flag="--overwrite_output_dir (or --resume_from_checkpoint latest to "
                            "continue a run)", overwrite=train_args.overwrite_output_dir, inputs=inputs,
                            any_flag="--overwrite_any_folder", overwrite_any=train_args.overwrite_any_folder)
        if data_args.tokenizer:  # before the corpus is read (a resumed run's tokenizer is checked as an input)
            check_training_tokenizer(data_args.tokenizer)
        return plan
    check_apart(plan.output_dir, inputs, option="--output_dir")
    if plan.output_dir.is_dir():
        check_not_locked(plan.output_dir)
    plan.checkpoint = resolve_checkpoint(train_args.resume_from_checkpoint, plan.output_dir)
    plan.resume_state = read_run_state(plan.checkpoint)
    check_compatible(plan.checkpoint, plan.resume_state, plan.identity)
    check_same_run(plan.output_dir, plan.checkpoint, plan.resume_state)
    check_same_inputs(plan.checkpoint, plan.resume_state, plan.identity, accept_edits=data_args.accept_changed_inputs,
                      tokenizer=data_args.tokenizer)
    check_checkpoint_files(plan.checkpoint, streaming=data_args.streaming, step=plan.resume_state["step"])
    resumed_budget(train_args, plan.resume_state, plan.checkpoint)  # the checkpoint's budget, kept or refused here
    if data_args.streaming:
        check_stream_length(train_args)
        check_stream_resume(plan.checkpoint, data_args, train_args.seed,  # the launcher says how many processes
                            num_processes=int(os.environ.get("WORLD_SIZE", "1")))
    if train_args.max_steps is not None:  # runs of num_epochs are checked once their length is known
        check_not_complete(plan, train_args.max_steps)
    return plan


def check_not_complete(plan: RunPlan, total_steps: int) -> None:
    """A resumed run whose folder already holds the final model of ``total_steps`` (or more) steps, saved
    after its checkpoint, raises AlreadyComplete: nothing is to be done or written."""
    if plan.checkpoint is None:
        return
    try:
        steps = json.loads((plan.output_dir / SUMMARY_FILE).read_text()).get("steps")
    except (OSError, ValueError, AttributeError):
        steps = None  # no (readable) final summary: the run goes on and finishes
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


# --- accelerator ----------------------------------------------------------------------------------


def make_accelerator(train_args: TrainArguments, trackers: list[str]) -> Accelerator:
    """An Accelerator with the requested mixed precision (auto: bf16 on CUDA, none elsewhere)."""
    precision = train_args.mixed_precision
    if precision == "auto":
        precision = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    accelerator = Accelerator(
        # Without an accelerator device, cpu=True lets a torchrun-style launch (accelerate launch --multi_gpu
        # --num_processes N) become a multi-CPU (gloo) job instead of N unrelated single-process runs.
        cpu=pick_device().type == "cpu",
        mixed_precision=precision,
        gradient_accumulation_steps=train_args.gradient_accumulation_steps,
        log_with=trackers or None,
        project_dir=train_args.output_dir,
        dynamo_backend="inductor" if train_args.compile else None,
    )
    check_sharding(accelerator.distributed_type, train_args,
                   getattr(getattr(accelerator.state, "fsdp_plugin", None), "state_dict_type", None))
    if effective_precision(accelerator) != accelerator.mixed_precision:
        accelerator.print(f"note: --mixed_precision {precision} is not available on {accelerator.device.type}; "
                          "training runs in fp32 (the summary and the card say so)")
    if accelerator.device.type == "cpu":
        requested = train_args.num_threads
        torch.set_num_threads(requested or max(1, (os.cpu_count() or 1) // max(1, accelerator.num_processes)))
        keep_freed_memory()  # every step frees and reallocates the same large tensors
    return accelerator


def check_sharding(distributed_type: DistributedType, train_args: TrainArguments, state_dict_type: Any = None) -> None:
    """Refuse what cannot run on sharded weights: Muon orthogonalises each whole matrix, and FSDP gives every
    process a slice of it; checkpoints are checked and resumed as whole weights (``state_dict_type``, the FSDP
    config's ``fsdp_state_dict_type``, FULL_STATE_DICT)."""
    if distributed_type != DistributedType.FSDP:
        return
    if train_args.optimizer == "muon":
        raise ValueError("--optimizer muon needs whole matrices, and an FSDP config shards them over the processes; "
                         "with FSDP pass --optimizer adamw (or launch without the FSDP config)")
    if train_args.checkpointing_steps and "FULL_STATE_DICT" not in str(state_dict_type):
        raise ValueError(f"--checkpointing_steps with FSDP writes whole weights, and the FSDP config asks for "
                         f"{getattr(state_dict_type, 'name', state_dict_type)}; set fsdp_state_dict_type: "
                         "FULL_STATE_DICT in the config (or leave out --checkpointing_steps)")


def effective_precision(accelerator: Accelerator) -> str:
    """The precision the steps really run in: Accelerate keeps the requested name (fp16 on a CPU) even where it
    falls back to fp32 without autocast."""
    precision = accelerator.mixed_precision
    return precision if precision == "no" or accelerator.native_amp else "no"


# --- data -----------------------------------------------------------------------------------------


def load_training_corpus(plan: RunPlan) -> Any:
    """The ``DatasetDict`` (train, validation) that ``--dataset`` names; its layout is recorded in the run
    identity and, resuming, must be the checkpoint's (``check_same_layout``)."""
    data_args = plan.data_args
    corpus = load_corpus(
        data_args.dataset, task=data_args.task, dataset_config=data_args.dataset_config,
        text_column=data_args.text_column, source_column=data_args.source_column,
        target_column=data_args.target_column, validation_split=validation_split_value(data_args.validation_split),
        seed=plan.train_args.seed, num_examples=data_args.num_examples, sample_by=data_args.sample_by,
        streaming=data_args.streaming, skip_bad_rows=data_args.skip_bad_rows,
    )
    if not data_args.streaming:
        plan.identity[LAYOUT] = corpus_layout(corpus)
        check_same_layout(plan)
    return corpus


LAYOUT = "corpus_layout"  # run identity key: rows of each split, characters and digest of validation
VALIDATION_TEXT = "validation_sha256"  # not in the layout of checkpoints saved before it was recorded


def corpus_layout(corpus: DatasetDict) -> dict[str, Any]:
    """How the corpus splits: the rows of train and validation, and the characters and a digest (sha256 of the
    texts in order) of validation. Training text edited in place keeps it; records added, removed or moved, or
    validation text edited, change what validation holds."""
    columns = [c for c in ("text", "source", "target") if c in corpus["validation"].column_names]
    digest, chars = hashlib.sha256(), 0
    for batch in corpus["validation"].iter(batch_size=10_000):
        for row in zip(*(batch[c] for c in columns), strict=True):
            for text in row:
                chars += len(text or "")
                digest.update((text or "").encode("utf-8", "surrogatepass") + b"\0")  # \0: where each text ends
    return {"train_rows": len(corpus["train"]), "validation_rows": len(corpus["validation"]), "validation_chars": chars,
            VALIDATION_TEXT: digest.hexdigest()}


def streamed_validation_layout(validation: Any, asked: int) -> dict[str, Any]:
    """What a streaming run evaluates on, as a record: the blocks asked (``--max_eval_samples``) and read, and a
    digest (sha256) of their tokens. The blocks are read once from the stream's first held-out rows, so records
    moved in the files change it."""
    ids = np.asarray(validation.with_format("numpy")["input_ids"])  # (blocks, block_size)
    return {"validation_blocks_asked": asked, "validation_blocks": int(ids.shape[0]),
            VALIDATION_TEXT: hashlib.sha256(ids.tobytes()).hexdigest()}


def check_same_layout(plan: RunPlan) -> None:
    """A resumed run's corpus splits as its checkpoint's did, and its validation holds the same text (with
    --accept_changed_inputs too): otherwise text the run trained on could now be in validation. A checkpoint
    saved before the validation digest was recorded is compared on the rest."""
    stored = (plan.resume_state or {}).get(LAYOUT)
    now = plan.identity[LAYOUT]
    if not isinstance(stored, dict):
        return
    changed = [key for key in now if key in stored and stored[key] != now[key]]
    if "validation_blocks_asked" in changed:
        raise ValueError(f"the run of checkpoint {plan.checkpoint} evaluated on --max_eval_samples "
                         f"{stored['validation_blocks_asked']} blocks, this one asks for "
                         f"{now['validation_blocks_asked']}: resume with the --max_eval_samples it had, so that its "
                         "evaluations stay comparable")
    if "validation_blocks" in changed:  # streaming, as many blocks asked: fewer held-out rows
        raise ValueError(f"the run of checkpoint {plan.checkpoint} evaluated on {stored['validation_blocks']} "
                         f"validation blocks, this one would on {now['validation_blocks']}: records were removed or "
                         "text was cut, so validation would hold other text. Restore the input, or start a new run in "
                         "another --output_dir")
    if changed == [VALIDATION_TEXT]:
        raise ValueError(f"the validation text is not the one of checkpoint {plan.checkpoint} (its size is, its text "
                         "is not): records were moved or edited, so validation would now hold other text, possibly "
                         "trained on. Restore the input, or start a new run in another --output_dir")
    if changed:
        diff = "; ".join(f"{k}: checkpoint has {stored[k]}, now {now[k]}" for k in changed if k != VALIDATION_TEXT)
        raise ValueError(f"the corpus no longer splits as in checkpoint {plan.checkpoint} ({diff}): records were "
                         "added or removed, or text was cut, so text the run trained on could now be validated on. "
                         "Restore the input, or start a new run in another --output_dir")


def tokenizer_staging(plan: RunPlan) -> Path:
    """Where a freshly trained tokenizer waits (a hidden sibling of output_dir, private to this launch) until the
    folder is claimed."""
    return plan.output_dir.with_name(f".{plan.output_dir.name}.tokenizer-{launch_id()}{PARTIAL_SUFFIX}")


def lock_output_folder(plan: RunPlan) -> None:
    """Take output_dir's lock before any work (the launch's first process), so that a second run on the same
    folder is refused before it reads data or trains a tokenizer. A folder made to hold the lock is noted:
    ``release_unclaimed`` removes it when the run stops before claiming it."""
    if os.environ.get("RANK", "0") != "0":
        return
    made = not plan.output_dir.exists()
    lock_folder(plan.output_dir, command="train")  # a live writer refuses (and nothing is noted)
    plan.made_folder = made
    pattern = f".{plan.output_dir.name}.tokenizer-*{PARTIAL_SUFFIX}"
    for orphan in plan.output_dir.parent.glob(pattern):  # only the lock holder stages: these are a killed run's
        if orphan != tokenizer_staging(plan):
            shutil.rmtree(orphan, ignore_errors=True)
            print(f"note: removed {orphan}, a tokenizer left half-saved by a run that was killed")


def release_unclaimed(plan: RunPlan) -> None:
    """After a failure before the folder was claimed: no staging folder is left, and a folder made only to hold
    the lock is removed (its lock with it)."""
    shutil.rmtree(tokenizer_staging(plan), ignore_errors=True)
    if plan.claimed is None and plan.made_folder:
        unlock_folder(plan.output_dir)
        shutil.rmtree(plan.output_dir, ignore_errors=True)


def get_tokenizer(plan: RunPlan, corpus: Any, accelerator: Accelerator) -> PreTrainedTokenizerBase:
    """The given tokenizer folder, the one a resumed run saved, or a byte-level BPE trained on the training
    split (the main process trains it into ``tokenizer_staging``; ``claim_output_folder`` moves it in)."""
    data_args, output_dir = plan.data_args, plan.output_dir
    if data_args.tokenizer:
        return load_tokenizer(data_args.tokenizer)
    if plan.checkpoint is not None and (output_dir / "tokenizer.json").is_file():
        return load_tokenizer(str(output_dir))
    staging = tokenizer_staging(plan)
    if accelerator.is_main_process:
        accelerator.print(f"training a {data_args.tokenizer_vocab_size}-token BPE tokenizer on {data_args.dataset}")
        tokenizer = train_bpe_tokenizer(
            iter_training_texts(corpus["train"], max_texts=data_args.tokenizer_max_texts, seed=plan.train_args.seed,
                                max_chars=data_args.tokenizer_max_chars),
            data_args.tokenizer_vocab_size, model_max_length=plan.config.max_position_embeddings,
            add_eos_token=data_args.task == "seq2seq",  # sources end with EOS, in training and in use
        )
        shutil.rmtree(staging, ignore_errors=True)
        try:
            tokenizer.save_pretrained(staging)
        except BaseException as error:  # an interruption (or a full disk) leaves no half-saved staging folder
            shutil.rmtree(staging, ignore_errors=True)
            failure = write_failure(error, staging, output_dir)
            if failure is error:
                raise
            raise failure from None
    accelerator.wait_for_everyone()
    return load_tokenizer(str(staging))


def claim_output_folder(plan: RunPlan) -> str:
    """Main process, once every check passed: the only place a run's old folder is replaced. A new run
    empties (or creates) output_dir and marks it; a resumed run keeps it. Returns the run id."""
    if plan.checkpoint is None:
        folder = plan.output_dir
        plan.claimed = ("missing" if plan.made_folder or not folder.exists() else "replaced" if describe_contents(folder)
                        else "empty")
        run_id = replace_folder(plan.output_dir, command="train")
    else:
        plan.claimed = "resumed"
        lock_folder(plan.output_dir, command="train")
        marker = read_marker(plan.output_dir)
        run_id = (marker or {}).get("run_id") or plan.resume_state.get("run_id") or uuid.uuid4().hex[:12]
        if marker is None:
            write_marker(plan.output_dir, command="train", run_id=run_id)
    staging = tokenizer_staging(plan)
    if staging.is_dir():
        move_files_into(staging, plan.output_dir)
    return run_id


def abandon_setup(plan: RunPlan | None) -> str:
    """After an interruption before the first step: remove what this run wrote (the tokenizer staging
    folder; a new run's marker and tokenizer), and say in one line what is left."""
    if plan is None:
        return "interrupted before training started; nothing was written"
    release_unclaimed(plan)
    folder = plan.output_dir
    if plan.claimed == "resumed":
        return f"interrupted before training resumed; the run in {folder} is as it was: resume it again"
    if plan.claimed == "missing":
        shutil.rmtree(folder, ignore_errors=True)
    elif plan.claimed in ("empty", "replaced"):  # holds only what this run put there
        for path in folder.iterdir():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    if plan.claimed == "replaced":
        return (f"interrupted before training started; the old contents of {folder} had already been replaced "
                "(--overwrite_output_dir), so it is left empty")
    return "interrupted before training started; nothing was written"


def _first_rows(split: Any, limit: int | None) -> Any:
    return split if limit is None or limit >= len(split) else split.select(range(limit))


def prepare_data(corpus: Any, tokenizer: PreTrainedTokenizerBase, plan: RunPlan) -> PreparedData:
    """Model-ready train/validation sets, the collator, and the texts that generation is shown or scored on."""
    data_args, train_args = plan.data_args, plan.train_args
    if data_args.streaming:
        data = prepare_streaming_data(corpus, tokenizer, data_args)
        asked = data_args.max_eval_samples or STREAMING_EVAL_BLOCKS
        plan.identity[LAYOUT] = streamed_validation_layout(data.validation, asked)  # a resumed run's must be the same
        check_same_layout(plan)
    elif data_args.task == "causal-lm":
        collate = block_collator(tokenizer)
        train = tokenize_and_pack(DatasetDict(train=corpus["train"]), tokenizer, data_args.block_size,
                                  num_proc=data_args.num_proc)["train"]
        validation = tokenize_and_pack(DatasetDict(validation=corpus["validation"]), tokenizer, data_args.block_size,
                                       num_proc=data_args.num_proc, for_evaluation=True)["validation"]
        if data_args.max_eval_samples is None:  # the whole validation text, as it stands in the corpus
            num_bytes = text_bytes(t for batch in corpus["validation"].iter(1000) for t in batch["text"])
        else:  # opt-in subset: the bytes of the tokens it scores
            validation = _first_rows(validation, data_args.max_eval_samples)
            num_bytes = predicted_bytes(collate(list(validation))["labels"].tolist(), tokenizer)
        prompts = [" ".join(text.split()[:6]) for text in corpus["validation"]["text"][:8] if text.strip()]
        data = PreparedData(train, validation, collate, prompts=prompts, num_bytes=num_bytes)
    else:
        features = preprocess_seq2seq(
            corpus, tokenizer, max_source_length=data_args.max_source_length,
            max_target_length=data_args.max_target_length, num_proc=data_args.num_proc,
        )
        pairs = _first_rows(corpus["validation"], train_args.generation_eval_samples)
        data = PreparedData(features["train"], _first_rows(features["validation"], data_args.max_eval_samples),
                            seq2seq_collator(tokenizer), prompts=list(corpus["validation"]["source"][:8]),
                            sources=list(pairs["source"]), references=list(pairs["target"]))
    if train_args.sample_prompts:
        data.prompts = [p.strip() for p in train_args.sample_prompts.split("|") if p.strip()]
    data.prompts = data.prompts[: train_args.num_sample_generations]
    return data


def is_hub_dataset(dataset: str) -> bool:
    """Whether ``--dataset`` names a Hub dataset (not a builtin, not local files)."""
    if dataset.startswith("builtin:") or any(ch in dataset for ch in "*?,"):
        return False
    return not Path(dataset).expanduser().exists()


# --- model --------------------------------------------------------------------------


def build_model(config: MiniTxConfig, tokenizer: PreTrainedTokenizerBase) -> nn.Module:
    """A fresh MiniTx model whose vocabulary and special ids come from the tokenizer (set on ``config``)."""
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    missing = [name for name, value in ids.items() if value is None]
    if missing:
        raise ValueError(f"the tokenizer lacks {missing}; use a tokenizer with <pad>, <bos> and <eos> tokens")
    for name, value in {**ids, "vocab_size": len(tokenizer), "decoder_start_token_id": ids["bos_token_id"]}.items():
        setattr(config, name, value)
    cls = MiniTxForConditionalGeneration if config.is_encoder_decoder else MiniTxForCausalLM
    return cls(config)
