"""Checks of the training arguments that need no data: counts, ranges and combinations that cannot run, each
refused with one clear error naming the option, before any work (``plan_run`` calls them)."""

from __future__ import annotations

import math
from pathlib import Path

from ..cli import check_at_least, check_fraction
from ..data.builtin import check_num_examples
from ..data.corpus import corpus_task
from ..data.tokenizer import check_vocab_size
from ..device import check_thread_count
from ..models import MiniTxConfig
from .arguments import DataArguments, TrainArguments
from .data_order import StepIndexedBatchSampler
from .optim import check_optimizer_arguments

TRACKERS = {  # Accelerate's trackers (--report_to) and the pip package that brings each
    "tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb", "aim": "aim", "comet_ml": "comet-ml",
    "mlflow": "mlflow", "clearml": "clearml", "dvclive": "dvclive", "swanlab": "swanlab",
}


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
    check_num_examples(data_args.dataset, data_args.num_examples)
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
    if data_args.task == "seq2seq":  # first: a pair's lengths need more than any count's 1
        check_at_least({name: getattr(data_args, name) for name in ("max_source_length", "max_target_length")}, 2,
                       hint=" (at least one token and <eos>)")
    check_at_least(counts, 1, hint=" (or left out for the default)")
    if data_args.block_size < 2:
        raise ValueError(f"--block_size must be >= 2 (a token and the next one to predict), got {data_args.block_size}")
    if data_args.shift_windows and (data_args.task != "causal-lm" or data_args.streaming):
        where = "--streaming (a stream is read once, in order)" if data_args.streaming else "--task seq2seq (pairs)"
        raise ValueError(f"--shift_windows cuts packed causal-lm text and does not apply with {where}; leave it out")
    if data_args.shuffle_buffer < 0:
        raise ValueError(f"--shuffle_buffer must be >= 0 (0 keeps stream order), got {data_args.shuffle_buffer}")
    if not data_args.tokenizer:
        check_vocab_size(data_args.tokenizer_vocab_size, "--tokenizer_vocab_size")
    for name, value in lengths.items():
        if value > config.max_position_embeddings:
            raise ValueError(
                f"--{name} {value} is larger than the model's max_position_embeddings "
                f"({config.max_position_embeddings}); "
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
    check_at_least({**positive, "generation_eval_samples": train_args.generation_eval_samples,  # None: the default
                    "generation_num_beams": train_args.generation_num_beams,
                    "save_total_limit": train_args.save_total_limit, "max_steps": train_args.max_steps}, 1)
    check_at_least({"num_sample_generations": train_args.num_sample_generations,  # 0 for the *_steps: never
                    "eval_steps": train_args.eval_steps, "checkpointing_steps": train_args.checkpointing_steps,
                    "warmup_steps": train_args.warmup_steps}, 0)
    check_thread_count(train_args.num_threads, "--num_threads")
    for name in ("eval_steps", "checkpointing_steps"):
        value = getattr(train_args, name)
        if value is not None and value > 1 and not float(value).is_integer():
            raise ValueError(f"--{name} is a whole number of steps or a fraction of the run in (0, 1), got {value}")
    if train_args.num_epochs is not None and not train_args.num_epochs > 0:
        raise ValueError(f"--num_epochs must be > 0 (or give --max_steps), got {train_args.num_epochs}")
    for name in ("adam_beta1", "adam_beta2", "label_smoothing"):
        check_fraction(name, getattr(train_args, name))
    for name in ("input_noise", "late_dropout"):
        check_fraction(name, getattr(train_args, name), hint=" (0: off)")
    if not 0 < train_args.adam_epsilon < math.inf:
        raise ValueError(f"--adam_epsilon must be > 0 and finite, got {train_args.adam_epsilon}")
    for name in ("weight_decay", "max_grad_norm"):  # max_grad_norm inf: no clipping, like 0
        if not getattr(train_args, name) >= 0 or (name == "weight_decay" and math.isinf(train_args.weight_decay)):
            raise ValueError(f"--{name} must be >= 0{' and finite' if name == 'weight_decay' else ''}, got "
                             f"{getattr(train_args, name)}")
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


def check_streaming_arguments(data_args: DataArguments, train_args: TrainArguments) -> None:
    """One clear error for a streaming run that cannot work."""
    if not data_args.streaming:
        return
    if data_args.task != "causal-lm":
        raise ValueError("--streaming trains causal-lm models only; for --task seq2seq leave --streaming out")
    if train_args.resume_from_checkpoint is None:  # a resumed run may take the checkpoint's budget up again
        check_stream_length(train_args)
    if data_args.shuffle_buffer < 0:
        raise ValueError(f"--shuffle_buffer must be >= 0 blocks, got {data_args.shuffle_buffer}")


def check_stream_length(train_args: TrainArguments, resumed_steps: int | None = None) -> None:
    """A stream has no length to count epochs from: --max_steps or a time budget (--max_minutes) ends the run
    (``resumed_steps``: the length the resumed checkpoint's run was laid over, said in the error)."""
    if train_args.num_epochs is not None and train_args.max_steps is None:
        raise ValueError(f"--num_epochs {train_args.num_epochs:g} cannot bound a --streaming run: a stream has no "
                         "length to count epochs from; give --max_steps (or --max_minutes alone) instead")
    if train_args.max_steps is None and train_args.max_minutes is None:
        finish = f"; the checkpoint's run was laid over {resumed_steps} steps: --max_steps {resumed_steps} finishes " \
                 "it" if resumed_steps else ""
        raise ValueError("--streaming needs --max_steps or --max_minutes: a stream has no length to count epochs "
                         f"from{finish}")


def check_one_batch(rows: int, global_batch: int, task: str, block_size: int, window: int) -> None:
    """The training split fills one global batch (``rows`` packed blocks or pairs, ``window`` > 0: shifted windows,
    where the last block only continues the others), said in the units the user can change."""
    if StepIndexedBatchSampler.usable_rows(rows, window) >= global_batch:
        return
    batch = f"a global batch of {global_batch} (--per_device_train_batch_size x processes)"
    if task != "causal-lm":
        raise ValueError(f"the training split has {rows} pairs, fewer than {batch}; give more pairs"
                         + (" or a smaller --per_device_train_batch_size" if global_batch > 1 else ""))
    blocks = f"{rows} block{'s' if rows != 1 else ''}"
    raise ValueError(f"the training text packs into {blocks} of --block_size {block_size} tokens, and {batch} needs "
                     f"{global_batch + 1 if window else global_batch}" + (" (a shifted window reads on into the next "
                                                                          "block)" if window else "")
                     + "; give more text, or a smaller --block_size"
                     + (" or --per_device_train_batch_size" if global_batch > 1 else ""))


def check_accumulation_window(accumulation_steps: int, batches_per_epoch: int | None) -> None:
    """One optimizer step reads the training split at most once: its window of micro-batches is gathered whole
    before the backward (the loss is divided by the window's token count), so a longer window would hold the split
    in memory more than once and repeat its rows in one gradient. A streamed corpus has no count to check."""
    if batches_per_epoch is not None and accumulation_steps > batches_per_epoch:
        raise ValueError(f"--gradient_accumulation_steps {accumulation_steps} asks one optimizer step to read "
                         f"{accumulation_steps} batches, and the training split holds {batches_per_epoch}; give at "
                         f"most {batches_per_epoch} (one step a pass over the data)")
