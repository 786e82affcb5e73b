"""write_folder (every command's output folder): a write that fails for lack of room or rights is said in one line
and leaves the folder as it was; any other error passes through unchanged."""

from __future__ import annotations

import errno

import pytest

from hf_minitx.folders import write_errno, write_folder


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
    assert "\n" not in message and message.startswith(f"cannot write {folder} (No space left on device; ")
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
