"""What a training run writes: metrics.jsonl records, and the final Hub-ready model folder
(weights, config, generation config, tokenizer, summary, loss curve, model card)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "training_summary.json"
LOSS_CURVE_FILE = "loss_curve.png"

logger = logging.getLogger(__name__)


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
    """Drop records after ``step`` (a resumed run rewrites them)."""
    path = Path(output_dir) / METRICS_FILE
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept))


def set_generation_defaults(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, max_new_tokens: int) -> None:
    """Generation config with the tokenizer's special ids and a length that fits the task.

    Decoder-only models sample (top-k 40, temperature 0.8) by default, as greedy decoding of a small
    language model loops; encoder-decoder models decode greedily.
    """
    generation = model.generation_config
    generation.bos_token_id = tokenizer.bos_token_id
    generation.eos_token_id = tokenizer.eos_token_id
    generation.pad_token_id = tokenizer.pad_token_id
    generation.max_new_tokens = max_new_tokens
    generation.max_length = None
    if model.config.is_encoder_decoder:
        generation.decoder_start_token_id = model.config.decoder_start_token_id
    else:
        generation.do_sample, generation.top_k, generation.temperature = True, 40, 0.8


def plot_loss_curve(output_dir: Path) -> Path | None:
    """loss_curve.png from metrics.jsonl, drawn by hf_minitx.tools.visualize (None if it cannot be drawn)."""
    try:
        from ..tools.visualize import plot_training
    except ImportError as err:  # matplotlib missing
        logger.warning("no loss curve: %s", err)
        return None
    out = output_dir / LOSS_CURVE_FILE
    plot_training(output_dir, out, title=f"Training curves: {output_dir.name}")
    return out


def write_card(output_dir: Path) -> Path | None:
    """README.md model card rendered by hf_minitx.hub.push (skipped with a warning when unavailable)."""
    try:
        from ..hub.push import write_model_card
    except ImportError as err:
        logger.warning("no model card written (%s)", err)
        return None
    try:
        return write_model_card(output_dir)
    except Exception as err:  # the model is saved; a card problem must not lose the run
        logger.warning("the model card could not be rendered: %s", err)
        return None


def save_final_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: str | Path,
    summary: dict[str, Any],
    *,
    max_new_tokens: int,
    push_to: str | None = None,
) -> Path:
    """Write the Hub-ready folder from the unwrapped (uncompiled) model; returns the folder."""
    output_dir = Path(output_dir)
    set_generation_defaults(model, tokenizer, max_new_tokens)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    summary = {**summary, "final_metrics": {k: _clean(v) for k, v in summary["final_metrics"].items()}}
    (output_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    plot_loss_curve(output_dir)
    write_card(output_dir)
    if push_to:
        from ..hub.push import push_to_hub

        push_to_hub(output_dir, push_to)
    return output_dir
