"""Validation metrics: loss, perplexity and bits per byte (causal LM); exact match and sacreBLEU from
``generate()`` (seq2seq); ``TextEvaluation`` bundles them for the training loop. Every function works under
``accelerate launch``: each process evaluates its shard and the totals are gathered, so the figures do not
depend on the number of processes."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..inference import generate, generate_texts
from ..models.modeling_minitx import IGNORE_INDEX
from ..models.positions_minitx import room_for_new_tokens
from .loss import Objective, sequence_cross_entropy

COVERAGE_KEYS = ("eval_tokens", "eval_bytes")  # what the figures cover, not metrics themselves


def text_bytes(texts: Iterable[str]) -> int:
    """UTF-8 bytes of ``texts`` as they stand (the denominator of bits per byte)."""
    return sum(len(text.encode("utf-8")) for text in texts if text)


def predicted_bytes(labels: Iterable[Sequence[int]], tokenizer: PreTrainedTokenizerBase) -> int:
    """UTF-8 bytes of the text the predicted labels (all but each row's first) of causal blocks encode,
    decoded as one stream so characters split across blocks count once; special tokens count zero."""
    ids = [i for row in labels for i in row[1:] if i != IGNORE_INDEX]
    return text_bytes([tokenizer.decode(ids, skip_special_tokens=True)])


@torch.no_grad()
def evaluate_loss(
    model: torch.nn.Module,
    dataloader: Iterable[dict],
    accelerator: Accelerator,
    *,
    shift: bool,
    inputs: Callable[[dict], dict] | None = None,
    num_bytes: int | None = None,
) -> dict[str, float]:
    """Validation loss over a prepared dataloader, with perplexity and the number of scored tokens
    (``eval_tokens``); given ``num_bytes``, the UTF-8 bytes of the text those tokens encode, also bits
    per byte = total nats / (ln 2 * num_bytes) (``eval_bytes`` records the denominator).

    ``inputs(batch)`` selects what the model is called with (default: the batch without labels).
    """
    was_training = model.training
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=accelerator.device)  # nats, tokens
    for batch in dataloader:
        call = inputs(batch) if inputs else {k: v for k, v in batch.items() if k != "labels"}
        logits = model(**call).logits  # (batch, seq, vocab)
        nats, counts = sequence_cross_entropy(logits, batch["labels"], shift=shift)  # (batch,) each
        rows = torch.stack([nats.double(), counts.double()], dim=1)  # (batch, 2)
        totals += accelerator.gather_for_metrics(rows).sum(dim=0)
    model.train(was_training)
    nats, tokens = totals.tolist()
    if tokens == 0:
        raise ValueError("the validation data holds no labelled token; check the validation split")
    loss = nats / tokens
    metrics = {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700.0)), "eval_tokens": int(tokens)}
    if num_bytes:
        metrics["eval_bits_per_byte"] = nats / (math.log(2) * num_bytes)
        metrics["eval_bytes"] = int(num_bytes)
    return metrics


def exact_match(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Percentage (0-100) of predictions equal to their reference, ignoring surrounding whitespace."""
    if len(predictions) != len(references) or not references:
        raise ValueError(f"need as many predictions as references (>0), got {len(predictions)} and {len(references)}")
    hits = sum(p.strip() == r.strip() for p, r in zip(predictions, references, strict=True))
    return 100.0 * hits / len(references)


def corpus_bleu(predictions: Sequence[str], references: Sequence[str]) -> float:
    """sacreBLEU corpus score (0-100) with one reference per prediction."""
    import sacrebleu

    return float(sacrebleu.corpus_bleu(list(predictions), [list(references)]).score)


def evaluate_generation(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sources: Sequence[str],
    references: Sequence[str],
    accelerator: Accelerator,
    **generate_kwargs,
) -> tuple[dict[str, float], list[str]]:
    """Exact match and BLEU of generated translations; each process translates every N-th pair.

    ``model`` is the unwrapped model. Returns the metrics and all predictions (in input order).
    """
    rank, world = accelerator.process_index, accelerator.num_processes
    mine = list(range(rank, len(sources), world))
    predictions = generate_texts(model, tokenizer, [sources[i] for i in mine], **generate_kwargs)
    pairs = gather_object(list(zip(mine, predictions, strict=True)))
    ordered = [text for _, text in sorted(pairs)]
    metrics = {
        "eval_exact_match": exact_match(ordered, references),
        "eval_bleu": corpus_bleu(ordered, references),
    }
    return metrics, ordered


def chance_note(metrics: dict[str, float], vocab_size: int) -> str | None:
    """A warning when the validation loss is no better than picking tokens at random (perplexity at least half
    the vocabulary size), e.g. after a run that diverged without a NaN; None when the model learned something."""
    loss = metrics.get("eval_loss")
    if loss is None or vocab_size < 2 or (math.isfinite(loss) and loss < math.log(vocab_size / 2)):
        return None
    perplexity = metrics.get("eval_perplexity", math.inf)
    if not math.isfinite(loss) or loss > math.log(vocab_size) + 1:  # far from uniform: confidently wrong
        return (f"warning: the final evaluation is far worse than chance (perplexity {perplexity:.4g} with a "
                f"{vocab_size}-token vocabulary): the model is unusable on this text. If the training loss rose, the "
                "training diverged: start again with a lower --learning_rate (and --muon_learning_rate with Muon); "
                "if it fell far below, the model learned its training text by heart: train on more text, for "
                "fewer steps, or a smaller model")
    return (f"warning: the final evaluation is at chance (perplexity {perplexity:.4g} with a {vocab_size}-token "
            "vocabulary): the model learned nothing usable. Train longer, or lower the learning rate if the loss "
            "rose")


@dataclass
class TextEvaluation:
    """What `minitx train` measures at each evaluation, on every process together.

    The validation loss (with perplexity and, for causal LM, bits per byte); for seq2seq also exact match
    and BLEU of generated outputs. It returns a few generations for a human to read: the first scored
    translations, or sampled continuations of ``prompts`` (decoder-only).
    """

    loader: Iterable[dict]  # the prepared validation dataloader
    objective: Objective
    tokenizer: PreTrainedTokenizerBase
    prompts: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # seq2seq: translated and scored against references
    references: list[str] = field(default_factory=list)
    generation: dict[str, Any] = field(default_factory=dict)  # generate_texts settings of the scored outputs
    num_samples: int = 2
    seed: int = 0
    num_bytes: int | None = None  # causal LM: UTF-8 bytes of the validation text the loss covers
    whole_split: bool = True  # False when --max_eval_samples took a subset
    rows: int = 0  # validation rows (blocks or pairs) the loss is taken over
    coverage: dict[str, Any] = field(default_factory=dict)  # what the last figures covered (for the summary)

    def __call__(self, model: torch.nn.Module, accelerator: Accelerator) -> tuple[dict[str, float], list[dict]]:
        """(metrics, samples) of the prepared ``model``; samples are [{"prompt", "output"(, "reference")}]."""
        metrics = evaluate_loss(model, self.loader, accelerator, shift=self.objective.shift,
                                inputs=self.objective.model_inputs, num_bytes=self.num_bytes)
        self.coverage = self.record_coverage(metrics)
        unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False).eval()  # no dropout while generating
        if self.sources:
            scored, predictions = evaluate_generation(unwrapped, self.tokenizer, self.sources, self.references,
                                                      accelerator, **self.generation)
            metrics.update(scored)
            if not self.prompts:  # no --sample_prompts: the first scored translations
                n = self.num_samples
                return metrics, [{"prompt": s, "output": p, "reference": r} for s, p, r in
                                 zip(self.sources[:n], predictions[:n], self.references[:n], strict=True)]
            if not accelerator.is_main_process:
                return metrics, []
            outputs = generate_texts(unwrapped, self.tokenizer, self.prompts, **self.generation)  # as the scored ones
            return metrics, [{"prompt": p, "output": o} for p, o in zip(self.prompts, outputs, strict=True)]
        if not (self.prompts and accelerator.is_main_process):
            return metrics, []
        style = {"do_sample": True, "top_k": 40, "temperature": 0.8} if self.objective.shift else {"do_sample": False}
        encoded = self.tokenizer(self.prompts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        longest = max(len(ids) for ids in encoded)
        room = room_for_new_tokens(unwrapped.config, longest)  # stay inside a learned or sinusoidal position table
        new_tokens = 48 if room is None else max(1, min(48, room))
        outputs = generate(unwrapped, self.tokenizer, self.prompts, seed=self.seed, max_new_tokens=new_tokens, **style)
        return metrics, [{"prompt": p, "output": o.strip()} for p, o in zip(self.prompts, outputs, strict=True)]

    def record_coverage(self, metrics: dict[str, float]) -> dict[str, Any]:
        """Move the coverage counts out of ``metrics``: rows, scored tokens and text bytes of the split."""
        counts = {key.removeprefix("eval_"): metrics.pop(key) for key in COVERAGE_KEYS if key in metrics}
        coverage = {"split": "validation", "rows": self.rows, **counts,
                    "whole_split": self.whole_split}
        if self.sources:
            coverage["generation_pairs"] = len(self.sources)
        return coverage
