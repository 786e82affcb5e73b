"""The model a time budget buys (hf_minitx.training.shape_plan): with --max_minutes and no preset or shape, the run
times candidate shapes and takes the largest its budget and corpus can feed; the choice is recorded, and a resumed
run keeps it. And what else a user's budget run does by default: it evaluates every quarter of its plan."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_budget import TickingClock
from test_budget_resume import Killed, _reset_accelerate
from test_train import _fresh_accelerate_state, text_file  # noqa: F401  (fixtures)

from hf_minitx.training import checkpoints, loop, shape_plan
from hf_minitx.training.arguments import DataArguments, ModelArguments, TrainArguments
from hf_minitx.training.shape_plan import (
    SHAPES,
    TOKENS_PER_PARAMETER,
    Shape,
    effective_tokens,
    plan_shape,
    plans_shape,
)

SETTINGS = {"vocab_size": 300, "max_position_embeddings": 64, "position_embedding_type": "rope",
            "norm_type": "rmsnorm", "hidden_act": "relu2", "qk_norm": True}


@pytest.fixture
def timed(monkeypatch):
    """A machine where a step costs in proportion to the shape's multiply-adds (a model's parameters are its real
    count): the rule, not the clock, is under test. Yields the shapes timed."""
    calls = []

    def timing(settings, shape, train_args, block_size, device):
        calls.append(shape)
        parameters = shape_plan.non_embedding_parameters(shape_plan.MiniTxForCausalLM(
            shape_plan.MiniTxConfig(**{**settings, **shape.settings(settings["hidden_act"])})))
        return 2e-6 * shape.layers * shape.hidden ** 2, parameters

    monkeypatch.setattr(shape_plan, "time_shape", timing)
    return calls


def _choose(minutes: float, corpus_tokens: int) -> shape_plan.ShapePlan:
    args = TrainArguments(max_minutes=minutes)
    batches = math.ceil(corpus_tokens / (args.per_device_train_batch_size * 128))
    return plan_shape(SETTINGS, args, 128, batches, corpus_tokens, device="cpu")


def test_a_longer_budget_or_a_larger_corpus_buys_a_larger_model(timed):
    small, large = _choose(10, 100_000), _choose(10, 5_000_000)
    assert SHAPES.index(large.chosen) > SHAPES.index(small.chosen)
    short = _choose(1, 500_000)
    timed.clear()
    long = _choose(30, 500_000)
    assert SHAPES.index(long.chosen) > SHAPES.index(short.chosen)
    record = long.record()
    assert record["chosen"] == long.chosen.name and record["settings"]["hidden_size"] == long.chosen.hidden
    chosen = next(c for c in record["candidates"] if c["shape"] == long.chosen.name)
    assert chosen["tokens_per_parameter"] >= TOKENS_PER_PARAMETER
    assert record["candidates"][-1]["tokens_per_parameter"] < TOKENS_PER_PARAMETER  # the timing stopped there
    assert len(timed) == len(record["candidates"]) < len(SHAPES)  # larger ones were never built


def test_the_rule_says_so_when_no_candidate_meets_it(timed):
    starved = _choose(0.05, 100_000_000).record()  # seconds for a huge corpus: every shape sees too few tokens
    assert starved["chosen"] == SHAPES[0].name
    assert starved["candidates"][0]["tokens_per_parameter"] < TOKENS_PER_PARAMETER
    assert starved["rule"].startswith("the smallest candidate: none was planned to see at least")
    assert _choose(10, 500_000).record()["rule"].startswith("the largest candidate planned to see at least")


def test_max_steps_or_num_epochs_bound_the_steps_a_budget_plans_its_shape_for(timed):
    batches = math.ceil(500_000 / (8 * 128))

    def plan(**bound):
        return plan_shape(SETTINGS, TrainArguments(max_minutes=30, **bound), 128, batches, 500_000, device="cpu")

    free, capped, one_pass = plan(), plan(max_steps=50), plan(num_epochs=1.0)
    assert all(c["planned_steps"] == 50 for c in capped.candidates)
    assert all(c["planned_steps"] <= batches and c["planned_passes"] <= 1.0 for c in one_pass.candidates)
    assert SHAPES.index(capped.chosen) < SHAPES.index(free.chosen)  # fewer tokens buy a smaller model
    both = plan(max_steps=5000, num_epochs=1.0)  # --max_steps wins over --num_epochs, as it does for the run
    assert both.candidates[0]["planned_steps"] == 5000 > batches  # the smallest shape: time for more than that


def test_repeated_tokens_are_worth_less_than_new_ones():
    assert effective_tokens(0.5, 1000) == 500 and effective_tokens(1.0, 1000) == 1000
    assert 6_500 < effective_tokens(8.0, 1000) < 6_700  # eight passes are worth about 6.6 (Muennighoff et al.)
    assert effective_tokens(100.0, 1000) < 1000 * 16.4 < 1000 * 100  # one model's ceiling, about 16 passes' worth


@pytest.mark.parametrize(("model", "data", "train", "expected"), [
    ({}, {}, {"max_minutes": 3}, True),
    ({"preset": "tiny"}, {}, {"max_minutes": 3}, False),
    ({"config_overrides": "hidden_size=96"}, {}, {"max_minutes": 3}, False),
    ({"config_overrides": "hidden_dropout=0.1"}, {}, {"max_minutes": 3}, True),  # not a shape
    ({}, {}, {}, False),  # no budget: tiny, as ever
    ({}, {"task": "seq2seq"}, {"max_minutes": 3}, False),
])
def test_only_a_budget_without_a_preset_or_a_shape_plans_the_shape(model, data, train, expected):
    assert plans_shape(ModelArguments(**model), DataArguments(**data), TrainArguments(**train)) is expected


def test_time_shape_times_a_real_step_and_leaves_the_rng_alone():
    import torch

    torch.manual_seed(3)
    before = torch.rand(1)
    torch.manual_seed(3)
    seconds, parameters = shape_plan.time_shape(SETTINGS, Shape(1, 32, 2), TrainArguments(), 16, "cpu")
    assert torch.equal(torch.rand(1), before) and seconds > 0
    shape = Shape(1, 32, 2).settings(SETTINGS["hidden_act"])
    model = shape_plan.MiniTxForCausalLM(shape_plan.MiniTxConfig(**{**SETTINGS, **shape}))
    total = sum(p.numel() for p in model.parameters())
    assert parameters == total - 300 * 32 > 6 * 32 * 32  # the token table left out; q/k/v/o, fc1/fc2 and norms in


SMALL = (Shape(1, 16, 2), Shape(2, 32, 2), Shape(2, 48, 2))


def planned_args(text_file: Path, out: Path, *extra: str) -> list[str]:  # noqa: F811
    """A run with a budget, no preset and no shape: the plan chooses among SMALL."""
    return ["--task", "causal-lm", "--dataset", str(text_file), "--config_overrides", "max_position_embeddings=64",
            "--tokenizer_vocab_size", "300", "--block_size", "32", "--output_dir", str(out), "--max_minutes", "0.1",
            "--logging_steps", "1", "--eval_steps", "0", "--max_eval_samples", "16", "--num_sample_generations", "0",
            "--disable_tqdm", "--num_threads", "1", *extra]


def test_a_planned_run_records_its_choice_and_a_resume_keeps_it(text_file, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(shape_plan, "SHAPES", SMALL)
    monkeypatch.setattr(shape_plan, "time_shape", lambda settings, shape, *a: (
        {16: 0.001, 32: 0.002, 48: 0.5}[shape.hidden], 1000 * shape.hidden))  # 48 wide: too slow for the budget
    out = tmp_path / "run"
    real_time, real_rotate = loop.time, checkpoints.rotate_checkpoints

    def rotate_then_die(*args, **kwargs):
        real_rotate(*args, **kwargs)
        raise Killed

    loop.time, checkpoints.rotate_checkpoints = TickingClock(0.004), rotate_then_die
    try:
        _reset_accelerate()
        with pytest.raises(Killed):
            loop.main(planned_args(text_file, out, "--checkpointing_steps", "30"))
    finally:
        loop.time, checkpoints.rotate_checkpoints = real_time, real_rotate
        _reset_accelerate()
    state = json.loads((out / "checkpoint-30" / "run_state.json").read_text())
    assert state["shape_plan"]["chosen"] == "2 x 32"
    # timed again, the 48-wide shape would now fit: the resumed run keeps the shape its checkpoint chose
    monkeypatch.setattr(shape_plan, "time_shape", lambda *a: pytest.fail("a resumed run times no shape"))
    loop.time = TickingClock(0.004)
    resumed = planned_args(text_file, out, "--resume_from_checkpoint", "latest")
    del resumed[resumed.index("--max_minutes"):resumed.index("--max_minutes") + 2]  # the recorded budget goes on
    try:
        loop.main(resumed)
    finally:
        loop.time = real_time
    summary = json.loads((out / "training_summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert summary["shape_plan"]["chosen"] == "2 x 32" and summary["preset"] is None
    assert [c["shape"] for c in summary["shape_plan"]["candidates"]] == ["1 x 16", "2 x 32", "2 x 48"]
    # the default's SwiGLU feed-forward at the parameters of an ungated one as wide as the model
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (32, 2, 22)
    assert config["hidden_act"] == "swiglu" and config["attention_bias"] is False
    card = (out / "README.md").read_text()
    assert "2 x 32" in card and "chosen by the time budget" in card


@pytest.mark.parametrize(("given", "minutes", "expected"), [(None, 3.0, 0.25), (None, None, 200), (0, 3.0, 0),
                                                            (50, 3.0, 50)])
def test_a_budget_evaluates_every_quarter_of_its_plan_unless_told(given, minutes, expected):
    from hf_minitx.training.run_plan import default_eval_steps

    args = TrainArguments(eval_steps=given, max_minutes=minutes)
    default_eval_steps(args)
    assert args.eval_steps == expected


@pytest.mark.parametrize("shape", shape_plan.SHAPES, ids=lambda shape: shape.name)
def test_a_gated_feed_forward_gets_the_parameters_of_the_ungated_one(shape):
    """The default's SwiGLU candidates carry ReLU^2's feed-forward parameters (the ratio was measured with those)."""
    relu2, swiglu = shape.settings("relu2"), shape.settings("swiglu")
    assert relu2["intermediate_size"] == shape.hidden and swiglu["intermediate_size"] % 2 == 0
    ungated, gated = 2 * shape.hidden * relu2["intermediate_size"], 3 * shape.hidden * swiglu["intermediate_size"]
    assert abs(gated - ungated) <= 3 * shape.hidden  # within one unit of the even size


def test_the_default_blocks_are_qwen3s_and_export():
    from hf_minitx.hub.export import mapping_problems
    from hf_minitx.training.arguments import DEFAULT_PRESET
    from hf_minitx.training.model_presets import load_preset

    default = shape_plan.MiniTxConfig(**load_preset(DEFAULT_PRESET))
    assert (default.hidden_act, default.attention_bias, default.qk_norm) == ("swiglu", False, True)
    assert default.intermediate_size == Shape(2, 64, 2).settings("swiglu")["intermediate_size"]
    assert mapping_problems(default, "qwen3") == []


def test_a_width_given_by_hand_gets_the_default_feed_forward_for_it_unless_one_is_given():
    from hf_minitx.training.run_plan import resolve_model_settings

    def settings(preset, overrides):
        return resolve_model_settings(ModelArguments(preset=preset, config_overrides=overrides), DataArguments())

    preset_width = settings(None, None)["intermediate_size"]
    assert settings(None, "hidden_size=96,num_attention_heads=3")["intermediate_size"] == 64  # 2/3 of 96: gated
    assert settings(None, "hidden_size=96,num_attention_heads=3,intermediate_size=200")["intermediate_size"] == 200
    assert settings(None, "hidden_size=96,num_attention_heads=3,hidden_act=relu2")["intermediate_size"] == 96
    assert settings(None, "num_hidden_layers=3")["intermediate_size"] == preset_width  # the width is the preset's
    assert settings("tiny", "hidden_size=96,num_attention_heads=3")["intermediate_size"] == settings(
        "tiny", None)["intermediate_size"]  # a preset named by hand keeps its own


@pytest.mark.slow
def test_a_run_started_with_the_presets_feed_forward_resumes_with_it(text_file, tmp_path):  # noqa: F811
    """A checkpoint of a run from before the feed-forward followed a width given by hand holds the preset's size:
    the same command resumes it, with that size."""
    out = tmp_path / "old"

    def args(overrides: str, *extra: str) -> list[str]:
        return ["--task", "causal-lm", "--dataset", str(text_file), "--config_overrides",
                f"hidden_size=32,num_attention_heads=2,max_position_embeddings=64{overrides}", "--tokenizer_vocab_size",
                "300",
                "--block_size", "32", "--output_dir", str(out), "--eval_steps", "0", "--max_eval_samples", "16",
                "--num_sample_generations", "0", "--disable_tqdm", "--num_threads", "1", "--checkpointing_steps",
                "2", *extra]

    loop.main(args(",intermediate_size=42", "--max_steps", "2"))  # what such a run trained: the preset's 42
    _reset_accelerate()
    loop.main(args("", "--max_steps", "3", "--resume_from_checkpoint", "latest"))  # now derived: 22, recorded: 42
    assert json.loads((out / "config.json").read_text())["intermediate_size"] == 42
    assert json.loads((out / "training_summary.json").read_text())["steps"] == 3
