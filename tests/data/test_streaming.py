"""Streaming training data: blocks packed on the fly, exact resume, per-process parts, fixed validation;
and the scalable in-memory preparation (dtype, one packed copy, collator-derived labels)."""

from __future__ import annotations

import itertools
from pathlib import Path

import datasets
import numpy as np
import pytest

from hf_minitx.data import documents, iter_training_texts, load_corpus, text_files, tokenize_and_pack
from hf_minitx.data.preprocessing import block_collator, encode_rows, token_dtype
from hf_minitx.data.streaming import (
    PackedBlockStream,
    held_out_blocks,
    load_stream_state,
    restore_stream_position,
    save_stream_position,
    save_stream_state,
)
from hf_minitx.data.tokenizer import train_bpe_tokenizer
from hf_minitx.training.arguments import DataArguments, validation_split_value

WORDS = "amber birch cedar delta ember fjord grove heron inlet juniper kelp larch".split()


def document(i: int) -> str:
    """A distinct document of a few lines (its number spelled in the first line)."""
    words = [WORDS[(i * 7 + j) % len(WORDS)] for j in range(30)]
    return f"doc {i} begins\n" + "\n".join(" ".join(words[k : k + 6]) for k in range(0, 30, 6)) + "\n"


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stream")
    for f in range(3):
        (folder / f"part{f}.txt").write_text("".join(document(f * 40 + i) for i in range(40)))
    return folder


@pytest.fixture(scope="module")
def tokenizer(corpus_dir):
    texts = [p.read_text() for p in sorted(corpus_dir.glob("*.txt"))]
    return train_bpe_tokenizer(texts * 2, vocab_size=300, min_frequency=1)


@pytest.fixture
def small_rows(monkeypatch):
    monkeypatch.setattr(text_files, "TEXT_CHUNK_CHARS", 300)  # several rows per file


def take(stream, n: int) -> list[list[int]]:
    blocks = iter(stream)
    return [next(blocks).tolist() for _ in range(n)]


def test_encode_rows_gives_the_tokenizer_ids_and_eos_only_at_document_ends(tokenizer):
    texts = ["hello amber\n", "", "birch cedar"]
    arrays = encode_rows(texts, [False, True, True], tokenizer, tokenizer.eos_token_id, np.dtype(np.uint16))
    assert arrays[0].tolist() == tokenizer(texts[0], add_special_tokens=False)["input_ids"]
    assert arrays[1].size == 0
    assert arrays[2].tolist() == tokenizer(texts[2], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32


def test_encoding_long_rows_with_a_saved_tokenizer_warns_of_no_model_length(tokenizer, tmp_path):
    """A tokenizer loaded from a folder has padding set on its backend, so rows go through the wrapper; rows
    longer than model_max_length are cut into blocks later and must not warn of indexing errors."""
    from transformers import AutoTokenizer
    from transformers.testing_utils import CaptureLogger
    from transformers.tokenization_utils_base import logger

    tokenizer.model_max_length = 8
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    loaded.backend_tokenizer.enable_padding(pad_id=loaded.pad_token_id, pad_token=loaded.pad_token)
    text = "hello amber birch cedar " * 10
    with CaptureLogger(logger) as captured:
        arrays = encode_rows([text], [True], loaded, loaded.eos_token_id, np.dtype(np.uint16))
    assert arrays[0].size > 8 and arrays[0].tolist()[:-1] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert "longer than the specified maximum" not in captured.out


def test_streamed_text_blocks_are_the_map_style_blocks(corpus_dir, tokenizer, small_rows):
    """Text files stream with the same documents, newlines and EOS as the in-memory path."""
    glob = str(corpus_dir / "*.txt")
    eager = tokenize_and_pack(load_corpus(glob, validation_split=0.2), tokenizer, 16)["train"]
    lazy = load_corpus(glob, validation_split=0.2, streaming=True)["train"]
    stream = PackedBlockStream(lazy, tokenizer, 16, shuffle_buffer=0)
    # the same rows in the same order: the same blocks (the in-memory carve is by documents, the
    # streaming one by rows, so compare against the streaming rows packed in memory)
    rows = datasets.Dataset.from_list(list(lazy), features=documents.TEXT_ROW_FEATURES)
    packed = tokenize_and_pack(datasets.DatasetDict(train=rows), tokenizer, 16)["train"]
    assert take(stream, len(packed)) == [list(r) for r in packed["input_ids"]]
    assert stream.epoch == 0 and len(eager) > 0
    assert packed.features["input_ids"].feature.dtype == "uint16"


@pytest.mark.parametrize("form", ["txt", "jsonl"])
def test_resume_from_a_saved_position_is_exact(tmp_path, corpus_dir, tokenizer, small_rows, form):
    if form == "jsonl":
        import json
        with open(tmp_path / "docs.jsonl", "w") as handle:
            for i in range(60):
                handle.write(json.dumps({"text": document(i)}) + "\n")
        source = str(tmp_path / "docs.jsonl")
    else:
        source = str(corpus_dir / "*.txt")
    rows = load_corpus(source, validation_split=0.1, streaming=True)["train"]
    settings = {"shuffle_buffer": 9, "seed": 3}
    reference = take(PackedBlockStream(rows, tokenizer, 12, **settings), 700)  # more than one epoch
    for cut in (0, 1, 50, 333):
        first = PackedBlockStream(rows, tokenizer, 12, **settings)
        head = take(first, cut)
        save_stream_state(first.state_dict(), tmp_path / "state.npz")
        second = PackedBlockStream(rows, tokenizer, 12, **settings)
        second.load_state_dict(load_stream_state(tmp_path / "state.npz"))
        assert head + take(second, 700 - cut) == reference, f"resume after {cut} blocks differs"
    stream = PackedBlockStream(rows, tokenizer, 12, **settings)
    take(stream, 700)
    assert stream.epoch >= 1, "the test must cross an epoch boundary"


def test_a_position_of_other_settings_is_refused(corpus_dir, tokenizer):
    rows = load_corpus(str(corpus_dir / "*.txt"), streaming=True)["train"]
    state = PackedBlockStream(rows, tokenizer, 12, shuffle_buffer=4).state_dict()
    with pytest.raises(ValueError, match="shuffle buffer"):
        PackedBlockStream(rows, tokenizer, 12, shuffle_buffer=8).load_state_dict(state)


def test_a_checkpoint_holds_each_process_position_and_resumes_it(tmp_path, corpus_dir, tokenizer):
    """The position a checkpoint save writes (one file per process, renamed into place) continues the stream at
    the very next block; a process whose position is missing is refused by name."""
    rows = load_corpus(str(corpus_dir / "*.txt"), streaming=True)["train"]
    settings = {"shuffle_buffer": 5, "seed": 2, "num_processes": 2, "process_index": 0}
    first = PackedBlockStream(rows, tokenizer, 12, **settings)
    take(first, 40)
    checkpoint = tmp_path / "checkpoint-3"
    save_stream_position(first.state_dict(), checkpoint, 0)
    assert sorted(p.name for p in checkpoint.iterdir()) == ["stream_state_0.npz"]  # no .tmp left
    second = PackedBlockStream(rows, tokenizer, 12, **settings)
    restore_stream_position(second, checkpoint, 0)
    assert take(second, 30) == take(first, 30)
    with pytest.raises(ValueError, match=r"is incomplete: .*stream_state_1.npz is missing .*copy the checkpoint whole"):
        restore_stream_position(PackedBlockStream(rows, tokenizer, 12, **{**settings, "process_index": 1}),
                                checkpoint, 1)


def test_epochs_shuffle_differently_and_repeat_no_block(corpus_dir, tokenizer, small_rows):
    rows = load_corpus(str(corpus_dir / "*.txt"), streaming=True)["train"]
    stream = PackedBlockStream(rows, tokenizer, 16, shuffle_buffer=50, seed=1)
    blocks = iter(stream)
    epochs: dict[int, list] = {}
    while stream.epoch < 2:
        block = next(blocks).tolist()
        epochs.setdefault(stream.epoch, []).append(tuple(block))
    first, second = epochs[0], epochs[1][:-1] + [epochs[1][-1]]
    unshuffled = take(PackedBlockStream(rows, tokenizer, 16, shuffle_buffer=0), len(first))
    # a permutation of the stream's blocks: none comes twice (or is lost) within an epoch
    assert sorted(first) == sorted(map(tuple, unshuffled))
    assert first != [tuple(b) for b in unshuffled] and first[: len(second)] != second


def test_processes_read_disjoint_parts_of_the_stream(corpus_dir, tokenizer, small_rows):
    rows = load_corpus(str(corpus_dir / "*.txt"), streaming=True, validation_split=0.25)["train"]
    seen = []
    for rank in range(2):
        stream = PackedBlockStream(rows, tokenizer, 8, shuffle_buffer=0, num_processes=2, process_index=rank)
        blocks = iter(stream)
        mine = []
        while stream.epoch == 0:
            mine.append(tokenizer.decode(next(blocks)))
        seen.append("".join(mine[:-1]))
    docs = [[d for d in text.split("doc ")[1:]] for text in seen]
    numbers = [{int(d.split()[0]) for d in part if d.split() and d.split()[0].isdigit()} for part in docs]
    assert numbers[0] and numbers[1] and not numbers[0] & numbers[1], "a document was read by both processes"


def test_held_out_blocks_are_the_first_evaluation_blocks(corpus_dir, tokenizer, small_rows):
    stream_val = load_corpus(str(corpus_dir / "*.txt"), streaming=True, validation_split=5)["validation"]
    rows = datasets.Dataset.from_list(list(stream_val), features=documents.TEXT_ROW_FEATURES)
    full = tokenize_and_pack(datasets.DatasetDict(validation=rows), tokenizer, 16, for_evaluation=True)["validation"]
    held = held_out_blocks(stream_val, tokenizer, 16, max_blocks=10)
    assert len(held) == 10 and held["input_ids"] == full["input_ids"][:10]
    everything = held_out_blocks(stream_val, tokenizer, 16, max_blocks=10**6)
    assert everything["input_ids"] == full["input_ids"]


@pytest.mark.parametrize("pattern", ["*.txt", "part0.txt"])  # documents; one document, validation its tail
def test_text_files_leave_no_copy_of_their_text_in_the_cache(tmp_path, monkeypatch, corpus_dir, tokenizer, pattern):
    cache = tmp_path / "cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    corpus = load_corpus(str(corpus_dir / pattern))
    assert all(not split.cache_files for split in corpus.values()), "the text rows were written to the cache"
    packed = tokenize_and_pack(corpus, tokenizer, 16)
    written = sorted(p for p in cache.rglob("*") if p.is_file() and p.stat().st_size)
    assert written == sorted(Path(split.cache_files[0]["filename"]) for split in packed.values())
    tokens = sum(len(split) * 16 for split in packed.values())
    assert sum(p.stat().st_size for p in written) < 2 * tokens + 2048 * len(written)  # uint16 ids and a header


def test_text_too_large_for_memory_is_cached_once_with_the_same_rows(tmp_path, monkeypatch, corpus_dir):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    held = load_corpus(str(corpus_dir / "part1.txt"))
    monkeypatch.setattr(documents, "IN_MEMORY_SHARE", 10**15)  # as if the text were larger than memory
    cached = load_corpus(str(corpus_dir / "part1.txt"))
    for name in ("train", "validation"):
        assert cached[name].cache_files and not held[name].cache_files
        assert cached[name]._fingerprint == held[name]._fingerprint
        assert cached[name].to_list() == held[name].to_list()


def test_in_memory_preparation_leaves_one_packed_copy(tmp_path, monkeypatch, corpus_dir, tokenizer):
    cache = tmp_path / "cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    corpus = load_corpus(str(corpus_dir / "*.txt"))
    packed = tokenize_and_pack(corpus, tokenizer, 16, num_proc=2)
    blocks_dir = cache / "hf_minitx_blocks"
    assert sorted(p.name for p in blocks_dir.iterdir()) == sorted(
        Path(split.cache_files[0]["filename"]).name for split in packed.values()), "intermediate files were left"
    batch = block_collator(tokenizer)([packed["train"][0], packed["train"][1]])
    assert batch["input_ids"].dtype.is_floating_point is False and batch["labels"].equal(batch["input_ids"])
    assert packed["train"].features["input_ids"].feature.dtype == "uint16"


def test_tokenizer_texts_can_be_capped_by_characters(corpus_dir):
    split = load_corpus(str(corpus_dir / "*.txt"), streaming=True)["train"]
    texts = list(iter_training_texts(split, max_chars=100))
    assert len(texts) == 1 and len(texts[0]) > 100  # stops after the text that reaches the cap
    assert len(list(iter_training_texts(split))) == 2  # three one-row files, the first row held out


def test_streaming_options_and_validation_counts():
    names = set(DataArguments.__dataclass_fields__)
    assert {"streaming", "shuffle_buffer", "tokenizer_max_chars"} <= names
    assert all(f.metadata.get("help") for f in DataArguments.__dataclass_fields__.values())
    assert validation_split_value(100.0) == 100 and isinstance(validation_split_value(100.0), int)
    assert validation_split_value(0.05) == 0.05


def test_batches_stack_blocks(corpus_dir, tokenizer):
    rows = load_corpus(str(corpus_dir / "*.txt"), streaming=True)["train"]
    stream = PackedBlockStream(rows, tokenizer, 16, shuffle_buffer=0)
    batch = next(stream.batches(4))
    assert batch["input_ids"].shape == batch["labels"].shape == (4, 16)
    assert stream.blocks_yielded == 4
    assert list(itertools.chain(*batch["input_ids"].tolist())) == list(itertools.chain(*take(
        PackedBlockStream(rows, tokenizer, 16, shuffle_buffer=0), 4)))


def test_a_csv_never_loaded_before_streams_with_its_columns(tmp_path, monkeypatch):
    """datasets streams a CSV without knowing its columns until it reads it (column_names None); a fresh file
    (an empty datasets cache) was refused as having no 'text' column."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    rows = [f"row {i}: NA stays text, and so does null {i}" for i in range(40)]
    path = tmp_path / "fresh.csv"
    path.write_text("text\n" + "".join(f'"{row}"\n' for row in rows))
    splits = load_corpus(str(path), streaming=True, validation_split=4)
    streamed = [r["text"] for r in itertools.chain(splits["validation"], splits["train"])]
    assert sorted(streamed) == sorted(rows)
