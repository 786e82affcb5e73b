"""The one output policy of every command that writes: nothing is lost that the user did not ask to replace.

Folders (`train`, `experiment`, `train-tokenizer`, `push --dry_run`):

- a missing or empty folder is used; a path that is a file is refused;
- a non-empty folder is refused, and the error names what is in it, unless the command's replace flag is
  given (``--overwrite_output_dir`` for train, ``--overwrite`` elsewhere) or the run is resumed;
- a folder a command made holds ``RUN_MARKER`` (JSON: command, run id): resuming checks that the folder
  and the checkpoint belong to the same run;
- one writer per folder: a run holds ``LOCK_FILE`` (pid and host) while it writes; a second writer is refused
  while the first lives, and the lock of a process that died is taken over with a note;
- a symlinked folder is resolved first (the real folder holds the run; the link stays), and ``.`` is the
  current folder (used when empty or resumed, never replaced);
- an output folder inside an input folder, or an input inside the output folder, is refused;
- the replace flag replaces only a folder a minitx command made (the marker, or a run's files); anything
  else needs ``--overwrite_any_folder`` (train) or is refused, naming what it would delete;
- the old contents are removed only after every check has passed (``replace_folder``), and new folders
  are built in a hidden sibling and renamed into place (``write_folder``), so an interruption leaves the
  old complete folder or the new complete one. A folder that cannot be renamed (a mount point, a Docker volume)
  is emptied and written inside instead, and a file that cannot be renamed across file systems is moved.

Single files (`visualize --out`, `explore --out`, `benchmark --json`): written to a temporary sibling and renamed into place
(atomic); an existing file is replaced only when we wrote it (our tag inside it) or with ``--overwrite``.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

RUN_MARKER = ".minitx-run.json"
LOCK_FILE = ".minitx-lock"  # held (flock) by the process writing the folder; JSON: pid, host, command
PARTIAL_SUFFIX = ".partial"  # hidden siblings being written: `.NAME.partial-<pid>`
WRITTEN_BY = "hf_minitx"  # the tag our single-file outputs carry (PNG text chunk "Software", JSON "written_by")


HTML_TAG = f'<meta name="generator" content="{WRITTEN_BY}">'  # the tag our HTML pages carry in their head


RUN_FILES = ("metrics.jsonl", "training_summary.json", "model.safetensors")  # what any run folder holds


def rust_os_error(error: BaseException) -> OSError | None:
    """The OS error inside an error of a Rust library (safetensors' SafetensorError, tokenizers' plain Exception):
    "... (os error 28)" or "IoError(Os { code: 28, ... })"; None for other errors."""
    import re

    if isinstance(error, OSError) or type(error).__name__ not in ("SafetensorError", "Exception"):
        return None
    match = re.search(r"\bcode: (\d+)|\(os error (\d+)\)", str(error))
    if match is None:
        return None
    code = int(match.group(1) or match.group(2))
    return OSError(code, os.strerror(code))


# Errors of a write that failed for lack of room or rights, not for a bug: said in one line, never a traceback.
WRITE_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EIO)


def write_errno(error: BaseException) -> int | None:
    """The errno of a failed write among WRITE_ERRNOS (an OSError's, or the one inside a Rust library's error);
    ENOSPC for numpy's short write ("N requested and M written", a full disk); None for any other error."""
    import re

    code = error.errno if isinstance(error, OSError) else getattr(rust_os_error(error), "errno", None)
    if code is None and isinstance(error, OSError) and re.search(r"\d+ requested and \d+ written", str(error)):
        code = errno.ENOSPC
    return code if code in WRITE_ERRNOS else None


def write_advice(code: int, path: Path) -> str:
    """What to do about a write that failed with ``code`` (one of WRITE_ERRNOS) at ``path``."""
    if code == errno.EROFS:
        return "that file system is read-only: pick a writable place, then run the same command again"
    if code == errno.EACCES:
        return "you may not write there: pick a place you can write to (or fix its permissions), then run again"
    if code == errno.EIO:
        return "the disk reported an I/O error: check it (or pick another place), then run the same command again"
    return (f"{free_mib(path):,.0f} MiB free there: free some space (or pick another place), then run the same "
            "command again")


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


def raw_write_error(error: BaseException) -> str | None:
    """One line for an OSError straight from the system (it names a file) among WRITE_ERRNOS: the path the user
    named, why, and what to do; None for any other error (a message we wrote ourselves has no errno)."""
    filename = getattr(error, "filename", None)
    code = write_errno(error) if isinstance(error, OSError) else None
    if code is None or not filename:
        return None
    path = unhidden(Path(os.fsdecode(filename)))
    return f"cannot write {path} ({os.strerror(code)}); {write_advice(code, path)}"


def free_mib(path: Path) -> float:
    """MiB free on the file system of `path` (or of its nearest existing parent)."""
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    return shutil.disk_usage(existing).free / 2**20


def weights_digest(model_dir: Path) -> str:
    """SHA-256 of a model folder's weight files (every ``*.safetensors`` at its top, in name order): what names
    the exact model a page or a report was made from."""
    digest = hashlib.sha256()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


class FolderRefused(FileExistsError, ValueError):
    """An output folder that this command may not write into as asked (a bad argument, and a file problem)."""


def describe_contents(folder: Path, limit: int = 5) -> str:
    """A short listing such as "tokenizer.json, README.md and 3 more"."""
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir() if p.name != LOCK_FILE)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The run marker of a folder a command made (None when there is none or it cannot be read)."""
    try:
        return json.loads((folder / RUN_MARKER).read_text())
    except (OSError, ValueError):
        return None


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


def check_output_folder(
    path: str | Path, *, flag: str | None, overwrite: bool, option: str = "--output_dir",
    inputs: Iterable[tuple[str, str | Path]] = (), command: str | None = None, any_flag: str | None = None,
    overwrite_any: bool = False,
) -> Path:
    """Refuse a file, a folder another live process writes, a folder inside an input or holding one, or a
    non-empty folder without ``overwrite`` (``flag`` names the option that replaces; None: nothing may
    replace it). With ``overwrite``, only a folder a minitx command made is replaced (``command``: only
    one that command made), unless ``overwrite_any`` (``any_flag`` names that option). ``inputs`` are
    the (option, path) pairs the command reads. Nothing is written; returns the resolved folder."""
    folder = output_path(path, option=option)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{option} {folder} is a file, not a folder; give a folder path")
    check_not_under_a_file(Path(path), option=option)
    check_apart(folder, inputs, option=option)
    if folder.is_dir():
        check_not_locked(folder, option=option)
    if folder.is_dir() and describe_contents(folder):
        check_inputs_outside(folder, inputs, option=option)
        if not overwrite:
            raise FolderRefused(f"{option} {folder} already exists and is not empty: {_what_it_holds(folder)} "
                                f"({describe_contents(folder)}). {_replace_remedy(folder, flag, option, command, any_flag)}")
        check_replaceable(folder, option=option, command=command, any_flag=any_flag, overwrite_any=overwrite_any)
    return folder


def _flag_refusal(folder: Path, command: str | None) -> tuple[str, dict[str, Any] | None] | None:
    """Why a replace flag would not replace ``folder`` ("foreign": no minitx command made it; "other-command":
    another command's run), with its marker; None when it would."""
    made_by = read_marker(folder)
    if made_by is None and not holds_run_files(folder):
        return "foreign", made_by
    if command is not None and made_by is not None and made_by.get("command") != command:
        return "other-command", made_by
    return None


def _replace_remedy(folder: Path, flag: str | None, option: str, command: str | None, any_flag: str | None) -> str:
    """How to get past a non-empty output folder: the replace flag only where it would work."""
    if flag is None:
        return f"Choose a new or empty {option}."
    refusal = _flag_refusal(folder, command)
    if refusal is not None and refusal[0] == "foreign":
        anyway = f"pass {flag} {any_flag} to replace it anyway" if any_flag else "delete its contents yourself"
        return f"It was not made by minitx, so {flag} alone would not replace it: {anyway}, or choose another {option}."
    if refusal is not None:
        return f"It holds a run of `minitx {refusal[1].get('command')}`, which {flag} would not replace: choose another {option}."
    return f"Pass {flag} to replace it, or choose another {option}."


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


def holds_run_files(folder: Path) -> bool:
    """Whether ``folder`` holds what a training run writes (a model, metrics, checkpoints)."""
    return any((folder / name).exists() for name in RUN_FILES) or any(folder.glob("checkpoint-*"))


def check_apart(folder: Path, inputs: Iterable[tuple[str, str | Path]], *, option: str) -> None:
    """Refuse an output folder that is, or lies inside, an input folder of the command (writing there mixes
    the run into the data); an input inside the output folder is ``check_inputs_outside``'s job."""
    root = folder.resolve()
    for name, path in inputs:
        where = Path(path).expanduser().resolve()
        if where.is_dir() and (where == root or where in root.parents):
            raise FolderRefused(f"{option} {folder} is inside {path} ({name}), which this command reads: the run "
                                f"would be written into its own input; choose an {option} outside {path}")


def check_inputs_outside(folder: Path, inputs: Iterable[tuple[str, str | Path]], *, option: str) -> None:
    """Refuse to replace ``folder`` when an input the command reads lies in it (replacing would delete it)."""
    root = folder.resolve()
    for name, path in inputs:
        where = Path(path).expanduser().resolve()
        if where == root or root in where.parents:
            raise FolderRefused(
                f"{option} {folder} holds {path} ({name}), which this command reads: replacing the folder would "
                f"delete it; move that input out of {folder} or choose another {option}")


# --- one writer per output ---------------------------------------------------------------------------

_held: dict[Path, tuple[int, Path]] = {}  # output (resolved) -> descriptor and path of the lock this process holds


def launch_id() -> str:
    """What names one launch: the pid of a single process; the rendezvous port shared by the processes of one
    ``accelerate launch`` (two launches on one host cannot share it)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("MASTER_PORT"):
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
    folder.mkdir(parents=True, exist_ok=True)
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
    made = next((path for path in reversed((where, *where.parents)) if not path.exists()), None)
    try:
        where.mkdir(parents=True, exist_ok=True)
        _take_lock(output, lock_path(output, single_file=single_file), command=command, option=option)
        yield output
    finally:
        unlock_folder(output)
        _remove_empty(where, made)


def _remove_empty(folder: Path, made: Path | None) -> None:
    """Remove ``folder`` and its parents up to ``made`` (the first one a command made) while they are empty."""
    for path in (folder, *folder.parents) if made is not None else ():
        if not path.is_dir() or any(path.iterdir()):
            return
        path.rmdir()
        if path == made:
            return


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
    if (folder / "config.json").is_file():
        return "it already holds a model folder"
    if holds_run_files(folder):
        return "it already holds a run"
    return "it holds files this command did not make"


def replace_folder(folder: Path, *, command: str, run_id: str | None = None) -> str:
    """Empty ``folder`` (create it if needed) and mark it as this command's run; returns the run id.

    Call only after every check passed. The folder is locked for this process first (a live writer
    refuses); the old contents are swapped out (``_swap_in``), then deleted, so a crash never leaves a
    half-deleted mix in ``folder``; the lock goes into the new folder with the same open file.
    """
    lock_folder(folder, command=command)
    if describe_contents(folder) and os.path.ismount(folder):  # a mount point cannot be renamed away: emptied
        _empty_in_place(folder, keep=(LOCK_FILE,))
    elif describe_contents(folder):
        fresh = folder.with_name(f".{folder.name}.new-{os.getpid()}")
        fresh.mkdir()
        shutil.rmtree(_swap_in(fresh, folder), ignore_errors=True)
    run_id = run_id or uuid.uuid4().hex[:12]
    write_marker(folder, command=command, run_id=run_id)
    return run_id


def _swap_in(fresh: Path, folder: Path) -> Path | None:
    """Put the complete folder ``fresh`` in place of ``folder``; returns where the old contents are now (to be
    deleted), None when there was no ``folder``. The lock this process holds on ``folder`` gets a second name in
    ``fresh`` first, so it stays held and named there. Both are exchanged in one step where the system can
    (renameat2), so no other writer can find the path free in between; elsewhere by two renames."""
    if not folder.exists():
        fresh.rename(folder)
        return None
    if folder.resolve() in _held:
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


def partial_sibling(path: Path) -> Path:
    """A hidden sibling of ``path`` to write into before renaming into place."""
    return path.with_name(f".{path.name}{PARTIAL_SUFFIX}-{os.getpid()}")


def write_file(path: Path, fill: Callable[[Path], Any]) -> Path:
    """``fill(tmp)`` writes a temporary sibling, which then replaces ``path`` in one rename; a symlink is written
    through (the file it names is replaced, the link stays), as a linked output folder is."""
    path = path.resolve() if path.is_symlink() else path
    tmp = partial_sibling(path)
    try:
        fill(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


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


def check_output_file(path: str | Path, *, overwrite: bool, option: str, is_ours: Callable[[Path], bool]) -> Path:
    """Refuse a folder, a path under a file, or an existing file we did not write, unless ``overwrite``.
    Returns the path (its missing parent folders are made when it is written); a symlink is resolved to the file it
    names, as a linked folder is, so that writing replaces that file and leaves the link in place."""
    out = Path(path).expanduser()
    if out.is_symlink():  # a link to an earlier page stays a link: the page it points to is replaced
        out = out.resolve()
    if out.is_dir():
        raise IsADirectoryError(f"{option} {out} is a folder; give a file path")
    check_not_under_a_file(out, option=option)
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
