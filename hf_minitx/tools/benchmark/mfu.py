"""Model FLOPs utilisation (CUDA only): hf_minitx training at the GPT-2-small shape in bf16, eager and
`torch.compile`d, against the GPU's dense bf16 peak.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from .models import BenchmarkShape, build, count_parameters

# Dense bf16 tensor-core peak (FLOP/s) by GPU name fragment, for MFU.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12, "L4": 121e12}


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



__all__ = ["PEAK_BF16_FLOPS", "measure_mfu", "training_flops_per_token"]
