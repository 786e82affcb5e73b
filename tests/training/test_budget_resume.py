"""A resumed time budget tells one story: the checkpoint's plan goes on (with the same budget, without
--max_minutes, with a longer one that only moves the clock), a shorter budget is refused, --max_steps alone
replaces it; the message, the steps run and the summary agree. And a budget too short for its timing probe
saves no model as the run's result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_budget import TickingClock, summary_of
from test_train import _fresh_accelerate_state, causal_args, records, text_file  # noqa: F401  (fixtures)

from hf_minitx.training import checkpoints, loop
from hf_minitx.training.budget import GRACE
from hf_minitx.training.end_of_run import keep_best
from hf_minitx.training.state import FitOutcome, RunState

TICK = 0.004  # seconds per reading of the clock: a 0.1-minute budget plans ~300 steps
KILLED_AT = 60  # the checkpoint: after the first plan (step 20), before the final one (about step 180)


class Killed(BaseException):
    """Stands for SIGKILL right after a checkpoint: nothing after it runs."""


def _reset_accelerate() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(scope="module")
def killed_run(text_file, tmp_path_factory) -> Path:  # noqa: F811
    """A --max_minutes 0.1 run killed right after its checkpoint at step 60, before its plan was final."""
    out = tmp_path_factory.mktemp("killed") / "run"
    real_time, real_rotate = loop.time, checkpoints.rotate_checkpoints

    def rotate_then_die(*args, **kwargs):
        real_rotate(*args, **kwargs)
        raise Killed

    loop.time, checkpoints.rotate_checkpoints = TickingClock(TICK), rotate_then_die
    try:
        _reset_accelerate()
        with pytest.raises(Killed):
            loop.main(causal_args(text_file, out, "--max_minutes", "0.1", "--checkpointing_steps", str(KILLED_AT)))
    finally:
        loop.time, checkpoints.rotate_checkpoints = real_time, real_rotate
        _reset_accelerate()
    return out


def resume(killed_run: Path, tmp_path: Path, text_file: Path, monkeypatch, *extra: str) -> Path:  # noqa: F811
    """A copy of the killed run, resumed from its checkpoint with ``extra`` in place of --max_minutes 0.1."""
    out = tmp_path / "run"
    shutil.copytree(killed_run, out)
    monkeypatch.setattr(loop, "time", TickingClock(TICK))
    loop.main(causal_args(text_file, out, "--checkpointing_steps", str(KILLED_AT), *extra,
                          "--resume_from_checkpoint", "latest"))
    return out


def saved_state(folder: Path) -> dict:
    return json.loads((folder / f"checkpoint-{KILLED_AT}" / "run_state.json").read_text())


def assert_plan_ran_to_its_end(out: Path, minutes: float) -> dict:
    """The summary's plan ran to its end inside ``minutes``, the schedule laid over it and decayed."""
    summary = summary_of(out)
    plan = summary["time_budget"]
    assert plan["ended_by"] == "plan" and plan["planned_steps"] == plan["steps_run"] == summary["steps"]
    assert summary["recipe"]["schedule"]["total_steps"] == plan["planned_steps"]
    assert "schedule_changes" not in summary["recipe"]["schedule"]
    assert summary["train_seconds"] <= minutes * 60 * (1 + GRACE)
    assert records(out, "train")[-1]["step"] == plan["planned_steps"]
    return plan


def test_the_killed_checkpoint_records_its_budget_before_the_plan_is_final(killed_run):
    saved = saved_state(killed_run)
    assert saved["step"] == KILLED_AT and saved["planned_steps"] > KILLED_AT and not saved["plan_final"]
    assert saved["plan_timing"]["budget_minutes"] == 0.1


@pytest.mark.slow
def test_a_resume_with_the_same_budget_runs_its_plan_and_says_nothing_more(killed_run, text_file, tmp_path,  # noqa: F811
                                                                           monkeypatch, caplog):
    out = resume(killed_run, tmp_path, text_file, monkeypatch, "--max_minutes", "0.1")
    plan = assert_plan_ran_to_its_end(out, 0.1)
    assert plan["budget_minutes"] == 0.1 and "planned_for_minutes" not in plan
    assert not [r for r in caplog.records if "min" in r.getMessage() and "budget" in r.getMessage()]


@pytest.mark.slow
def test_a_resume_without_max_minutes_keeps_the_recorded_budget_not_an_epoch(killed_run, text_file, tmp_path,  # noqa: F811
                                                                             monkeypatch, caplog):
    out = resume(killed_run, tmp_path, text_file, monkeypatch)
    plan = assert_plan_ran_to_its_end(out, 0.1)
    assert plan["budget_minutes"] == 0.1
    (said,) = [r.getMessage() for r in caplog.records if "resumed without --max_minutes" in r.getMessage()]
    assert "time budget of 0.1 min goes on" in said
    assert f"plan of {saved_state(killed_run)['planned_steps']} steps" in said


@pytest.mark.slow
def test_a_longer_budget_only_moves_the_clock_and_the_plan_is_made_for_the_first(killed_run, text_file, tmp_path,  # noqa: F811
                                                                                 monkeypatch, caplog):
    out = resume(killed_run, tmp_path, text_file, monkeypatch, "--max_minutes", "0.3")
    plan = assert_plan_ran_to_its_end(out, 0.1)  # not re-planned to fill 0.3 minutes
    assert plan["budget_minutes"] == 0.3 and plan["planned_for_minutes"] == 0.1
    (said,) = [r.getMessage() for r in caplog.records if "only moves the clock" in r.getMessage()]
    assert f"the plan of {saved_state(killed_run)['planned_steps']} steps made for --max_minutes 0.1 goes on" in said
    assert "--max_minutes 0.3 only moves the clock's stop" in said
    assert "planned for 0.1 min before a resume" in (out / "README.md").read_text()


def test_a_shorter_budget_or_another_max_steps_beside_it_is_refused_before_any_write(killed_run, text_file,  # noqa: F811
                                                                                    tmp_path, monkeypatch):
    out = tmp_path / "run"
    shutil.copytree(killed_run, out)
    before = (out / "metrics.jsonl").read_text()
    planned = saved_state(killed_run)["planned_steps"]
    with pytest.raises(ValueError, match=rf"plan of {planned} steps made for --max_minutes 0.1; --max_minutes 0.05 "
                                         "would stop it by the clock before its decay ends"):
        loop.main(causal_args(text_file, out, "--max_minutes", "0.05", "--resume_from_checkpoint", "latest"))
    with pytest.raises(ValueError, match="--max_steps 900 beside --max_minutes would contradict it"):
        loop.main(causal_args(text_file, out, "--max_minutes", "0.1", "--max_steps", "900",
                              "--resume_from_checkpoint", "latest"))
    assert (out / "metrics.jsonl").read_text() == before and not (out / "training_summary.json").exists()


@pytest.mark.slow
def test_max_steps_without_max_minutes_replaces_the_plan_and_says_so(killed_run, text_file, tmp_path,  # noqa: F811
                                                                     monkeypatch, caplog):
    out = resume(killed_run, tmp_path, text_file, monkeypatch, "--max_steps", "80")
    summary = summary_of(out)
    assert summary["steps"] == 80 and "time_budget" not in summary
    planned = saved_state(killed_run)["planned_steps"]
    assert summary["recipe"]["schedule"]["schedule_changes"] == [
        {"step": KILLED_AT, "total_steps_before": planned, "total_steps": 80}]
    (said,) = [r.getMessage() for r in caplog.records if "replaced by --max_steps 80" in r.getMessage()]
    assert f"time budget of 0.1 min and the plan of {planned} steps" in said and f"from step {KILLED_AT}" in said


@pytest.mark.slow
def test_a_budget_shorter_than_a_step_saves_no_model_and_resumes_with_the_budget_it_names(text_file, tmp_path,  # noqa: F811
                                                                                          monkeypatch):
    monkeypatch.setattr(loop, "time", TickingClock(0.2))  # a step reads the clock a few times: ~0.7 s a step
    out = tmp_path / "short"
    with pytest.raises(ValueError) as refused:
        loop.main(causal_args(text_file, out, "--max_minutes", "0.005"))
    said = str(refused.value)
    assert "--max_minutes 0.005 (0.3 s) ran out after 1 step(s) of about" in said
    assert "no model is saved as the run's result" in said
    assert not (out / "training_summary.json").exists() and not (out / "model.safetensors").exists()
    assert "temperature" not in (out / "metrics.jsonl").read_text()  # no fit for a model that is not the result
    suggested = said.split("--resume_from_checkpoint latest --max_minutes ")[1].split()[0]
    assert float(suggested) > 0.005 and (out / "checkpoint-1").is_dir()
    _reset_accelerate()
    monkeypatch.setattr(loop, "time", TickingClock(0.2))  # (this clock makes later steps dearer than the first)
    loop.main(causal_args(text_file, out, "--max_minutes", "1", "--resume_from_checkpoint", "latest"))
    plan = summary_of(out)["time_budget"]  # the checkpoint held no plan: the new budget makes one, and it decays
    assert plan["planned_steps"] > plan["probe_steps"] and plan["budget_minutes"] == 1
    assert plan["ended_by"] == "plan" and plan["steps_run"] == plan["planned_steps"]


def test_a_budget_the_probe_spends_is_refused_as_one_that_ran_out_inside_it(text_file, tmp_path, monkeypatch):  # noqa: F811
    """The probe's timing may leave no step after it (a plan of exactly the steps made): the model never decayed
    (its steps ran the provisional warmup), so it is refused like a budget that ran out inside the probe."""
    from hf_minitx.training.budget import TimeBudget

    bars = []

    class RecordedBar(loop.tqdm):
        def close(self):
            bars.append(self.total)
            super().close()

    monkeypatch.setattr(TimeBudget, "steps_that_fit", lambda self, done, *args, **kwargs: done)
    monkeypatch.setattr(loop, "tqdm", RecordedBar)
    out = tmp_path / "spent"
    with pytest.raises(ValueError, match=r"ran out after 20 step\(s\) of about .* inside the timing probe that makes "
                                         r"the plan \(the 20 steps after"):
        loop.main(causal_args(text_file, out, "--max_minutes", "0.5"))
    assert (out / "checkpoint-20").is_dir() and not (out / "model.safetensors").exists()
    assert not (out / "training_summary.json").exists()
    assert bars and set(bars) == {None}  # no billion-step total: no plan was made


def test_a_replaced_folder_gets_its_old_contents_back_when_the_probe_spends_the_budget(text_file, tmp_path,  # noqa: F811
                                                                                      monkeypatch):
    """--overwrite_output_dir with a budget too short to plan: nothing is replaced (the old model and a file the
    user put beside it are back, the new run's checkpoint is gone); a budget that plans replaces as asked."""
    from hf_minitx.training.budget import TimeBudget

    out = tmp_path / "run"
    loop.main(causal_args(text_file, out, "--max_steps", "2"))
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    _reset_accelerate()
    with monkeypatch.context() as patched:
        patched.setattr(TimeBudget, "steps_that_fit", lambda self, done, *args, **kwargs: done)
        with pytest.raises(ValueError, match=rf"{out} holds its old contents again, as nothing was replaced: run "
                                             r"again with --max_minutes [\d.]+ or more"):
            loop.main(causal_args(text_file, out, "--max_minutes", "0.5", "--overwrite_output_dir"))
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert not list(out.glob("checkpoint-*")) and sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    _reset_accelerate()
    monkeypatch.setattr(loop, "time", TickingClock(TICK))
    loop.main(causal_args(text_file, out, "--max_minutes", "0.05", "--overwrite_output_dir"))
    assert summary_of(out)["time_budget"]["ended_by"] == "plan" and not (out / "notes.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # the old contents kept aside are deleted


def test_a_validation_split_too_small_to_choose_by_keeps_the_last_weights_and_says_so(caplog):
    import torch
    from conftest import tiny_causal
    from test_budget import _run_with

    from hf_minitx.training.best import MIN_CHOOSING_TOKENS, BestWeights

    model = tiny_causal()
    best = BestWeights()
    best.offer(model, 5, {"eval_loss": 2.0})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    last = {k: v.clone() for k, v in model.state_dict().items()}
    outcome = FitOutcome(final_metrics={"eval_loss": 3.0})
    run = _run_with(model, best)
    run.evaluation = SimpleNamespace(coverage={"split": "validation", "rows": 1, "tokens": 1})  # as Evaluator records
    keep_best(run, RunState(step=20), outcome)
    assert outcome.kept["step"] == 20 and outcome.final_metrics["eval_loss"] == 3.0
    assert all(torch.equal(last[k], v) for k, v in model.state_dict().items())
    reason = f"the validation split scores 1 token(s), fewer than {MIN_CHOOSING_TOKENS:,}: too few to choose a model by"
    assert outcome.kept["not_chosen"] == reason
    (said,) = [r.getMessage() for r in caplog.records if "kept the last weights" in r.getMessage()]
    assert "not those of step 5" in said and reason in said


def test_a_run_scored_on_few_tokens_keeps_its_last_weights_end_to_end(text_file, tmp_path, monkeypatch):  # noqa: F811
    """The rule reads the count the evaluation really records (its coverage), not a key of the metrics: a run
    whose earlier evaluation is taken to be better still keeps its last weights and says why."""
    from hf_minitx.training.best import BestWeights

    monkeypatch.setattr(BestWeights, "beaten_by", lambda self, metrics: self.step is None)  # keep the first
    monkeypatch.setattr(BestWeights, "better_than", lambda self, metrics, step: self.step != step)
    out = tmp_path / "run"
    loop.main(causal_args(text_file, out, "--max_steps", "4", "--eval_steps", "2", "--max_eval_samples", "1"))
    summary = summary_of(out)
    assert summary["evaluation"]["tokens"] < 1000
    assert summary["kept"]["step"] == 4 and summary["kept"]["not_chosen"].startswith("the validation split scores")
    assert f"| Weights kept | the last step's, 4: {summary['kept']['not_chosen']} |" in (out / "README.md").read_text()


@pytest.mark.parametrize("tracker, package", [("tensorboard", "tensorboard"), ("comet_ml", "comet-ml")])
def test_a_tracker_that_is_not_installed_is_refused_before_anything_is_written(tracker, package, text_file,  # noqa: F811
                                                                               tmp_path, monkeypatch):
    import accelerate.utils

    monkeypatch.setattr(accelerate.utils, f"is_{tracker}_available", lambda: False)
    out = tmp_path / "tracked"
    with pytest.raises(ImportError, match=rf"--report_to {tracker}: not installed; pip install {package} "):
        loop.main(causal_args(text_file, out, "--max_steps", "2", "--report_to", f"none,{tracker}"))
    assert not out.exists()


def test_a_budget_given_to_the_resume_of_a_run_planned_in_steps_is_refused_before_any_write(text_file, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    loop.main(causal_args(text_file, out, "--max_steps", "4", "--checkpointing_steps", "2"))
    shutil.rmtree(out / "checkpoint-4")
    before = (out / "metrics.jsonl").read_text()
    _reset_accelerate()
    with pytest.raises(ValueError, match=r"checkpoint-2 goes on with its schedule over 4 steps, planned without a time "
                                         r"budget; --max_minutes 0.2 would lay it over a timed plan from step 2 on"):
        loop.main(causal_args(text_file, out, "--max_minutes", "0.2", "--resume_from_checkpoint", "latest"))
    assert (out / "metrics.jsonl").read_text() == before


@pytest.mark.slow
def test_every_process_of_a_launch_says_the_replaced_folder_is_back(text_file, tmp_path):  # noqa: F811
    """Only the first process keeps a replaced folder's old contents aside: the others say what it did, not that a
    checkpoint it deleted can be resumed."""
    import os
    import subprocess
    import sys

    from conftest import REPO, free_port

    out = tmp_path / "run"
    loop.main(causal_args(text_file, out, "--max_steps", "2"))
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".minitx-lock"}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                           "--main_process_port", str(free_port()), "-m", "hf_minitx", "train",
                           *causal_args(text_file, out, "--max_minutes", "0.002", "--overwrite_output_dir")],
                          env=env, cwd=REPO, timeout=300, capture_output=True, text=True)
    assert done.returncode != 0 and done.stderr.count(f"{out} holds its old contents again") == 2, done.stderr
    assert "--resume_from_checkpoint latest" not in done.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".minitx-lock"} == before
