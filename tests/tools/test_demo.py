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
