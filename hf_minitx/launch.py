"""This process's place in a launch: ``accelerate launch`` (torchrun) sets RANK, LOCAL_RANK and WORLD_SIZE in each
process it starts; a process started alone is the first of one."""

from __future__ import annotations

import os


def process_count() -> int:
    """The processes of this launch, on every machine (1 when started alone)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def is_first_process(*, on_this_machine: bool = False) -> bool:
    """Whether this is the launch's first process (``on_this_machine``: the first on this machine)."""
    return os.environ.get("LOCAL_RANK" if on_this_machine else "RANK", "0") == "0"
