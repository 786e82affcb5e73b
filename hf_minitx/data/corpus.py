"""Resolve a ``--dataset`` argument into a ``DatasetDict`` with ``train`` and ``validation`` splits.

Accepted forms (see README, section Data):

* ``builtin:NAME``: a corpus that needs no network (``BUILTIN_CORPORA`` lists them);
* local files: ``.txt``, ``.json``/``.jsonl``, ``.csv``, ``.parquet``; one path, a glob
  (``data/*.txt``) or a comma-separated list (``a.txt,b.txt``);
* anything else goes to ``datasets.load_dataset(name, config)``: a Hub id, or a local folder.

Columns are normalised: ``causal-lm`` gives one ``text`` column, ``seq2seq`` gives ``source`` and
``target``. Every bad input raises one clear error before any training starts.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict
from datasets.exceptions import DatasetGenerationError

from .builtin import BUILTIN_CORPORA, BUILTIN_PREFIX, get_builtin
from .preprocessing import preprocess_seq2seq, seq2seq_collator, tokenize_and_pack

__all__ = [
    "BUILTIN_CORPORA",
    "TASKS",
    "load_corpus",
    "corpus_task",
    "iter_training_texts",
    "tokenize_and_pack",
    "preprocess_seq2seq",
    "seq2seq_collator",
]

TASKS = ("causal-lm", "seq2seq")
FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
VALIDATION_ALIASES = ("validation", "valid", "val", "dev")

AnyDataset = Dataset | IterableDataset
AnyDatasetDict = DatasetDict | IterableDatasetDict


def load_corpus(
    dataset: str,
    *,
    task: str = "causal-lm",
    dataset_config: str | None = None,
    text_column: str = "text",
    source_column: str | None = None,
    target_column: str | None = None,
    validation_split: float | int = 0.05,
    seed: int = 42,
    streaming: bool = False,
    num_examples: int | None = None,
) -> DatasetDict | IterableDatasetDict:
    """Load ``dataset`` (builtin name, local file(s) or Hub id) as normalised train/validation splits.

    ``validation_split`` (a fraction if float, a row count if int) carves a validation split from
    train, deterministically from ``seed``, when the source has none. ``num_examples`` sizes the
    generated built-in tasks (``builtin:numbers-*``). With ``streaming=True`` nothing is loaded in
    memory and an ``IterableDatasetDict`` is returned.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    _check_validation_split(validation_split, streaming)
    raw = _load_raw(dataset, dataset_config, streaming, num_examples, seed)
    splits = _with_validation(raw, dataset, validation_split, seed, streaming)
    normalised = {
        name: _normalise_columns(split, dataset, task, text_column, source_column, target_column)
        for name, split in splits.items()
    }
    for name, split in normalised.items():
        _check_not_empty(split, dataset, name)
    return IterableDatasetDict(normalised) if streaming else DatasetDict(normalised)


def corpus_task(dataset: str) -> str | None:
    """The task a built-in corpus is made for (``causal-lm``/``seq2seq``); None for other sources."""
    return get_builtin(dataset).task if dataset.startswith(BUILTIN_PREFIX) else None


def iter_training_texts(split: AnyDataset, max_texts: int | None = None, seed: int = 42) -> Iterator[str]:
    """Yield the texts of a normalised split (both sides for seq2seq), e.g. to train a tokenizer.

    With ``max_texts``, a map-style split is sampled (shuffled with ``seed``) and a streaming split is
    cut after its first ``max_texts`` rows, so memory stays bounded on large corpora.
    """
    if max_texts is not None:
        if isinstance(split, Dataset):
            if len(split) > max_texts:
                split = split.shuffle(seed=seed).select(range(max_texts))
        else:
            split = split.take(max_texts)
    columns = [c for c in ("text", "source", "target") if c in (split.column_names or [])]
    for batch in split.iter(batch_size=1000):
        for column in columns:
            yield from (text for text in batch[column] if text)


# --- loading ------------------------------------------------------------------------------------


def _load_raw(
    dataset: str, config: str | None, streaming: bool, num_examples: int | None, seed: int
) -> dict[str, AnyDataset]:
    if not isinstance(dataset, str) or not dataset.strip():
        raise ValueError(f"dataset must be a non-empty string, got {dataset!r}")
    if dataset.startswith(BUILTIN_PREFIX):
        train = get_builtin(dataset).build(num_examples, seed)
        return {"train": train.to_iterable_dataset() if streaming else train}
    files = _local_files(dataset)
    if files is not None:
        return _load_files(files, streaming)
    return _load_with_datasets(dataset, config, streaming)


def _looks_like_path(dataset: str) -> bool:
    """Whether ``dataset`` is meant as a local path rather than a Hub id like ``owner/name``."""
    return (
        any(ch in dataset for ch in "*?[,")
        or dataset.startswith((".", "/", "~"))
        or Path(dataset).suffix.lower() in FILE_BUILDERS
        or os.sep != "/" and os.sep in dataset
    )


def _local_files(dataset: str) -> list[str] | None:
    """Expand a file path, glob or comma-separated list; None when ``dataset`` is not a file spec."""
    if os.path.isdir(os.path.expanduser(dataset)) or not _looks_like_path(dataset):
        return None
    files: list[str] = []
    for part in (p.strip() for p in dataset.split(",")):
        if not part:
            continue
        pattern = os.path.expanduser(part)
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        matches = [m for m in matches if os.path.isfile(m)]
        if not matches:
            raise FileNotFoundError(
                f"no file matches {part!r} (from --dataset {dataset!r}). Give an existing file, a glob, a "
                f"comma-separated list, a folder, a Hub id or one of {sorted(BUILTIN_CORPORA)}."
            )
        files.extend(matches)
    if len(files) == 1 and os.path.isdir(files[0]):  # pragma: no cover - folders handled above
        return None
    return files


def _load_files(files: list[str], streaming: bool) -> dict[str, AnyDataset]:
    builders = {FILE_BUILDERS.get(Path(f).suffix.lower()) for f in files}
    if None in builders:
        unknown = sorted({Path(f).suffix or f for f in files if Path(f).suffix.lower() not in FILE_BUILDERS})
        raise ValueError(f"unsupported file type {unknown}; supported: {sorted(FILE_BUILDERS)}")
    if len(builders) > 1:
        raise ValueError(f"all files must have the same type, got {sorted(builders)} from {files}")
    builder = builders.pop()
    empty = [f for f in files if os.path.getsize(f) == 0]
    if empty:
        raise ValueError(f"dataset file(s) {empty} are empty: there is nothing to train on")
    # A .txt file: one row per paragraph (blank-line separated), so that EOS separates paragraphs and
    # not every wrapped line.
    kwargs = {"sample_by": "paragraph"} if builder == "text" else {}
    return _call_load_dataset(",".join(files), builder, data_files={"train": files}, streaming=streaming, **kwargs)


def _load_with_datasets(name: str, config: str | None, streaming: bool) -> dict[str, AnyDataset]:
    """``datasets.load_dataset(name, config)``: a Hub id or a local folder of data files."""
    return _call_load_dataset(name, name, config, streaming=streaming)


def _call_load_dataset(name: str, *args: Any, **kwargs: Any) -> dict[str, AnyDataset]:
    """Call ``datasets.load_dataset`` and turn its failures into one clear error each."""
    try:
        loaded = datasets.load_dataset(*args, **kwargs)
    except ConnectionError as err:
        offline = datasets.config.HF_HUB_OFFLINE or os.environ.get("HF_DATASETS_OFFLINE") == "1"
        hint = (
            "HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set, so only datasets already in the local cache load: "
            "unset them on a machine with network access, or download the data and pass a local path."
            if offline
            else "check the network connection (or set HF_HUB_OFFLINE=1 to use the local cache only)."
        )
        raise ConnectionError(f"could not load dataset {name!r} from the Hugging Face Hub: {err}. {hint}") from err
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"dataset {name!r} was not found, neither as a local path nor on the Hub ({err}). "
            f"Built-in corpora: {sorted(BUILTIN_CORPORA)}."
        ) from err
    except ValueError as err:
        if "corresponds to no data" in str(err):
            raise ValueError(f"dataset {name!r} has an empty split ({err}): there is nothing to use") from err
        raise
    except (DatasetGenerationError, StopIteration) as err:
        cause = err.__cause__ or err
        raise ValueError(
            f"could not read dataset {name!r}: {type(cause).__name__}: {cause}. Is it empty or malformed?"
        ) from err
    if isinstance(loaded, (Dataset, IterableDataset)):  # pragma: no cover - load_dataset without split
        return {"train": loaded}
    return dict(loaded)


# --- splits -------------------------------------------------------------------------------------


def _check_validation_split(validation_split: float | int, streaming: bool) -> None:
    if isinstance(validation_split, bool) or not isinstance(validation_split, (int, float)):
        raise ValueError(f"validation_split must be a float in (0, 1) or an int >= 1, got {validation_split!r}")
    if isinstance(validation_split, float) and not 0.0 < validation_split < 1.0:
        raise ValueError(f"validation_split as a fraction must be in (0, 1), got {validation_split}")
    if isinstance(validation_split, int) and validation_split < 1:
        raise ValueError(f"validation_split as a row count must be >= 1, got {validation_split}")


def _with_validation(
    raw: dict[str, AnyDataset], dataset: str, validation_split: float | int, seed: int, streaming: bool
) -> dict[str, AnyDataset]:
    """Return train and validation (plus test if present), carving validation from train if needed."""
    splits = dict(raw)
    if "train" not in splits:
        raise ValueError(f"dataset {dataset!r} has no 'train' split; its splits are {sorted(splits)}")
    for alias in VALIDATION_ALIASES:
        if alias in splits:
            splits["validation"] = splits.pop(alias)
            break
    else:
        _check_not_empty(splits["train"], dataset, "train")
        if streaming:
            splits["train"], splits["validation"] = _carve_streaming(splits["train"], validation_split)
        else:
            train = splits["train"]
            if isinstance(validation_split, int) and validation_split >= len(train):
                raise ValueError(
                    f"validation_split={validation_split} rows leaves nothing to train on: "
                    f"{dataset!r} has {len(train)} training rows"
                )
            parts = train.train_test_split(test_size=validation_split, seed=seed, shuffle=True)
            splits["train"], splits["validation"] = parts["train"], parts["test"]
    return {k: v for k, v in splits.items() if k in ("train", "validation", "test")}


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


def _check_not_empty(split: AnyDataset, dataset: str, name: str) -> None:
    empty = len(split) == 0 if isinstance(split, Dataset) else next(iter(split.take(1)), None) is None
    if empty:
        raise ValueError(f"split {name!r} of dataset {dataset!r} is empty: there is nothing to train or evaluate on")


# --- columns ------------------------------------------------------------------------------------


def _normalise_columns(
    split: AnyDataset,
    dataset: str,
    task: str,
    text_column: str,
    source_column: str | None,
    target_column: str | None,
) -> AnyDataset:
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
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"source and target must be different columns, got {list(wanted)}")
    features = split.features
    if features is not None:
        for column in wanted:
            dtype = getattr(features[column], "dtype", None)
            if dtype not in ("string", "large_string"):
                raise ValueError(f"column {column!r} of {dataset!r} must hold strings, but its type is {features[column]}")
    split = split.select_columns(list(wanted))
    renames = {old: new for old, new in wanted.items() if old != new}
    return split.rename_columns(renames) if renames else split
