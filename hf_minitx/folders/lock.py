"""One writer per output: a process holds ``LOCK_FILE`` (flock; JSON: pid, host, command) in a folder, or
``.NAME.minitx-lock`` beside a single file, for its whole write. A second writer is refused while the first
lives; the lock of a process that died (the kernel released it) is taken over with a note."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..launch import process_count
from .paths import LOCK_FILE, FolderRefused, first_missing, make_folder, remove_made

_held: dict[Path, tuple[int, Path]] = {}  # output (resolved) -> descriptor and path of the lock this process holds


def launch_id() -> str:
    """What names one launch: the pid of a single process; the rendezvous port shared by the processes of one
    ``accelerate launch`` (two launches on one host cannot share it)."""
    if process_count() > 1 and os.environ.get("MASTER_PORT"):
        return f"port{os.environ['MASTER_PORT']}"
    return str(os.getpid())


def _same_launch(owner: dict[str, Any]) -> bool:
    """Whether a lock's owner is another process of this launch (its first process locks for all of them)."""
    return owner.get("launch") == launch_id() and owner.get("host") == socket.gethostname()


def _lock_owner(fd: int) -> dict[str, Any]:
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def describe_owner(owner: dict[str, Any], lock: str = LOCK_FILE) -> str:
    """Who holds a lock: the command, pid and host its lock file records (another process, when it records none)."""
    if not owner.get("pid"):
        return f"another process (lock {lock})"
    return (f"`minitx {owner.get('command', '?')}` (pid {owner.get('pid', '?')} on {owner.get('host', '?')}, "
            f"lock {lock})")


def lock_holder(folder: Path) -> dict[str, Any] | None:
    """Who holds ``folder``'s lock (its JSON: pid, host, command) when another live process does; None when
    nobody (or this launch) does. Reads only."""
    path = folder / LOCK_FILE
    if folder.resolve() in _held or not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _lock_owner(fd)
        return None if _same_launch(owner) else owner
    finally:
        os.close(fd)
    return None


def is_held(output: Path) -> bool:
    """Whether this process holds the lock of ``output`` (a folder, or a single file)."""
    return output.resolve() in _held


def _busy(option: str, output: Path, owner: dict[str, Any], lock: str = LOCK_FILE) -> FolderRefused:
    return FolderRefused(f"{option} {output} is being written by {describe_owner(owner, lock)}; wait for it to "
                         f"finish or stop it, or choose another {option}")


def check_not_locked(folder: Path, *, option: str = "--output_dir") -> None:
    """Refuse a folder whose lock another live process holds; reads only."""
    owner = lock_holder(folder)
    if owner is not None:
        raise _busy(option, folder, owner)


def lock_path(output: Path, *, single_file: bool = False) -> Path:
    """Where the lock of an output lives: ``LOCK_FILE`` inside a folder, ``.NAME.minitx-lock`` beside a file."""
    return output.with_name(f".{output.name}{LOCK_FILE}") if single_file else output / LOCK_FILE


def _still_named(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the open file ``fd`` (its writer may have removed it before we locked it)."""
    try:
        named, held = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _take_lock(output: Path, lock: Path, *, command: str, option: str) -> None:
    """Lock ``lock`` (created if missing) for this process as the writer of ``output``; see ``lock_folder``."""
    key = output.resolve()
    if key in _held:
        return
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _lock_owner(fd)
            os.close(fd)
            raise _busy(option, output, owner, lock.name) from None
        if _still_named(fd, lock):
            break
        os.close(fd)  # its writer finished and removed it between our open and our lock: lock the file there now
    stale = _lock_owner(fd)
    if stale:
        print(f"note: {output} was locked by {describe_owner(stale, lock.name)}, which is no longer running; "
              "taking it over", file=sys.stderr)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                              "launch": launch_id()}).encode(), 0)
    _held[key] = (fd, lock.resolve())


def lock_folder(folder: Path, *, command: str, option: str = "--output_dir") -> None:
    """Take the lock of ``folder`` (created if missing) for this process, until ``unlock_folder`` or exit.

    A lock held by a live process refuses; one left by a process that died (the kernel released it) is
    taken over with a note on stderr."""
    make_folder(folder, option=option)
    _take_lock(folder, folder / LOCK_FILE, command=command, option=option)


def unlock_folder(folder: Path) -> None:
    """Release (and remove) the lock this process holds on ``folder`` (or on a single file); nothing when it holds
    none."""
    held = _held.pop(folder.resolve(), None)
    if held is not None:
        held[1].unlink(missing_ok=True)
        os.close(held[0])


@contextmanager
def holding_lock(output: Path, *, command: str, option: str = "--output_dir", single_file: bool = False
                 ) -> Iterator[Path]:
    """Hold the lock of ``output`` (a folder, or a single file) for a whole write, as `train` holds its folder's:
    a second writer is refused while this one lives. Folders made only to hold the lock are removed again when the
    write left them empty (it failed). Inside an outer hold of the same output, the outer one goes on."""
    if output.resolve() in _held:
        yield output
        return
    where = output.parent if single_file else output
    made = first_missing(where)
    try:
        make_folder(where, option=option, named=output)
        _take_lock(output, lock_path(output, single_file=single_file), command=command, option=option)
        yield output
    finally:
        unlock_folder(output)
        remove_made(where, made)
