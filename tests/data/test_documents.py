"""Text corpora keep their text: rows, documents, EOS only between documents, honest validation figures,
and saved tokenizers that encode exactly what training saw."""

from __future__ import annotations

import json
import math
from pathlib import Path

import datasets
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_minitx.data import load_corpus, preprocess_seq2seq, rows_from_lines, text_files, tokenize_and_pack
from hf_minitx.data.documents import SAMPLE_BY, TEXT_ROW_FEATURES, as_samples
from hf_minitx.data.preprocessing import block_collator
from hf_minitx.data.tokenizer import train_bpe_tokenizer
from hf_minitx.models.configuration_minitx import IGNORE_INDEX

PLAY = "ACT I\r\n\r\nHAMLET.\nWho's there?\n\n\nHORATIO.\n  Friends to this ground.\n\t\nHAMLET.\nGood night"


@pytest.fixture(autouse=True)
def isolated_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.getbasetemp() / "hf_cache"))


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer([PLAY * 3, "Friends, good night.\n" * 5], vocab_size=300, min_frequency=1)


def texts(split) -> str:
    return "".join(split["text"])


def documents(split) -> list[str]:
    """The documents of a split: its rows joined up to each ``doc_end``."""
    docs, current = [], ""
    for text, end in zip(split["text"], split["doc_end"], strict=True):
        current += text
        if end:
            docs, current = [*docs, current], ""
    return docs


def write(path: Path, text: str) -> str:
    path.write_bytes(text.encode("utf-8"))
    return str(path)


def variants(i: int) -> str:
    return PLAY.replace("HAMLET", f"HAMLET{i}") + "\n" * (i % 2)


# --- rows ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [16, 1 << 20])
def test_every_form_of_text_files_gives_rows_that_are_the_files(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(text_files, "TEXT_CHUNK_CHARS", chunk)
    files = [write(tmp_path / f"{name}.txt", variants(i)) for i, name in enumerate(["a", "b", "c"])]
    folder = tmp_path / "play"
    folder.mkdir()
    write(folder / "train.txt", variants(0))
    write(folder / "validation.txt", variants(1))

    dd = load_corpus(str(folder))
    assert texts(dd["train"]) == variants(0) and texts(dd["validation"]) == variants(1)
    for spec in (",".join(files), str(tmp_path / "*.txt")):
        dd = load_corpus(spec, validation_split=1)
        assert len(documents(dd["validation"])) == 1  # whole files go to validation
        assert sorted(documents(dd["train"]) + documents(dd["validation"])) == [variants(i) for i in range(3)]
    rows = load_corpus(str(folder))["train"]
    assert rows["doc_end"][-1] and not any(rows["doc_end"][:-1])
    if chunk == 16:
        assert len(rows) > 1  # a long file is read in several rows


def test_a_single_file_is_one_document_and_validation_is_its_tail(tmp_path):
    text = "".join(f"line {i} of the only document\n" + ("\n" if i % 5 == 0 else "") for i in range(200))
    dd = load_corpus(write(tmp_path / "one.txt", text), validation_split=0.1)
    train, validation = texts(dd["train"]), texts(dd["validation"])
    assert train + validation == text and train.endswith("\n")
    assert 0.09 * len(text) <= len(validation) <= 0.12 * len(text)
    assert dd["train"]["doc_end"][-1] is False and dd["validation"]["doc_end"][-1] is True
    with pytest.raises(ValueError, match="single document"):
        load_corpus(str(tmp_path / "one.txt"), validation_split=3)


def test_sample_by_paragraph_and_line_on_text_files_and_on_records(tmp_path):
    text = "a b\nc\n\n\nd e\nf\n"
    path = write(tmp_path / "t.txt", text)
    folder = tmp_path / "f"
    folder.mkdir()
    write(folder / "train.txt", text)
    write(folder / "validation.txt", "z\n")
    train = load_corpus(str(folder), sample_by="paragraph")["train"]
    assert train["text"] == ["a b\nc\n\n\n", "d e\nf\n"] and all(train["doc_end"])
    train = load_corpus(str(folder), sample_by="line")["train"]
    assert train["text"] == ["a b\n", "c\n", "\n", "\n", "d e\n", "f\n"]
    assert len(load_corpus(path, sample_by="paragraph", validation_split=1)["validation"]) == 1
    # wikitext style: a record row is a line (with or without its line break); blank rows end paragraphs
    rows = tmp_path / "wiki.jsonl"
    rows.write_text("".join(json.dumps({"text": t}) + "\n" for t in [" = T = \n", "", "x y\n", "z", "", "w\n"]))
    (tmp_path / "wv.jsonl").write_text(json.dumps({"text": "v"}) + "\n")
    spec = {"train": str(rows), "validation": str(tmp_path / "wv.jsonl")}
    wiki = datasets.load_dataset("json", data_files=spec)
    paragraphs = as_samples(wiki["train"].select_columns(["text"]), "paragraph")
    assert paragraphs["text"] == [" = T = \n\n", "x y\nz\n\n", "w\n"] and all(paragraphs["doc_end"])
    documents = as_samples(wiki["train"].select_columns(["text"]))
    assert documents["text"] == [" = T = \n", "", "x y\n", "z", "", "w\n"] and all(documents["doc_end"])


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab \n\r\t\u00e9\u4e2d"), max_size=120),
       st.sampled_from(SAMPLE_BY), st.integers(1, 12))
def test_rows_concatenate_to_the_text_and_chunks_end_only_inside_samples(text, sample_by, chunk):
    lines = text.splitlines(keepends=True)
    rows = list(rows_from_lines(lines, sample_by, chunk))
    assert "".join(r["text"] for r in rows) == text
    assert all(r["text"] for r in rows) and (not rows or rows[-1]["doc_end"])
    if sample_by == "document":
        assert sum(r["doc_end"] for r in rows) == (1 if rows else 0)


# --- packing -----------------------------------------------------------------------------------------


def packed_stream(rows: list[dict], tokenizer, block: int, **kwargs) -> tuple[list[int], list]:
    dd = datasets.DatasetDict(train=datasets.Dataset.from_list(rows, features=TEXT_ROW_FEATURES))
    blocks = tokenize_and_pack(dd, tokenizer, block, drop_remainder=False, **kwargs)["train"]
    labels = block_collator(tokenizer)(list(blocks))["labels"]
    return [t for t in labels.flatten().tolist() if t != IGNORE_INDEX], blocks


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<"),
                        min_size=1, max_size=60), min_size=1, max_size=5),
       st.integers(1, 20), st.integers(2, 9))
def test_packing_keeps_every_byte_and_puts_eos_only_between_documents(tokenizer, documents, chunk, block):
    rows = [row for doc in documents for row in rows_from_lines(doc.splitlines(keepends=True), "document", chunk)]
    stream, _ = packed_stream(rows, tokenizer, block)
    eos = tokenizer.eos_token_id
    assert stream.count(eos) == len(documents) and stream[-1] == eos
    pieces, current = [], []
    for token in stream:
        if token == eos:
            pieces.append(tokenizer.decode(current))
            current = []
        else:
            current.append(token)
    assert pieces == documents


def test_evaluation_blocks_predict_every_token_once(tokenizer):
    rows = [{"text": variants(i), "doc_end": True} for i in range(3)]
    plain, _ = packed_stream(rows, tokenizer, 7)
    _, blocks = packed_stream(rows, tokenizer, 7, for_evaluation=True)
    labels = block_collator(tokenizer)(list(blocks))["labels"][:, 1:]
    predicted = [t for t in labels.flatten().tolist() if t != IGNORE_INDEX]
    assert blocks[0]["input_ids"][0] == tokenizer.eos_token_id  # the first token has a document start as context
    assert predicted == plain
    blocks = list(blocks)
    assert all(a["input_ids"][-1] == b["input_ids"][0] for a, b in zip(blocks, blocks[1:], strict=False))


def test_folder_round_trip_through_load_corpus_and_packing(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(text_files, "TEXT_CHUNK_CHARS", 24)
    folder = tmp_path / "plays"
    folder.mkdir()
    write(folder / "train.txt", variants(0) + variants(3))  # odd whitespace: some cuts are forced
    write(folder / "validation.txt", play_corpus(12, 0))  # ordinary lines: every cut is clean
    dd = load_corpus(str(folder))
    assert len(dd["train"]) > 1 and len(dd["validation"]) > 1
    packed = tokenize_and_pack(dd, tokenizer, 8, drop_remainder=False)
    for name, path in (("train", folder / "train.txt"), ("validation", folder / "validation.txt")):
        labels = block_collator(tokenizer)(list(packed[name]))["labels"]
        ids = [t for t in labels.flatten().tolist() if t != IGNORE_INDEX]
        text = path.read_bytes().decode("utf-8")
        assert tokenizer.decode(ids) == text + tokenizer.eos_token
    # chunks are cut where byte-level BPE splits anyway: the ids are those of the whole document
    assert ids == tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]


# --- end to end: saved folders encode what training saw, figures are what a user gets ----------------


def play_corpus(speeches: int, seed: int) -> str:
    """A play-like text: speaker lines, short verse lines, a blank line between speeches."""
    gen = torch.Generator().manual_seed(seed)
    names = ["HAMLET", "HORATIO", "OPHELIA"]
    words = "the night is cold and my lord speaks of ghosts upon the wall tonight".split()
    parts = []
    for _ in range(speeches):
        name = names[int(torch.randint(0, 3, (1,), generator=gen))]
        lines = []
        for _ in range(int(torch.randint(1, 3, (1,), generator=gen))):
            idx = torch.randint(0, len(words), (int(torch.randint(3, 7, (1,), generator=gen)),), generator=gen)
            lines.append(" ".join(words[int(i)] for i in idx).capitalize() + ".")
        parts.append(f"{name}.\n" + "\n".join(lines) + "\n")
    return "\n".join(parts)


@pytest.fixture
def fresh_accelerate():
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def run(args: list[str]) -> Path:
    from hf_minitx.training.loop import main

    return main([*args, "--preset", "tiny", "--eval_steps", "0", "--disable_tqdm", "--num_threads", "1",
                 "--logging_steps", "5", "--num_sample_generations", "1"])


@torch.no_grad()
def independent_bits_per_byte(model, tokenizer, text: str, window: int) -> float:
    """Score a text from scratch: EOS as context, then every token, in windows of the trained length."""
    ids = [tokenizer.eos_token_id, *tokenizer(text)["input_ids"], tokenizer.eos_token_id]
    nats = 0.0
    for start in range(0, len(ids) - 1, window - 1):
        chunk = torch.tensor([ids[start : start + window]])
        logits = model(chunk).logits[0, :-1]
        nats += torch.nn.functional.cross_entropy(logits.double(), chunk[0, 1:], reduction="sum").item()
    return nats / (math.log(2) * len(text.encode("utf-8")))


@pytest.mark.slow
def test_causal_folder_run_reports_honest_figures_and_its_tokenizer_encodes_like_training(
        tmp_path, fresh_accelerate):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path / "plays"
    folder.mkdir()
    (folder / "train.txt").write_text(play_corpus(300, 0))
    (folder / "validation.txt").write_text(play_corpus(30, 1))
    out = run(["--dataset", str(folder), "--output_dir", str(tmp_path / "run"), "--tokenizer_vocab_size", "300",
               "--block_size", "64", "--max_steps", "40", "--per_device_train_batch_size", "8",
               "--learning_rate", "3e-3", "--warmup_steps", "5"])
    summary = json.loads((out / "training_summary.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    validation = (folder / "validation.txt").read_text()
    coverage = summary["evaluation"]
    assert coverage["whole_split"] and coverage["bytes"] == len(validation.encode("utf-8"))
    assert coverage["tokens"] == len(tokenizer(validation)["input_ids"]) + 1  # every token and the final EOS
    assert coverage["rows"] == math.ceil(coverage["tokens"] / 63)  # blocks of 64 overlap by one: 63 new each
    reported = summary["final_metrics"]["eval_bits_per_byte"]
    assert reported == pytest.approx(independent_bits_per_byte(model, tokenizer, validation, 64), rel=0.02)
    assert f"{coverage['bytes']:,} UTF-8 bytes" in (out / "README.md").read_text()
    # the saved tokenizer encodes a document exactly as training's packing did (no BOS, EOS at the end)
    train = (folder / "train.txt").read_text()
    packed = tokenize_and_pack(load_corpus(str(folder)), tokenizer, 64)["train"]
    stream = [t for block in packed for t in block["input_ids"]]
    assert stream == (tokenizer(train)["input_ids"] + [tokenizer.eos_token_id])[: len(stream)]


@pytest.mark.slow
def test_seq2seq_folder_exact_match_through_the_plain_hf_path_is_the_reported_one(tmp_path, fresh_accelerate):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    words = "red green blue cat dog sun".split()
    gen = torch.Generator().manual_seed(0)
    pairs = []
    for _ in range(400):
        src = [words[int(i)] for i in torch.randint(0, len(words), (3,), generator=gen)]
        pairs.append({"source": " ".join(src), "target": " ".join(reversed(src))})
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    out = run(["--task", "seq2seq", "--dataset", str(path), "--output_dir", str(tmp_path / "run"),
               "--tokenizer_vocab_size", "280", "--max_source_length", "16", "--max_target_length", "16",
               "--max_steps", "120", "--per_device_train_batch_size", "32", "--learning_rate", "5e-3",
               "--warmup_steps", "10", "--validation_split", "0.1"])
    reported = json.loads((out / "training_summary.json").read_text())["final_metrics"]["eval_exact_match"]
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    corpus = load_corpus(str(path), task="seq2seq", validation_split=0.1)
    sources, targets = list(corpus["validation"]["source"]), list(corpus["validation"]["target"])
    features = preprocess_seq2seq(corpus, tokenizer, max_source_length=16, max_target_length=16)
    assert features["validation"]["input_ids"] == tokenizer(sources)["input_ids"]
    assert all(ids[-1] == tokenizer.eos_token_id for ids in tokenizer(sources)["input_ids"])
    with torch.no_grad():
        generated = model.generate(**tokenizer(sources, return_tensors="pt", padding=True), do_sample=False)
    predictions = [t.strip() for t in tokenizer.batch_decode(generated, skip_special_tokens=True)]
    plain = 100.0 * sum(p == t for p, t in zip(predictions, targets, strict=True)) / len(targets)
    assert plain == pytest.approx(reported)
    assert 10.0 < reported  # the comparison means something: the model gets some pairs right
