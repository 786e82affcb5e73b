"""Generation steps of `minitx benchmark`: eager and compiled `generate()`, decoder-only and seq2seq.

Every step is one greedy `generate()` call of exactly `shape.new_tokens` new tokens per sequence (EOS cannot stop
it early), through transformers' own generation loop, as a user would call it:

- eager: the dynamic cache (`DynamicCache`, or `EncoderDecoderCache` for seq2seq), the default of `generate()`;
- compiled: `cache_implementation="static"` with a `CompileConfig`, which makes `generate()` run each decode step
  through `torch.compile` (the prompt's step stays eager). transformers compiles on its own only on GPUs; on a CPU
  the config's `_compile_all_devices` flag asks for it. The compile time is measured once, while the step is built,
  and reported apart from the tokens/s.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from .models import BenchmarkShape, build, random_ids

COMPILED_SUFFIX = "-compiled"
SEQ2SEQ_NAMES = ("bart", "minitx-seq2seq")
# Low-precision rows of hf_minitx: "-bf16" bf16 weights and activations; "-int8" every linear map's weight int8
# weight-only through torchao's `quantize_(model, Int8WeightOnlyConfig())`, the head included (`pip install
# 'hf_minitx[int8]'`; its rows are left out without it), which the decode layout reads as int8.
LOW_PRECISION_SUFFIXES = ("-bf16", "-int8")


def int8_available() -> bool:
    """Whether torchao (int8 weight-only) can be imported."""
    import importlib.util

    return importlib.util.find_spec("torchao") is not None


def lower_precision(model: nn.Module, name: str) -> nn.Module:
    """``model`` in the precision ``name``'s suffix asks for (unchanged without one)."""
    if name.endswith("-bf16"):
        return model.to(torch.bfloat16)
    if name.endswith("-int8"):
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        quantize_(model, Int8WeightOnlyConfig())
    return model


def compile_config(backend: str = "inductor"):
    """The CompileConfig of the compiled rows: one static graph per decode step, also on a CPU."""
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=True, dynamic=False, backend=backend, mode=None if backend != "inductor" else
                           "default")
    config._compile_all_devices = True  # transformers compiles only on accelerators unless asked
    return config


def generation_inputs(name: str, shape: BenchmarkShape, batch: int, device: str) -> dict[str, torch.Tensor]:
    """The prompt (decoder-only) or source (seq2seq) of a generation step: (batch, length) ids and mask."""
    gen = torch.Generator().manual_seed(2)
    length = shape.seq2seq_len if name.removesuffix(COMPILED_SUFFIX) in SEQ2SEQ_NAMES else shape.prompt_len
    ids = random_ids(batch, length, shape.vocab_size, gen, device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def generation_step(name: str, shape: BenchmarkShape, batch: int, device: str = "cpu",
                    backend: str = "inductor") -> tuple[Callable[[], int], float | None]:
    """Return (step, compile seconds): step() runs one greedy generate() and returns the tokens made.

    `name` is a benchmark implementation ("gpt2", "minitx", "bart", "minitx-seq2seq", "*-no-cache", "minitx-bf16",
    "minitx-int8"), or one of them with "-compiled": static cache + torch.compile with `backend`. For a compiled
    step the first call (compilation included) runs here; the compile time is that call minus a steady call.
    """
    base = name.removesuffix(COMPILED_SUFFIX)
    precise = next((base.removesuffix(s) for s in LOW_PRECISION_SUFFIXES if base.endswith(s)), base)
    model: nn.Module = lower_precision(build(precise, shape).to(device).eval(), base)
    inputs = generation_inputs(name, shape, batch, device)
    extra: dict = {"use_cache": not base.endswith("no-cache")}
    if name.endswith(COMPILED_SUFFIX):
        extra.update(cache_implementation="static", compile_config=compile_config(backend))
    start_tokens = 1 if base in SEQ2SEQ_NAMES else inputs["input_ids"].shape[1]  # decoder start, or the prompt

    def step() -> int:
        out = model.generate(**inputs, max_new_tokens=shape.new_tokens, min_new_tokens=shape.new_tokens,
                             do_sample=False, num_beams=1, pad_token_id=0, eos_token_id=2, **extra)
        made = out.shape[1] - start_tokens
        if made != shape.new_tokens:
            raise RuntimeError(f"{name}: generated {made} tokens, expected {shape.new_tokens}.")
        return batch * made

    if not name.endswith(COMPILED_SUFFIX):
        return step, None
    first = _timed(step)
    steady = _timed(step)
    return step, max(first - steady, 0.0)


def _timed(step: Callable[[], int]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


__all__ = ["COMPILED_SUFFIX", "LOW_PRECISION_SUFFIXES", "SEQ2SEQ_NAMES", "compile_config", "generation_inputs",
           "generation_step", "int8_available", "lower_precision"]
