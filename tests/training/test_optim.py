"""The optimizer and the schedule (hf_minitx.training.optim): parameter groups, Muon + AdamW as one optimizer,
its checkpoint round trip, the warmup-stable-decay shape, and clear errors."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from torch import nn

from hf_minitx import MiniTxForCausalLM
from hf_minitx.training.arguments import TrainArguments
from hf_minitx.training.optim import (
    CombinedOptimizer,
    build_optimizer,
    build_scheduler,
    check_optimizer_arguments,
    describe_optimizer,
    describe_schedule,
    partition_parameters,
    schedule_factor,
    warmup_cut_warning,
)


def _model(make_config, **overrides) -> MiniTxForCausalLM:
    torch.manual_seed(0)
    return MiniTxForCausalLM(make_config(position_embedding_type="learned", **overrides))


def _groups(optimizer) -> dict[str, dict]:
    return {g["name"]: g for g in optimizer.param_groups}


@pytest.mark.parametrize("tied", [True, False])
def test_adamw_decays_matrices_and_an_untied_head_only(make_config, tied):
    model = _model(make_config, tie_word_embeddings=tied)
    args = TrainArguments(optimizer="adamw", learning_rate=3e-3, weight_decay=0.1)
    groups = _groups(build_optimizer(model, args))
    assert set(groups) == {"adamw_decay", "adamw_no_decay"}
    decayed = {id(p) for p in groups["adamw_decay"]["params"]}
    for name, param in model.named_parameters():
        expect = param.ndim == 2 and "embed" not in name and "norm" not in name
        assert (id(param) in decayed) == expect, name
    assert (groups["adamw_decay"]["weight_decay"], groups["adamw_no_decay"]["weight_decay"]) == (0.1, 0.0)
    assert {g["lr"] for g in groups.values()} == {3e-3}
    assert any(isinstance(m, nn.LayerNorm) for m in model.modules())


@pytest.mark.parametrize("tied", [True, False])
def test_muon_takes_the_hidden_matrices_and_adamw_the_rest_each_parameter_once(make_config, tied):
    model = _model(make_config, tie_word_embeddings=tied)
    args = TrainArguments(optimizer="muon", learning_rate=3e-3, muon_learning_rate=0.05, weight_decay=0.1,
                          muon_weight_decay=0.01)
    optimizer = build_optimizer(model, args)
    assert isinstance(optimizer, CombinedOptimizer)
    assert isinstance(optimizer.parts["muon"], torch.optim.Muon)
    assert isinstance(optimizer.parts["adamw"], torch.optim.AdamW)
    groups = _groups(optimizer)
    ids = [id(p) for g in optimizer.param_groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())  # every parameter exactly once
    by_id = {id(p): name for name, p in model.named_parameters()}
    muon = {by_id[id(p)] for p in groups["muon"]["params"]}
    assert muon and all("embed" not in n and "norm" not in n and "lm_head" not in n for n in muon)
    assert all(model.get_parameter(n).ndim == 2 for n in muon)
    assert (groups["muon"]["lr"], groups["muon"]["weight_decay"]) == (0.05, 0.01)
    assert groups["adamw_no_decay"]["lr"] == 3e-3 and groups["adamw_no_decay"]["weight_decay"] == 0.0
    head = [by_id[id(p)] for p in groups.get("adamw_head", {"params": []})["params"]]
    assert head == ([] if tied else ["lm_head.weight"])
    if not tied:
        assert groups["adamw_head"]["weight_decay"] == 0.1


def test_described_groups_count_every_parameter(make_config):
    model = _model(make_config, tie_word_embeddings=False)
    records = describe_optimizer(build_optimizer(model, TrainArguments(optimizer="muon")))
    assert [r["optimizer"] for r in records] == ["Muon", "AdamW", "AdamW"]
    assert sum(r["parameters"] for r in records) == sum(p.numel() for p in model.parameters())
    assert records[0]["learning_rate"] == TrainArguments().muon_learning_rate
    assert records[0]["momentum"] == TrainArguments().muon_momentum  # the whole recipe is on record
    assert records[1]["betas"] == [TrainArguments().adam_beta1, TrainArguments().adam_beta2]


def _step(model, optimizer, seed):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, model.config.vocab_size, (2, 8), generator=generator)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_combined_state_round_trips_so_training_continues_identically(make_config):
    args = TrainArguments(optimizer="muon", learning_rate=1e-2)
    model = _model(make_config, tie_word_embeddings=False)
    optimizer = build_optimizer(model, args)
    scheduler = build_scheduler(optimizer, replace(args, warmup_steps=1), 10)
    for seed in range(3):
        _step(model, optimizer, seed)
        scheduler.step()
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), torch.load(_save(optimizer), weights_only=False)
    assert set(saved_opt) == {"muon", "adamw"} and saved_opt["muon"]["state"]  # Muon's momentum buffers are kept
    for seed in (3, 4):
        _step(model, optimizer, seed)

    other = _model(make_config, tie_word_embeddings=False)
    other.load_state_dict(saved_model)
    restored = build_optimizer(other, args)
    restored.load_state_dict(saved_opt)
    for group, stored in zip(restored.param_groups, optimizer.param_groups, strict=True):
        group["lr"] = stored["lr"]  # the scheduler's state is restored separately
    for seed in (3, 4):
        _step(other, restored, seed)
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="another --optimizer"):
        restored.load_state_dict({"adamw": saved_opt["adamw"]})


def _save(optimizer):
    import io

    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    return buffer


def test_warmup_stable_decay_warms_up_holds_then_decays_linearly(make_config):
    args = TrainArguments(optimizer="muon", lr_scheduler_type="warmup_stable_decay", warmup_steps=10,
                          decay_ratio=0.25, min_lr_ratio=0.1, learning_rate=2e-3, muon_learning_rate=0.04)
    optimizer = build_optimizer(_model(make_config), args)
    scheduler = build_scheduler(optimizer, args, 100)
    lrs = []
    for _ in range(100):
        lrs.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    muon = [lr[0] for lr in lrs]
    assert muon[0] == pytest.approx(0.1 * 0.04) and muon[5] == pytest.approx(0.04 * (0.1 + 0.9 * 0.5))
    assert all(lr == pytest.approx(0.04) for lr in muon[10:75])  # stable: warmup 10, decay the last 25
    assert muon[75 + 10] == pytest.approx(0.04 * (0.1 + 0.9 * (1 - 10 / 25)))  # linear decay
    assert muon[99] > 0.04 * 0.1 and muon[99] < muon[98]
    assert all(abs(a[-1] / a[0] - 2e-3 / 0.04) < 1e-9 for a in lrs)  # every group follows from its own peak
    assert describe_schedule(args, 100) == {"type": "warmup_stable_decay", "warmup_steps": 10, "total_steps": 100,
                                            "decay_steps": 25, "decay_ratio": 0.25, "min_lr_ratio": 0.1}


def test_a_warmup_cut_short_is_recorded_as_run_with_the_asked_value_beside_it():
    args = TrainArguments(optimizer="muon", lr_scheduler_type="warmup_stable_decay", warmup_steps=50,
                          decay_ratio=0.5)
    record = describe_schedule(args, 60)  # 30 decay steps leave room for 30 of the 50 warmup steps
    assert (record["warmup_steps"], record["warmup_steps_asked"], record["decay_steps"]) == (30, 50, 30)
    factor = schedule_factor(args, 60)
    assert factor(29) < 1.0 and factor(30) == pytest.approx(1.0)  # the peak is reached where the record says
    assert "warmup_steps_asked" not in describe_schedule(args, 200)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant_with_warmup", "inverse_sqrt"])
def test_a_warmup_longer_than_the_run_is_recorded_and_warned_with_the_rates_unchanged(schedule):
    args = TrainArguments(optimizer="adamw", lr_scheduler_type=schedule, warmup_steps=500)
    record = describe_schedule(args, 4)  # the asked ramp runs: it is recorded, with the peak never reached
    assert record == {"type": schedule, "warmup_steps": 500, "total_steps": 4, "peak_reached": False}
    assert "never reaches its peak" in warmup_cut_warning(record) and "--warmup_steps 500" in warmup_cut_warning(record)
    factor = schedule_factor(args, 4)
    assert [factor(step) for step in range(4)] == pytest.approx([0, 1 / 500, 2 / 500, 3 / 500])  # the asked ramp
    long_run = describe_schedule(args, 1000)
    assert "peak_reached" not in long_run and warmup_cut_warning(long_run) is None
    wsd = describe_schedule(replace(args, lr_scheduler_type="warmup_stable_decay", decay_ratio=0.5), 60)
    assert "is cut to 30: the run has 60 steps and decays over the last 30" in warmup_cut_warning(wsd)


def test_partition_puts_norms_embeddings_and_biases_out_of_decay(make_config):
    model = _model(make_config, tie_word_embeddings=False)
    kinds = partition_parameters(model)
    assert sum(len(v) for v in kinds.values()) == len(list(model.parameters()))
    assert all(p.ndim == 2 for p in kinds["matrices"]) and kinds["head"] == [model.lm_head.weight]


@pytest.mark.parametrize(("change", "message"), [
    ({"optimizer": "sgd"}, "--optimizer 'sgd' is not known"),
    ({"muon_learning_rate": 0.0}, "--muon_learning_rate must be > 0"),
    ({"decay_ratio": 1.5}, "--decay_ratio must be in"),
    ({"muon_momentum": 1.0}, "--muon_momentum must be in"),
])
def test_bad_optimizer_arguments_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        check_optimizer_arguments(replace(TrainArguments(), **change))


def test_muon_step_is_torchs_muon_with_float32_orthogonalisation(monkeypatch):
    import torch.optim._muon as torch_muon

    from hf_minitx.training.optim import Muon, newton_schulz

    # torch orthogonalises in bfloat16; given the same float32 iteration, its step and ours are the same
    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz",
                        lambda grad, coefficients, steps, eps: newton_schulz(grad.float(), coefficients, steps, eps))
    torch.manual_seed(0)
    ours, theirs = (nn.Parameter(torch.randn(48, 16)) for _ in range(2))
    theirs.data.copy_(ours.data)
    opt_ours = Muon([ours], lr=0.02, weight_decay=0.1)
    opt_theirs = torch.optim.Muon([theirs], lr=0.02, weight_decay=0.1)
    for _ in range(3):
        grad = torch.randn(48, 16)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        opt_ours.step()
        opt_theirs.step()
    assert torch.equal(ours, theirs)
    buffers = [opt.state_dict()["state"][0]["momentum_buffer"] for opt in (opt_ours, opt_theirs)]
    assert buffers[0].equal(buffers[1])
    singular = torch.linalg.svdvals(newton_schulz(torch.randn(64, 24), (3.4445, -4.775, 2.0315), 5, 1e-7))
    assert singular.min() > 0.5 and singular.max() < 1.5  # semi-orthogonal, up to the iteration's slack


@pytest.mark.parametrize("shape", [(24, 96), (96, 24), (24, 40), (40, 40)])
def test_newton_schulz_on_the_gram_matrix_is_the_plain_iteration(shape):
    from hf_minitx.training.optim import newton_schulz

    a, b, c = coefficients = (3.4445, -4.775, 2.0315)
    torch.manual_seed(0)
    matrix = torch.randn(*shape, dtype=torch.float64) * torch.logspace(-2, 0, shape[1], dtype=torch.float64)
    x = matrix.T if shape[0] > shape[1] else matrix
    x = x / x.norm()
    for _ in range(5):  # X <- aX + (bA + cA^2)X, A = XX^T, written plainly
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    expected = x.T if shape[0] > shape[1] else x
    torch.testing.assert_close(newton_schulz(matrix, coefficients, 5, 1e-7), expected)
    torch.testing.assert_close(newton_schulz(matrix.float(), coefficients, 5, 1e-7), expected.float(),
                               atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", [(24, 96), (96, 24), (40, 40)])
def test_a_stack_of_matrices_is_orthogonalised_like_each_matrix_alone(shape):
    from hf_minitx.training.optim import newton_schulz

    coefficients = (3.4445, -4.775, 2.0315)
    torch.manual_seed(0)
    stack = torch.randn(5, *shape) * torch.logspace(-2, 1, 5)[:, None, None]  # each matrix its own scale
    together = newton_schulz(stack, coefficients, 5, 1e-7)
    assert together.shape == stack.shape
    for matrix, got in zip(stack, together, strict=True):
        torch.testing.assert_close(got, newton_schulz(matrix, coefficients, 5, 1e-7), atol=1e-5, rtol=1e-4)


def test_muon_orthogonalises_same_shaped_matrices_together_with_the_same_result():
    from hf_minitx.training.optim import Muon

    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(*shape)) for shape in [(16, 16), (16, 48), (16, 16), (48, 16), (16, 48)]]
    alone = [nn.Parameter(p.detach().clone()) for p in params]
    together, one_by_one = Muon(params, lr=0.02), [Muon([p], lr=0.02) for p in alone]
    for _ in range(3):
        for p, q in zip(params, alone, strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        together.step()
        for optimizer in one_by_one:
            optimizer.step()
    for p, q in zip(params, alone, strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


def test_newton_schulz_stays_bounded_on_rank_one_updates_at_any_number_of_steps():
    """The Gram form's rounding grows in the null directions with each step: it is used for up to 5 steps
    (close to the exact iteration even for a rank-1 update), the plain form beyond."""
    from hf_minitx.training.optim import GRAM_MAX_STEPS, newton_schulz

    coefficients = (3.4445, -4.775, 2.0315)
    torch.manual_seed(0)
    update = torch.randn(32, 1) @ torch.randn(1, 128)  # rank 1: all but one singular value are zero
    x = update.double() / update.double().norm()
    for steps in range(1, 13):
        gram = x @ x.T
        x = coefficients[0] * x + (coefficients[1] * gram + coefficients[2] * gram @ gram) @ x
        got = newton_schulz(update, coefficients, steps, 1e-7).double()
        assert torch.isfinite(got).all() and got.abs().max() < 1.0, steps  # the Gram form gave NaN at 10 steps
        if steps <= GRAM_MAX_STEPS:  # beyond, even the plain float32 form drifts from the exact iterate
            assert (got - x).abs().max() <= 3e-3 * x.abs().max(), steps


def test_the_schedule_reaches_both_parts_after_accelerate_prepares_and_reloads_them(make_config):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    args = TrainArguments(optimizer="muon", warmup_steps=4, learning_rate=1e-3, muon_learning_rate=0.02)
    model = _model(make_config)
    optimizer = build_optimizer(model, args)
    scheduler = build_scheduler(optimizer, args, 10)  # built before prepare, as the training loop does
    model, prepared = Accelerator(cpu=True).prepare(model, optimizer)  # prepare reloads the state: new group dicts
    prepared.load_state_dict(prepared.state_dict())
    for step in range(1, 4):
        prepared.step()
        scheduler.step()
        used = {name: part.param_groups[0]["lr"] for name, part in optimizer.parts.items()}
        assert used == pytest.approx({"muon": 0.02 * step / 4, "adamw": 1e-3 * step / 4})


def test_gpt2_style_preset_brings_back_adamw_and_cosine_under_the_command_line(tmp_path):
    import json

    from hf_minitx.training.arguments import parse_training_args, preset_training
    from hf_minitx.training.model_presets import load_preset

    model_args, _, train = parse_training_args(["--preset", "gpt2-style"])
    assert (train.optimizer, train.lr_scheduler_type, train.learning_rate, train.warmup_steps) == (
        "adamw", "cosine", 1e-3, 100)
    assert load_preset("gpt2-style")["position_embedding_type"] == "learned"  # the training key is not a config field
    _, _, train = parse_training_args(["--preset", "gpt2-style", "--learning_rate", "0.004"])
    assert (train.optimizer, train.learning_rate) == ("adamw", 0.004)  # the command line wins
    args_file = tmp_path / "run.json"
    args_file.write_text(json.dumps({"preset": "gpt2-style", "warmup_steps": 7}))
    _, _, train = parse_training_args([str(args_file)])
    assert (train.optimizer, train.warmup_steps) == ("adamw", 7)  # so does an arguments file
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hidden_size": 32, "training": {"optimiser": "adamw"}}))
    with pytest.raises(ValueError, match="unknown training argument.*optimiser"):
        preset_training(str(bad))


def test_groups_with_the_modern_architecture_options(make_config):
    model = _model(make_config, norm_type="rmsnorm", qk_norm=True, hidden_act="swiglu", tie_word_embeddings=False,
                   zero_init_head=True)
    optimizer = build_optimizer(model, TrainArguments(optimizer="muon"))
    groups = {g["name"]: {n for n, p in model.named_parameters() if any(p is q for q in g["params"])}
              for g in optimizer.param_groups}
    assert sum(len(names) for names in groups.values()) == len(list(model.parameters()))
    assert any("gate_proj" in n for n in groups["muon"]) and any("q_norm" in n for n in groups["adamw_no_decay"])
    assert not any("norm" in n or "embed" in n for n in groups["muon"]) and groups["adamw_head"] == {"lm_head.weight"}


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_embedding_weight_decay_is_a_group_of_the_tables_only_when_set(make_config, optimizer):
    model = _model(make_config)  # tied: the head is the token table
    plain = _groups(build_optimizer(model, TrainArguments(optimizer=optimizer)))
    assert "adamw_embeddings" not in plain  # the groups (and checkpoints) of a run without it are unchanged
    assert any(p is model.get_input_embeddings().weight for p in plain["adamw_no_decay"]["params"])
    groups = _groups(build_optimizer(model, TrainArguments(optimizer=optimizer, embedding_weight_decay=0.3)))
    tables = {n for n, p in model.named_parameters() if any(p is q for q in groups["adamw_embeddings"]["params"])}
    assert tables == {"model.decoder.embed_tokens.weight", "model.decoder.embed_positions.weight"}  # learned positions
    assert groups["adamw_embeddings"]["weight_decay"] == 0.3 and groups["adamw_no_decay"]["weight_decay"] == 0.0
    assert not any(p.ndim == 2 for p in groups["adamw_no_decay"]["params"])
    with pytest.raises(ValueError, match="--embedding_weight_decay must be >= 0"):
        check_optimizer_arguments(TrainArguments(embedding_weight_decay=-0.1))


def test_cautious_decay_shrinks_only_the_entries_the_update_moves_toward_zero():
    from hf_minitx.training.optim import decay_weight

    param = torch.tensor([[1.0, -2.0], [3.0, -4.0]])
    update = torch.tensor([[0.5, 0.5], [-0.5, -0.5]])  # subtracted: agrees with the weight's sign at (0,0), (1,1)
    plain, cautious = param.clone(), param.clone()
    decay_weight(plain, update, 0.1, cautious=False)
    decay_weight(cautious, update, 0.1, cautious=True)
    assert torch.allclose(plain, param * 0.9)
    assert torch.allclose(cautious, torch.tensor([[0.9, -2.0], [3.0, -3.6]]))


def test_muon_with_cautious_decay_differs_from_plain_decay_only_by_the_masked_entries(make_config):
    results = {}
    for cautious in (False, True):
        model = _model(make_config)
        args = TrainArguments(optimizer="muon", muon_weight_decay=0.5, cautious_weight_decay=cautious)
        optimizer = build_optimizer(model, args)
        assert optimizer.parts["muon"].param_groups[0]["cautious"] is cautious
        _step(model, optimizer, seed=0)
        results[cautious] = {n: p.detach().clone() for n, p in model.named_parameters()}
    changed = {n for n in results[True] if not torch.equal(results[True][n], results[False][n])}
    assert changed and all(n.endswith("proj.weight") or "fc" in n for n in changed)  # the Muon matrices only
    name = sorted(changed)[0]
    assert (results[True][name].abs() >= results[False][name].abs() - 1e-7).all()  # decayed less, never more
