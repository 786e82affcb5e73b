"""The benchmark's quality section: one scorer for both sides (every validation token once, bits per byte),
nanoGPT's schedule and weight decay on the reference side, our side as the `minitx train` command users type,
the two sides alternating, and bad settings refused before any training. No timing assertions."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hf_minitx.tools.benchmark import run
from hf_minitx.tools.benchmark.quality import (
    NANOGPT,
    AveragedModels,
    nanogpt_lr,
    nanogpt_optimizer,
    reference_model,
    run_quality,
    score_bits,
    score_ours,
    train_reference,
    write_splits,
)
from hf_minitx.tools.benchmark.quality_report import format_quality, plot_curves
from hf_minitx.tools.benchmark.quality_settings import CURVE_POINTS, QualitySettings, our_arguments
from hf_minitx.training import shape_plan
from hf_minitx.training.arguments import parse_training_args

LINES = [f"line {i}: the cat sat on the mat, and the dog — café — ran {i * 7} laps." for i in range(300)]


class Uniform(torch.nn.Module):
    """Equal logits for every token: each prediction costs log2(vocab) bits."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.calls = vocab, 0

    def forward(self, input_ids):
        self.calls += 1
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, self.vocab))


class Bigram(torch.nn.Module):
    """Logits that depend on the previous token only: any context >= 2 scores every token alike."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)))

    def forward(self, input_ids):
        return SimpleNamespace(logits=self.table[input_ids])


@pytest.mark.parametrize("length", [1, 2, 7, 8, 9, 50, 129])
def test_the_scorer_scores_every_token_once(length):
    ids = [3 + i % 11 for i in range(length)]
    model = Uniform(16)
    assert score_bits(model, ids, context=8, vocab_size=16) == pytest.approx(length * math.log2(16))


def test_sliding_windows_give_each_token_the_context_a_whole_pass_would():
    ids = torch.randint(0, 20, (200,), generator=torch.Generator().manual_seed(1)).tolist()
    model = Bigram(20)
    whole = score_bits(model, ids, context=1000, vocab_size=20)  # one window
    assert score_bits(model, ids, context=16, vocab_size=20) == pytest.approx(whole, rel=1e-6)


def test_nanogpt_schedule_warms_up_decays_to_min_lr_and_holds():
    peak, low = NANOGPT["learning_rate"], NANOGPT["min_lr"]
    assert nanogpt_lr(0, 2000) == pytest.approx(peak / 101)
    assert nanogpt_lr(99, 2000) == pytest.approx(peak * 100 / 101)
    assert nanogpt_lr(100, 2000) == pytest.approx(peak)
    assert nanogpt_lr(2000, 2000) == pytest.approx(low) == nanogpt_lr(5000, 2000)
    assert nanogpt_lr(1050, 2000) == pytest.approx((peak + low) / 2)
    assert nanogpt_lr(3000, 6000) > nanogpt_lr(3000, 2000)  # a longer budget decays over as many as fit


def test_reference_is_gpt2_of_the_shared_shape_with_decay_on_every_matrix():
    settings = QualitySettings(hidden=32, heads=2, layers=2)
    model = reference_model(settings, 100, 16, {"bos_token_id": 1, "eos_token_id": 2})
    assert type(model).__name__ == "GPT2LMHeadModel" and model.config.n_embd == 32 and model.config.n_layer == 2
    assert model.config.resid_pdrop == model.config.embd_pdrop == model.config.attn_pdrop == 0.0
    decay, no_decay = nanogpt_optimizer(model).param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_our_side_is_the_command_users_type(tmp_path):
    settings = QualitySettings(seconds=90, threads=2, ours_args="--optimizer adamw")
    args = our_arguments(settings, tmp_path / "data", tmp_path / "tok", tmp_path / "out")
    model_args, data_args, train_args = parse_training_args(args)
    assert train_args.max_minutes == 1.5 and train_args.num_threads == 2 and train_args.optimizer == "adamw"
    assert model_args.preset is None and model_args.config_overrides is None  # the default recipe: the budget plans
    assert shape_plan.plans_shape(model_args, data_args, train_args)  # the shape, and two models if one cannot use
    assert shape_plan.may_split(train_args) and train_args.keep_phases  # the budget, both kept for scoring
    assert train_args.checkpointing_steps == 1 / CURVE_POINTS and train_args.eval_steps == 0
    assert data_args.tokenizer == str(tmp_path / "tok")
    assert QualitySettings().num_threads >= 1  # every core by default
    shared = parse_training_args(our_arguments(QualitySettings(shared_shape=True), tmp_path, tmp_path, tmp_path))[0]
    assert shared.config_overrides == "hidden_size=128,num_attention_heads=4,num_hidden_layers=4"


class Seen(Exception):
    """Raised by a stand-in for run_quality with the settings the command built."""


def test_the_command_passes_the_shared_shape(monkeypatch):
    def stand_in(settings, log, work):
        raise Seen(settings)

    monkeypatch.setattr(run, "run_quality", stand_in)
    for argv, shared in (([], False), (["--quality_shared_shape"], True)):
        with pytest.raises(Seen) as seen:
            run.main(["--quality_only", "--quality_seconds", "5", *argv])
        assert seen.value.args[0].shared_shape is shared and seen.value.args[0].seconds == 5


@pytest.mark.parametrize("settings, message", [
    (QualitySettings(seconds=0), "--quality_seconds must be a finite number > 0"),
    (QualitySettings(seconds=math.nan), "--quality_seconds must be a finite number > 0, got nan"),
    (QualitySettings(seconds=math.inf), "--quality_seconds must be a finite number > 0, got inf"),
    (QualitySettings(hidden=30, heads=4), "divisible by heads"),
    (QualitySettings(threads=0), "--quality_threads must be from 1 to"),
    (QualitySettings(ours_args="--no_such_flag 1"), "--quality_ours_args"),
])
def test_bad_quality_settings_are_refused_before_work(settings, message):
    with pytest.raises(ValueError, match=message):
        settings.check()


def test_bad_quality_settings_are_refused_by_the_command(tmp_path):
    with pytest.raises(ValueError, match="--quality_seconds"):
        run.main(["--quality_only", "--quality_seconds", "-5", "--json", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_the_reference_loop_takes_random_windows_and_keeps_snapshots_along_the_time(tmp_path):
    from hf_minitx.data.tokenizer import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(iter(LINES), 300)
    tokenizer.save_pretrained(tmp_path / "tok")
    settings = QualitySettings(hidden=32, heads=2, layers=1, threads=1)
    trained = train_reference(settings, str(tmp_path / "tok"), "\n".join(LINES), block=16, seconds=1.5)
    assert trained["steps"] > 0 and trained["tokens_seen"] == trained["steps"] * NANOGPT["batch"] * 16
    times = [s["seconds"] for s in trained["snapshots"]]
    assert 2 <= len(times) <= CURVE_POINTS and times == sorted(times) and times[-1] >= 1.5
    assert trained["decay_iters"] >= NANOGPT["decay_iters"]


def test_an_averaged_pair_scores_the_mean_of_the_members_probabilities():
    ids = torch.randint(0, 20, (120,), generator=torch.Generator().manual_seed(2)).tolist()
    first, second = Bigram(20), Bigram(20)
    with torch.no_grad():
        second.table.copy_(torch.randn(20, 20, generator=torch.Generator().manual_seed(5)))
    alone = [score_bits(model, ids, context=16, vocab_size=20) for model in (first, second)]
    assert score_bits(AveragedModels(first, first), ids, 16, 20) == pytest.approx(alone[0], rel=1e-6)
    pair = score_bits(AveragedModels(first, second), ids, 16, 20)
    assert pair < sum(alone) / 2  # log of a mean is above the mean of logs, strictly for members that differ
    probs = (first.table.softmax(-1) + second.table.softmax(-1)) / 2  # by hand: the pair's bits of one token
    logits = AveragedModels(first, second)(torch.tensor([[3, 4]])).logits
    assert torch.allclose(logits[0, 0].exp(), probs[3], atol=1e-6)


def tiny_model_folder(folder: Path, seed: int, tokenizer, summary: dict) -> None:
    """A 1 x 16 causal LM of ``seed`` with ``tokenizer`` and a training summary, as a run saves it."""
    import json

    from hf_minitx.models.configuration_minitx import MiniTxConfig
    from hf_minitx.models.modeling_minitx import MiniTxForCausalLM

    torch.manual_seed(seed)
    config = MiniTxConfig(vocab_size=len(tokenizer), hidden_size=16, num_attention_heads=2, num_hidden_layers=1,
                          intermediate_size=32, max_position_embeddings=64)
    MiniTxForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "training_summary.json").write_text(json.dumps(summary))


def checkpoint_of(folder: Path, step: int, seconds: float) -> None:
    """``folder``'s weights as its checkpoint of ``step``, saved ``seconds`` into its run."""
    import json

    from safetensors.torch import load_file, save_file

    checkpoint = folder / f"checkpoint-{step}"
    checkpoint.mkdir()
    save_file(load_file(folder / "model.safetensors"), checkpoint / "model.safetensors")
    (checkpoint / "run_state.json").write_text(json.dumps({"train_seconds": seconds}))


@pytest.mark.parametrize("kept", ["student", "teacher"])
def test_a_run_in_two_phases_is_scored_model_by_model_and_as_a_pair(kept, tmp_path):
    from hf_minitx.data.tokenizer import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(iter(LINES), 300)
    base = {"recipe": {"block_size": 16}, "tokens_seen": 100}
    out = tmp_path / "ours"
    tiny_model_folder(out / "teacher", 1, tokenizer, {**base, "steps": 20, "train_seconds": 1.5})
    tiny_model_folder(out / "student", 2, tokenizer, {**base, "steps": 15, "train_seconds": 2.0})
    checkpoint_of(out / "teacher", 10, 0.7)
    checkpoint_of(out / "student", 5, 0.8)
    steps = {"teacher": 20, "student": 15}
    summary = {**base, "steps": steps[kept], "train_seconds": 3.5, "phases": {
        "model_kept": kept, "passes_of_one_model": 12.5, "folders_kept": True,
        "teacher": {"steps": 20}, "student": {"steps": 15}}}
    tiny_model_folder(out, {"teacher": 1, "student": 2}[kept], tokenizer, summary)  # the kept model's weights
    validation = "\n".join(LINES[:40])
    ours = score_ours(QualitySettings(threads=1, curve_tokens=200), out, validation, summary)
    split = ours["phases"]
    assert split[kept] == pytest.approx(ours["bits_per_byte"]) and split["teacher"] != split["student"]
    assert split["averaged_pair"] < (split["teacher"] + split["student"]) / 2
    # the teacher's checkpoint and model, the student's checkpoint after the teacher's time, the kept model last
    assert [(p["seconds"], p["step"]) for p in ours["curve"]] == [(0.7, 10), (1.5, 20), (2.3, 5), (3.5, steps[kept])]
    assert ours["curve"][-1]["bits_per_byte"] == ours["curve"][1 if kept == "teacher" else -1]["bits_per_byte"]
    result = {"settings": {"seconds": 60}, "corpora": {"c": {
        "reference": {"bits_per_byte": 2.0}, "ours": ours, "ratio": 0.5, "pair_ratio": 0.4}}}
    assert f"| 12.5 | 20 + 15 | {split['teacher']:.3f} | {split['student']:.3f} | {kept} |" in format_quality(result)
    summary["phases"]["folders_kept"] = False  # stopped before the working folders were removed: one model
    assert "phases" not in score_ours(QualitySettings(threads=1, curve_tokens=200), out, validation, summary)


def test_the_table_and_the_curves_come_from_the_results(tmp_path):
    side = {"bits_per_byte": 2.0, "steps": 10, "tokens_per_second": 1100.0,
            "curve": [{"seconds": 1.0, "bits_per_byte": 3.0}, {"seconds": 2.0, "bits_per_byte": 2.0}]}
    result = {"settings": {"seconds": 60, "num_threads": 2}, "corpora": {
        "builtin:kjv": {"reference": side, "ours": {**side, "bits_per_byte": 1.6, "steps": 20}, "ratio": 0.8}}}
    table = format_quality(result)
    assert "| `builtin:kjv` | 60 | 2.000 | 10 | 1,100 | 1.600 | 20 | 1,100 | 0.800x |" in table
    png = plot_curves(result, tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_splits_are_the_first_ninety_percent_and_the_rest(tmp_path):
    train, validation = write_splits("x" * 90 + "y" * 10, tmp_path)
    assert (train, validation) == ("x" * 90, "y" * 10)
    assert (tmp_path / "validation.txt").read_text() == "y" * 10


@pytest.mark.slow
def test_one_corpus_end_to_end_both_sides_alone_one_scorer(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(LINES * 3), encoding="utf-8")
    settings = QualitySettings(seconds=6, corpora=(str(corpus),), hidden=32, heads=2, layers=1, threads=1,
                               ours_args="--tokenizer_vocab_size 300 --block_size 32", curve_tokens=2000)
    result = run_quality(settings, log=lambda _: None, work=tmp_path / "work")
    figures = result["corpora"][str(corpus)]
    ours, ref = figures["ours"], figures["reference"]
    assert figures["first"] == "ours"  # the first corpus starts with ours; the next one with the reference
    assert figures["ratio"] == pytest.approx(ours["bits_per_byte"] / ref["bits_per_byte"])
    assert 0 < ours["bits_per_byte"] < 8 and 0 < ref["bits_per_byte"] < 8
    plan = ours["time_budget"]  # the plan runs whole, unless a busy worker slowed it into the clock cap past T
    assert (plan["ended_by"], ours["steps"]) == ("plan", plan["planned_steps"]) or \
        (plan["ended_by"] == "clock" and 0 < ours["steps"] < plan["planned_steps"])
    assert ours["train_seconds"] <= 6 * 1.05
    assert ref["train_seconds"] >= 6 and ref["steps"] > 0
    for side in (ours, ref):
        seconds = [p["seconds"] for p in side["curve"]]
        assert len(seconds) >= 3 and seconds == sorted(seconds) and side["load_average"] is not None
        assert side["curve"][-1]["bits_per_byte"] < side["curve"][0]["bits_per_byte"]  # it learned along the way
    assert Path(tmp_path / "work" / "corpus0" / "ours" / "model.safetensors").is_file()
