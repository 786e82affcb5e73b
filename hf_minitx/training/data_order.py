"""A step-indexed data order: the rows of micro-batch ``j`` depend only on (seed, j), so a resumed run
continues at exactly the same data position, and ``N`` processes see the same global batches as one.

With shifted windows (``--shift_windows``) each sample is a pair (block, offset): the ``block_size`` tokens that
start ``offset`` tokens into that packed block and run on into the next one (``ShiftedWindows``). Every epoch
draws new offsets, so a corpus seen many times is not cut at the same places each time (nanoGPT's random windows,
kept step-indexed)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler


class StepIndexedBatchSampler(Sampler[list]):
    """Endless batches of row indices for one process.

    Epoch ``e`` is a permutation of the rows drawn from ``seed + e``; global micro-batch ``j`` is slice
    ``j`` of ``global_batch_size`` rows (the remainder of an epoch is dropped); process ``p`` takes its
    ``batch_size`` rows of that slice. Iteration starts at micro-batch ``start``.

    ``window > 0`` (shifted windows): the last row only continues others, the epoch's generator then draws one
    offset in ``[0, window)`` per row, and the batches hold ``(row, offset)`` pairs for ``ShiftedWindows``.
    """

    def __init__(
        self, num_rows: int, batch_size: int, *, num_processes: int = 1, process_index: int = 0,
        seed: int = 42, start: int = 0, window: int = 0,
    ) -> None:
        self.window = window
        num_rows = self.usable_rows(num_rows, window)
        self.num_rows = num_rows
        self.batch_size = batch_size
        self.num_processes = num_processes
        self.process_index = process_index
        self.seed = seed
        self.start = start
        self.global_batch_size = batch_size * num_processes
        self.batches_per_epoch = num_rows // self.global_batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"the training split has {num_rows} rows, fewer than one global batch of {self.global_batch_size} "
                f"(per_device_train_batch_size={batch_size} x {num_processes} processes); lower the batch size"
            )

    @staticmethod
    def usable_rows(num_rows: int, window: int) -> int:
        """The rows a sample may start in: all of them, or with shifted windows all but the last (a window starting
        in it would run off the end)."""
        return num_rows - 1 if window else num_rows

    def epoch_order(self, epoch: int) -> list:
        """Samples of ``epoch`` in order: num_rows row indices, or (row, offset) pairs with shifted windows."""
        generator = torch.Generator().manual_seed(self.seed + epoch)
        rows = torch.randperm(self.num_rows, generator=generator).tolist()
        if not self.window:
            return rows
        offsets = torch.randint(0, self.window, (self.num_rows,), generator=generator).tolist()
        return [(row, offsets[row]) for row in rows]

    def global_batch(self, index: int) -> list:
        """Samples of global micro-batch ``index`` (all processes together)."""
        epoch, position = divmod(index, self.batches_per_epoch)
        order = self.epoch_order(epoch)
        return order[position * self.global_batch_size : (position + 1) * self.global_batch_size]

    def __iter__(self) -> Iterator[list]:
        index, epoch, order = self.start, None, None
        lo = self.process_index * self.batch_size
        while True:
            current_epoch, position = divmod(index, self.batches_per_epoch)
            if current_epoch != epoch:
                epoch, order = current_epoch, self.epoch_order(current_epoch)
            rows = order[position * self.global_batch_size : (position + 1) * self.global_batch_size]
            yield rows[lo : lo + self.batch_size]
            index += 1


class ShiftedWindows(Dataset):
    """Packed training blocks read through a shifted window: item ``(row, offset)`` is the (block_size,) tokens
    from ``offset`` into block ``row`` on into block ``row + 1``. The blocks must be cut back to back (no
    overlap), as ``tokenize_and_pack`` cuts a training split."""

    def __init__(self, blocks: Any) -> None:
        self.blocks = blocks.with_format("numpy") if hasattr(blocks, "with_format") else blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, key: tuple[int, int]) -> np.ndarray:
        row, offset = key
        pair = self.blocks[row : row + 2]["input_ids"]  # (2, block_size)
        block_size = pair.shape[1]
        return np.asarray(pair).reshape(-1)[offset : offset + block_size]  # (block_size,)
