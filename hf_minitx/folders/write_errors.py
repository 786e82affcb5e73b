"""Writes that fail for lack of room or rights, not for a bug: recognised (from the system or a Rust
library), and said in one line that names the path the user gave and what to do."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from .paths import unhidden


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
