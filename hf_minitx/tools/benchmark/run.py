"""Side-by-side speed and memory benchmark of hf_minitx against the implementations users would otherwise pick.

Every workload builds all its implementations at one shared shape, then times them round-robin in one process,
rotating the order every round so drift in machine load hits every implementation alike. Figures are medians
over rounds; ratios are paired (implementation / reference within the same round), then the median is taken.

Workloads:
- `train_causal`: decoder-only training step (forward + backward + AdamW), hf_minitx (sdpa, eager) vs
  transformers' `GPT2LMHeadModel` (sdpa) at the same dimensions and parameter count.
- `train_seq2seq`: encoder-decoder training step, hf_minitx vs `BartForConditionalGeneration` and
  `torch.nn.Transformer` (with embeddings and a tied output layer).
- `generate_b1` / `generate_b8`: greedy generation with a KV cache (EOS cannot stop it early), hf_minitx vs
  GPT-2 `generate()`, eager (dynamic cache) and compiled (static cache + torch.compile, compile time reported
  apart); at batch 1 also both without a cache (each model's cache speed-up). See `generation_bench`.
- `generate_seq2seq`: greedy generation (one beam) at batch 1 from a `seq2seq_len` source, hf_minitx vs BART.
- `memory`: peak memory of a few training steps, each implementation in a fresh subprocess.
- `mfu` (CUDA only): model FLOPs utilisation at a GPT-2-small shape in bf16, eager and `torch.compile`d.
- data preparation (``data_prep_bench``): raw .txt to packed blocks, hf_minitx vs run_clm's map + group_texts on
  line rows and on paragraph rows.
- quality (``quality_bench``): validation bits per byte at equal wall time, `minitx train --max_minutes T` vs
  GPT-2 trained in a plain loop with nanoGPT's recipe, on the same tokens, each side alone on every core.
"""

from __future__ import annotations

import datetime
import glob
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from ...device import pick_device
from ...folders import WRITTEN_BY, check_output_file, write_file
from .data_prep import format_data_prep, run_data_prep
from .generation import COMPILED_SUFFIX, generation_step, int8_available
from .models import QUICK_SHAPE, BenchmarkShape, build, count_parameters, random_ids
from .quality import QUALITY_CORPORA, QualitySettings, format_quality, plot_curves, run_quality

# Workload name -> (reference implementation, implementations) in the order they are built.
WORKLOADS: dict[str, tuple[str, tuple[str, ...]]] = {
    "train_causal": ("gpt2", ("gpt2", "gpt2-gelu", "minitx-sdpa", "minitx-eager")),
    "train_seq2seq": ("bart", ("bart", "torch-transformer", "minitx-seq2seq")),
    "generate_b1": ("gpt2", ("gpt2", "minitx", "gpt2-compiled", "minitx-compiled", "minitx-no-cache", "gpt2-no-cache",
                             "minitx-bf16", "minitx-int8", "minitx-int8-compiled")),
    "generate_b8": ("gpt2", ("gpt2", "minitx", "gpt2-compiled", "minitx-compiled", "minitx-bf16", "minitx-int8",
                             "minitx-int8-compiled")),
    "generate_seq2seq": ("bart", ("bart", "minitx-seq2seq")),
}
# Low-precision generation rows, each also reported over our fp32 eager row round by round.
LOW_PRECISION_ROWS = ("minitx-bf16", "minitx-int8", "minitx-int8-compiled")
MEMORY_IMPLEMENTATIONS = ("gpt2", "minitx-sdpa", "minitx-eager", "bart", "torch-transformer", "minitx-seq2seq")
# Dense bf16 tensor-core peak (FLOP/s) by GPU name fragment, for MFU.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12, "L4": 121e12}


# ----------------------------------------------------------------------------------------------- steps


def training_step(name: str, shape: BenchmarkShape, device: str = "cpu") -> tuple[Callable[[], int], nn.Module]:
    """Build `name` and return (step, model); step() runs forward + backward + AdamW and returns tokens used."""
    model = build(name, shape).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1)
    if name in ("bart", "minitx-seq2seq", "torch-transformer"):
        source = random_ids(shape.batch, shape.seq2seq_len, shape.vocab_size, gen, device)
        target = random_ids(shape.batch, shape.seq2seq_len, shape.vocab_size, gen, device)
        if name == "torch-transformer":
            def loss_fn() -> torch.Tensor:
                return model(source, target)
        else:
            def loss_fn() -> torch.Tensor:
                return model(input_ids=source, labels=target).loss
        tokens = source.numel() + target.numel()
    else:
        ids = random_ids(shape.batch, shape.context, shape.vocab_size, gen, device)

        def loss_fn() -> torch.Tensor:
            return model(input_ids=ids, labels=ids).loss
        tokens = ids.numel()

    def step() -> int:
        loss = loss_fn()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise RuntimeError(f"{name}: training loss is not finite ({value}).")
        return tokens

    return step, model


# ----------------------------------------------------------------------------------------------- timing


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def interleaved(steps: dict[str, Callable[[], int]], rounds: int, repeats: int, warmup: int,
                device: str = "cpu") -> dict[str, list[float]]:
    """Time each step round-robin; round r starts at implementation r mod n. Returns tokens/s per round."""
    names = list(steps)
    for name in names:
        for _ in range(warmup):
            steps[name]()
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            _sync(device)
            start = time.perf_counter()
            tokens = sum(steps[name]() for _ in range(repeats))
            _sync(device)
            rates[name].append(tokens / (time.perf_counter() - start))
    return rates


def summarize(rates: dict[str, list[float]], reference: str) -> dict[str, dict[str, float]]:
    """Median tokens/s and the median of per-round ratios to `reference` for every implementation."""
    out = {}
    for name, values in rates.items():
        ratios = [v / ref for v, ref in zip(values, rates[reference], strict=True)]
        out[name] = {
            "tokens_per_second": statistics.median(values),
            "ratio_vs_reference": statistics.median(ratios),
            "rounds": len(values),
        }
    return out


def run_workload(workload: str, shape: BenchmarkShape, rounds: int, repeats: int, warmup: int,
                 device: str = "cpu", compile_backend: str = "inductor") -> dict:
    """Build every implementation of `workload`, time them interleaved, and summarise.

    `compile_backend` is the torch.compile backend of the "-compiled" generation rows; "none" leaves them out.
    """
    reference, names = WORKLOADS[workload]
    params: dict[str, int] = {}
    compile_seconds: dict[str, float] = {}
    steps = {}
    if workload.startswith("train"):
        for name in names:
            steps[name], model = training_step(name, shape, device)
            params[name] = count_parameters(model)
    else:
        batch = shape.batch if workload == "generate_b8" else 1
        for name in names:
            if name.endswith(COMPILED_SUFFIX) and compile_backend == "none" or "-int8" in name and not \
                    int8_available():
                continue
            steps[name], seconds = generation_step(name, shape, batch, device, compile_backend)
            if seconds is not None:
                compile_seconds[name] = seconds
    rates = interleaved(steps, rounds, repeats, warmup, device)
    result = {"reference": reference, "implementations": summarize(rates, reference), "raw_tokens_per_second": rates}
    if params:
        result["parameters"] = params
    if compile_seconds:
        result["compile_seconds"] = compile_seconds
        result["compile_backend"] = compile_backend
    for who in ("minitx", "gpt2"):
        if f"{who}{COMPILED_SUFFIX}" in rates:
            compiled, eager = rates[f"{who}{COMPILED_SUFFIX}"], rates[who]
            result[f"{who}_compiled_speedup"] = statistics.median(c / e for c, e in zip(compiled, eager, strict=True))
    for low in LOW_PRECISION_ROWS:
        if low in rates and workload.startswith("generate"):  # over our own fp32 eager, round by round
            result[f"{low}_vs_fp32"] = statistics.median(x / f for x, f in zip(rates[low], rates["minitx"], strict=True))
    if "minitx-int8-compiled" in rates and "minitx-compiled" in rates:  # both compiled
        result["minitx-int8-compiled_vs_fp32_compiled"] = statistics.median(
            x / f for x, f in zip(rates["minitx-int8-compiled"], rates["minitx-compiled"], strict=True))
    if workload == "generate_b1":
        cached, uncached = rates["minitx"], rates["minitx-no-cache"]
        result["minitx_cache_speedup"] = statistics.median(c / u for c, u in zip(cached, uncached, strict=True))
        cached, uncached = rates["gpt2"], rates["gpt2-no-cache"]
        result["gpt2_cache_speedup"] = statistics.median(c / u for c, u in zip(cached, uncached, strict=True))
    return result


# ----------------------------------------------------------------------------------------------- memory


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
            "import json, sys, torch; from hf_minitx.tools.benchmark.run import BenchmarkShape, memory_probe; "
            f"torch.set_num_threads({threads}); "
            f"print(json.dumps(memory_probe({name!r}, BenchmarkShape(**{asdict(shape)!r}), device={device!r})))"
        )
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"memory probe of {name} failed:\n{done.stderr[-2000:]}")
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


# ----------------------------------------------------------------------------------------------- MFU (CUDA)


def training_flops_per_token(model: nn.Module, layers: int, hidden: int, context: int) -> float:
    """6·N for the weights' matmuls (forward + backward) plus 12·layers·hidden·context for attention scores."""
    return 6.0 * count_parameters(model) + 12.0 * layers * hidden * context


def measure_mfu(compile_model: bool, steps: int = 10, batch: int = 8, peak_flops: float | None = None) -> dict:
    """MFU of hf_minitx training at the GPT-2-small shape (124M, context 1024) in bf16 autocast on CUDA."""
    shape = BenchmarkShape(vocab_size=50304, context=1024, layers=12, hidden=768, heads=12, batch=batch,
                           prompt_len=1, new_tokens=1)
    name = torch.cuda.get_device_name()
    peak = peak_flops or next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    if peak is None:
        raise ValueError(f"Unknown peak bf16 FLOP/s for GPU {name!r}; pass --peak-tflops.")
    torch.backends.cuda.matmul.allow_tf32 = True
    model = build("minitx-sdpa", shape).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    forward = torch.compile(model) if compile_model else model
    ids = torch.randint(4, shape.vocab_size, (batch, shape.context), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    flops = training_flops_per_token(model, shape.layers, shape.hidden, shape.context) * ids.numel()
    return {"gpu": name, "compiled": compile_model, "step_seconds": seconds,
            "tokens_per_second": ids.numel() / seconds, "mfu": flops / seconds / peak, "peak_flops": peak}


# ----------------------------------------------------------------------------------------------- driver


def machine_description(threads: int, device: str) -> dict:
    """CPU model, cores, load average, library versions and the date (UTC): the context any figure needs."""
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {
        "cpu": cpu, "cpu_count": os.cpu_count(), "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "torch_threads": threads, "device": device, "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "hf_minitx": _package_version(), "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _package_version() -> str | None:
    """hf_minitx's installed version, or None where the package metadata is missing (a bare checkout)."""
    try:
        return importlib.metadata.version("hf_minitx")
    except importlib.metadata.PackageNotFoundError:
        return None


def run_benchmark(shape: BenchmarkShape, *, rounds: int = 5, repeats: int = 1, warmup: int = 1, threads: int = 1,
                  device: str = "cpu", workloads: tuple[str, ...] = tuple(WORKLOADS), memory: bool = True,
                  mfu: bool = True, compile_backend: str = "inductor", log: Callable[[str], None] = print) -> dict:
    """Run the chosen workloads and return every figure as a JSON-ready dict."""
    shape.check()
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        raise ValueError(f"Unknown workloads {sorted(unknown)}; choose from {list(WORKLOADS)}.")
    if rounds < 1 or repeats < 1 or warmup < 0:
        raise ValueError("rounds and repeats must be >= 1 and warmup >= 0.")
    torch.set_num_threads(threads)
    result: dict = {"machine": machine_description(threads, device), "shape": asdict(shape),
                    "settings": {"rounds": rounds, "repeats": repeats, "warmup": warmup}, "workloads": {}}
    start = time.perf_counter()
    for workload in workloads:
        log(f"[benchmark] {workload} ...")
        result["workloads"][workload] = run_workload(workload, shape, rounds, repeats, warmup, device, compile_backend)
    if memory:
        log("[benchmark] peak memory (one subprocess per implementation) ...")
        result["memory"] = measure_memory(shape, threads, device)
    if mfu and device.startswith("cuda"):
        log("[benchmark] MFU at GPT-2-small shape, bf16 ...")
        result["mfu"] = {"eager": measure_mfu(False), "compiled": measure_mfu(True)}
    elif mfu:
        result["mfu"] = {"skipped": "MFU is measured on CUDA only"}
    result["machine"]["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    result["elapsed_seconds"] = time.perf_counter() - start
    return result


def format_table(result: dict) -> str:
    """A Markdown table of the medians and paired ratios (and memory, cache speed-up, MFU when present)."""
    lines = ["| workload | implementation | tokens/s (median) | ratio vs reference |", "|---|---|---:|---:|"]
    for workload, data in result["workloads"].items():
        for name, figures in data["implementations"].items():
            ref = " (reference)" if name == data["reference"] else ""
            lines.append(f"| {workload} | {name}{ref} | {figures['tokens_per_second']:.0f} | "
                         f"{figures['ratio_vs_reference']:.2f}x |")
        for who in ("minitx", "gpt2"):
            if f"{who}_cache_speedup" in data:
                lines.append(f"| {workload} | {who} cache vs no cache | | {data[f'{who}_cache_speedup']:.1f}x |")
            if f"{who}_compiled_speedup" in data:
                seconds = data["compile_seconds"][f"{who}{COMPILED_SUFFIX}"]
                lines.append(f"| {workload} | {who} compiled vs eager (compile {seconds:.0f} s, not timed) | | "
                             f"{data[f'{who}_compiled_speedup']:.2f}x |")
        for low in LOW_PRECISION_ROWS:
            if f"{low}_vs_fp32" in data:
                lines.append(f"| {workload} | {low} vs minitx fp32 | | {data[f'{low}_vs_fp32']:.2f}x |")
        if "minitx-int8-compiled_vs_fp32_compiled" in data:
            lines.append(f"| {workload} | minitx-int8-compiled vs minitx-compiled | | "
                         f"{data['minitx-int8-compiled_vs_fp32_compiled']:.2f}x |")
    if "memory" in result:
        lines += ["", "| training peak memory | peak (MiB) | growth over imports (MiB) |", "|---|---:|---:|"]
        for name, mem in result["memory"].items():
            growth = f"{mem['growth_bytes'] / 2**20:.0f}" if "growth_bytes" in mem else "-"
            lines.append(f"| {name} | {mem['peak_bytes'] / 2**20:.0f} | {growth} |")
    mfu = result.get("mfu", {})
    if "eager" in mfu:
        lines += ["", "| MFU (GPT-2 small, bf16) | tokens/s | MFU |", "|---|---:|---:|"]
        for kind in ("eager", "compiled"):
            lines.append(f"| {kind} | {mfu[kind]['tokens_per_second']:.0f} | {100 * mfu[kind]['mfu']:.1f}% |")
    return "\n".join(lines)


def _shape_help(name: str, text: str) -> dict:
    return {"help": f"{text} (default {getattr(BenchmarkShape(), name)}; --quick {getattr(QUICK_SHAPE, name)})"}


@dataclass
class BenchmarkArguments:
    """`minitx benchmark`: the shape (default: the reference shape, or --quick) and how to measure."""

    quick: bool = field(default=False, metadata={"help": "small shape and 3 rounds: under 2 minutes on 2 cores"})
    vocab_size: int | None = field(default=None, metadata=_shape_help("vocab_size", "vocabulary size"))
    context: int | None = field(default=None, metadata=_shape_help("context", "training sequence length"))
    layers: int | None = field(default=None, metadata=_shape_help(
        "layers", "layers (seq2seq: split evenly encoder/decoder)"))
    hidden: int | None = field(default=None, metadata=_shape_help("hidden", "hidden size"))
    heads: int | None = field(default=None, metadata=_shape_help("heads", "attention heads"))
    ffn_mult: int | None = field(default=None, metadata=_shape_help("ffn_mult", "FFN width multiple"))
    batch: int | None = field(default=None, metadata=_shape_help("batch", "batch size"))
    seq2seq_len: int | None = field(default=None, metadata=_shape_help("seq2seq_len", "source/target length"))
    prompt_len: int | None = field(default=None, metadata=_shape_help("prompt_len", "generation prompt length"))
    new_tokens: int | None = field(default=None, metadata=_shape_help("new_tokens", "tokens generated per sequence"))
    rounds: int | None = field(default=None, metadata={"help": "timed rounds per workload (default 5, --quick 3)"})
    repeats: int = field(default=1, metadata={"help": "steps per implementation per round"})
    warmup: int = field(default=1, metadata={"help": "untimed steps per implementation first"})
    threads: int = field(default=1, metadata={"help": "torch intra-op threads (default 1)"})
    device: str = field(default="cpu", metadata={"help": "cpu or cuda"})
    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS), metadata={
        "help": f"which workloads to run: {', '.join(WORKLOADS)}"})
    no_memory: bool = field(default=False, metadata={"help": "skip the peak-memory subprocesses"})
    compile_backend: str = field(default="inductor", metadata={
        "help": "torch.compile backend of the compiled generation rows (static cache); 'none' leaves them out"})
    data_prep_mb: float | None = field(default=None, metadata={
        "help": "data preparation: MB of generated .txt to prepare (default 100, --quick 8)"})
    data_prep_files: str | None = field(default=None, metadata={
        "help": "data preparation: prepare these .txt files instead (comma-separated or a glob)"})
    data_prep_block_size: int = field(default=256, metadata={"help": "data preparation: tokens per packed block"})
    data_prep_rounds: int = field(default=1, metadata={"help": "data preparation: rounds of every side (median)"})
    no_data_prep: bool = field(default=False, metadata={
        "help": "skip the data-preparation section (hf_minitx vs run_clm's map + group_texts, line and paragraph rows)"})
    data_prep_only: bool = field(default=False, metadata={"help": "run the data-preparation section alone"})
    no_quality: bool = field(default=False, metadata={
        "help": "skip the quality section (bits/byte at equal wall time vs GPT-2 trained the nanoGPT way)"})
    quality_only: bool = field(default=False, metadata={"help": "run the quality section alone"})
    quality_seconds: float | None = field(default=None, metadata={
        "help": "quality: training wall time in seconds of each side on each corpus, each side alone, one after the "
                "other (default 180, --quick 30)"})
    quality_threads: int | None = field(default=None, metadata={
        "help": "quality: torch threads of each side (default: every core, as users train)"})
    quality_plot: str | None = field(default=None, metadata={
        "help": "quality: draw validation bits/byte against training seconds of both sides into this PNG"})
    quality_corpora: list[str] = field(default_factory=lambda: list(QUALITY_CORPORA), metadata={
        "help": "quality: the corpora (any minitx train --dataset)"})
    quality_ours_args: str = field(default="", metadata={
        "help": "quality: minitx train arguments that change our side's recipe, e.g. '--optimizer adamw'"})
    json: str | None = field(default=None, metadata={"help": "write every figure and the machine description here"})
    overwrite: bool = field(default=False, metadata={
        "help": "replace an existing --json file that minitx did not write (its own are replaced anyway)"})


def _expand_files(spec: str | None) -> list[str] | None:
    """A comma-separated list or glob of files, sorted; None when no spec."""
    if not spec:
        return None
    files = sorted(f for part in spec.split(",") for f in (glob.glob(part.strip()) or [part.strip()]))
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise FileNotFoundError(f"--data_prep_files: no such file(s) {missing}")
    return files


def main(argv: Sequence[str] | None = None) -> dict:
    """`minitx benchmark`: run, print the table, optionally write JSON. Returns the result dict."""
    from ...cli import parse_arguments

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # --threads sets torch's own pool
    (args,) = parse_arguments([BenchmarkArguments], argv, prog="minitx benchmark", description=(
        "Benchmark hf_minitx against GPT-2, BART and torch.nn.Transformer, side by side in one process."))
    if args.threads < 1:
        raise ValueError("--threads must be >= 1")
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown:
        raise ValueError(f"--workloads {unknown} unknown; choose among {', '.join(WORKLOADS)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA GPU; use --device cpu")
    if pick_device(args.device).type not in ("cpu", "cuda"):
        raise ValueError(f"--device {args.device}: the benchmark runs on cpu or cuda")
    if args.rounds is not None and args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    base = QUICK_SHAPE if args.quick else BenchmarkShape()
    shape = replace(base, **{f: getattr(args, f) for f in asdict(base) if getattr(args, f) is not None})
    shape.check()
    if args.json:  # before minutes of measuring, not after
        check_output_file(args.json, overwrite=args.overwrite, option="--json", is_ours=_written_by_us)
    if args.no_quality and args.quality_only:
        raise ValueError("--no_quality and --quality_only contradict each other; give one")
    if args.data_prep_only and (args.no_data_prep or args.quality_only):
        raise ValueError("--data_prep_only contradicts --no_data_prep and --quality_only; give one")
    if args.data_prep_block_size < 2 or args.data_prep_rounds < 1:
        raise ValueError("--data_prep_block_size must be >= 2 and --data_prep_rounds >= 1")
    data_prep_files = _expand_files(args.data_prep_files)
    quality = QualitySettings(seconds=args.quality_seconds or (30.0 if args.quick else 180.0),
                              corpora=tuple(args.quality_corpora), threads=args.quality_threads,
                              ours_args=args.quality_ours_args)
    if not (args.no_quality or args.data_prep_only):
        quality.check()
    rounds = args.rounds or (3 if args.quick else 5)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if args.quality_only or args.data_prep_only:
        result = {"machine": machine_description(args.threads, args.device)}
    else:
        result = run_benchmark(shape, rounds=rounds, repeats=args.repeats, warmup=args.warmup, threads=args.threads,
                               device=args.device, workloads=tuple(args.workloads), memory=not args.no_memory,
                               compile_backend=args.compile_backend, log=log)
    if not (args.no_data_prep or args.quality_only):
        result["data_preparation"] = run_data_prep(
            megabytes=args.data_prep_mb or (8 if args.quick else 100), files=data_prep_files,
            block_size=args.data_prep_block_size, rounds=args.data_prep_rounds, log=log)
    if not (args.no_quality or args.data_prep_only):
        result["quality"] = run_quality(quality, log=log)
        if args.quality_plot:
            result["quality"]["plot"] = str(plot_curves(result["quality"], Path(args.quality_plot)))
    result["command"] = "minitx benchmark " + " ".join(argv if argv is not None else sys.argv[1:])
    if "workloads" in result:
        print(format_table(result))
    if "quality" in result:
        print("\n" + format_quality(result["quality"]))
    if "data_preparation" in result:
        print("\n" + format_data_prep(result["data_preparation"]))
    if args.json:
        result["written_by"] = WRITTEN_BY
        write_file(Path(args.json), lambda tmp: tmp.write_text(json.dumps(result, indent=2)))
    return result


def _written_by_us(path: Path) -> bool:
    """Whether ``path`` is a benchmark JSON this command wrote (so it may be replaced without --overwrite)."""
    try:
        return json.loads(path.read_text()).get("written_by") == WRITTEN_BY
    except (OSError, ValueError, AttributeError):
        return False


__all__ = ["BenchmarkShape", "QUICK_SHAPE", "WORKLOADS", "build", "run_benchmark", "run_workload", "summarize",
           "interleaved", "memory_probe", "measure_memory", "measure_mfu", "format_table", "BenchmarkArguments", "main"]
