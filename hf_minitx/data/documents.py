"""Documents and samples: causal-LM text as ``{"text", "doc_end"}`` rows.

The rows of a split, concatenated in order, are the corpus text byte for byte; a row with ``doc_end=True``
ends a sample (packing puts EOS there and nowhere else). A long text is cut into rows of about
``TEXT_CHUNK_CHARS`` characters at line boundaries, preferably where byte-level BPE splits anyway, so the
rows tokenize like the whole text and memory stays bounded. ``sample_by`` (``SAMPLE_BY``) says where samples
end: after each document, paragraph or line.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import datasets
import pyarrow as pa
from datasets import Dataset, Features, IterableDataset, Value
from datasets.fingerprint import Hasher
from datasets.table import InMemoryTable

from .preprocessing import DOC_END

SAMPLE_BY = ("document", "paragraph", "line")
TEXT_CHUNK_CHARS = 1 << 20  # a text file is read in rows of about this many characters
TEXT_ROW_FEATURES = Features({"text": Value("string"), DOC_END: Value("bool")})
IN_MEMORY_SHARE = 8  # text rows up to 1/8 of the machine's memory are held in memory, not copied to the cache

AnyDataset = Dataset | IterableDataset


def _clean_cut(line: str, next_line: str) -> bool:
    """Whether a chunk may end after ``line``: a non-space character, one line break, then a line that
    starts with a non-space character (or, inside a long line, a non-space character then a word start).
    Byte-level BPE splits there anyway, so chunks tokenize like the whole document."""
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
