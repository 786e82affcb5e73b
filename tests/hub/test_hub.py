"""Sharing: model card rendering and validation, model-folder checks, staging, upload and the dry run."""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import huggingface_hub
import pytest
import torch
from conftest import hold_lock
from huggingface_hub import metadata_load
from huggingface_hub.repocard_data import model_index_to_eval_results

from hf_minitx import MiniTxConfig, MiniTxForCausalLM, MiniTxForConditionalGeneration
from hf_minitx.cli import main as minitx
from hf_minitx.data.tokenizer import load_tokenizer, train_bpe_tokenizer
from hf_minitx.hub.folder import ModelFolderError, read_safetensors_header
from hf_minitx.hub.push import (
    HubError,
    check_loads_without_package,
    check_model_card,
    check_repo_id,
    child_failure,
    dry_run,
    push_to_hub,
    render_model_card,
    resolve_token,
    stage_for_upload,
    verify_model_folder,
    write_model_card,
)

SENTENCES = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "seven hundred and twelve", "sept cent douze", "one thousand and one", "mille un",
]
CAUSAL_METRICS = {"eval_loss": 3.2188, "eval_perplexity": 24.99, "eval_bits_per_byte": 1.1834}
SEQ2SEQ_METRICS = {"eval_loss": 0.0412, "eval_exact_match": 99.25, "eval_bleu": 98.76}


def _write_records(folder: Path, task: str, metrics: dict, **summary_overrides) -> dict:
    """training_summary.json + metrics.jsonl in the training format."""
    summary = {
        "task": task, "dataset": "builtin:kjv" if task == "causal-lm" else "builtin:numbers-en-fr",
        "dataset_config": None, "hub_dataset": False, "steps": 120, "tokens_seen": 245_760,
        "train_seconds": 75.5, "hardware": "1 x cpu (2 cores)", "mixed_precision": "no", "num_processes": 1,
        "final_metrics": metrics,
        "sample_generations": [{"prompt": SENTENCES[0][:16] if task == "causal-lm" else SENTENCES[2],
                                "output": "and the `earth`\nwas"}],
        "preset": "tiny", "seed": 7,
    }
    summary.update(summary_overrides)
    (folder / "training_summary.json").write_text(json.dumps(summary))
    records = [
        {"type": "train", "step": 60, "epoch": 0.5, "loss": 4.1, "learning_rate": 1e-3, "tokens_per_second": 3200.0,
         "tokens_seen": 122_880, "elapsed_seconds": 38.0},
        {"type": "eval", "step": 120, **metrics},
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return summary


def _build_folder(root: Path, kind: str) -> Path:
    """A tiny saved model of `kind` with a tokenizer and training records."""
    torch.manual_seed(0)
    tokenizer = train_bpe_tokenizer(SENTENCES * 3, vocab_size=300, add_eos_token=kind == "seq2seq")
    config = MiniTxConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=64, is_encoder_decoder=kind == "seq2seq",
                          position_embedding_type="rope" if kind == "seq2seq" else "learned")
    model = (MiniTxForConditionalGeneration if kind == "seq2seq" else MiniTxForCausalLM)(config)
    folder = root / f"tiny-{kind}"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    _write_records(folder, kind, SEQ2SEQ_METRICS if kind == "seq2seq" else CAUSAL_METRICS)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {kind: _build_folder(root, kind) for kind in ("causal-lm", "seq2seq")}


@pytest.fixture
def causal_copy(folders, tmp_path) -> Path:
    """A private copy of the causal folder that a test may break."""
    return Path(shutil.copytree(folders["causal-lm"], tmp_path / "model"))


def _metadata(text: str) -> dict:
    return huggingface_hub.ModelCard(text).data.to_dict()


# --- model card -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["causal-lm", "seq2seq"])
def test_card_metadata_carries_task_tags_and_measured_metrics(folders, kind):
    text = render_model_card(folders[kind], repo_id="alice/tiny")
    check_model_card(text)
    data = _metadata(text)
    assert data["library_name"] == "transformers"
    assert data["pipeline_tag"] == {"causal-lm": "text-generation", "seq2seq": "text2text-generation"}[kind]
    assert data["tags"] == ["hf_minitx", "custom_code", kind]
    assert data["license"] == "apache-2.0"
    assert "datasets" not in data  # built-in corpora are not Hub datasets
    name, results = model_index_to_eval_results(data["model-index"])
    assert name == "tiny"
    expected = CAUSAL_METRICS if kind == "causal-lm" else SEQ2SEQ_METRICS
    reported = {r.metric_type: r.metric_value for r in results}
    assert reported == {key.removeprefix("eval_"): value for key, value in expected.items()}
    assert {r.dataset_split for r in results} == {"validation"}


def test_card_body_shows_architecture_parameters_training_and_usage(folders):
    folder = folders["seq2seq"]
    text = render_model_card(folder, repo_id="alice/numbers")
    model = MiniTxForConditionalGeneration.from_pretrained(folder)
    assert f"| Parameters | {model.num_parameters():,} " in text
    assert "| Layers | 2 encoder + 2 decoder |" in text
    assert "rotary (RoPE)" in text and "pre-LayerNorm" in text
    assert "| Optimizer steps | 120 |" in text and "| Training tokens | 245,760" in text
    assert "| Training time | 1 min 16 s |" in text and "1 x cpu (2 cores)" in text
    assert "| Validation exact match (%) | 99.25 |" in text and "| Validation BLEU (sacreBLEU) | 98.76 |" in text
    assert 'AutoModelForSeq2SeqLM.from_pretrained("alice/numbers", trust_remote_code=True)' in text
    assert 'AutoModelForSeq2SeqLM.from_pretrained("alice/numbers")\n' in text  # installed-package path
    assert "byte-level BPE tokenizer with 300 tokens" in text
    assert "| `seven hundred and twelve` | `and the 'earth' was` |" in text  # newline/backticks cannot break it


def test_card_code_examples_use_the_recorded_prompt_and_its_table_a_safe_copy(causal_copy):
    summary = json.loads((causal_copy / "training_summary.json").read_text())
    summary["sample_generations"] = [{"prompt": '| | as "s[len(s):]" = `t`', "output": "ok"}]
    (causal_copy / "training_summary.json").write_text(json.dumps(summary))
    text = render_model_card(causal_copy)
    assert 'tokenizer(["| | as \\"s[len(s):]\\" = `t`"], return_tensors="pt")' in text  # the prompt as given
    assert "| `/ / as \"s[len(s):]\" = 't'` | `ok` |" in text  # a table cell cannot be split by it
    summary["sample_generations"] = [{"prompt": "```\nrm", "output": "ok"}]  # it would end the code block
    (causal_copy / "training_summary.json").write_text(json.dumps(summary))
    assert 'tokenizer(["In the beginning"], return_tensors="pt")' in render_model_card(causal_copy)


def test_card_names_the_config_overrides_a_run_was_given(causal_copy):
    assert "Config overrides" not in render_model_card(causal_copy)
    summary = json.loads((causal_copy / "training_summary.json").read_text())
    (causal_copy / "training_summary.json").write_text(json.dumps({**summary, "config_overrides": "hidden_size=96"}))
    assert "| Config overrides | `hidden_size=96` |" in render_model_card(causal_copy)


def test_card_lists_hub_datasets_only(folders, tmp_path):
    folder = Path(shutil.copytree(folders["causal-lm"], tmp_path / "m"))
    _write_records(folder, "causal-lm", CAUSAL_METRICS, dataset="someone/poems", dataset_config="small",
                   hub_dataset=True)
    data = _metadata(render_model_card(folder))
    assert data["datasets"] == ["someone/poems"]
    _, results = model_index_to_eval_results(data["model-index"])
    assert {(r.dataset_type, r.dataset_config) for r in results} == {("someone/poems", "small")}


def test_card_without_training_summary_has_no_model_index(causal_copy):
    (causal_copy / "training_summary.json").unlink()
    text = render_model_card(causal_copy)
    check_model_card(text)
    assert "model-index" not in _metadata(text)
    assert "No validation metrics were recorded" in text
    assert "your-username/model" in text  # usage snippet falls back to the folder name


def test_card_drops_non_finite_metrics(causal_copy):
    _write_records(causal_copy, "causal-lm", {"eval_loss": float("nan"), "eval_perplexity": 12.5})
    _, results = model_index_to_eval_results(_metadata(render_model_card(causal_copy))["model-index"])
    assert [(r.metric_type, r.metric_value) for r in results] == [("perplexity", 12.5)]


def test_card_rejects_summary_of_the_other_task(causal_copy):
    _write_records(causal_copy, "seq2seq", SEQ2SEQ_METRICS)
    with pytest.raises(ModelFolderError, match="training_summary.json says task='seq2seq'"):
        render_model_card(causal_copy)


def test_write_model_card_round_trips_through_metadata_load(causal_copy):
    path = write_model_card(causal_copy)
    assert path == causal_copy / "README.md"
    assert metadata_load(path) == _metadata(path.read_text())
    assert metadata_load(path)["pipeline_tag"] == "text-generation"


def test_check_model_card_rejects_bad_metadata(folders):
    good = render_model_card(folders["causal-lm"])
    with pytest.raises(ValueError, match="library_name"):
        check_model_card(good.replace("library_name: transformers", "library_name: timm"))
    with pytest.raises(ValueError, match="tags lack"):
        check_model_card(good.replace("- custom_code\n", ""))
    with pytest.raises(ValueError, match="non-numeric"):
        check_model_card(good.replace("value: 24.99", "value: lots"))
    with pytest.raises(ValueError, match="model_index"):  # huggingface_hub's own parser refuses it
        check_model_card(good.replace("    dataset:\n", "    dataset_gone:\n", 1))


# --- model folder checks --------------------------------------------------------------------------


def test_verify_accepts_complete_folders(folders):
    info = verify_model_folder(folders["seq2seq"], "seq2seq")
    assert info.kind == "seq2seq" and info.auto_class == "AutoModelForSeq2SeqLM"
    assert info.weight_files == ("model.safetensors",)
    assert set(info.code_files) == {"configuration_minitx.py", "modeling_minitx.py", "layers_minitx.py",
                                    "attention_minitx.py", "positions_minitx.py", "decoding_minitx.py",
                                    "checks_minitx.py", "lm_head_minitx.py"}
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


# --- staging, repo ids, tokens, upload ------------------------------------------------------------


def test_stage_copies_exactly_the_shareable_files(causal_copy, tmp_path):
    (causal_copy / "checkpoint-10").mkdir()
    (causal_copy / "checkpoint-10" / "optimizer.bin").write_bytes(b"0" * 10)
    (causal_copy / "scratch.txt").write_text("private notes")
    staging = stage_for_upload(causal_copy, tmp_path / "stage", repo_id="alice/kjv-tiny")
    staged = {path.name for path in staging.iterdir()}
    assert staged == {
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        "configuration_minitx.py", "modeling_minitx.py", "layers_minitx.py", "attention_minitx.py",
        "positions_minitx.py", "decoding_minitx.py", "checks_minitx.py", "lm_head_minitx.py", "training_summary.json",
        "metrics.jsonl", "README.md",
    }
    assert (staging / "model.safetensors").read_bytes() == (causal_copy / "model.safetensors").read_bytes()
    assert '"alice/kjv-tiny"' in (staging / "README.md").read_text()
    with pytest.raises(ValueError, match="already exists and is not empty: it already holds a model folder"):
        stage_for_upload(causal_copy, staging)


def test_push_shares_an_explorer_page_on_request_and_the_card_links_it(causal_copy, tmp_path, capsys):
    from hf_minitx.cli import main as minitx

    page = tmp_path / "page.html"
    assert minitx(["explore", "--model", str(causal_copy), "--text", "the quick fox", "--out", str(page)]) == 0
    staging = stage_for_upload(causal_copy, tmp_path / "with", explorer=page)
    assert (staging / "explore.html").read_bytes() == page.read_bytes()
    assert "[explore.html](explore.html)" in (staging / "README.md").read_text()
    plain = stage_for_upload(causal_copy, tmp_path / "without")
    assert not (plain / "explore.html").exists() and "explore.html" not in (plain / "README.md").read_text()
    (causal_copy / "training_summary.json").unlink(missing_ok=True)  # a folder saved without training
    bare = stage_for_upload(causal_copy, tmp_path / "bare", explorer=page)
    assert "[explore.html](explore.html)" in (bare / "README.md").read_text()

    other = tmp_path / "other.html"
    other.write_text("<html><body>someone else's page</body></html>")
    capsys.readouterr()
    assert minitx(["push", "--model_dir", str(causal_copy), "--dry_run", str(tmp_path / "refused"),
                   "--explorer", str(other)]) == 2
    assert "not a page written by minitx explore" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()
    with pytest.raises(FileNotFoundError, match="make it first: minitx explore"):
        stage_for_upload(causal_copy, tmp_path / "missing", explorer=tmp_path / "nope.html")
    (tmp_path / "pages").mkdir()
    assert minitx(["push", "--model_dir", str(causal_copy), "--dry_run", str(tmp_path / "refused"),
                   "--explorer", str(tmp_path / "pages")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pages is a folder; pass the .html page written by minitx explore" in err[0]
    assert err[0].endswith(f"--out {tmp_path / 'pages' / 'explore.html'}")  # the command it gives works
    assert not (tmp_path / "refused").exists()


def test_push_refuses_an_explorer_page_made_from_other_weights(causal_copy, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    page = tmp_path / "page.html"
    assert minitx(["explore", "--model", str(causal_copy), "--text", "the quick fox", "--out", str(page)]) == 0
    retrained = tmp_path / "retrained"
    shutil.copytree(causal_copy, retrained)
    weights = load_file(retrained / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 0.01  # same shapes, other weights: the page shows another model
    save_file(weights, retrained / "model.safetensors", metadata={"format": "pt"})
    capsys.readouterr()
    assert minitx(["push", "--model_dir", str(retrained), "--dry_run", str(tmp_path / "refused"),
                   "--explorer", str(page)]) == 2
    error = capsys.readouterr().err
    assert "was not made from the weights in" in error and f"minitx explore --model {retrained}" in error
    assert not (tmp_path / "refused").exists()
    assert (stage_for_upload(causal_copy, tmp_path / "same", explorer=page) / "explore.html").is_file()


@pytest.mark.parametrize("repo_id", ["kjv-gpt", "a/b/c", "/kjv", "alice/", "alice/kjv gpt", "alice/kjv--gpt"])
def test_bad_repo_ids_are_refused(repo_id):
    with pytest.raises(ValueError, match="repo_id"):
        check_repo_id(repo_id)


def test_good_repo_id_passes():
    assert check_repo_id("alice/kjv-gpt.v2") == "alice/kjv-gpt.v2"


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    """No token anywhere: not in the environment and no `hf auth login` file."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))


def test_missing_token_is_a_clear_error(no_token, monkeypatch):
    with pytest.raises(HubError, match="hf auth login"):
        resolve_token()
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert resolve_token() == "hf_from_env"
    assert resolve_token("hf_explicit") == "hf_explicit"


class _RecordingApi:
    """Stands in for HfApi where the Hub cannot be reached; records calls and the uploaded files."""

    calls: list = []

    def __init__(self, token=None):
        self.calls.append(("init", token))

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))

    def create_branch(self, repo_id, **kwargs):
        self.calls.append(("create_branch", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        folder = Path(kwargs["folder_path"])
        files = {path.name: path.read_bytes() for path in folder.iterdir()}
        self.calls.append(("upload_folder", {**kwargs, "files": files}))
        return type("Commit", (), {"commit_url": f"https://huggingface.co/{kwargs['repo_id']}/commit/abc"})()


def test_push_to_hub_creates_the_repo_and_uploads_the_staged_folder(folders, monkeypatch):
    monkeypatch.setattr(huggingface_hub, "HfApi", _RecordingApi)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    _RecordingApi.calls = []
    url = push_to_hub(folders["seq2seq"], "alice/numbers", private=True, revision="v1", token="hf_test")
    assert url == "https://huggingface.co/alice/numbers/commit/abc"
    calls = _RecordingApi.calls
    assert calls[0] == ("init", "hf_test")
    assert calls[1] == ("create_repo", "alice/numbers", {"private": True, "repo_type": "model", "exist_ok": True})
    assert calls[2] == ("create_branch", "alice/numbers", {"branch": "v1", "repo_type": "model", "exist_ok": True})
    upload = calls[3][1]
    assert upload["repo_id"] == "alice/numbers" and upload["revision"] == "v1"
    assert upload["files"]["model.safetensors"] == (folders["seq2seq"] / "model.safetensors").read_bytes()
    assert "modeling_minitx.py" in upload["files"] and "tokenizer.json" in upload["files"]
    check_model_card(upload["files"]["README.md"].decode())
    assert not Path(upload["folder_path"]).exists()  # the temporary staging folder is cleaned up


def test_an_upload_of_a_diverged_model_says_its_training_warning(causal_copy, monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub, "HfApi", _RecordingApi)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    _write_records(causal_copy, "causal-lm", CAUSAL_METRICS, warning="warning: the training diverged")
    assert minitx(["push", "--model_dir", str(causal_copy), "--repo_id", "alice/kjv"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "warning: the training diverged (the model card carries this warning)"
    assert b"> **Warning:** the training diverged" in _RecordingApi.calls[-1][1]["files"]["README.md"]


def test_push_to_hub_checks_everything_before_calling_the_hub(causal_copy, monkeypatch, no_token):
    monkeypatch.setattr(huggingface_hub, "HfApi", _RecordingApi)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    _RecordingApi.calls = []
    with pytest.raises(HubError, match="No Hugging Face token"):
        push_to_hub(causal_copy, "alice/kjv")
    (causal_copy / "tokenizer_config.json").unlink()
    with pytest.raises(ModelFolderError, match="tokenizer_config.json: missing"):
        push_to_hub(causal_copy, "alice/kjv", token="hf_test")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError, match="HF_HUB_OFFLINE"):
        push_to_hub(causal_copy, "alice/kjv", token="hf_test")
    assert _RecordingApi.calls == []


def test_cli_reports_bad_input_without_a_traceback(folders, no_token, capsys):
    assert minitx(["push", "--model_dir", str(folders["causal-lm"]), "--repo_id", "no-owner"]) == 2
    assert minitx(["push", "--model_dir", str(folders["causal-lm"]), "--repo_id", "alice/kjv"]) == 2
    assert minitx(["push", "--model_dir", str(folders["causal-lm"])]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "must look like OWNER/NAME" in err and "No Hugging Face token found" in err and "--repo_id" in err


def test_installed_package_path_loads_staged_folder_without_remote_code(folders, tmp_path):
    from transformers import AutoModelForCausalLM

    staging = stage_for_upload(folders["causal-lm"], tmp_path / "stage")
    model = AutoModelForCausalLM.from_pretrained(staging)
    assert type(model) is MiniTxForCausalLM


# --- dry run: load in a clean process without hf_minitx -------------------------------------------


def _local_greedy(folder: Path, prompt: str, max_new_tokens: int) -> list[int]:
    """Greedy ids from the in-process hf_minitx model, to compare with the package-free child."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    auto = AutoModelForSeq2SeqLM if config.get("is_encoder_decoder") else AutoModelForCausalLM
    model = auto.from_pretrained(folder).eval()
    output = model.generate(**tokenizer([prompt], return_tensors="pt"), max_new_tokens=max_new_tokens,
                            min_new_tokens=1, do_sample=False)
    return output[0].tolist()


@pytest.mark.slow
def test_dry_run_causal_folder_loads_and_generates_without_hf_minitx(folders, tmp_path):
    staging, result = dry_run(folders["causal-lm"], tmp_path / "kjv-tiny-staged", repo_id="alice/kjv-tiny",
                              prompt="In the beginning", max_new_tokens=6)
    assert result.model_class.startswith("transformers_modules.") and result.model_class.endswith("MiniTxForCausalLM")
    assert result.config_class.endswith("configuration_minitx.MiniTxConfig")
    assert result.num_new_tokens == 6
    assert result.output_ids == _local_greedy(folders["causal-lm"], "In the beginning", 6)
    assert (staging / "README.md").is_file()


@pytest.mark.slow
def test_a_dry_run_of_a_diverged_model_repeats_its_training_warning(causal_copy, tmp_path, capsys):
    warning = "the final evaluation is far worse than chance (perplexity 1.014e+304): the model is unusable"
    _write_records(causal_copy, "causal-lm", CAUSAL_METRICS, warning=f"warning: {warning}")
    assert minitx(["push", "--model_dir", str(causal_copy), "--dry_run", str(tmp_path / "staged")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-2:] == [f"warning: {warning}", "dry run passed (mind the warning above): nothing was uploaded."]
    _write_records(causal_copy, "causal-lm", CAUSAL_METRICS)
    assert minitx(["push", "--model_dir", str(causal_copy), "--dry_run", str(tmp_path / "staged2")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "dry run passed: nothing was uploaded."


@pytest.mark.slow
def test_cli_dry_run_seq2seq_folder_loads_and_generates_without_hf_minitx(folders, tmp_path, capsys):
    staging = tmp_path / "numbers-staged"
    code = minitx(["push", "--model_dir", str(folders["seq2seq"]), "--dry_run", str(staging),
                          "--prompt", "seven hundred and twelve"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "loaded without hf_minitx as MiniTxForConditionalGeneration" in out and "dry run passed" in out
    from transformers import AutoTokenizer

    expected_ids = _local_greedy(folders["seq2seq"], "seven hundred and twelve", 8)[1:]  # drop decoder start
    expected_text = AutoTokenizer.from_pretrained(staging).decode(expected_ids, skip_special_tokens=True)
    assert f"generated {len(expected_ids)} tokens: {expected_text!r}" in out
    assert (staging / "README.md").is_file() and (staging / "model.safetensors").is_file()


@pytest.mark.slow
def test_package_free_check_reports_a_folder_that_cannot_load(folders, tmp_path, monkeypatch):
    """The child's last error, with the file and line of the folder's code, in one line; the whole traceback
    with HF_MINITX_TRACEBACK=1."""
    staging = stage_for_upload(folders["causal-lm"], tmp_path / "stage")
    (staging / "layers_minitx.py").write_text("import torch\n\nraise ImportError('broken layer code')\n")
    monkeypatch.setenv("HF_MINITX_TRACEBACK", "1")
    with pytest.raises(HubError) as failed:
        check_loads_without_package(staging)
    head, traceback = str(failed.value).split(":\n", 1)
    assert head == (f"{staging.resolve()} does not load without hf_minitx installed: ImportError: broken layer code "
                    "(in layers_minitx.py, line 3)")
    assert "Traceback (most recent call last):" in traceback and len(traceback.splitlines()) > 10
    monkeypatch.delenv("HF_MINITX_TRACEBACK")
    assert (str(child_failure(staging.resolve(), traceback, 1))
            == f"{head}; set HF_MINITX_TRACEBACK=1 to see the whole traceback")


FULL_DISK = """
with open("/dev/full", "w") as handle:  # every write fails as on a full disk
    handle.write("x" * 10)
"""


def test_a_full_temporary_folder_is_said_as_such_not_as_a_folder_that_cannot_load(tmp_path, monkeypatch):
    run = subprocess.run

    def child_on_a_full_disk(command, **kwargs):  # the check's own child, its writes failing as on a full disk
        return run([sys.executable, "-c", FULL_DISK], **kwargs)

    monkeypatch.setattr(subprocess, "run", child_on_a_full_disk)
    with pytest.raises(HubError) as failed:
        check_loads_without_package(tmp_path)
    message, where = str(failed.value), tempfile.gettempdir()
    assert message.startswith(f"the loading check of {tmp_path} could not write in the temporary folder {where} (No "
                              "space left on device), so it could not run; ")
    assert "MiB free there" in message and "TMPDIR" in message and "\n" not in message
    assert "does not load" not in message and "Traceback" not in message

    def full_temporary_folder(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"{where}/minitx-remote-check-x")

    monkeypatch.setattr(tempfile, "mkdtemp", full_temporary_folder)
    with pytest.raises(HubError) as failed:
        check_loads_without_package(tmp_path)
    assert str(failed.value) == message


CLEAN_LOAD = """
import json, sys
sys.modules["hf_minitx"] = None  # an environment without hf_minitx
from transformers import AutoTokenizer, PreTrainedTokenizerFast
model_dir, tokenizer_dir, text = sys.argv[1:]
loaded = [AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True),
          PreTrainedTokenizerFast.from_pretrained(model_dir), AutoTokenizer.from_pretrained(tokenizer_dir)]
print(json.dumps([tokenizer(text)["input_ids"] for tokenizer in loaded]))
"""


def test_tokenizer_loads_in_a_clean_environment_as_the_card_says(causal_copy, tmp_path):
    tokenizer_dir = tmp_path / "tokenizer"
    load_tokenizer(causal_copy).save_pretrained(tokenizer_dir)  # loaded and saved again, as --tokenizer does
    load_tokenizer(tokenizer_dir).save_pretrained(causal_copy)
    for folder in (tokenizer_dir, causal_copy):
        settings = json.loads((folder / "tokenizer_config.json").read_text())
        assert not {"is_local", "local_files_only"} & set(settings), settings
    text = SENTENCES[0]
    done = subprocess.run([sys.executable, "-c", CLEAN_LOAD, str(causal_copy), str(tokenizer_dir), text],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "warning"})
    assert done.returncode == 0, done.stderr
    assert "Do you wish" not in done.stdout + done.stderr and done.stderr.strip() == "", done.stderr
    expected = load_tokenizer(causal_copy)(text)["input_ids"]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [expected] * 3
    card = render_model_card(causal_copy)
    assert "AutoTokenizer.from_pretrained(repo, trust_remote_code=True)" in card
    assert "PreTrainedTokenizerFast.from_pretrained(repo)" in card and "loads it without custom code" not in card


def test_card_records_the_training_recipe(causal_copy):
    from hf_minitx.training.arguments import TrainArguments
    from hf_minitx.training.optim import build_optimizer, describe_optimizer, describe_schedule

    model = MiniTxForCausalLM.from_pretrained(causal_copy)
    args = TrainArguments(optimizer="muon", lr_scheduler_type="warmup_stable_decay", warmup_steps=10,
                          decay_ratio=0.2, muon_learning_rate=0.03)
    recipe = {"optimizer": "muon", "schedule": describe_schedule(args, 120), "global_batch_size": 32,
              "per_device_train_batch_size": 16, "gradient_accumulation_steps": 2, "block_size": 128,
              "max_grad_norm": 1.0, "parameter_groups": describe_optimizer(build_optimizer(model, args))}
    _write_records(causal_copy, "causal-lm", CAUSAL_METRICS, recipe=recipe)
    text = render_model_card(causal_copy, repo_id="alice/tiny")
    muon = recipe["parameter_groups"][0]
    assert "| Optimizer | `muon` |" in text
    assert (f"| Group `muon` | Muon, peak lr 0.03, weight decay {args.muon_weight_decay:g}, "
            f"momentum {args.muon_momentum:g}, "
            f"{muon['tensors']} tensors, {muon['parameters']:,} parameters |") in text
    assert (f"| Group `adamw_no_decay` | AdamW, peak lr {args.learning_rate:g}, weight decay 0, "
            f"betas ({args.adam_beta1:g}, {args.adam_beta2:g}),") in text
    assert ("| Schedule | `warmup_stable_decay`, 10 warmup steps, 120 steps, linear decay over the last 24 to 0 x "
            "peak |") in text
    assert "| Batch | 32 rows per optimizer step (16 per process x 2 accumulation) |" in text
    assert "| Block size | 128 tokens |" in text and "| Gradient clipping | 1 |" in text
    # a warmup longer than the run, then a resume that laid the schedule over more steps
    long_warmup = TrainArguments(lr_scheduler_type="cosine", warmup_steps=50)
    recipe["schedule"] = {**describe_schedule(long_warmup, 5),
                          "schedule_changes": [{"step": 4, "total_steps_before": 5, "total_steps": 8}]}
    _write_records(causal_copy, "causal-lm", CAUSAL_METRICS, recipe=recipe)
    assert ("| Schedule | `cosine`, 50 warmup steps, 5 steps (the warmup outlasted the run: the peak rate was never "
            "reached); from step 4 laid over 8 steps instead of 5 (a resume) |") in render_model_card(causal_copy)
    # late dropout: planned from a pass the 120 steps reached, then from one they did not
    recipe["late_dropout"] = {"probability": 0.1, "from_step": 100, "after_passes": 2.0}
    _write_records(causal_copy, "causal-lm", CAUSAL_METRICS, recipe=recipe)
    assert ("| Late dropout | 0.1 on the embeddings and sub-layer outputs from step 100, after 2 passes over the "
            "training data |") in render_model_card(causal_copy)
    recipe["late_dropout"]["from_step"] = 130
    _write_records(causal_copy, "causal-lm", CAUSAL_METRICS, recipe=recipe)
    assert ("| Late dropout | none: the run ended before step 130, where 0.1 would have started |"
            in render_model_card(causal_copy))


def test_the_card_of_a_run_that_ended_at_chance_carries_its_warning(causal_copy):
    warning = ("warning: the final evaluation is far worse than chance (perplexity 1.014e+304 with a 4096-token "
               "vocabulary): the training diverged and the model is unusable. Start again with a lower --learning_rate")
    diverged = {"eval_loss": 700.02, "eval_perplexity": 1.0142320547350045e304, "eval_bits_per_byte": 281.6}
    _write_records(causal_copy, "causal-lm", diverged, warning=warning)
    card = render_model_card(causal_copy)
    assert f"> **Warning:** {warning.removeprefix('warning: ')}" in card
    assert "| Validation perplexity | 1.014e+304 |" in card
    assert "| Validation loss (nats per token) | 700.0200 |" in card
    assert card.index("> **Warning:**") < card.index("| Metric | Value |")
    _write_records(causal_copy, "causal-lm", CAUSAL_METRICS)
    assert "Warning" not in render_model_card(causal_copy)


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


def test_card_says_what_temperature_was_folded_into_the_weights(causal_copy):
    fitted = {"temperature": 1.0949, "logit_scale": 0.91331, "fitted_on_tokens": 16256, "fitted_loss_before": 3.32147,
              "fitted_loss_after": 3.30100}
    _write_records(causal_copy, "causal-lm", CAUSAL_METRICS, calibration=fitted)
    assert ("| Temperature | the logits divided by 1.0949, folded into the final norm: fitted on 16,256 validation "
            "tokens, loss 3.3215 → 3.3010 |") in render_model_card(causal_copy)
    _write_records(causal_copy, "causal-lm", CAUSAL_METRICS, calibration={**fitted, "logit_scale": 1.0})
    assert "| Temperature |" not in render_model_card(causal_copy)  # fitted, but not worth folding in
