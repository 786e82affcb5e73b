"""The final save of a run on a full disk keeps the trained weights: the space is checked before the save, and a
finished model that the output folder's disk cannot hold is written to another disk, with one line saying where."""

from __future__ import annotations

import errno
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
from test_safety import assert_same_weights
from test_train import causal_args, text_file  # noqa: F401  (text_file is a fixture)

import hf_minitx.training.end_of_run as end_of_run
from hf_minitx.cli import main as minitx
from hf_minitx.training import rescue
from hf_minitx.training.loop import main as train_main

Usage = namedtuple("Usage", "total used free")


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield


def full_disk_at(full: Path, monkeypatch) -> None:
    """Every path under ``full`` is on a disk with 100 KiB free, as seen by shutil.disk_usage."""
    real = shutil.disk_usage

    def usage(path):
        return Usage(1 << 30, (1 << 30) - 102400, 102400) if Path(path).is_relative_to(full) else real(path)

    monkeypatch.setattr(shutil, "disk_usage", usage)


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def two_steps(text_file, tmp_path_factory) -> Path:  # noqa: F811
    """An uninterrupted 2-step run without checkpoints."""
    out = tmp_path_factory.mktemp("rescue") / "straight"
    train_main(causal_args(text_file, out, "--max_steps", "2"))
    return out


def test_a_disk_too_full_for_the_final_save_gets_the_model_written_elsewhere(two_steps, text_file, tmp_path,  # noqa: F811
                                                                             monkeypatch, capsys):
    disk, elsewhere = tmp_path / "disk", tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = disk / "run"
    writes = []
    real_save = end_of_run.save_final_model

    def save(model, tokenizer, folder, *args, **kwargs):
        writes.append(Path(folder))
        return real_save(model, tokenizer, folder, *args, **kwargs)

    full_disk_at(disk, monkeypatch)
    monkeypatch.setattr(rescue, "rescue_places", lambda: [tmp_path / "missing", elsewhere])
    monkeypatch.setattr(end_of_run, "save_final_model", save)
    assert minitx(["train", *causal_args(text_file, out, "--max_steps", "2")]) == 2
    err = error_lines(capsys)
    (rescued,) = elsewhere.iterdir()
    assert len(err) == 1 and f"cannot write the final model into {out} (No space left on device;" in err[0], err
    assert f"the finished model of 2 steps was saved to {rescued} instead; move its files into {out}" in err[0]
    assert all(not folder.is_relative_to(disk) for folder in writes)  # checked first: nothing half-written there
    assert_same_weights(two_steps, rescued)  # the trained weights survive
    assert (rescued / "tokenizer.json").is_file() and (rescued / "training_summary.json").is_file()
    assert not (out / "model.safetensors").exists() and not list(disk.rglob("*.partial*"))


def test_a_write_that_fails_midway_is_rescued_and_a_full_everywhere_says_so(text_file, tmp_path, monkeypatch,  # noqa: F811
                                                                            capsys):
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    real_save = end_of_run.save_final_model

    def full_in_run(model, tokenizer, folder, *args, **kwargs):
        if Path(folder).is_relative_to(out):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(model, tokenizer, folder, *args, **kwargs)

    monkeypatch.setattr(end_of_run, "save_final_model", full_in_run)
    monkeypatch.setattr(rescue, "rescue_places", lambda: [elsewhere])
    assert minitx(["train", *causal_args(text_file, out, "--max_steps", "2")]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and "the finished model of 2 steps was saved to" in err[0], err
    assert (next(elsewhere.iterdir()) / "model.safetensors").is_file()

    full_disk_at(elsewhere, monkeypatch)  # no other disk has room either
    assert minitx(["train", *causal_args(text_file, out, "--max_steps", "2", "--overwrite_output_dir")]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and f"could not be kept anywhere (no room in {elsewhere} either)" in err[0], err
    assert err[0].endswith("start the run again with the same command plus --overwrite_output_dir")
    assert len(list(elsewhere.iterdir())) == 1  # nothing half-written there


def test_the_needed_bytes_count_tied_weights_once():
    from conftest import tiny_causal

    model = tiny_causal()
    unique = {t.untyped_storage().data_ptr(): t.numel() * t.element_size() for t in model.state_dict().values()}
    assert rescue.final_save_bytes(model, None, None) == sum(unique.values()) + rescue.SAVE_MARGIN
