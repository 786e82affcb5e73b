"""Trust at the edges of a run: a stop signal at the final evaluation, at the final save or mid-stream leaves a
run that resumes (to bit-identical weights); a full disk is one line and leaves the last checkpoint usable;
the validation split cannot change under a resumed run; repeated input files are read once; damaged or
foreign checkpoint files are named; bytes that are not UTF-8 are named and can be skipped; arguments that
need no data are checked first; the summary says which precision really ran."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from accelerate import Accelerator
from test_safety import (  # noqa: F401  (_fresh_accelerate_state is an autouse fixture)
    REPO,
    STARTUP_HOOK,
    _fresh_accelerate_state,
    assert_same_weights,
    has_a_train_record,
    run_hooked,
    snapshot,
)
from test_streaming_train import corpus, stream_args  # noqa: F401  (corpus is a fixture)
from test_train import causal_args, records, seq2seq_args, text_file  # noqa: F401  (text_file is a fixture)

import hf_minitx.training.end_of_run as end_of_run
import hf_minitx.training.setup as setup
from hf_minitx.cli import main as minitx
from hf_minitx.data.corpus import REPLACED_BYTES, load_corpus, local_inputs
from hf_minitx.folders import LOCK_FILE
from hf_minitx.training.checkpoints import check_compatible
from hf_minitx.training.loop import main as train_main

# 5 steps, a checkpoint every 2: the last one before the end is checkpoint-4.
FIVE = ("--max_steps", "5", "--checkpointing_steps", "2", "--save_total_limit", "3", "--config_overrides",
        "hidden_size=32,intermediate_size=64,max_position_embeddings=64,hidden_dropout=0.1")

# A test-only pause (the process prints a marker, then waits) at the final evaluation or inside the final save,
# so that a signal lands exactly there. Nothing that is computed changes.
PAUSE_HOOK = """
import os, sys, time
import hf_minitx.training.end_of_run as end_of_run
import hf_minitx.training.loop as loop
where = os.environ["TEST_PAUSE_IN"]
real_validate, real_save = loop.validate, end_of_run.save_final_model
def paused_validate(run, state, **record):
    if where == "final-eval" and state.step == run.settings.total_steps and not record:
        print("PAUSED", flush=True)
        time.sleep(3)
    return real_validate(run, state, **record)
real_calibrate = loop.calibrate
def paused_calibrate(*args, **kwargs):
    if where == "temperature-fit":
        print("PAUSED", flush=True)
        time.sleep(3)
    return real_calibrate(*args, **kwargs)
loop.calibrate = paused_calibrate
def paused_save(*args, **kwargs):
    result = real_save(*args, **kwargs)
    if where == "final-save":
        print("PAUSED", flush=True)
        time.sleep(3)
    return result
loop.validate, end_of_run.save_final_model = paused_validate, paused_save
from hf_minitx.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def five_steps(text_file, tmp_path_factory) -> Path:  # noqa: F811
    """An uninterrupted 5-step run (checkpoints at 2 and 4)."""
    out = tmp_path_factory.mktemp("end") / "straight"
    train_main(causal_args(text_file, out, *FIVE))
    return out


def run_paused(args: list[str], where: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PAUSE_HOOK, *args], cwd=REPO, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "TEST_PAUSE_IN": where},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def signal_when_paused(args: list[str], where: str, sig: int, code: int) -> str:
    """Run ``args`` paused at ``where``, send ``sig`` there, and check it exits with ``code`` and no traceback;
    returns its stderr."""
    process = run_paused(args, where)
    assert any(line.strip() == "PAUSED" for line in iter(process.stdout.readline, ""))
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == code, stderr
    assert "Traceback" not in stderr
    return stderr


def partials(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".partial" in p.name]


# --- 1. the end of a run is protected ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_at_the_final_evaluation_saves_the_last_step_and_resumes(five_steps, text_file, tmp_path, sig, code):  # noqa: F811
    out = tmp_path / "run"
    stderr = signal_when_paused(["train", *causal_args(text_file, out, *FIVE)], "final-eval", sig, code)
    assert f"after step 5; saved {out / 'checkpoint-5'}" in stderr and "--resume_from_checkpoint latest" in stderr
    assert (out / "checkpoint-5" / "run_state.json").is_file() and not (out / "training_summary.json").exists()
    train_main(causal_args(text_file, out, *FIVE, "--resume_from_checkpoint", "latest"))  # the same command
    assert_same_weights(five_steps, out)
    assert json.loads((out / "training_summary.json").read_text())["steps"] == 5


@pytest.mark.slow
def test_signal_during_the_final_save_completes_it(text_file, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    stderr = signal_when_paused(["train", *causal_args(text_file, out, *FIVE)], "final-save", signal.SIGTERM, 143)
    assert "during the final save, which was completed first" in stderr
    assert (out / "model.safetensors").is_file() and (out / "training_summary.json").is_file()
    assert partials(out) == []
    args = ["train", *causal_args(text_file, out, *FIVE, "--resume_from_checkpoint", "latest")]
    assert minitx(args) == 0  # the same command resumed: nothing left to do
    assert "already complete at step 5" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_the_temperature_fit_finishes_the_run_then_says_so(
        five_steps, text_file, tmp_path, sig, code):  # noqa: F811
    out = tmp_path / "run"
    stderr = signal_when_paused(["train", *causal_args(text_file, out, *FIVE)], "temperature-fit", sig, code)
    assert "during the temperature fit, which was completed first" in stderr
    assert partials(out) == []
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["steps"] == 5 and "calibration" in summary
    assert_same_weights(five_steps, out)  # the model an uninterrupted run saves


def test_a_second_ctrl_c_during_the_steps_quits_at_once_and_says_so(text_file, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    process = run_paused(["train", *causal_args(text_file, out, *FIVE)], "final-eval")
    assert any(line.strip() == "PAUSED" for line in iter(process.stdout.readline, ""))
    process.send_signal(signal.SIGINT)
    time.sleep(1.5)  # past the window in which a launcher's echo of the first signal is not a second one
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "SIGINT again: quitting at once, without saving; the last checkpoint, if any, continues with " \
           "--resume_from_checkpoint latest" in stderr and "Traceback" not in stderr
    assert (out / "checkpoint-4").is_dir() and not (out / "training_summary.json").exists()


def test_a_second_ctrl_c_during_the_final_save_still_completes_it(text_file, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"  # no checkpoints: the final save is the only copy of the run
    process = run_paused(["train", *causal_args(text_file, out, "--max_steps", "3")], "final-save")
    assert any(line.strip() == "PAUSED" for line in iter(process.stdout.readline, ""))
    process.send_signal(signal.SIGINT)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)  # the impatient second Ctrl-C
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "quitting now would lose the run" in stderr
    assert (out / "model.safetensors").is_file() and (out / "training_summary.json").is_file()
    assert partials(tmp_path) == [] and not (out / LOCK_FILE).exists()
    assert minitx(["train", *causal_args(text_file, out, "--max_steps", "3", "--resume_from_checkpoint",
                                         "latest")]) == 2  # nothing to resume: the run is complete
    assert "holds no checkpoint-STEP folder" in capsys.readouterr().err


FILL_THE_DISK = """
import os, sys
from pathlib import Path
import hf_minitx.training.checkpoints as checkpoints
real = checkpoints.rotate_checkpoints
def rotate_then_fill(output_dir, keep):
    done = real(output_dir, keep)
    if (Path(output_dir) / "checkpoint-4").is_dir():  # the disk is full from the last checkpoint on
        with open(os.environ["TEST_FILLER"], "wb") as handle:
            try:
                while True:
                    handle.write(b"x" * 65536)
                    handle.flush()
            except OSError:
                pass
    return done
checkpoints.rotate_checkpoints = rotate_then_fill
import hf_minitx.training.rescue as rescue
rescue.rescue_places = lambda: [Path(os.environ["TEST_RESCUE"])]  # another disk, with room
from hf_minitx.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_really_full_disk_at_the_final_save_is_one_line_and_resumes(five_steps, text_file, tmp_path):  # noqa: F811
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root); the injected failures below stand in")
    try:
        out, filler, elsewhere = disk / "run", disk / "filler", tmp_path / "elsewhere"
        elsewhere.mkdir()
        process = subprocess.run(
            [sys.executable, "-c", FILL_THE_DISK, "train", *causal_args(text_file, out, *FIVE)], cwd=REPO, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "TEST_FILLER": str(filler), "TEST_RESCUE": str(elsewhere)},
            capture_output=True, timeout=300)
        assert process.returncode == 2, process.stderr
        err = [line for line in process.stderr.strip().splitlines() if line.startswith("error:")]
        assert len(err) == 1 and "No space left on device" in err[0]
        assert "the finished model of 5 steps was saved" in err[0]
        assert "Traceback" not in process.stderr and partials(disk) == [] and not (out / LOCK_FILE).exists()
        (rescued,) = elsewhere.iterdir()  # the trained weights survive the full disk
        assert_same_weights(five_steps, rescued)
        filler.unlink()  # and the last checkpoint still resumes to them
        train_main(causal_args(text_file, out, *FIVE, "--resume_from_checkpoint", "latest"))
        assert_same_weights(five_steps, out)
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.parametrize("message", [
    'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })',
    "Error while serializing: I/O error: No space left on device (os error 28)"])  # older, newer safetensors
def test_a_safetensors_write_failure_is_one_line(text_file, tmp_path, monkeypatch, capsys, message):  # noqa: F811
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError(message)

    import transformers.modeling_utils

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    out = tmp_path / "run"
    assert minitx(["train", *causal_args(text_file, out, *FIVE)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]  # not the bars
    assert len(err) == 1 and "No space left on device" in err[0] and f"{out / 'checkpoint-4'}, is intact" in err[0]
    assert partials(tmp_path) == []


def test_sigterm_during_startup_ends_in_one_line_and_leaves_nothing(tmp_path, text_file):  # noqa: F811
    process = subprocess.Popen(
        [sys.executable, "-c", STARTUP_HOOK, "train", *causal_args(text_file, tmp_path / "run", "--max_steps", "2")],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", "TEST_PAUSE_AT": "staged"}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert any(line.strip() == "PAUSED" for line in iter(process.stdout.readline, ""))
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1] == "interrupted before training started; nothing was written"
    assert list(tmp_path.iterdir()) == []  # no output folder, no tokenizer staging folder


def _full_disk_in(name: str):
    real = Accelerator.save_state

    def save_state(self, output_dir=None, **kwargs):
        if name in str(output_dir):
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            (Path(output_dir) / "half-written.bin").write_bytes(b"x")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, output_dir, **kwargs)

    return save_state


def test_a_full_disk_at_a_checkpoint_is_one_line_and_the_last_checkpoint_resumes(
        five_steps, text_file, tmp_path, monkeypatch, capsys):  # noqa: F811
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(Accelerator, "save_state", _full_disk_in("checkpoint-4"))
        assert minitx(["train", *causal_args(text_file, out, *FIVE)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot write {out} (No space left on device;" in err[0] and "MiB free there" in err[0]
    assert f"{out / 'checkpoint-2'}, is intact" in err[0]
    assert partials(tmp_path) == [] and not (out / "checkpoint-4").exists()
    train_main(causal_args(text_file, out, *FIVE, "--resume_from_checkpoint", "latest"))
    assert_same_weights(five_steps, out)


def test_a_full_disk_at_the_final_save_leaves_no_hidden_folder(text_file, tmp_path, monkeypatch, capsys):  # noqa: F811
    out = tmp_path / "run"

    def full(model, tokenizer, folder, *args, **kwargs):
        Path(folder).mkdir(parents=True, exist_ok=True)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(end_of_run, "save_final_model", full)
    assert minitx(["train", *causal_args(text_file, out, *FIVE)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]  # not the bars
    assert len(err) == 1 and "No space left on device" in err[0] and "checkpoint-4" in err[0], err
    assert partials(tmp_path) == [] and (out / "checkpoint-4" / "run_state.json").is_file()


def test_a_full_disk_at_the_final_save_of_a_run_without_checkpoints_says_how_to_start_again(
        text_file, tmp_path, monkeypatch, capsys):  # noqa: F811
    out, args = tmp_path / "run", ["train", *causal_args(text_file, tmp_path / "run", "--max_steps", "2")]

    def full(model, tokenizer, folder, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(end_of_run, "save_final_model", full)
        assert minitx(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]  # not the bars
    assert len(err) == 1 and "no checkpoint was saved before" in err[0], err
    assert err[0].endswith("start the run again with the same command plus --overwrite_output_dir")
    assert minitx(args) == 2  # a plain re-run is refused: the folder holds the unfinished run
    assert minitx([*args, "--overwrite_output_dir"]) == 0 and (out / "model.safetensors").is_file()  # the advice


# --- 2. validation integrity ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_steps(text_file, tmp_path_factory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("split") / "run"
    train_main(causal_args(text_file, out, "--max_steps", "2", "--checkpointing_steps", "2"))
    return out


@pytest.mark.parametrize("extra, field", [
    (["--seed", "7"], "seed: checkpoint has 42, this run has 7"),
    (["--validation_split", "0.1"], "validation_split: checkpoint has 0.05, this run has 0.1"),
    (["--streaming", "--shuffle_buffer", "4"], "streaming: checkpoint has False, this run has True"),
])
def test_resuming_with_another_validation_split_is_refused(two_steps, text_file, tmp_path, capsys, extra, field):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(two_steps, run)
    before = snapshot(run)
    args = ["train", *causal_args(text_file, run, "--max_steps", "4", "--resume_from_checkpoint", "latest"), *extra]
    assert minitx(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]
    assert snapshot(run) == before


def test_resuming_a_streaming_run_without_streaming_is_refused(corpus, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    train_main(stream_args(corpus, out, "--max_steps", "2", "--checkpointing_steps", "2"))
    before = snapshot(out)
    args = stream_args(corpus, out, "--max_steps", "4", "--resume_from_checkpoint", "latest")
    args.remove("--streaming")  # rows read in memory would carve another validation split than the stream's
    del args[args.index("--shuffle_buffer") : args.index("--shuffle_buffer") + 2]
    capsys.readouterr()
    assert minitx(["train", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "streaming: checkpoint has True, this run has False" in err[0], err
    assert snapshot(out) == before


def test_a_file_listed_twice_or_matched_twice_is_read_once(tmp_path, caplog):
    folder = tmp_path / "texts"
    folder.mkdir()
    for name in ("a", "b"):
        (folder / f"{name}.txt").write_text("\n".join(f"{name} line {i} of text" for i in range(40)) + "\n")
    once = load_corpus(f"{folder / 'a.txt'},{folder / 'b.txt'}", validation_split=0.5)
    for spec in (f"{folder / 'a.txt'},{folder / 'a.txt'},{folder / 'b.txt'}", f"{folder}/*.txt,{folder / 'a.txt'}"):
        twice = load_corpus(spec, validation_split=0.5)
        assert twice["train"]["text"] == once["train"]["text"]
        assert twice["validation"]["text"] == once["validation"]["text"]
        assert sorted(map(str, local_inputs(spec))) == [str(folder / "a.txt"), str(folder / "b.txt")]
    assert "more than once" in caplog.text and "each file is read once" in caplog.text


@pytest.mark.parametrize("link", ["symlink", "hard link"])
@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_a_symlink_in_a_dataset_folder_is_read_once(tmp_path, caplog, suffix, link):
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("a", "b"):
        lines = [f"{name} line {i} of text" for i in range(40)]
        (folder / f"{name}{suffix}").write_text("\n".join(lines if suffix == ".txt" else
                                                          (json.dumps({"text": t}) for t in lines)) + "\n")
    once = load_corpus(str(folder), validation_split=0.5)
    (os.symlink if link == "symlink" else os.link)(folder / f"a{suffix}", folder / f"link{suffix}")
    twice = load_corpus(str(folder), validation_split=0.5)
    assert twice["train"]["text"] == once["train"]["text"]
    assert twice["validation"]["text"] == once["validation"]["text"]
    assert "more than once" in caplog.text


@pytest.mark.parametrize("extra, field", [
    (["--learning_rate", "3e-4"], "recipe.learning_rate: checkpoint has 0.003, this run has 0.0003"),
    (["--muon_learning_rate", "0.005"], "recipe.muon_learning_rate: checkpoint has 0.05, this run has 0.005"),
    (["--optimizer", "adamw"], "recipe.optimizer: checkpoint has 'muon', this run has 'adamw'"),
    (["--lr_scheduler_type", "linear"],
     "recipe.lr_scheduler_type: checkpoint has 'warmup_stable_decay', this run has 'linear'"),
    (["--late_dropout", "0.2"], "recipe.late_dropout: checkpoint has 0.1, this run has 0.2"),
    (["--input_noise", "0.1"], "recipe.input_noise: checkpoint has 0.0, this run has 0.1"),
])
def test_resuming_with_another_recipe_is_refused_naming_the_field(
        two_steps, text_file, tmp_path, capsys, extra, field):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(two_steps, run)
    args = ["train", *causal_args(text_file, run, "--max_steps", "4", "--resume_from_checkpoint", "latest", *extra)]
    assert minitx(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0] and "a changed rate would not apply" in err[0], err
    assert not (run / "checkpoint-4").exists()


def test_a_seq2seq_resume_with_other_pair_lengths_is_refused_and_an_older_checkpoint_is_not(tmp_path):
    """Pairs cut to other lengths are other training data: the lengths are part of a seq2seq run's identity."""
    from dataclasses import replace

    from hf_minitx.training.arguments import DataArguments
    from hf_minitx.training.run_plan import run_identity

    args = DataArguments(task="seq2seq", dataset="builtin:numbers-en-fr", max_target_length=64)
    stored = run_identity({}, args, 42)
    with pytest.raises(ValueError, match="max_target_length: checkpoint has 64, this run has 16"):
        check_compatible(tmp_path, stored, run_identity({}, replace(args, max_target_length=16), 42))
    older = {key: value for key, value in stored.items() if key not in ("max_source_length", "max_target_length")}
    check_compatible(tmp_path, older, run_identity({}, args, 42))  # written before the lengths were recorded
    assert "max_target_length" not in run_identity({}, replace(args, task="causal-lm"), 42)
    check_compatible(tmp_path, stored, run_identity({}, replace(args, block_size=64), 42))  # seq2seq cuts no blocks


def test_a_checkpoint_older_than_late_dropout_resumes_without_it_and_is_refused_with_it(tmp_path):
    """Checkpoints written before --late_dropout existed trained without it: they resume with --late_dropout 0,
    and the default (on) is refused naming the field, instead of every such checkpoint being refused."""
    stored = {"recipe": {"optimizer": "muon", "learning_rate": 0.006}}
    check_compatible(tmp_path, stored, {"recipe": {"optimizer": "muon", "learning_rate": 0.006, "late_dropout": 0.0}})
    with pytest.raises(ValueError, match="recipe.late_dropout: checkpoint has 0.0, this run has 0.1"):
        check_compatible(tmp_path, stored, {"recipe": {"optimizer": "muon", "learning_rate": 0.006,
                                                       "late_dropout": 0.1, "late_dropout_passes": 2.0}})


@pytest.mark.parametrize("edit", ["cut-the-end", "delete-records"])
def test_accepted_changed_inputs_never_move_trained_text_into_validation(tmp_path, capsys, edit):
    records_file = tmp_path / "corpus.jsonl"
    texts = [f"record {i}: the quick brown fox jumps over the lazy dog {i % 7} times." for i in range(120)]
    records_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "run"
    args = ["train", *causal_args(records_file, out, "--max_steps", "2", "--checkpointing_steps", "2",
                                  "--validation_split", "0.1")]
    assert minitx(args) == 0
    kept = texts[:100] if edit == "cut-the-end" else texts[::2]
    records_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in kept))
    capsys.readouterr()
    resumed = [*args, "--max_steps", "4", "--resume_from_checkpoint", "latest", "--accept_changed_inputs"]
    assert minitx(resumed) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]  # not the bars
    assert len(err) == 1 and "no longer splits as in checkpoint" in err[0] and "train_rows" in err[0], err
    assert not (out / "checkpoint-4").exists()


# --- 3. exact streaming resume after a signal ----------------------------------------------------------------


@pytest.mark.slow
def test_streaming_resume_after_a_signal_gives_the_uninterrupted_weights(corpus, tmp_path):  # noqa: F811
    extra = ("--max_steps", "8", "--gradient_accumulation_steps", "2")
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train_main(stream_args(corpus, straight, *extra))
    process = run_hooked(["train", *stream_args(corpus, stopped, *extra)], TEST_STEP_DELAY="0.4")
    deadline = time.time() + 120
    while not has_a_train_record(stopped) and time.time() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    step = max(r["step"] for r in records(stopped, "train"))
    assert step < 8 and (stopped / f"checkpoint-{step}" / "stream_state_0.npz").is_file()
    train_main(stream_args(corpus, stopped, *extra, "--resume_from_checkpoint", "latest"))
    assert_same_weights(straight, stopped)
    assert [r["loss"] for r in records(straight, "train")] == [r["loss"] for r in records(stopped, "train")]


# --- 4. bad bytes in a streamed corpus ---------------------------------------------------------------------


@pytest.mark.slow
def test_bad_bytes_deep_in_a_stream_are_named_saved_at_and_skipped(tmp_path, monkeypatch, capsys):
    import functools

    import hf_minitx.data.preprocessing as preprocessing
    import hf_minitx.data.streaming as streaming

    small = functools.partial(preprocessing.row_batches, max_rows=8)  # rows are read 8 at a time, not 1000
    monkeypatch.setattr(streaming, "row_batches", small)
    monkeypatch.setattr(preprocessing, "row_batches", small)
    folder = tmp_path / "texts"
    folder.mkdir()
    words = ("kan", "lor", "mis", "nel", "rum", "tap", "pod", "den")
    lines = [" ".join(words[(i * 3 + j) % 8] for j in range(8)) + "." for i in range(200)]
    for part in range(2):
        (folder / f"part{part}.txt").write_text("\n".join(lines) + "\n")
    bad = folder / "part1.txt"
    data = bad.read_bytes()
    offset = data.index(b"\n", len(data) // 2) + 3
    bad.write_bytes(data[:offset] + b"\xff" + data[offset + 1:])
    out = tmp_path / "run"
    args = ["--dataset", str(folder / "*.txt"), "--streaming", "--sample_by", "line", "--preset", "tiny",
            "--config_overrides", "hidden_size=32,intermediate_size=64,max_position_embeddings=64",
            "--tokenizer_vocab_size", "300", "--tokenizer_max_texts", "20", "--block_size", "16",
            "--output_dir", str(out), "--per_device_train_batch_size", "4", "--warmup_steps", "1",
            "--eval_steps", "0", "--max_eval_samples", "4", "--num_sample_generations", "0", "--disable_tqdm",
            "--num_threads", "1", "--shuffle_buffer", "0", "--max_steps", "400"]
    assert minitx(["train", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{bad} is not UTF-8 text: the byte at offset {offset}" in err[0], err
    assert "--skip_bad_rows" in err[0]
    saved = sorted(out.glob("checkpoint-*"))
    assert len(saved) == 1 and f"saved {saved[0]}" in err[0], err
    step = json.loads((saved[0] / "run_state.json").read_text())["step"]
    assert step > 0  # it failed deep in the stream, after training steps

    fixed = tmp_path / "fixed"
    shutil.copytree(out, fixed)
    REPLACED_BYTES.clear()
    resumed = [*args[:-1], str(step + 3), "--skip_bad_rows", "--resume_from_checkpoint", "latest"]
    assert minitx(["train", *resumed]) == 0
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["steps"] == step + 3 and summary["bad_bytes_replaced"] == {str(bad): 1}

    # or the file is repaired in place, and the run goes on with it once that is accepted explicitly
    bad.write_bytes(data)
    REPLACED_BYTES.clear()
    resumed = [*args[:-1], str(step + 3), "--output_dir", str(fixed), "--resume_from_checkpoint", "latest"]
    capsys.readouterr()
    assert minitx(["train", *resumed]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{bad} changed" in err[0] and "--accept_changed_inputs" in err[0], err
    assert minitx(["train", *resumed, "--accept_changed_inputs"]) == 0
    summary = json.loads((fixed / "training_summary.json").read_text())
    assert summary["steps"] == step + 3 and not summary.get("bad_bytes_replaced")


# --- 6. damaged checkpoints are named ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["random_states_0.pkl", "custom_checkpoint_0.pkl"])
def test_a_missing_accelerate_state_file_is_named(two_steps, text_file, tmp_path, capsys, name):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(two_steps, run)
    (run / "checkpoint-2" / name).unlink()
    args = ["train", *causal_args(text_file, run, "--max_steps", "4", "--resume_from_checkpoint", "latest")]
    assert minitx(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"checkpoint-2/{name} is missing" in err[0]


@pytest.mark.slow
def test_a_truncated_stream_position_is_named(corpus, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    train_main(stream_args(corpus, out, "--max_steps", "2", "--checkpointing_steps", "2"))
    position = out / "checkpoint-2" / "stream_state_0.npz"
    position.write_bytes(position.read_bytes()[:50])
    capsys.readouterr()
    assert minitx(["train", *stream_args(corpus, out, "--max_steps", "4", "--resume_from_checkpoint", "latest")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{position} cannot be read (BadZipFile" in err[0]


def test_a_foreign_checkpoint_of_another_vocabulary_is_named(two_steps, text_file, tmp_path, capsys):  # noqa: F811
    other = tmp_path / "other"
    train_main(causal_args(text_file, other, "--max_steps", "2", "--checkpointing_steps", "2",
                           "--tokenizer_vocab_size", "320"))
    run = tmp_path / "run"
    shutil.copytree(two_steps, run)
    weights = next((other / "checkpoint-2").glob("*model*"))
    shutil.copy(weights, run / "checkpoint-2" / weights.name)
    capsys.readouterr()
    args = ["train", *causal_args(text_file, run, "--max_steps", "4", "--resume_from_checkpoint", "latest")]
    assert minitx(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"checkpoint-2/{weights.name} does not fit this model" in err[0] and "320" in err[0]


# --- 7. cheap checks first; the precision that ran ---------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--learning_rate", "-0.001"], "--learning_rate must be > 0"),
    (["--adam_beta2", "1.5"], "--adam_beta2 must be in [0, 1)"),
    (["--weight_decay", "-1"], "--weight_decay must be >= 0"),
    (["--seed", "-5"], "--seed must be a whole number from 0 to 4294967295"),  # numpy would say it in its words
    (["--seed", str(2**64)], "--seed must be a whole number from 0 to 4294967295"),
    (["--num_threads", str(2**40)], "--num_threads must be from 1 to"),  # overflowed in torch
    (["--config_overrides", "return_dict=false"], "'return_dict' is how transformers runs or files a model"),
    # the window is gathered whole before its backward: a huge one filled memory instead of training
    (["--gradient_accumulation_steps", str(10**6)], f"asks one optimizer step to read {10**6} batches"),
])
def test_bad_settings_are_refused_before_any_work(tmp_path, text_file, capsys, args, message):  # noqa: F811
    assert minitx(["train", *causal_args(text_file, tmp_path / "run", "--max_steps", "2", *args)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0]
    assert list(tmp_path.iterdir()) == []  # no output folder, no hidden staging folder


def test_a_target_length_of_one_is_refused_before_any_work(tmp_path, capsys):
    assert minitx(["train", *seq2seq_args(tmp_path / "run", "--max_steps", "2", "--max_target_length", "1")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max_target_length must be >= 2" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_a_failure_after_the_tokenizer_was_trained_leaves_no_staging_folder(tmp_path, text_file, monkeypatch):  # noqa: F811
    def broken(*args, **kwargs):
        raise ValueError("packing failed")

    monkeypatch.setattr(setup, "prepare_data", broken)
    with pytest.raises(ValueError, match="packing failed"):
        train_main(causal_args(text_file, tmp_path / "run", "--max_steps", "2"))
    assert list(tmp_path.iterdir()) == []


def test_fp16_on_a_cpu_is_recorded_as_what_ran(tmp_path, text_file, capsys):  # noqa: F811
    out = tmp_path / "run"
    train_main(causal_args(text_file, out, "--max_steps", "1", "--mixed_precision", "fp16"))
    assert "training runs in fp32" in capsys.readouterr().out
    summary = json.loads((out / "training_summary.json").read_text())
    assert (summary["mixed_precision"], summary["mixed_precision_asked"]) == ("no", "fp16")  # ran, and asked
    assert ("| Mixed precision | none (fp32); fp16 was asked, which the device does not run |"
            in (out / "README.md").read_text())


def test_bad_bytes_in_a_text_file_read_in_memory_are_named_or_replaced(tmp_path):
    from hf_minitx.data.corpus import UndecodableText

    path = tmp_path / "latin.txt"
    text = "".join(f"line {i} of some text\n" for i in range(50)).encode()
    path.write_bytes(text[:300] + "café".encode("latin-1") + text[300:])
    offset = 300 + len(b"caf")
    with pytest.raises(UndecodableText, match=f"{path} is not UTF-8 text: the byte at offset {offset} "):
        load_corpus(str(path))
    loaded = load_corpus(str(path), skip_bad_rows=True)
    texts = "".join([*loaded["train"]["text"], *loaded["validation"]["text"]])
    assert "caf\ufffd" in texts and len(texts) == len(text) + 4


@pytest.mark.parametrize("command", ["train", "train-tokenizer"])
def test_a_full_disk_while_the_tokenizer_is_saved_is_one_line(text_file, tmp_path, capsys, command):  # noqa: F811
    """tokenizers' Rust writer reports a full disk as a plain Exception ("... (os error 28)"), which the full-disk
    handling of the other writes did not know."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        with open(disk / "filler", "wb") as handle:  # leave a few KiB: folders fit, tokenizer.json does not
            handle.write(b"x" * (shutil.disk_usage(disk).free - 8192))
        out = disk / "out"
        args = (["train", *causal_args(text_file, out, *FIVE)] if command == "train" else
                ["train-tokenizer", "--dataset", str(text_file), "--vocab_size", "300", "--output_dir", str(out)])
        assert minitx(args) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]  # not the bars
        assert len(err) == 1 and "No space left on device" in err[0] and "Traceback" not in err[0], err
        named = disk if command == "train" else out  # train names the folder its staging sits in; the tokenizer its own
        assert f"cannot write {named} (No space left on device" in err[0] and "--overwrite_output_dir" not in err[0]
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # nothing half-written is left
    finally:
        subprocess.run(["umount", str(disk)], check=False)
