"""A time budget as a plan in steps (--max_minutes), and the best model by validation (--load_best_model_at_end)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import KILL_AFTER_FIRST_CHECKPOINT, assert_same_weights, free_port, tiny_causal
from safetensors.torch import load_file
from test_train import _fresh_accelerate_state, causal_args, records, text_file  # noqa: F401  (fixtures)

from hf_minitx.training.arguments import TrainArguments
from hf_minitx.training.best import BestWeights
from hf_minitx.training.budget import GRACE, MARGIN, MIN_OVERDUE, TimeBudget, every
from hf_minitx.training.end_of_run import keep_best
from hf_minitx.training.loop import main
from hf_minitx.training.optim import build_optimizer, build_scheduler, relay_schedule
from hf_minitx.training.run_length import ADVICE_SLACK
from hf_minitx.training.state import FitOutcome, RunState

REPO = Path(__file__).resolve().parents[2]


def summary_of(folder: Path) -> dict:
    return json.loads((folder / "training_summary.json").read_text())


# --- the plan ----------------------------------------------------------------------------------------


def test_the_plan_fits_the_steps_and_evaluations_in_what_is_left_of_the_budget():
    budget = TimeBudget(100.0, eval_steps=50)
    steps = budget.steps_that_fit(done=20, elapsed=10.0, step_seconds=0.1, eval_seconds=2.0)
    assert steps == 20 + int((100 * (1 - MARGIN) - 10) / (0.1 + 2.0 / 50))  # an evaluation's time every 50 steps
    fitting = TimeBudget(100.0, eval_steps=0.25).steps_that_fit(20, 10.0, 0.1, 2.0)
    assert fitting == 20 + int((100 * (1 - MARGIN) - 10 - 4 * 2.0) / 0.1)
    assert TimeBudget(100.0, step_cap=50).steps_that_fit(10, 10.0, 0.1, 0.0) == 50  # --max_steps bounds the plan
    assert TimeBudget(5.0).steps_that_fit(20, 10.0, 0.1, 0.0) == 20  # the probe ate the budget


def test_the_probe_keeps_its_untimed_first_steps_apart_as_the_processs_start_up():
    from hf_minitx.training.budget import TIMED_FROM, Probe

    probe = Probe.window(TimeBudget(60.0), 0)
    costs = [2.0, 0.5] + [0.1] * (probe.last - 2)
    assert not any(probe.timed(step, cost) for step, cost in enumerate(costs[:-1], start=1))
    assert probe.timed(probe.last, costs[-1])
    assert probe.untimed == pytest.approx(sum(costs[:TIMED_FROM]))
    assert probe.seconds_per_step == pytest.approx(0.1)


@pytest.mark.parametrize("checkpoint, evaluation", [(True, 0.0), (True, 21.0), (False, 21.0)])
def test_the_budget_advised_after_the_probe_ran_out_leaves_room_for_a_plan(tmp_path, checkpoint, evaluation):
    """A budget that ran out after 19 steps of 0.45 s and an evaluation: a resume counts the seconds already trained
    and times a probe of its own, a new run times the probe and the evaluation again, and either starts up again
    (its first steps, 1.5 s here); the advised budget leaves steps to decay in after all that."""
    from hf_minitx.training.run_length import refuse_unplanned_budget

    budget = TimeBudget(30.0, eval_steps=50, seconds_per_evaluation=evaluation or None, startup_seconds=1.5)
    state = SimpleNamespace(step=19, train_seconds=19 * 0.45)
    run = SimpleNamespace(budget=budget, checkpoint_fields={}, output_dir=tmp_path,
                          accelerator=SimpleNamespace(num_processes=1))
    outcome = SimpleNamespace(stopped_by_time_budget=True,
                              checkpoint=tmp_path / "checkpoint-19" if checkpoint else None)
    with pytest.raises(ValueError) as refused:
        refuse_unplanned_budget(run, state, outcome)
    said = str(refused.value)
    assert ("of about 0.45 s and an evaluation of 21.0 s, inside" in said) == bool(evaluation)
    minutes = float(said.split("--max_minutes ")[2].split()[0])
    assert minutes > budget.seconds / 60  # never the budget that just ran out
    assert ("--resume_from_checkpoint latest --max_minutes" in said) == checkpoint
    done, spent = (19, state.train_seconds) if checkpoint else (0, 0.0)
    spent += 1.5 + budget.probe_steps * 0.45 + 2 * evaluation  # the start-up, probe, evaluations of the run after
    assert TimeBudget(minutes * 60).steps_that_fit(  # and as many steps again
        done + budget.probe_steps, spent, 0.45, 0.0) >= done + 2 * budget.probe_steps


def test_a_stable_phase_is_timed_twice_and_the_second_plan_keeps_the_decay_ahead():
    budget = TimeBudget(100.0, decay_ratio=0.3)
    assert budget.plan(20, 900, 0.1, 0.0) == 900 and not budget.fixed  # timed again, up to half the plan
    window = budget.second_window(20)
    assert (window.first_timed, window.last) == (180, 450)  # from a fifth of the plan: the machine has settled
    assert budget.plan(450, 800, 0.11, 0.0) == 800 and budget.fixed
    slow = TimeBudget(100.0, decay_ratio=0.3)
    slow.plan(20, 900, 0.1, 0.0)
    assert slow.plan(450, 500, 0.4, 0.0) == math.ceil(451 / 0.7)  # the decay had not started at step 450
    once = TimeBudget(100.0)  # cosine and linear: the rate depends on the length at once, one plan
    assert once.plan(20, 900, 0.1, 0.0) == 900 and once.fixed


@pytest.mark.parametrize("kind", ["warmup_stable_decay", "cosine", "linear"])
def test_a_schedule_relaid_after_the_probe_is_the_schedule_of_the_planned_length(kind):
    args = replace(TrainArguments(output_dir="unused"), lr_scheduler_type=kind, warmup_steps=20)
    model = tiny_causal()
    planned = build_scheduler(build_optimizer(model, args), args, 300)
    relaid = build_scheduler(build_optimizer(model, args), args, 10**9)  # the provisional length
    rates = []
    for step in range(300):
        if step == 20:  # the probe ends inside warmup: nothing so far depended on the length
            relay_schedule(relaid, args, 300)
        assert relaid.get_last_lr() == pytest.approx(planned.get_last_lr(), rel=1e-12), step
        rates.append(planned.get_last_lr()[0])
        for scheduler in (planned, relaid):
            scheduler.optimizer.step()
            scheduler.step()
    assert relaid.get_last_lr() == pytest.approx(planned.get_last_lr(), rel=1e-12)
    assert rates[-1] < 0.05 * max(rates)  # the decay reaches the end of the planned steps


class TickingClock:
    """A clock that advances a fixed amount at every reading: each step costs the same, as on a quiet machine."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now

    def __getattr__(self, name: str):
        import time

        return getattr(time, name)


@pytest.mark.slow
def test_max_minutes_decays_to_the_final_rate_before_the_budget_ends(text_file, tmp_path, monkeypatch):  # noqa: F811
    from hf_minitx.training import loop

    monkeypatch.setattr(loop, "time", TickingClock(0.002))  # every step reads the clock the same number of times
    out = tmp_path / "timed"
    main(causal_args(text_file, out, "--max_minutes", "0.1", "--optimizer", "adamw", "--learning_rate", "3e-3"))
    summary = summary_of(out)
    plan = summary["time_budget"]
    assert plan["ended_by"] == "plan" and plan["planned_steps"] == plan["steps_run"] == summary["steps"]
    assert plan["planned_steps"] > plan["probe_steps"] and plan["seconds_per_step"] > 0
    assert 0.95 * 6.0 <= summary["train_seconds"] <= 6.0  # within 5% of the budget
    assert summary["recipe"]["schedule"]["total_steps"] == plan["planned_steps"]
    assert summary["epochs"] == round(records(out, "train")[-1]["epoch"], 3) > 1  # passes over the data, said
    rates = [r["learning_rate"] for r in records(out, "train")]
    decay = summary["recipe"]["schedule"]["decay_steps"]
    assert rates[-1] <= 3e-3 / decay + 1e-12  # the last step ran at the decay's last rate
    assert all(a > b for a, b in zip(rates[-decay:], rates[-decay + 1:], strict=False))  # falling to the end
    card = (out / "README.md").read_text()
    assert f"{plan['planned_steps']:,} steps planned" in card and "Passes over the training data" in card


def slowed_run(text_file: Path, out: Path, monkeypatch, slower: Callable[[TimeBudget, int], bool],  # noqa: F811
               tick: float = 0.003) -> dict:
    """A --max_minutes 0.1 run whose steps take ``tick`` on the clock (not 0.002) where ``slower(budget, step)``."""
    from hf_minitx.training import loop

    clock, real_step = TickingClock(0.002), loop.train_step

    def slower_there(run, state, *args):
        clock.tick = tick if state.planned_steps and slower(run.budget, state.step) else 0.002
        return real_step(run, state, *args)

    monkeypatch.setattr(loop, "time", clock)
    monkeypatch.setattr(loop, "train_step", slower_there)
    main(causal_args(text_file, out, "--max_minutes", "0.1", "--optimizer", "adamw", "--learning_rate", "3e-3"))
    return summary_of(out)


@pytest.mark.slow
def test_a_machine_slower_than_its_timing_before_the_decay_gets_a_shorter_plan_that_decays(text_file, tmp_path,  # noqa: F811
                                                                                          monkeypatch):
    out = tmp_path / "slowed"
    summary = slowed_run(text_file, out, monkeypatch, lambda budget, step: budget.fixed)  # from the final plan on
    plan, decay = summary["time_budget"], summary["recipe"]["schedule"]["decay_steps"]
    assert plan["ended_by"] == "plan" and plan["steps_run"] == plan["planned_steps"] == summary["steps"]
    assert max(plan["replanned_at_steps"]) < plan["planned_steps"] - decay  # before the decay, which it did not move
    assert summary["train_seconds"] <= 6.0 and plan["seconds_per_step"] == pytest.approx(0.012, rel=0.05)
    rates = [r["learning_rate"] for r in records(out, "train")]
    assert rates[-1] <= 3e-3 / decay + 1e-12  # the last step ran at the decay's last rate
    card = (out / "README.md").read_text()
    *first, last = [f"{step:,}" for step in plan["replanned_at_steps"]]
    assert f"laid again at the steps' pace at step {', '.join(first) + ' and ' if first else ''}{last}" in card


@pytest.mark.slow
def test_a_machine_many_times_slower_right_after_the_plan_still_decays_by_the_budget(text_file, tmp_path,  # noqa: F811
                                                                                    monkeypatch):
    """20 times slower from the first plan on: a window of a tenth of the plan would take twice the budget, so
    the guard closes it once its steps took their planned time, and the plan is laid again before the clock."""
    out = tmp_path / "crawl"
    summary = slowed_run(text_file, out, monkeypatch, lambda budget, step: True, tick=0.04)
    plan, decay = summary["time_budget"], summary["recipe"]["schedule"]["decay_steps"]
    assert plan["ended_by"] == "plan" and plan["steps_run"] == plan["planned_steps"] == summary["steps"]
    assert plan["replanned_at_steps"] and plan["replanned_at_steps"][0] <= plan["probe_steps"] + MIN_OVERDUE + 1
    rates = [r["learning_rate"] for r in records(out, "train")]
    assert rates[-1] <= 3e-3 / decay + 1e-12  # the decay ran to its end


def test_a_guard_window_ends_once_its_steps_took_their_planned_time():
    budget = TimeBudget(100.0, decay_ratio=0.3)
    budget.plan(20, 900, 0.1, 0.0)
    window = budget.guard_window(20)
    assert window.due == pytest.approx((window.last - 20) * 0.1)
    step = 21
    while not window.timed(step, 2.0):  # 20 times slower
        step += 1
    assert step == window.last == 20 + MIN_OVERDUE  # closed after MIN_OVERDUE steps, not after a tenth of the plan
    assert window.seconds_per_step == pytest.approx(2.0)
    on_pace = budget.guard_window(20)
    assert not any(on_pace.timed(step, 0.1) for step in range(21, on_pace.last)) and on_pace.timed(on_pace.last, 0.1)
    budget.one_process = False  # processes of a launch close it at the same step: its full length
    launched = budget.guard_window(20)
    assert launched.due is None and not launched.timed(20 + MIN_OVERDUE, 100.0)


@pytest.mark.slow
def test_a_slowdown_that_passes_costs_no_steps(text_file, tmp_path, monkeypatch):  # noqa: F811
    out = tmp_path / "busy-then-free"
    summary = slowed_run(text_file, out, monkeypatch, lambda budget, step: 40 <= step < 80, tick=0.01)
    plan = summary["time_budget"]
    assert plan["ended_by"] == "plan" and plan["steps_run"] == plan["planned_steps"]
    assert 0.9 * 6.0 <= summary["train_seconds"] <= 6.0  # the plan grew back once the steps were fast again
    assert len(plan["replanned_at_steps"]) >= 2  # shortened, then lengthened: each on record


@pytest.mark.slow
def test_a_machine_slower_than_its_timing_in_the_decay_is_stopped_by_the_clock_and_says_so(text_file, tmp_path,  # noqa: F811
                                                                                          monkeypatch):
    out = tmp_path / "slowed"
    summary = slowed_run(text_file, out, monkeypatch, lambda budget, step: budget.fixed and step >= budget.decay_from)
    plan = summary["time_budget"]
    assert plan["ended_by"] == "clock" and plan["steps_run"] < plan["planned_steps"]
    assert 6.0 <= summary["train_seconds"] <= 6.0 * (1 + GRACE) + 0.1
    assert "the clock stopped it first" in (out / "README.md").read_text()


@pytest.mark.slow
def test_steps_slower_after_late_dropout_starts_are_timed_for_the_final_plan(text_file, tmp_path, monkeypatch):  # noqa: F811
    """Late dropout makes every step after its pass dearer: the final plan is timed after the switch, so the run
    still ends on its plan, its decay whole, rather than by the clock."""
    from hf_minitx.training import loop

    clock, real_switch, switched = TickingClock(0.002), loop.switch_on_late_dropout, []

    def dearer_after_the_switch(run, step):
        real_switch(run, step)
        if run.settings.late_dropout is not None and step >= run.settings.late_dropout[0]:
            clock.tick = 0.0026  # 30% slower from the switch on
            switched.append(step)

    monkeypatch.setattr(loop, "time", clock)
    monkeypatch.setattr(loop, "switch_on_late_dropout", dearer_after_the_switch)
    out = tmp_path / "dropout"
    main(causal_args(text_file, out, "--max_minutes", "0.1", "--late_dropout", "0.1", "--late_dropout_passes", "5",
                     "--eval_steps", "0.25"))  # timed before the first quarter without the fix
    plan, late = summary_of(out)["time_budget"], summary_of(out)["recipe"]["late_dropout"]
    assert switched and late["from_step"] < 0.7 * plan["planned_steps"]  # the switch lies before the decay
    assert plan["ended_by"] == "plan" and plan["steps_run"] == plan["planned_steps"]


def test_the_final_plan_is_timed_after_the_step_from_which_steps_cost_more_when_it_lies_before_the_decay():
    budget = TimeBudget(100.0, decay_ratio=0.3, slower_from=200)
    budget.plan(20, 1000, 0.1, 0.0)
    assert budget.final_window(1000) == (204, 504)  # as long a window as without it (200..500), after the switch
    window = budget.second_window(20)
    assert (window.first_timed, window.last) == (204, 504) and budget.replan_step(1000) == 504
    later = TimeBudget(100.0, decay_ratio=0.3, slower_from=400)  # a plan a quarter shorter decays from step 525
    assert later.final_window(1000) == (404, 525)
    near_the_decay = TimeBudget(100.0, decay_ratio=0.3, slower_from=480)  # no room for 50 steps: the usual window
    assert near_the_decay.final_window(1000) == (200, 500)
    early = TimeBudget(100.0, decay_ratio=0.3, slower_from=100)  # before the usual window: nothing changes
    assert early.final_window(1000) == (200, 500)
    quarters = TimeBudget(100.0, decay_ratio=0.3, first_fraction=0.25)  # evaluations every quarter of the run
    assert quarters.final_window(1000) == (70, 175)  # before the first, and a window of 105 steps, not 10


@pytest.mark.slow
def test_a_timed_run_killed_and_resumed_keeps_its_plan_and_equals_a_run_of_that_many_steps(text_file, tmp_path):  # noqa: F811
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    killed, straight = tmp_path / "killed", tmp_path / "straight"

    def timed(minutes: str) -> list[str]:
        return causal_args(text_file, killed, "--max_minutes", minutes, "--checkpointing_steps", "0.7")

    died = subprocess.run([sys.executable, "-c", KILL_AFTER_FIRST_CHECKPOINT, *timed("0.1")], env=env, cwd=REPO,
                          timeout=300, capture_output=True)
    assert died.returncode == -signal.SIGKILL, died.stderr.decode()[-2000:]
    (checkpoint,) = killed.glob("checkpoint-*")
    saved = json.loads((checkpoint / "run_state.json").read_text())
    assert saved["plan_final"] and saved["step"] == every(0.7, saved["planned_steps"])  # the final plan came first
    # the resumed run keeps the recorded plan; a longer budget only moves the clock's cap (a restarted process
    # spends its first steps warming up, which a 6-second test cannot absorb)
    subprocess.run([sys.executable, "-m", "hf_minitx", "train", *timed("0.3"), "--resume_from_checkpoint", "latest"],
                   check=True, env=env, cwd=REPO, timeout=300)
    plan = summary_of(killed)["time_budget"]
    assert plan["planned_steps"] == saved["planned_steps"] == plan["steps_run"]  # the same plan, run to its end
    # the record says which budget the plan was made for, and keeps the timings it was made from
    assert plan["budget_minutes"] == 0.3 and plan["planned_for_minutes"] == 0.1
    assert plan["seconds_per_step"] == pytest.approx(saved["plan_timing"]["seconds_per_step"], abs=1e-4)
    # the recorded plan repeats the run without a clock, bit for bit
    subprocess.run([sys.executable, "-m", "hf_minitx", "train",
                    *causal_args(text_file, straight, "--max_steps", str(plan["planned_steps"]))],
                   check=True, env=env, cwd=REPO, timeout=300)
    assert_same_weights(straight, killed)
    assert [r["learning_rate"] for r in records(straight, "train")] == [
        r["learning_rate"] for r in records(killed, "train")]


@pytest.mark.slow
def test_two_processes_agree_on_one_plan(text_file, tmp_path):  # noqa: F811
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = tmp_path / "two"
    subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                    "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                    "--main_process_port", str(free_port()), "-m", "hf_minitx", "train",
                    *causal_args(text_file, out, "--max_minutes", "0.15", "--per_device_train_batch_size", "4")],
                   check=True, env=env, cwd=REPO, timeout=300)
    plan = summary_of(out)["time_budget"]  # processes that disagreed would hang in a collective, or differ in steps
    # (a busy machine may stop the run by the clock before its plan: the timing itself is tested alone above)
    assert plan["planned_steps"] >= plan["steps_run"] == summary_of(out)["steps"] > 0
    assert plan["ended_by"] == "plan" or plan["steps_run"] < plan["planned_steps"]


# --- the best model by validation -------------------------------------------------------------------


def _run_with(model: torch.nn.Module, best: BestWeights):
    from accelerate import Accelerator

    return SimpleNamespace(best=best, accelerator=Accelerator(cpu=True), model=model,
                           evaluation=SimpleNamespace(coverage={"tokens": 5000}))  # enough to choose by


def test_the_best_evaluation_weights_come_back_when_the_last_evaluation_is_worse():
    model = tiny_causal()
    best = BestWeights()
    best.offer(model, 10, {"eval_loss": 2.0})
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    best.offer(model, 20, {"eval_loss": float("nan")})  # NaN never wins
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    best.offer(model, 30, {"eval_loss": 3.0})  # worse: not kept
    outcome = FitOutcome(final_metrics={"eval_loss": 3.0})
    keep_best(_run_with(model, best), RunState(step=30), outcome)
    assert outcome.kept == {"step": 10, "eval_loss": 2.0, "last_step": 30, "last_eval_loss": 3.0}
    assert outcome.final_metrics == {"eval_loss": 2.0}
    assert all(torch.equal(kept[k], v) for k, v in model.state_dict().items())


def test_the_last_weights_stay_when_the_last_evaluation_is_the_best():
    model = tiny_causal()
    best = BestWeights()
    best.offer(model, 10, {"eval_loss": 2.0})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    best.offer(model, 30, {"eval_loss": 1.0})
    now = {k: v.clone() for k, v in model.state_dict().items()}
    outcome = FitOutcome(final_metrics={"eval_loss": 1.0})
    keep_best(_run_with(model, best), RunState(step=30), outcome)
    assert outcome.kept["step"] == 30 and all(torch.equal(now[k], v) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_the_best_weights_survive_a_resume_and_are_the_ones_saved(text_file, tmp_path, monkeypatch):  # noqa: F811
    """Scripted evaluation losses make step 20 the best; the run is stopped at 30 and resumed to 40."""
    from hf_minitx.training import evaluation

    losses = iter([5.0, 1.0, 3.0, 4.0, 4.5])
    real = evaluation.TextEvaluation.__call__

    def scripted(self, model, accelerator):
        metrics, samples = real(self, model, accelerator)
        return {**metrics, "eval_loss": next(losses)}, samples

    monkeypatch.setattr(evaluation.TextEvaluation, "__call__", scripted)
    monkeypatch.setattr("hf_minitx.training.best.MIN_CHOOSING_TOKENS", 100)  # the tiny split's 496 tokens choose
    out = tmp_path / "best"
    common = ("--eval_steps", "10", "--checkpointing_steps", "10", "--save_total_limit", "10",
              "--calibrate_temperature", "false")  # the kept weights as they were (a fitted temperature changes them)
    main(causal_args(text_file, out, "--max_steps", "30", *common))
    mask = os.umask(0)
    os.umask(mask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (out / "checkpoint-30").rglob("*") if p.is_file()}
    assert "best_weights.safetensors" in modes and set(modes.values()) == {0o666 & ~mask}, modes  # none left 0600
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    main(causal_args(text_file, out, "--max_steps", "40", *common, "--resume_from_checkpoint",
                     str(out / "checkpoint-30")))
    summary = summary_of(out)
    assert summary["kept"] == {"step": 20, "eval_loss": 1.0, "last_step": 40, "last_eval_loss": 4.0}
    assert summary["final_metrics"]["eval_loss"] == 1.0
    from hf_minitx.tools.explore import read_weights
    from hf_minitx.training.checkpoints import MODEL_FILES

    (weights,) = [out / "checkpoint-20" / name for name in MODEL_FILES if (out / "checkpoint-20" / name).is_file()]
    final, at_20 = load_file(out / "model.safetensors"), read_weights(weights)
    assert final.keys() <= at_20.keys()
    assert all(torch.equal(final[k], at_20[k]) for k in final)
    assert "Weights kept" in (out / "README.md").read_text()


def test_a_plan_bound_by_max_steps_or_too_short_to_time_again_is_final():
    capped = TimeBudget(12.0, step_cap=30, decay_ratio=0.3)  # --max_steps 30 --max_minutes 0.2
    assert capped.plan(20, capped.steps_that_fit(20, 1.0, 0.01, 0.0), 0.01, 0.0) == 30 and capped.fixed
    short = TimeBudget(12.0, decay_ratio=0.3)  # a second timing at step 40 would fall in the decay (from step 35)
    assert short.plan(20, 50, 0.1, 0.0) == 50 and short.fixed


def test_a_fraction_of_the_run_is_placed_on_the_final_plan():
    from hf_minitx.training.run_length import evaluation_passed
    from hf_minitx.training.state import LoopSettings

    budget = TimeBudget(100.0, decay_ratio=0.3, first_fraction=0.5)  # --eval_steps 0.5
    assert budget.replan_step(384) == round(0.35 * 384)  # the final plan before half of a shorter one
    assert TimeBudget(100.0, decay_ratio=0.3).replan_step(384) == 192
    final = LoopSettings(total_steps=250, batches_per_epoch=10, eval_steps=every(0.5, 250))
    assert evaluation_passed(final, 134, evaluated_at=20)  # a final plan shorter still: evaluated when it is made
    assert not evaluation_passed(final, 134, evaluated_at=125) and not evaluation_passed(final, 120, evaluated_at=20)


@pytest.mark.slow
def test_half_of_a_timed_run_is_half_of_its_final_plan_and_the_bar_waits_for_the_plan(text_file, tmp_path,  # noqa: F811
                                                                                      monkeypatch):
    from hf_minitx.training import loop

    bars = []

    class RecordedBar(loop.tqdm):
        def __init__(self, *args, **kwargs):
            bars.append(kwargs.get("total"))
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(loop, "time", TickingClock(0.004))
    monkeypatch.setattr(loop, "tqdm", RecordedBar)
    out = tmp_path / "half"
    # without late dropout, whose switch (step 84) would move the final timing past half of the run
    main(causal_args(text_file, out, "--max_minutes", "0.1", "--eval_steps", "0.5", "--late_dropout", "0"))
    planned = summary_of(out)["time_budget"]["planned_steps"]
    assert summary_of(out)["steps"] == planned
    evaluations = [r["step"] for r in records(out, "eval") if "temperature" not in r]  # not the calibrated model's
    assert evaluations == [20, every(0.5, planned), planned]  # the probe's timed one, half of the run, the end
    assert bars[0] is None and bars[1].total == planned  # no billion-step total before the plan


def test_a_fraction_of_the_run_rounds_up_so_no_evaluation_falls_just_before_the_end():
    assert (every(0.25, 1289), every(0.25, 1288), every(0.1, 30), every(0.5, 3)) == (323, 322, 3, 2)
    assert [s for s in range(1, 1290) if s % every(0.25, 1289) == 0] == [323, 646, 969]  # then the end, 1289
    assert (every(0.001, 10), every(200, 10), every(0, 10), every(None, 10)) == (1, 200, None, None)


def test_a_budget_spent_inside_its_probe_names_a_step_without_the_shape_timing_and_the_teachers_share():
    from hf_minitx.training.run_length import refuse_unplanned_budget

    split = {"minutes": 0.3, "teacher_minutes": 0.15, "student_minutes": 0.15}
    run = SimpleNamespace(budget=TimeBudget(seconds=9.0), accelerator=SimpleNamespace(num_processes=1),
                          checkpoint_fields={"shape_plan": {"timing_seconds": 6.0, "phases": split}})
    state = RunState(step=8, train_seconds=6.0 + 8 * 0.375)  # the shape's timing is spent from the budget too
    outcome = FitOutcome(stopped_by_time_budget=True, checkpoint=Path("out/checkpoint-8"))
    with pytest.raises(ValueError) as refused:
        refuse_unplanned_budget(run, state, outcome)
    said = str(refused.value)
    assert "--max_minutes 0.15 (9.0 s) (the teacher's share of a 0.3-minute budget split in two)" in said
    assert "8 step(s) of about 0.38 s" in said  # not (6 + 3) / 8 = 1.12 s
    advised = float(said.split("--resume_from_checkpoint latest --max_minutes ")[1].split()[0])
    # the timing and the 8 steps stay on the resumed clock; the steps to come may be up to ADVICE_SLACK slower
    assert advised == run.budget.shortest_budget(0.375 * ADVICE_SLACK, 9.0)
    assert advised * 60 * (1 - MARGIN) > 9.0 + 2 * 20 * 0.375 * ADVICE_SLACK  # a new probe and as many steps, after it
    run.budget = TimeBudget(seconds=18.0)  # a budget given to a resume is not the teacher's share: not said so
    with pytest.raises(ValueError) as refused:
        refuse_unplanned_budget(run, state, outcome)
    assert "teacher's share" not in str(refused.value)


@pytest.mark.slow
def test_the_probe_times_an_evaluation_already_made_at_its_step_instead_of_making_a_second(text_file, tmp_path,  # noqa: F811
                                                                                            monkeypatch):
    from hf_minitx.training import loop

    monkeypatch.setattr(loop, "time", TickingClock(0.004))
    out = tmp_path / "twice"
    main(causal_args(text_file, out, "--max_minutes", "30", "--max_steps", "40", "--eval_steps", "10"))
    evaluations = [r["step"] for r in records(out, "eval") if "temperature" not in r]
    assert evaluations == [10, 20, 30, 40]  # step 20, the probe's, is scored once
    assert summary_of(out)["time_budget"]["seconds_per_evaluation"] > 0  # and its time is the plan's figure


def test_a_plan_off_its_pace_is_laid_again_at_the_steps_that_fit_before_its_decay():
    budget = TimeBudget(100.0, decay_ratio=0.3, eval_steps=0.25)
    budget.plan(20, budget.steps_that_fit(20, 2.0, 0.1, 1.0), 0.1, 1.0)  # a plan at 0.1 s a step
    budget.plan(100, budget.steps_that_fit(100, 10.0, 0.1, 1.0), 0.1, 1.0)  # the final one
    planned = budget.planned_steps
    assert budget.paced_plan(300, 30.0, 0.1) is None  # on its pace
    assert budget.paced_plan(300, 30.0, 0.104) is None  # slower, ending inside the clock's grace
    assert budget.paced_plan(300, 30.0, 0.095) is None  # faster, ending less than 3 margins early
    shorter = budget.paced_plan(300, 30.0, 0.2)  # twice as slow: what is left fits half the steps
    left = 4 - 300 // every(0.25, planned)  # evaluations at quarters of the plan: those not yet made
    assert left == 3 and shorter == 300 + math.floor((100 * (1 - MARGIN) - 30.0 - left * 1.0) / 0.2)
    assert shorter < planned
    budget.planned_steps = shorter
    assert budget.paced_plan(300, 30.0, 0.1) > shorter  # fast again: the steps come back
    window = budget.guard_window(300)
    assert window.last - window.first_timed == max(budget.probe_steps, round(0.1 * shorter))
    assert budget.guard_window(math.ceil(budget.decay_from)) is None  # the decay is never moved
    assert TimeBudget(100.0).guard_window(0) is None  # no plan yet
    cosine = TimeBudget(100.0, decay_ratio=None)
    cosine.plan(20, 900, 0.1, 0.0)
    assert cosine.guard_window(20) is None  # its rates depend on the length from the start
