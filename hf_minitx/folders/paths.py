"""The names minitx gives what it keeps in an output folder, and the checks every output path passes first:
where a path really leads (a symlink resolved), what a folder holds, and which run made it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RUN_MARKER = ".minitx-run.json"
LOCK_FILE = ".minitx-lock"  # held (flock) by the process writing the folder; JSON: pid, host, command
PARTIAL_SUFFIX = ".partial"  # hidden siblings being written: `.NAME.partial-<pid>`
SUMMARY_FILE = "training_summary.json"  # written last by a finished run: its data, recipe and figures
# the records only a training run writes (weights alone are any model's: a Hub download holds them too)
RUN_FILES = ("metrics.jsonl", SUMMARY_FILE)


class FolderRefused(FileExistsError, ValueError):
    """An output folder that this command may not write into as asked (a bad argument, and a file problem)."""


def output_path(path: str | Path, *, option: str = "--output_dir") -> Path:
    """The folder ``path`` names, with a symlink (or ``.``/``..``) resolved to the real folder, so that
    replacing it replaces the real folder's contents and leaves the link in place."""
    if not str(path).strip():
        raise ValueError(f"{option} is empty; give a folder path")
    folder = Path(path).expanduser()
    if folder.is_symlink() or folder.name in ("", ".", ".."):
        folder = folder.resolve()
    return folder


def check_not_under_a_file(path: Path, *, option: str) -> None:
    """Refuse an output path below a file (``afile/run``): the system would say a bare "Not a directory" about a
    hidden working path; this names the file in the user's path."""
    blocking = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise NotADirectoryError(f"{option} {path}: {blocking} is a file, not a folder; choose another {option}")


def folder_path(path: str | Path, *, option: str) -> Path:
    """The folder ``path`` names (``output_path``), refused where it is a file or lies below one: checked before any
    work, nothing written."""
    folder = output_path(path, option=option)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{option} {folder} is a file, not a folder; choose another {option}")
    check_not_under_a_file(Path(path).expanduser(), option=option)
    return folder


def make_folder(folder: Path, *, option: str, named: Path | None = None) -> None:
    """Create ``folder`` (and its parents) before any work; one that cannot be made is an error naming the part of
    the path the system refused and why (``/proc/x``: no such folder; ``/sys/run``: not permitted), and ``named``
    (default: the folder) as the user gave it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        if isinstance(error, (FileExistsError, NotADirectoryError)) or error.errno is None:
            raise
        where = os.fsdecode(error.filename) if error.filename else str(folder)
        raise FolderRefused(f"{option} {named or folder} cannot be made ({error.strerror}: {where}); choose a "
                            "folder where you can write") from None


def first_missing(folder: Path) -> Path | None:
    """The outermost of ``folder`` and its parents that does not exist (the first one making it would create)."""
    return next((path for path in reversed((folder, *folder.parents)) if not path.exists()), None)


def remove_made(folder: Path, made: Path | None) -> None:
    """Remove ``folder`` and its parents up to ``made`` (the first one a command made) while they are empty."""
    for path in (folder, *folder.parents) if made is not None else ():
        if not path.is_dir() or any(path.iterdir()):
            return
        path.rmdir()
        if path == made:
            return


def check_can_make(folder: Path, *, option: str, named: Path | None = None) -> None:
    """Refuse, before any work, a folder the system will not create (``make_folder``'s error); the folders made to
    find out are removed again, so nothing is left when the command writes later or not at all."""
    made = first_missing(folder)
    if made is not None:
        make_folder(folder, option=option, named=named)
        remove_made(folder, made)


def describe_contents(folder: Path, limit: int = 5) -> str:
    """A short listing such as "tokenizer.json, README.md and 3 more"."""
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir() if p.name != LOCK_FILE)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None where the file is missing, unreadable or holds something else, for the
    records minitx reads back as a hint (a hand-edited or half-copied one is treated as absent, never a traceback)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The run marker of a folder a command made (None when there is none or it cannot be read)."""
    return read_json_object(folder / RUN_MARKER)


def read_summary(folder: Path) -> dict[str, Any] | None:
    """A finished run's training_summary.json (None when there is none or it cannot be read)."""
    return read_json_object(folder / SUMMARY_FILE)


def holds_run_files(folder: Path) -> bool:
    """Whether ``folder`` holds what only a training run writes (its records, checkpoints)."""
    return any((folder / name).exists() for name in RUN_FILES) or any(folder.glob("checkpoint-*"))


def partial_sibling(path: Path) -> Path:
    """A hidden sibling of ``path`` to write into before renaming into place."""
    return path.with_name(f".{path.name}{PARTIAL_SUFFIX}-{os.getpid()}")


def unhidden(path: Path) -> Path:
    """The path a user named, for one of our hidden working files: ``.NAME.partial-PID`` (or ``.NAME.old-PID``)
    is NAME, the run lock is its folder; any other path is itself."""
    import re

    if path.name == LOCK_FILE:
        return path.parent
    if path.name.startswith(".") and path.name.endswith(LOCK_FILE):  # a single file's lock, beside it
        return path.with_name(path.name[1:-len(LOCK_FILE)])
    match = re.fullmatch(rf"\.(.+)(?:{re.escape(PARTIAL_SUFFIX)}|\.old)-\d+", path.name)
    return path.with_name(match.group(1)) if match else path
