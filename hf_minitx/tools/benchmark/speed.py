"""The speed workloads of `minitx benchmark`: every implementation of a workload built at one shared shape and
timed round-robin in one process, rotating the order every round so drift in machine load hits every
implementation alike. Figures are medians over rounds; ratios are paired (implementation / reference within the
same round), then the median is taken.

- `train_causal`: decoder-only training step (forward + backward + AdamW), hf_minitx (sdpa, eager) vs
  transformers' `GPT2LMHeadModel` (sdpa) at the same dimensions and parameter count.
- `train_seq2seq`: encoder-decoder training step, hf_minitx vs `BartForConditionalGeneration` and
  `torch.nn.Transformer` (with embeddings and a tied output layer).
- `generate_b1` / `generate_b8`: greedy generation with a KV cache (EOS cannot stop it early), hf_minitx vs
  GPT-2 `generate()`, eager (dynamic cache) and compiled (static cache + torch.compile, compile time reported
  apart); at batch 1 also both without a cache (each model's cache speed-up), and hf_minitx in bf16 and int8.
  See `generation`.
- `generate_seq2seq`: greedy generation (one beam) at batch 1 from a `seq2seq_len` source, hf_minitx vs BART.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from .generation import COMPILED_SUFFIX, generation_step, int8_available
from .models import BenchmarkShape, build, count_parameters, random_ids

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
            result[f"{low}_vs_fp32"] = statistics.median(
                x / f for x, f in zip(rates[low], rates["minitx"], strict=True))
    if "minitx-int8-compiled" in rates and "minitx-compiled" in rates:  # both compiled
        result["minitx-int8-compiled_vs_fp32_compiled"] = statistics.median(
            x / f for x, f in zip(rates["minitx-int8-compiled"], rates["minitx-compiled"], strict=True))
    if workload == "generate_b1":
        cached, uncached = rates["minitx"], rates["minitx-no-cache"]
        result["minitx_cache_speedup"] = statistics.median(c / u for c, u in zip(cached, uncached, strict=True))
        cached, uncached = rates["gpt2"], rates["gpt2-no-cache"]
        result["gpt2_cache_speedup"] = statistics.median(c / u for c, u in zip(cached, uncached, strict=True))
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


__all__ = ["LOW_PRECISION_ROWS", "WORKLOADS", "format_table", "interleaved", "run_workload", "summarize",
           "training_step"]
