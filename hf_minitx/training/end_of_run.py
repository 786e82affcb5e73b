"""The end of a run: the weights it keeps, its summary and its final save.

    keep_best          --load_best_model_at_end: the best evaluation's weights go back into the model
    train_summary      training_summary.json: the data, the run (``run_summary``, whatever trained it), the recipe
    finish             the final folder (model, tokenizer, summary, loss curve), its card, and the push

The final folder is written into a hidden folder first and renamed into place with training_summary.json last,
so that a kill or a full disk never leaves a folder that looks finished and is not.
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from safetensors import SafetensorError
from transformers import PreTrainedTokenizerBase

from ..data.corpus import REPLACED_BYTES, SKIPPED_ROWS
from ..device import describe_hardware
from ..folders import PARTIAL_SUFFIX, move_files_into
from .best import too_few_to_choose
from .checkpoints import write_failure
from .optim import describe_optimizer
from .outputs import LOSS_CURVE_FILE, SUMMARY_FILE, save_final_model, tokens_per_second
from .rescue import check_room, final_save_bytes, rescue_final_model
from .run_plan import RunPlan
from .setup import effective_precision
from .shape_plan import SHAPE_PLAN
from .signals import StopSignals
from .state import FitOutcome, RunState, TrainingRun
from .training_data import is_hub_dataset

logger = logging.getLogger(__name__)


def keep_best(run: TrainingRun, state: RunState, outcome: FitOutcome) -> None:
    """--load_best_model_at_end: the best evaluation's weights go back into the model when the last evaluation
    is worse; ``outcome`` then reports the kept model's metrics, and records which step it is."""
    best = run.best
    if best is None or best.step is None:
        return
    last = outcome.final_metrics
    outcome.kept = {"step": state.step, "eval_loss": last.get("eval_loss"), "last_step": state.step,
                    "last_eval_loss": last.get("eval_loss")}
    small = too_few_to_choose(run.evaluation.coverage)
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


def train_summary(plan: RunPlan, run: TrainingRun, state: RunState, outcome: FitOutcome) -> dict[str, Any]:
    """training_summary.json of a `minitx train` run: its data and arguments around ``run_summary``."""
    model_args, data_args, train_args = plan.model_args, plan.data_args, plan.train_args
    return {
        "task": data_args.task, "dataset": data_args.dataset, "dataset_config": data_args.dataset_config,
        "hub_dataset": is_hub_dataset(data_args.dataset), **run_summary(run, state, outcome),
        "evaluation": run.evaluation.coverage,
        "preset": model_args.preset, "seed": train_args.seed, "config_overrides": model_args.config_overrides,
        **({SHAPE_PLAN: plan.shape_plan} if plan.shape_plan else {}),
        **({"distilled_from": plan.teacher} if plan.teacher else {}),
        **({"bad_bytes_replaced": dict(REPLACED_BYTES), "rows_without_text_skipped": dict(SKIPPED_ROWS)}
           if data_args.skip_bad_rows else {}),
    }


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
        **({"calibration": outcome.calibration} if outcome.calibration else {}),
        "hardware": describe_hardware(run.accelerator.device, run.accelerator.num_processes),
        "mixed_precision": effective_precision(run.accelerator), "num_processes": run.accelerator.num_processes,
        **({"mixed_precision_asked": run.accelerator.mixed_precision}  # fp16 on a CPU: the steps ran in fp32
           if effective_precision(run.accelerator) != run.accelerator.mixed_precision else {}),
        "final_metrics": outcome.final_metrics,
        "sample_generations": [{"prompt": s["prompt"], "output": s["output"]} for s in state.last_samples],
        "num_parameters": model.num_parameters(),
        "stopped_by_time_budget": outcome.stopped_by_time_budget,
        "tokens_per_second": tokens_per_second(state.tokens_seen, state.train_seconds),
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
    release_wrapper(run)
    accelerator.end_training()
    return signals.received


def release_wrapper(run: TrainingRun) -> None:
    """Drop the data-parallel wrapper while its process group is still registered. Dropped after the group, its
    reducer would free the group's last reference, whose destructor waits for gloo's thread while holding the
    interpreter lock that thread may need to finish its last work: a process that hangs at exit, now and then."""
    run.model = run.accelerator.unwrap_model(run.model)
    run.accelerator.free_memory()  # its list of prepared models held the wrapper too


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
