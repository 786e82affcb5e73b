"""Sources of a corpus: a built-in corpus, local files (a path, a glob, a comma-separated list) or whatever
``datasets.load_dataset`` reads (a Hub id, a local folder), loaded as raw splits.

A file reached twice is read once; an unsupported file type, a folder of mixed types, an empty file, a
missing file or a failed download each raise one clear error. ``locate_row`` names the file and row a row of
a split came from, for the errors about bad rows.
"""

from __future__ import annotations

import csv
import functools
import glob
import json
import logging
import os
from pathlib import Path
from typing import Any

import datasets
from datasets import Dataset, IterableDataset
from datasets.exceptions import DatasetGenerationError
from datasets.table import CastError

from .builtin import BUILTIN_CORPORA, BUILTIN_PREFIX, get_builtin
from .documents import AnyDataset
from .splits import VALIDATION_ALIASES, empty_data_files
from .text_files import UndecodableText, load_text_files

logger = logging.getLogger(__name__)

FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet"}


def load_raw(
    dataset: str, config: str | None, streaming: bool, num_examples: int | None, seed: int, sample_by: str,
    skip_bad_rows: bool = False,
) -> dict[str, AnyDataset]:
    if not isinstance(dataset, str) or not dataset.strip():
        raise ValueError(f"dataset must be a non-empty string, got {dataset!r}")
    if dataset.startswith(BUILTIN_PREFIX):
        train = get_builtin(dataset).build(num_examples, seed)
        return {"train": train.to_iterable_dataset() if streaming else train}
    files = _local_files(dataset)
    if files is not None:
        return _load_files(files, streaming, sample_by, skip_bad_rows)
    return _load_with_datasets(dataset, config, streaming, sample_by, skip_bad_rows)


def _looks_like_path(dataset: str) -> bool:
    """Whether ``dataset`` is meant as a local path rather than a Hub id like ``owner/name``."""
    return (
        any(ch in dataset for ch in "*?[,")
        or dataset.startswith((".", "/", "~"))
        or Path(dataset).suffix.lower() in FILE_BUILDERS
        or os.sep != "/" and os.sep in dataset
        or os.path.isfile(os.path.expanduser(dataset))  # an existing file is local, whatever its name
    )


COMPRESSED = {b"\x1f\x8b": "gzip-compressed", b"PK\x03\x04": "a zip archive", b"BZh": "bzip2-compressed",
              b"\xfd7zXZ": "xz-compressed", b"\x28\xb5\x2f\xfd": "zstd-compressed"}


def describe_unsupported(path: str) -> str:
    """What a data file of an unsupported type is (compressed, binary or text, from its first bytes) and what
    to do; one sentence naming the supported types."""
    with open(path, "rb") as handle:
        head = handle.read(4096)
    supported = ", ".join(FILE_BUILDERS)
    kind = next((name for magic, name in COMPRESSED.items() if head.startswith(magic)), None)
    if kind:
        fix = "decompress it first (e.g. `gunzip`, `unzip`)"
    else:
        try:
            head.decode("utf-8")  # a cut multi-byte character at the end would fail: allow 3 bytes
            is_text = b"\x00" not in head
        except UnicodeDecodeError as error:
            is_text = error.start >= len(head) - 3 and b"\x00" not in head
        kind = "UTF-8 text" if is_text else "binary data (not UTF-8 text)"
        fix = ("rename it with the extension of its format (e.g. .txt for plain text)" if is_text
               else "give the text as a .txt file, or the records as .jsonl/.csv/.tsv/.parquet")
    suffix = Path(path).suffix or "no extension"
    return f"{path} is {kind} ({suffix}); minitx reads {supported} files: {fix}"


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
    return _read_once(dataset, files)


def _file_identity(path: str) -> tuple:
    """What makes two paths one file: its device and inode (a symlink or a hard link to it is the same file),
    or its real path where it cannot be read (a remote file)."""
    try:
        info = os.stat(path)
    except OSError:
        return (os.path.realpath(path),)
    return (info.st_dev, info.st_ino)


def _read_once(dataset: str, files: list[str]) -> list[str]:
    """``files`` without repeats (the same file listed twice, matched by a glob and another entry, or reached
    through a symlink or a hard link): a file read twice could put the same text in training and validation.
    The first listing is kept."""
    seen: dict[tuple, str] = {}
    for path in files:
        seen.setdefault(_file_identity(path), path)
    unique = list(seen.values())
    if len(unique) < len(files):
        _note_repeats(dataset, len(files) - len(unique))
    return unique


@functools.cache
def _note_repeats(dataset: str, repeats: int) -> None:
    """Say once per --dataset that repeated files are read once."""
    logger.warning("note: --dataset %r reaches %d file(s) more than once (listed twice, through a glob, a "
                   "symlink or a hard link); each file is read once", dataset, repeats)


def local_inputs(dataset: str) -> list[Path]:
    """The local files (or the folder) that ``dataset`` reads: none for a builtin or a Hub id. A file spec
    that matches nothing raises FileNotFoundError, as loading would."""
    if dataset.startswith(BUILTIN_PREFIX):
        return []
    if os.path.isdir(os.path.expanduser(dataset)):
        return [Path(os.path.expanduser(dataset))]
    return [Path(f) for f in _local_files(dataset) or []]


def dataset_key(dataset: str) -> str:
    """``dataset`` as a run records it: each local path (file, glob, folder) made absolute with its symlinks
    resolved, so that ``corpus.txt``, ``./corpus.txt`` and its absolute path are one input; a builtin or a Hub
    id as given."""
    if dataset.startswith(BUILTIN_PREFIX):
        return dataset
    if os.path.isdir(os.path.expanduser(dataset)):
        return os.path.realpath(os.path.expanduser(dataset))
    if not _looks_like_path(dataset):
        return dataset
    parts = (p.strip() for p in dataset.split(","))
    return ",".join(os.path.realpath(os.path.expanduser(p)) for p in parts if p)


def _load_files(
    files: list[str], streaming: bool, sample_by: str, skip_bad_rows: bool = False
) -> dict[str, AnyDataset]:
    builders = {FILE_BUILDERS.get(Path(f).suffix.lower()) for f in files}
    if None in builders:
        unknown = [f for f in files if Path(f).suffix.lower() not in FILE_BUILDERS]
        more = f" (and {len(unknown) - 1} more file(s) of unsupported types)" if len(unknown) > 1 else ""
        raise ValueError(describe_unsupported(unknown[0]) + more)
    if len(builders) > 1:
        raise ValueError(f"all files must have the same type, got {sorted(builders)} from {files}")
    builder = builders.pop()
    empty = [f for f in files if os.path.getsize(f) == 0]
    if empty:
        raise ValueError(f"dataset file(s) {empty} are empty: there is nothing to train on")
    if builder == "text":
        return _guarded(",".join(files), load_text_files, {"train": files}, streaming, sample_by, skip_bad_rows)
    reader, options = _reader(builder, files)
    return _guarded(",".join(files), datasets.load_dataset, reader, data_files={"train": files}, streaming=streaming,
                    **options)


CSV_AS_TEXT = {"keep_default_na": False, "na_values": [""]}  # "NA", "null", "nan", "N/A", "#N/A" stay text


def _reader(builder: str | None, files: list[str] | None = None, sep: str | None = None) -> tuple[str, dict[str, Any]]:
    """datasets' builder for one of FILE_BUILDERS' kinds, and its options. A CSV or TSV (datasets' ``csv`` with tab
    separators and no quoting: a TSV cell is what lies between two tabs) is read as text: every column of the local
    ``files``' header a string, so that "149" stays "149" and "1.50" stays "1.50", and only an empty cell is
    missing. Local files whose headers differ are refused, naming two of them."""
    if builder not in ("csv", "tsv"):
        return builder, {}
    sep = sep or ("\t" if builder == "tsv" else ",")
    quoting = csv.QUOTE_NONE if sep == "\t" else csv.QUOTE_MINIMAL
    options: dict[str, Any] = {**CSV_AS_TEXT, "sep": sep, "quoting": quoting}
    headers = [(path, _csv_header(path, sep, quoting)) for path in files or []]
    read = [(path, header) for path, header in headers if header is not None]
    other = next(((path, header) for path, header in read[1:] if header != read[0][1]), None)
    if other is not None:
        raise ValueError(f"the files do not all have the same columns: {read[0][0]} has {read[0][1]}, {other[0]} "
                         f"has {other[1]}; give every file, train and validation alike, the same header")
    if headers and len(read) == len(headers):  # every header read, and all the same
        options["features"] = datasets.Features({name: datasets.Value("string") for name in read[0][1]})
    return "csv", options


def _csv_header(path: str, sep: str, quoting: int) -> list[str] | None:
    """The column names of a local CSV file's first row, a blank one named as pandas names it ("Unnamed: 2");
    None where they cannot be read, the first line is blank or names repeat (pandas renames repeats: its own
    inference is kept then)."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            header = next(csv.reader(handle, delimiter=sep, quoting=quoting), None)
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    if not header or len(set(header)) != len(header):
        return None
    return [name or f"Unnamed: {index}" for index, name in enumerate(header)]


def _load_with_datasets(
    name: str, config: str | None, streaming: bool, sample_by: str, skip_bad_rows: bool = False
) -> dict[str, AnyDataset]:
    """``datasets.load_dataset(name, config)``: a Hub id or a local folder of data files. Text files
    (what datasets' ``text`` builder would read line by line) are read as documents instead."""
    _check_one_file_type(name)
    if _saved_dataset(name):
        return _load_saved_dataset(name, streaming)
    builder = _guarded(name, datasets.load_dataset_builder, name, config)
    files = {str(split): list(paths) for split, paths in (builder.config.data_files or {}).items()}
    if builder.name == "text" and files:
        return _guarded(name, load_text_files, _each_file_once(name, files), streaming, sample_by, skip_bad_rows)
    local = os.path.isdir(os.path.expanduser(name))
    every_file = [path for paths in files.values() for path in paths] if local else None
    _, options = _reader(builder.name, every_file, getattr(builder.config, "sep", None))
    if local and files and _each_file_once(name, files) != files:
        return _guarded(name, datasets.load_dataset, builder.name, data_files=_each_file_once(name, files),
                        streaming=streaming, **options)
    return _guarded(name, datasets.load_dataset, name, config, streaming=streaming, **options)


def _saved_dataset(name: str) -> bool:
    """Whether ``name`` is a folder written by ``Dataset.save_to_disk`` (one dataset, not a ``DatasetDict``, which
    ``load_dataset`` reads split by split)."""
    folder = Path(name).expanduser()
    return (folder / "state.json").is_file() and not (folder / "dataset_dict.json").is_file()


def _load_saved_dataset(name: str, streaming: bool) -> dict[str, AnyDataset]:
    """A ``save_to_disk`` folder of one dataset, as the train split (--validation_split holds out part of it)."""
    loaded = _guarded(name, datasets.load_from_disk, os.path.expanduser(name))["train"]
    return {"train": loaded.to_iterable_dataset() if streaming else loaded}


def _each_file_once(name: str, files: dict[str, list[str]]) -> dict[str, list[str]]:
    """The data files of each split, a file reached twice (a symlink, a hard link, a file listed twice) kept once
    over all splits, so that no text is both trained on and validated on."""
    seen: set[tuple] = set()
    kept = {}
    for split, paths in files.items():
        kept[split] = [p for p in paths if _file_identity(p) not in seen and not seen.add(_file_identity(p))]
    repeats = sum(map(len, files.values())) - sum(map(len, kept.values()))
    if repeats:
        _note_repeats(name, repeats)
    return kept


def _check_one_file_type(name: str) -> None:
    """A local folder must hold data files of one type: datasets would read one type and skip the rest."""
    folder = Path(name).expanduser()
    if not folder.is_dir():
        return
    found = {path.suffix.lower() for path in folder.rglob("*")
             if path.is_file() and path.suffix.lower() in FILE_BUILDERS}
    kinds = {FILE_BUILDERS[suffix] for suffix in found}
    if len(kinds) > 1:
        raise ValueError(f"folder {name!r} holds data files of several types ({', '.join(sorted(found))}), and only "
                         "one type would be read; move the files of the other types out, or pass the files "
                         "of one type as a comma-separated list or a glob")


# datasets' JSON and CSV readers log the file they failed on, then raise an error that does not name it
READER_LOGGERS = ("datasets.packaged_modules.json.json", "datasets.packaged_modules.csv.csv")


class ReaderFailures(logging.Filter):
    """Holds the last failure datasets' file readers logged (its line names the file), so that one error line can
    say it: ``_guarded``'s for a read made at once, ``minitx``'s (``read_failure``) for a stream, whose rows are read,
    and fail, later. The reader's own line is kept back where that error line is sure to come (``quiet``: in
    ``_guarded``, and in a ``minitx`` command); a program reading a stream itself still sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.last: str | None = None
        self.quiet = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        self.last = " ".join(record.getMessage().split())
        return not self.quiet


READER_FAILURES = ReaderFailures()
for _logger_name in READER_LOGGERS:
    logging.getLogger(_logger_name).addFilter(READER_FAILURES)


def read_failure(error: BaseException) -> str | None:
    """The failure a datasets reader logged just before it raised ``error`` (the line that names the file), once."""
    said, READER_FAILURES.last = READER_FAILURES.last, None
    return said if said is not None and " ".join(str(error).split()) in said else None


PROBED_BYTES = 1 << 28  # a file larger than this is not parsed again to name it (the error then names the dataset)


def _json_file_at_fault(name: str) -> str | None:
    """"FILE: error" for the first local .json or .jsonl file of ``name`` (a file spec or a folder) that Python's
    json cannot parse (datasets' reader raised without naming it), or None. Read only after a failure."""
    folder = Path(name).expanduser()
    files = sorted(map(str, folder.rglob("*"))) if folder.is_dir() else _local_files(name) or []
    for path in files:
        suffix = Path(path).suffix.lower()
        if suffix not in (".json", ".jsonl") or os.path.getsize(path) > PROBED_BYTES:
            continue
        where = ""
        try:
            with open(path, encoding="utf-8") as handle:
                if suffix == ".json":
                    json.load(handle)
                    continue
                for number, line in enumerate(handle, 1):
                    where = f" line {number}"
                    if line.strip():
                        json.loads(line)
        except (ValueError, OSError) as error:  # UnicodeDecodeError and json's errors are ValueErrors
            return f"{path}{where}: {error}"
    return None


def _guarded(name: str, load: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a datasets loading function and turn its failures into one clear error each."""
    READER_FAILURES.last, quiet, READER_FAILURES.quiet = None, READER_FAILURES.quiet, True
    try:
        loaded = load(*args, **kwargs)
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
            empty = empty_data_files(name, tuple(FILE_BUILDERS))
            said = (f"{', '.join(empty)} {'is' if len(empty) == 1 else 'are'} empty" if empty
                    else f"a split has no rows ({err})")
            raise ValueError(f"dataset {name!r}: {said}; give each split some text, or leave an empty validation "
                             "file out (--validation_split then holds out part of the training text)") from err
        raise
    except (DatasetGenerationError, StopIteration) as err:
        cause = err.__cause__ or err
        if isinstance(cause, UndecodableText):
            raise cause from None
        if isinstance(cause, CastError):  # datasets reads every file of a dataset with the first file's columns
            raise ValueError(f"could not read dataset {name!r}: its files do not all have the same columns "
                             f"({cause.details()}); give every file, train and validation alike, the same "
                             "column names") from err
        said = read_failure(cause) or _json_file_at_fault(name) or f"{type(cause).__name__}: {cause}"
        raise ValueError(f"could not read dataset {name!r}: {said}. Is it empty or malformed?") from err
    finally:
        READER_FAILURES.quiet = quiet
    if isinstance(loaded, (Dataset, IterableDataset)):  # pragma: no cover - load_dataset without split
        return {"train": loaded}
    return dict(loaded) if isinstance(loaded, dict) else loaded


def locate_row(dataset: str, name: str, index: int) -> str:
    """"FILE row N" for row ``index`` of a split read from local files, else "row N of the NAME split of ..."."""
    files = None
    try:
        if _saved_dataset(dataset):
            files = None  # its arrow files are no rows a user can find
        elif os.path.isdir(os.path.expanduser(dataset)):
            data_files = datasets.load_dataset_builder(dataset).config.data_files or {}
            aliases = VALIDATION_ALIASES if name == "validation" else (name,)
            files = next((list(paths) for split, paths in data_files.items() if str(split) in aliases), None)
        elif name == "train":
            files = _local_files(dataset)
    except Exception:  # noqa: BLE001  only the message's precision depends on it
        files = None
    bars = not datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        return _row_in_files(files or [], index) or f"row {index + 1} of the {name} split of {dataset!r}"
    finally:
        if bars:
            datasets.enable_progress_bars()


def _row_in_files(files: list[str], index: int) -> str | None:
    """"FILE row N" of row ``index`` of ``files`` read one after the other (None: past their end)."""
    for path in files:
        builder = FILE_BUILDERS.get(Path(path).suffix.lower())
        if builder is None:  # not a data file a user wrote (an arrow cache)
            return None
        reader, options = _reader(builder, [path])
        rows = len(datasets.load_dataset(reader, data_files=[path], split="train", **options))
        if index < rows:
            return f"{path}: {'data row' if reader == 'csv' else 'row'} {index + 1}"
        index -= rows
    return None
