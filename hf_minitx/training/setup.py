"""Setup of a `minitx train` run: from its checked plan (a ``RunPlan``) to the first step.

``setup`` makes the Accelerator, loads the corpus, gets the tokenizer, prepares the data, builds the model, the
optimizer and the schedule over the run's length, claims the run folder, resumes the checkpoint's states and
starts the trackers: it returns the ``TrainingRun`` that ``fit`` drives and the ``RunState`` it starts from.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from torch import nn
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from ..data.sources import dataset_key
from ..device import keep_freed_memory, pick_device
from ..hub.card_training import describe_shape_candidates
from ..inference import non_finite_weights
from ..models import MiniTxConfig, MiniTxForCausalLM, MiniTxForConditionalGeneration
from .argument_checks import check_accumulation_window, check_one_batch
from .arguments import DEFAULT_PRESET, TrainArguments
from .best import BestWeights
from .budget import TimeBudget, every
from .checkpoints import check_checkpoint_fits
from .data_order import StepIndexedBatchSampler
from .distill import check_teacher_vocabulary, load_distillation
from .evaluation import TextEvaluation
from .optim import build_optimizer, build_scheduler, describe_schedule, relay_schedule, warmup_cut_warning
from .outputs import truncate_metrics
from .run_folder import claim_output_folder, get_tokenizer
from .run_length import SCHEDULE_CHANGES, late_dropout_plan, run_length, schedule_changes
from .run_plan import RunPlan, build_config, check_global_batch, check_not_complete, shift_window
from .shape_plan import (
    PASSES_PER_MODEL,
    PHASES,
    SHAPE_PLAN,
    may_split,
    plan_phases,
    plan_shape,
    too_many_passes,
    unsplit_reason,
)
from .state import LoopSettings, RunState, TrainingRun
from .training_data import load_training_corpus, prepare_data, streaming_train_batches, training_loader

logger = logging.getLogger(__name__)


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
    if train_args.distill_from:  # before the run folder is claimed: a teacher of another vocabulary writes nothing
        check_teacher_vocabulary(train_args.distill_from, tokenizer)
    with accelerator.main_process_first():
        data = prepare_data(corpus, tokenizer, plan)
    window = shift_window(plan)
    if not plan.data_args.streaming:  # said in blocks or pairs before the sampler would say it in rows
        check_one_batch(len(data.train), train_args.per_device_train_batch_size * accelerator.num_processes,
                        plan.data_args.task, plan.data_args.block_size, window)
    batches_per_epoch = None if plan.data_args.streaming else StepIndexedBatchSampler(
        len(data.train), train_args.per_device_train_batch_size, num_processes=accelerator.num_processes,
        window=window,
    ).batches_per_epoch
    check_accumulation_window(k, batches_per_epoch)
    timing_seconds = choose_planned_shape(plan, tokenizer, accelerator, batches_per_epoch, data)
    set_seed(train_args.seed)
    model = build_model(plan.config, tokenizer)
    distillation = load_distillation(train_args, model, accelerator.device)
    optimizer = build_optimizer(model, train_args)
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
    state.train_seconds += timing_seconds  # the shape's timing is spent from the budget, as training is
    if changes:  # the optimizer came back with the checkpoint's rate: the new length applies from this step on
        relay_schedule(scheduler, train_args, total_steps)
    best = BestWeights.load(plan.checkpoint, state.best_step, state.best_metrics) if plan.checkpoint else BestWeights()
    evaluation = build_evaluation(plan, data, tokenizer, eval_loader)
    settings = loop_settings(plan, total_steps, batches_per_epoch, budget)
    if budget is not None and settings.late_dropout is not None:  # the final plan prices the slower steps
        budget.slower_from = settings.late_dropout[0]
    stream = None
    if plan.data_args.streaming:  # this process's rows, tokenized and packed on the fly, from the saved position
        batches, stream = streaming_train_batches(data, tokenizer, plan.data_args, train_args, accelerator,
                                                  plan.checkpoint)
    else:
        batches = iter(training_loader(data, train_args, accelerator, start=state.step * k, window=shift_window(plan)))
    run = TrainingRun(accelerator, model, optimizer, scheduler, batches, plan.objective, evaluation, settings,
                      plan.output_dir, checkpoint_fields={
                          **plan.identity, "run_id": run_id, SCHEDULE_CHANGES: changes, SHAPE_PLAN: plan.shape_plan,
                          "global_batch_size": train_args.per_device_train_batch_size * accelerator.num_processes * k},
                      stream=stream, recipe=training_recipe(plan, total_steps, accelerator.num_processes),
                      budget=budget, schedule_args=train_args,
                      best=best if train_args.load_best_model_at_end else None, distillation=distillation)
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


def build_evaluation(plan: RunPlan, data: Any, tokenizer: PreTrainedTokenizerBase,
                     eval_loader: DataLoader) -> TextEvaluation:
    """What each evaluation measures: the validation loss (and bits per byte over the whole split, where it is
    whole), and the sample generations the arguments ask for."""
    train_args = plan.train_args
    objective = replace(plan.objective, input_noise=0.0)  # scored on the text as it is read at inference
    return TextEvaluation(
        eval_loader, objective, tokenizer, prompts=data.prompts, sources=data.sources,
        references=data.references, num_samples=train_args.num_sample_generations, seed=train_args.seed,
        num_bytes=data.num_bytes, whole_split=plan.data_args.max_eval_samples is None and not plan.data_args.streaming,
        rows=len(data.validation),
        generation={"max_new_tokens": plan.data_args.max_target_length, "num_beams": train_args.generation_num_beams,
                    "do_sample": False, "max_source_length": plan.data_args.max_source_length,
                    "batch_size": train_args.per_device_eval_batch_size * 4},
    )


def loop_settings(plan: RunPlan, total_steps: int, batches_per_epoch: int | None,
                  budget: TimeBudget | None) -> LoopSettings:
    """The loop's cadences and limits, from the arguments and the run's planned length (``budget``: the time
    budget's plan, or None)."""
    train_args = plan.train_args
    k = train_args.gradient_accumulation_steps
    return LoopSettings(
        total_steps=total_steps, batches_per_epoch=batches_per_epoch, accumulation_steps=k,
        logging_steps=train_args.logging_steps, eval_steps=every(train_args.eval_steps, total_steps),
        checkpointing_steps=every(train_args.checkpointing_steps, total_steps),
        save_total_limit=train_args.save_total_limit,
        max_grad_norm=train_args.max_grad_norm or None, show_progress=not train_args.disable_tqdm,
        max_seconds=budget.cap_seconds if budget is not None else None,
        late_dropout=late_dropout_plan(train_args, plan.config, batches_per_epoch, k),
        calibrate=train_args.calibrate_temperature,
    )


def choose_planned_shape(plan: RunPlan, tokenizer: PreTrainedTokenizerBase, accelerator: Accelerator,
                         batches_per_epoch: int | None, data: Any) -> float:
    """A run whose time budget chooses its shape (``RunPlan.plans_shape``) times the candidates here, with the
    tokenizer's vocabulary, and takes the chosen one into its settings and config (``data``: the prepared data,
    whose training samples hold --block_size tokens); the seconds it spent (0.0 for any other run)."""
    if not plan.plans_shape or not batches_per_epoch:
        return 0.0
    settings = {**plan.settings, **tokenizer_ids(tokenizer)}
    block = plan.data_args.block_size
    chosen = plan_shape(settings, plan.train_args, block, batches_per_epoch, len(data.train) * block,
                        accelerator.device, reduce=accelerator.reduce if accelerator.num_processes > 1 else None)
    plan.shape_plan = chosen.record()
    plan.settings.update(plan.shape_plan["settings"])
    plan.config = build_config(plan.settings, DEFAULT_PRESET)
    accelerator.print(f"the time budget chose {chosen.chosen.name} ({plan.shape_plan['rule']}): "
                      f"{describe_shape_candidates(chosen.candidates)}")
    planned = chosen.planned
    warning = too_many_passes(planned["planned_passes"])
    if warning:
        logger.warning(warning)
    split = (plan_phases(planned["planned_passes"], planned["planned_steps"], plan.train_args.max_minutes)
             if may_split(plan.train_args) else None)
    if split is not None:  # this run is the teacher: its budget is its share (see phases.py)
        plan.shape_plan[PHASES] = {**split, "dataset": dataset_key(plan.data_args.dataset)}
        plan.train_args.max_minutes = split["teacher_minutes"]
        accelerator.print(f"{split['passes_of_one_model']:g} passes over the data are more than one model learns "
                          f"from ({PASSES_PER_MODEL:g}): a teacher trains for {split['teacher_minutes']:.3g} min, then "
                          f"a student learns from it for {split['student_minutes']:.3g} min")
    elif may_split(plan.train_args):
        reason = unsplit_reason(planned["planned_passes"], planned["planned_steps"])
        if reason:
            accelerator.print(reason)
    return chosen.seconds


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
    if not accelerator.is_main_process:  # its warnings would repeat the first process's, once per process
        logging.getLogger("hf_minitx").setLevel(logging.ERROR)
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


def tokenizer_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """The config fields that come from the tokenizer: the vocabulary size and the special ids."""
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    missing = [name for name, value in ids.items() if value is None]
    if missing:
        raise ValueError(f"the tokenizer lacks {missing}; use a tokenizer with <pad>, <bos> and <eos> tokens")
    return {**ids, "vocab_size": len(tokenizer), "decoder_start_token_id": ids["bos_token_id"]}


def build_model(config: MiniTxConfig, tokenizer: PreTrainedTokenizerBase) -> nn.Module:
    """A fresh MiniTx model whose vocabulary and special ids come from the tokenizer (set on ``config``)."""
    for name, value in tokenizer_ids(tokenizer).items():
        setattr(config, name, value)
    cls = MiniTxForConditionalGeneration if config.is_encoder_decoder else MiniTxForCausalLM
    return cls(config)


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


def training_recipe(plan: RunPlan, total_steps: int, num_processes: int) -> dict[str, Any]:
    """How the run trains, for training_summary.json and the card: optimizer, schedule, clipping, batch, lengths."""
    train_args, data_args = plan.train_args, plan.data_args
    batch = train_args.per_device_train_batch_size
    causal = {"block_size": data_args.block_size, "shift_windows": bool(shift_window(plan))}
    lengths = (causal if plan.objective.shift else
               {"max_source_length": data_args.max_source_length, "max_target_length": data_args.max_target_length})
    return {"optimizer": train_args.optimizer, "schedule": describe_schedule(train_args, total_steps),
            "max_grad_norm": train_args.max_grad_norm or None, "label_smoothing": train_args.label_smoothing,
            "input_noise": train_args.input_noise,
            "per_device_train_batch_size": batch, "gradient_accumulation_steps": train_args.gradient_accumulation_steps,
            "global_batch_size": batch * num_processes * train_args.gradient_accumulation_steps, **lengths}


def start_trackers(plan: RunPlan, accelerator: Accelerator) -> None:
    """Accelerate trackers (--report_to) with every argument as the run's config."""
    if accelerator.trackers:
        config = {**asdict(plan.model_args), **asdict(plan.data_args), **asdict(plan.train_args)}
        accelerator.init_trackers("hf_minitx", config={k: v for k, v in config.items() if v is not None})
