"""``--streaming`` in training: the checks, the held-out validation read once, this process's endless train
batches from a ``PackedBlockStream``, and its exact position saved in (and restored from) checkpoints."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from transformers import PreTrainedTokenizerBase

from ..data.preprocessing import block_collator
from ..data.streaming import PackedBlockStream, held_out_blocks, load_stream_state, save_stream_state
from .arguments import DataArguments, TrainArguments
from .evaluation import predicted_bytes
from .prepared import PreparedData

STREAMING_EVAL_BLOCKS = 256  # validation blocks read once from the held-out rows when --max_eval_samples is unset


def stream_state_path(checkpoint: Path, process_index: int) -> Path:
    """Where process ``process_index`` keeps its stream position inside a checkpoint folder."""
    return Path(checkpoint) / f"stream_state_{process_index}.npz"


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


def check_stream_length(train_args: TrainArguments) -> None:
    """A stream has no length to count epochs from: --max_steps or a time budget (--max_minutes) ends the run."""
    if train_args.max_steps is None and train_args.max_minutes is None:
        raise ValueError("--streaming needs --max_steps or --max_minutes: a stream has no length to count epochs "
                         "from")


def prepare_streaming_data(corpus: Any, tokenizer: PreTrainedTokenizerBase, data_args: DataArguments) -> PreparedData:
    """The train rows (a stream), validation blocks read once from the held-out rows (the first
    ``--max_eval_samples``, default ``STREAMING_EVAL_BLOCKS``), the collator, prompts and scored bytes."""
    collate = block_collator(tokenizer)
    validation = held_out_blocks(corpus["validation"], tokenizer, data_args.block_size,
                                 data_args.max_eval_samples or STREAMING_EVAL_BLOCKS)
    num_bytes = predicted_bytes(collate(list(validation))["labels"].tolist(), tokenizer)
    texts = [row["text"] for row in itertools.islice(corpus["validation"], 8)]
    prompts = [" ".join(text.split()[:6]) for text in texts if text.strip()]
    return PreparedData(corpus["train"], validation, collate, prompts=prompts, num_bytes=num_bytes)


def streaming_train_batches(
    data: PreparedData, tokenizer: PreTrainedTokenizerBase, data_args: DataArguments, train_args: TrainArguments,
    accelerator: Accelerator, checkpoint: Path | None,
) -> tuple[Iterator[dict[str, torch.Tensor]], PackedBlockStream]:
    """This process's endless (batch, block) train batches and their stream, continued from the position
    saved in ``checkpoint`` (if any)."""
    stream = PackedBlockStream(
        data.train, tokenizer, data_args.block_size, shuffle_buffer=data_args.shuffle_buffer,
        seed=train_args.seed, num_processes=accelerator.num_processes, process_index=accelerator.process_index)
    if checkpoint is not None:
        restore_stream_position(stream, checkpoint, accelerator.process_index)
    return stream.batches(train_args.per_device_train_batch_size, data.collate), stream


def save_stream_position(position: dict[str, Any], checkpoint: Path, process_index: int) -> None:
    """Write this process's stream position (a ``PackedBlockStream.state_dict()``) into the checkpoint folder
    (each process its own file)."""
    path = stream_state_path(checkpoint, process_index)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    save_stream_state(position, partial)
    partial.replace(path)


def restore_stream_position(stream: PackedBlockStream, checkpoint: Path, process_index: int) -> None:
    """Continue ``stream`` exactly where the checkpoint's run left it."""
    path = stream_state_path(checkpoint, process_index)
    if not path.is_file():
        raise ValueError(f"checkpoint {checkpoint} has no stream position for process {process_index} ({path.name}): "
                         "it was not saved by a --streaming run with this many processes; resume it without "
                         "--streaming, or start a new run")
    stream.load_state_dict(load_stream_state(path))
