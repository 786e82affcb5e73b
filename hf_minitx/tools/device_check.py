"""Check that a saved model gives the same answers on an accelerator as on the CPU.

For each dtype, the model is loaded on the target device with `from_pretrained(..., dtype=...)`, run
on a left-padded batch of prompts, and its logits are compared with float32 logits on the CPU. Then it
generates greedily with and without the KV cache on the device, which must agree token for token in
float32 (half precision may legitimately pick a different near-tie token, so that is only reported).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..data.tokenizer import PADDING_SIDES
from ..device import pick_device
from ..model_files import model_kind

DEFAULT_PROMPTS = ("In the beginning", "one hundred and twenty three")
# Allowed max |logit difference| relative to the largest |logit| of the CPU float32 reference.
RELATIVE_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 1e-2}


@dataclass(frozen=True)
class DeviceCheck:
    """Result for one dtype on one device."""

    device: str
    dtype: str
    max_abs_diff: float
    relative_diff: float
    tolerance: float
    top1_agreement: float
    cache_matches_no_cache: bool
    new_tokens: int
    sample: str

    @property
    def passed(self) -> bool:
        """Logits within tolerance, and (in float32) cached and uncached generation identical."""
        cache_ok = self.cache_matches_no_cache or self.dtype != "float32"
        return self.relative_diff <= self.tolerance and cache_ok and self.new_tokens > 0


def _load(model_dir: Path, device: torch.device, dtype: torch.dtype):
    """Tokenizer and eval-mode model from a saved folder."""
    from ..inference import load_model_folder

    model, tokenizer = load_model_folder(model_dir, device=device, dtype=dtype)
    return tokenizer, model


@torch.no_grad()
def _logits(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Float32 CPU logits at real (non-pad) positions: (tokens, vocab) or (batch, 1, vocab) for seq2seq."""
    if model.config.is_encoder_decoder:
        start = torch.full((batch["input_ids"].shape[0], 1), model.config.decoder_start_token_id,
                           device=batch["input_ids"].device)  # (batch, 1)
        return model(**batch, decoder_input_ids=start, use_cache=False).logits.float().cpu()
    logits = model(**batch, use_cache=False).logits  # (batch, seq, vocab)
    return logits[batch["attention_mask"].bool()].float().cpu()


def compare_devices(
    model_dir: str | Path,
    device: str | torch.device = "cuda",
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16),
    prompts: tuple[str, ...] = DEFAULT_PROMPTS,
    max_new_tokens: int = 20,
) -> list[DeviceCheck]:
    """Compare `device` against CPU float32 for each dtype; returns one DeviceCheck per dtype."""
    model_dir, device = Path(model_dir), torch.device(device)
    tokenizer, cpu_model = _load(model_dir, torch.device("cpu"), torch.float32)
    side = PADDING_SIDES[model_kind(cpu_model.config)]  # a decoder-only model generates from the prompts' ends
    batch = tokenizer(list(prompts), return_tensors="pt", padding=True, padding_side=side)
    batch = {key: batch[key] for key in ("input_ids", "attention_mask")}
    from ..inference import check_fits_positions

    used = 1 if cpu_model.config.is_encoder_decoder else batch["input_ids"].shape[1]  # the decoder's start
    check_fits_positions(cpu_model, used, max_new_tokens, refuse_past_training=True)  # as `minitx generate` refuses
    reference = _logits(cpu_model, batch)
    scale = max(reference.abs().max().item(), 1.0)
    results = []
    for dtype in dtypes:
        _, model = _load(model_dir, device, dtype)
        on_device = {key: value.to(device) for key, value in batch.items()}
        logits = _logits(model, on_device)
        diff = (logits - reference).abs().max().item()
        agreement = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
        options = dict(max_new_tokens=max_new_tokens, min_new_tokens=1, do_sample=False)
        cached = model.generate(**on_device, use_cache=True, **options)
        uncached = model.generate(**on_device, use_cache=False, **options)
        prompt_len = 1 if model.config.is_encoder_decoder else on_device["input_ids"].shape[1]
        results.append(DeviceCheck(
            device=str(device), dtype=str(dtype).removeprefix("torch."), max_abs_diff=diff,
            relative_diff=diff / scale, tolerance=RELATIVE_TOLERANCE[dtype], top1_agreement=agreement,
            cache_matches_no_cache=cached.shape == uncached.shape and torch.equal(cached, uncached),
            new_tokens=cached.shape[1] - prompt_len,
            sample=tokenizer.decode(cached[0, prompt_len:], skip_special_tokens=True),
        ))
    return results


def format_report(results: list[DeviceCheck]) -> str:
    """A small text table of the checks."""
    lines = [f"{'device':<8} {'dtype':<9} {'max|dlogit|':>11} {'relative':>9} {'tol':>7} {'top1 agree':>10} "
             f"{'cache==nocache':>14}  result"]
    for r in results:
        lines.append(f"{r.device:<8} {r.dtype:<9} {r.max_abs_diff:>11.2e} {r.relative_diff:>9.2e} {r.tolerance:>7.0e} "
                     f"{r.top1_agreement:>10.1%} {str(r.cache_matches_no_cache):>14}  "
                     f"{'ok' if r.passed else 'FAIL'}  sample: {r.sample[:60]!r}")
    return "\n".join(lines)


DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class DeviceCheckArguments:
    """`minitx check-device`: which folder, which device, which dtypes."""

    model_dir: str = field(metadata={"help": "saved model folder (config, weights, tokenizer)",
                                     "aliases": ["--model"]})  # the name `generate`, `explore` and `export` use
    device: str = field(default="cuda", metadata={"help": "device to compare with the CPU (default: cuda)"})
    dtypes: list[str] = field(default_factory=lambda: ["float32", "bfloat16"], metadata={
        "help": f"dtypes to compare: {', '.join(DTYPE_NAMES)}"})
    max_new_tokens: int = field(default=20, metadata={"help": "tokens of the cached vs uncached generation check"})


def main(argv: Sequence[str] | None = None) -> int:
    """`minitx check-device`: 0 when every check passes, 1 when one fails; a device that is not there is an
    error (exit 2), so a machine without CUDA never reads as a pass."""
    from ..cli import parse_arguments

    (args,) = parse_arguments([DeviceCheckArguments], argv, prog="minitx check-device", description=(
        "Load a saved model on a GPU, compare its logits with the CPU (float32 and bfloat16), and check that "
        "cached and uncached generation agree."))
    if args.max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens must be >= 1 (the generation check needs a token), got "
                         f"{args.max_new_tokens}")
    unknown = sorted(set(args.dtypes) - set(DTYPE_NAMES))
    if unknown:
        raise ValueError(f"--dtypes {unknown} unknown; choose among {', '.join(DTYPE_NAMES)}")
    if not Path(args.model_dir, "config.json").is_file():
        raise FileNotFoundError(f"{args.model_dir} has no config.json; pass a folder written by save_pretrained")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("CUDA is not available on this machine (torch.cuda.is_available() is False), so nothing "
                         "can be checked; run this on a GPU machine, or pass --device cpu to exercise the check")
    device = pick_device(args.device)  # an unknown or unavailable device is one clear error
    if device.type == "meta":
        raise ValueError("--device meta holds no values to compare; use cuda, cuda:N, mps or cpu")
    if device.type == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(torch.device(args.device))}, torch {torch.__version__}")
    results = compare_devices(args.model_dir, device, tuple(DTYPE_NAMES[d] for d in args.dtypes),
                              max_new_tokens=args.max_new_tokens)
    print(format_report(results))
    failed = [r for r in results if not r.passed]
    print("all checks passed" if not failed else f"{len(failed)} check(s) failed")
    return 1 if failed else 0


__all__ = ["DeviceCheck", "compare_devices", "format_report", "RELATIVE_TOLERANCE", "DeviceCheckArguments", "main"]
