"""Model-folder checks before anything is shared: missing, broken or mismatched files, and bad paths."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import saved_model
from conftest import hold_lock

from hf_minitx import MiniTxForConditionalGeneration
from hf_minitx.cli import main as minitx
from hf_minitx.hub.folder import ModelFolderError, read_safetensors_header
from hf_minitx.hub.push import (
    child_failure,
    verify_model_folder,
)

folders, causal_copy = saved_model.folders, saved_model.causal_copy  # the fixtures of saved models


def test_verify_accepts_complete_folders(folders):
    info = verify_model_folder(folders["seq2seq"], "seq2seq")
    assert info.kind == "seq2seq" and info.auto_class == "AutoModelForSeq2SeqLM"
    assert info.weight_files == ("model.safetensors",)
    assert set(info.code_files) == {"configuration_minitx.py", "modeling_minitx.py", "layers_minitx.py",
                                    "attention_minitx.py", "positions_minitx.py", "decoding_minitx.py",
                                    "checks_minitx.py", "lm_head_minitx.py", "cache_minitx.py"}
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(info.tokenizer_files)
    assert info.num_parameters == MiniTxForConditionalGeneration.from_pretrained(folders["seq2seq"]).num_parameters()
    with pytest.raises(ModelFolderError, match="describes a seq2seq model, but a causal-lm model was expected"):
        verify_model_folder(folders["seq2seq"], "causal-lm")


def test_verify_names_everything_missing_from_a_non_model_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelFolderError) as error:
        verify_model_folder(tmp_path)
    message = str(error.value)  # one line, each problem after "; "
    assert message.startswith(f"{tmp_path} is not a complete hf_minitx model folder: config.json: missing")
    assert "\n" not in message and ":;" not in message
    for name in ("model.safetensors", "tokenizer.json"):
        assert f"; {name}" in message
    with pytest.raises(NotADirectoryError, match="notes.txt is a file, not a model folder"):
        verify_model_folder(tmp_path / "notes.txt")
    with pytest.raises(FileNotFoundError, match="missing does not exist; pass the folder of a saved model"):
        verify_model_folder(tmp_path / "missing")


def test_push_of_an_interrupted_run_says_how_to_finish_it(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)  # a run stopped before its final save: checkpoints, no config.json
    (run / "checkpoint-2" / "run_state.json").write_text(json.dumps({"step": 2}))
    assert minitx(["push", "--model_dir", str(run), "--dry_run", str(tmp_path / "stage")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "its run was interrupted" in err[0] and ":;" not in err[0], err
    assert "--resume_from_checkpoint latest" in err[0] and f"minitx explore --model {run} --run {run}" in err[0]
    assert not (tmp_path / "stage").exists()
    holder = hold_lock(run)  # the same folder while its run is still going: not "interrupted"
    try:
        assert minitx(["push", "--model_dir", str(run), "--dry_run", str(tmp_path / "stage")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "its run is still going (`minitx train` (pid" in err[0] and "Wait for it" in err[0]
        assert "--resume_from_checkpoint" not in err[0] and f"minitx explore --model {run} --run {run}" in err[0]
    finally:
        holder.kill()
        holder.wait()


def test_verify_requires_a_tokenizer(causal_copy):
    (causal_copy / "tokenizer.json").unlink()
    with pytest.raises(ModelFolderError, match=r"tokenizer\.json: missing, so the folder has no tokenizer"):
        verify_model_folder(causal_copy)


def test_verify_detects_truncated_weights(causal_copy):
    weights = causal_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ModelFolderError, match=r"model\.safetensors is truncated: expected \d+ bytes"):
        verify_model_folder(causal_copy)
    weights.write_bytes(weights.read_bytes()[:20])  # cut inside the header
    with pytest.raises(ModelFolderError, match=r"model\.safetensors is truncated or corrupted"):
        verify_model_folder(causal_copy)


def test_verify_detects_corrupted_weights_header(causal_copy):
    weights = causal_copy / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[8:16] = b"\xff\xfe garb"
    weights.write_bytes(bytes(raw))
    with pytest.raises(ModelFolderError, match=r"model\.safetensors is corrupted: its header is not valid JSON"):
        verify_model_folder(causal_copy)


def test_verify_detects_weights_that_do_not_match_the_config(causal_copy):
    config = json.loads((causal_copy / "config.json").read_text())
    config["hidden_size"] = 64
    (causal_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFolderError, match=r"model\.safetensors: model\.decoder\.embed_tokens\.weight has shape"):
        verify_model_folder(causal_copy)


def test_verify_detects_missing_custom_code_and_foreign_configs(causal_copy):
    (causal_copy / "layers_minitx.py").unlink()  # imported by modeling_minitx.py, not named in auto_map
    with pytest.raises(ModelFolderError, match=r"layers_minitx\.py: missing custom code"):
        verify_model_folder(causal_copy)
    (causal_copy / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelFolderError, match="model_type is 'gpt2', not 'minitx'"):
        verify_model_folder(causal_copy)


def test_verify_detects_a_tokenizer_larger_than_the_vocabulary(causal_copy):
    config = json.loads((causal_copy / "config.json").read_text())
    config["vocab_size"] = 100
    (causal_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFolderError, match="tokenizer.json: has 300 tokens but config.json's vocab_size is 100"):
        verify_model_folder(causal_copy)


def test_safetensors_header_reader_counts_each_tied_tensor_once(folders):
    header = read_safetensors_header(folders["causal-lm"] / "model.safetensors")
    assert "lm_head.weight" not in header  # tied to the embeddings, stored once
    raw = (folders["causal-lm"] / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    assert set(header) == set(json.loads(raw[8:8 + length])) - {"__metadata__"}


def test_a_code_file_that_does_not_parse_is_named_with_its_line(tmp_path):
    """transformers parses the folder's code without naming the file ("<unknown>"): the check names it."""
    (tmp_path / "configuration_minitx.py").write_text("x = 1\n")
    (tmp_path / "modeling_minitx.py").write_text("import torch\n\ndef broken(:\n    pass\n")
    stderr = ('Traceback (most recent call last):\n  File "/x/dynamic_module_utils.py", line 225, in get_imports\n'
              '    tree = ast.parse(content)\n  File "<unknown>", line 3\n    def broken(:\n               ^\n'
              "SyntaxError: invalid syntax\n")
    assert str(child_failure(tmp_path, stderr, 1)) == (
        f"{tmp_path} does not load without hf_minitx installed: SyntaxError: invalid syntax (in modeling_minitx.py, "
        "line 3); set HF_MINITX_TRACEBACK=1 to see the whole traceback")


@pytest.mark.parametrize("command", [
    ["export", "--to", "qwen3", "--output_dir", "out", "--model"], ["push", "--dry_run", "out", "--model_dir"],
    ["generate", "--prompt", "hi", "--model"], ["explore", "--text", "hi", "--out", "page.html", "--model"]],
    ids=lambda argv: argv[0])
def test_a_model_path_that_does_not_exist_or_is_a_file_is_said_so(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    Path("notes.txt").write_text("mine")
    for model, said in (("nonexist", "nonexist does not exist; pass the folder of a saved model"),
                        ("notes.txt", "notes.txt is a file, not a model folder; pass the folder of a saved model")):
        assert minitx([*command, model]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {said}") and err.count("\n") == 1, err
    assert os.listdir() == ["notes.txt"]


@pytest.mark.parametrize("summary", ["[1, 2]", "{not json"])
def test_a_hand_edited_training_summary_is_named_in_the_users_folder(causal_copy, tmp_path, capsys, summary):
    (causal_copy / "training_summary.json").write_text(summary)  # the card and the smoke prompt read it
    assert minitx(["push", "--model_dir", str(causal_copy), "--dry_run", str(tmp_path / "stage")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{causal_copy} is not a complete hf_minitx model folder: training_summary.json" in err[0]
    assert "put back the one the training run wrote, or remove it" in err[0] and "save_pretrained" not in err[0]
    assert ("holds a list, not a JSON object" in err[0]) == summary.startswith("[")
    assert not (tmp_path / "stage").exists()


def test_records_read_back_as_hints_are_absent_when_unreadable(tmp_path):
    from hf_minitx.folders import read_json_object, read_summary

    assert read_summary(tmp_path) is None  # missing
    for text in ("[1, 2]", '"run"', "{not json", "\xff"):
        (tmp_path / "training_summary.json").write_text(text, encoding="latin-1")
        assert read_summary(tmp_path) is None, text
    (tmp_path / "training_summary.json").write_text('{"steps": 3}')
    assert read_summary(tmp_path) == {"steps": 3} == read_json_object(tmp_path / "training_summary.json")
    (tmp_path / "folder.json").mkdir()
    assert read_json_object(tmp_path / "folder.json") is None


def test_the_model_kind_is_read_alike_from_config_json_and_from_a_config(folders):
    from hf_minitx.model_files import MODEL_KINDS, model_kind, read_folder_config
    from hf_minitx.models import MiniTxConfig

    for kind in ("causal-lm", "seq2seq"):
        config = read_folder_config(folders[kind])
        assert model_kind(config) == kind == model_kind(MiniTxConfig(**config))
        assert verify_model_folder(folders[kind]).kind == kind
    assert set(MODEL_KINDS) == {"causal-lm", "seq2seq"}
