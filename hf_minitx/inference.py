"""Load a saved model folder on the best device and generate from it: the one loader every command uses.

`load_model_folder` picks the Auto class the config asks for (`AutoModelForSeq2SeqLM` for encoder-decoders,
else `AutoModelForCausalLM`); `generate` turns prompts into strings for either kind (`generate_texts` is its
batched encoder-decoder path, also used to score translations during training).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from .data.preprocessing import Seq2SeqCollator
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


@torch.no_grad()
def generate_texts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sources: Sequence[str],
    *,
    batch_size: int = 64,
    max_source_length: int | None = None,
    **generate_kwargs,
) -> list[str]:
    """Outputs of an encoder-decoder model for ``sources``, in batches; ``generate_kwargs`` (e.g.
    max_new_tokens, num_beams, do_sample) go to ``generate()``.

    Sources are encoded like the training data (ids + EOS, right padding), so train and test inputs
    look the same to the encoder.
    """
    collate = Seq2SeqCollator(tokenizer.pad_token_id)
    device = next(model.parameters()).device
    outputs: list[str] = []
    for start in range(0, len(sources), batch_size):
        chunk = sources[start : start + batch_size]
        ids = tokenizer(list(chunk), add_special_tokens=False)["input_ids"]
        if max_source_length:
            ids = [row[: max_source_length - 1] for row in ids]
        batch = collate([{"input_ids": row + [tokenizer.eos_token_id]} for row in ids])
        generated = model.generate(
            input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
            **generate_kwargs,
        )  # (batch, new tokens)
        outputs.extend(text.strip() for text in tokenizer.batch_decode(generated, skip_special_tokens=True))
    return outputs


def _continue_prompts(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], **generate_kwargs: Any
) -> list[str]:
    """New text of a decoder-only model after each prompt (left-padded batch, prompt tokens removed)."""
    device = next(model.parameters()).device
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    output = model.generate(**encoded, **generate_kwargs)  # (batch, prompt + new)
    new_tokens = output[:, encoded["input_ids"].shape[1]:]  # (batch, new)
    return tokenizer.batch_decode(new_tokens, skip_special_tokens=True)


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    seed: int | None = None,
    **generate_kwargs: Any,
) -> list[str]:
    """Continuations (decoder-only) or outputs (encoder-decoder) of ``prompts``, one string each: the one
    generation helper of the package (the CLI, the demo and training's sample generations call it).

    ``generate_kwargs`` go to ``model.generate`` (max_new_tokens, do_sample, temperature, top_k,
    top_p, num_beams); None values are dropped so the model's generation_config decides. With ``seed`` the
    sampling is reproducible and the caller's RNG state is left as it was (training calls this mid-run).
    The model is in eval mode while generating and comes back in the mode it had.
    """
    if not prompts:
        raise ValueError("give at least one prompt")
    kwargs = {k: v for k, v in generate_kwargs.items() if v is not None}
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            if model.config.is_encoder_decoder:
                return generate_texts(model, tokenizer, list(prompts), batch_size=len(prompts), **kwargs)
            return _continue_prompts(model, tokenizer, list(prompts), **kwargs)
    finally:
        model.train(was_training)


@dataclass
class GenerateArguments:
    """`minitx generate`: prompts in, one line out per prompt."""

    model: str = field(metadata={"help": "a saved model folder (the --output_dir of a training run)"})
    prompt: list[str] = field(metadata={"help": "one or more prompts (or sources to translate)"})
    max_new_tokens: int | None = field(default=None, metadata={"help": "default: generation_config.json"})
    do_sample: bool = field(default=False, metadata={
        "help": "sample (default: what the model's generation_config.json says)"})
    greedy: bool = field(default=False, metadata={"help": "greedy decoding (no sampling)"})
    temperature: float | None = field(default=None, metadata={"help": "sampling temperature"})
    top_k: int | None = field(default=None, metadata={"help": "sample among the k most likely tokens"})
    top_p: float | None = field(default=None, metadata={"help": "nucleus sampling probability mass"})
    num_beams: int | None = field(default=None, metadata={"help": "beam search width (implies no sampling)"})
    seed: int = field(default=0, metadata={"help": "seed of the sampling"})
    device: str = field(default="auto", metadata={"help": "auto (cuda -> mps -> cpu), cpu, cuda, cuda:N, mps"})
    dtype: str = field(default="auto", metadata={"help": "auto, float32, bfloat16, float16"})


def main(argv: Sequence[str] | None = None) -> list[str]:
    """`minitx generate`: print and return one output per prompt."""
    from .cli import parse_arguments

    (args,) = parse_arguments([GenerateArguments], argv, prog="minitx generate",
                              description="Generate with a saved hf_minitx model (decoder-only or encoder-decoder).")
    if args.greedy and args.do_sample:
        raise ValueError("--greedy and --do_sample contradict each other; give one of them")
    model, tokenizer = load_model_folder(args.model, device=args.device, dtype=args.dtype)
    do_sample = True if args.do_sample else False if args.greedy or (args.num_beams or 1) > 1 else None
    outputs = generate(
        model, tokenizer, args.prompt, seed=args.seed, max_new_tokens=args.max_new_tokens, do_sample=do_sample,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, num_beams=args.num_beams,
    )
    for prompt, output in zip(args.prompt, outputs, strict=True):
        print(f"{prompt} -> {output}" if model.config.is_encoder_decoder else f"{prompt}{output}")
    return outputs
