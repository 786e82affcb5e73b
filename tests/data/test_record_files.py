"""Records in table files (CSV, TSV) and in a `save_to_disk` folder: every cell read as the text it is written as,
and the column mistakes a user makes named before any tokenizer is trained."""

from __future__ import annotations

import json

import datasets
import pytest
from test_data import isolated_cache, session_cache  # noqa: F401 - datasets' cache inside pytest's tmp folder

from hf_minitx.data import load_corpus

PAIRS = [(str(n), " ".join("zero one two three four five six seven eight nine".split()[int(d)] for d in str(n)))
         for n in range(100, 140)]
ODD_SOURCES = ["007", "1.50", "1e3", "NA", "-0"]  # text a number parser would change or drop


def pairs_file(path, sep: str):
    rows = PAIRS + [(source, f"say {source}") for source in ODD_SOURCES]
    path.write_text(f"source{sep}target\n" + "".join(f"{s}{sep}{t}\n" for s, t in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("name, sep", [("pairs.csv", ","), ("pairs.tsv", "\t")])
def test_cells_that_look_like_numbers_stay_the_text_written(tmp_path, name, sep, streaming):
    corpus = load_corpus(str(pairs_file(tmp_path / name, sep)), task="seq2seq", validation_split=None,
                         streaming=streaming)
    sources = [row["source"] for row in corpus["train"]]
    assert sources == [s for s, _ in PAIRS] + ODD_SOURCES
    assert {row["target"] for row in corpus["train"]} >= {"one zero zero", "say 007"}


def test_a_folder_of_tsv_files_gives_its_splits(tmp_path):
    folder = tmp_path / "pairs"
    folder.mkdir()
    pairs_file(folder / "train.tsv", "\t")
    (folder / "validation.tsv").write_text("source\ttarget\n12\tone two\n", encoding="utf-8")
    corpus = load_corpus(str(folder), task="seq2seq")
    assert corpus["validation"][0] == {"source": "12", "target": "one two"}
    assert len(corpus["train"]) == len(PAIRS) + len(ODD_SOURCES)


def test_the_same_column_as_source_and_target_is_refused(tmp_path):
    path = pairs_file(tmp_path / "pairs.csv", ",")
    with pytest.raises(ValueError, match="--source_column and --target_column both name 'source'"):
        load_corpus(str(path), task="seq2seq", source_column="source", target_column="source")


def test_files_with_other_columns_are_named_as_such(tmp_path):
    folder = tmp_path / "pairs"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in PAIRS))
    (folder / "validation.jsonl").write_text(json.dumps({"src": "12", "tgt": "one two"}) + "\n")
    with pytest.raises(ValueError, match=r"files do not all have the same columns \(.*src.*\); give every file, "
                                         "train and validation alike, the same column names"):
        load_corpus(str(folder), task="seq2seq")


def test_a_seq2seq_column_of_numbers_names_the_seq2seq_column_options(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"source": int(s), "target": t}) + "\n" for s, t in PAIRS))
    with pytest.raises(ValueError, match="row 1 holds 100 \\(int\\).*pick the columns with --source_column and "
                                         "--target_column"):
        load_corpus(str(path), task="seq2seq")


@pytest.mark.parametrize("streaming", [False, True])
def test_a_dataset_saved_with_save_to_disk_is_the_train_split(tmp_path, streaming):
    rows = [{"source": s, "target": t} for s, t in PAIRS]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    corpus = load_corpus(str(tmp_path / "saved"), task="seq2seq", validation_split=4, streaming=streaming)
    seen = [row for split in ("train", "validation") for row in corpus[split]]
    assert sorted(map(tuple, (r.values() for r in seen))) == sorted(PAIRS)
    assert len(list(corpus["validation"])) == 4


def test_a_test_split_beside_train_is_said_to_be_left_out(tmp_path, caplog):
    folder = tmp_path / "pairs"
    folder.mkdir()
    pairs_file(folder / "train.csv", ",")
    (folder / "test.csv").write_text("source,target\n12,one two\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="hf_minitx.data.splits"):
        corpus = load_corpus(str(folder), task="seq2seq", validation_split=4)
    assert "has a test split, which training does not read" in caplog.text
    assert len(corpus["validation"]) == 4 and {"source": "12", "target": "one two"} not in list(corpus["validation"])


def test_a_tsv_cell_is_what_lies_between_two_tabs_quotes_included(tmp_path):
    path = tmp_path / "quotes.tsv"
    cells = ['"Hi, he began', "second line", 'she said "stop" there', '"Hello," she said', '"a"b']
    path.write_text("text\tlabel\n" + "".join(f"{cell}\t{i}\n" for i, cell in enumerate(cells * 8)), encoding="utf-8")
    corpus = load_corpus(str(path), validation_split=None)
    assert [row["text"] for row in corpus["train"]][:5] == cells


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("layout", ["list", "folder"])
def test_csv_files_with_other_headers_are_named(tmp_path, layout, streaming):
    one, two = ("train.csv", "validation.csv") if layout == "folder" else ("a.csv", "b.csv")
    (tmp_path / one).write_text("text,label\n" + "a long enough line,1\n" * 30)
    (tmp_path / two).write_text("text,other,label\n" + "another line,x,2\n" * 30)
    dataset = str(tmp_path) if layout == "folder" else f"{tmp_path / one},{tmp_path / two}"
    with pytest.raises(ValueError, match=rf"the files do not all have the same columns: .*{one} has \['text', "
                                         rf"'label'\], .*{two} has \['text', 'other', 'label'\]"):
        load_corpus(dataset, streaming=streaming, validation_split=4)


def test_a_header_with_a_blank_name_loads_as_pandas_names_it(tmp_path):
    path = tmp_path / "export.csv"  # a spreadsheet's trailing comma
    path.write_text("text,label,\n" + "".join(f"{n},{n},x\n" for n in range(100, 140)))
    corpus = load_corpus(str(path), validation_split=None)
    assert [row["text"] for row in corpus["train"]] == [str(n) for n in range(100, 140)]


def test_a_saved_dataset_with_a_row_without_text_is_named(tmp_path):
    datasets.Dataset.from_dict({"text": ["some text"] * 40 + [None]}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(ValueError, match=r"row 41 of the train split of .*saved' has no text"):
        load_corpus(str(tmp_path / "saved"), validation_split=None)
