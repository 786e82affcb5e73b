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

PREPROCESSING_VERSION = "1"  # bump when the output of a function here changes
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
    """Tokenize each non-empty document and append EOS (empty or missing documents are skipped)."""
    texts = [t for t in batch["text"] if t]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    return {"ids": [doc + [eos_id] for doc in ids]}


def _pack(documents: Any, block_size: int, pad_id: int, drop_remainder: bool) -> Iterator[dict]:
    """Concatenate the documents' ids and cut them into ``block_size`` blocks, carrying over batches."""
    buffer: list[int] = []
    for batch in documents.iter(batch_size=1000):
        for doc in batch["ids"]:
            buffer.extend(doc)
        full = len(buffer) // block_size * block_size
        for start in range(0, full, block_size):
            block = buffer[start : start + block_size]
            yield {"input_ids": block, "labels": block}
        buffer = buffer[full:]
    if buffer and not drop_remainder:
        padding = block_size - len(buffer)
        yield {"input_ids": buffer + [pad_id] * padding, "labels": buffer + [LABEL_PAD_ID] * padding}


def tokenize_and_pack(
    dataset_dict: AnyDatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    *,
    num_proc: int | None = None,
    drop_remainder: bool = True,
) -> AnyDatasetDict:
    """Tokenize the ``text`` column, append EOS to each document and pack into ``block_size`` blocks.

    Blocks span document boundaries, so no token is lost except at the very end of each split: with
    ``drop_remainder=True`` (default) the last ``< block_size`` tokens of a split are dropped; with
    False they form a last block right-padded with ``<pad>`` (labels ``IGNORE_INDEX``). Padding at the end of
    a causal block is never attended to by real tokens. ``labels`` equal ``input_ids``; the model
    shifts them. Every row is exactly ``block_size`` long.
    """
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    eos_id = _required_id(tokenizer, "eos")
    pad_id = eos_id if drop_remainder else _required_id(tokenizer, "pad")
    tok_key = tokenizer_fingerprint(tokenizer)
    out = {}
    for name, split in dataset_dict.items():
        if "text" not in (split.column_names or []):
            raise ValueError(f"split {name!r} has no 'text' column (columns: {split.column_names}); use load_corpus")
        fn_kwargs = {"tokenizer": tokenizer, "eos_id": eos_id}
        pack_kwargs = {"block_size": block_size, "pad_id": pad_id, "drop_remainder": drop_remainder}
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
                fingerprint=_fingerprint(docs, "pack", block_size, pad_id, drop_remainder),
            )
        except ValueError as err:  # datasets refuses to build a split with no rows
            if "corresponds to no data" not in str(err):
                raise
            total = sum(len(ids) for ids in docs["ids"])
            raise ValueError(
                f"split {name!r} has {total} tokens, fewer than block_size={block_size}: no block was made. "
                "Lower block_size, use more data, or pass drop_remainder=False."
            ) from err
        out[name] = packed
    return IterableDatasetDict(out) if isinstance(dataset_dict, IterableDatasetDict) else DatasetDict(out)


# --- seq2seq ------------------------------------------------------------------------------------


def _tokenize_pairs(
    batch: dict[str, list], tokenizer: PreTrainedTokenizerBase, eos_id: int, max_source: int, max_target: int
) -> dict:
    """Source and target ids, each truncated to its maximum length including the final EOS."""
    sources = tokenizer([t or "" for t in batch["source"]], add_special_tokens=False)["input_ids"]
    targets = tokenizer([t or "" for t in batch["target"]], add_special_tokens=False)["input_ids"]
    input_ids = [ids[: max_source - 1] + [eos_id] for ids in sources]
    return {
        "input_ids": input_ids,
        "attention_mask": [[1] * len(ids) for ids in input_ids],
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

    Both sides end with EOS and are truncated to the given lengths (EOS included). No BOS is added to
    labels: the model builds ``decoder_input_ids`` by shifting labels right after the start token.
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
