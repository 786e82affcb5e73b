"""write_folder (every command's output folder): a write that fails for lack of room or rights is said in one line
and leaves the folder as it was; any other error passes through unchanged. One writer per output: the lock is held
for the whole write (``output_folder``, ``holding_lock``); an output below a file, and a linked file."""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

import pytest
from conftest import another_writer

from hf_minitx.cli import main as minitx
from hf_minitx.cli import run_cli
from hf_minitx.folders import (
    LOCK_FILE,
    RUN_MARKER,
    FolderRefused,
    check_output_file,
    check_output_folder,
    honour_umask,
    html_written_by_us,
    lock_folder,
    output_folder,
    unlock_folder,
    write_errno,
    write_file,
    write_folder,
    write_marker,
)
from hf_minitx.folders import lock as output_lock
from hf_minitx.folders import policy as output_policy


class SafetensorError(Exception):
    """Named like safetensors' Rust writer's error, which carries the OS error in its text."""


FAILURES = {
    "oserror": OSError(errno.ENOSPC, "No space left on device"),
    "safetensors": SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
    "short-write": OSError("262144 requested and 42016 written"),  # numpy's tofile on a full disk (the GGUF writer)
}


@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
@pytest.mark.parametrize("failure", FAILURES.values(), ids=FAILURES.keys())
def test_a_write_that_runs_out_of_room_is_one_line_and_leaves_the_folder_as_it_was(tmp_path, failure, existing):
    folder = tmp_path / "out"
    if existing:
        folder.mkdir()
        (folder / "old.txt").write_text("old")

    def fill(tmp):
        (tmp / "half.bin").write_bytes(b"x")
        raise failure

    with pytest.raises(OSError) as caught:
        write_folder(folder, fill)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"cannot write {folder} (No space left on device); ")
    assert "MiB free there" in message and ("left as it was" if existing else "was not made") in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no chained traceback
    assert [p.name for p in tmp_path.iterdir()] == (["out"] if existing else [])  # no partial folder left
    if existing:
        assert [p.name for p in folder.iterdir()] == ["old.txt"]


def test_other_errors_pass_through_unchanged(tmp_path):
    def fill(tmp):
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        write_folder(tmp_path / "out", fill)
    assert not (tmp_path / "out").exists()
    assert write_errno(OSError(errno.ENOENT, "gone")) is None and write_errno(KeyError("x")) is None


RAW = {  # an OSError straight from the system, naming one of our hidden working files: (error, advice)
    "read-only": (errno.EROFS, "that file system is read-only: pick a writable place"),
    "no-rights": (errno.EACCES, "you may not write there: pick a place you can write to"),
    "full": (errno.ENOSPC, "MiB free there: free some space"),
}


@pytest.mark.parametrize("hidden, named", [(".page.html.partial-4242", "page.html"), (".out.old-7", "out"),
                                           (LOCK_FILE, ""), (".page.html.minitx-lock", "page.html"),
                                           ("plain.txt", "plain.txt")])
@pytest.mark.parametrize("case", RAW.values(), ids=RAW.keys())
def test_a_raw_write_error_names_the_users_path_and_what_to_do(tmp_path, capsys, case, hidden, named):
    code, advice = case

    def main():
        raise OSError(code, os.strerror(code), str(tmp_path / hidden))

    assert run_cli(main) == 2
    err = capsys.readouterr().err.strip().splitlines()
    shown = tmp_path / named if named else tmp_path
    assert err == [f"error: cannot write {shown} ({os.strerror(code)}); " + err[0].split("; ", 1)[1]]
    assert advice in err[0] and ".partial" not in err[0] and LOCK_FILE not in err[0]


def test_other_raw_errors_keep_their_own_words(tmp_path, capsys):
    def main():
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(tmp_path / "gone.txt"))

    assert run_cli(main) == 2
    assert capsys.readouterr().err.strip() == f"error: [Errno 2] No such file or directory: '{tmp_path / 'gone.txt'}'"


# --- one writer per output, and paths under a file ---------------------------------------------------------


def test_an_output_below_a_file_names_the_file_in_the_users_path(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("afile").write_text("mine")
    with pytest.raises(NotADirectoryError, match="^--output_dir afile/run: afile is a file, not a folder; choose "
                                                 "another --output_dir$"):
        check_output_folder("afile/run", flag=None, overwrite=False)
    with pytest.raises(NotADirectoryError, match="^--out afile/sub/page.html: afile is a file, not a folder"):
        check_output_file("afile/sub/page.html", overwrite=False, option="--out", is_ours=html_written_by_us)
    for argv, option in ((["train-tokenizer", "--output_dir", "afile/run"], "--output_dir"),
                         (["push", "--model_dir", "nowhere", "--dry_run", "afile/run"], "--dry_run")):
        assert minitx(argv) == 2
        err = capsys.readouterr().err
        assert err == f"error: {option} afile/run: afile is a file, not a folder; choose another {option}\n", err
    assert sorted(os.listdir()) == ["afile"] and Path("afile").read_text() == "mine"


def test_an_output_whose_folder_cannot_be_made_is_named_before_any_work(tmp_path, capsys):
    """A path the system will not create (a folder under /proc, which takes none) is one line naming the part it
    refused, from the lock taken before any work, not a raw errno at the first write."""
    (tmp_path / "a.txt").write_text("some text to train on\n" * 50)
    assert minitx(["train", "--dataset", str(tmp_path / "a.txt"), "--output_dir", "/proc/no-such/run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --output_dir /proc/no-such/run cannot be made (No such file or directory: "
                          "/proc/no-such); choose a folder where you can write"), err
    with pytest.raises(output_lock.FolderRefused, match=r"^--out /proc/no-such/page.html cannot be made \("):
        with output_lock.holding_lock(Path("/proc/no-such/page.html"), command="explore", option="--out",
                                      single_file=True):
            pass
    for argv in (["visualize", "masks", "--out", "/proc/no-such/m.png"],
                 ["benchmark", "--json", "/proc/no-such/b.json"]):
        assert minitx(argv) == 2  # before drawing, before benchmarking
        assert capsys.readouterr().err.startswith(f"error: {argv[-2]} {argv[-1]} cannot be made (No such file or")
    deep = tmp_path / "new" / "er" / "page.png"  # a folder that can be made is left to the write: nothing made yet
    assert check_output_file(deep, overwrite=False, option="--out", is_ours=html_written_by_us) == deep
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_a_second_writer_is_refused_naming_the_first_and_nothing_is_written(tmp_path):
    folder = tmp_path / "out"
    with another_writer(folder / LOCK_FILE, pid=4242, host="box", command="export"):
        with pytest.raises(FolderRefused) as refused:
            with output_folder(folder, command="train-tokenizer", flag="--overwrite", overwrite=False):
                raise AssertionError("not reached")
        assert str(refused.value) == (f"--output_dir {folder} is being written by `minitx export` (pid 4242 on box, "
                                      f"lock {LOCK_FILE}); wait for it to finish or stop it, or choose another "
                                      "--output_dir")
        assert os.listdir(folder) == [LOCK_FILE]
    with another_writer(folder / LOCK_FILE):  # a lock that records nobody
        with pytest.raises(FolderRefused, match=f"is being written by another process \\(lock {LOCK_FILE}\\)"):
            lock_folder(folder, command="export")


def test_the_lock_is_held_through_the_write_and_released_after(tmp_path):
    folder = tmp_path / "new" / "out"

    def export(fresh: Path, text: str) -> None:  # as `minitx export` writes: the model, and whose folder it is
        (fresh / "model.safetensors").write_text(text)
        write_marker(fresh, command="export", run_id="qwen3")

    with output_folder(folder, command="export", flag="--overwrite", overwrite=False) as claimed:
        write_folder(claimed, lambda fresh: export(fresh, "complete"))
        with pytest.raises(BlockingIOError):  # after the new folder took the old one's place: still held there
            with another_writer(folder / LOCK_FILE):
                pass
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert sorted(os.listdir(folder)) == sorted([RUN_MARKER, "model.safetensors"])  # the lock is gone with the writer
    with output_folder(folder, command="export", flag="--overwrite", overwrite=True) as claimed:
        write_folder(claimed, lambda fresh: export(fresh, "replaced"))
        assert sorted(os.listdir(folder)) == sorted([LOCK_FILE, RUN_MARKER, "model.safetensors"])
    assert (folder / "model.safetensors").read_text() == "replaced" and sorted(os.listdir(tmp_path / "new")) == ["out"]


@pytest.mark.parametrize("command, flag", [("export", "--overwrite"), ("train", "--overwrite_output_dir")])
def test_a_folder_of_weights_and_user_files_is_not_taken_for_a_run(tmp_path, command, flag):
    """Weights alone are any model's (a Hub download, a user's copy): without a marker or a training run's
    records, a replace flag refuses the folder; a run's records without a marker (a staged copy) are train's."""
    folder = tmp_path / "downloaded"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "train.py"):
        (folder / name).write_text("mine")
    with pytest.raises(FolderRefused, match="was not made by minitx; replacing it would delete 3 entries"):
        check_output_folder(folder, flag=flag, overwrite=True, command=command)
    (folder / "training_summary.json").write_text("{}")
    if command == "train":
        check_output_folder(folder, flag=flag, overwrite=True, command=command)
    else:
        with pytest.raises(FolderRefused, match="holds a run of `minitx train`"):
            check_output_folder(folder, flag=flag, overwrite=True, command=command)
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors", "train.py", "training_summary.json"]


def test_a_write_that_fails_removes_the_folders_made_for_its_lock(tmp_path):
    (tmp_path / "kept").mkdir()
    for folder in (tmp_path / "a" / "b" / "out", tmp_path / "kept"):
        with pytest.raises(ValueError, match="a bug"):
            with output_folder(folder, command="export", flag=None, overwrite=False):
                raise ValueError("a bug")
    assert sorted(os.listdir(tmp_path)) == ["kept"] and os.listdir(tmp_path / "kept") == []


def test_what_another_writer_finished_before_the_lock_was_taken_is_seen(tmp_path, monkeypatch):
    folder, checks, check = tmp_path / "out", [], check_output_folder

    def check_then_the_other_writer_finishes(*args, **kwargs):
        checks.append(check(*args, **kwargs))
        if len(checks) == 1:  # between our first check and our lock, another command filled the folder
            folder.mkdir()
            write_marker(folder, command="export", run_id="qwen3")
        return checks[-1]

    monkeypatch.setattr(output_policy, "check_output_folder", check_then_the_other_writer_finishes)
    with pytest.raises(FolderRefused, match="already holds a run of `minitx export`"):
        with output_folder(folder, command="export", flag="--overwrite", overwrite=False):
            raise AssertionError("not reached")
    assert os.listdir(folder) == [RUN_MARKER]


def test_a_lock_file_its_writer_removed_before_it_was_locked_is_not_taken(tmp_path, monkeypatch):
    """The writer that held it finished (unlink, then close) between our open and our lock: the file we opened is
    no longer the lock, so the one now at its path is locked instead."""
    folder, flock, calls = tmp_path / "out", fcntl.flock, []

    def finishing_writer(fd, operation):
        calls.append(fd)
        if len(calls) == 1:
            (folder / LOCK_FILE).unlink()
        return flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", finishing_writer)
    lock_folder(folder, command="export")
    try:
        assert len(calls) == 2 and output_lock._held[folder.resolve()][1] == folder / LOCK_FILE
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    finally:
        unlock_folder(folder)


def test_a_linked_file_is_written_through_and_stays_a_link(tmp_path):
    page, link = tmp_path / "pages" / "page.html", tmp_path / "link.html"
    page.parent.mkdir()
    page.write_text("old")
    link.symlink_to(page)
    out = check_output_file(link, overwrite=True, option="--out", is_ours=html_written_by_us)
    assert out == page.resolve()
    write_file(link, lambda tmp: tmp.write_text("new"))
    assert link.is_symlink() and link.resolve() == page.resolve() and page.read_text() == "new"
    assert sorted(os.listdir(page.parent)) == ["page.html"] and sorted(os.listdir(tmp_path)) == ["link.html", "pages"]


def test_the_digest_of_a_checkpoint_with_bin_weights_names_them():
    import tempfile

    from hf_minitx.folders import weights_digest

    with tempfile.TemporaryDirectory() as folder:
        empty = weights_digest(Path(folder))
        (Path(folder) / "pytorch_model.bin").write_bytes(b"weights")
        first = weights_digest(Path(folder))
        (Path(folder) / "pytorch_model.bin").write_bytes(b"other weights")
        assert len({empty, first, weights_digest(Path(folder))}) == 3
        (Path(folder) / "model.safetensors").write_bytes(b"weights")  # safetensors, where there are any
        assert weights_digest(Path(folder)) not in (empty, first)



def test_a_folder_written_holds_its_weights_with_the_umasks_mode(tmp_path):
    """safetensors writes its files 0600; the folder's files all get the mode the umask gives, private or not."""
    import torch
    from safetensors.torch import save_file

    def fill(folder: Path) -> None:
        save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text("{}")

    before = os.umask(0o022)
    try:
        write_folder(tmp_path / "shared", fill)
        assert {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "shared").iterdir()} == {
            "model.safetensors": 0o644, "config.json": 0o644}
        os.umask(0o077)
        write_folder(tmp_path / "private", fill)
        assert {p.stat().st_mode & 0o777 for p in (tmp_path / "private").iterdir()} == {0o600}
        (tmp_path / "private" / "config.json").chmod(0o640)  # a mode set on purpose is left as it is
        honour_umask(tmp_path / "private")
        assert (tmp_path / "private" / "config.json").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(before)


def test_an_output_file_named_through_a_missing_folder_and_back_makes_no_folder(tmp_path, monkeypatch):
    """`--out .hidden/../page.html` is page.html: writing it leaves no empty .hidden behind."""
    monkeypatch.chdir(tmp_path)
    out = check_output_file(".hidden/../page.html", overwrite=False, option="--out", is_ours=html_written_by_us)
    write_file(out, lambda tmp: tmp.write_text("<html></html>"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]


def test_a_folder_named_under_a_file_through_home_is_refused(tmp_path, monkeypatch):
    """`--runs_dir ~/notes.txt/runs`: the file is found where `~` leads, as it is without `~`."""
    from hf_minitx.folders import folder_path

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(NotADirectoryError, match="notes.txt"):
        folder_path("~/notes.txt/runs", option="--runs_dir")
    assert (tmp_path / "notes.txt").read_text() == "mine"
