"""Turn normalised corpora into model inputs: packed causal-LM blocks and seq2seq pairs.

Results are cached by datasets under fingerprints computed from the input split, the tokenizer's
content and the arguments, so a second run with the same inputs does not tokenize again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import torch
from datasets import Dataset, DatasetDict, Features, IterableDataset, IterableDatasetDict, Sequence, Value
from datasets.fingerprint import Hasher
from transformers import PreTrainedTokenizerBase

from ..models.modeling_minitx import IGNORE_INDEX

PREPROCESSING_VERSION = "2"  # bump when the output of a function here changes
LABEL_PAD_ID = IGNORE_INDEX
BLOCK_FEATURES = Features({"input_ids": Sequence(Value("int64")), "labels": Sequence(Value("int64"))})

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


def _tokenize_documents(batch: dict[str, list], tokenizer: PreTrainedTokenizerBase, eos_id: int) -> dict:
    """Tokenize each non-empty row; EOS follows a row that ends a document (``doc_end``, default True).

    No special token is added inside a document: a causal tokenizer's post-processor adds none, so these
    ids are what ``tokenizer(document)`` gives.
    """
    ends = batch.get("doc_end") or [True] * len(batch["text"])
    rows = [(text, end) for text, end in zip(batch["text"], ends, strict=True) if text]
    ids = tokenizer([text for text, _ in rows], add_special_tokens=False)["input_ids"] if rows else []
    return {"ids": [doc + [eos_id] if end else doc for doc, (_, end) in zip(ids, rows, strict=True)]}


def _pack(
    documents: Any, block_size: int, pad_id: int, drop_remainder: bool, overlap: int = 0, prefix: tuple = ()
) -> Iterator[dict]:
    """Concatenate the documents' ids (after ``prefix``) and cut them into ``block_size`` blocks, carrying
    over batches; consecutive blocks share ``overlap`` tokens. The rest is dropped or right-padded."""
    buffer: list[int] = list(prefix)
    step = block_size - overlap
    for batch in documents.iter(batch_size=1000):
        for doc in batch["ids"]:
            buffer.extend(doc)
        start = 0
        while len(buffer) - start >= block_size:
            block = buffer[start : start + block_size]
            yield {"input_ids": block, "labels": block}
            start += step
        buffer = buffer[start:]
    if len(buffer) > overlap and not drop_remainder:
        padding = block_size - len(buffer)
        yield {"input_ids": buffer + [pad_id] * padding, "labels": buffer + [LABEL_PAD_ID] * padding}


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
    right-padded with ``<pad>`` (labels ``IGNORE_INDEX``). ``labels`` equal ``input_ids``; the model shifts them.
    Every row is exactly ``block_size`` long.

    ``for_evaluation=True`` makes every token of a split predicted exactly once: the stream starts
    with EOS (the context of a document start), consecutive blocks share one token, and the last
    partial block is kept (padded).
    """
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    eos_id = _required_id(tokenizer, "eos")
    drop_remainder = drop_remainder and not for_evaluation
    pad_id = eos_id if drop_remainder else _required_id(tokenizer, "pad")
    tok_key = tokenizer_fingerprint(tokenizer)
    out = {}
    for name, split in dataset_dict.items():
        if "text" not in (split.column_names or []):
            raise ValueError(f"split {name!r} has no 'text' column (columns: {split.column_names}); use load_corpus")
        fn_kwargs = {"tokenizer": tokenizer, "eos_id": eos_id}
        pack_kwargs = {"block_size": block_size, "pad_id": pad_id, "drop_remainder": drop_remainder,
                       "overlap": int(for_evaluation), "prefix": (eos_id,) if for_evaluation else ()}
        if isinstance(split, IterableDataset):
            docs = split.map(_tokenize_documents, batched=True, remove_columns=split.column_names,
                             fn_kwargs=fn_kwargs)
            out[name] = IterableDataset.from_generator(
                _pack, features=BLOCK_FEATURES, gen_kwargs={"documents": docs, **pack_kwargs}
            )
            continue
        docs = split.map(
            _tokenize_documents,
            batched=True,
            num_proc=num_proc,
            remove_columns=split.column_names,
            fn_kwargs=fn_kwargs,
            new_fingerprint=_fingerprint(split, "tokenize", tok_key),
            desc=f"Tokenizing {name}",
        )
        try:
            packed = Dataset.from_generator(
                _pack,
                features=BLOCK_FEATURES,
                gen_kwargs={"documents": docs, **pack_kwargs},
                fingerprint=_fingerprint(docs, "pack", block_size, pad_id, drop_remainder, for_evaluation),
            )
        except ValueError as err:  # datasets refuses to build a split with no rows
            if "corresponds to no data" not in str(err):
                raise
            total = sum(len(ids) for ids in docs["ids"])
            raise ValueError(
                f"split {name!r} has {total} tokens in {len(split)} rows, fewer than block_size={block_size}: no "
                "block was made. Lower --block_size or use more data (if the file should hold more rows, check "
                "how it parsed, e.g. its quoting)."
            ) from err
        out[name] = packed
    return IterableDatasetDict(out) if isinstance(dataset_dict, IterableDatasetDict) else DatasetDict(out)


# --- seq2seq ------------------------------------------------------------------------------------


def _tokenize_pairs(
    batch: dict[str, list], tokenizer: PreTrainedTokenizerBase, eos_id: int, max_source: int, max_target: int
) -> dict:
    """Sources exactly as ``tokenizer(sources, truncation=True, max_length=max_source)`` encodes them
    (the saved tokenizer is the one source of truth for the encoder's input: its post-processor adds
    EOS); labels are target ids + EOS, truncated to ``max_target`` including the EOS."""
    encoded = tokenizer([t or "" for t in batch["source"]], truncation=True, max_length=max_source)
    targets = tokenizer([t or "" for t in batch["target"]], add_special_tokens=False)["input_ids"]
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
    (ignored by the loss). The tokenizer's own ``padding_side`` ("left", for generation) is ignored
    on purpose: labels must be right-padded so that the shifted decoder inputs stay aligned.
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
