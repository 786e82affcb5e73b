"""Validation metrics: loss, perplexity and bits per byte (causal LM); exact match and sacreBLEU from
``generate()`` (seq2seq). Every function works under ``accelerate launch``: each process evaluates its
shard and the totals are gathered, so the figures do not depend on the number of processes."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .loss import per_sequence_cross_entropy

COVERAGE_KEYS = ("eval_tokens", "eval_bytes")  # what the figures cover, not metrics themselves


def text_bytes(texts: Iterable[str]) -> int:
    """UTF-8 bytes of ``texts`` as they stand (the denominator of bits per byte)."""
    return sum(len(text.encode("utf-8")) for text in texts if text)


def predicted_bytes(labels: Iterable[Sequence[int]], tokenizer: PreTrainedTokenizerBase) -> int:
    """UTF-8 bytes of the text the predicted labels (all but each row's first) of causal blocks encode,
    decoded as one stream so characters split across blocks count once; special tokens count zero."""
    ids = [i for row in labels for i in row[1:] if i != -100]
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
        nats, counts = per_sequence_cross_entropy(logits, batch["labels"], shift=shift)  # (batch,) each
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
        encoded = tokenizer(chunk, return_tensors="pt", padding=True, **truncation).to(device)
        generated = model.generate(**encoded, **generate_kwargs)  # (batch, new tokens)
        outputs.extend(text.strip() for text in tokenizer.batch_decode(generated, skip_special_tokens=True))
    return outputs


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
