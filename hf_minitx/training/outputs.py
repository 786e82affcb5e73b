"""What a training run writes: metrics.jsonl records (written by `append_metrics`, read back by
`read_metrics`), and the final Hub-ready model folder (weights, config, generation config, tokenizer,
summary). Nothing here draws or renders: the loss curve (`hf_minitx.training.curves`) and the model card are
made from these files by the training loop's last step."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..folders import SUMMARY_FILE, honour_umask, write_file

METRICS_FILE = "metrics.jsonl"
CALIBRATED = "temperature"  # the key of the eval record of a model with its fitted temperature
LOSS_CURVE_FILE = "loss_curve.png"


def tokens_per_second(tokens: int, seconds: float) -> float:
    """The training rate the summary, the card and the benchmark report (a run of no measurable time: no division
    by zero)."""
    return round(tokens / max(seconds, 1e-9), 1)


def _clean(value: Any) -> Any:
    """JSON-safe numbers: NaN/inf become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def append_metrics(output_dir: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON record (one line) to output_dir/metrics.jsonl."""
    with open(Path(output_dir) / METRICS_FILE, "a") as handle:
        handle.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")


def read_metrics(run_dir: str | Path) -> dict[str, np.ndarray]:
    """Read metrics.jsonl (a run folder or the file itself) into arrays.

    Returns "train_step", "train_loss", "learning_rate", "tokens_per_second", "eval_step", "eval_loss",
    and "eval_<metric>" arrays for every other numeric field of the eval records (NaN where missing). The record of
    the model with its fitted temperature (`CALIBRATED`, after the last step) is left out: it scores other logits
    than training made, and the summary and the card report it.
    """
    path = Path(run_dir)
    path = path / METRICS_FILE if path.is_dir() else path
    if not Path(run_dir).exists():
        raise FileNotFoundError(f"{run_dir} does not exist; pass a training output folder (it holds metrics.jsonl).")
    if not path.is_file():
        raise FileNotFoundError(f"No metrics file at {path}; pass a training output folder that holds metrics.jsonl.")
    train, evals = [], []
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}:{number} is not UTF-8 (byte {raw[err.start]:#04x} at column {err.start + 1}); "
                             "metrics.jsonl is written by minitx train: restore it, or delete that line") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number} is not valid JSON ({err.msg}); each line must be one JSON "
                             "object.") from err
        if record.get("type") == "train":
            train.append(record)
        elif record.get("type") == "eval" and CALIBRATED not in record:
            evals.append(record)
    if not train:
        raise ValueError(f"{path} has no train records ({{'type': 'train', ...}}); did the run log any step?")

    def column(records: list[dict], key: str) -> np.ndarray:
        return np.array([float(r[key]) if r.get(key) is not None else np.nan for r in records], dtype=float)

    data = {
        "train_step": column(train, "step"),
        "train_loss": column(train, "loss"),
        "learning_rate": column(train, "learning_rate"),
        "tokens_per_second": column(train, "tokens_per_second"),
        "eval_step": column(evals, "step"),
        "eval_loss": column(evals, "eval_loss"),
    }
    extra = sorted({k for r in evals for k, v in r.items() if k.startswith("eval_") and isinstance(v, (int, float))})
    for key in extra:
        data.setdefault(key, column(evals, key))
    return data


def truncate_metrics(output_dir: str | Path, step: int) -> None:
    """Drop records after ``step`` (a resumed run rewrites them), a calibrated model's evaluation (made after the
    last step, so after every checkpoint: a resume fits its temperature again), and a last line cut short by a kill."""
    path = Path(output_dir) / METRICS_FILE
    if not path.is_file():
        return
    kept = [line for line in path.read_text(errors="replace").splitlines()
            if (record := _parse(line)) and record["step"] <= step and CALIBRATED not in record]
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


def unsharded_twin(model: PreTrainedModel, state_dict: dict[str, torch.Tensor]) -> PreTrainedModel:
    """A plain model of ``model``'s own class holding ``state_dict`` (a sharded model's gathered weights).

    FSDP turns a model into an instance of a subclass of its own (``FSDPMiniTxForCausalLM``, defined in torch);
    save_pretrained would copy that class's torch files as the folder's custom code and name it in ``auto_map``.
    """
    from torch.distributed.fsdp import FSDPModule

    own_class = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))
    with torch.device("meta"):
        twin = own_class(model.config)
    twin.load_state_dict(state_dict, strict=False, assign=True)  # the tied head may be left out
    twin.tie_weights()
    twin.generation_config = model.generation_config
    missing = [name for name, tensor in twin.state_dict().items() if tensor.is_meta]
    if missing:
        raise ValueError(f"the gathered weights lack {', '.join(missing[:3])}")
    return twin


def save_final_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    output_dir: str | Path,
    summary: dict[str, Any],
    *,
    max_new_tokens: int,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write the Hub-ready folder from the unwrapped (uncompiled) model; returns the folder.

    Weights, config, generation config, the tokenizer (toy experiments have none) and the summary; the
    loss curve and the model card are drawn and rendered by the caller, from what is written here.
    ``state_dict``: the weights to write where the model holds only its shard of them (FSDP), else None.
    """
    output_dir = Path(output_dir)
    if state_dict is not None:
        model = unsharded_twin(model, state_dict)
    set_generation_defaults(model, tokenizer, max_new_tokens)
    model.save_pretrained(output_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    summary = {**summary, "final_metrics": {k: _clean(v) for k, v in summary["final_metrics"].items()}}
    (output_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    honour_umask(output_dir)
    return output_dir
