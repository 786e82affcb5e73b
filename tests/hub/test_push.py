"""Sharing: staging, repo ids, tokens, the upload, and the dry run that loads in a clean process."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import huggingface_hub
import pytest
import saved_model
from saved_model import (
    CAUSAL_METRICS,
    write_records,
)

from hf_minitx import MiniTxForCausalLM
from hf_minitx.cli import main as minitx
from hf_minitx.hub.folder import ModelFolderError
from hf_minitx.hub.push import (
    HubError,
    check_loads_without_package,
    check_model_card,
    check_repo_id,
    check_upload_ready,
    child_failure,
    dry_run,
    push_to_hub,
    resolve_token,
    stage_for_upload,
    transport_errors,
)

folders, causal_copy = saved_model.folders, saved_model.causal_copy  # the fixtures of saved models


def test_stage_copies_exactly_the_shareable_files(causal_copy, tmp_path):
    (causal_copy / "checkpoint-10").mkdir()
    (causal_copy / "checkpoint-10" / "optimizer.bin").write_bytes(b"0" * 10)
    (causal_copy / "scratch.txt").write_text("private notes")
    staging = stage_for_upload(causal_copy, tmp_path / "stage", repo_id="alice/kjv-tiny")
    staged = {path.name for path in staging.iterdir()}
    assert staged == {
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        "configuration_minitx.py", "modeling_minitx.py", "layers_minitx.py", "attention_minitx.py",
        "positions_minitx.py", "decoding_minitx.py", "cache_minitx.py", "checks_minitx.py", "lm_head_minitx.py",
        "training_summary.json", "metrics.jsonl", "README.md",
    }
    assert (staging / "model.safetensors").read_bytes() == (causal_copy / "model.safetensors").read_bytes()
    assert '"alice/kjv-tiny"' in (staging / "README.md").read_text()
    with pytest.raises(ValueError, match="already exists and is not empty: it already holds a model folder"):
        stage_for_upload(causal_copy, staging)


def test_a_dry_run_is_not_staged_inside_the_folder_it_copies(causal_copy, capsys):
    inside = causal_copy / "stage"
    assert minitx(["push", "--model_dir", str(causal_copy), "--dry_run", str(inside)]) == 2
    assert (f"--dry_run {inside} is inside {causal_copy} (--model_dir), which this command reads: its output would "
            "be written into its own input") in capsys.readouterr().err
    assert not inside.exists()


def test_a_card_staged_without_a_repo_id_is_named_after_the_model_folder(causal_copy, tmp_path):
    card = (stage_for_upload(causal_copy, tmp_path / "stage") / "README.md").read_text()
    assert f"\n# {causal_copy.name}\n" in card and f'"your-username/{causal_copy.name}"' in card
    assert ".partial" not in card  # not the hidden folder the copy was written in


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
    write_records(causal_copy, "causal-lm", CAUSAL_METRICS, warning="warning: the training diverged")
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


class _UnreachableApi(_RecordingApi):
    """The Hub's name does not resolve: the request never gets an answer."""

    error: type[BaseException] = OSError

    def create_repo(self, repo_id, **kwargs):
        raise self.error("[Errno -2] Name or service not known")


@pytest.mark.parametrize("error", transport_errors())
def test_a_hub_that_cannot_be_reached_is_one_error_line_naming_the_unchanged_folder(causal_copy, monkeypatch, capsys,
                                                                                   error):
    monkeypatch.setattr(huggingface_hub, "HfApi", _UnreachableApi)
    monkeypatch.setattr(_UnreachableApi, "error", error)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    before = sorted(path.name for path in causal_copy.iterdir())
    assert minitx(["push", "--model_dir", str(causal_copy), "--repo_id", "alice/kjv"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "the Hub could not be reached" in err and "Name or service not known" in err
    assert f"send it with `minitx push --model_dir {causal_copy} --repo_id alice/kjv`" in err
    assert sorted(path.name for path in causal_copy.iterdir()) == before


def test_offline_without_a_token_says_offline_first(causal_copy, monkeypatch, no_token):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError, match="HF_HUB_OFFLINE"):  # logging in would not help
        check_upload_ready("alice/kjv")


def test_cli_reports_bad_input_without_a_traceback(folders, no_token, capsys, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
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
    write_records(causal_copy, "causal-lm", CAUSAL_METRICS, warning=f"warning: {warning}")
    assert minitx(["push", "--model_dir", str(causal_copy), "--dry_run", str(tmp_path / "staged")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-2:] == [f"warning: {warning}", "dry run passed (mind the warning above): nothing was uploaded."]
    write_records(causal_copy, "causal-lm", CAUSAL_METRICS)
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


def test_a_folder_a_run_still_writes_or_a_two_phase_run_left_half_done_is_not_pushed(causal_copy, tmp_path, capsys):
    """Both hold a model folder's files (the teacher's, with its card) while the run's model is still to come."""
    from conftest import another_writer

    from hf_minitx.folders import LOCK_FILE

    with another_writer(causal_copy / LOCK_FILE, pid=1, host="elsewhere", command="train"):
        assert minitx(["push", "--model_dir", str(causal_copy), "--dry_run", str(tmp_path / "stage")]) == 2
    assert "--model_dir" in capsys.readouterr().err and not (tmp_path / "stage").exists()
    (causal_copy / LOCK_FILE).unlink()
    summary_file = causal_copy / "training_summary.json"
    summary = json.loads(summary_file.read_text())
    summary_file.write_text(json.dumps({**summary, "shape_plan": {"phases": {"minutes": 1.2}}}))  # the teacher
    assert minitx(["push", "--model_dir", str(causal_copy), "--dry_run", str(tmp_path / "stage")]) == 2
    err = capsys.readouterr().err
    assert "holds the teacher of a run in two phases that stopped before its student finished" in err
    assert "--resume_from_checkpoint latest, then push" in err and not (tmp_path / "stage").exists()
    finished = {**summary, "shape_plan": {"phases": {"minutes": 1.2}}, "phases": {"model_kept": "student"}}
    summary_file.write_text(json.dumps(finished))  # the run's own model: pushed
    assert minitx(["push", "--model_dir", str(causal_copy), "--dry_run", str(tmp_path / "stage")]) == 0
    teacher = causal_copy / "teacher"  # a finished run's teacher kept by --keep_phases: a model of its own
    shutil.copytree(tmp_path / "stage", teacher)
    (teacher / "training_summary.json").write_text(json.dumps({**summary, "shape_plan": {"phases": {"minutes": 1}}}))
    summary_file.write_text(json.dumps({**finished, "phases": {"model_kept": "student", "folders_kept": True}}))
    assert minitx(["push", "--model_dir", str(teacher), "--dry_run", str(tmp_path / "stage-teacher")]) == 0
