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
- the old contents are removed only after every check has passed (``replace_folder``; a training run keeps them
  aside until training stops, and puts them back where it stops before a model or a checkpoint exists), and
  new folders are built in a hidden sibling and renamed into place (``write_folder``), so an interruption leaves
  the old complete folder or the new complete one. A folder that cannot be renamed (a mount point, a Docker volume)
  is emptied and written inside instead, and a file that cannot be renamed across file systems is moved.

Single files (`visualize --out`, `explore --out`, `benchmark --json`): written to a temporary sibling and renamed
into place (atomic); an existing file is replaced only when we wrote it (our tag inside it) or with ``--overwrite``.

The policy lives in ``policy``, the lock in ``lock``, the atomic writes in ``atomic``, single-file outputs in
``single_files``, failed writes in ``write_errors`` and the names and first checks of output paths in ``paths``;
this package exports them all.
"""

from __future__ import annotations

from .atomic import (
    drop_set_aside,
    honour_umask,
    move_files_into,
    put_back,
    replace_folder,
    write_file,
    write_folder,
    write_marker,
)
from .lock import (
    check_not_locked,
    describe_owner,
    holding_lock,
    launch_id,
    lock_folder,
    lock_holder,
    lock_path,
    unlock_folder,
)
from .paths import (
    LOCK_FILE,
    PARTIAL_SUFFIX,
    RUN_FILES,
    RUN_MARKER,
    SUMMARY_FILE,
    FolderRefused,
    check_not_under_a_file,
    describe_contents,
    folder_path,
    holds_run_files,
    output_path,
    partial_sibling,
    read_json_object,
    read_marker,
    read_summary,
    unhidden,
)
from .policy import (
    check_apart,
    check_inputs_outside,
    check_marker,
    check_output_folder,
    check_replaceable,
    output_folder,
)
from .single_files import HTML_TAG, WRITTEN_BY, check_output_file, html_written_by_us, weights_digest
from .write_errors import WRITE_ERRNOS, free_mib, raw_write_error, rust_os_error, write_advice, write_errno

__all__ = [
    "RUN_MARKER", "LOCK_FILE", "PARTIAL_SUFFIX", "WRITTEN_BY", "HTML_TAG", "RUN_FILES", "rust_os_error",
    "SUMMARY_FILE", "read_json_object", "read_summary", "folder_path",
    "WRITE_ERRNOS", "write_errno", "write_advice", "unhidden", "raw_write_error", "free_mib",
    "weights_digest", "FolderRefused", "describe_contents", "read_marker", "output_path",
    "check_not_under_a_file", "check_output_folder", "check_replaceable", "holds_run_files", "check_apart",
    "check_inputs_outside", "launch_id", "describe_owner", "lock_holder", "check_not_locked", "lock_path",
    "lock_folder", "unlock_folder", "holding_lock", "output_folder", "check_marker", "replace_folder",
    "write_marker", "put_back", "drop_set_aside", "partial_sibling", "write_file", "write_folder",
    "move_files_into", "check_output_file", "html_written_by_us", "honour_umask",
]
