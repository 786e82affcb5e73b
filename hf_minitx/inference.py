"""Load a saved model folder with the Auto classes and generate text, for both model kinds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .evaluation import generate_texts
from .loading import load_model_folder


def load_for_generation(
    model_dir: str | Path, *, device: str | None = None, dtype: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model (in eval mode, on the chosen device and dtype) and tokenizer from a saved folder.

    The model class follows the config: ``AutoModelForSeq2SeqLM`` for encoder-decoders, else
    ``AutoModelForCausalLM``. ``device``/``dtype`` default to the best the machine supports.
    """
    return load_model_folder(model_dir, device=device, dtype=dtype)


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    seed: int | None = None,
    **generate_kwargs: Any,
) -> list[str]:
    """Continuations (decoder-only) or outputs (encoder-decoder) of ``prompts``, one string each.

    ``generate_kwargs`` go to ``model.generate`` (max_new_tokens, do_sample, temperature, top_k,
    top_p, num_beams); None values are dropped so the model's generation_config decides.
    """
    if not prompts:
        raise ValueError("give at least one prompt")
    kwargs = {k: v for k, v in generate_kwargs.items() if v is not None}
    if seed is not None:
        torch.manual_seed(seed)
    if model.config.is_encoder_decoder:
        return generate_texts(model, tokenizer, prompts, batch_size=len(prompts), **kwargs)
    device = next(model.parameters()).device
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    output = model.generate(**encoded, **kwargs)  # (batch, prompt + new)
    new_tokens = output[:, encoded["input_ids"].shape[1]:]  # (batch, new)
    return tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
