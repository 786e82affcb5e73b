"""Quality at equal wall time: hf_minitx's default recipe against GPT-2 trained the nanoGPT way.

For each corpus, in one run, on the same tokens (a BPE trained by hf_minitx on the corpus, and hf_minitx's block
size, for both sides):

- the reference: transformers' ``GPT2LMHeadModel`` (learned positions, LayerNorm, GELU, tied head, dropout 0),
  trained with the optimiser of nanoGPT's published CPU recipe: batch 12, AdamW lr 1e-3, betas (0.9, 0.99),
  weight decay 0.1 on every tensor of 2 or more dimensions, gradient clipping 1.0, 100 warmup steps, cosine decay
  to 1e-4 over 2000 steps (then held);
- ours: ``minitx train``'s default recipe (the default preset and training arguments; ``ours_args`` changes it)
  at the same width and depth.

Both train for the same wall time at the same time, each in its own process on ``threads`` threads, so the
machine's load hits both alike, through the package's one training loop (``training.loop.fit``). Each is then
scored on the whole validation text in bits per byte: total nats / ln 2 / UTF-8 bytes of the validation text.
Our schedule is defined in steps; here it is laid over the wall-time budget (``WallClockSchedule``): a short timed
probe of the same model and batch (discarded) gives the step rate, so warmup lasts about as many steps as asked,
and the schedule's position follows the clock, so the decay ends when the time does even if the machine's load
changes the pace.
"""

from __future__ import annotations

import math
import multiprocessing
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from accelerate import Accelerator
from datasets import DatasetDict
from torch import nn
from torch.utils.data import DataLoader

QUALITY_CORPORA = ("builtin:kjv", "builtin:pydocs")
SIDES = ("reference", "ours")
NANOGPT = {"batch": 12, "learning_rate": 1e-3, "betas": (0.9, 0.99), "weight_decay": 0.1, "max_grad_norm": 1.0,
           "warmup": 100, "decay_iters": 2000, "min_lr": 1e-4}  # nanoGPT's CPU (shakespeare_char) optimiser settings


@dataclass(frozen=True)
class QualitySettings:
    """One quality comparison: the shared shape, the budget, and what may change our side's recipe."""

    seconds: float = 180.0
    corpora: tuple[str, ...] = QUALITY_CORPORA
    layers: int = 4
    heads: int = 4
    hidden: int = 128
    threads: int = 1
    seed: int = 42  # minitx train's default: the same validation carve
    ours_args: str = ""  # extra `minitx train` arguments for our side, e.g. "--optimizer adamw"
    probe_steps: int = 8  # timed steps that size our schedule

    def check(self) -> None:
        if self.seconds <= 0:
            raise ValueError(f"--quality_seconds must be > 0, got {self.seconds}")
        if self.hidden % self.heads:
            raise ValueError(f"quality: hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        our_recipe(self)  # unknown or bad --quality_ours_args fail here, before minutes of training


def our_recipe(settings: QualitySettings) -> tuple[Any, Any, Any]:
    """(model settings, data arguments, train arguments) of ``minitx train``'s default recipe plus ``ours_args``,
    at the comparison's width and depth."""
    from ..training.arguments import parse_training_args
    from ..training.optim import check_optimizer_arguments
    from ..training.prepare import resolve_model_settings

    try:
        model_args, data_args, train_args = parse_training_args(shlex.split(settings.ours_args))
    except (ValueError, SystemExit) as err:
        raise ValueError(f"--quality_ours_args {settings.ours_args!r}: {err}; give minitx train arguments") from None
    model = resolve_model_settings(model_args, data_args)
    model.update(hidden_size=settings.hidden, num_hidden_layers=settings.layers, num_attention_heads=settings.heads,
                 intermediate_size=4 * settings.hidden, num_key_value_heads=None,
                 max_position_embeddings=max(model.get("max_position_embeddings", 0), data_args.block_size))
    check_optimizer_arguments(train_args)
    return model, data_args, train_args


# --- data ------------------------------------------------------------------------------------------


@dataclass
class CorpusData:
    """The tokens both sides share: packed train blocks, validation blocks covering the whole text once."""

    train: Any
    validation: Any
    collate: Any
    vocab_size: int
    special_ids: dict[str, int]
    num_bytes: int  # UTF-8 bytes of the whole validation text
    block_size: int


def corpus_data(corpus: str, data_args: Any, seed: int) -> CorpusData:
    """Load ``corpus``, train hf_minitx's BPE on its train split (``--tokenizer_vocab_size``), pack both splits."""
    from ..data.corpus import iter_training_texts, load_corpus, tokenize_and_pack
    from ..data.preprocessing import block_collator
    from ..data.tokenizer import train_bpe_tokenizer
    from ..training.evaluation import text_bytes

    dd = load_corpus(corpus, task="causal-lm", seed=seed)
    tokenizer = train_bpe_tokenizer(
        iter_training_texts(dd["train"], max_texts=data_args.tokenizer_max_texts, seed=seed,
                            max_chars=data_args.tokenizer_max_chars), data_args.tokenizer_vocab_size)
    block = data_args.block_size
    train = tokenize_and_pack(DatasetDict(train=dd["train"]), tokenizer, block)["train"]
    validation = tokenize_and_pack(DatasetDict(validation=dd["validation"]), tokenizer, block,
                                   for_evaluation=True)["validation"]
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    return CorpusData(train.with_format("numpy"), validation.with_format("numpy"), block_collator(tokenizer),
                      len(tokenizer), ids, text_bytes(dd["validation"]["text"]), block)


# --- the two sides -----------------------------------------------------------------------------------


def nanogpt_lr_factor(step: int) -> float:
    """nanoGPT's learning rate at ``step`` as a fraction of the peak: linear warmup, cosine to min_lr, then held."""
    peak, low = NANOGPT["learning_rate"], NANOGPT["min_lr"]
    if step < NANOGPT["warmup"]:
        return (step + 1) / (NANOGPT["warmup"] + 1)
    if step > NANOGPT["decay_iters"]:
        return low / peak
    progress = (step - NANOGPT["warmup"]) / (NANOGPT["decay_iters"] - NANOGPT["warmup"])
    return (low + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - low)) / peak


def reference_side(settings: QualitySettings, data: CorpusData) -> tuple[nn.Module, Any, Any, int, float]:
    """GPT2LMHeadModel and nanoGPT's optimiser: (model, optimizer, scheduler, batch, max grad norm)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=data.vocab_size, n_positions=data.block_size, n_embd=settings.hidden,
                        n_layer=settings.layers, n_head=settings.heads, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, **data.special_ids)
    model = GPT2LMHeadModel(config)
    model.set_attn_implementation("sdpa")
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": matrices, "weight_decay": NANOGPT["weight_decay"]},
                                   {"params": others, "weight_decay": 0.0}],
                                  lr=NANOGPT["learning_rate"], betas=NANOGPT["betas"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, nanogpt_lr_factor)
    return model, optimizer, scheduler, NANOGPT["batch"], NANOGPT["max_grad_norm"]


def our_side(settings: QualitySettings, data: CorpusData, probe: bool = False):
    """hf_minitx's default recipe: (model, optimizer, scheduler, batch, max grad norm, recipe record).
    The schedule spans the steps the budget allows (``probe_rate``), unless ``probe``."""
    from ..models import MiniTxConfig, MiniTxForCausalLM
    from ..training.optim import build_optimizer, build_scheduler, describe_schedule

    model_settings, _, train_args = our_recipe(settings)
    config = MiniTxConfig(**{**model_settings, **data.special_ids, "vocab_size": data.vocab_size,
                             "decoder_start_token_id": data.special_ids["bos_token_id"]})
    model = MiniTxForCausalLM(config)
    optimizer = build_optimizer(model, train_args)
    batch = train_args.per_device_train_batch_size
    if probe:
        return model, optimizer, None, batch, train_args.max_grad_norm or None, {}
    steps = max(1, int(settings.seconds * probe_rate(settings, data)))
    scheduler = build_scheduler(optimizer, train_args, steps)
    scheduler.lr_lambdas = [WallClockSchedule(fn, steps, settings.seconds) for fn in scheduler.lr_lambdas]
    recipe = {"optimizer": train_args.optimizer, "schedule": describe_schedule(train_args, steps),
              "per_device_train_batch_size": batch, "block_size": data.block_size,
              "model": {k: v for k, v in model_settings.items() if k != "is_encoder_decoder"}}
    return model, optimizer, scheduler, batch, train_args.max_grad_norm or None, recipe


class WallClockSchedule:
    """A step schedule ``factor(step)`` over ``steps`` steps, followed by the clock instead: at step k >= 1 it gives
    factor(steps x elapsed / seconds), the clock started at the first step (capped at the last step)."""

    def __init__(self, factor: Callable[[int], float], steps: int, seconds: float,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.factor, self.steps, self.seconds, self.clock = factor, steps, seconds, clock
        self.start: float | None = None

    def __call__(self, step: int) -> float:
        if step == 0:
            return self.factor(0)
        if self.start is None:
            self.start = self.clock()
        position = 1 + int(self.steps * (self.clock() - self.start) / self.seconds)
        return self.factor(min(self.steps, position))


def probe_rate(settings: QualitySettings, data: CorpusData) -> float:
    """Optimizer steps per second of our recipe (a throwaway model, the last of ``probe_steps`` timed)."""
    torch.manual_seed(settings.seed + 1)
    model, optimizer, _, batch, _, _ = our_side(settings, data, probe=True)
    rows = data.collate([data.train[i] for i in range(batch)])
    times = []
    for _ in range(settings.probe_steps):
        start = time.perf_counter()
        logits = model(input_ids=rows["input_ids"]).logits  # (batch, block, vocab)
        nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), rows["labels"][:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return 1.0 / sorted(times[1:])[len(times[1:]) // 2]


# --- training and scoring, one side in one process ----------------------------------------------------


@dataclass
class BitsPerByte:
    """The loop's evaluation here: the loss on every validation block, as bits per byte of the validation text."""

    loader: Any
    num_bytes: int
    coverage: dict[str, Any] = field(default_factory=dict)

    def __call__(self, model: nn.Module, accelerator: Accelerator) -> tuple[dict[str, float], list[dict]]:
        from ..training.evaluation import evaluate_loss

        metrics = evaluate_loss(model, self.loader, accelerator, shift=True,
                                inputs=lambda b: {"input_ids": b["input_ids"]}, num_bytes=self.num_bytes)
        return metrics, []


def bits_per_byte(total_nats: float, num_bytes: int) -> float:
    """Total nats over the validation tokens / ln 2 / UTF-8 bytes of the validation text."""
    return total_nats / math.log(2) / num_bytes


def train_side(side: str, corpus: str, settings: QualitySettings) -> dict[str, Any]:
    """Train one side on one corpus for ``settings.seconds`` and score it; runs in its own process."""
    from accelerate.state import AcceleratorState, GradientState

    from ..training.data_order import StepIndexedBatchSampler
    from ..training.loop import LoopSettings, RunState, TrainingRun, fit
    from ..training.loss import Objective
    from ..training.optim import describe_optimizer

    torch.set_num_threads(settings.threads)
    _, data_args, _ = our_recipe(settings)
    data = corpus_data(corpus, data_args, settings.seed)
    torch.manual_seed(settings.seed)
    if side == "reference":
        model, optimizer, scheduler, batch, clip = reference_side(settings, data)
        recipe = {"optimizer": "adamw (nanoGPT)", **{k: v for k, v in NANOGPT.items()}, "block_size": data.block_size}
    else:
        model, optimizer, scheduler, batch, clip, recipe = our_side(settings, data)
        torch.manual_seed(settings.seed)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    sampler = StepIndexedBatchSampler(len(data.train), batch, seed=settings.seed)
    batches = iter(DataLoader(data.train, batch_sampler=sampler, collate_fn=data.collate))
    evaluation = BitsPerByte(DataLoader(data.validation, batch_size=32, collate_fn=data.collate), data.num_bytes)
    model, optimizer = accelerator.prepare(model, optimizer)
    loop = LoopSettings(total_steps=10**9, batches_per_epoch=sampler.batches_per_epoch, logging_steps=10**9,
                        max_grad_norm=clip, max_seconds=settings.seconds, show_progress=False)
    run = TrainingRun(accelerator, model, optimizer, scheduler, batches, Objective(shift=True), evaluation, loop, None)
    state = RunState()
    outcome = fit(run, state)
    return {"side": side, "corpus": corpus, "bits_per_byte": outcome.final_metrics["eval_bits_per_byte"],
            "eval_loss": outcome.final_metrics["eval_loss"], "steps": state.step, "tokens_seen": state.tokens_seen,
            "train_seconds": round(state.train_seconds, 1), "validation_bytes": data.num_bytes,
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "recipe": {**recipe, "parameter_groups": describe_optimizer(optimizer)}}


def _train_side(job: tuple[str, str, QualitySettings]) -> dict[str, Any]:
    return train_side(*job)


def run_quality(settings: QualitySettings, log=print) -> dict[str, Any]:
    """Both sides on every corpus, the two sides of a corpus at the same time; ratios ours / reference."""
    settings.check()
    results: dict[str, Any] = {"settings": asdict(settings), "corpora": {}}
    context = multiprocessing.get_context("spawn")  # a fresh interpreter per side: no shared torch state
    for corpus in settings.corpora:
        log(f"[quality] {corpus}: reference and ours, {settings.seconds:g} s each, side by side ...")
        with context.Pool(2) as pool:
            reference, ours = pool.map(_train_side, [(side, corpus, settings) for side in SIDES])
        results["corpora"][corpus] = {"reference": reference, "ours": ours,
                                      "ratio": ours["bits_per_byte"] / reference["bits_per_byte"]}
    return results


def format_quality(result: dict[str, Any]) -> str:
    """A Markdown table: bits per byte of each side, steps, and the ratio ours / reference per corpus."""
    seconds = result["settings"]["seconds"]
    lines = [f"| corpus ({seconds:g} s each) | GPT-2, nanoGPT recipe (bits/byte, steps) | hf_minitx default "
             "(bits/byte, steps) | ratio |", "|---|---:|---:|---:|"]
    for corpus, figures in result["corpora"].items():
        ref, ours = figures["reference"], figures["ours"]
        lines.append(f"| {corpus} | {ref['bits_per_byte']:.3f} ({ref['steps']}) | {ours['bits_per_byte']:.3f} "
                     f"({ours['steps']}) | {figures['ratio']:.3f}x |")
    return "\n".join(lines)
