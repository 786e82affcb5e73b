"""Writes that leave the old complete output or the new complete one, never a mix.

A folder is built in a hidden sibling and swapped into place (in one step where the system can); a file is
written beside its path and renamed over it. A folder that cannot be renamed (a mount point, a Docker volume) is
emptied and written inside instead, and a file that cannot be renamed across file systems is moved."""

from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .lock import is_held, lock_folder
from .paths import LOCK_FILE, PARTIAL_SUFFIX, RUN_MARKER, describe_contents, partial_sibling
from .write_errors import write_advice, write_errno


def replace_folder(folder: Path, *, command: str, run_id: str | None = None, keep_old: bool = False
                   ) -> tuple[str, Path | None]:
    """Empty ``folder`` (create it if needed) and mark it as this command's run; returns the run id and, with
    ``keep_old``, the hidden sibling that holds the old contents until ``put_back`` or ``drop_set_aside``.

    Call only after every check passed. The folder is locked for this process first (a live writer
    refuses); the old contents are swapped out (``_swap_in``), then deleted (or kept aside), so a crash never
    leaves a half-deleted mix in ``folder``; the lock goes into the new folder with the same open file. A mount
    point cannot be renamed away: it is emptied in place, and nothing is kept aside.
    """
    lock_folder(folder, command=command)
    aside = None
    if describe_contents(folder) and os.path.ismount(folder):
        _empty_in_place(folder, keep=(LOCK_FILE,))
    elif describe_contents(folder):
        fresh = folder.with_name(f".{folder.name}.new-{os.getpid()}-{uuid.uuid4().hex[:6]}")
        fresh.mkdir()
        old = _swap_in(fresh, folder)
        if keep_old and old is not None:
            # a name no earlier run left (a restarted container reuses pids)
            aside = old.rename(folder.with_name(f".{folder.name}.replaced-{os.getpid()}-{uuid.uuid4().hex[:6]}"))
            (aside / LOCK_FILE).unlink(missing_ok=True)  # the lock's second name: it stays held in ``folder``
        else:
            shutil.rmtree(old, ignore_errors=True)
    run_id = run_id or uuid.uuid4().hex[:12]
    write_marker(folder, command=command, run_id=run_id)
    return run_id, aside


def put_back(folder: Path, aside: Path) -> None:
    """Undo ``replace_folder(keep_old=True)``: the contents kept ``aside`` take ``folder``'s place again, and what
    was written in ``folder`` since is deleted; the lock this process holds stays held."""
    shutil.rmtree(_swap_in(aside, folder), ignore_errors=True)


def drop_set_aside(aside: Path | None) -> None:
    """Delete the old contents ``replace_folder(keep_old=True)`` kept aside (the replacement is committed)."""
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _swap_in(fresh: Path, folder: Path) -> Path | None:
    """Put the complete folder ``fresh`` in place of ``folder``; returns where the old contents are now (to be
    deleted), None when there was no ``folder``. The lock this process holds on ``folder`` gets a second name in
    ``fresh`` first, so it stays held and named there. Both are exchanged in one step where the system can
    (renameat2), so no other writer can find the path free in between; elsewhere by two renames."""
    if not folder.exists():
        fresh.rename(folder)
        return None
    if is_held(folder):
        os.link(folder / LOCK_FILE, fresh / LOCK_FILE)
    if _exchange(fresh, folder):
        return fresh
    old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    folder.rename(old)
    fresh.rename(folder)
    return old


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths atomically (Linux's renameat2 RENAME_EXCHANGE); False where the system cannot."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_cwd, exchange = -100, 2  # AT_FDCWD, RENAME_EXCHANGE
    if renameat2(at_cwd, os.fsencode(first), at_cwd, os.fsencode(second), exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a file system or kernel without the exchange
        return False
    raise OSError(code, os.strerror(code), str(second))


def _empty_in_place(folder: Path, keep: tuple[str, ...]) -> None:
    """Delete what ``folder`` holds except the names in ``keep`` (a folder that cannot be renamed: a mount point)."""
    for path in folder.iterdir():
        if path.name not in keep:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def write_marker(folder: Path, *, command: str, run_id: str) -> None:
    """Record which command and run made ``folder`` (atomically)."""
    write_file(folder / RUN_MARKER, lambda tmp: tmp.write_text(json.dumps({"command": command, "run_id": run_id})))


def write_file(path: Path, fill: Callable[[Path], Any]) -> Path:
    """``fill(tmp)`` writes a temporary sibling, which then replaces ``path`` in one rename; a symlink is written
    through (the file it names is replaced, the link stays), as a linked output folder is."""
    path = path.resolve() if path.is_symlink() else path
    path.parent.mkdir(parents=True, exist_ok=True)  # a new folder named with the file, as check_output_file says
    tmp = partial_sibling(path)
    try:
        fill(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def honour_umask(folder: Path) -> None:
    """Give the files of ``folder`` written 0600 (safetensors writes its files through a private temporary) the
    mode the umask gives any other file, so that a model folder is readable as a whole or not at all."""
    mask = os.umask(0)
    os.umask(mask)
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o777 == 0o600:
            path.chmod(0o666 & ~mask)


def write_folder(folder: Path, fill: Callable[[Path], Any]) -> Path:
    """``fill(tmp)`` writes a complete folder next to ``folder``, which then takes its place.

    An existing ``folder`` (already checked by ``check_output_folder``) is swapped out just before and deleted
    after (``_swap_in``), so at every moment ``folder`` is the old complete one or the new complete one; the lock
    this process holds on it stays held in the new one.
    """
    mount = folder.is_dir() and os.path.ismount(folder)  # cannot be renamed: written inside (a Docker volume)
    tmp = folder / f".{folder.name}{PARTIAL_SUFFIX}-{os.getpid()}" if mount else partial_sibling(folder)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        fill(tmp)
        honour_umask(tmp)
        if mount:
            _empty_in_place(folder, keep=(tmp.name, LOCK_FILE))
            move_files_into(tmp, folder)
            return folder
        old = _swap_in(tmp, folder)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except Exception as error:
        code = write_errno(error)
        if code is None:
            raise
        state = "was left as it was" if folder.exists() else "was not made"
        raise OSError(f"cannot write {folder} ({os.strerror(code)}); it {state}; {write_advice(code, folder.parent)}"
                      ) from None
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
        try:
            os.replace(source / name, folder / name)
        except OSError as error:  # another file system (a mount point's parent): copied, then removed
            if error.errno != errno.EXDEV:
                raise
            if (folder / name).is_dir():
                shutil.rmtree(folder / name)
            shutil.move(source / name, folder / name)
    source.rmdir()
