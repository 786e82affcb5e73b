"""Turn normalised corpora into model inputs: packed causal-LM blocks and seq2seq pairs.

Results are cached by datasets under fingerprints computed from the input split, the tokenizer's
content and the arguments, so a second run with the same inputs does not tokenize again.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import torch
from datasets import (
    Dataset,
    DatasetDict,
    Features,
    IterableDataset,
    IterableDatasetDict,
    List,
    Value,
)
from datasets.arrow_writer import ArrowWriter
from datasets.fingerprint import Hasher
from datasets.utils.tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from ..models.modeling_minitx import IGNORE_INDEX

PREPROCESSING_VERSION = "4"  # bump when the output of a function here changes
LABEL_PAD_ID = IGNORE_INDEX
DOC_END = "doc_end"

AnyDatasetDict = DatasetDict | IterableDatasetDict


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of what the tokenizer computes (vocabulary, merges, pipeline), not of its runtime state."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return Hasher.hash(tokenizer)
    spec = json.loads(backend.to_str())
    spec.pop("truncation", None)  # runtime settings that calls mutate
    spec.pop("padding", None)
    return Hasher.hash([spec, tokenizer.eos_token_id, tokenizer.pad_token_id])


def _required_id(tokenizer: PreTrainedTokenizerBase, name: str) -> int:
    token_id = getattr(tokenizer, f"{name}_token_id")
    if token_id is None:
        raise ValueError(f"the tokenizer has no {name} token; set tokenizer.{name}_token before preprocessing")
    return token_id


def _fingerprint(split: Dataset, *parts: Any) -> str:
    return Hasher.hash([split._fingerprint, PREPROCESSING_VERSION, *parts])


# --- causal LM ----------------------------------------------------------------------------------

CHARS_PER_BATCH = 1 << 22  # characters tokenized per call: rows of ~1 MB go a few at a time
PARALLEL_CHARS_PER_BATCH = 1 << 20  # per call when several threads tokenize: finer pieces share the work evenly


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds every id of a ``vocab_size``-token vocabulary."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def block_features(block_size: int, dtype: np.dtype) -> Features:
    """Packed blocks: one fixed-length ``input_ids`` column; labels are derived by the collator."""
    return Features({"input_ids": List(Value(dtype.name), length=block_size)})


def encode_rows(
    texts: list[str], ends: list[bool], tokenizer: PreTrainedTokenizerBase, eos_id: int, dtype: np.dtype
) -> list[np.ndarray]:
    """Ids of each row as a 1-D array of ``dtype``, EOS appended where the row ends a document.

    The ids are what ``tokenizer(text, add_special_tokens=False, split_special_tokens=True)`` gives: no
    special token inside a document, a literal ``"<eos>"`` or ``"<pad>"`` in the text being encoded as text, so
    EOS marks only document ends. Empty rows give empty arrays and no EOS. All rows go to the tokenizer in one call.
    """
    keep = [i for i, text in enumerate(texts) if text]
    batch = [texts[i] for i in keep]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not batch:
        encoded = []
    elif backend is not None and backend.truncation is None and backend.padding is None:
        backend.encode_special_tokens = True  # the wrapper sets it on each call too: threads may set it at once
        encoded = [e.ids for e in backend.encode_batch_fast(batch, add_special_tokens=False)]
    else:  # a slow tokenizer, or truncation/padding set on the backend: the wrapper resets it. Rows are cut
        # into blocks later, so their length is no concern (verbose=False: no "longer than the maximum" warning).
        encoded = tokenizer(batch, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"]
    out = [np.empty(0, dtype)] * len(texts)
    for i, ids in zip(keep, encoded, strict=True):
        out[i] = np.array(ids + [eos_id] if ends[i] else ids, dtype=dtype)
    return out


def row_batches(rows: Iterable[dict], max_chars: int = CHARS_PER_BATCH, max_rows: int = 1000) -> Iterator[dict]:
    """Group ``{"text", "doc_end"}`` rows into ``{"text": [...], "doc_end": [...]}`` batches of at most
    ``max_rows`` rows, closed as soon as they hold ``max_chars`` characters (no look-ahead: a batch is
    yielded right after its last row was read)."""
    texts: list[str] = []
    ends: list[bool] = []
    size = 0
    for row in rows:
        texts.append(row["text"] or "")
        ends.append(row.get(DOC_END, True))
        size += len(texts[-1])
        if size >= max_chars or len(texts) >= max_rows:
            yield {"text": texts, DOC_END: ends}
            texts, ends, size = [], [], 0
    if texts:
        yield {"text": texts, DOC_END: ends}


def cut_blocks(tokens: np.ndarray, block_size: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut a 1-D token array into (n, block_size) blocks starting every ``step`` tokens while a whole
    block fits; also returns the rest (the tokens from the first start without a whole block)."""
    if len(tokens) < block_size:
        return tokens[:0].reshape(0, block_size), tokens
    count = (len(tokens) - block_size) // step + 1
    if step == block_size:
        blocks = tokens[: count * block_size].reshape(count, block_size)
    else:
        blocks = np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(tokens, block_size)[::step][:count])
    return blocks, tokens[count * step :]


def last_block(rest: np.ndarray, block_size: int, overlap: int, pad_id: int, drop_remainder: bool) -> np.ndarray:
    """The final (0 or 1, block_size) block: the rest right-padded with ``pad_id``, unless dropped or it
    holds no token not already in the previous block."""
    if drop_remainder or len(rest) <= overlap:
        return rest[:0].reshape(0, block_size)
    return np.concatenate([rest, np.full(block_size - len(rest), pad_id, rest.dtype)]).reshape(1, block_size)


def block_labels(input_ids: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """Labels of packed blocks (batch, block): the ids, with each row's trailing run of ``pad_id`` (the
    right padding of a split's last block) set to ``IGNORE_INDEX``. The model shifts them itself."""
    if pad_id is None:
        return input_ids.clone()
    trailing = (input_ids == pad_id).flip(-1).cumprod(-1).flip(-1).bool()
    return input_ids.masked_fill(trailing, IGNORE_INDEX)


class BlockCollator:
    """Stack packed causal-LM blocks (rows with ``input_ids`` of one length, or arrays) into ``input_ids``
    and ``labels`` (batch, block) long tensors; labels come from ``block_labels``."""

    def __init__(self, pad_token_id: int | None) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, features: list[Any]) -> dict[str, torch.Tensor]:
        if not len(features):
            raise ValueError("cannot collate an empty batch")
        rows = [np.asarray(f["input_ids"] if isinstance(f, dict) else f) for f in features]
        input_ids = torch.from_numpy(np.stack(rows).astype(np.int64))
        return {"input_ids": input_ids, "labels": block_labels(input_ids, self.pad_token_id)}


def block_collator(tokenizer: PreTrainedTokenizerBase) -> BlockCollator:
    """The collator of ``tokenize_and_pack`` blocks: the tokenizer's pad id marks right padding."""
    return BlockCollator(tokenizer.pad_token_id)


def _can_share(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether ``encode_rows`` may run in several threads at once: it calls the fast backend directly (which
    releases the GIL) and never changes the tokenizer's runtime state."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and backend.truncation is None and backend.padding is None


def encoded_batches(batches: Iterable[dict], tokenizer: PreTrainedTokenizerBase, eos_id: int, dtype: np.dtype,
                    workers: int = 1) -> Iterator[list[np.ndarray]]:
    """``encode_rows`` of each ``{"text", "doc_end"}`` batch, in order. With ``workers > 1`` (and a fast
    tokenizer) that many threads encode batches at once, at most two per thread ahead of the reader."""
    if workers <= 1 or not _can_share(tokenizer):
        for batch in batches:
            yield encode_rows(batch["text"], batch[DOC_END], tokenizer, eos_id, dtype)
        return
    with ThreadPoolExecutor(workers) as pool:
        pending: deque[Future] = deque()
        for batch in batches:
            pending.append(pool.submit(encode_rows, batch["text"], batch[DOC_END], tokenizer, eos_id, dtype))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def iter_block_arrays(rows: Iterable[dict], tokenizer: PreTrainedTokenizerBase, block_size: int, pack: dict[str, Any],
                      dtype: np.dtype, workers: int = 1) -> Iterator[np.ndarray]:
    """Tokenize and pack ``{"text", "doc_end"}`` rows: (n, block_size) arrays in order, the last one the final
    (maybe padded) block. ``pack``: ``eos_id``, ``overlap`` (tokens shared by consecutive blocks), ``prefix``
    (tokens put first), ``pad_id`` and ``drop_remainder`` (see ``tokenize_and_pack``)."""
    rest = np.asarray(pack["prefix"], dtype=dtype)
    max_chars = CHARS_PER_BATCH if workers <= 1 else PARALLEL_CHARS_PER_BATCH
    for ids in encoded_batches(row_batches(rows, max_chars), tokenizer, pack["eos_id"], dtype, workers):
        blocks, rest = cut_blocks(np.concatenate([rest, *ids]), block_size, block_size - pack["overlap"])
        yield blocks
    yield last_block(rest, block_size, pack["overlap"], pack["pad_id"], pack["drop_remainder"])


def iter_blocks(rows: Iterable[dict], tokenizer: PreTrainedTokenizerBase, block_size: int, pack: dict[str, Any],
                dtype: np.dtype) -> Iterator[np.ndarray]:
    """Tokenize and pack ``{"text", "doc_end"}`` rows on the fly: (block_size,) arrays, in order, with
    the same blocks as the map-style path (``pack`` as in ``iter_block_arrays``)."""
    for blocks in iter_block_arrays(rows, tokenizer, block_size, pack, dtype):
        yield from blocks


def _split_rows(split: Dataset, name: str) -> Iterator[dict]:
    """The ``{"text", "doc_end"}`` rows of a map-style split in order, with a progress bar."""
    with tqdm(total=len(split), desc=f"Tokenizing and packing {name}", unit=" rows") as bar:
        for batch in split.select_columns([c for c in ("text", DOC_END) if c in split.column_names]).iter(256):
            texts = batch["text"]
            for text, end in zip(texts, batch.get(DOC_END) or [True] * len(texts), strict=True):
                yield {"text": text, DOC_END: end}
            bar.update(len(texts))


def _write_blocks(writer: ArrowWriter, blocks: np.ndarray) -> int:
    """Append (n, block_size) blocks to an open writer; returns n."""
    if len(blocks):
        column = pa.FixedSizeListArray.from_arrays(pa.array(blocks.reshape(-1)), blocks.shape[1])
        writer.write_table(pa.table({"input_ids": column}))
    return len(blocks)


def _pack_split(split: Dataset, name: str, tokenizer: PreTrainedTokenizerBase, block_size: int, num_proc: int | None,
                pack: dict[str, Any]) -> Dataset:
    """One packed copy of a map-style split, cached under the datasets cache by fingerprint: the rows are
    tokenized by ``num_proc`` threads (default: the cores) and cut into blocks written straight to the file,
    with no tokenized intermediate."""
    dtype = token_dtype(len(tokenizer))
    key = _fingerprint(split, "pack", tokenizer_fingerprint(tokenizer), block_size, dtype.name, sorted(pack.items()))
    folder = Path(datasets.config.HF_DATASETS_CACHE) / "hf_minitx_blocks"
    path = folder / f"{key}.arrow"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        workers = num_proc or os.cpu_count() or 1
        with tempfile.TemporaryDirectory(dir=folder, prefix="tmp-") as tmp:
            writer = ArrowWriter(features=block_features(block_size, dtype), path=str(Path(tmp) / "blocks.arrow"))
            count = sum(_write_blocks(writer, blocks) for blocks in iter_block_arrays(
                _split_rows(split, name), tokenizer, block_size, pack, dtype, workers))
            writer.finalize()
            if count == 0:  # fewer tokens than one block: counting them again is quick
                tokens = sum(len(ids) for batch in encoded_batches(row_batches(_split_rows(split, name)), tokenizer,
                                                                   pack["eos_id"], dtype) for ids in batch)
                raise ValueError(
                    f"split {name!r} has {tokens} tokens in {len(split)} rows, fewer than block_size={block_size}: no "
                    "block was made. Lower --block_size or use more data (if the file should hold more rows, check "
                    "how it parsed, e.g. its quoting).")
            os.replace(Path(tmp) / "blocks.arrow", path)
    blocks = Dataset.from_file(str(path))
    blocks._fingerprint = key
    return blocks


def _iter_block_rows(rows: IterableDataset, **kwargs: Any) -> Iterator[dict]:
    for block in iter_blocks(rows, **kwargs):
        yield {"input_ids": block}


def tokenize_and_pack(
    dataset_dict: AnyDatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    *,
    num_proc: int | None = None,
    drop_remainder: bool = True,
    for_evaluation: bool = False,
) -> AnyDatasetDict:
    """Tokenize the ``text`` column, put EOS where a document ends and pack into ``block_size`` blocks.

    A row ends a document when its ``doc_end`` is True (every row when there is no such column), so
    the chunks of one document are joined with nothing between them. Blocks span document boundaries,
    so no token is lost except at the very end of each split: with ``drop_remainder=True`` (default)
    the last ``< block_size`` tokens of a split are dropped; with False they form a last block
    right-padded with ``<pad>``. Rows hold only ``input_ids`` (the smallest unsigned dtype for the
    vocabulary); ``BlockCollator`` derives the labels (the ids, padding ignored; the model shifts them).

    ``for_evaluation=True`` makes every token of a split predicted exactly once: the stream starts
    with EOS (the context of a document start), consecutive blocks share one token, and the last
    partial block is kept (padded).

    Map-style splits are tokenized by ``num_proc`` threads (default: the machine's cores) into one cached
    packed copy; streaming splits are packed on the fly.
    """
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    eos_id = _required_id(tokenizer, "eos")
    drop_remainder = drop_remainder and not for_evaluation
    pack = {"eos_id": eos_id, "pad_id": eos_id if drop_remainder else _required_id(tokenizer, "pad"),
            "drop_remainder": drop_remainder, "overlap": int(for_evaluation),
            "prefix": (eos_id,) if for_evaluation else ()}
    dtype = token_dtype(len(tokenizer))
    out = {}
    for name, split in dataset_dict.items():
        if "text" not in (split.column_names or []):
            raise ValueError(f"split {name!r} has no 'text' column (columns: {split.column_names}); use load_corpus")
        if isinstance(split, IterableDataset):
            out[name] = IterableDataset.from_generator(
                _iter_block_rows, features=block_features(block_size, dtype),
                gen_kwargs={"rows": split, "tokenizer": tokenizer, "block_size": block_size, "pack": pack,
                            "dtype": dtype})
        else:
            out[name] = _pack_split(split, name, tokenizer, block_size, num_proc, pack)
    return IterableDatasetDict(out) if isinstance(dataset_dict, IterableDatasetDict) else DatasetDict(out)


# --- seq2seq ------------------------------------------------------------------------------------


def _tokenize_pairs(
    batch: dict[str, list], tokenizer: PreTrainedTokenizerBase, eos_id: int, max_source: int, max_target: int
) -> dict:
    """Sources exactly as ``tokenizer(sources, truncation=True, max_length=max_source)`` encodes them
    (the saved tokenizer is the one source of truth for the encoder's input: its post-processor adds
    EOS); labels are target ids + EOS, truncated to ``max_target`` including the EOS. Special-token text in a
    source or target is encoded as text."""
    encoded = tokenizer([t or "" for t in batch["source"]], truncation=True, max_length=max_source,
                        split_special_tokens=True)
    targets = tokenizer([t or "" for t in batch["target"]], add_special_tokens=False,
                        split_special_tokens=True)["input_ids"]
    return {
        "input_ids": encoded["input_ids"],
        "attention_mask": encoded["attention_mask"],
        "labels": [ids[: max_target - 1] + [eos_id] for ids in targets],
    }


def preprocess_seq2seq(
    dataset_dict: AnyDatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_source_length: int,
    max_target_length: int,
    num_proc: int | None = None,
) -> AnyDatasetDict:
    """Tokenize ``source``/``target`` into unpadded ``input_ids``, ``attention_mask`` and ``labels``.

    Sources are encoded by the tokenizer itself, special tokens included (``train_bpe_tokenizer(...,
    add_eos_token=True)`` appends EOS, as BART/T5 tokenizers do), so ``tokenizer(source)`` at inference
    gives the same ids. Labels end with EOS. Both are truncated to the given lengths (EOS included).
    No BOS is added to labels: the model builds ``decoder_input_ids`` by shifting labels right after
    the start token.
    """
    if max_source_length < 2 or max_target_length < 2:
        raise ValueError(f"max lengths must be >= 2, got {max_source_length} and {max_target_length}")
    eos_id = _required_id(tokenizer, "eos")
    fn_kwargs = {"tokenizer": tokenizer, "eos_id": eos_id, "max_source": max_source_length,
                 "max_target": max_target_length}
    tok_key = tokenizer_fingerprint(tokenizer)
    out = {}
    for name, split in dataset_dict.items():
        if not {"source", "target"} <= set(split.column_names or []):
            raise ValueError(f"split {name!r} needs 'source' and 'target' columns, has {split.column_names}")
        if isinstance(split, IterableDataset):
            out[name] = split.map(_tokenize_pairs, batched=True, remove_columns=split.column_names,
                                  fn_kwargs=fn_kwargs)
            continue
        out[name] = split.map(
            _tokenize_pairs,
            batched=True,
            num_proc=num_proc,
            remove_columns=split.column_names,
            fn_kwargs=fn_kwargs,
            new_fingerprint=_fingerprint(split, "seq2seq", tok_key, max_source_length, max_target_length),
            desc=f"Tokenizing {name}",
        )
    return IterableDatasetDict(out) if isinstance(dataset_dict, IterableDatasetDict) else DatasetDict(out)


class Seq2SeqCollator:
    """Pad a list of seq2seq rows into tensors, always on the right.

    ``input_ids`` are padded with the pad id, ``attention_mask`` with 0 and ``labels`` with IGNORE_INDEX
    (ignored by the loss). The tokenizer's own ``padding_side`` (a decoder-only model's tokenizer
    pads on the left, for generation) is ignored on purpose: labels must be right-padded so that the shifted decoder
    inputs stay aligned.
    """

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None) -> None:
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def _padded_length(self, rows: list[list[int]]) -> int:
        length = max(len(r) for r in rows)
        multiple = self.pad_to_multiple_of
        return -(-length // multiple) * multiple if multiple else length

    def _pad(self, rows: list[list[int]], value: int) -> torch.Tensor:
        length = self._padded_length(rows)
        return torch.tensor([list(r) + [value] * (length - len(r)) for r in rows], dtype=torch.long)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not features:
            raise ValueError("cannot collate an empty batch")
        input_ids = [f["input_ids"] for f in features]
        masks = [f["attention_mask"] if "attention_mask" in f else [1] * len(f["input_ids"]) for f in features]
        batch = {"input_ids": self._pad(input_ids, self.pad_token_id), "attention_mask": self._pad(masks, 0)}
        if "labels" in features[0]:
            batch["labels"] = self._pad([f["labels"] for f in features], LABEL_PAD_ID)
        return batch


def seq2seq_collator(tokenizer: PreTrainedTokenizerBase, pad_to_multiple_of: int | None = None) -> Seq2SeqCollator:
    """A collator for ``preprocess_seq2seq`` rows: right padding, labels padded with IGNORE_INDEX."""
    return Seq2SeqCollator(_required_id(tokenizer, "pad"), pad_to_multiple_of)
