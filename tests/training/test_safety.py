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
from hf_minitx.training.arguments import TrainArguments
from hf_minitx.training.loop import main as train_main
from hf_minitx.training.optim import schedule_factor

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
    assert "holds files this command did not make" in err and "tokenizer.json" in err
    assert ("not made by minitx, so --overwrite_output_dir alone would not replace it: pass --overwrite_output_dir "
            "--overwrite_any_folder to replace it anyway, or choose another --output_dir") in err
    assert "resume" not in err  # no run of ours is there to continue
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
    assert "HF_HUB_OFFLINE" in capsys.readouterr().err  # offline first: a token would not help
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
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


# --- found by an adversarial tester: each was a broken promise --------------------------------------------

STARTUP_HOOK = """
import os, sys, time
import hf_minitx.training.run_folder as run_folder
import hf_minitx.training.setup as setup
where = os.environ["TEST_PAUSE_AT"]
real_corpus, real_load = setup.load_training_corpus, run_folder.load_tokenizer
def pause():
    print("PAUSED", flush=True)
    time.sleep(60)
def slow_corpus(plan):
    corpus = real_corpus(plan)
    if where == "data":
        pause()
    return corpus
def slow_load(path):
    if where == "staged" and path.endswith(".partial"):
        pause()  # the freshly trained tokenizer waits in its staging folder
    return real_load(path)
real_claim = setup.claim_output_folder
def slow_claim(plan):
    run_id = real_claim(plan)
    if where == "claimed":
        pause()  # the folder is replaced, no step is made yet
    return run_id
setup.load_training_corpus, run_folder.load_tokenizer, setup.claim_output_folder = slow_corpus, slow_load, slow_claim
from hf_minitx.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_overwrite_refuses_a_folder_holding_the_runs_own_inputs(tmp_path, text_file, capsys):  # noqa: F811
    folder = tmp_path / "dd"
    folder.mkdir()
    corpus = folder / "corpus.txt"
    shutil.copy(text_file, corpus)
    (folder / "preset.json").write_text('{"hidden_size": 32}')
    (folder / "args.json").write_text('{"max_steps": 2}')
    user_folder(folder / "tok")
    (folder / "data").mkdir()
    shutil.copy(text_file, folder / "data" / "corpus.txt")
    before = snapshot(folder)
    cases = [
        ["train", *causal_args(corpus, folder, "--max_steps", "2", "--overwrite_output_dir")],
        ["train", *causal_args(text_file, folder, "--overwrite_output_dir", "--tokenizer", str(folder / "tok"))],
        ["train", *causal_args(text_file, folder, "--max_steps", "2", "--overwrite_output_dir", "--preset",
                               str(folder / "preset.json"))],
        ["train", str(folder / "args.json"), *causal_args(text_file, folder, "--overwrite_output_dir")],
        ["train", *causal_args(folder / "data", folder, "--max_steps", "2", "--overwrite_output_dir")],  # a folder
        ["train-tokenizer", "--dataset", str(corpus), "--vocab_size", "300", "--output_dir", str(folder),
         "--overwrite"],
    ]
    for args in cases:
        assert minitx(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "which this command reads" in err[0], err
    assert snapshot(folder) == before


@pytest.mark.parametrize("extra, message", [
    (["--max_eval_samples", "0"], "--max_eval_samples must be >= 1"),
    (["--generation_eval_samples", "0"], "--generation_eval_samples must be >= 1"),
    (["--tokenizer_max_texts", "0"], "--tokenizer_max_texts must be >= 1"),
    (["--tokenizer_max_chars", "-5"], "--tokenizer_max_chars must be >= 1"),
    (["--tokenizer_vocab_size", "100"], "--tokenizer_vocab_size must be >= 260"),
    (["--tokenizer_vocab_size", str(2**40)], "--tokenizer_vocab_size must be at most 1,048,576"),
    (["--per_device_eval_batch_size", str(10**22)], "past what a 64-bit count holds"),  # failed at the first eval
    (["--eval_steps", "-1"], "--eval_steps must be >= 0"),
    (["--block_size", "1"], "--block_size must be >= 2"),
    (["--learning_rate", "inf"], "--learning_rate must be > 0 and at most 10"),
    (["--learning_rate", "nan"], "--learning_rate must be > 0 and at most 10"),
    (["--learning_rate", "1000"], "--learning_rate must be > 0 and at most 10"),
    (["--optimizer", "muon", "--muon_learning_rate", "nan"], "--muon_learning_rate must be > 0"),
    (["--optimizer", "muon", "--muon_weight_decay", "-1"], "--muon_weight_decay must be >= 0 and finite"),
    (["--weight_decay", "inf"], "--weight_decay must be >= 0 and finite"),
    (["--adam_epsilon", "nan"], "--adam_epsilon must be > 0 and finite"),
    (["--eval_steps", "nan"], "--eval_steps must be a finite number, got nan"),
    (["--checkpointing_steps", "inf"],
     "--checkpointing_steps is a whole number of steps or a fraction of the run in (0, 1), got inf"),
    (["--max_minutes", "nan"], "--max_minutes must be a finite number, got nan"),  # with --max_steps too
    (["--lr_scheduler_type", "warmup_stable_decay", "--min_lr_ratio", "nan"], "--min_lr_ratio must be"),
    (["--shift_windows", "true", "--streaming"], "--shift_windows cuts packed causal-lm text and does not apply"),
    (["--task", "seq2seq", "--max_source_length", "0"], "--max_source_length must be >= 2 (at least one token and"),
    (["--task", "seq2seq", "--max_target_length", "-1"], "--max_target_length must be >= 2 (at least one token and"),
])
def test_bad_counts_are_refused_before_any_work(tmp_path, text_file, capsys, extra, message):  # noqa: F811
    out = tmp_path / "run"
    assert minitx(["train", *causal_args(text_file, out, "--max_steps", "2", *extra)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra, message", [
    (["--max_texts", "0"], "--max_texts must be >= 1"),
    (["--max_texts", "-3"], "--max_texts must be >= 1"),
    (["--min_frequency", "-1"], "--min_frequency must be >= 0"),
    (["--vocab_size", "259"], "--vocab_size must be >= 260"),
    (["--vocab_size", str(10**9)], "--vocab_size must be at most 1,048,576 (the trainer allocates for every token"),
    (["--vocab_size", str(10**22)], f"--vocab_size {10**22} is past what a 64-bit count holds"),
])
def test_train_tokenizer_refuses_bad_counts(tmp_path, text_file, capsys, extra, message):  # noqa: F811
    out = tmp_path / "tok"
    assert minitx(["train-tokenizer", "--dataset", str(text_file), "--output_dir", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not out.exists()


@pytest.mark.parametrize("values, message", [
    (["norm_position", "post", "sideways"], "sideways"),
    (["steps", "3", "-2"], "steps must be positive"),
    (["steps", "3", "3"], "each value once"),
])
def test_experiment_compare_checks_every_value_before_creating_anything(tmp_path, capsys, values, message):
    out = tmp_path / "ex4"
    assert minitx(["experiment", "--steps", "2", "--output_dir", str(out), "--compare", *values]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not out.exists()


def test_preset_with_an_unknown_field_is_refused(tmp_path, text_file, capsys):  # noqa: F811
    preset = tmp_path / "preset.json"
    preset.write_text('{"hidden_sise": 32}')
    assert minitx(["train", *causal_args(text_file, tmp_path / "x", "--preset", str(preset))]) == 2
    err = capsys.readouterr().err.strip()
    assert "'hidden_sise' is not a MiniTxConfig field; did you mean hidden_size" in err and str(preset) in err
    assert not (tmp_path / "x").exists()


def ctrl_c_as_in_a_terminal() -> None:
    """In the child: SIGINT as a terminal delivers it. A shell that starts the tests in the background makes its
    children ignore SIGINT, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("pause_at", ["data", "staged"])
def test_ctrl_c_during_startup_ends_in_one_line_and_leaves_nothing(tmp_path, text_file, pause_at):  # noqa: F811
    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-c", STARTUP_HOOK, "train", *causal_args(text_file, out, "--max_steps", "2")],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", "TEST_PAUSE_AT": pause_at}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=ctrl_c_as_in_a_terminal)
    assert any(line.strip() == "PAUSED" for line in iter(process.stdout.readline, ""))
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == "interrupted before training started; nothing was written"
    assert list(tmp_path.iterdir()) == []  # no output folder, no tokenizer staging folder


def contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_replaced_folder_comes_back_when_setup_is_interrupted_or_fails(finished_run, text_file, tmp_path,  # noqa: F811
                                                                         monkeypatch):
    """The old contents wait aside from the claim to the first step's end: Ctrl-C or a failure in between puts them
    back, byte for byte, and leaves no hidden sibling."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    before = contents(out)
    process = subprocess.Popen(
        [sys.executable, "-c", STARTUP_HOOK, "train", *causal_args(text_file, out, "--max_steps", "2",
                                                                    "--overwrite_output_dir")],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", "TEST_PAUSE_AT": "claimed"}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=ctrl_c_as_in_a_terminal)
    assert any(line.strip() == "PAUSED" for line in iter(process.stdout.readline, ""))
    assert not (out / "model.safetensors").exists() and len(list(tmp_path.glob(".run.replaced-*"))) == 1
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == (f"interrupted before training started; {out} holds its old "
                                               "contents again: nothing was replaced")
    assert contents(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["run"]

    from hf_minitx.training import setup

    def fail(*args, **kwargs):
        raise RuntimeError("a failure after the claim")

    monkeypatch.setattr(setup, "build_evaluation", fail)
    with pytest.raises(RuntimeError, match="a failure after the claim"):
        train_main(causal_args(text_file, out, "--max_steps", "2", "--overwrite_output_dir"))
    assert contents(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_old_contents_a_killed_run_kept_aside_are_named_not_deleted(finished_run, text_file, tmp_path,  # noqa: F811
                                                                    capsys):
    """Even where this process has the pid of the killed one (a restarted container) and replaces the folder again,
    and where the folder's name holds glob characters."""
    out, aside = tmp_path / "run[1]", tmp_path / f".run[1].replaced-{os.getpid()}"
    shutil.copytree(finished_run, aside)  # as kill -9 leaves them, beside the run that replaced them
    shutil.copytree(finished_run, out)
    train_main(causal_args(text_file, out, "--max_steps", "1", "--overwrite_output_dir"))
    assert (f"note: {aside} holds what {out} held before a run that was killed replaced it; move it back or "
            "delete it yourself") in capsys.readouterr().out
    assert contents(aside) == contents(finished_run) and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [aside.name, out.name]  # this run's own aside is gone


def test_ctrl_c_while_the_libraries_load_ends_in_one_line(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "hf_minitx", "train", "--output_dir", str(tmp_path / "run")],
                               cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               preexec_fn=ctrl_c_as_in_a_terminal)
    time.sleep(0.5)  # importing torch and transformers takes seconds
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines() == ["interrupted while starting; nothing was written"]
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def short_run(text_file, tmp_path_factory) -> Path:  # noqa: F811
    """A finished 2-step run with its checkpoint at step 2."""
    out = tmp_path_factory.mktemp("short") / "run"
    train_main(causal_args(text_file, out, "--max_steps", "2", "--checkpointing_steps", "2"))
    return out


def test_resuming_a_complete_run_changes_nothing(short_run, text_file, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(short_run, run)
    before = snapshot(run)
    args = ["train", *causal_args(text_file, run, "--max_steps", "2", "--checkpointing_steps", "2",
                                  "--resume_from_checkpoint", "latest")]
    assert minitx(args) == 0
    assert "already complete at step 2; nothing to do" in capsys.readouterr().out
    assert snapshot(run) == before


def test_a_resume_behind_its_checkpoint_is_refused_and_a_summary_without_a_model_is_not_complete(
        short_run, text_file, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(short_run, run)
    resume = ["train", *causal_args(text_file, run, "--checkpointing_steps", "2", "--resume_from_checkpoint", "latest")]
    for name in ("model.safetensors", "config.json"):  # a summary alone is not a finished model
        (run / name).unlink()
    for summary in (True, False):  # with a summary, and with none (a run killed before its end)
        if not summary:
            (run / "training_summary.json").unlink()
        before = snapshot(run)
        assert minitx([*resume, "--max_steps", "1"]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(err) == 1 and "is at step 2, past the 1 steps this run asks for; resume with --max_steps 2" in err[0]
        assert snapshot(run) == before
    assert minitx([*resume, "--max_steps", "2"]) == 0
    assert "already complete" not in capsys.readouterr().out and (run / "model.safetensors").is_file()


def test_a_checkpoint_with_a_nan_weight_is_refused_on_resume_not_called_good(short_run, text_file, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(short_run, run)
    for name in ("model.safetensors", "config.json", "training_summary.json"):  # killed before its final save
        (run / name).unlink()
    weights_file = run / "checkpoint-2" / "pytorch_model.bin"
    weights = torch.load(weights_file, weights_only=True)
    weights[sorted(weights)[0]].view(-1)[0] = float("nan")  # damaged on disk
    torch.save(weights, weights_file)
    resume = ["train", *causal_args(text_file, run, "--max_steps", "4", "--checkpointing_steps", "2",
                                    "--resume_from_checkpoint", "latest")]
    assert minitx(resume) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and f"checkpoint {run / 'checkpoint-2'} holds 1 non-finite weight(s) (NaN or inf)" in err[0]
    assert "it is damaged" in err[0] and "learning_rate" not in err[0]
    assert not (run / "model.safetensors").exists()
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2"]


def test_damaged_run_marker_is_named(short_run, text_file, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(short_run, run)
    (run / ".minitx-run.json").write_text('{"command": ')
    before = snapshot(run)
    args = ["train", *causal_args(text_file, run, "--max_steps", "4", "--resume_from_checkpoint", "latest")]
    assert minitx(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ".minitx-run.json is damaged" in err[0]
    assert snapshot(run) == before


def test_resuming_with_changed_settings_is_one_line(short_run, text_file, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(short_run, run)
    args = ["train", *causal_args(text_file, run, "--max_steps", "4", "--resume_from_checkpoint", "latest"),
            "--block_size", "16",
            "--config_overrides", "hidden_size=64,intermediate_size=64,max_position_embeddings=64"]
    assert minitx(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "block_size: checkpoint has 32, this run has 16" in err[0] and "hidden_size" in err[0]


def test_error_messages_of_several_lines_are_printed_as_one(capsys):
    from hf_minitx.cli import run_cli

    def fails() -> None:
        raise ValueError("first part:\n  second part\n\nthird part")

    assert run_cli(fails) == 2
    assert capsys.readouterr().err == "error: first part: second part; third part\n"


def test_resume_refuses_changed_input_data(tmp_path, text_file, capsys):  # noqa: F811
    data, run = tmp_path / "mydata.txt", tmp_path / "run"
    shutil.copy(text_file, data)
    train_main(causal_args(data, run, "--max_steps", "2", "--checkpointing_steps", "2"))
    data.write_text(" ".join(reversed(text_file.read_text().split())))  # other text, same words
    before, _ = snapshot(run), capsys.readouterr()
    args = ["train", *causal_args(data, run, "--max_steps", "4", "--checkpointing_steps", "2",
                                  "--resume_from_checkpoint", "latest")]
    assert minitx(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"input file {data} changed" in err[0]
    assert snapshot(run) == before


def test_accepted_edits_that_move_other_text_into_validation_are_refused(tmp_path, capsys):
    data, run = tmp_path / "rows.jsonl", tmp_path / "run"
    sentence = "the quick brown fox jumps over a lazy dog while seven small birds sing about rivers and hills"

    def write(numbers: list[int]) -> None:
        data.write_text("".join(json.dumps({"text": f"record {i:03d}: {sentence}"}) + "\n" for i in numbers))

    write(list(range(120)))
    train_main(causal_args(data, run, "--max_steps", "2", "--checkpointing_steps", "2"))
    write(list(range(1, 121)))  # first record deleted, one of equal length appended: same rows and characters
    before, _ = snapshot(run), capsys.readouterr()
    args = ["train", *causal_args(data, run, "--max_steps", "4", "--checkpointing_steps", "2",
                                  "--resume_from_checkpoint", "latest", "--accept_changed_inputs")]
    assert minitx(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]  # not the bars
    assert len(err) == 1 and "validation would now hold other text, possibly trained on" in err[0], err
    assert "start a new run in another --output_dir" in err[0] and snapshot(run) == before
    state_file = run / "checkpoint-2" / "run_state.json"  # a checkpoint saved before the digest was recorded
    state = json.loads(state_file.read_text())
    del state["corpus_layout"]["validation_sha256"]
    state_file.write_text(json.dumps(state))
    assert minitx(args) == 0  # is compared on rows and characters, as before
    assert json.loads((run / "checkpoint-4" / "run_state.json").read_text())["step"] == 4


@pytest.mark.parametrize("schedule", ["cosine", "constant_with_warmup"])
def test_a_resume_with_more_steps_records_the_new_schedule_and_warns_of_a_jump(tmp_path, text_file, caplog,  # noqa: F811
                                                                             schedule):
    run = tmp_path / "run"
    args = causal_args(text_file, run, "--checkpointing_steps", "4", "--lr_scheduler_type", schedule)
    train_main([*args, "--max_steps", "6"])
    assert json.loads((run / "checkpoint-4" / "run_state.json").read_text())["total_steps"] == 6
    caplog.clear()
    train_main([*args, "--max_steps", "8", "--resume_from_checkpoint", str(run / "checkpoint-4")])
    recorded = json.loads((run / "training_summary.json").read_text())["recipe"]["schedule"]
    assert recorded["total_steps"] == 8
    assert recorded["schedule_changes"] == [{"step": 4, "total_steps_before": 6, "total_steps": 8}]
    jumps = [r.getMessage() for r in caplog.records if "is now laid over 8" in r.getMessage()]
    assert len(jumps) == (1 if schedule == "cosine" else 0)  # a constant rate does not move
    # the record goes on with the run: the checkpoints saved after the resume carry it to later resumes
    state = json.loads((run / "checkpoint-8" / "run_state.json").read_text())
    assert state["total_steps"] == 8 and state["schedule_changes"] == recorded["schedule_changes"]
    # and the steps after the resume run at the new schedule's rates from the first one on (step 5 ran at the old
    # rate once: the optimizer came back from the checkpoint with it)
    rates = {r["step"]: r["learning_rate"] for r in records(run, "train")}
    laid = TrainArguments(lr_scheduler_type=schedule, warmup_steps=2)
    peak = rates[3] / schedule_factor(laid, 6)(2)  # step 3 ran before the resume, at the 6-step schedule
    for step in (5, 6, 7, 8):
        assert rates[step] == pytest.approx(peak * schedule_factor(laid, 8)(step - 1)), step


def test_a_checkpoint_named_without_its_folder_gets_the_path_it_meant(tmp_path, text_file, capsys, monkeypatch):  # noqa: F811
    run = tmp_path / "run"
    args = causal_args(text_file, run, "--checkpointing_steps", "2", "--max_steps", "2")
    train_main(args)
    monkeypatch.chdir(tmp_path)  # checkpoint-2 is inside run/, not here
    capsys.readouterr()
    assert minitx(["train", *args, "--max_steps", "4", "--resume_from_checkpoint", "checkpoint-2"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "--resume_from_checkpoint checkpoint-2 does not exist (a path is read from the " \
        f"current folder: did you mean {run / 'checkpoint-2'}?); pass 'latest'" in err[0], err
    (tmp_path / "empty").mkdir()
    assert minitx(["train", *args, "--max_steps", "4", "--resume_from_checkpoint", "empty"]) == 2
    assert "--resume_from_checkpoint empty is not a checkpoint folder (no run_state.json); pass" in \
        capsys.readouterr().err


def test_a_streamed_run_refuses_accepted_edits_that_move_text_into_validation(tmp_path, capsys):
    data, run = tmp_path / "rows.jsonl", tmp_path / "run"
    sentence = "the quick brown fox jumps over a lazy dog while seven small birds sing about rivers and hills"

    def write(numbers: list[int], edit: int | None = None) -> None:
        texts = [f"record {i:03d}: {sentence}" for i in numbers]
        if edit is not None:
            texts[edit] = texts[edit].replace("quick", "QUICK")  # edited in place, same length
        data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))

    write(list(range(200)))
    args = causal_args(data, run, "--streaming", "--checkpointing_steps", "2", "--max_eval_samples", "4")
    train_main([*args, "--max_steps", "2"])
    resume = ["train", *args, "--max_steps", "4", "--resume_from_checkpoint", "latest", "--accept_changed_inputs"]
    write(list(range(1, 201)))  # the first record deleted, one of equal length appended
    capsys.readouterr()
    assert minitx(resume) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "validation would now hold other text, possibly trained on" in err[0], err
    assert not (run / "checkpoint-4").exists()
    write(list(range(200)), edit=5)  # a training row edited in place: what validation holds is unchanged
    assert minitx(resume) == 0 and (run / "checkpoint-4").is_dir()
    capsys.readouterr()  # another --max_eval_samples evaluates on other blocks: named, not taken for moved text
    assert minitx([*resume, "--max_steps", "6", "--max_eval_samples", "2"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "--max_eval_samples 4 blocks, this one asks for 2" in err[0], err


def test_a_launchers_sigterm_right_after_ctrl_c_is_the_same_stop_and_ctrl_c_again_quits(monkeypatch):
    """torchrun answers the terminal's SIGINT with a SIGTERM to its workers, which got the SIGINT too: quitting at
    once on it would lose the steps since the last checkpoint. Ctrl-C again, or a signal a moment later, quits."""
    import signal

    from hf_minitx.training import signals

    quits: list[int] = []
    monkeypatch.setattr(signals.os, "_exit", quits.append)
    clock = iter([100.0, 100.2, 200.0, 200.5, 202.0])  # read by a first signal and by another kind
    monkeypatch.setattr(signals.time, "monotonic", lambda: next(clock))
    stop = signals.StopSignals()
    stop.handle(signal.SIGINT, None)  # 100.0
    stop.handle(signal.SIGTERM, None)  # 100.2: the launcher's echo
    assert quits == [] and stop.received == signal.SIGINT
    stop.handle(signal.SIGINT, None)  # Ctrl-C again
    assert quits == [130]
    late = signals.StopSignals()
    late.handle(signal.SIGTERM, None)  # 200.0
    late.handle(signal.SIGINT, None)  # 200.5: still the same stop
    assert quits == [130]
    late.handle(signal.SIGINT, None)  # 202.0: a moment later, a second stop
    assert quits == [130, 130]


def test_only_the_first_process_of_a_launch_catches_sigterm_in_setup(monkeypatch):
    """The others write nothing in setup; waiting for the first inside the process group's start, a Python
    handler would never run and the launcher's SIGTERM would wait 30 s for its SIGKILL."""
    import signal

    from hf_minitx.training.signals import TermDuringSetup

    before = signal.getsignal(signal.SIGTERM)
    for rank, caught in ((None, True), ("0", True), ("1", False)):
        if rank is None:
            monkeypatch.delenv("RANK", raising=False)
        else:
            monkeypatch.setenv("RANK", rank)
        with TermDuringSetup() as setup:
            assert (signal.getsignal(signal.SIGTERM) == setup.handle) is caught
        assert signal.getsignal(signal.SIGTERM) == before
