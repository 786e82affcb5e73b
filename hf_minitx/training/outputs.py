"""What a training run writes: metrics.jsonl records, and the final Hub-ready model folder
(weights, config, generation config, tokenizer, summary). Nothing here draws or renders: the loss curve
and the model card are made from these files by the training loop's last step."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..folders import write_file

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "training_summary.json"
LOSS_CURVE_FILE = "loss_curve.png"


def _clean(value: Any) -> Any:
    """JSON-safe numbers: NaN/inf become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def append_metrics(output_dir: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON record (one line) to output_dir/metrics.jsonl."""
    with open(Path(output_dir) / METRICS_FILE, "a") as handle:
        handle.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")


def truncate_metrics(output_dir: str | Path, step: int) -> None:
    """Drop records after ``step`` (a resumed run rewrites them), and a last line cut short by a kill."""
    path = Path(output_dir) / METRICS_FILE
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines() if (record := _parse(line)) and record["step"] <= step]
    write_file(path, lambda tmp: tmp.write_text("".join(line + "\n" for line in kept)))


def _parse(line: str) -> dict[str, Any] | None:
    try:
        return json.loads(line)
    except ValueError:
        return None


def set_generation_defaults(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, max_new_tokens: int
) -> None:
    """Generation config with the tokenizer's special ids (the config's without one) and a fitting length.

    Decoder-only models sample (top-k 40, temperature 0.8) by default, as greedy decoding of a small
    language model loops; encoder-decoder models decode greedily.
    """
    generation, ids = model.generation_config, tokenizer if tokenizer is not None else model.config
    generation.bos_token_id = ids.bos_token_id
    generation.eos_token_id = ids.eos_token_id
    generation.pad_token_id = ids.pad_token_id
    generation.max_new_tokens = max_new_tokens
    generation.max_length = None
    if model.config.is_encoder_decoder:
        generation.decoder_start_token_id = model.config.decoder_start_token_id
    else:
        generation.do_sample, generation.top_k, generation.temperature = True, 40, 0.8


def save_final_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    output_dir: str | Path,
    summary: dict[str, Any],
    *,
    max_new_tokens: int,
) -> Path:
    """Write the Hub-ready folder from the unwrapped (uncompiled) model; returns the folder.

    Weights, config, generation config, the tokenizer (toy experiments have none) and the summary; the
    loss curve and the model card are drawn and rendered by the caller, from what is written here.
    """
    output_dir = Path(output_dir)
    set_generation_defaults(model, tokenizer, max_new_tokens)
    model.save_pretrained(output_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    summary = {**summary, "final_metrics": {k: _clean(v) for k, v in summary["final_metrics"].items()}}
    (output_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return output_dir
