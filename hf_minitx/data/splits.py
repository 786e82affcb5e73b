"""Splits: train and validation (under any usual alias), validation carved from train when the source has none.

Whole samples go to one side, chosen with a seed; a corpus of one document gives the last fraction of its
text; a stream carves by rows. A corpus too small to carve from raises ``TooSmallToSplit``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from datasets import Dataset, IterableDataset
from datasets.fingerprint import Hasher

from .documents import TEXT_CHUNK_CHARS, AnyDataset, rows_dataset, rows_from_lines
from .preprocessing import DOC_END

logger = logging.getLogger(__name__)

VALIDATION_ALIASES = ("validation", "valid", "val", "dev")


def check_validation_split(validation_split: float | int | None, streaming: bool) -> None:
    if validation_split is None:
        return
    if isinstance(validation_split, bool) or not isinstance(validation_split, (int, float)):
        raise ValueError(f"validation_split must be a float in (0, 1) or an int >= 1, got {validation_split!r}")
    if isinstance(validation_split, float) and not 0.0 < validation_split < 1.0:
        raise ValueError(f"validation_split as a fraction must be in (0, 1), got {validation_split}")
    if isinstance(validation_split, int) and validation_split < 1:
        raise ValueError(f"validation_split as a row count must be >= 1, got {validation_split}")


def pick_splits(raw: dict[str, AnyDataset], dataset: str) -> dict[str, AnyDataset]:
    """train, validation (under any usual alias) and test; other splits are left out."""
    splits = {str(k): v for k, v in raw.items()}
    if "train" not in splits:
        raise ValueError(f"dataset {dataset!r} has no 'train' split; its splits are {sorted(splits)}")
    for alias in VALIDATION_ALIASES:
        if alias in splits:
            splits["validation"] = splits.pop(alias)
            break
    return {k: v for k, v in splits.items() if k in ("train", "validation", "test")}


def with_validation(
    splits: dict[str, AnyDataset], dataset: str, validation_split: float | int, seed: int, streaming: bool
) -> dict[str, AnyDataset]:
    """Return the splits, carving validation from train when there is none."""
    if "validation" in splits or validation_split is None:
        return splits
    splits = dict(splits)
    check_not_empty(splits["train"], dataset, "train")
    if "test" in splits:  # kept for the user's own scoring; training validates on a split of its own
        logger.warning("note: %r has a test split, which training does not read; validation is carved from train "
                       "(--validation_split). To validate on that text, name its file validation.* instead", dataset)
    if streaming:
        splits["train"], splits["validation"] = _carve_streaming(splits["train"], validation_split)
        for name, split in splits.items():
            if next(iter(split.take(1)), None) is None:
                raise TooSmallToSplit(
                    f"streaming carves validation from {dataset!r} by rows (the first N, or every k-th; a text file's "
                    f"rows are ~1 MB pieces), and too few rows leave {name} empty; for a corpus this small drop "
                    "--streaming, or give a validation split (a validation.* file)")
    else:
        splits["train"], splits["validation"] = _carve(splits["train"], dataset, validation_split, seed)
    return splits


def _carve(train: Dataset, dataset: str, validation_split: float | int, seed: int) -> tuple[Dataset, Dataset]:
    """Whole samples to validation, chosen with ``seed`` (``train_test_split`` over the samples)."""
    if DOC_END in train.column_names:
        ends = np.asarray(train[DOC_END], dtype=bool)
        ends[-1] = True
    else:
        ends = np.ones(len(train), dtype=bool)
    starts = np.flatnonzero(np.r_[True, ends[:-1]])
    stops = np.r_[starts[1:], len(ends)]
    if len(starts) == 1 and DOC_END in train.column_names:
        if isinstance(validation_split, int):
            raise ValueError(f"{dataset!r} is a single document, so validation_split must be a fraction of its "
                             f"text (e.g. 0.05), not a count ({validation_split})")
        return _split_document(train, validation_split)
    if len(starts) < 2:  # one sample (not a document, cut by its text above): nothing to split it into
        raise TooSmallToSplit(f"{dataset!r} has 1 training sample, too few to carve a validation split from: give "
                              "at least 2 (--num_examples sizes a generated task), or a validation split of its own "
                              "(a validation.* file)")
    if isinstance(validation_split, int) and validation_split >= len(starts):
        raise TooSmallToSplit(
            f"validation_split={validation_split} samples leaves nothing to train on: "
            f"{dataset!r} has {len(starts)} training samples"
        )
    order = Dataset.from_dict({"sample": range(len(starts))})
    parts = order.train_test_split(test_size=validation_split, seed=seed, shuffle=True)

    def rows(samples: list[int]) -> Dataset:
        return train.select([i for s in samples for i in range(starts[s], stops[s])])

    return rows(parts["train"]["sample"]), rows(parts["test"]["sample"])


def _document_part(split: Dataset, cut: int, validation: bool) -> Iterator[dict]:
    """Rows of the lines of a one-document split that start before (train) or at/after (validation)
    ``cut``. The train part does not end the document: it goes on in validation."""

    def lines() -> Iterator[str]:
        seen = 0
        for batch in split.iter(batch_size=100):
            for text in batch["text"]:
                for line in text.splitlines(keepends=True):
                    if (seen >= cut) == validation:
                        yield line
                    seen += len(line)

    previous = None
    for row in rows_from_lines(lines(), "document", TEXT_CHUNK_CHARS):
        if previous is not None:
            yield previous
        previous = row
    if previous is not None:
        yield {**previous, DOC_END: validation}


class TooSmallToSplit(ValueError):
    """The corpus is too small to carve a validation split from (a command that needs none can go on)."""


def _split_document(split: Dataset, fraction: float) -> tuple[Dataset, Dataset]:
    """A one-document split: validation is the last ``fraction`` of its characters, from a line start."""
    total = sum(len(text) for batch in split.iter(batch_size=100) for text in batch["text"])
    cut = total - math.ceil(fraction * total)
    parts = []
    for validation in (False, True):
        key = Hasher.hash([split._fingerprint, "document-part", cut, validation, TEXT_CHUNK_CHARS])
        try:
            parts.append(rows_dataset(_document_part, {"split": split, "cut": cut, "validation": validation}, key,
                                      total - cut if validation else cut))
        except ValueError as err:
            if "corresponds to no data" not in str(err):
                raise
            raise TooSmallToSplit("the corpus is a single document with too few lines to carve a validation split from "
                             "its end; give a validation file, more text, or --sample_by paragraph|line") from err
    return parts[0], parts[1]


def _carve_streaming(train: IterableDataset, validation_split: float | int) -> tuple[IterableDataset, ...]:
    """Streaming: the first N rows (int), or every k-th row (fraction ~ 1/k), become validation."""
    if isinstance(validation_split, int):
        return train.skip(validation_split), train.take(validation_split)
    every = max(2, round(1 / validation_split))
    return (
        train.filter(_every_kth, with_indices=True, fn_kwargs={"every": every, "keep": False}),
        train.filter(_every_kth, with_indices=True, fn_kwargs={"every": every, "keep": True}),
    )


def _every_kth(_row: dict, index: int, every: int, keep: bool) -> bool:
    return (index % every == 0) == keep


def check_not_empty(split: AnyDataset, dataset: str, name: str) -> None:
    """A split with no rows, or (in memory) whose text is only whitespace, is refused."""
    empty = len(split) == 0 if isinstance(split, Dataset) else next(iter(split.take(1)), None) is None
    if empty:
        raise ValueError(f"split {name!r} of dataset {dataset!r} is empty: there is nothing to train or evaluate on")
    columns = [c for c in ("text", "source", "target") if c in (split.column_names or [])]
    if isinstance(split, Dataset) and columns and not _has_text(split, columns):
        named = empty_data_files(dataset)
        files = f" ({', '.join(named)} {'is' if len(named) == 1 else 'are'} white space only)" if named else ""
        raise ValueError(f"split {name!r} of dataset {dataset!r} has no text: its {len(split)} rows are empty or "
                         f"whitespace only{files}; check the file (and --text_column) or pass another --dataset")


def empty_data_files(name: str, suffixes: tuple[str, ...] = (".txt",)) -> list[str]:
    """The data files (of ``suffixes``) of a local folder or file that hold nothing but white space (at most 1 MB
    is read of each): what an empty split is named by."""
    path = Path(name).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in suffixes)
    else:
        files = [path] if path.is_file() else []
    empty = []
    for file in files:
        try:
            with file.open("rb") as handle:
                if not handle.read(1 << 20).strip():
                    empty.append(str(file))
        except OSError:
            continue
    return empty


def _has_text(split: Dataset, columns: list[str]) -> bool:
    """Whether any row holds a non-whitespace character (stops at the first that does)."""
    for batch in split.select_columns(columns).iter(batch_size=1000):
        if any(text and not text.isspace() for column in columns for text in batch[column]):
            return True
    return False
