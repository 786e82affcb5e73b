"""`minitx benchmark`: hf_minitx side by side with the implementations users would otherwise pick, every figure
printed as Markdown tables and optionally written as JSON with the machine it was measured on.

Sections, each in a module of its own:
- speed (`speed`): training steps and `generate()` of hf_minitx, GPT-2, BART and `torch.nn.Transformer` at one
  shared shape, timed round-robin in one process, paired ratios to a reference.
- `memory`: peak memory of a few training steps, each implementation in a fresh subprocess.
- `mfu` (CUDA only): model FLOPs utilisation at a GPT-2-small shape in bf16, eager and `torch.compile`d.
- data preparation (`data_prep`): raw .txt to packed blocks, hf_minitx vs run_clm's map + group_texts on
  line rows and on paragraph rows.
- `quality`: validation bits per byte at equal wall time, `minitx train --max_minutes T` vs
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
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ...cli import EXIT_INTERRUPTED, Interrupted, check_at_least
from ...device import check_thread_count, pick_device
from ...folders import WRITTEN_BY, check_output_file, write_file
from .data_prep import format_data_prep, run_data_prep
from .memory import measure_memory
from .mfu import measure_mfu
from .models import QUICK_SHAPE, BenchmarkShape
from .quality import run_quality
from .quality_report import format_quality, plot_curves
from .quality_settings import MIN_CORPUS_CHARS, QUALITY_CORPORA, QualitySettings, check_work_dir
from .speed import WORKLOADS, format_table, run_workload


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
        "cpu": cpu, "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
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


def _shape_help(name: str, text: str) -> dict:
    return {"help": f"{text} (default {getattr(BenchmarkShape(), name)}; --quick {getattr(QUICK_SHAPE, name)})"}


@dataclass
class BenchmarkArguments:
    """`minitx benchmark`: the shape (default: the reference shape, or --quick) and how to measure."""

    quick: bool = field(default=False, metadata={
        "help": "small shape, 3 rounds, 8 MB of data preparation and 30 s of training per quality side (with "
                "--no_quality: under 2 minutes on 2 cores)"})
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
        "help": "skip the data-preparation section (hf_minitx vs run_clm's map + group_texts, line and paragraph "
                "rows)"})
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
        "help": "quality: the corpora, each builtin:kjv, builtin:pydocs or one UTF-8 .txt file of at least "
                f"{MIN_CORPUS_CHARS:,} characters (the comparison cuts its own 90/10 split)"})
    quality_work_dir: str | None = field(default=None, metadata={
        "help": "quality: keep each side's figures here as it finishes, so that the same command after an "
                "interruption measures only the rest (default: a temporary folder, deleted)"})
    quality_shared_shape: bool = field(default=False, metadata={
        "help": "quality: train our side at the reference's width and depth (4 x 128) rather than the shape its "
                "budget plans, as users get it"})
    quality_ours_args: str = field(default="", metadata={
        "help": "quality: minitx train arguments that change our side's recipe, e.g. '--optimizer adamw'"})
    json: str | None = field(default=None, metadata={"help": "write every figure and the machine description here"})
    overwrite: bool = field(default=False, metadata={
        "help": "replace an existing --json or --quality_plot file that minitx did not write (its own are "
                "replaced anyway)"})


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
    check_thread_count(args.threads, "--threads")
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown:
        raise ValueError(f"--workloads {unknown} unknown; choose among {', '.join(WORKLOADS)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA GPU; use --device cpu")
    if pick_device(args.device).type not in ("cpu", "cuda"):
        raise ValueError(f"--device {args.device}: the benchmark runs on cpu or cuda")
    check_at_least({"rounds": args.rounds}, 1)
    base = QUICK_SHAPE if args.quick else BenchmarkShape()
    shape = replace(base, **{f: getattr(args, f) for f in asdict(base) if getattr(args, f) is not None})
    shape.check()
    if args.json:  # before minutes of measuring, not after
        check_output_file(args.json, overwrite=args.overwrite, option="--json", is_ours=_written_by_us)
    if args.no_quality and args.quality_only:
        raise ValueError("--no_quality and --quality_only contradict each other; give one")
    if args.data_prep_only and (args.no_data_prep or args.quality_only):
        raise ValueError("--data_prep_only contradicts --no_data_prep and --quality_only; give one")
    check_at_least({"data_prep_block_size": args.data_prep_block_size}, 2)
    check_at_least({"data_prep_rounds": args.data_prep_rounds}, 1)
    if args.data_prep_mb is not None and not 0 < args.data_prep_mb < math.inf:  # NaN fails the comparison too
        raise ValueError(f"--data_prep_mb must be a number of megabytes > 0, got {args.data_prep_mb}")
    data_prep_files = _expand_files(args.data_prep_files)
    seconds = args.quality_seconds if args.quality_seconds is not None else 30.0 if args.quick else 180.0
    quality = QualitySettings(seconds=seconds,
                              corpora=tuple(args.quality_corpora), threads=args.quality_threads,
                              ours_args=args.quality_ours_args, shared_shape=args.quality_shared_shape)
    if not (args.no_quality or args.data_prep_only):
        quality.check()
        if args.quality_plot:
            from ...training.curves import check_png_path, written_by_us

            check_png_path(args.quality_plot, option="--quality_plot")
            plot = check_output_file(args.quality_plot, overwrite=args.overwrite, option="--quality_plot",
                                     is_ours=written_by_us)
            if args.json and plot.resolve() == Path(args.json).expanduser().resolve():
                raise ValueError(f"--json and --quality_plot both name {args.json}; give each its own file")
        if args.quality_work_dir:
            check_work_dir(Path(args.quality_work_dir).expanduser(), quality)
    rounds = args.rounds or (3 if args.quick else 5)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if args.quality_only or args.data_prep_only:
        threads = quality.num_threads if args.quality_only else args.threads
        result = {"machine": machine_description(threads, args.device)}
    else:
        result = run_benchmark(shape, rounds=rounds, repeats=args.repeats, warmup=args.warmup, threads=args.threads,
                               device=args.device, workloads=tuple(args.workloads), memory=not args.no_memory,
                               compile_backend=args.compile_backend, log=log)
    if not (args.no_data_prep or args.quality_only):
        result["data_preparation"] = run_data_prep(
            megabytes=args.data_prep_mb or (8 if args.quick else 100), files=data_prep_files,
            block_size=args.data_prep_block_size, rounds=args.data_prep_rounds, log=log)
    if not (args.no_quality or args.data_prep_only):
        result["quality"] = measure_quality(quality, args.quality_work_dir, log)
    result["command"] = "minitx benchmark " + " ".join(argv if argv is not None else sys.argv[1:])
    if "workloads" in result:
        print(format_table(result))
    if "quality" in result:
        print("\n" + format_quality(result["quality"]))
    if "data_preparation" in result:
        print("\n" + format_data_prep(result["data_preparation"]))
    if args.quality_plot and "quality" in result:
        result["quality"]["plot"] = str(plot_curves(result["quality"], Path(args.quality_plot)))
    if args.json:
        result["written_by"] = WRITTEN_BY
        write_file(Path(args.json), lambda tmp: tmp.write_text(json.dumps(result, indent=2)))
    return result


def measure_quality(settings: QualitySettings, work_dir: str | None, log: Callable[[str], None]) -> dict:
    """The quality section; an interruption says what it kept (a --quality_work_dir's finished sides) or lost."""
    work = Path(work_dir).expanduser() if work_dir else None
    try:
        return run_quality(settings, log=log, work=work)
    except KeyboardInterrupt:
        kept = (f"the sides measured so far are kept in {work}: the same command measures only the rest" if work
                else "the sides measured so far are lost: give --quality_work_dir DIR to keep them across an "
                     "interruption")
        raise Interrupted(f"interrupted: {kept}", EXIT_INTERRUPTED) from None


def _written_by_us(path: Path) -> bool:
    """Whether ``path`` is a benchmark JSON this command wrote (so it may be replaced without --overwrite)."""
    try:
        return json.loads(path.read_text()).get("written_by") == WRITTEN_BY
    except (OSError, ValueError, AttributeError):
        return False


__all__ = ["BenchmarkArguments", "machine_description", "main", "run_benchmark"]
