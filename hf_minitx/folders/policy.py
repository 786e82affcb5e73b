"""The output-folder policy: which folder a command may write, and which it may replace.

A file, a folder another live process writes, a folder inside an input (or holding one) and a non-empty folder
without the replace flag are refused; the replace flag replaces only a folder a minitx command made. Each refusal
names what is there and what to do."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .lock import check_not_locked, holding_lock
from .paths import (
    LOCK_FILE,
    RUN_MARKER,
    FolderRefused,
    describe_contents,
    folder_path,
    holds_run_files,
    read_marker,
)


@contextmanager
def output_folder(path: str | Path, *, command: str, option: str = "--output_dir", **checks: Any) -> Iterator[Path]:
    """The one way `minitx COMMAND` writes a folder: ``check_output_folder`` (``checks`` are its other options), the
    folder's lock for the whole write (``holding_lock``: taken before any work, as `train` takes it), and the checks
    again under the lock, so that what another writer finished meanwhile is seen. Yields the resolved folder, to
    be written with ``write_folder``."""
    folder = check_output_folder(path, option=option, command=command, **checks)
    with holding_lock(folder, command=command, option=option):
        check_output_folder(folder, option=option, command=command, **checks)
        yield folder


def check_output_folder(
    path: str | Path, *, flag: str | None, overwrite: bool, option: str = "--output_dir",
    inputs: Iterable[tuple[str, str | Path]] = (), command: str | None = None, any_flag: str | None = None,
    overwrite_any: bool = False, resume_flag: str | None = None,
) -> Path:
    """Refuse a file, a folder another live process writes, a folder inside an input or holding one, or a
    non-empty folder without ``overwrite`` (``flag`` names the option that replaces; None: nothing may
    replace it). With ``overwrite``, only a folder a minitx command made is replaced (``command``: only
    one that command made), unless ``overwrite_any`` (``any_flag`` names that option). ``inputs`` are
    the (option, path) pairs the command reads; ``resume_flag`` names how to continue a run the folder holds
    (offered where a run of this command is there). Nothing is written; returns the resolved folder."""
    folder = folder_path(path, option=option)
    check_apart(folder, inputs, option=option)
    if folder.is_dir():
        check_not_locked(folder, option=option)
    if folder.is_dir() and describe_contents(folder):
        check_inputs_outside(folder, inputs, option=option)
        if not overwrite:
            remedy = _replace_remedy(folder, flag, option, command, any_flag, resume_flag)
            raise FolderRefused(f"{option} {folder} already exists and is not empty: {_what_it_holds(folder)} "
                                f"({describe_contents(folder)}). {remedy}")
        check_replaceable(folder, option=option, command=command, any_flag=any_flag, overwrite_any=overwrite_any)
    return folder


def _what_it_holds(folder: Path) -> str:
    made_by = read_marker(folder)
    if made_by:
        return f"it already holds a run of `minitx {made_by.get('command')}`"
    if (folder / "config.json").is_file():
        return "it already holds a model folder"
    if holds_run_files(folder):
        return "it already holds a run"
    return "it holds files this command did not make"


def _flag_refusal(folder: Path, command: str | None) -> tuple[str, dict[str, Any] | None] | None:
    """Why a replace flag would not replace ``folder`` ("foreign": no minitx command made it; "other-command":
    another command's run), with its marker; None when it would."""
    made_by = read_marker(folder)
    if made_by is None and not holds_run_files(folder):
        return "foreign", made_by
    if made_by is None:  # a training run's records without a marker (a staged copy of a run, say): train's
        made_by = {"command": "train"}
    if command is not None and made_by.get("command") != command:
        return "other-command", made_by
    return None


def _replace_remedy(folder: Path, flag: str | None, option: str, command: str | None, any_flag: str | None,
                    resume_flag: str | None = None) -> str:
    """How to get past a non-empty output folder: the replace flag only where it would work, the resume flag
    only where a run of this command is there to continue."""
    if flag is None:
        return f"Choose a new or empty {option}."
    refusal = _flag_refusal(folder, command)
    if refusal is not None and refusal[0] == "foreign":
        anyway = f"pass {flag} {any_flag} to replace it anyway" if any_flag else "delete its contents yourself"
        return f"It was not made by minitx, so {flag} alone would not replace it: {anyway}, or choose another {option}."
    if refusal is not None:
        return f"{flag} would not replace another command's run: choose another {option}."
    resumable = resume_flag and any(folder.glob("checkpoint-*"))  # a run with nothing saved has nothing to go on from
    resume = f" (or {resume_flag} to continue its run)" if resumable else ""
    return f"Pass {flag} to replace it{resume}, or choose another {option}."


def check_replaceable(folder: Path, *, option: str, command: str | None, any_flag: str | None,
                      overwrite_any: bool) -> None:
    """A replace flag replaces a folder a minitx command made (``command``: that command's folders only);
    anything else is refused, naming what would be deleted, unless ``overwrite_any``."""
    if folder.resolve() in (Path.cwd().resolve(), *Path.cwd().resolve().parents):
        raise FolderRefused(f"{option} {folder} is the current folder (or holds it): replacing it would delete the "
                            f"folder you are in ({describe_contents(folder)}); choose a subfolder as {option}")
    if overwrite_any:
        return
    refusal = _flag_refusal(folder, command)
    count = sum(1 for p in folder.iterdir() if p.name != LOCK_FILE)
    what = f"{count} entr{'y' if count == 1 else 'ies'}: {describe_contents(folder)}"
    if refusal is not None and refusal[0] == "foreign":
        remedy = f"pass {any_flag} to delete them anyway, or" if any_flag else "delete them yourself, or"
        raise FolderRefused(f"{option} {folder} was not made by minitx; replacing it would delete {what}. The "
                            f"replace flag only replaces a minitx folder: {remedy} choose another {option}")
    if refusal is not None:
        raise FolderRefused(f"{option} {folder} holds a run of `minitx {refusal[1].get('command')}` ({what}); "
                            f"`minitx {command}` replaces only a folder `minitx {command}` made. Choose another "
                            f"{option}")


def check_apart(folder: Path, inputs: Iterable[tuple[str, str | Path]], *, option: str) -> None:
    """Refuse an output folder that is, or lies inside, an input folder of the command (writing there mixes
    the run into the data); an input inside the output folder is ``check_inputs_outside``'s job."""
    root = folder.resolve()
    for name, path in inputs:
        where = Path(path).expanduser().resolve()
        if where.is_dir() and (where == root or where in root.parents):
            raise FolderRefused(f"{option} {folder} is inside {path} ({name}), which this command reads: its "
                                f"output would be written into its own input; choose an {option} outside {path}")


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
