"""Nothing is lost: each command refuses to write over a folder or file it was not asked to replace (checked
with hashes of everything in it), every check runs before the first byte is written, interruptions by real
signals and kill -9 leave a run that resumes to the weights of an uninterrupted one, and a damaged
checkpoint is named."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train import causal_args, records, text_file  # noqa: F401  (text_file is a fixture)

from hf_minitx.cli import main as minitx
from hf_minitx.training.loop import main as train_main

REPO = Path(__file__).resolve().parents[2]

# Runs `minitx` in a subprocess, optionally slowed down per step (so a signal lands mid-run) or hanging
# inside one checkpoint save (so kill -9 lands there). Neither changes what is computed.
HOOK = """
import os, sys, time
import hf_minitx.training.loop as loop
from accelerate import Accelerator
step_delay = float(os.environ.get("TEST_STEP_DELAY", "0"))
hang_in = os.environ.get("TEST_HANG_IN_SAVE")
real_step, real_save = loop.train_step, Accelerator.save_state
def slow_step(*args, **kwargs):
    time.sleep(step_delay)
    return real_step(*args, **kwargs)
def hanging_save(self, output_dir=None, **kwargs):
    result = real_save(self, output_dir, **kwargs)
    if hang_in and hang_in in str(output_dir):
        print("HANGING IN SAVE", flush=True)
        time.sleep(600)
    return result
loop.train_step, Accelerator.save_state = slow_step, hanging_save
from hf_minitx.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield


def snapshot(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under ``folder``."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def user_folder(folder: Path) -> Path:
    """A folder of someone's files that no minitx command made (a tokenizer and a README)."""
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text('{"version": "mine"}')
    (folder / "README.md").write_text("my notes\n")
    return folder


@pytest.fixture(scope="module")
def finished_run(text_file, tmp_path_factory) -> Path:  # noqa: F811
    """A finished 6-step causal run with checkpoints at steps 2, 4 and 6 (dropout on)."""
    out = tmp_path_factory.mktemp("safety") / "finished"
    train_main(causal_args(text_file, out, *STRAIGHT))
    return out


STRAIGHT = ("--max_steps", "6", "--checkpointing_steps", "2", "--save_total_limit", "3", "--config_overrides",
            "hidden_size=32,intermediate_size=64,max_position_embeddings=64,hidden_dropout=0.1")


def assert_same_weights(a: Path, b: Path) -> None:
    first, second = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


def has_a_train_record(out: Path) -> bool:
    try:
        return bool(records(out, "train"))
    except (OSError, ValueError):  # not written yet, or a line being written
        return False


def run_hooked(args: list[str], **env: str) -> subprocess.Popen:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen([sys.executable, "-c", HOOK, *args], cwd=REPO, env=full_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# --- every command refuses what it was not asked to replace ----------------------------------------------


@pytest.mark.slow
def test_experiment_refuses_a_finished_training_run(finished_run, capsys):
    before = snapshot(finished_run)
    assert minitx(["experiment", "--steps", "2", "--output_dir", str(finished_run)]) == 2
    assert "already holds a run of `minitx train`" in capsys.readouterr().err
    assert snapshot(finished_run) == before


@pytest.mark.slow
def test_resuming_another_runs_checkpoint_into_a_run_is_refused(finished_run, text_file, tmp_path):  # noqa: F811
    other = tmp_path / "B"
    shutil.copytree(finished_run, other)
    (other / ".minitx-run.json").write_text(json.dumps({"command": "train", "run_id": "someone-else"}))
    before = snapshot(other)
    with pytest.raises(ValueError, match="belongs to the run in"):
        train_main(causal_args(text_file, other, *STRAIGHT, "--resume_from_checkpoint",
                               str(finished_run / "checkpoint-4")))
    with pytest.raises(ValueError, match="made by run .* belongs to run someone-else"):
        train_main(causal_args(text_file, other, *STRAIGHT, "--resume_from_checkpoint", "latest"))
    assert snapshot(other) == before


@pytest.mark.slow
def test_overwrite_with_a_bad_dataset_deletes_nothing(finished_run, tmp_path, capsys):
    before = snapshot(finished_run)
    args = ["train", "--dataset", str(tmp_path / "misspelt.txt"), "--preset", "tiny", "--overwrite_output_dir",
            "--output_dir", str(finished_run), "--disable_tqdm"]
    assert minitx(args) == 2
    assert "misspelt.txt" in capsys.readouterr().err
    assert snapshot(finished_run) == before


def test_train_refuses_a_folder_of_user_files(tmp_path, text_file, capsys):  # noqa: F811
    folder = user_folder(tmp_path / "tokenizer")
    before = snapshot(folder)
    assert minitx(["train", *causal_args(text_file, folder, "--max_steps", "1")]) == 2
    err = capsys.readouterr().err
    assert "holds files this command did not make" in err and "tokenizer.json" in err and "--overwrite_output_dir" in err
    assert snapshot(folder) == before


@pytest.mark.slow
def test_train_tokenizer_refuses_a_model_folder_and_a_file(finished_run, tmp_path, capsys):
    before = snapshot(finished_run)
    assert minitx(["train-tokenizer", "--dataset", "builtin:pydocs", "--output_dir", str(finished_run)]) == 2
    assert snapshot(finished_run) == before
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    assert minitx(["train-tokenizer", "--dataset", "builtin:pydocs", "--output_dir", str(a_file)]) == 2
    assert "is a file" in capsys.readouterr().err and a_file.read_text() == "keep me"


def test_bad_time_budget_and_push_without_token_write_nothing(tmp_path, text_file, monkeypatch, capsys):  # noqa: F811
    out = tmp_path / "run"
    assert minitx(["train", *causal_args(text_file, out, "--max_minutes", "-1")]) == 2
    assert "--max_minutes must be > 0" in capsys.readouterr().err
    import huggingface_hub

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    assert minitx(["train", *causal_args(text_file, out, "--push_to_hub", "--hub_model_id", "alice/x")]) == 2
    assert "token" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".run*"))


def test_single_file_outputs_are_not_overwritten_unless_ours_or_asked(tmp_path, capsys):
    mine = tmp_path / "picture.png"
    mine.write_bytes(b"not a minitx picture")
    assert minitx(["visualize", "masks", "--out", str(mine)]) == 2
    assert "--overwrite" in capsys.readouterr().err and mine.read_bytes() == b"not a minitx picture"
    ours = tmp_path / "masks.png"
    assert minitx(["visualize", "masks", "--out", str(ours)]) == 0
    assert minitx(["visualize", "masks", "--out", str(ours)]) == 0  # our own picture is replaced
    assert minitx(["visualize", "masks", "--out", str(mine), "--overwrite"]) == 0
    assert mine.read_bytes()[:4] == b"\x89PNG"
    results = tmp_path / "results.json"
    results.write_text("{}")
    assert minitx(["benchmark", "--quick", "--json", str(results)]) == 2
    assert results.read_text() == "{}"


# --- damaged input is named --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name, damage", [
    ("optimizer.bin", lambda path: path.write_bytes(b"")),
    ("pytorch_model.bin", lambda path: path.write_bytes(path.read_bytes()[:100])),
    ("run_state.json", lambda path: path.write_text(path.read_text()[:20])),
])
def test_damaged_checkpoint_file_is_named(finished_run, text_file, tmp_path, capsys, name, damage):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    damage(run / "checkpoint-6" / name)
    before = snapshot(run)
    assert minitx(["train", *causal_args(text_file, run, *STRAIGHT, "--resume_from_checkpoint", "latest")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"checkpoint-6/{name}" in err[0] and "resume from an older one" in err[0]
    assert snapshot(run) == before


def test_malformed_recipe_and_preset_are_named(tmp_path, capsys):
    recipe = tmp_path / "recipe.json"
    recipe.write_text('{"task": "causal-lm",')
    assert minitx(["train", str(recipe), "--output_dir", str(tmp_path / "x")]) == 2
    assert str(recipe) in capsys.readouterr().err
    preset = tmp_path / "preset.json"
    preset.write_text("{hidden_size: 3")
    assert minitx(["train", "--preset", str(preset), "--output_dir", str(tmp_path / "x")]) == 2
    assert str(preset) in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# --- interruptions ----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_saves_a_checkpoint_that_resumes_to_the_same_weights(finished_run, text_file, tmp_path, sig, code):  # noqa: F811
    out = tmp_path / "interrupted"
    process = run_hooked(["train", *causal_args(text_file, out, *STRAIGHT)], TEST_STEP_DELAY="0.5")
    deadline = time.time() + 120
    while not has_a_train_record(out) and time.time() < deadline:
        time.sleep(0.1)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == code, stderr
    assert "Traceback" not in stderr and "--resume_from_checkpoint latest" in stderr
    step = max(r["step"] for r in records(out, "train"))
    assert step < 6 and (out / f"checkpoint-{step}").is_dir() and not (out / "model.safetensors").exists()
    train_main(causal_args(text_file, out, *STRAIGHT, "--resume_from_checkpoint", "latest"))
    assert_same_weights(finished_run, out)


@pytest.mark.slow
def test_kill_during_a_checkpoint_save_leaves_a_resumable_run(finished_run, text_file, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "killed"
    process = run_hooked(["train", *causal_args(text_file, out, *STRAIGHT)], TEST_HANG_IN_SAVE="checkpoint-4")
    lines = iter(process.stdout.readline, "")
    assert any(line.strip() == "HANGING IN SAVE" for line in lines)
    process.kill()  # SIGKILL, in the middle of writing checkpoint-4
    process.wait(timeout=30)
    assert (out / "checkpoint-2" / "run_state.json").is_file() and not (out / "checkpoint-4").exists()
    (out / "checkpoint-5").mkdir()  # an incomplete checkpoint left by an older version: latest skips it
    train_main(causal_args(text_file, out, *STRAIGHT, "--resume_from_checkpoint", "latest"))
    assert "skipping incomplete checkpoint" in capsys.readouterr().err
    assert_same_weights(finished_run, out)
    assert [r["loss"] for r in records(out, "train")] == [r["loss"] for r in records(finished_run, "train")]
