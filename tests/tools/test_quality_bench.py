"""The benchmark's quality section on tiny cases: bits per byte over the whole validation text (checked by hand),
nanoGPT's schedule and weight decay on the reference side, our side built from `minitx train`'s defaults, and
bad settings refused before any training. No timing assertions."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from hf_minitx.tools import benchmark
from hf_minitx.tools.quality_bench import (
    NANOGPT,
    BitsPerByte,
    QualitySettings,
    WallClockSchedule,
    corpus_data,
    format_quality,
    nanogpt_lr_factor,
    our_recipe,
    our_side,
    reference_side,
)
from hf_minitx.training.arguments import DataArguments, TrainArguments

LINES = [f"line {i}: the cat sat on the mat, and the dog — café — ran {i * 7} laps." for i in range(400)]


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("quality") / "corpus.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    data_args = DataArguments(tokenizer_vocab_size=300, block_size=16)
    return path, corpus_data(str(path), data_args, seed=42)


class Uniform(torch.nn.Module):
    """Equal logits for every token: each prediction costs ln(vocab) nats."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.unused = torch.nn.Linear(1, 1)

    def forward(self, input_ids):
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, self.vocab))


def test_bits_per_byte_covers_the_whole_validation_text_once(tiny_corpus):
    path, data = tiny_corpus
    from hf_minitx.data.corpus import load_corpus

    text = "".join(load_corpus(str(path), task="causal-lm", seed=42)["validation"]["text"])
    assert data.num_bytes == len(text.encode("utf-8")) > len(text)  # bytes, not characters ("é", "—")
    loader = DataLoader(data.validation, batch_size=4, collate_fn=data.collate)
    metrics, _ = BitsPerByte(loader, data.num_bytes)(Uniform(data.vocab_size), Accelerator(cpu=True))
    # by hand: every token of the validation text plus the closing <eos>, each ln(V) nats
    tokens = metrics["eval_tokens"]
    assert tokens == _count_text_tokens(data, text) + 1
    assert metrics["eval_bits_per_byte"] == pytest.approx(tokens * math.log2(data.vocab_size) / data.num_bytes)


def _count_text_tokens(data, text: str) -> int:
    """The validation text's token count, read back from the packed blocks (overlap of one token removed)."""
    rows = [data.collate([row])["labels"][0] for row in data.validation]
    stream = torch.cat([rows[0]] + [row[1:] for row in rows[1:]])
    stream = stream[stream != -100]
    assert stream[0].item() == data.special_ids["eos_token_id"]  # the context of a document start
    return len(stream) - 2  # minus the leading context and the closing <eos>


def test_nanogpt_schedule_warms_up_decays_to_min_lr_and_holds():
    peak, low = NANOGPT["learning_rate"], NANOGPT["min_lr"]
    assert nanogpt_lr_factor(0) == pytest.approx(1 / 101)
    assert nanogpt_lr_factor(100) == pytest.approx(1.0)
    assert nanogpt_lr_factor(1050) == pytest.approx((low + 0.5 * (peak - low)) / peak)
    assert nanogpt_lr_factor(2000) == pytest.approx(low / peak) == nanogpt_lr_factor(5000)


def test_reference_is_gpt2_with_nanogpt_decay_on_every_matrix(tiny_corpus):
    _, data = tiny_corpus
    model, optimizer, _, batch, clip = reference_side(QualitySettings(hidden=32, heads=4, layers=2), data)
    assert type(model).__name__ == "GPT2LMHeadModel" and (batch, clip) == (12, 1.0)
    decayed = {id(p) for p in optimizer.param_groups[0]["params"]}
    assert optimizer.param_groups[0]["weight_decay"] == 0.1 and optimizer.defaults["betas"] == (0.9, 0.99)
    for name, param in model.named_parameters():
        assert (id(param) in decayed) == (param.dim() >= 2), name
    assert model.config.resid_pdrop == model.config.attn_pdrop == model.config.embd_pdrop == 0.0


def test_our_side_is_minitx_train_defaults_at_the_shared_shape(tiny_corpus, monkeypatch):
    _, data = tiny_corpus
    import hf_minitx.tools.quality_bench as quality

    monkeypatch.setattr(quality, "probe_rate", lambda settings, data: 2.0)  # 2 steps/s: 20 steps in 10 s
    settings = QualitySettings(seconds=10, hidden=32, heads=4, layers=2, ours_args="--block_size 16")
    model, optimizer, scheduler, batch, clip, recipe = our_side(settings, data)
    defaults = TrainArguments()
    assert (batch, recipe["optimizer"]) == (defaults.per_device_train_batch_size, defaults.optimizer)
    assert recipe["schedule"]["total_steps"] == 20 and recipe["block_size"] == 16
    assert all(isinstance(fn, WallClockSchedule) and fn.steps == 20 for fn in scheduler.lr_lambdas)
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.num_attention_heads) == (32, 2, 4)
    model_settings, _, train_args = our_recipe(QualitySettings(ours_args="--optimizer adamw --learning_rate 0.004"))
    assert (train_args.optimizer, train_args.learning_rate) == ("adamw", 0.004)


def test_bad_quality_settings_are_refused_before_work():
    with pytest.raises(ValueError, match="quality_seconds must be > 0"):
        QualitySettings(seconds=0).check()
    with pytest.raises(ValueError, match="--quality_ours_args '--no_such_flag 1'.*no_such_flag"):
        QualitySettings(ours_args="--no_such_flag 1").check()
    with pytest.raises(ValueError, match="contradict"):
        benchmark.main(["--no_quality", "--quality_only"])


def test_quality_table_gives_the_ratio_per_corpus():
    side = {"bits_per_byte": 1.5, "steps": 100}
    table = format_quality({"settings": {"seconds": 60}, "corpora": {
        "builtin:kjv": {"reference": side, "ours": {"bits_per_byte": 1.2, "steps": 300}, "ratio": 0.8}}})
    assert "| builtin:kjv | 1.500 (100) | 1.200 (300) | 0.800x |" in table


def test_our_schedule_follows_the_clock_so_the_decay_ends_with_the_budget():
    now = [100.0]
    schedule = WallClockSchedule(lambda step: step, steps=200, seconds=10.0, clock=lambda: now[0])
    assert schedule(0) == 0  # set at construction, before training
    assert schedule(1) == 1  # the clock starts at the first step
    now[0] += 5.0
    assert schedule(7) == 101  # half the budget: half the schedule, whatever the step count
    now[0] += 20.0
    assert schedule(300) == 200  # past the budget: the last step's factor
