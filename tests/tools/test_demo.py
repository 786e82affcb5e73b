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
