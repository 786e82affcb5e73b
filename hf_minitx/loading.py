"""Load a saved model folder with the Auto class its config asks for (causal LM or seq2seq)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from .device import pick_device, pick_dtype

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def load_model_folder(
    model_dir: str | Path,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    attn_implementation: str | None = None,
    need_tokenizer: bool = True,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """Eval-mode model and tokenizer (None when the folder has none and `need_tokenizer` is False).

    `AutoModelForSeq2SeqLM` for encoder-decoder configs, else `AutoModelForCausalLM`. `device`/`dtype`
    default to the best the machine supports (see `hf_minitx.device`).
    """
    import hf_minitx  # noqa: F401  (registers model_type "minitx" with the Auto classes)

    folder = Path(model_dir)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a model folder (no config.json); pass the --output_dir of a training run")
    has_tokenizer = any((folder / name).is_file() for name in TOKENIZER_FILES)
    if need_tokenizer and not has_tokenizer:
        raise FileNotFoundError(f"{folder} holds no tokenizer (tokenizer.json); save the tokenizer next to the model")
    chosen_device = device if isinstance(device, torch.device) else pick_device(device)
    chosen_dtype = dtype if isinstance(dtype, torch.dtype) else pick_dtype(chosen_device, dtype)
    config = AutoConfig.from_pretrained(folder)
    auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = auto.from_pretrained(folder, dtype=chosen_dtype, **extra).to(chosen_device).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder) if has_tokenizer else None
    return model, tokenizer
