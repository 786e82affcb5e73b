"""Causal-LM training data from a stream: blocks tokenized and packed on the fly, shuffled with a seeded
buffer, split between processes, and resumable at the exact block.

``PackedBlockStream`` has no ``len()``: it reads a streaming split of ``{"text", "doc_end"}`` rows (any
``load_corpus(..., streaming=True)`` train split) epoch after epoch. Its ``state_dict()`` is the whole
position after the last block handed out (rows read, tokens not yet packed, the shuffle buffer and its
random generator), so a stream restored with ``load_state_dict`` yields exactly the blocks the first one
would have yielded next, without tokenizing again what came before (datasets skips the rows already read).
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset, IterableDataset
from datasets.distributed import split_dataset_by_node
from transformers import PreTrainedTokenizerBase

from .preprocessing import (
    DOC_END,
    BlockCollator,
    block_features,
    encode_rows,
    iter_blocks,
    row_batches,
    token_dtype,
)

STATE_VERSION = 1


class PackedBlockStream:
    """Endless (block_size,) token blocks for one process, read from a streaming split.

    Epoch ``e`` reads this process's rows in order (with ``num_processes > 1``, one row in
    ``num_processes``, through ``datasets.distributed.split_dataset_by_node``), tokenizes them in batches,
    puts EOS where a document ends, and packs the tokens into blocks (the last partial block of an epoch is
    dropped). Blocks pass through a buffer of ``shuffle_buffer`` blocks: once it is full, each new block
    takes the place of a randomly chosen one, which is handed out; at the end of an epoch the buffer is
    emptied in random order, so no block of epoch ``e`` comes after one of ``e + 1``. The generator of
    epoch ``e`` is seeded with (seed, e, process), so every run gives the same blocks in the same order.
    The rows' order is the same every epoch: held-out validation rows are defined by position.
    """

    def __init__(
        self, rows: IterableDataset, tokenizer: PreTrainedTokenizerBase, block_size: int, *,
        shuffle_buffer: int = 10_000, seed: int = 42, num_processes: int = 1, process_index: int = 0,
    ) -> None:
        if block_size < 2:
            raise ValueError(f"block_size must be >= 2, got {block_size}")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token; set tokenizer.eos_token before streaming")
        if shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be >= 0 blocks, got {shuffle_buffer}")
        self._source = rows if num_processes == 1 else split_dataset_by_node(
            rows, rank=process_index, world_size=num_processes, strategy="examples")
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.num_processes = num_processes
        self.process_index = process_index
        self.dtype = token_dtype(len(tokenizer))
        self.blocks_yielded = 0
        self.set_epoch(0)

    def settings(self) -> dict[str, Any]:
        """What a saved position is only valid for."""
        return {"block_size": self.block_size, "shuffle_buffer": self.shuffle_buffer, "seed": self.seed,
                "num_processes": self.num_processes, "process_index": self.process_index, "dtype": self.dtype.name}

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch``: no row read, nothing buffered, the epoch's own generator."""
        self.epoch = epoch
        self.epoch_blocks = 0
        self._rows_state: dict | None = None
        self._carry = np.empty(0, self.dtype)
        self._buffer = np.empty((self.shuffle_buffer, self.block_size), self.dtype)
        self._filled = 0
        self._rng = np.random.default_rng([self.seed, epoch, self.process_index])

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            yield from self._epoch()
            if self.epoch_blocks == 0:
                rows = ("each process reads whole rows, and a text file is one row per document (cut at about 1 MB): "
                        "use more data, --sample_by paragraph or line, fewer processes, or a smaller --block_size"
                        if self.num_processes > 1 else "use more data or a smaller --block_size")
                raise ValueError(f"process {self.process_index} of {self.num_processes} got no block of "
                                 f"{self.block_size} tokens from the stream in a whole epoch: {rows}")
            self.set_epoch(self.epoch + 1)

    def _epoch(self) -> Iterator[np.ndarray]:
        """The rest of the current epoch, from the saved position."""
        rows = copy.deepcopy(self._source)  # a fresh iteration state; the source keeps epoch 0 and its order
        if self._rows_state is not None:
            rows.load_state_dict(self._rows_state)
        batches = row_batches(rows)
        while True:
            while len(self._carry) >= self.block_size:  # tokens already read come first
                block, self._carry = self._carry[: self.block_size], self._carry[self.block_size :]
                out = self._exchange(block)
                if out is not None:
                    yield self._count(out)
            batch = next(batches, None)
            if batch is None:
                break
            self._rows_state = rows.state_dict()
            ids = encode_rows(batch["text"], batch[DOC_END], self.tokenizer, self.tokenizer.eos_token_id, self.dtype)
            self._carry = np.concatenate([self._carry, *ids])
        self._carry = self._carry[:0]  # the epoch's last partial block
        while self._filled:
            index = int(self._rng.integers(self._filled))
            out = self._buffer[index].copy()
            self._filled -= 1
            self._buffer[index] = self._buffer[self._filled]
            yield self._count(out)

    def _exchange(self, block: np.ndarray) -> np.ndarray | None:
        """Put ``block`` in the buffer; return the block it replaces (None while the buffer fills)."""
        if self.shuffle_buffer <= 1:
            return block.copy()
        if self._filled < self.shuffle_buffer:
            self._buffer[self._filled] = block
            self._filled += 1
            return None
        index = int(self._rng.integers(self.shuffle_buffer))
        out = self._buffer[index].copy()
        self._buffer[index] = block
        return out

    def _count(self, block: np.ndarray) -> np.ndarray:
        self.blocks_yielded += 1
        self.epoch_blocks += 1
        return block

    def batches(self, batch_size: int, collate: BlockCollator | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """Endless collated batches: ``input_ids`` and ``labels`` (batch_size, block_size). The position
        (``state_dict``) is always just after the last batch handed out."""
        collate = collate or BlockCollator(None)
        blocks = iter(self)
        while True:
            yield collate([next(blocks) for _ in range(batch_size)])

    def state_dict(self) -> dict[str, Any]:
        """The exact position: arrays ``carry`` (tokens) and ``buffer`` (filled, block_size), the rest JSON-able."""
        return {"version": STATE_VERSION, "settings": self.settings(), "epoch": self.epoch,
                "epoch_blocks": self.epoch_blocks, "blocks_yielded": self.blocks_yielded,
                "rows": copy.deepcopy(self._rows_state), "rng": self._rng.bit_generator.state,
                "carry": self._carry.copy(), "buffer": self._buffer[: self._filled].copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a ``state_dict()`` of a stream built with the same settings and rows."""
        if state.get("version") != STATE_VERSION or state.get("settings") != self.settings():
            raise ValueError(
                f"the saved stream position was made with {state.get('settings')}, this stream has {self.settings()}; "
                "the block size, shuffle buffer, seed and number of processes must match to resume exactly")
        self.set_epoch(state["epoch"])
        self.epoch_blocks, self.blocks_yielded = state["epoch_blocks"], state["blocks_yielded"]
        self._rows_state = copy.deepcopy(state["rows"])
        self._rng.bit_generator.state = state["rng"]
        self._carry = np.asarray(state["carry"], self.dtype).copy()
        self._filled = len(state["buffer"])
        self._buffer[: self._filled] = state["buffer"]


def save_stream_state(state: dict[str, Any], path: str | Path) -> None:
    """Write a ``PackedBlockStream.state_dict()`` to ``path`` (.npz: the arrays, plus the rest as JSON)."""
    meta = {key: value for key, value in state.items() if key not in ("carry", "buffer")}
    with open(path, "wb") as handle:
        np.savez(handle, carry=state["carry"], buffer=state["buffer"], meta=np.array(json.dumps(meta)))


def load_stream_state(path: str | Path) -> dict[str, Any]:
    """Read what ``save_stream_state`` wrote."""
    with np.load(path, allow_pickle=False) as saved:
        return {**json.loads(str(saved["meta"])), "carry": saved["carry"], "buffer": saved["buffer"]}


def held_out_blocks(rows: IterableDataset, tokenizer: PreTrainedTokenizerBase, block_size: int,
                    max_blocks: int) -> Dataset:
    """A fixed validation set read once from held-out streaming rows: the first ``max_blocks``
    evaluation blocks (``tokenize_and_pack(..., for_evaluation=True)``: every token predicted once),
    in memory. Only the rows those blocks need are read."""
    if max_blocks < 1:
        raise ValueError(f"the number of validation blocks must be >= 1, got {max_blocks}")
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    if eos_id is None or pad_id is None:
        raise ValueError("the tokenizer needs eos and pad tokens to make validation blocks")
    pack = {"eos_id": eos_id, "pad_id": pad_id, "drop_remainder": False, "overlap": 1, "prefix": (eos_id,)}
    dtype = token_dtype(len(tokenizer))
    blocks = list(itertools.islice(iter_blocks(rows, tokenizer, block_size, pack, dtype), max_blocks))
    if not blocks:
        raise ValueError("the held-out validation rows of the stream hold no token")
    return Dataset.from_dict({"input_ids": np.stack(blocks)}, features=block_features(block_size, dtype))


def stream_state_path(checkpoint: str | Path, process_index: int) -> Path:
    """Where process ``process_index`` keeps its stream position inside a checkpoint folder."""
    return Path(checkpoint) / f"stream_state_{process_index}.npz"


def save_stream_position(position: dict[str, Any], checkpoint: str | Path, process_index: int) -> None:
    """Write this process's stream position (a ``PackedBlockStream.state_dict()``) into the checkpoint folder
    (each process its own file, renamed into place once written)."""
    path = stream_state_path(checkpoint, process_index)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    save_stream_state(position, partial)
    partial.replace(path)


def restore_stream_position(stream: PackedBlockStream, checkpoint: str | Path, process_index: int) -> None:
    """Continue ``stream`` exactly where the checkpoint's run left it."""
    path = stream_state_path(checkpoint, process_index)
    if not path.is_file():
        raise ValueError(f"checkpoint {checkpoint} is incomplete: {path} is missing (each process of a --streaming "
                         "run saves its position in the stream there; a run without --streaming cannot resume it): "
                         "copy the checkpoint whole, or resume from an older one (--resume_from_checkpoint PATH)")
    stream.load_state_dict(load_stream_state(path))
