"""Text files read as documents, and their bad bytes.

A text file is one document, read in rows of about ``TEXT_CHUNK_CHARS`` characters with its newlines as they
are. Bytes that are not UTF-8 raise ``UndecodableText`` naming the file and the offset, or (``skip_bad_rows``)
are replaced with U+FFFD and counted per file in ``REPLACED_BYTES``.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterator

from datasets import IterableDataset
from datasets.fingerprint import Hasher
from datasets.utils.file_utils import xopen

from .documents import (
    TEXT_CHUNK_CHARS,
    TEXT_ROW_FEATURES,
    AnyDataset,
    bounded_lines,
    rows_dataset,
    rows_from_lines,
)


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


def _files_key(files: list[str]) -> list:
    """What identifies the files' content for the cache: size and mtime of local files, else the path
    (Hub paths carry the commit)."""
    return [(f, os.stat(f).st_size, os.stat(f).st_mtime_ns) if os.path.isfile(f) else f for f in files]


def load_text_files(
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
