"""write_folder (every command's output folder): a write that fails for lack of room or rights is said in one line
and leaves the folder as it was; any other error passes through unchanged."""

from __future__ import annotations

import errno
import os

import pytest

from hf_minitx.cli import run_cli
from hf_minitx.folders import LOCK_FILE, write_errno, write_folder


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
                                           (LOCK_FILE, ""), ("plain.txt", "plain.txt")])
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
