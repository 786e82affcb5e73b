"""The final save on a full disk: the space it needs is checked before it starts, and when the output folder's
disk cannot hold the finished model, the model is written to a folder on another disk instead, so that the trained
weights (the only copy, in memory, of every step since the last checkpoint) are never lost without a word."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from ..folders import free_mib, write_errno, write_folder

SAVE_MARGIN = 512 << 10  # config, generation config, summary, card, loss curve and the model's code files


def final_save_bytes(model: torch.nn.Module, tokenizer: Any, state_dict: dict[str, torch.Tensor] | None) -> int:
    """About the bytes the final folder takes: each weight tensor once (tied ones share storage), the tokenizer
    as JSON, and a margin for the small files."""
    seen, weights = set(), 0
    for tensor in (state_dict or model.state_dict()).values():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset()) if tensor.device.type != "meta" else None
        if key is None or key not in seen:
            seen.add(key)
            weights += tensor.numel() * tensor.element_size()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    tokens = len(backend.to_str()) if backend is not None else 0
    return weights + 2 * tokens + SAVE_MARGIN


def check_room(folder: Path, need: int) -> None:
    """An OSError (ENOSPC) when ``folder``'s disk has less than ``need`` bytes free: raised before the save, so
    that the model is kept elsewhere rather than half-written."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # cannot be measured: the write itself will tell
    if free < need:
        raise OSError(errno.ENOSPC, f"about {need / 2**20:,.1f} MiB needed, {free / 2**20:,.1f} MiB free")


def rescue_places() -> list[Path]:
    """Where a finished model that its output folder's disk cannot hold is written instead: the temporary
    folder, then the home folder (the first with room)."""
    return [Path(tempfile.gettempdir()), Path.home()]


def rescue_final_model(write: Callable[[Path], Any], output_dir: Path, need: int, steps: int, run_id: str | None,
                       error: BaseException, failure: BaseException) -> OSError:
    """Write the finished model (``write(folder)``) into the first of ``rescue_places`` with room; returns the
    one-line error to raise: where the model now is and what to do, or, when no place could hold it, that and
    ``failure`` (the one line for the output folder's write ``error``, with its advice)."""
    name = f"minitx-rescued-{output_dir.name}-step{steps}{f'-{run_id}' if run_id else ''}"
    tried = []
    for place in rescue_places():
        tried.append(str(place))
        if not place.is_dir() or (place / name).exists() or free_mib(place) * 2**20 < need:
            continue
        try:
            write_folder(place / name, write)
        except (OSError, RuntimeError, SafetensorError):  # this place cannot hold it either: the next one
            continue
        return OSError(f"cannot write the final model into {output_dir} ({reason(error)}; "
                       f"{free_mib(output_dir):,.1f} MiB free there, about {need / 2**20:,.1f} MiB needed): the "
                       f"finished model of {steps} steps was saved to {place / name} instead; move its files into "
                       f"{output_dir} once there is room (training_summary.json last), or use it from there")
    return OSError(f"the finished model of {steps} steps could not be kept anywhere (no room in "
                   f"{' or '.join(tried)} either): {failure}")


def reason(error: BaseException) -> str:
    """Why a write failed, in a few words (the OS's text for its errno)."""
    code = write_errno(error)
    return os.strerror(code) if code is not None else "the file write failed"
