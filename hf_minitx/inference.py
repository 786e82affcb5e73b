"""Load a saved model folder on the best device and generate from it: the one loader every command uses.

`load_model_folder` picks the Auto class the config asks for (`AutoModelForSeq2SeqLM` for encoder-decoders,
else `AutoModelForCausalLM`); `generate` turns prompts into strings for either kind (`generate_texts` is its
batched encoder-decoder path, also used to score translations during training).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from .data.tokenizer import checked_texts, load_tokenizer
from .device import pick_device, pick_dtype, random_state_kept
from .folders import read_marker
from .model_files import WEIGHTS_FILE, read_folder_config, read_safetensors_header
from .models.positions_minitx import room_for_new_tokens

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# The one wording of a model whose outputs overflow (finite weights, NaN or inf logits): generate and explore use it.
NON_FINITE_OUTPUTS = "the model's outputs{on} hold NaN or inf values{so}; check the model's weights (an earlier " \
                     "checkpoint may be sound)"
logger = hf_logging.get_logger(__name__)


def check_generation_config(folder: Path) -> None:
    """A generation_config.json that does not parse is refused (transformers would silently fall back to
    defaults, and sampling settings would change without a word)."""
    path = folder / "generation_config.json"
    if not path.is_file():
        return
    try:
        GenerationConfig.from_pretrained(folder)
    except Exception as error:  # JSON errors and invalid settings alike
        raise ValueError(f"{path} is damaged ({type(error).__name__}: {str(error).splitlines()[0][:200]}); fix it, "
                         "or delete it to use the default generation settings") from None


def check_loading_info(folder: Path, info: dict) -> None:
    """Refuse weights that do not match the config: missing, unexpected or mismatched tensors."""
    problems = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = sorted(str(key[0] if isinstance(key, tuple) else key) for key in info.get(kind) or ())
        if keys:
            shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
            problems.append(f"{len(keys)} {kind.replace('_keys', '')} ({shown})")
    if problems or info.get("error_msgs"):
        detail = "; ".join(problems) or "; ".join(map(str, info["error_msgs"]))
        raise ValueError(f"{folder / WEIGHTS_FILE} does not match {folder / 'config.json'}: {detail}. The folder was "
                         "edited or mixed from two runs; save the model again, or restore the config it was saved with")


def non_finite_weights(model: torch.nn.Module) -> tuple[int, str | None, int]:
    """(NaN and inf values in all of ``model``'s parameters, the first tensor holding one, its count). A sharded
    (FSDP2) parameter counts this process's shard; a quantized one (torchao's) its dequantized values."""
    total, first, first_bad = 0, None, 0
    for name, param in model.named_parameters():
        values = param.detach()
        if hasattr(values, "to_local"):  # a sharded (FSDP2) parameter
            values = values.to_local()
        if type(values) is not torch.Tensor and hasattr(values, "dequantize"):  # a quantized weight (torchao's)
            values = values.dequantize()
        bad = int((~torch.isfinite(values)).sum())
        if bad and first is None:
            first, first_bad = name, bad
        total += bad
    return total, first, first_bad


def check_finite_weights(model: torch.nn.Module, source: Path) -> None:
    """Refuse a model with a NaN or infinite weight (a run that diverged), naming the first such tensor:
    its logits would be NaN, and every page or sample drawn from them meaningless."""
    _, name, bad = non_finite_weights(model)
    if name is not None:
        raise ValueError(f"{source} holds {bad} non-finite value(s) (NaN or inf) in {name}: the training that "
                         "saved it diverged. Use an earlier checkpoint, or train again with a lower "
                         "--learning_rate")


@contextmanager
def quiet_load_report() -> Iterator[None]:
    """Silence transformers' load report (a logged warning) and its progress bar for the duration of a load."""
    previous, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)
        if bars:
            hf_logging.enable_progress_bar()


def _no_tokenizer_advice(folder: Path) -> str:
    """What to do with a model folder that has no tokenizer: a `minitx experiment` model reads token ids."""
    if (read_marker(folder) or {}).get("command") == "experiment":
        return ("it was made by `minitx experiment`, whose models read token ids: `minitx explore` and `minitx "
                "visualize` take them as text (\"5 9 7\"), and in Python `model.generate(torch.tensor([[5, 9, 7]]))`")
    return "save the tokenizer next to the model (`tokenizer.save_pretrained(folder)`)"


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
    default to the best the machine supports (see `hf_minitx.device`). A folder whose weights do not
    match its config, or whose files are corrupt, is refused with a ValueError naming the file: nothing is
    ever initialised at random behind the user's back.
    """
    folder = Path(model_dir)
    config = read_folder_config(folder)
    if not (folder / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{folder} has no {WEIGHTS_FILE}; "
                                "pass a folder written by minitx train or save_pretrained")
    read_safetensors_header(folder / WEIGHTS_FILE)  # a truncated or corrupt file is named here
    has_tokenizer = any((folder / name).is_file() for name in TOKENIZER_FILES)
    if need_tokenizer and not has_tokenizer:
        raise FileNotFoundError(f"{folder} holds no tokenizer (tokenizer.json); {_no_tokenizer_advice(folder)}")
    chosen_device = device if isinstance(device, torch.device) else pick_device(device)
    chosen_dtype = dtype if isinstance(dtype, torch.dtype) else pick_dtype(chosen_device, dtype)
    auto = AutoModelForSeq2SeqLM if config.get("is_encoder_decoder") else AutoModelForCausalLM
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    with quiet_load_report():  # a mismatch is our error below, not a report followed by a random model
        model, info = auto.from_pretrained(folder, dtype=chosen_dtype, output_loading_info=True,
                                           ignore_mismatched_sizes=True, **extra)
    check_loading_info(folder, info)
    check_finite_weights(model, folder / WEIGHTS_FILE)
    check_generation_config(folder)
    tokenizer = load_tokenizer(folder) if has_tokenizer else None
    return model.to(chosen_device).eval(), tokenizer


class FiniteScoresCheck(LogitsProcessor):
    """Refuse a decoding step whose scores hold NaN or +inf, or give no token a finite score (weights that are
    finite but overflow): sampling would fail in torch, and greedy or beam search would pick garbage. It runs last,
    after the warpers, so the -inf of top-k or top-p filtering is fine as long as one token stays finite."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if not bool(torch.isfinite(scores.amax(dim=-1)).all()):  # amax is NaN for a row with a NaN
            raise ValueError(NON_FINITE_OUTPUTS.format(on="", so=", so no next token can be chosen"))
        return scores


def check_generation_arguments(kwargs: dict[str, Any]) -> None:
    """Refuse sampling and search settings that generate() would reject late, or not at all."""
    top_p, top_k = kwargs.get("top_p"), kwargs.get("top_k")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (a probability mass), got {top_p}; e.g. --top_p 0.9")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 turns it off), got {top_k}")
    temperature = kwargs.get("temperature")
    if temperature is not None and not 0 < temperature < math.inf:  # NaN too: transformers would say it in its words
        raise ValueError(f"temperature must be > 0 and finite, got {temperature}; use --greedy for deterministic "
                         "output")
    if kwargs.get("num_beams") is not None and kwargs["num_beams"] < 1:
        raise ValueError(f"num_beams must be >= 1 (1 is greedy or sampling), got {kwargs['num_beams']}")
    if kwargs.get("max_new_tokens") is not None and kwargs["max_new_tokens"] < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {kwargs['max_new_tokens']}")


def check_fits_positions(model: PreTrainedModel, used: int, max_new_tokens: int | None, *,
                         refuse_past_training: bool = False) -> None:
    """Refuse a generation that would run past the model's positions; say how many new tokens fit.

    `used` is the positions the decoder starts with: the (padded) prompt for a decoder-only model, the
    start token for an encoder-decoder. Rotary positions have no table: running past the trained context
    (``max_position_embeddings``) is warned about up front, as transformers warns once it happens, or refused
    with ``refuse_past_training`` (the CLI).
    """
    new = max_new_tokens or model.generation_config.max_new_tokens or 0
    config, limit = model.config, model.config.max_position_embeddings
    fit = room_for_new_tokens(config, used)
    if fit is None:
        if used + new <= limit + 1:
            return
        if not refuse_past_training:
            logger.warning(f"generating {new} new tokens after {used} will exceed the model's predefined maximum "
                           f"length ({limit}, the context it was trained on); past it, expect the text to degrade")
            return
        fit = limit + 1 - used  # the context it was trained on, as a table would hold it
    elif new <= fit:
        return
    start = "the decoder's start takes" if config.is_encoder_decoder else "the prompt takes"
    raise ValueError(f"max_new_tokens={new} does not fit: the model has {limit} positions "
                     f"({config.position_embedding_type}) and {start} {used}, "
                     f"so at most {max(fit, 0)} new tokens fit"
                     + ("; shorten the prompt" if fit < 1 else f"; pass --max_new_tokens {fit} or less"))


def check_sources_fit(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sources: list[str], *,
                      refuse_past_training: bool = False) -> None:
    """Refuse a source longer than the encoder's positions, naming it (a table has no row past them); with rotary
    positions, past the context it was trained on is warned about, or refused with ``refuse_past_training``."""
    lengths = [len(ids) for ids in tokenizer(sources, split_special_tokens=True, verbose=False)["input_ids"]]
    limit, longest = model.config.max_position_embeddings, max(lengths)
    if longest <= limit:
        return
    which = lengths.index(longest)
    said = (f"prompt {which} takes {longest} tokens and the encoder has {limit} positions "
            f"({model.config.position_embedding_type})")
    if model.config.position_table or refuse_past_training:
        raise ValueError(f"{said}; shorten it")
    logger.warning(f"{said}, the context it was trained on; past it, expect the output to degrade")


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

    This is the plain Hugging Face path, ``model.generate(**tokenizer(sources, return_tensors="pt",
    padding=True))``: the tokenizer encodes sources exactly as training did (its post-processor adds
    EOS), with its own padding side; ``max_source_length`` truncates like training.
    """
    device = next(model.parameters()).device
    truncation = {"truncation": True, "max_length": max_source_length} if max_source_length else {}
    outputs: list[str] = []
    for start in range(0, len(sources), batch_size):
        chunk = list(sources[start : start + batch_size])
        encoded = tokenizer(chunk, return_tensors="pt", padding=True, split_special_tokens=True,
                            **truncation).to(device)
        generated = model.generate(**encoded, **generate_kwargs)  # (batch, new tokens)
        outputs.extend(text.strip() for text in tokenizer.batch_decode(generated, skip_special_tokens=True))
    return outputs


def _continue_prompts(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], *,
    refuse_past_training: bool = False, **generate_kwargs: Any,
) -> list[str]:
    """New text of a decoder-only model after each prompt (left-padded batch, prompt tokens removed)."""
    device = next(model.parameters()).device
    # verbose=False: check_fits_positions below says what a too-long prompt means (the tokenizer's warning would not)
    # split_special_tokens: a "<eos>" written in a prompt is text, never an EOS id mid-prompt
    # padding_side: left, whatever side the tokenizer was saved with (one trained on a seq2seq corpus pads right)
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False,
                        split_special_tokens=True, verbose=False).to(device)
    empty = [i for i, ids in enumerate(encoded["attention_mask"].sum(dim=1).tolist()) if ids == 0]
    if empty:
        raise ValueError(f"prompt {empty[0]} is empty; give every prompt at least one character of text to continue")
    check_fits_positions(model, encoded["input_ids"].shape[1], generate_kwargs.get("max_new_tokens"),
                         refuse_past_training=refuse_past_training)
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
    refuse_past_training: bool = False,
    **generate_kwargs: Any,
) -> list[str]:
    """Continuations (decoder-only) or outputs (encoder-decoder) of ``prompts``, one string each: the one
    generation helper of the package (the CLI, the demo and training's sample generations call it).

    ``generate_kwargs`` go to ``model.generate`` (max_new_tokens, do_sample, temperature, top_k,
    top_p, num_beams); None values are dropped so the model's generation_config decides. Settings out of
    range, and generations longer than the model's positions, are refused before any work (rotary positions: a
    warning, or refused with ``refuse_past_training``). With ``seed`` the
    sampling is reproducible and the caller's RNG state is left as it was (training calls this mid-run).
    The model is in eval mode while generating and comes back in the mode it had.
    """
    if not prompts:
        raise ValueError("give at least one prompt")
    kwargs = {k: v for k, v in generate_kwargs.items() if v is not None}
    check_generation_arguments(kwargs)
    if kwargs.get("num_beams", 1) > model.config.vocab_size:  # each beam a step's scores: memory grows with the width
        raise ValueError(f"num_beams must be at most the vocabulary size ({model.config.vocab_size}): a first step "
                         f"has no more different continuations to keep, got {kwargs['num_beams']}")
    kwargs["logits_processor"] = LogitsProcessorList([*kwargs.get("logits_processor", ()), FiniteScoresCheck()])
    prompts = list(checked_texts(prompts, "the prompts"))
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with random_state_kept(device, enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            if model.config.is_encoder_decoder:
                empty = [i for i, source in enumerate(prompts) if not source.strip()]
                if empty:
                    raise ValueError(f"prompt {empty[0]} is empty; give every prompt some text to translate")
                check_fits_positions(model, 1, kwargs.get("max_new_tokens"), refuse_past_training=refuse_past_training)
                check_sources_fit(model, tokenizer, prompts, refuse_past_training=refuse_past_training)
                return generate_texts(model, tokenizer, prompts, batch_size=len(prompts), **kwargs)
            return _continue_prompts(model, tokenizer, prompts, refuse_past_training=refuse_past_training, **kwargs)
    finally:
        model.train(was_training)


OUTPUT_RULE = "-" * 40  # between several prompts' continuations in `minitx generate`'s output


@dataclass
class GenerateArguments:
    """`minitx generate`: prompts in, one line out per prompt."""

    model: str = field(metadata={"help": "a saved model folder (the --output_dir of a training run)"})
    prompt: list[str] = field(metadata={"help": "one or more prompts (or sources to translate)"})
    max_new_tokens: int | None = field(default=None, metadata={"help": "default: generation_config.json"})
    do_sample: bool | None = field(default=None, metadata={
        "help": "sample, or with false decode greedily (default: what the model's generation_config.json says; "
                "--temperature, --top_k or --top_p sample too)"})
    greedy: bool = field(default=False, metadata={"help": "greedy decoding (no sampling): --do_sample false"})
    temperature: float | None = field(default=None, metadata={"help": "sampling temperature"})
    top_k: int | None = field(default=None, metadata={"help": "sample among the k most likely tokens"})
    top_p: float | None = field(default=None, metadata={"help": "nucleus sampling probability mass"})
    num_beams: int | None = field(default=None, metadata={
        "help": "beam search width (no sampling, unless --do_sample or a sampling setting is given too: beam "
                "sampling)"})
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
    greedy = "--greedy" if args.greedy else "--do_sample false" if args.do_sample is False else None
    sampling = [f"--{name}" for name in ("temperature", "top_k", "top_p") if getattr(args, name) is not None]
    if greedy and sampling:
        raise ValueError(f"{greedy} does not sample, so {', '.join(sampling)} would do nothing; drop "
                         f"{'it' if len(sampling) == 1 else 'them'} or {greedy}")
    list(checked_texts(args.prompt, option="--prompt"))  # a byte the shell could not decode, named up front
    model, tokenizer = load_model_folder(args.model, device=args.device, dtype=args.dtype)
    if model.config.is_encoder_decoder:  # a source past the encoder's positions is refused, whatever the length asked
        check_sources_fit(model, tokenizer, args.prompt, refuse_past_training=True)
    # a sampling setting samples (a model whose generation_config is greedy would ignore it); beams search
    do_sample = True if args.do_sample or sampling else False if greedy or (args.num_beams or 1) > 1 else None
    outputs = generate(  # an asked length past the trained context is refused (in Python: a warning)
        model, tokenizer, args.prompt, seed=args.seed, refuse_past_training=args.max_new_tokens is not None,
        max_new_tokens=args.max_new_tokens,
        do_sample=do_sample,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, num_beams=args.num_beams,
    )
    for i, (prompt, output) in enumerate(zip(args.prompt, outputs, strict=True)):
        if model.config.is_encoder_decoder:
            print(f"{prompt} -> {output}")
            continue
        if i:  # a continuation may span lines: a rule marks where the next prompt's begins
            print(OUTPUT_RULE)
        print(f"{prompt}{output}")
    return outputs
