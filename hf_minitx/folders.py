"""The one output policy of every command that writes: nothing is lost that the user did not ask to replace.

Folders (`train`, `experiment`, `train-tokenizer`, `push --dry_run`):

- a missing or empty folder is used; a path that is a file is refused;
- a non-empty folder is refused, and the error names what is in it, unless the command's replace flag is
  given (``--overwrite_output_dir`` for train, ``--overwrite`` elsewhere) or the run is resumed;
- a folder a command made holds ``RUN_MARKER`` (JSON: command, run id): resuming checks that the folder
  and the checkpoint belong to the same run;
- the old contents are removed only after every check has passed (``replace_folder``), and new folders
  are built in a hidden sibling and renamed into place (``write_folder``), so an interruption leaves the
  old complete folder or the new complete one.

Single files (`visualize --out`, `explore --out`, `benchmark --json`): written to a temporary sibling and renamed into place
(atomic); an existing file is replaced only when we wrote it (our tag inside it) or with ``--overwrite``.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

RUN_MARKER = ".minitx-run.json"
PARTIAL_SUFFIX = ".partial"  # hidden siblings being written: `.NAME.partial-<pid>`
WRITTEN_BY = "hf_minitx"  # the tag our single-file outputs carry (PNG text chunk "Software", JSON "written_by")


HTML_TAG = f'<meta name="generator" content="{WRITTEN_BY}">'  # the tag our HTML pages carry in their head


RUN_FILES = ("metrics.jsonl", "training_summary.json", "model.safetensors")  # what any run folder holds


class FolderRefused(FileExistsError, ValueError):
    """An output folder that this command may not write into as asked (a bad argument, and a file problem)."""


def describe_contents(folder: Path, limit: int = 5) -> str:
    """A short listing such as "tokenizer.json, README.md and 3 more"."""
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The run marker of a folder a command made (None when there is none or it cannot be read)."""
    try:
        return json.loads((folder / RUN_MARKER).read_text())
    except (OSError, ValueError):
        return None


def check_output_folder(
    path: str | Path, *, flag: str | None, overwrite: bool, option: str = "--output_dir",
    inputs: Iterable[tuple[str, str | Path]] = (),
) -> Path:
    """Refuse a file, or a non-empty folder without ``overwrite`` (``flag`` names the option that replaces;
    None: nothing may replace it), or a folder to be replaced that holds one of the ``inputs`` the command
    reads ((option, path) pairs: a dataset file, a tokenizer folder, a preset); nothing is written.
    Returns the path."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{option} {folder} is a file, not a folder; give a folder path")
    if folder.is_dir() and any(folder.iterdir()):
        if not overwrite:
            remedy = (f"Pass {flag} to replace it, or choose another {option}." if flag
                      else f"Choose a new or empty {option}.")
            raise FolderRefused(f"{option} {folder} already exists and is not empty: {_what_it_holds(folder)} "
                                f"({describe_contents(folder)}). {remedy}")
        check_inputs_outside(folder, inputs, option=option)
    return folder


def check_inputs_outside(folder: Path, inputs: Iterable[tuple[str, str | Path]], *, option: str) -> None:
    """Refuse to replace ``folder`` when an input the command reads lies in it (replacing would delete it)."""
    root = folder.resolve()
    for name, path in inputs:
        where = Path(path).expanduser().resolve()
        if where == root or root in where.parents:
            raise FolderRefused(
                f"{option} {folder} holds {path} ({name}), which this command reads: replacing the folder would "
                f"delete it; move that input out of {folder} or choose another {option}")


def check_marker(folder: Path) -> dict[str, Any] | None:
    """The run marker of ``folder`` (None when there is none); a damaged marker is a ValueError naming it."""
    path = folder / RUN_MARKER
    if not path.exists():
        return None
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        marker, detail = None, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else error}"
    else:
        detail = "not a JSON object with a run_id"
    if isinstance(marker, dict) and isinstance(marker.get("run_id"), str) and marker.get("command"):
        return marker
    raise ValueError(f"{path} is damaged ({detail}); it records which run made {folder}. Restore it, delete it "
                     "to resume with the checkpoint's own run id, or start again in another folder")


def _what_it_holds(folder: Path) -> str:
    made_by = read_marker(folder)
    if made_by:
        return f"it already holds a run of `minitx {made_by.get('command')}`"
    if any((folder / name).exists() for name in RUN_FILES) or any(folder.glob("checkpoint-*")):
        return "it already holds a run"
    return "it holds files this command did not make"


def replace_folder(folder: Path, *, command: str, run_id: str | None = None) -> str:
    """Empty ``folder`` (create it if needed) and mark it as this command's run; returns the run id.

    Call only after every check passed. The old contents are renamed away first, then deleted, so a crash
    never leaves a half-deleted mix in ``folder``.
    """
    if folder.is_dir() and any(folder.iterdir()):
        trash = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        folder.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    run_id = run_id or uuid.uuid4().hex[:12]
    write_marker(folder, command=command, run_id=run_id)
    return run_id


def write_marker(folder: Path, *, command: str, run_id: str) -> None:
    """Record which command and run made ``folder`` (atomically)."""
    write_file(folder / RUN_MARKER, lambda tmp: tmp.write_text(json.dumps({"command": command, "run_id": run_id})))


def partial_sibling(path: Path) -> Path:
    """A hidden sibling of ``path`` to write into before renaming into place."""
    return path.with_name(f".{path.name}{PARTIAL_SUFFIX}-{os.getpid()}")


def write_file(path: Path, fill: Callable[[Path], Any]) -> Path:
    """``fill(tmp)`` writes a temporary sibling, which then replaces ``path`` in one rename."""
    tmp = partial_sibling(path)
    try:
        fill(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_folder(folder: Path, fill: Callable[[Path], Any]) -> Path:
    """``fill(tmp)`` writes a complete folder next to ``folder``, which then takes its place.

    An existing ``folder`` (already checked by ``check_output_folder``) is renamed away just before and
    deleted after, so at every moment ``folder`` is the old complete one, the new complete one, or absent.
    """
    tmp = partial_sibling(folder)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def move_files_into(source: Path, folder: Path, *, last: str | None = None) -> None:
    """Rename every file of ``source`` into ``folder`` (each rename atomic), ``last`` at the very end."""
    names = sorted(p.name for p in source.iterdir())
    if last in names:
        names.remove(last)
        names.append(last)
    for name in names:
        os.replace(source / name, folder / name)
    source.rmdir()


def check_output_file(path: str | Path, *, overwrite: bool, option: str, is_ours: Callable[[Path], bool]) -> Path:
    """Refuse a folder, or an existing file we did not write, unless ``overwrite``. Returns the path."""
    out = Path(path)
    if out.is_dir():
        raise IsADirectoryError(f"{option} {out} is a folder; give a file path")
    if out.exists() and not overwrite and not is_ours(out):
        raise FileExistsError(
            f"{option} {out} exists and was not written by minitx; pass --overwrite to replace it, or choose "
            "another file name"
        )
    return out


def html_written_by_us(path: Path) -> bool:
    """Whether the HTML page at ``path`` carries our tag (in its first 2 kB, where the head is)."""
    try:
        with Path(path).open(encoding="utf-8", errors="replace") as handle:
            return HTML_TAG in handle.read(2048)
    except OSError:
        return False
