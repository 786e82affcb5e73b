"""Pick a device (cuda -> mps -> cpu) and a dtype the device supports, with explicit overrides."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys

import torch

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


THREADS_PER_CORE = 4  # past this, torch threads only wait for the cores (and a few thousand cannot be created)


def check_thread_count(threads: int | None, option: str) -> None:
    """Refuse a CPU thread count ``option`` below 1 or past THREADS_PER_CORE per core: libgomp fails to create
    thousands (or dies in native code), and torch.set_num_threads overflows past a C int."""
    most = THREADS_PER_CORE * (os.cpu_count() or 1)
    if threads is not None and not 1 <= threads <= most:
        raise ValueError(f"{option} must be from 1 to {most} ({THREADS_PER_CORE} per core of this machine's "
                         f"{os.cpu_count()}), got {threads}; leave it out to use every core")


def pick_device(requested: str | None = None) -> torch.device:
    """``requested`` ("cuda", "cuda:1", "mps", "cpu") or the best available: cuda, then mps, then cpu."""
    if requested in (None, "", "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    try:
        device = torch.device(requested)
    except RuntimeError as err:
        raise ValueError(f"unknown device {requested!r}; use auto, cpu, cuda, cuda:N or mps") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {requested!r} was asked for but CUDA is not available; use --device cpu or auto")
    if device.type == "mps" and not _mps_available():
        raise ValueError(f"device {requested!r} was asked for but MPS is not available; use --device cpu or auto")
    return device


def pick_dtype(device: torch.device, requested: str | None = None) -> torch.dtype:
    """``requested`` (float32|bfloat16|float16, or auto) or the device's best: bf16 on recent CUDA, fp16 on
    older CUDA, fp32 on MPS and CPU."""
    if requested not in (None, "", "auto"):
        if requested not in DTYPES:
            raise ValueError(f"unknown dtype {requested!r}; use auto, {', '.join(sorted(set(DTYPES)))}")
        dtype = DTYPES[requested]
        if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            raise ValueError("this GPU does not support bfloat16; use --dtype float16 or float32")
        return dtype
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def describe_hardware(device: torch.device, num_processes: int = 1) -> str:
    """A short human description, e.g. '2 x cpu (2 cores)' or '1 x NVIDIA H100'."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "mps":
        name = "Apple MPS"
    else:
        name = f"cpu ({os.cpu_count()} cores)"
    return f"{num_processes} x {name}"


# glibc's mallopt parameters (malloc.h): the size from which a block is mapped from the OS on its own, and the free
# space at the top of the heap beyond which it is given back to the OS.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_FREED_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Let glibc keep the memory a CPU training step frees, for the next step; True where it could.

    A step of a small model allocates and frees the same large tensors every time (the (batch, seq, vocab)
    logits and their gradient are the largest). By default glibc maps blocks of a few MB straight from the OS
    and gives free heap space back, so each step touches fresh pages again: page faults, and kernel time,
    of tens of MB per step. Raising both thresholds to 1 GiB keeps that memory in the process; its resident size
    stays at the step's peak instead of falling back between steps. glibc only (Linux); elsewhere a no-op.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_FREED_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_FREED_BYTES))


def random_state_kept(device: torch.device, enabled: bool = True) -> contextlib.AbstractContextManager:
    """The random state of the CPU and of ``device`` restored on exit: what runs inside (an evaluation, a seeded
    generation) draws no number from the stream the training steps draw their dropout masks from."""
    if device.type == "cpu" or not enabled:
        return torch.random.fork_rng(devices=[], enabled=enabled)
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else None, device_type=device.type)

