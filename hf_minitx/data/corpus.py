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

This module puts the steps together; each has its own: ``sources`` (built-in, files, ``datasets``),
``text_files`` (text files as documents, undecodable bytes), ``documents`` (rows and samples), ``columns``
(which columns hold the text, rows without text) and ``splits`` (train and validation).
"""

from __future__ import annotations

from collections.abc import Iterator

from datasets import Dataset, DatasetDict, IterableDatasetDict

from ..model_files import MODEL_KINDS
from .builtin import BUILTIN_CORPORA, BUILTIN_PREFIX, get_builtin
from .columns import SKIPPED_ROWS, normalise_columns, rows_with_text
from .documents import SAMPLE_BY, AnyDataset, as_samples, rows_from_lines
from .preprocessing import preprocess_seq2seq, seq2seq_collator, tokenize_and_pack
from .sources import dataset_key, load_raw, local_inputs
from .splits import check_not_empty, check_validation_split, pick_splits, with_validation
from .text_files import REPLACED_BYTES, UndecodableText

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
    # where a corpus comes from, and what was wrong with it (for the commands that say so)
    "dataset_key",
    "local_inputs",
    "REPLACED_BYTES",
    "SKIPPED_ROWS",
    "UndecodableText",
]

TASKS = MODEL_KINDS
TRAINING_PIECE_CHARS = 1 << 16  # a tokenizer trainer is given texts of about this size at most


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
    check_validation_split(validation_split, streaming)
    raw = pick_splits(load_raw(dataset, dataset_config, streaming, num_examples, seed, sample_by, skip_bad_rows),
                      dataset)
    splits = {}
    for name, split in raw.items():
        split = normalise_columns(split, dataset, name, task, text_column, source_column, target_column)
        split = rows_with_text(split, dataset, name, skip_bad_rows)
        splits[name] = as_samples(split, sample_by) if task == "causal-lm" else split
    splits = with_validation(splits, dataset, validation_split, seed, streaming)
    for name, split in splits.items():
        check_not_empty(split, dataset, name)
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
