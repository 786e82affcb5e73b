"""A budget one model cannot use is spent on two (hf_minitx.training.phases): past PASSES_PER_MODEL passes the
plan trains a teacher, then a student with the KL term to it, and leaves one ordinary model folder; a kill in
either phase, then a resume, ends on the same weights as a run never stopped."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_budget import TickingClock
from test_budget_resume import Killed, _reset_accelerate
from test_shape_plan import SMALL, planned_args
from test_train import _fresh_accelerate_state, text_file  # noqa: F401  (fixtures)
from transformers import AutoModelForCausalLM

from hf_minitx.training import checkpoints, loop, phases, shape_plan
from hf_minitx.training.arguments import TrainArguments
from hf_minitx.training.distill import Distillation
from hf_minitx.training.shape_plan import (
    MIN_PHASE_STEPS,
    PASSES_PER_MODEL,
    STUDENT_STEP_COST,
    may_split,
    plan_phases,
)

TICK = 0.004  # seconds per reading of the clock: each phase of a 0.1-minute budget plans about 150 steps
CHECKPOINT_AT = 100  # after each phase's final plan (made near step 75)


def test_more_passes_than_one_model_uses_split_the_budget_in_two():
    assert plan_phases(PASSES_PER_MODEL, 5000, 10.0) is None
    assert plan_phases(PASSES_PER_MODEL * 2, 2 * MIN_PHASE_STEPS - 1, 10.0) is None  # too short for two runs
    # the student's steps carry the teacher's forward: two phases of MIN_PHASE_STEPS need more than twice as many
    just_short = math.floor(2 * MIN_PHASE_STEPS * STUDENT_STEP_COST) - 1
    assert plan_phases(PASSES_PER_MODEL * 2, just_short, 10.0) is None
    assert plan_phases(PASSES_PER_MODEL * 2, just_short + 2, 10.0) is not None
    # a budget past the passes of one model that does not split says why
    assert f"{just_short:,} steps of it are too few" in shape_plan.unsplit_reason(PASSES_PER_MODEL * 2, just_short)
    assert shape_plan.unsplit_reason(PASSES_PER_MODEL * 2, just_short + 2) is None
    assert shape_plan.unsplit_reason(PASSES_PER_MODEL, 10) is None
    split = plan_phases(PASSES_PER_MODEL + 0.1, 5000, 10.0)
    assert split["teacher_minutes"] + split["student_minutes"] == 10.0 and split["teacher_minutes"] > 0
    assert split["passes_of_one_model"] > split["passes_per_model"] == PASSES_PER_MODEL


def test_the_student_takes_its_share_unless_a_resume_gives_another_budget():
    split = plan_phases(PASSES_PER_MODEL * 2, 5000, 3.0)
    for given in (None, 3.0, split["teacher_minutes"]):  # none, the whole budget, or the teacher's own args
        assert phases.student_minutes(split, given) == split["student_minutes"]
    # a budget that ran out inside the student's timing probe names a longer one to resume with: it is used
    assert phases.student_minutes(split, 4.5) == 4.5
    # but one the teacher was resumed with, and ran to, is the teacher's: the student keeps its share
    assert phases.student_minutes(split, 4.5, teacher_minutes=4.5) == split["student_minutes"]


def test_a_resume_given_less_than_a_phases_share_is_refused_in_the_budget_typed():
    split = plan_phases(PASSES_PER_MODEL * 2, 5000, 1.2)
    for phase in ("teacher", "student"):  # the whole budget, none, the share, or more pass
        for given in (None, 1.2, split[f"{phase}_minutes"], 0.9, 2.0):
            shape_plan.check_phase_budget(split, given, phase)
        with pytest.raises(ValueError, match=rf"planned for --max_minutes 1.2 in two phases .*--max_minutes 0.3 would "
                                             rf"stop the {phase}'s plan .*resume with --max_minutes 1.2 \(or leave"):
            shape_plan.check_phase_budget(split, 0.3, phase)


@pytest.mark.parametrize(("given", "world_size", "expected"), [
    ({}, "1", True), ({"max_steps": 100}, "1", False), ({"num_epochs": 3.0}, "1", False),
    ({"distill_from": "teacher"}, "1", False), ({}, "2", False)])
def test_only_a_run_of_the_budget_alone_in_one_process_is_split(given, world_size, expected, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", world_size)
    assert may_split(TrainArguments(max_minutes=10.0, **given)) is expected


def run_in_phases(text_file: Path, out: Path, *extra: str, die_in: str | None = None,  # noqa: F811
                  budget: bool = True) -> list[str]:
    """The planned run of test_shape_plan (2 x 32 chosen, a corpus it passes over many times) with a checkpoint at
    CHECKPOINT_AT; ``die_in`` ("teacher" or "student"): killed right after that phase's checkpoint; ``budget``
    False: without its --max_minutes (a resume taking up the recorded one, or given another length). Returns how
    many optimizer steps each phase trained, and in how many of them the KL term was computed: {(phase, "steps" or
    "kl"): count}."""
    saved = (shape_plan.SHAPES, shape_plan.time_shape, loop.time, checkpoints.rotate_checkpoints,
             Distillation.summed_loss, loop.train_step)
    calls: Counter = Counter()

    def time_shape(settings, shape, *args):
        return {16: 0.001, 32: 0.002, 48: 0.5}[shape.hidden], 1000 * shape.hidden

    def rotate(output_dir, *args, **kwargs):
        saved[3](output_dir, *args, **kwargs)
        if die_in is not None and (output_dir.name == phases.STUDENT_DIR) == (die_in == "student"):
            raise Killed

    def summed_loss(self, *args, **kwargs):
        calls[loop_phase(), "kl"] += 1
        return saved[4](self, *args, **kwargs)

    def train_step(*args, **kwargs):
        calls[loop_phase(), "steps"] += 1
        return saved[5](*args, **kwargs)

    def loop_phase() -> str:
        return "student" if Path(self_dir[-1]).name == phases.STUDENT_DIR else "teacher"

    self_dir: list[str] = []
    real_train = loop.train

    def train(model_args, data_args, train_args):
        self_dir.append(train_args.output_dir)
        return real_train(model_args, data_args, train_args)

    shape_plan.SHAPES, shape_plan.time_shape = SMALL, time_shape
    loop.time, checkpoints.rotate_checkpoints, Distillation.summed_loss = TickingClock(TICK), rotate, summed_loss
    loop.train, loop.train_step = train, train_step
    try:
        _reset_accelerate()
        args = planned_args(text_file, out, "--checkpointing_steps", str(CHECKPOINT_AT), *extra)
        if not budget:
            at = args.index("--max_minutes")
            del args[at:at + 2]
        loop.main(args)
    finally:
        (shape_plan.SHAPES, shape_plan.time_shape, loop.time, checkpoints.rotate_checkpoints, Distillation.summed_loss,
         loop.train_step) = saved
        loop.train = real_train
        _reset_accelerate()
    return calls


def summary_of(out: Path) -> dict:
    return json.loads((out / "training_summary.json").read_text())


@pytest.fixture(scope="module")
def straight(text_file, tmp_path_factory) -> tuple[Path, Counter]:  # noqa: F811
    """A run in two phases never stopped, and its counts of steps and KL terms."""
    out = tmp_path_factory.mktemp("phases") / "run"
    return out, run_in_phases(text_file, out)


def test_a_budget_past_the_passes_of_one_model_trains_a_teacher_then_a_student(straight):
    out, calls = straight
    split = summary_of(out)["phases"]
    assert split["passes_of_one_model"] > PASSES_PER_MODEL and split["teacher_minutes"] == 0.05
    assert split["teacher"]["steps"] > CHECKPOINT_AT and split["student"]["steps"] > CHECKPOINT_AT
    assert split["student"]["distill_weight"] == 0.45 and len(split["teacher"]["weights_digest"]) == 64
    # the KL term is in the student's loss at every step (one micro-batch each), and never in the teacher's
    assert calls == {("teacher", "steps"): split["teacher"]["steps"], ("student", "steps"): split["student"]["steps"],
                     ("student", "kl"): split["student"]["steps"]}
    kept = split["model_kept"]
    assert split[kept]["eval_loss"] == min(split["teacher"]["eval_loss"], split["student"]["eval_loss"])
    assert summary_of(out)["steps"] == split[kept]["steps"]
    # the run's training time is both phases' (what a comparison at equal wall time must give the other side)
    both = split["teacher"]["train_seconds"] + split["student"]["train_seconds"]
    assert summary_of(out)["train_seconds"] == round(both, 2)
    run = summary_of(out)  # and its rate is the one of both phases' tokens over both phases' time
    assert run["tokens_per_second"] == round(run["tokens_seen"] / run["train_seconds"], 1)


def test_the_folder_is_one_ordinary_model(straight):
    out, _ = straight
    assert not any(path.is_dir() for path in out.iterdir())  # no teacher, student or checkpoint folder is left
    summary = summary_of(out)
    assert summary["shape_plan"]["chosen"] == "2 x 32" and "distilled_from" not in summary
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    generated = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4, do_sample=False)
    assert generated.shape == (1, 7)
    card = (out / "README.md").read_text()
    assert "Two models" in card and f"holds the {summary['phases']['model_kept']}" in card
    # the card says whose figures each row gives: the kept model's steps and passes, both phases' tokens and time
    split, kept = summary["phases"], summary["phases"]["model_kept"]
    both = split["teacher"]["steps"] + split["student"]["steps"]
    assert f"| {summary['steps']:,} (the {kept}'s; both phases: {both:,}) |" in card
    assert f"| {split['minutes']:g} min in two phases, the {kept}'s {split[f'{kept}_minutes']:.3g} min: " in card
    assert "(both phases) |" in card and f"{summary['epochs']:.2f} (the {kept}'s)" in card


def test_a_resume_of_the_finished_folder_has_nothing_to_do(straight, text_file, capsys):  # noqa: F811
    out, _ = straight
    before = {path.name: path.stat().st_mtime_ns for path in out.iterdir()}
    run_in_phases(text_file, out, "--resume_from_checkpoint", "latest")
    assert "already complete" in capsys.readouterr().out
    assert {path.name: path.stat().st_mtime_ns for path in out.iterdir()} == before


def test_a_stop_between_the_summary_and_the_cleanup_renders_the_card_again(straight, text_file, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    shutil.copytree(straight[0], out)
    (out / phases.STUDENT_DIR).mkdir()  # the working folders were not removed yet; the card is the student's own
    (out / "README.md").write_text("the student's card")
    run_in_phases(text_file, out, "--resume_from_checkpoint", "latest")
    assert "Two models" in (out / "README.md").read_text() and not (out / phases.STUDENT_DIR).exists()


def test_keep_phases_leaves_both_models_with_their_checkpoints_beside_the_kept_one(text_file, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    run_in_phases(text_file, out, "--keep_phases")
    summary = summary_of(out)
    kept = summary["phases"]["model_kept"]
    assert summary["phases"][phases.FOLDERS_KEPT] is True and not phases.list_checkpoints(out)
    for name in (phases.TEACHER_DIR, phases.STUDENT_DIR):  # each a model folder with its own checkpoints
        assert phases.list_checkpoints(out / name) and (out / name / "model.safetensors").is_file()
        assert summary_of(out / name)["steps"] == summary["phases"][name]["steps"]
    assert load_file(out / "model.safetensors").keys() == load_file(out / kept / "model.safetensors").keys()
    assert all(torch.equal(value, load_file(out / kept / "model.safetensors")[key])
               for key, value in load_file(out / "model.safetensors").items())
    before = {str(path.relative_to(out)): path.stat().st_mtime_ns for path in out.rglob("*")}
    run_in_phases(text_file, out, "--resume_from_checkpoint", "latest")  # finished: nothing to do, folders kept
    assert {str(path.relative_to(out)): path.stat().st_mtime_ns for path in out.rglob("*")} == before
    card = out / "README.md"  # a stop between the summary and the card left the kept model's own card
    card.write_text("the student's card")
    os.utime(card, ns=(card.stat().st_atime_ns, (out / "training_summary.json").stat().st_mtime_ns - 1))
    run_in_phases(text_file, out, "--resume_from_checkpoint", "latest")
    assert "Two models" in card.read_text() and (out / phases.TEACHER_DIR).is_dir()
    with pytest.raises(ValueError, match="kept to be read"):  # a kept phase is not a run to resume
        run_in_phases(text_file, out / phases.TEACHER_DIR, "--resume_from_checkpoint", "latest")


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["teacher", "student"])
def test_a_kill_in_either_phase_then_a_resume_ends_on_the_weights_of_a_straight_run(straight, phase, text_file,  # noqa: F811
                                                                                 tmp_path, monkeypatch, caplog):
    out = tmp_path / "run"
    with pytest.raises(Killed):
        run_in_phases(text_file, out, die_in=phase)
    where = out / phases.STUDENT_DIR if phase == "student" else out
    assert (where / f"checkpoint-{CHECKPOINT_AT}").is_dir()
    if phase == "student":  # past the teacher, a resume reading other data is refused before any write
        with pytest.raises(ValueError, match="--seed 42"):
            run_in_phases(text_file, out, "--resume_from_checkpoint", "latest", "--seed", "7")
        assert sorted(p.name for p in where.iterdir() if p.name.startswith("checkpoint")) == [
            f"checkpoint-{CHECKPOINT_AT}"]
    with pytest.raises(ValueError, match=rf"planned for --max_minutes 0.1 in two phases .* the {phase}'s plan"):
        run_in_phases(text_file, out, "--resume_from_checkpoint", "latest", "--max_minutes", "0.02", budget=False)
    monkeypatch.chdir(text_file.parent)  # the same corpus named another way is the same data
    caplog.clear()
    resumed_steps = run_in_phases(Path(text_file.name), out, "--resume_from_checkpoint", "latest")
    said = " ".join(r.getMessage() for r in caplog.records)
    assert ("the student resumes in" in said) == (phase == "student") and "given --max_minutes" not in said
    split = summary_of(out)["phases"]  # the resume trained only what the checkpoint had not
    assert resumed_steps["teacher", "steps"] == (split["teacher"]["steps"] - CHECKPOINT_AT if phase == "teacher" else 0)
    assert resumed_steps["student", "steps"] == split["student"]["steps"] - (CHECKPOINT_AT if phase == "student" else 0)
    expected, resumed = load_file(straight[0] / "model.safetensors"), load_file(out / "model.safetensors")
    assert expected.keys() == resumed.keys()
    assert all(torch.equal(expected[name], resumed[name]) for name in expected)
    assert summary_of(out)["phases"]["model_kept"] == summary_of(straight[0])["phases"]["model_kept"]
    assert not any(path.is_dir() for path in out.iterdir())


@pytest.mark.slow
def test_a_student_resumed_with_max_steps_alone_lays_its_schedule_over_them(text_file, tmp_path, caplog):  # noqa: F811
    """As any resumed run: --max_steps N without --max_minutes replaces the student's plan (the teacher's record
    must not add its share of the budget beside it, which the resume refuses as a contradiction)."""
    out = tmp_path / "run"
    with pytest.raises(Killed):
        run_in_phases(text_file, out, die_in="student")
    caplog.clear()
    steps = run_in_phases(text_file, out, "--resume_from_checkpoint", "latest", "--max_steps", str(CHECKPOINT_AT + 30),
                          budget=False)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"the student resumes in {out / phases.STUDENT_DIR}, learning from the teacher, for --max_steps" in said
    assert steps["student", "steps"] == 30 and steps["teacher", "steps"] == 0
    split = summary_of(out)["phases"]
    assert split["student"]["steps"] == CHECKPOINT_AT + 30 and not any(path.is_dir() for path in out.iterdir())


def test_a_budget_far_longer_than_its_corpus_can_use_is_said_so():
    assert shape_plan.too_many_passes(2 * PASSES_PER_MODEL) is None  # two models' worth: nothing to say
    said = shape_plan.too_many_passes(4.07e6)
    assert said.startswith("the budget passes over the data 4,070,000 times") and "shorter --max_minutes" in said


def test_the_card_gives_the_kept_models_share_and_a_budget_a_resume_gave_it():
    from hf_minitx.hub.card_training import training_rows

    phases_record = {"minutes": 2.0, "teacher_minutes": 1.0, "student_minutes": 1.0, "model_kept": "student",
                     "passes_of_one_model": 12.0, "passes_per_model": 10.0,
                     "teacher": {"steps": 90, "passes": 4.0, "eval_loss": 5.0},
                     "student": {"steps": 40, "passes": 2.0, "eval_loss": 4.9}}
    budget = {"budget_minutes": 1.0, "planned_steps": 40, "probe_steps": 20, "steps_run": 40, "ended_by": "plan"}
    rows = dict(training_rows({"phases": phases_record, "time_budget": budget, "steps": 40}))
    assert rows["Time budget"].startswith("2 min in two phases, the student's 1 min: 40 steps planned")
    rows = dict(training_rows({"phases": phases_record, "time_budget": {**budget, "budget_minutes": 2.47}}))
    assert rows["Time budget"].startswith("2 min in two phases, the student's 1 min (2.47 min given to a resume):")
