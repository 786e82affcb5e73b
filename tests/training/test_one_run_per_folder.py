"""One run per folder: a live writer's lock refuses a second writer (two real processes) and a dead one's lock
is taken over; symlinked and `.` output folders; an output inside an input and an input inside the output;
the replace flags replace only what minitx made."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HOLD, REPO, another_writer, hold_lock, second_writer
from test_safety import has_a_train_record, run_hooked, snapshot
from test_train import causal_args, text_file  # noqa: F401  (text_file is a fixture)

from hf_minitx.cli import main as minitx
from hf_minitx.folders import (
    LOCK_FILE,
    RUN_MARKER,
    FolderRefused,
    check_output_folder,
    lock_folder,
    unlock_folder,
    write_marker,
)


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield




def test_the_other_processes_of_the_launch_that_holds_the_lock_pass_its_check(tmp_path, monkeypatch):
    """accelerate launch: the first process locks the folder before any work; the others check it after."""
    from hf_minitx.folders import FolderRefused, check_not_locked

    folder = tmp_path / "run"
    launch = {"WORLD_SIZE": "2", "MASTER_PORT": "29512"}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=REPO, text=True, stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(REPO), **launch, "RANK": "0"})
    try:
        assert holder.stdout.readline().strip() == "LOCKED"
        for name, value in launch.items():
            monkeypatch.setenv(name, value)
        check_not_locked(folder)  # rank 1 of the same launch
        monkeypatch.setenv("MASTER_PORT", "29513")  # another launch
        with pytest.raises(FolderRefused, match="is being written by"):
            check_not_locked(folder)
    finally:
        holder.kill()
        holder.wait()


def a_run_folder(folder: Path, command: str = "train") -> Path:
    """A folder as a finished run leaves it (the marker, a model, a checkpoint)."""
    folder.mkdir(parents=True)
    write_marker(folder, command=command, run_id="old-run")
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "checkpoint-2").mkdir()
    (folder / "checkpoint-2" / "model.safetensors").write_bytes(b"weights")
    return folder


def test_a_live_writer_refuses_a_second_and_a_dead_ones_lock_is_taken_over(tmp_path, text_file, capsys):  # noqa: F811
    folder = a_run_folder(tmp_path / "run")
    holder = hold_lock(folder)
    try:
        before = snapshot(folder)
        assert minitx(["train", *causal_args(text_file, folder, "--max_steps", "1", "--overwrite_output_dir")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"pid {holder.pid}" in err[0] and "being written by `minitx train`" in err[0], err
        assert snapshot(folder) == before
        with pytest.raises(FolderRefused, match=f"pid {holder.pid}"):
            lock_folder(folder, command="train")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    owner = json.loads((folder / LOCK_FILE).read_text())
    assert owner["pid"] == holder.pid and owner["host"]  # the dead process's lock is still there
    lock_folder(folder, command="train")  # taken over, with a note
    assert "no longer running; taking it over" in capsys.readouterr().err
    assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    unlock_folder(folder)
    assert not (folder / LOCK_FILE).exists()


@pytest.mark.slow
def test_training_holds_the_lock_and_releases_it(tmp_path, text_file):  # noqa: F811
    out = tmp_path / "run"
    first = run_hooked(["train", *causal_args(text_file, out, "--max_steps", "400")], TEST_STEP_DELAY="0.3")
    try:
        deadline = time.time() + 120
        while not has_a_train_record(out) and time.time() < deadline and first.poll() is None:
            time.sleep(0.2)
        assert (out / LOCK_FILE).exists() and first.poll() is None
        second = subprocess.run(
            [sys.executable, "-m", "hf_minitx", "train", *causal_args(text_file, out, "--max_steps", "1",
                                                                     "--overwrite_output_dir")],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True, capture_output=True)
        assert second.returncode == 2 and f"pid {first.pid}" in second.stderr, second.stderr
        assert first.poll() is None  # the first run trains on
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)
    assert first.returncode == 130 and (out / RUN_MARKER).exists() and not (out / LOCK_FILE).exists()


def test_a_symlinked_output_folder_is_replaced_in_its_target(tmp_path, text_file):  # noqa: F811
    real = a_run_folder(tmp_path / "disk" / "real")
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    assert minitx(["train", *causal_args(text_file, link, "--max_steps", "1", "--overwrite_output_dir")]) == 0
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert json.loads((real / RUN_MARKER).read_text())["run_id"] != "old-run"
    assert (real / "training_summary.json").is_file() and not (real / "checkpoint-2").exists()
    assert sorted(p.name for p in (tmp_path / "disk").iterdir()) == ["real"]  # no leftovers beside it


def test_output_inside_an_input_and_input_inside_the_output_are_refused(tmp_path, text_file, capsys):  # noqa: F811
    data = tmp_path / "data"
    data.mkdir()
    (data / "corpus.txt").write_text(text_file.read_text())
    before = snapshot(data)
    for out in (data / "run", data):
        assert minitx(["train", *causal_args(data, out, "--max_steps", "1")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is inside {data}" in err[0] and str(out) in err[0], err
    assert snapshot(data) == before and not (data / "run").exists()
    assert minitx(["train", *causal_args(data / "corpus.txt", data, "--max_steps", "1")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"holds {data / 'corpus.txt'}" in err[0], err
    assert snapshot(data) == before


def test_overwrite_replaces_only_a_folder_minitx_made(tmp_path, text_file, capsys):  # noqa: F811
    folder = tmp_path / "paper"
    folder.mkdir()
    for name in ("thesis.tex", "results.csv", "figure.png"):
        (folder / name).write_text(name)
    before = snapshot(folder)
    assert minitx(["train", *causal_args(text_file, folder, "--max_steps", "1", "--overwrite_output_dir")]) == 2
    err = capsys.readouterr().err
    assert "was not made by minitx" in err and "3 entries" in err and "thesis.tex" in err
    assert "--overwrite_any_folder" in err and snapshot(folder) == before
    assert minitx(["train", *causal_args(text_file, folder, "--max_steps", "1", "--overwrite_any_folder",
                                         "--overwrite_output_dir")]) == 0
    assert not (folder / "thesis.tex").exists() and (folder / "training_summary.json").is_file()


def test_train_tokenizer_overwrite_refuses_a_trained_run(tmp_path, text_file, capsys):  # noqa: F811
    run = a_run_folder(tmp_path / "run")
    before = snapshot(run)
    args = ["train-tokenizer", "--dataset", str(text_file), "--vocab_size", "300", "--output_dir", str(run)]
    assert minitx([*args, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "holds a run of `minitx train`" in err and "model.safetensors" in err and "checkpoint-2/" in err
    assert snapshot(run) == before
    tok = a_run_folder(tmp_path / "tok", command="train-tokenizer")
    assert minitx([*args[:-1], str(tok), "--overwrite"]) == 0  # its own folders are replaced
    assert (tok / "tokenizer.json").is_file() and not (tok / "model.safetensors").exists()


def test_a_killed_runs_half_saved_tokenizer_is_removed_by_the_next_run(tmp_path, text_file, capsys):  # noqa: F811
    out = tmp_path / "run"
    orphan = tmp_path / ".run.tokenizer-4242.partial"  # kill -9 while the tokenizer was being saved
    other = tmp_path / ".other.tokenizer-4242.partial"  # another folder's: not this run's to remove
    for folder in (orphan, other):
        folder.mkdir()
        (folder / "tokenizer.json").write_text("{")
    assert minitx(["train", *causal_args(text_file, out, "--max_steps", "1")]) == 0
    assert f"note: removed {orphan}, a tokenizer left half-saved by a run that was killed" in capsys.readouterr().out
    assert not orphan.exists() and other.is_dir() and (out / "tokenizer.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tokenizer-4242.partial", "run"]


def test_the_first_refusal_names_only_a_fix_that_works(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")

    def refusal(**kwargs) -> str:
        with pytest.raises(FolderRefused) as caught:
            check_output_folder(folder, overwrite=False, **{"flag": "--overwrite", **kwargs})
        return str(caught.value)

    assert "not made by minitx, so --overwrite alone would not replace it: delete its contents yourself" in refusal()
    assert "pass --overwrite --overwrite_any_folder to replace it anyway" in refusal(any_flag="--overwrite_any_folder")
    write_marker(folder, command="train", run_id="r1")
    said = refusal(command="export")
    assert said.endswith("it already holds a run of `minitx train` (.minitx-run.json, notes.txt). --overwrite would "
                         "not replace another command's run: choose another --output_dir.")
    assert said.count("minitx train") == 1  # said once
    assert refusal(command="train").endswith("Pass --overwrite to replace it, or choose another --output_dir.")
    assert refusal(flag=None).endswith("Choose a new or empty --output_dir.")


def test_output_dir_dot_is_the_current_folder(tmp_path, text_file, monkeypatch, capsys):  # noqa: F811
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert minitx(["train", *causal_args(text_file, Path("."), "--max_steps", "1")]) == 0
    assert (here / "training_summary.json").is_file() and (here / RUN_MARKER).is_file()
    before = snapshot(here)
    assert minitx(["train", *causal_args(text_file, Path("."), "--max_steps", "1", "--overwrite_output_dir")]) == 2
    err = capsys.readouterr().err
    assert "is the current folder" in err and "PosixPath" not in err and snapshot(here) == before
    with pytest.raises(FolderRefused, match="is the current folder"):
        check_output_folder(".", flag="--overwrite", overwrite=True, overwrite_any=True)


WAIT_AFTER_DATA = """
import os, sys, time
import hf_minitx.training.setup as setup
real = setup.load_training_corpus
def waiting(plan):
    corpus = real(plan)
    print("PAUSED", flush=True)
    while not os.path.exists(os.environ["TEST_GO"]):
        time.sleep(0.1)
    return corpus
setup.load_training_corpus = waiting
from hf_minitx.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_lock_is_taken_before_any_work_so_a_second_start_does_none(tmp_path, text_file):  # noqa: F811
    out, go = tmp_path / "run", tmp_path / "go"
    args = ["train", *causal_args(text_file, out, "--max_steps", "2")]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TEST_GO": str(go)}
    first = subprocess.Popen([sys.executable, "-c", WAIT_AFTER_DATA, *args], cwd=REPO, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert any(line.strip() == "PAUSED" for line in iter(first.stdout.readline, ""))
        second = subprocess.run([sys.executable, "-m", "hf_minitx", *args], cwd=REPO, env=env, text=True,
                                capture_output=True, timeout=120)
        assert second.returncode == 2 and f"pid {first.pid}" in second.stderr, second.stderr
        assert "tokenizer" not in second.stdout  # refused before its own tokenizer (and data) work
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no staging folder of the second
    finally:
        go.touch()
        _, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    assert (out / "training_summary.json").is_file() and (out / "tokenizer.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["go", "run"] and not (out / LOCK_FILE).exists()


def test_two_starts_at_once_leave_one_run_and_its_own_tokenizer(tmp_path, text_file):  # noqa: F811
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    runs = []
    for vocab in ("300", "320"):  # two different tokenizers: the folder must hold the winner's
        runs.append(subprocess.Popen(
            [sys.executable, "-m", "hf_minitx", "train", *causal_args(text_file, out, "--max_steps", "2",
                                                                      "--tokenizer_vocab_size", vocab)],
            cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        time.sleep(0.2)
    codes = [run.wait(timeout=300) for run in runs]
    assert sorted(codes) == [0, 2], [run.stderr.read() for run in runs]
    winner = ("300", "320")[codes.index(0)]
    assert json.loads((out / "config.json").read_text())["vocab_size"] == len(
        json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]) == int(winner)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and not (out / LOCK_FILE).exists()


@pytest.fixture
def mount_point(tmp_path):
    """An empty tmpfs mounted at tmp_path/volume (a folder that cannot be renamed, like a Docker volume)."""
    volume = tmp_path / "volume"
    volume.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(volume)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield volume
    subprocess.run(["umount", str(volume)], check=False)


def test_an_output_folder_on_a_mount_point_is_written_inside(mount_point, tmp_path, text_file, capsys):  # noqa: F811
    args = ["train", *causal_args(text_file, mount_point, "--max_steps", "1")]
    assert minitx(args) == 0, capsys.readouterr().err  # the tokenizer staged beside it crosses file systems
    assert (mount_point / "model.safetensors").is_file() and os.path.ismount(mount_point)
    assert minitx([*args, "--overwrite_output_dir"]) == 0, capsys.readouterr().err  # emptied in place
    assert (mount_point / "training_summary.json").is_file() and os.path.ismount(mount_point)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["volume"]  # nothing left beside it
    tokenizer_args = ["train-tokenizer", "--dataset", str(text_file), "--vocab_size", "300", "--output_dir",
                      str(mount_point), "--overwrite"]
    for path in mount_point.iterdir():
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    for _ in range(2):  # a new folder, then one replaced
        assert minitx(tokenizer_args) == 0, capsys.readouterr().err
        assert (mount_point / "tokenizer.json").is_file() and os.path.ismount(mount_point)
    assert not [p for p in mount_point.iterdir() if ".partial" in p.name]


@pytest.mark.slow
def test_two_tokenizers_into_one_folder_one_is_refused_and_the_folder_holds_the_winners(tmp_path, text_file,  # noqa: F811
                                                                                       monkeypatch, capsys):
    """`train-tokenizer --vocab_size 300` writes; while it does, one with 400 into the same folder runs in another
    process and is refused; a second writer in this process's place (a lock it does not hold) is refused too."""
    from hf_minitx.data import tokenizer as train_tokenizer

    folder, save, second = tmp_path / "tk", train_tokenizer._save_marked, []
    argv = ["--dataset", str(text_file), "--output_dir", str(folder)]

    def save_while_another_starts(tokenizer, fresh):
        second.append(second_writer(["train-tokenizer", *argv, "--vocab_size", "400"]))
        return save(tokenizer, fresh)

    monkeypatch.setattr(train_tokenizer, "_save_marked", save_while_another_starts)
    train_tokenizer.main([*argv, "--vocab_size", "300"])
    assert second[0].returncode == 2 and "saved to" not in second[0].stdout, second[0].stderr
    assert second[0].stderr == (f"error: --output_dir {folder} is being written by `minitx train-tokenizer` (pid "
                                f"{os.getpid()} on {socket.gethostname()}, lock {LOCK_FILE}); wait for it to finish "
                                "or stop it, or choose another --output_dir\n")
    assert "saved to" in capsys.readouterr().out
    assert sorted(os.listdir(folder)) == [RUN_MARKER, "tokenizer.json", "tokenizer_config.json"]
    assert len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]) == 300
    monkeypatch.undo()
    with another_writer(folder / LOCK_FILE, pid=4242, host="box", command="train-tokenizer"):
        assert minitx(["train-tokenizer", *argv, "--vocab_size", "400", "--overwrite"]) == 2
    assert "is being written by `minitx train-tokenizer` (pid 4242 on box" in capsys.readouterr().err
    assert len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]) == 300
