"""A step-indexed data order (and the collator of equal-length rows): the rows of micro-batch ``j`` depend only on (seed, j), so a resumed run
continues at exactly the same data position, and ``N`` processes see the same global batches as one."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class StepIndexedBatchSampler(Sampler[list[int]]):
    """Endless batches of row indices for one process.

    Epoch ``e`` is a permutation of the rows drawn from ``seed + e``; global micro-batch ``j`` is slice
    ``j`` of ``global_batch_size`` rows (the remainder of an epoch is dropped); process ``p`` takes its
    ``batch_size`` rows of that slice. Iteration starts at micro-batch ``start``.
    """

    def __init__(
        self, num_rows: int, batch_size: int, *, num_processes: int = 1, process_index: int = 0,
        seed: int = 42, start: int = 0,
    ) -> None:
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

    def epoch_permutation(self, epoch: int) -> torch.Tensor:
        """Row order of ``epoch``: (num_rows,) indices."""
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_rows, generator=generator)

    def global_batch(self, index: int) -> list[int]:
        """Rows of global micro-batch ``index`` (all processes together)."""
        epoch, position = divmod(index, self.batches_per_epoch)
        order = self.epoch_permutation(epoch)
        return order[position * self.global_batch_size : (position + 1) * self.global_batch_size].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        index, epoch, order = self.start, None, None
        lo = self.process_index * self.batch_size
        while True:
            current_epoch, position = divmod(index, self.batches_per_epoch)
            if current_epoch != epoch:
                epoch, order = current_epoch, self.epoch_permutation(current_epoch)
            rows = order[position * self.global_batch_size : (position + 1) * self.global_batch_size]
            yield rows[lo : lo + self.batch_size].tolist()
            index += 1
