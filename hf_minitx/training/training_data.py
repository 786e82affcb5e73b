"""The model-ready data of a `minitx train` run (``PreparedData``): the corpus loaded and its layout recorded, the
train and validation sets tokenized (packed blocks, encoded pairs, or a ``PackedBlockStream`` with validation read
once from its held-out rows), and this process's endless training batches.

A resumed run's corpus must split as its checkpoint's did, with the same validation text (``check_same_layout``),
so that text the run trained on never becomes validation.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from datasets import DatasetDict
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from ..data.corpus import load_corpus, preprocess_seq2seq, seq2seq_collator, tokenize_and_pack
from ..data.preprocessing import block_collator
from ..data.streaming import PackedBlockStream, held_out_blocks, restore_stream_position
from .arguments import DataArguments, TrainArguments, validation_split_value
from .data_order import ShiftedWindows, StepIndexedBatchSampler
from .evaluation import predicted_bytes, text_bytes
from .run_plan import RunPlan

STREAMING_EVAL_BLOCKS = 256  # validation blocks read once from the held-out rows when --max_eval_samples is unset


@dataclass
class PreparedData:
    """What setup hands to the loop: the model-ready splits, their collator, and the texts generation is shown
    (``prompts``) or scored on (seq2seq ``sources`` and ``references``)."""

    train: Any  # packed blocks or encoded pairs (a Dataset); --streaming: the raw rows of the train stream
    validation: Any  # the scored validation rows (blocks or pairs)
    collate: Callable[[list[dict]], dict[str, torch.Tensor]]
    prompts: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    num_bytes: int | None = None  # causal LM: UTF-8 bytes of the validation text the loss covers


def load_training_corpus(plan: RunPlan) -> Any:
    """The ``DatasetDict`` (train, validation) that ``--dataset`` names; its layout is recorded in the run
    identity and, resuming, must be the checkpoint's (``check_same_layout``)."""
    data_args = plan.data_args
    corpus = load_corpus(
        data_args.dataset, task=data_args.task, dataset_config=data_args.dataset_config,
        text_column=data_args.text_column, source_column=data_args.source_column,
        target_column=data_args.target_column, validation_split=validation_split_value(data_args.validation_split),
        seed=plan.train_args.seed, num_examples=data_args.num_examples, sample_by=data_args.sample_by,
        streaming=data_args.streaming, skip_bad_rows=data_args.skip_bad_rows,
    )
    if not data_args.streaming:
        plan.identity[LAYOUT] = corpus_layout(corpus)
        check_same_layout(plan)
    return corpus


LAYOUT = "corpus_layout"  # run identity key: rows of each split, characters and digest of validation
VALIDATION_TEXT = "validation_sha256"  # not in the layout of checkpoints saved before it was recorded


def corpus_layout(corpus: DatasetDict) -> dict[str, Any]:
    """How the corpus splits: the rows of train and validation, and the characters and a digest (sha256 of the
    texts in order) of validation. Training text edited in place keeps it; records added, removed or moved, or
    validation text edited, change what validation holds."""
    columns = [c for c in ("text", "source", "target") if c in corpus["validation"].column_names]
    digest, chars = hashlib.sha256(), 0
    for batch in corpus["validation"].iter(batch_size=10_000):
        for row in zip(*(batch[c] for c in columns), strict=True):
            for text in row:
                chars += len(text or "")
                digest.update((text or "").encode("utf-8", "surrogatepass") + b"\0")  # \0: where each text ends
    return {"train_rows": len(corpus["train"]), "validation_rows": len(corpus["validation"]), "validation_chars": chars,
            VALIDATION_TEXT: digest.hexdigest()}


def streamed_validation_layout(validation: Any, asked: int) -> dict[str, Any]:
    """What a streaming run evaluates on, as a record: the blocks asked (``--max_eval_samples``) and read, and a
    digest (sha256) of their tokens. The blocks are read once from the stream's first held-out rows, so records
    moved in the files change it."""
    ids = np.asarray(validation.with_format("numpy")["input_ids"])  # (blocks, block_size)
    return {"validation_blocks_asked": asked, "validation_blocks": int(ids.shape[0]),
            VALIDATION_TEXT: hashlib.sha256(ids.tobytes()).hexdigest()}


def check_same_layout(plan: RunPlan) -> None:
    """A resumed run's corpus splits as its checkpoint's did, and its validation holds the same text (with
    --accept_changed_inputs too): otherwise text the run trained on could now be in validation. A checkpoint
    saved before the validation digest was recorded is compared on the rest."""
    stored = (plan.resume_state or {}).get(LAYOUT)
    now = plan.identity[LAYOUT]
    if not isinstance(stored, dict):
        return
    changed = [key for key in now if key in stored and stored[key] != now[key]]
    if "validation_blocks_asked" in changed:
        raise ValueError(f"the run of checkpoint {plan.checkpoint} evaluated on --max_eval_samples "
                         f"{stored['validation_blocks_asked']} blocks, this one asks for "
                         f"{now['validation_blocks_asked']}: resume with the --max_eval_samples it had, so that its "
                         "evaluations stay comparable")
    if "validation_blocks" in changed:  # streaming, as many blocks asked: fewer held-out rows
        raise ValueError(f"the run of checkpoint {plan.checkpoint} evaluated on {stored['validation_blocks']} "
                         f"validation blocks, this one would on {now['validation_blocks']}: records were removed or "
                         "text was cut, so validation would hold other text. Restore the input, or start a new run in "
                         "another --output_dir")
    if changed == [VALIDATION_TEXT]:
        raise ValueError(f"the validation text is not the one of checkpoint {plan.checkpoint} (its size is, its text "
                         "is not): records were moved or edited, so validation would now hold other text, possibly "
                         "trained on. Restore the input, or start a new run in another --output_dir")
    if changed:
        diff = "; ".join(f"{k}: checkpoint has {stored[k]}, now {now[k]}" for k in changed if k != VALIDATION_TEXT)
        raise ValueError(f"the corpus no longer splits as in checkpoint {plan.checkpoint} ({diff}): records were "
                         "added or removed, or text was cut, so text the run trained on could now be validated on. "
                         "Restore the input, or start a new run in another --output_dir")


def prepare_data(corpus: Any, tokenizer: PreTrainedTokenizerBase, plan: RunPlan) -> PreparedData:
    """Model-ready train/validation sets, the collator, and the texts that generation is shown or scored on."""
    data_args, train_args = plan.data_args, plan.train_args
    if data_args.streaming:
        data = prepare_streaming_data(corpus, tokenizer, data_args)
        asked = data_args.max_eval_samples or STREAMING_EVAL_BLOCKS
        plan.identity[LAYOUT] = streamed_validation_layout(data.validation, asked)  # a resumed run's must be the same
        check_same_layout(plan)
    elif data_args.task == "causal-lm":
        collate = block_collator(tokenizer)
        train = tokenize_and_pack(DatasetDict(train=corpus["train"]), tokenizer, data_args.block_size,
                                  num_proc=data_args.num_proc)["train"]
        validation = tokenize_and_pack(DatasetDict(validation=corpus["validation"]), tokenizer, data_args.block_size,
                                       num_proc=data_args.num_proc, for_evaluation=True)["validation"]
        if data_args.max_eval_samples is None:  # the whole validation text, as it stands in the corpus
            num_bytes = text_bytes(t for batch in corpus["validation"].iter(1000) for t in batch["text"])
        else:  # opt-in subset: the bytes of the tokens it scores
            validation = _first_rows(validation, data_args.max_eval_samples)
            num_bytes = predicted_bytes(collate(list(validation))["labels"].tolist(), tokenizer)
        prompts = [" ".join(text.split()[:6]) for text in corpus["validation"]["text"][:8] if text.strip()]
        data = PreparedData(train, validation, collate, prompts=prompts, num_bytes=num_bytes)
    else:
        features = preprocess_seq2seq(
            corpus, tokenizer, max_source_length=data_args.max_source_length,
            max_target_length=data_args.max_target_length, num_proc=data_args.num_proc,
        )
        pairs = _first_rows(corpus["validation"], train_args.generation_eval_samples)
        data = PreparedData(features["train"], _first_rows(features["validation"], data_args.max_eval_samples),
                            seq2seq_collator(tokenizer), sources=list(pairs["source"]),
                            references=list(pairs["target"]))  # samples: the first scored pairs, or --sample_prompts
    if train_args.sample_prompts:
        data.prompts = [p.strip() for p in train_args.sample_prompts.split("|") if p.strip()]
    data.prompts = data.prompts[: train_args.num_sample_generations]
    return data


def _first_rows(split: Any, limit: int | None) -> Any:
    return split if limit is None or limit >= len(split) else split.select(range(limit))


def prepare_streaming_data(corpus: Any, tokenizer: PreTrainedTokenizerBase, data_args: DataArguments) -> PreparedData:
    """The train rows (a stream), validation blocks read once from the held-out rows (the first
    ``--max_eval_samples``, default ``STREAMING_EVAL_BLOCKS``), the collator, prompts and scored bytes."""
    collate = block_collator(tokenizer)
    validation = held_out_blocks(corpus["validation"], tokenizer, data_args.block_size,
                                 data_args.max_eval_samples or STREAMING_EVAL_BLOCKS)
    num_bytes = predicted_bytes(collate(list(validation))["labels"].tolist(), tokenizer)
    texts = [row["text"] for row in itertools.islice(corpus["validation"], 8)]
    prompts = [" ".join(text.split()[:6]) for text in texts if text.strip()]
    return PreparedData(corpus["train"], validation, collate, prompts=prompts, num_bytes=num_bytes)


def training_loader(data: PreparedData, train_args: TrainArguments, accelerator: Accelerator, start: int,
                    window: int = 0) -> DataLoader:
    """This process's endless training batches, from global micro-batch ``start`` on (see data_order)."""
    return DataLoader(  # its own generator: iterating must not draw from the global (dropout) RNG
        ShiftedWindows(data.train) if window else data.train, collate_fn=data.collate,
        generator=torch.Generator().manual_seed(train_args.seed),
        batch_sampler=StepIndexedBatchSampler(
            len(data.train), train_args.per_device_train_batch_size, num_processes=accelerator.num_processes,
            process_index=accelerator.process_index, seed=train_args.seed, start=start, window=window,
        ),
    )


def streaming_train_batches(
    data: PreparedData, tokenizer: PreTrainedTokenizerBase, data_args: DataArguments, train_args: TrainArguments,
    accelerator: Accelerator, checkpoint: Path | None,
) -> tuple[Iterator[dict[str, torch.Tensor]], PackedBlockStream]:
    """This process's endless (batch, block) train batches and their stream, continued from the position
    saved in ``checkpoint`` (if any)."""
    stream = PackedBlockStream(
        data.train, tokenizer, data_args.block_size, shuffle_buffer=data_args.shuffle_buffer,
        seed=train_args.seed, num_processes=accelerator.num_processes, process_index=accelerator.process_index)
    if checkpoint is not None:
        restore_stream_position(stream, checkpoint, accelerator.process_index)
    return stream.batches(train_args.per_device_train_batch_size, data.collate), stream


def is_hub_dataset(dataset: str) -> bool:
    """Whether ``--dataset`` names a Hub dataset (not a builtin, not local files)."""
    if dataset.startswith("builtin:") or any(ch in dataset for ch in "*?,"):
        return False
    return not Path(dataset).expanduser().exists()
