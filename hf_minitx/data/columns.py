"""Columns of a split: the text column (causal-lm) or the source and target columns (seq2seq), renamed to
``text`` or ``source``/``target``, and rows where they hold no text.

A column that holds something other than text is refused naming the first such row; a row whose text is
missing (a JSON null, an empty CSV cell) raises ``RowWithoutText``, or is skipped with ``skip_bad_rows``
(counted in ``SKIPPED_ROWS``).
"""

from __future__ import annotations

import logging
import reprlib

import numpy as np
from datasets import IterableDataset

from .documents import AnyDataset
from .preprocessing import DOC_END
from .sources import locate_row

logger = logging.getLogger(__name__)

SKIPPED_ROWS: dict[str, int] = {}  # --skip_bad_rows: rows without text skipped, per "dataset (split)"
TEXT_COLUMNS = ("text", "source", "target")


class RowWithoutText(ValueError):
    """A row whose text (or source, target) is missing: a JSON null, an empty CSV cell, a parquet null."""


def rows_with_text(split: AnyDataset, dataset: str, name: str, skip_bad_rows: bool) -> AnyDataset:
    """``split`` (normalised columns) without missing texts: a row with one raises ``RowWithoutText`` naming the
    file and the row, or is skipped with ``skip_bad_rows`` (counted in ``SKIPPED_ROWS``, said once)."""
    columns = [c for c in TEXT_COLUMNS if c in (split.column_names or [])]
    if not columns or DOC_END in (split.column_names or []):
        return split  # rows read from text files always hold text
    if isinstance(split, IterableDataset):
        kwargs = {"columns": columns, "dataset": dataset, "name": name}
        return (split.filter(_all_present, fn_kwargs={"columns": columns}) if skip_bad_rows
                else split.map(_refuse_missing, fn_kwargs=kwargs, features=split.features, with_indices=True))
    if not any(split.data.column(column).null_count for column in columns):
        return split  # the usual case: one look at the table's counts
    if split._indices is not None:  # rows selected from a larger table: the mask must follow the rows
        split = split.flatten_indices()
    missing = np.zeros(len(split), dtype=bool)
    for column in columns:
        missing |= split.data.column(column).is_null().to_numpy(zero_copy_only=False)
    if not missing.any():
        return split
    first = int(np.flatnonzero(missing)[0])
    if not skip_bad_rows:
        column = next(c for c in columns if split[first][c] is None)
        raise RowWithoutText(f"{locate_row(dataset, name, first)} has no {column} (null or an empty cell): fix or "
                             "delete that row, or pass --skip_bad_rows to skip rows without text (counted in the "
                             "summary)")
    key = f"{dataset} ({name})"
    SKIPPED_ROWS[key] = int(missing.sum())
    logger.warning("--skip_bad_rows: skipped %d row(s) without text in %s, the first %s", SKIPPED_ROWS[key], key,
                   locate_row(dataset, name, first))
    return split.select(np.flatnonzero(~missing))


def _all_present(row: dict, columns: list[str]) -> bool:
    return all(row[column] is not None for column in columns)


def _refuse_missing(row: dict, index: int, columns: list[str], dataset: str, name: str) -> dict:
    """A streamed row, refused naming its file and row (``index``: its place in the stream) if a text is missing."""
    for column in columns:
        if row[column] is None:
            raise RowWithoutText(f"{locate_row(dataset, name, index)} has no {column} (null or an empty cell): fix "
                                 "or delete that row, or pass --skip_bad_rows to skip rows without text")
    return row


def _first_non_text(split: AnyDataset, dataset: str, name: str, column: str) -> str:
    """Where ``column`` first holds something other than text: "FILE: row N holds 5 (int)" for a split in memory,
    the column's type for a stream (which is not read ahead to find the row)."""
    feature = split.features[column]
    kind = f"{feature.dtype} values" if isinstance(getattr(feature, "dtype", None), str) else \
        "values that are not all strings (numbers, lists or objects)"
    if isinstance(split, IterableDataset):
        return f"it holds {kind}"
    for start in range(0, len(split), 10_000):
        values = split[start:start + 10_000][column]
        for offset, value in enumerate(values):
            if value is not None and not isinstance(value, str):
                shown = reprlib.repr(value)
                return f"{locate_row(dataset, name, start + offset)} holds {shown} ({type(value).__name__})"
    return f"it holds {kind}"


def normalise_columns(
    split: AnyDataset,
    dataset: str,
    name: str,
    task: str,
    text_column: str,
    source_column: str | None,
    target_column: str | None,
) -> AnyDataset:
    if split.column_names is None and isinstance(split, IterableDataset):  # a streamed CSV: known once read
        split = split._resolve_features()
    columns = list(split.column_names or [])
    if task == "seq2seq":
        source = source_column or ("source" if "source" in columns else None)
        target = target_column or ("target" if "target" in columns else None)
        if source is None or target is None:
            raise ValueError(
                f"task/dataset mismatch: task='seq2seq' needs source and target columns, but {dataset!r} "
                f"has columns {columns}. Pass source_column/target_column (--source_column/--target_column) "
                "or use task='causal-lm' for a text corpus."
            )
        if source == target:
            raise ValueError(f"--source_column and --target_column both name {source!r}: give the source and the "
                             "target in two columns (for a copy task, copy the column first)")
        wanted = {source: "source", target: "target"}
    else:
        if text_column not in columns and {"source", "target"} <= set(columns):
            raise ValueError(
                f"task/dataset mismatch: {dataset!r} is a seq2seq corpus (columns {columns}); use task='seq2seq'"
            )
        wanted = {text_column: "text"}
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise ValueError(f"column(s) {missing} not found in {dataset!r}; the columns are {columns}")
    features = split.features
    pick = ("columns with --source_column and --target_column" if task == "seq2seq"
            else "text column with --text_column")
    if features is not None:
        for column in wanted:
            if getattr(features[column], "dtype", None) not in ("string", "large_string"):
                raise ValueError(f"column {column!r} of {dataset!r} must hold text, but "
                                 f"{_first_non_text(split, dataset, name, column)}: write each value as a string "
                                 f"(in quotes in JSON), or pick the {pick}")
    keep = list(wanted) + ([DOC_END] if task == "causal-lm" and DOC_END in columns else [])
    split = split.select_columns(keep)
    renames = {old: new for old, new in wanted.items() if old != new}
    return split.rename_columns(renames) if renames else split
