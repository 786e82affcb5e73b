"""Resolve a ``--dataset`` argument into a ``DatasetDict`` with ``train`` and ``validation`` splits.

Accepted forms (see docs/data.md):

* ``builtin:NAME``: a corpus that needs no network (``BUILTIN_CORPORA`` lists them);
* local files: ``.txt``, ``.json``/``.jsonl``, ``.csv``, ``.parquet``; one path, a glob
  (``data/*.txt``) or a comma-separated list (``a.txt,b.txt``);
* anything else goes to ``datasets.load_dataset(name, config)``: a Hub id, or a local folder.

Columns are normalised: ``causal-lm`` gives ``text`` and ``doc_end``, ``seq2seq`` gives ``source`` and
``target``. Every bad input raises one clear error before any training starts.

Causal-LM rows: the rows of a split, concatenated in order, are the corpus text byte for byte; a row
with ``doc_end=True`` ends a sample, and packing puts EOS there and nowhere else. A text file (from a
path, list, glob, folder or Hub dataset of text files) is one document by default, read in chunks of
about ``TEXT_CHUNK_CHARS`` characters cut at line boundaries (``doc_end=False`` on all but the last), so
a large file never becomes one giant row. ``sample_by`` (``document``, ``paragraph``, ``line``) says where
samples end instead. Record rows (json, csv, parquet, Hub tables, built-ins) are documents; with
``paragraph`` or ``line`` they are taken as the consecutive lines of one text (wikitext style). The
flag is computed row by row, so it works the same for a streaming ``IterableDataset``.
"""

from __future__ import annotations

import codecs
import functools
import glob
import logging
import math
import os
import reprlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
from datasets import Dataset, DatasetDict, Features, IterableDataset, IterableDatasetDict, Value
from datasets.exceptions import DatasetGenerationError
from datasets.fingerprint import Hasher
from datasets.table import InMemoryTable
from datasets.utils.file_utils import xopen

from .builtin import BUILTIN_CORPORA, BUILTIN_PREFIX, get_builtin
from .preprocessing import DOC_END, preprocess_seq2seq, seq2seq_collator, tokenize_and_pack

__all__ = [
    "BUILTIN_CORPORA",
    "SAMPLE_BY",
    "TASKS",
    "load_corpus",
    "corpus_task",
    "iter_training_texts",
    "as_samples",
    "rows_from_lines",
    "tokenize_and_pack",
    "preprocess_seq2seq",
    "seq2seq_collator",
]

logger = logging.getLogger(__name__)

TASKS = ("causal-lm", "seq2seq")
FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
VALIDATION_ALIASES = ("validation", "valid", "val", "dev")
SAMPLE_BY = ("document", "paragraph", "line")
TEXT_CHUNK_CHARS = 1 << 20  # a text file is read in rows of about this many characters
TRAINING_PIECE_CHARS = 1 << 16  # a tokenizer trainer is given texts of about this size at most
TEXT_ROW_FEATURES = Features({"text": Value("string"), DOC_END: Value("bool")})
IN_MEMORY_SHARE = 8  # text rows up to 1/8 of the machine's memory are held in memory, not copied to the cache

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
    validation_split: float | int | None = 0.05,
    seed: int = 42,
    streaming: bool = False,
    num_examples: int | None = None,
    sample_by: str = "document",
    skip_bad_rows: bool = False,
) -> DatasetDict | IterableDatasetDict:
    """Load ``dataset`` (builtin name, local file(s) or Hub id) as normalised train/validation splits.

    ``validation_split`` (a fraction if float, a count of samples if int) carves a validation split
    from train, deterministically from ``seed``, when the source has none: whole samples (documents,
    or paragraphs/lines with ``sample_by``) go to one side; a corpus of one document gives the last
    fraction of its lines. ``sample_by`` says what ends a causal-LM sample (module docstring).
    ``num_examples`` sizes the generated built-in tasks. With ``streaming=True`` nothing is loaded in
    memory, an ``IterableDatasetDict`` is returned and validation is carved by rows. ``validation_split=None``
    carves nothing (only train, for a command that needs no validation); a corpus too small to carve from
    raises ``TooSmallToSplit``. Bytes of a text file that are not UTF-8 raise ``UndecodableText`` naming the
    file and the offset; ``skip_bad_rows`` replaces them with U+FFFD instead (counted per file in
    ``REPLACED_BYTES``). A row whose text (source, target) is missing (JSON null, an empty CSV cell) raises
    ``RowWithoutText`` naming the file and the row; ``skip_bad_rows`` skips it (counted in ``SKIPPED_ROWS``).
    CSV cells such as ``NA``, ``null`` or ``N/A`` are text, never missing values.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if sample_by not in SAMPLE_BY:
        raise ValueError(f"sample_by must be one of {SAMPLE_BY}, got {sample_by!r}")
    if isinstance(validation_split, float) and validation_split >= 1 and validation_split.is_integer():
        validation_split = int(validation_split)  # `--validation_split 20` on the command line: 20 rows
    _check_validation_split(validation_split, streaming)
    raw = _pick_splits(_load_raw(dataset, dataset_config, streaming, num_examples, seed, sample_by, skip_bad_rows),
                       dataset)
    splits = {}
    for name, split in raw.items():
        split = _normalise_columns(split, dataset, name, task, text_column, source_column, target_column)
        split = rows_with_text(split, dataset, name, skip_bad_rows)
        splits[name] = as_samples(split, sample_by) if task == "causal-lm" else split
    splits = _with_validation(splits, dataset, validation_split, seed, streaming)
    for name, split in splits.items():
        _check_not_empty(split, dataset, name)
    return IterableDatasetDict(splits) if streaming else DatasetDict(splits)


def corpus_task(dataset: str) -> str | None:
    """The task a built-in corpus is made for (``causal-lm``/``seq2seq``); None for other sources."""
    return get_builtin(dataset).task if dataset.startswith(BUILTIN_PREFIX) else None


def iter_training_texts(
    split: AnyDataset, max_texts: int | None = None, seed: int = 42, max_chars: int | None = None
) -> Iterator[str]:
    """Yield the texts of a normalised split (both sides for seq2seq), e.g. to train a tokenizer.

    The texts are the rows as training reads them, newlines included; chunks of a long document are
    cut where the tokenizer's pre-tokenizer would split anyway. With ``max_texts``, a map-style split
    is sampled (shuffled with ``seed``) and a streaming split is cut after its first ``max_texts`` rows,
    so memory stays bounded on large corpora; ``max_chars`` stops once that many characters were given.
    """
    given = 0
    for text in _training_texts(split, max_texts, seed):
        if max_chars is not None and given >= max_chars:
            return
        given += len(text)
        if len(text) <= 2 * TRAINING_PIECE_CHARS:
            yield text
        else:  # pieces cut where byte-level BPE splits anyway: the same words, far less trainer memory
            yield from (row["text"] for row in rows_from_lines(text.splitlines(keepends=True), "document",
                                                               TRAINING_PIECE_CHARS))


def _training_texts(split: AnyDataset, max_texts: int | None, seed: int) -> Iterator[str]:
    if max_texts is not None:
        if isinstance(split, Dataset):
            if len(split) > max_texts:
                split = split.shuffle(seed=seed).select(range(max_texts))
        else:
            split = split.take(max_texts)
    columns = [c for c in ("text", "source", "target") if c in (split.column_names or [])]
    for batch in split.iter(batch_size=32):  # text-file rows are ~1 MB each
        for column in columns:
            yield from (text for text in batch[column] if text)


# --- documents and samples ----------------------------------------------------------------------


def _clean_cut(line: str, next_line: str) -> bool:
    """Whether a chunk may end after ``line``: a non-space character, one line break, then a line that
    starts with a non-space character (or, inside a long line, a non-space character then a word start). Byte-level BPE splits there anyway, so chunks tokenize like the
    whole document."""
    body = line.rstrip("\r\n")
    if body == line:  # a piece of a long line (``bounded_lines``): clean before a space that starts a word
        return bool(body) and not body[-1].isspace() and next_line[:1] == " " and next_line[1:2].strip() != ""
    return bool(body) and not body[-1].isspace() and bool(next_line) and not next_line[0].isspace()


def rows_from_lines(lines: Iterable[str], sample_by: str, chunk_chars: int | None = None) -> Iterator[dict]:
    """Group the lines of one text (each with its line break) into ``{"text", "doc_end"}`` rows.

    ``document``: the whole text is one sample; ``paragraph``: a sample ends after its blank line(s);
    ``line``: every line is a sample. A sample longer than ``chunk_chars`` is cut into several rows at
    line boundaries (``doc_end=False`` on all but its last), preferably at clean cuts, at the latest
    at twice the size. The rows' texts concatenate to the input exactly.
    """
    chunk_chars = chunk_chars or TEXT_CHUNK_CHARS
    pending: list[str] = []
    size, has_text, previous = 0, False, None
    for line in lines:
        if previous is not None:
            blank = not line.strip()
            if sample_by == "line" or (sample_by == "paragraph" and has_text and not previous.strip() and not blank):
                yield {"text": "".join(pending), DOC_END: True}
                pending, size, has_text = [], 0, False
            elif size >= chunk_chars and (_clean_cut(previous, line) or size >= 2 * chunk_chars):
                yield {"text": "".join(pending), DOC_END: False}
                pending, size = [], 0
        pending.append(line)
        size += len(line)
        has_text = has_text or bool(line.strip())
        previous = line
    if pending:
        yield {"text": "".join(pending), DOC_END: True}


def bounded_lines(handle: Any, limit: int) -> Iterator[str]:
    """The lines of a text handle, a line longer than ``limit`` characters given in pieces of at most about
    ``limit``: each cut is between a word's end and a space that starts the next word, where byte-level
    BPE splits anyway (a clean cut for ``rows_from_lines``), so a one-line file of any size is read (and
    tokenized) in bounded memory."""
    carry = ""
    while True:
        wanted = max(limit - len(carry), 1)
        line = handle.readline(wanted)
        piece, carry = carry + line, ""
        if not piece:
            return
        if piece.endswith(("\n", "\r")) or len(line) < wanted:  # a whole line, or the end of the file
            yield piece
            continue
        cut = piece.rfind(" ", 0, len(piece) - 1)  # a space followed by one more character
        while cut > 0 and (piece[cut + 1].isspace() or piece[cut - 1].isspace()):  # word, space, word
            cut = piece.rfind(" ", 0, cut)
        if cut <= 0:  # no word start in the piece: cut anywhere (one giant word)
            cut = len(piece)
        yield piece[:cut]
        carry = piece[cut:]


class UndecodableText(ValueError):
    """A text file holds bytes that are not UTF-8 (the message names the file, the byte offset and the fix)."""


REPLACED_BYTES: dict[str, int] = {}  # --skip_bad_rows: undecodable byte sequences replaced, per file (one pass)
_replaced = [0]


def _replace_and_count(error: UnicodeDecodeError) -> tuple[str, int]:
    _replaced[0] += 1
    return "\ufffd", error.end


codecs.register_error("minitx-replace", _replace_and_count)


def _text_file_rows(files: list[str], sample_by: str, chunk_chars: int, skip_bad_rows: bool = False) -> Iterator[dict]:
    """Rows of text files, one document per file; newlines kept as they are (``newline=""``). Bytes that are
    not UTF-8 raise ``UndecodableText``, or are replaced with U+FFFD (and counted) with ``skip_bad_rows``."""
    for path in files:
        before = _replaced[0]
        try:
            with xopen(path, "r", encoding="utf-8", newline="",
                       errors="minitx-replace" if skip_bad_rows else "strict") as handle:
                for row in rows_from_lines(bounded_lines(handle, chunk_chars), sample_by, chunk_chars):
                    if _replaced[0] > before:  # a file read again (next epoch) is not counted twice
                        REPLACED_BYTES[str(path)] = max(REPLACED_BYTES.get(str(path), 0), _replaced[0] - before)
                    yield row
        except UnicodeDecodeError as error:
            offset = _first_bad_byte(path)
            raise UndecodableText(
                f"{path} is not UTF-8 text: the byte at offset {offset if offset is not None else '?'} cannot be "
                f"decoded ({error.reason}); convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8), or pass "
                "--skip_bad_rows to replace undecodable bytes with U+FFFD") from None


def _first_bad_byte(path: str) -> int | None:
    """The offset of the first byte of ``path`` that is not UTF-8 (None: the file decodes)."""
    decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
    with xopen(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as error:
                return offset - pending + error.start
            offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return offset - len(decoder.getstate()[0])
    return None


def _record_rows(split: AnyDataset, sample_by: str, chunk_chars: int) -> Iterator[dict]:
    """Rows of a record split read as consecutive lines of one text (each row ends with a line break)."""

    def lines() -> Iterator[str]:
        for batch in split.iter(batch_size=1000):
            for text in batch["text"]:
                if text is None:
                    continue
                yield from (text if text.endswith(("\n", "\r")) else text + "\n").splitlines(keepends=True)

    yield from rows_from_lines(lines(), sample_by, chunk_chars)


def _every_row_ends_a_document(batch: dict[str, list]) -> dict[str, list]:
    return {DOC_END: [True] * len(batch["text"])}


def as_samples(split: AnyDataset, sample_by: str = "document") -> AnyDataset:
    """A causal-LM split with its ``doc_end`` column (text-file rows already have it).

    Record rows are documents with ``sample_by="document"``; otherwise they are regrouped as the lines
    of one text (wikitext style: a row is a line; ``paragraph`` ends samples at blank lines).
    """
    if DOC_END in (split.column_names or []):
        return split
    if sample_by == "document":
        return split.map(_every_row_ends_a_document, batched=True, features=TEXT_ROW_FEATURES)
    kwargs = {"split": split, "sample_by": sample_by, "chunk_chars": TEXT_CHUNK_CHARS}
    if isinstance(split, IterableDataset):
        return IterableDataset.from_generator(_record_rows, features=TEXT_ROW_FEATURES, gen_kwargs=kwargs)
    return Dataset.from_generator(_record_rows, features=TEXT_ROW_FEATURES, gen_kwargs=kwargs,
                                  fingerprint=Hasher.hash([split._fingerprint, sample_by, TEXT_CHUNK_CHARS]))


# --- loading ------------------------------------------------------------------------------------


def _load_raw(
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
               else "give the text as a .txt file, or the records as .jsonl/.csv/.parquet")
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


def _load_files(files: list[str], streaming: bool, sample_by: str, skip_bad_rows: bool = False) -> dict[str, AnyDataset]:
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
        return _guarded(",".join(files), _load_text_files, {"train": files}, streaming, sample_by, skip_bad_rows)
    return _guarded(",".join(files), datasets.load_dataset, builder, data_files={"train": files}, streaming=streaming,
                    **_reader_options(builder))


CSV_AS_TEXT = {"keep_default_na": False, "na_values": [""]}  # "NA", "null", "nan", "N/A", "#N/A" stay text


def _reader_options(builder: str) -> dict[str, Any]:
    """Options of datasets' ``builder``: a CSV cell is text, and only an empty one is missing."""
    return dict(CSV_AS_TEXT) if builder == "csv" else {}


def _files_key(files: list[str]) -> list:
    """What identifies the files' content for the cache: size and mtime of local files, else the path
    (Hub paths carry the commit)."""
    return [(f, os.stat(f).st_size, os.stat(f).st_mtime_ns) if os.path.isfile(f) else f for f in files]


def _load_text_files(
    data_files: dict[str, list[str]], streaming: bool, sample_by: str, skip_bad_rows: bool = False
) -> dict[str, AnyDataset]:
    """One split per entry of ``data_files``; each file is one document (``sample_by`` may cut it)."""
    splits: dict[str, AnyDataset] = {}
    for name, files in data_files.items():
        kwargs = {"files": [str(f) for f in files], "sample_by": sample_by, "chunk_chars": TEXT_CHUNK_CHARS,
                  "skip_bad_rows": skip_bad_rows}
        if streaming:
            splits[str(name)] = IterableDataset.from_generator(
                _text_file_rows, features=TEXT_ROW_FEATURES, gen_kwargs=kwargs)
        else:
            key = Hasher.hash(["text-files", _files_key(kwargs["files"]), sample_by, TEXT_CHUNK_CHARS, skip_bad_rows])
            size = sum(os.path.getsize(f) for f in kwargs["files"] if os.path.isfile(f))
            splits[str(name)] = rows_dataset(_text_file_rows, kwargs, key, size)
    return splits


def _fits_in_memory(chars: int) -> bool:
    """Whether ``chars`` characters of text are at most 1/``IN_MEMORY_SHARE`` of the machine's memory."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - no sysconf: keep the cached copy
        return False
    return chars * IN_MEMORY_SHARE <= memory


def rows_dataset(generate: Any, gen_kwargs: dict[str, Any], fingerprint: str, chars: int) -> Dataset:
    """The ``{"text", "doc_end"}`` rows that ``generate(**gen_kwargs)`` yields, as a map-style split.

    Text that fits in memory is held there: the files themselves are the copy on disk, and the datasets cache
    keeps only what is made from them (the packed blocks). Larger text is written to the cache once, as
    ``Dataset.from_generator`` does, and memory-mapped.
    """
    if not _fits_in_memory(chars):
        return Dataset.from_generator(generate, features=TEXT_ROW_FEATURES, gen_kwargs=gen_kwargs,
                                      fingerprint=fingerprint)
    texts: list[str] = []
    ends: list[bool] = []
    for row in generate(**gen_kwargs):
        texts.append(row["text"])
        ends.append(row[DOC_END])
    if not texts:
        raise ValueError("the text corresponds to no data: there are no rows")
    table = pa.table({"text": pa.array(texts, pa.string()), DOC_END: pa.array(ends, pa.bool_())})
    del texts
    return Dataset(InMemoryTable(table), info=datasets.DatasetInfo(features=TEXT_ROW_FEATURES),
                   fingerprint=fingerprint)


def _load_with_datasets(
    name: str, config: str | None, streaming: bool, sample_by: str, skip_bad_rows: bool = False
) -> dict[str, AnyDataset]:
    """``datasets.load_dataset(name, config)``: a Hub id or a local folder of data files. Text files
    (what datasets' ``text`` builder would read line by line) are read as documents instead."""
    _check_one_file_type(name)
    builder = _guarded(name, datasets.load_dataset_builder, name, config)
    files = {str(split): list(paths) for split, paths in (builder.config.data_files or {}).items()}
    if builder.name == "text" and files:
        return _guarded(name, _load_text_files, _each_file_once(name, files), streaming, sample_by, skip_bad_rows)
    if os.path.isdir(os.path.expanduser(name)) and files and _each_file_once(name, files) != files:
        return _guarded(name, datasets.load_dataset, builder.name, data_files=_each_file_once(name, files),
                        streaming=streaming, **_reader_options(builder.name))
    return _guarded(name, datasets.load_dataset, name, config, streaming=streaming, **_reader_options(builder.name))


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
    found = {path.suffix.lower() for path in folder.rglob("*") if path.is_file() and path.suffix.lower() in FILE_BUILDERS}
    kinds = {FILE_BUILDERS[suffix] for suffix in found}
    if len(kinds) > 1:
        raise ValueError(f"folder {name!r} holds data files of several types ({', '.join(sorted(found))}), and only one "
                         "type would be read; keep one type in the folder, or pass the files as a comma-separated list")


def _guarded(name: str, load: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a datasets loading function and turn its failures into one clear error each."""
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
            raise ValueError(f"dataset {name!r} has an empty split ({err}): there is nothing to use") from err
        raise
    except (DatasetGenerationError, StopIteration) as err:
        cause = err.__cause__ or err
        if isinstance(cause, UndecodableText):
            raise cause from None
        raise ValueError(
            f"could not read dataset {name!r}: {type(cause).__name__}: {cause}. Is it empty or malformed?"
        ) from err
    if isinstance(loaded, (Dataset, IterableDataset)):  # pragma: no cover - load_dataset without split
        return {"train": loaded}
    return dict(loaded) if isinstance(loaded, dict) else loaded


# --- splits -------------------------------------------------------------------------------------


def _check_validation_split(validation_split: float | int | None, streaming: bool) -> None:
    if validation_split is None:
        return
    if isinstance(validation_split, bool) or not isinstance(validation_split, (int, float)):
        raise ValueError(f"validation_split must be a float in (0, 1) or an int >= 1, got {validation_split!r}")
    if isinstance(validation_split, float) and not 0.0 < validation_split < 1.0:
        raise ValueError(f"validation_split as a fraction must be in (0, 1), got {validation_split}")
    if isinstance(validation_split, int) and validation_split < 1:
        raise ValueError(f"validation_split as a row count must be >= 1, got {validation_split}")


def _pick_splits(raw: dict[str, AnyDataset], dataset: str) -> dict[str, AnyDataset]:
    """train, validation (under any usual alias) and test; other splits are left out."""
    splits = {str(k): v for k, v in raw.items()}
    if "train" not in splits:
        raise ValueError(f"dataset {dataset!r} has no 'train' split; its splits are {sorted(splits)}")
    for alias in VALIDATION_ALIASES:
        if alias in splits:
            splits["validation"] = splits.pop(alias)
            break
    return {k: v for k, v in splits.items() if k in ("train", "validation", "test")}


def _with_validation(
    splits: dict[str, AnyDataset], dataset: str, validation_split: float | int, seed: int, streaming: bool
) -> dict[str, AnyDataset]:
    """Return the splits, carving validation from train when there is none."""
    if "validation" in splits or validation_split is None:
        return splits
    splits = dict(splits)
    _check_not_empty(splits["train"], dataset, "train")
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


def _check_not_empty(split: AnyDataset, dataset: str, name: str) -> None:
    """A split with no rows, or (in memory) whose text is only whitespace, is refused."""
    empty = len(split) == 0 if isinstance(split, Dataset) else next(iter(split.take(1)), None) is None
    if empty:
        raise ValueError(f"split {name!r} of dataset {dataset!r} is empty: there is nothing to train or evaluate on")
    columns = [c for c in ("text", "source", "target") if c in (split.column_names or [])]
    if isinstance(split, Dataset) and columns and not _has_text(split, columns):
        raise ValueError(f"split {name!r} of dataset {dataset!r} has no text: its {len(split)} rows are empty or "
                         "whitespace only; check the file (and --text_column) or pass another --dataset")


def _has_text(split: Dataset, columns: list[str]) -> bool:
    """Whether any row holds a non-whitespace character (stops at the first that does)."""
    for batch in split.select_columns(columns).iter(batch_size=1000):
        if any(text and not text.isspace() for column in columns for text in batch[column]):
            return True
    return False


# --- rows without text --------------------------------------------------------------------------

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
        raise RowWithoutText(f"{_locate_row(dataset, name, first)} has no {column} (null or an empty cell): fix or "
                             "delete that row, or pass --skip_bad_rows to skip rows without text (counted in the "
                             "summary)")
    key = f"{dataset} ({name})"
    SKIPPED_ROWS[key] = int(missing.sum())
    logger.warning("--skip_bad_rows: skipped %d row(s) without text in %s, the first %s", SKIPPED_ROWS[key], key,
                   _locate_row(dataset, name, first))
    return split.select(np.flatnonzero(~missing))


def _all_present(row: dict, columns: list[str]) -> bool:
    return all(row[column] is not None for column in columns)


def _refuse_missing(row: dict, index: int, columns: list[str], dataset: str, name: str) -> dict:
    """A streamed row, refused naming its file and row (``index``: its place in the stream) if a text is missing."""
    for column in columns:
        if row[column] is None:
            raise RowWithoutText(f"{_locate_row(dataset, name, index)} has no {column} (null or an empty cell): fix "
                                 "or delete that row, or pass --skip_bad_rows to skip rows without text")
    return row


def _locate_row(dataset: str, name: str, index: int) -> str:
    """"FILE row N" for row ``index`` of a split read from local files, else "row N of the NAME split of ..."."""
    files = None
    try:
        if os.path.isdir(os.path.expanduser(dataset)):
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
        rows = len(datasets.load_dataset(builder, data_files=[path], split="train", **_reader_options(builder)))
        if index < rows:
            return f"{path}: {'data row' if builder == 'csv' else 'row'} {index + 1}"
        index -= rows
    return None


# --- columns ------------------------------------------------------------------------------------


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
                return f"{_locate_row(dataset, name, start + offset)} holds {shown} ({type(value).__name__})"
    return f"it holds {kind}"


def _normalise_columns(
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
            if getattr(features[column], "dtype", None) not in ("string", "large_string"):
                raise ValueError(f"column {column!r} of {dataset!r} must hold text, but "
                                 f"{_first_non_text(split, dataset, name, column)}: write each value as a string "
                                 f"(in quotes in JSON), or pick the text column with --text_column")
    keep = list(wanted) + ([DOC_END] if task == "causal-lm" and DOC_END in columns else [])
    split = split.select_columns(keep)
    renames = {old: new for old, new in wanted.items() if old != new}
    return split.rename_columns(renames) if renames else split
