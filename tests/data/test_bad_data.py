"""Bad corpora and tokenizer folders end in one clear error that names the problem (issue: bad input sweep)."""

import gzip
import json
from pathlib import Path

import datasets
import pytest
from transformers import AutoTokenizer

from hf_minitx.cli import main as minitx
from hf_minitx.data import load_corpus, tokenize_and_pack, train_bpe_tokenizer
from hf_minitx.data.tokenizer import load_tokenizer

TEXTS = [f"row {i}: a few words of ordinary text, number {i}." for i in range(80)]


@pytest.fixture(autouse=True)
def isolated_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.getbasetemp() / "bad_cache"))


def test_whitespace_only_corpus_has_no_text(tmp_path, capsys):
    corpus = tmp_path / "blank.txt"
    corpus.write_text("   \n\n\t\n   \n" * 50)
    with pytest.raises(ValueError, match="has no text: its .* rows are empty or whitespace only"):
        load_corpus(str(corpus))
    assert minitx(["train-tokenizer", "--dataset", str(corpus), "--output_dir", str(tmp_path / "tok")]) == 2
    assert "has no text" in capsys.readouterr().err
    assert not (tmp_path / "tok").exists()


def test_integer_validation_split_is_a_row_count(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(f'{{"text": "{t}"}}\n' for t in TEXTS))
    corpus = load_corpus(str(path), validation_split=20.0)  # what `--validation_split 20` parses to
    assert len(corpus["validation"]) == 20 and len(corpus["train"]) == len(TEXTS) - 20
    with pytest.raises(ValueError, match="fraction must be in"):
        load_corpus(str(path), validation_split=1.5)


def test_empty_tokenizer_folder_says_it_holds_no_tokenizer(tmp_path):
    (tmp_path / "tok").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no tokenizer"):
        load_tokenizer(str(tmp_path / "tok"))


def test_a_slow_format_tokenizer_folder_is_named_as_such_and_the_advised_conversion_loads(tmp_path):
    import json

    from tokenizers import ByteLevelBPETokenizer

    slow = tmp_path / "slow"
    slow.mkdir()
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS, vocab_size=300, special_tokens=["<pad>", "<bos>", "<eos>"])
    bpe.save_model(str(slow))  # vocab.json and merges.txt: the slow GPT-2 format
    (slow / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>"}))
    with pytest.raises(FileNotFoundError, match=r"holds a tokenizer in a slow format \(vocab.json, merges.txt\) "
                                                r"without tokenizer.json, which minitx reads"):
        load_tokenizer(str(slow))
    AutoTokenizer.from_pretrained(slow).save_pretrained(slow)  # the advice
    assert load_tokenizer(str(slow))("in the beginning")["input_ids"]


def test_lone_surrogate_is_named_with_its_row_and_position(tmp_path):
    with pytest.raises(ValueError, match=r"row 5 of the texts .* at character 4, a lone surrogate"):
        train_bpe_tokenizer([*TEXTS[:5], "bad \ud800 text", *TEXTS[5:]], 300)
    # in a file, JSON escapes are the only way to write one; the reader names the row
    path = tmp_path / "surrogate.jsonl"
    path.write_text('{"text": "good row"}\n{"text": "bad \\ud800 row"}\n')
    with pytest.raises(ValueError, match="surrogate pair in string is invalid. in row 1"):
        load_corpus(str(path), validation_split=1)


def test_too_few_tokens_counts_the_rows_and_names_real_flags(tmp_path):
    dd = datasets.DatasetDict(train=datasets.Dataset.from_dict({"text": TEXTS}),
                              validation=datasets.Dataset.from_dict({"text": ["tiny"] * 3}))
    tokenizer = train_bpe_tokenizer(TEXTS, 300)
    with pytest.raises(ValueError, match=r"'validation' has \d+ tokens in 3 rows.*--block_size") as error:
        tokenize_and_pack(dd, tokenizer, block_size=64)
    assert "drop_remainder" not in str(error.value)


def test_streaming_a_corpus_too_small_to_carve_says_why(tmp_path):
    corpus = tmp_path / "small.txt"
    corpus.write_text("one small document\nof a few lines\n" * 20)
    with pytest.raises(ValueError, match=r"streaming carves validation .* too few rows leave train empty"):
        load_corpus(str(corpus), streaming=True)


@pytest.mark.parametrize("emptied, blank, said", [
    (["validation.txt"], "", "{named} is empty; give each split some text, or leave an empty validation file out"),
    (["train.txt", "validation.txt"], "", "{named} are empty; give each split some text"),
    (["validation.txt"], "  \n\n \n", "split 'validation' .* has no text: .*\\({named} is white space only\\)")])
def test_an_empty_or_blank_split_file_is_named(tmp_path, emptied, blank, said):
    folder = tmp_path / "splits"
    folder.mkdir()
    for name in ("train.txt", "validation.txt"):
        (folder / name).write_text(blank if name in emptied else "some text\n" * 20)
    with pytest.raises(ValueError, match=said.format(named=", ".join(str(folder / name) for name in emptied))):
        load_corpus(str(folder))


def test_folder_of_mixed_file_types_is_refused_not_half_read(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "a.txt").write_text("some text\n" * 20)
    (folder / "b.jsonl").write_text("".join(f'{{"text": "{t}"}}\n' for t in TEXTS))
    with pytest.raises(ValueError, match=r"holds data files of several types \(.jsonl, .txt\)"):
        load_corpus(str(folder))


# --- files minitx cannot read, shell-expanded globs, corpora too small to carve validation from -----------


@pytest.mark.parametrize("name, content, says", [
    ("corpus.txt.gz", gzip.compress(b"some text\n", mtime=0), "is gzip-compressed (.gz)"),
    ("data.bin", bytes(range(256)) * 8, "is binary data (not UTF-8 text) (.bin)"),
    ("corpus", b"plain text without an extension\n", "is UTF-8 text (no extension)"),
])
def test_an_unsupported_file_is_described_not_blamed_on_the_hub(tmp_path, monkeypatch, capsys, name, content, says):
    monkeypatch.chdir(tmp_path)
    Path(name).write_bytes(content)
    assert minitx(["train-tokenizer", "--dataset", name, "--vocab_size", "300", "--output_dir", "tok"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{name} {says}" in err[0] and ".txt, .json, .jsonl, .csv, .tsv, .parquet" in err[0], err
    assert "Hub" not in err[0] and not Path("tok").exists()


def test_an_unquoted_glob_is_named_as_such(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("shards").mkdir()
    files = [f"shards/part{i:02d}.txt" for i in range(29)]
    for name in files:
        Path(name).write_text("text\n")
    assert minitx(["train-tokenizer", "--dataset", *files, "--output_dir", "tok"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--dataset got 29 paths" in err and "unquoted glob" in err and "--dataset 'shards/*.txt'" in err
    assert "part05.txt" not in err  # not the 29 names
    assert minitx(["train-tokenizer", "--dataset", files[0], "--no_such_option", "1", "--output_dir", "tok"]) == 2
    assert "unrecognized arguments: --no_such_option 1" in capsys.readouterr().err


def test_a_malformed_json_lines_file_is_named_in_one_line(tmp_path, monkeypatch, capfd):
    """datasets' JSON reader logs the file it failed on, then raises without it: one line says both."""
    monkeypatch.chdir(tmp_path)
    Path("corpus").mkdir()
    Path("corpus/train.jsonl").write_text("".join(f'{{"text": "{t}"}}\n' for t in TEXTS))
    Path("corpus/validation.jsonl").write_text('{"text": "fine"}\n{"text": "cut off\n')
    assert minitx(["train-tokenizer", "--dataset", "corpus", "--vocab_size", "300", "--output_dir", "tok"]) == 2
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip() and "examples/s" not in line]
    assert len(err) == 1 and "validation.jsonl" in err[0] and "malformed" in err[0], err
    assert not Path("tok").exists()


BROKEN = {
    ".jsonl": "".join(f'{{"text": "{t}"}}\n' for t in TEXTS[:20]) + '{"text": "cut off\n',
    ".json": '[{"text": "one"}, {"text": "two"',
    ".csv": "text\n" + "".join(f'"{t}"\n' for t in TEXTS[:20]) + 'a,"b\n',
}


@pytest.mark.parametrize("suffix, streaming", [(".jsonl", True), (".json", False), (".csv", False), (".csv", True)])
def test_the_malformed_one_of_several_files_is_named_in_one_line(tmp_path, monkeypatch, capfd, suffix, streaming):
    """Read at once or, streaming, when the rows are reached (after datasets' loading call has returned)."""
    monkeypatch.chdir(tmp_path)
    good = {".jsonl": "".join(f'{{"text": "{t}"}}\n' for t in TEXTS), ".json": json.dumps([{"text": t} for t in TEXTS]),
            ".csv": "text\n" + "".join(f'"{t}"\n' for t in TEXTS)}[suffix]
    Path(f"good{suffix}").write_text(good)
    Path(f"broken{suffix}").write_text(BROKEN[suffix])
    args = ["train", "--dataset", f"good{suffix},broken{suffix}", "--preset", "tiny", "--max_steps", "1",
            "--tokenizer_vocab_size", "300", "--output_dir", "run", "--num_threads", "1", "--disable_tqdm"]
    assert minitx([*args, *(["--streaming"] if streaming else [])]) == 2
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip() and "examples/s" not in line]
    named = err[0].replace(f"'good{suffix},broken{suffix}'", "")  # the file, not only the --dataset it came in
    assert len(err) == 1 and f"broken{suffix}" in named and "malformed" in named, err
    assert not Path("run").exists()


@pytest.mark.parametrize("text", ["one line of text, the whole corpus\n", "a\nb\n"])
def test_train_tokenizer_on_a_tiny_corpus_needs_no_validation_split(tmp_path, text):
    corpus = tmp_path / "tiny.txt"
    corpus.write_text(text)
    assert minitx(["train-tokenizer", "--dataset", str(corpus), "--vocab_size", "300", "--output_dir",
                   str(tmp_path / "tok")]) == 0
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


ONE_LINE_RSS = """
import resource, sys
from hf_minitx.data.documents import TEXT_CHUNK_CHARS
from hf_minitx.data.text_files import _text_file_rows
from hf_minitx.data.preprocessing import encode_rows, row_batches
from hf_minitx.data.tokenizer import load_tokenizer
tokenizer = load_tokenizer(sys.argv[2])
longest = tokens = 0
for batch in row_batches(_text_file_rows([sys.argv[1]], "document", TEXT_CHUNK_CHARS)):
    longest = max([longest, *map(len, batch["text"])])
    tokens += sum(map(len, encode_rows(batch["text"], batch["doc_end"], tokenizer, 2, "uint16")))
print(longest, tokens, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


@pytest.mark.slow
def test_a_one_line_file_is_read_in_bounded_pieces_that_tokenize_like_the_whole(tmp_path):
    import io
    import random
    import subprocess
    import sys

    from hf_minitx.data.documents import bounded_lines

    rng = random.Random(0)
    words = ["the", "of", "and", "  spaced", "tab\t", "x" * 40, "é", "end."]
    text = " ".join(rng.choice(words) for _ in range(4_000_000))  # ~20 MB, no line break
    pieces = list(bounded_lines(io.StringIO(text[:200_000], newline=""), 1000))
    assert "".join(pieces) == text[:200_000] and max(map(len, pieces)) <= 1000
    assert all(p.startswith(" ") and not p[1].isspace() for p in pieces[1:])  # cut where a word starts
    tokenizer = train_bpe_tokenizer([text[:100_000]], vocab_size=400)
    encode = tokenizer.backend_tokenizer.encode
    assert sum((encode(p, add_special_tokens=False).ids for p in pieces), []) == \
        encode(text[:200_000], add_special_tokens=False).ids
    corpus = tmp_path / "one-line.txt"
    corpus.write_text(text)
    tokenizer.save_pretrained(tmp_path / "tok")
    done = subprocess.run([sys.executable, "-c", ONE_LINE_RSS, str(corpus), str(tmp_path / "tok")],
                          capture_output=True, text=True, timeout=600)
    longest, tokens, peak_mb = map(int, done.stdout.split())
    assert longest <= 2 * (1 << 20) and tokens > 1_000_000
    assert peak_mb < 1024, f"peak RSS {peak_mb} MB reading a 20 MB one-line file"


def _write_rows(path: Path, texts: list) -> Path:
    """``texts`` (None: a missing text) as a json, jsonl, csv or parquet file of one ``text`` column."""
    import json

    import pandas as pd

    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    elif path.suffix == ".json":
        path.write_text(json.dumps([{"text": t} for t in texts]))
    elif path.suffix == ".csv":  # a missing text is an empty cell
        pd.DataFrame({"id": range(len(texts)), "text": texts}).to_csv(path, index=False)
    else:
        pd.DataFrame({"text": texts}).to_parquet(path)
    return path


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".csv", ".parquet"])
def test_a_row_without_text_is_named_or_skipped_and_counted(tmp_path, capsys, suffix):
    texts = [*TEXTS[:6], None, *TEXTS[6:]]  # the 7th row has no text
    path = _write_rows(tmp_path / f"rows{suffix}", texts)
    row = "data row 7" if suffix == ".csv" else "row 7"
    with pytest.raises(ValueError, match=rf"rows{suffix}: {row} has no text .*--skip_bad_rows"):
        load_corpus(str(path))
    assert minitx(["train-tokenizer", "--dataset", str(path), "--output_dir", str(tmp_path / "tok")]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "split:" not in line]  # no progress
    assert len(err) == 1 and f"{row} has no text" in err[0] and not (tmp_path / "tok").exists()
    from hf_minitx.data.columns import SKIPPED_ROWS

    corpus = load_corpus(str(path), skip_bad_rows=True, validation_split=10)
    assert len(corpus["train"]) + len(corpus["validation"]) == len(TEXTS)
    assert SKIPPED_ROWS[f"{path} (train)"] == 1
    assert all(t for split in corpus.values() for t in split["text"])


def test_a_null_in_a_validation_file_is_named(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    _write_rows(folder / "train.jsonl", TEXTS)
    _write_rows(folder / "validation.jsonl", [TEXTS[0], TEXTS[1], None])
    with pytest.raises(ValueError, match=r"validation.jsonl: row 3 has no text"):
        load_corpus(str(folder))


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".jsonl"])
def test_words_that_pandas_reads_as_missing_stay_text(tmp_path, suffix):
    words = ["NA", "null", "nan", "None", "N/A", "#N/A", "NaN", "n/a", "NULL"]
    path = _write_rows(tmp_path / f"words{suffix}", [*TEXTS[:10], *words])
    corpus = load_corpus(str(path), validation_split=None)
    assert corpus["train"]["text"][10:] == words


def test_a_streamed_row_without_text_is_refused_or_skipped(tmp_path):
    path = _write_rows(tmp_path / "rows.jsonl", [*TEXTS[:6], None, *TEXTS[6:]])
    with pytest.raises(ValueError, match=r"rows.jsonl: row 7 has no text .*--skip_bad_rows"):  # file and row named
        list(load_corpus(str(path), streaming=True, validation_split=10)["train"])
    corpus = load_corpus(str(path), streaming=True, skip_bad_rows=True, validation_split=10)
    texts = [row["text"] for split in corpus.values() for row in split]
    assert len(texts) == len(TEXTS) and all(texts)


@pytest.mark.parametrize("streaming", [False, True])
def test_a_text_column_holding_other_values_is_named(tmp_path, streaming):
    import json

    mixed = tmp_path / "mixed.jsonl"
    values = [*TEXTS[:6], 5, *TEXTS[6:], ["a", "list"]]
    mixed.write_text("".join(json.dumps({"text": v}) + "\n" for v in values))
    where = "it holds values that are not all strings" if streaming else "mixed.jsonl: row 7 holds 5 \\(int\\)"
    with pytest.raises(ValueError, match=rf"column 'text' of .*mixed.jsonl' must hold text, but .*{where}.*in quotes"):
        load_corpus(str(mixed), streaming=streaming)
    numbers = _write_rows(tmp_path / "numbers.parquet", list(range(30)))
    where = "it holds int64 values" if streaming else "numbers.parquet: row 1 holds 0 \\(int\\)"
    with pytest.raises(ValueError, match=rf"must hold text, but .*{where}: write each value as a string"):
        load_corpus(str(numbers), streaming=streaming)


def test_a_reader_failure_is_held_once_and_still_printed_outside_a_command():
    """A program reading a stream itself still sees datasets' line; ``minitx`` keeps it back and says it once."""
    import logging

    from hf_minitx.data.sources import READER_FAILURES, read_failure

    said = "Failed to load JSON from file 'x.jsonl' with error <class 'ArrowInvalid'>: JSON parse error: row 3"
    record = logging.LogRecord("datasets.packaged_modules.json.json", logging.ERROR, "", 0, said, None, None)
    assert READER_FAILURES.filter(record) is True  # printed: no command's error line will say it
    assert read_failure(ValueError("JSON parse error: row 3")) == said
    assert read_failure(ValueError("JSON parse error: row 3")) is None  # said once
    READER_FAILURES.filter(record)
    assert read_failure(ValueError("another error")) is None  # not this error's line
