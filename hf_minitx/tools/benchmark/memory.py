"""Peak memory of a few training steps of each implementation, each in a fresh Python subprocess so that no
implementation pays for another's allocations. CPU: peak resident set size (and its growth over the size after
imports); CUDA: `max_memory_allocated`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import asdict

import torch

from .models import BenchmarkShape
from .speed import training_step

# The folder that holds the hf_minitx package (a checkout or site-packages), put first on the probes' path: they
# import this very copy of the package.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(importlib.util.find_spec("hf_minitx").origin))
MEMORY_IMPLEMENTATIONS = ("gpt2", "minitx-sdpa", "minitx-eager", "bart", "torch-transformer", "minitx-seq2seq")


def _status_bytes(field: str) -> int | None:
    """A memory line of /proc/self/status (Linux) in bytes, or None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            line = next(line for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024  # "VmHWM:  123456 kB"


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (Linux: write 5 to clear_refs), so import spikes are not counted."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _peak_rss_bytes() -> int:
    peak = _status_bytes("VmHWM")
    if peak is not None:
        return peak
    import resource

    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def memory_probe(name: str, shape: BenchmarkShape, steps: int = 2, device: str = "cpu") -> dict[str, float]:
    """Peak memory of `steps` training steps of `name` in this process (meant to be a fresh subprocess).

    CPU: peak resident set size, and its growth over the resident size after imports (the peak mark is reset
    after imports where the OS allows it). CUDA: max_memory_allocated.
    """
    import transformers  # noqa: F401  (imported before the baseline so every implementation pays it alike)

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        step, _ = training_step(name, shape, device)
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        return {"peak_bytes": float(torch.cuda.max_memory_allocated()), "kind": "cuda_max_memory_allocated"}
    reset = _reset_peak_rss()
    baseline = _status_bytes("VmRSS") if reset else _peak_rss_bytes()
    step, _ = training_step(name, shape, device)
    for _ in range(steps):
        step()
    peak = _peak_rss_bytes()
    return {"peak_bytes": float(peak), "growth_bytes": float(peak - baseline), "kind": "peak_rss",
            "peak_reset_after_imports": reset}


def measure_memory(shape: BenchmarkShape, threads: int, device: str = "cpu",
                   names: tuple[str, ...] = MEMORY_IMPLEMENTATIONS) -> dict[str, dict[str, float]]:
    """Run `memory_probe` for each implementation in a fresh Python subprocess."""
    results = {}
    for name in names:
        code = (
            "import json, sys, torch; from hf_minitx.tools.benchmark.memory import memory_probe; "
            "from hf_minitx.tools.benchmark.models import BenchmarkShape; "
            f"torch.set_num_threads({threads}); "
            f"print(json.dumps(memory_probe({name!r}, BenchmarkShape(**{asdict(shape)!r}), device={device!r})))"
        )
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        env["PYTHONPATH"] = PACKAGE_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"memory probe of {name} failed:\n{done.stderr[-2000:]}")
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return results



__all__ = ["MEMORY_IMPLEMENTATIONS", "measure_memory", "memory_probe"]
