"""Two models for a budget one model cannot use: a teacher, then a student that learns from it.

A model stops learning from text it has read many times (Muennighoff et al. 2023 fit R* = 15.4 passes; Kim et
al. 2025, "Pre-training under infinite compute", see the same), while a second model that learns from the first,
finished one goes on. So when a time budget that chooses the shape (``shape_plan.plans_shape``) would pass over the
corpus more than ``PASSES_PER_MODEL`` times (about where splitting began to pay in this project's screens), the run
splits it (``shape_plan.plan_phases``; docs/recipe-log.md, "A second model"):

    teacher   the run itself, in --output_dir, with ``TEACHER_SHARE`` of the budget: an ordinary run whose
              shape plan records the split (``PHASES``), so that its resume keeps it (one process only)
    student   the same shape and seed, the rest of the budget, in OUTPUT/student; its loss adds the KL term
              to the frozen teacher, copied whole to OUTPUT/teacher first (``--distill_from``)
    promote   the one with the lower validation loss becomes the folder's model; the summary and the card
              record both, the two working folders are removed: one ordinary model folder is left
              (``--keep_phases`` keeps them, each with its checkpoints, e.g. for the benchmark's averaged pair)

Each step can be killed and resumed with the same command plus ``--resume_from_checkpoint latest``: the teacher
resumes as any run does, ``continue_phases`` finds where the rest stands (the teacher copy, the student's
checkpoints, the promotion) and goes on from there. Every step of it is idempotent.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..data.sources import dataset_key
from ..folders import (
    LOCK_FILE,
    PARTIAL_SUFFIX,
    RUN_MARKER,
    SUMMARY_FILE,
    read_summary,
    unlock_folder,
    weights_digest,
    write_file,
)
from ..hub.card import CARD_FILE
from .arguments import DataArguments, ModelArguments, TrainArguments
from .checkpoints import list_checkpoints
from .end_of_run import write_card
from .outputs import tokens_per_second
from .shape_plan import PHASES, SHAPE_PLAN, check_phase_budget, planned_split

logger = logging.getLogger(__name__)

TEACHER_DIR, STUDENT_DIR = "teacher", "student"  # working folders inside --output_dir, removed at the end (or kept)
FOLDERS_KEPT = "folders_kept"  # in the phases' record: --keep_phases left both working folders


def teacher_summary(output_dir: Path) -> dict[str, Any] | None:
    """The finished teacher's summary when the run is past its first phase: the copy in OUTPUT/teacher, or the
    folder's own before the copy; None for any other folder (one model, or a teacher not finished)."""
    for folder in (output_dir / TEACHER_DIR, output_dir):
        summary = read_summary(folder)
        if summary is not None and planned_split(summary.get(SHAPE_PLAN)):
            return summary
    return None


def past_first_phase(output_dir: str | None) -> bool:
    """Whether a resumed run's folder holds a finished teacher (or the promoted model): ``continue_phases`` goes
    on from there. A phase's folder kept by --keep_phases is refused: its run is finished in the folder above."""
    if output_dir is None:
        return False
    folder = Path(output_dir)
    if folder.name in (TEACHER_DIR, STUDENT_DIR) and folders_kept(folder.parent):
        raise ValueError(f"{folder} is the {folder.name} of a finished run in two phases, kept to be read "
                         f"(--keep_phases); the run's model is in {folder.parent}: start a new run in another "
                         "--output_dir, or pass it as --distill_from")
    return finished(folder) or teacher_summary(folder) is not None


def finished(output_dir: Path) -> bool:
    """Whether the folder holds the promoted model of a run in two phases."""
    summary = read_summary(output_dir)
    return bool(summary and (summary.get(PHASES) or {}).get("model_kept"))


def continue_phases(model_args: ModelArguments, data_args: DataArguments, train_args: TrainArguments,
                    output_dir: Path, train: Callable[..., Path]) -> Path:
    """After the teacher finished in ``output_dir``: copy it, train (or resume) the student with ``train`` (the
    loop's), promote the better one. Called at the teacher's end, and by a resume that finds the teacher finished.
    ``output_dir`` is locked by the caller."""
    if finished(output_dir):
        working = any((output_dir / name).exists() for name in (TEACHER_DIR, STUDENT_DIR))
        if (working and not folders_kept(output_dir)) or _card_older_than_summary(output_dir):
            write_card(output_dir)  # stopped between the summary and the cleanup: the card may be the student's own
        else:
            print(f"{output_dir} is already complete: it holds the {read_summary(output_dir)[PHASES]['model_kept']} "
                  "of a run in two phases; nothing to do")
    else:
        record = teacher_summary(output_dir)
        check_same_run(record, data_args, train_args, output_dir)
        copy_teacher(output_dir)
        train_student(model_args, data_args, train_args, output_dir, record, train)
        promote(output_dir, record, keep=train_args.keep_phases)
    if not folders_kept(output_dir):
        for name in (TEACHER_DIR, STUDENT_DIR):
            shutil.rmtree(output_dir / name, ignore_errors=True)
    if train_args.push_to_hub and train_args.hub_model_id:
        from ..hub.push import push_to_hub

        push_to_hub(output_dir, train_args.hub_model_id)
    return output_dir


def check_same_run(record: dict[str, Any], data_args: DataArguments, train_args: TrainArguments,
                   output_dir: Path) -> None:
    """The student of a resumed run reads the teacher's data with its seed (and so its validation split)."""
    split = record[SHAPE_PLAN][PHASES]
    for name, recorded, given in (("dataset", split.get("dataset"), dataset_key(data_args.dataset)),
                                  ("seed", record.get("seed"), train_args.seed)):
        if recorded != given:
            raise ValueError(f"{output_dir} holds the teacher of a run with --{name} {recorded}, not {given}: resume "
                             f"it with --{name} {recorded}, or start a new run in another --output_dir")


def copy_teacher(output_dir: Path) -> Path:
    """The finished teacher's files (not its checkpoints) into OUTPUT/teacher, whole or not at all."""
    teacher = output_dir / TEACHER_DIR
    if teacher.is_dir():
        return teacher
    partial = output_dir / f".{TEACHER_DIR}{PARTIAL_SUFFIX}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    for path in _model_files(output_dir):
        shutil.copy2(path, partial / path.name)
    partial.rename(teacher)
    return teacher


def train_student(model_args: ModelArguments, data_args: DataArguments, train_args: TrainArguments,
                  output_dir: Path, record: dict[str, Any], train: Callable[..., Path]) -> None:
    """The student's run in OUTPUT/student: the teacher's shape and tokenizer, the rest of the budget, the KL
    term to the teacher; resumed from its latest checkpoint when it has one, started again when it has none."""
    student, teacher = output_dir / STUDENT_DIR, output_dir / TEACHER_DIR
    if read_summary(student) is not None:
        return
    split, shape = record[SHAPE_PLAN][PHASES], record[SHAPE_PLAN]["settings"]
    overrides = ",".join(filter(None, [model_args.config_overrides,
                                       ",".join(f"{key}={value}" for key, value in shape.items())]))
    resume = student.is_dir() and bool(list_checkpoints(student))
    if student.is_dir() and not resume:
        logger.warning("%s holds no checkpoint of the student (--checkpointing_steps saves them): it starts again "
                       "from its first step", student)
    if resume and train_args.max_steps is None:
        check_phase_budget(split, train_args.max_minutes, "student")
    minutes = student_minutes(split, train_args.max_minutes, (record.get("time_budget") or {}).get("budget_minutes"))
    if resume and train_args.max_minutes is None and train_args.max_steps is not None:
        minutes = None  # as any resumed run: --max_steps N without --max_minutes lays its schedule over N steps
    args = replace(train_args, output_dir=str(student), max_minutes=minutes,
                   distill_from=str(teacher), resume_from_checkpoint="latest" if resume else None,
                   overwrite_output_dir=not resume, push_to_hub=False)
    if resume:  # its budget follows the rules of any resumed run: a plan made goes on, the clock may move
        given = ("" if minutes == split["student_minutes"] else f", for --max_steps {args.max_steps}"
                 if minutes is None else f", given --max_minutes {minutes:g}")
        logger.warning("the student resumes in %s, learning from the teacher%s", student, given)
    else:
        cap = "" if args.max_steps is None else f" (at most --max_steps {args.max_steps})"
        logger.warning("the budget passes over the data %.1f times, more than one model learns from: the student "
                       "trains for %.3g min%s in %s, learning from the teacher", split["passes_of_one_model"], minutes,
                       cap, student)
    try:
        train(replace(model_args, config_overrides=overrides), replace(data_args, tokenizer=str(teacher)), args)
    finally:
        unlock_folder(student)


def student_minutes(split: dict[str, Any], given: float | None, teacher_minutes: float | None = None) -> float:
    """The student's budget: its share of the split, or a --max_minutes given to a resume of the student (a longer
    one, as a budget that ran out inside its timing probe asks for). One that is the whole budget, the teacher's
    share, or the budget the teacher itself ran to (``teacher_minutes``: a resume of the teacher with it) is not
    the student's. A student with a plan keeps it, as any resumed run does: the budget then only moves its clock."""
    if given is None or any(math.isclose(given, minutes) for minutes in (
            split["minutes"], split["teacher_minutes"], teacher_minutes or split["teacher_minutes"])):
        return split["student_minutes"]
    return given


def promote(output_dir: Path, record: dict[str, Any], keep: bool = False) -> None:
    """The model with the lower validation loss becomes the folder's; the summary records both phases and marks the
    run finished, then the card is rendered again from it (a stop before the working folders are removed renders
    it again: ``continue_phases``). ``keep`` (--keep_phases): the teacher's checkpoints move into OUTPUT/teacher,
    and both working folders stay, recorded as kept."""
    teacher, student = read_summary(output_dir / TEACHER_DIR), read_summary(output_dir / STUDENT_DIR)
    kept = "student" if _eval_loss(student) <= _eval_loss(teacher) else "teacher"
    chosen = output_dir / (STUDENT_DIR if kept == "student" else TEACHER_DIR)
    for path in _model_files(chosen):
        if path.name != SUMMARY_FILE:
            shutil.copy2(path, output_dir / path.name)
    for checkpoint in list_checkpoints(output_dir):  # the teacher's: nothing is left to resume
        if keep:
            checkpoint.rename(output_dir / TEACHER_DIR / checkpoint.name)
        else:
            shutil.rmtree(checkpoint)
    summary = {**(student if kept == "student" else teacher), "run_id": teacher.get("run_id"),  # the folder's run
               "config_overrides": record.get("config_overrides"),
               SHAPE_PLAN: record[SHAPE_PLAN],  # the teacher's choice, which the student took over
               PHASES: {**record[SHAPE_PLAN][PHASES], "model_kept": kept,
                        "teacher": {**_phase_figures(teacher),
                                    "weights_digest": weights_digest(output_dir / TEACHER_DIR)},
                        "student": {**_phase_figures(student), **_distillation(student)},
                        FOLDERS_KEPT: keep}}
    summary.pop("distilled_from", None)  # the teacher's folder is removed (or kept): its digest is in the record
    for name in ("train_seconds", "tokens_seen"):  # the run's: both phases' (the kept model's are in its record)
        summary[name] = round(teacher.get(name, 0) + student.get(name, 0), 2)
    summary["tokens_per_second"] = tokens_per_second(summary["tokens_seen"], summary["train_seconds"])
    write_file(output_dir / SUMMARY_FILE, lambda tmp: tmp.write_text(json.dumps(summary, indent=2)))
    write_card(output_dir)


def folders_kept(output_dir: Path) -> bool:
    """Whether the finished run recorded its teacher's and student's folders as kept (--keep_phases)."""
    summary = read_summary(output_dir)
    return bool(summary and (summary.get(PHASES) or {}).get(FOLDERS_KEPT))


def _card_older_than_summary(output_dir: Path) -> bool:
    """Whether the card was not rendered since the summary was written (a stop between the two; the promoted
    model's own card is copied with its older time)."""
    card, summary = output_dir / CARD_FILE, output_dir / SUMMARY_FILE
    return not card.is_file() or card.stat().st_mtime_ns < summary.stat().st_mtime_ns


def _phase_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """What the summary and the card say of one phase."""
    metrics = summary.get("final_metrics") or {}
    return {"steps": summary.get("steps"), "passes": summary.get("epochs"),
            "train_seconds": summary.get("train_seconds"), "eval_loss": _eval_loss(summary),
            "eval_bits_per_byte": metrics.get("eval_bits_per_byte")}


def _distillation(summary: dict[str, Any]) -> dict[str, Any]:
    """The KL term's weight and temperature the student trained with."""
    teacher = summary.get("distilled_from") or {}
    return {"distill_weight": teacher.get("weight"), "distill_temperature": teacher.get("temperature")}


def _eval_loss(summary: dict[str, Any]) -> float:
    value = (summary.get("final_metrics") or {}).get("eval_loss")
    return float("inf") if value is None else float(value)


def _model_files(folder: Path) -> list[Path]:
    """The files of a finished run's folder that make its model (everything but checkpoints, the run's marker and
    lock, and hidden or working folders)."""
    return sorted(path for path in folder.iterdir() if path.is_file() and path.name not in (RUN_MARKER, LOCK_FILE)
                  and not path.name.startswith("."))


