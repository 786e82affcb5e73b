"""`minitx demo`'s bookkeeping: each of the two trainings it runs at once is timed to its own end."""

from __future__ import annotations

import sys

from hf_minitx.tools import demo


def test_each_training_is_timed_to_its_own_end(tmp_path, monkeypatch):
    """The translator trains in the background; when it ends first, its time is its own, not the KJV run's."""
    seconds = {"numbers-en-fr.json": 0.1, "kjv-gpt.json": 1.5}
    monkeypatch.setattr(demo, "_train_command", lambda recipe, *args: [
        sys.executable, "-c", f"import time; time.sleep({seconds[recipe]})"])
    timed = demo.train_both(tmp_path / "kjv", tmp_path / "numbers", tmp_path / "tok")
    assert timed["numbers"] < 1.0 and timed["kjv"] >= 1.5


def test_a_runs_dir_that_is_a_file_is_refused_before_step_one(tmp_path, monkeypatch, capsys):
    from hf_minitx.cli import main

    started = []
    monkeypatch.setattr(demo, "run_demo", lambda runs: started.append(runs) or 0)
    (tmp_path / "afile").write_text("data")
    for runs_dir in ("afile", "afile/runs"):
        assert main(["demo", "--runs_dir", str(tmp_path / runs_dir)]) == 2
        assert "afile is a file, not a folder; choose another --runs_dir" in capsys.readouterr().err
    assert started == []


def test_a_step_that_failed_ends_the_demo_with_its_exit_status_not_a_traceback(tmp_path, monkeypatch):
    """The step's command printed its own error line; CalledProcessError's traceback followed it."""
    import subprocess

    def failed_step(runs):
        raise subprocess.CalledProcessError(2, ["minitx", "train-tokenizer"])

    monkeypatch.setattr(demo, "run_demo", failed_step)
    assert demo.main(["--runs_dir", str(tmp_path / "runs")]) == 2


def test_an_interrupted_run_goes_on_from_its_checkpoint_and_a_finished_one_is_trained_again(tmp_path):
    run = tmp_path / "kjv-gpt"
    (run / "checkpoint-40").mkdir(parents=True)
    command = demo._train_command("kjv-gpt.json", run)
    assert command[-2:] == ["--resume_from_checkpoint", "latest"] and "--overwrite_output_dir" not in command
    (run / "training_summary.json").write_text("{}")  # the summary marks a finished run
    assert demo._train_command("kjv-gpt.json", run)[-1] == "--overwrite_output_dir"
    assert demo._train_command("kjv-gpt.json", tmp_path / "new")[-1] == "--overwrite_output_dir"


CHILD = """
import signal, sys, time
asked = []
signal.signal(signal.SIGINT, lambda *_: asked.append(1))
open(sys.argv[1] + ".started", "w").close()
while not asked:
    time.sleep(0.05)
time.sleep(1.0)  # finishing its step and saving a checkpoint
open(sys.argv[1], "w").write("saved")
sys.exit(130)
"""

PARENT = """
import subprocess, sys
from hf_minitx.tools import demo
try:
    demo._finish(subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]]))
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_a_ctrl_c_lets_a_training_run_finish_its_save(tmp_path):
    """The terminal sends SIGINT to the demo and its training run together; subprocess.run killed the run 0.25 s
    later, in the middle of its checkpoint."""
    import os
    import signal
    import subprocess
    import time

    saved = tmp_path / "saved"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(saved)], start_new_session=True)
    deadline = time.monotonic() + 60
    while not saved.with_suffix(".started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(parent.pid, signal.SIGINT)  # what Ctrl-C does: the whole process group
    assert parent.wait(timeout=60) == 130
    assert saved.read_text() == "saved"
