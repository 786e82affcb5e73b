"""Checkpoint folders (``checkpoint-STEP/``): writing (``save_checkpoint``), finding, validating (every file read
before any work, a damaged one named) and rotating them."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from ..data.corpus import dataset_key
from ..data.streaming import load_stream_state, save_stream_position
from ..folders import PARTIAL_SUFFIX, RUN_MARKER, check_marker, free_mib, holds_run_files, honour_umask, write_errno
from .outputs import SUMMARY_FILE

if TYPE_CHECKING:
    from .state import RunState, TrainingRun

CHECKPOINT_PREFIX = "checkpoint-"
RUN_STATE_FILE = "run_state.json"
MODEL_FILES = ("model.safetensors", "pytorch_model.bin", "pytorch_model_fsdp.bin")  # the last: FSDP's whole weights
OPTIMIZER_FILE = "optimizer.bin"
# what accelerator.load_state reads besides the model: the optimizer, the scheduler (registered for
# checkpointing) and the first process's random generators (accelerate skips missing ones silently)
STATE_FILES = (OPTIMIZER_FILE, "custom_checkpoint_0.pkl", "random_states_0.pkl")
_FIX = ("delete that checkpoint folder and resume from an older one (--resume_from_checkpoint PATH), "
        "or start again with --overwrite_output_dir")
_CHECKPOINT_NAME = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """``checkpoint-STEP`` folders of ``output_dir`` holding a run state, oldest (lowest step) first."""
    return [p for p in _numbered_checkpoints(output_dir) if (p / RUN_STATE_FILE).is_file()]


def _numbered_checkpoints(output_dir: str | Path) -> list[Path]:
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _CHECKPOINT_NAME.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def resolve_checkpoint(spec: str, output_dir: str | Path) -> Path:
    """``latest`` (the newest complete checkpoint in ``output_dir``) or a checkpoint folder path.

    Checkpoints are renamed into place once complete, so a ``checkpoint-STEP`` without its run state is
    left over from an older, interrupted save: ``latest`` skips it and says so.
    """
    if spec == "latest":
        numbered, checkpoints = _numbered_checkpoints(output_dir), list_checkpoints(output_dir)
        newer = numbered[numbered.index(checkpoints[-1]) + 1:] if checkpoints else numbered
        for skipped in newer:
            print(f"skipping incomplete checkpoint {skipped} (no {RUN_STATE_FILE})", file=sys.stderr)
        if not checkpoints:
            raise FileNotFoundError(
                f"--resume_from_checkpoint latest: {output_dir} holds no checkpoint-STEP folder; "
                "train with --checkpointing_steps N first, or start without --resume_from_checkpoint"
            )
        return checkpoints[-1]
    path = Path(spec)
    if not (path / RUN_STATE_FILE).is_file():
        inside = Path(output_dir) / spec
        what = "does not exist" if not path.exists() else f"is not a checkpoint folder (no {RUN_STATE_FILE})"
        hint = (f" (a path is read from the current folder: did you mean {inside}?)"
                if not path.is_absolute() and (inside / RUN_STATE_FILE).is_file() else "")
        raise FileNotFoundError(
            f"--resume_from_checkpoint {spec} {what}{hint}; pass 'latest' or a {CHECKPOINT_PREFIX}STEP folder "
            "written by this training script"
        )
    return path


def read_run_state(checkpoint: Path) -> dict[str, Any]:
    """The training position and settings stored with a checkpoint; a damaged file is named."""
    path = checkpoint / RUN_STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        reason = f"{type(error).__name__}: {error}"
        raise ValueError(f"{path} cannot be read ({reason}); {_FIX.format(checkpoint)}") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise ValueError(f"{path} is not a run state (a JSON object with a step); {_FIX.format(checkpoint)}")
    return state


def write_run_state(checkpoint: Path, state: dict[str, Any]) -> None:
    """Store the training position and settings next to the accelerator state."""
    (checkpoint / RUN_STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))


def check_checkpoint_files(checkpoint: Path, *, streaming: bool = False, step: int | None = None) -> None:
    """Read every file ``accelerator.load_state`` (and, streaming, the stream position) will read, so that a
    missing or damaged one is named before any work; with ``step`` (the run state's), the scheduler and the
    optimizer must have counted as many steps."""
    required = [*STATE_FILES, *(["stream_state_0.npz"] if streaming else [])]
    missing = [name for name in required if not (checkpoint / name).is_file()]
    if not any((checkpoint / name).is_file() for name in MODEL_FILES):
        missing.insert(0, f"{', '.join(MODEL_FILES[:-1])} or {MODEL_FILES[-1]}")
    if missing:
        raise ValueError(f"checkpoint {checkpoint} is incomplete: {checkpoint / missing[0]} is missing; "
                         f"{_FIX.format(checkpoint)}")
    counted: dict[str, int | None] = {}
    for path in sorted(checkpoint.iterdir()):
        try:
            if path.suffix == ".safetensors":
                with safe_open(str(path), framework="pt") as handle:
                    for key in handle.keys():
                        handle.get_slice(key)
            elif path.suffix in (".bin", ".pkl", ".pt"):
                loaded = torch.load(path, map_location="cpu", weights_only=False)
                if path.name in STEP_COUNTERS:
                    counted[path.name] = STEP_COUNTERS[path.name](loaded)
            elif path.suffix == ".npz":
                load_stream_state(path)
        except Exception as error:  # noqa: BLE001  torch, pickle, zip and safetensors each raise their own kinds
            detail = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ValueError(f"{path} cannot be read ({type(error).__name__}: {detail}); "
                             f"{_FIX.format(checkpoint)}") from None
    if step is not None:
        check_step_counts(checkpoint, step, counted)


def _scheduler_steps(state: Any) -> int | None:
    """The steps a saved LR scheduler state counted (its ``last_epoch``)."""
    last = state.get("last_epoch") if isinstance(state, dict) else None
    return last if isinstance(last, int) else None


def _optimizer_steps(state: Any) -> int | None:
    """The most steps any parameter of a saved optimizer state counted (AdamW's ``step``; Muon keeps none), in
    a plain optimizer's state or in each part of a combined one."""
    if not isinstance(state, dict):
        return None
    parts = [state] if "state" in state else [v for v in state.values() if isinstance(v, dict) and "state" in v]
    steps = [int(value["step"]) for part in parts if isinstance(part["state"], dict)
             for value in part["state"].values() if isinstance(value, dict) and "step" in value]
    return max(steps) if steps else None


STEP_COUNTERS = {"custom_checkpoint_0.pkl": _scheduler_steps, OPTIMIZER_FILE: _optimizer_steps}


def check_step_counts(checkpoint: Path, step: int, counted: dict[str, int | None]) -> None:
    """Refuse a run state whose step is not the one the scheduler counted, or below the optimizer's count (an
    edited or mixed-up ``run_state.json``): resuming would start the schedule, the data order and the run's length
    elsewhere. The optimizer may count fewer: a mixed-precision loss scaler skips the steps whose gradients
    overflow."""
    for name, steps in counted.items():
        if steps is not None and (steps > step if name == OPTIMIZER_FILE else steps != step):
            raise ValueError(
                f"checkpoint {checkpoint} is damaged: {RUN_STATE_FILE} says step {step}, but its "
                f"{'optimizer' if name == OPTIMIZER_FILE else 'scheduler'} ({name}) counted {steps} steps; "
                f"{_FIX.format(checkpoint)}")


def check_checkpoint_fits(checkpoint: Path, model: torch.nn.Module) -> None:
    """The checkpoint's weights have the names and shapes of ``model`` (a checkpoint of another vocabulary or
    shape is named here, not in a size-mismatch error inside ``load_state``)."""
    path = next(checkpoint / name for name in MODEL_FILES if (checkpoint / name).is_file())
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as handle:
            saved = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
    else:
        saved = {key: tuple(value.shape) for key, value in torch.load(path, map_location="cpu").items()}
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    for key in sorted(saved):  # a weight the file leaves out may be tied to another (safetensors drops those)
        if saved[key] != expected.get(key):
            raise ValueError(
                f"{path} does not fit this model: {key} is {saved[key]} in the checkpoint and "
                f"{expected.get(key) or 'absent'} in the model (another vocabulary or model shape); "
                f"{_FIX.format(checkpoint)}")


def check_same_run(output_dir: Path, checkpoint: Path, state: dict[str, Any]) -> None:
    """A run resumes in its own folder: the checkpoint must lie in ``output_dir`` and carry its run id."""
    if checkpoint.resolve().parent != output_dir.resolve():
        raise ValueError(
            f"checkpoint {checkpoint} belongs to the run in {checkpoint.parent}, not to --output_dir {output_dir}; "
            f"resume it there (--output_dir {checkpoint.parent} --resume_from_checkpoint latest)"
        )
    marker = check_marker(output_dir)  # a damaged marker is named, not silently rewritten
    if marker and state.get("run_id") and marker.get("run_id") != state["run_id"]:
        raise ValueError(f"checkpoint {checkpoint} was made by run {state['run_id']}, but {output_dir} belongs to "
                         f"run {marker.get('run_id')}; resume a checkpoint of this folder's own run")
    if marker is None:  # no marker (deleted): the folder's other records of its run
        for where, run_id in _recorded_runs(output_dir, checkpoint):
            if run_id != state.get("run_id"):
                raise ValueError(
                    f"checkpoint {checkpoint} was made by run {state.get('run_id') or '(none recorded)'}, but {where} "
                    f"records run {run_id} "
                    f"(and {output_dir} has no {RUN_MARKER}): it was copied from another run, and resuming it would "
                    "replace this folder's own model; resume it in its own run's folder, or remove it")


def _recorded_runs(output_dir: Path, checkpoint: Path) -> list[tuple[Path, str]]:
    """(file, run id) of what ``output_dir`` holds of its run besides ``checkpoint``: the final summary and the
    other checkpoints' run states (unreadable ones are skipped: they are checked where they are read)."""
    files = [output_dir / SUMMARY_FILE, *(p / RUN_STATE_FILE for p in list_checkpoints(output_dir)
                                         if p.resolve() != checkpoint.resolve())]
    found = []
    for path in files:
        try:
            run_id = json.loads(path.read_text()).get("run_id")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(run_id, str) and run_id:
            found.append((path, run_id))
    return found


def check_compatible(checkpoint: Path, stored: dict[str, Any], expected: dict[str, Any]) -> None:
    """Refuse to resume when the checkpoint was made with other model/data settings."""
    different = {}
    for key, value in expected.items():
        if key == INPUT_FILES or (key in (*SPLIT_FIELDS, RECIPE, *PAIR_LENGTHS) and key not in stored):
            continue  # compared by check_same_inputs; fields of checkpoints older than their recording
        old = stored.get(key)
        if key == "dataset" and isinstance(old, str) and (dataset_key(old) == value or _all_moved(stored, expected)):
            continue  # the same files named another way (./corpus.txt, its absolute path), or moved whole
        if isinstance(old, dict) and isinstance(value, dict):
            before = RECORDED_SINCE if key == RECIPE else {}
            for sub in sorted(set(old) | set(value)):
                if old.get(sub, before.get(sub)) != value.get(sub):
                    different[f"{key}.{sub}"] = (old.get(sub, before.get(sub)), value.get(sub))
        elif old != value:
            different[key] = (old, value)
    if different:
        diff = "; ".join(f"{k}: checkpoint has {old!r}, this run has {new!r}" for k, (old, new) in different.items())
        recipe = (" (a resumed run goes on with its checkpoint's optimizer state and schedule, so a changed rate "
                  "would not apply)" if any(k.startswith(f"{RECIPE}.") for k in different) else "")
        raise ValueError(
            f"checkpoint {checkpoint} comes from another configuration ({diff}); "
            f"resume with the same settings{recipe}, or start a new run in another --output_dir"
        )


SPLIT_FIELDS = ("seed", "validation_split", "streaming")  # what defines the validation split, besides the files
PAIR_LENGTHS = ("max_source_length", "max_target_length")  # run identity, seq2seq: the tokens a pair is cut to
INPUT_FILES = "input_files"  # run identity key: {path: fingerprint} of the local files the run reads
RECIPE = "recipe"  # run identity key: the optimizer, its rates and decays, the schedule (prepare.optimizer_recipe)
# recipe fields older checkpoints lack: what those runs trained with
RECORDED_SINCE = {"late_dropout": 0.0, "embedding_weight_decay": 0.0, "cautious_weight_decay": False,
                  "input_noise": 0.0}


def _recorded_inputs(stored: dict[str, Any]) -> dict[str, str]:
    """The checkpoint's {real path: fingerprint} of its local inputs (older checkpoints kept paths as given)."""
    old = stored.get(INPUT_FILES)
    return {os.path.realpath(path): value for path, value in old.items()} if isinstance(old, dict) else {}


def moved_inputs(stored: dict[str, Any], expected: dict[str, Any]) -> dict[str, str]:
    """{old path: new path} of the checkpoint's input files that no longer exist where the run read them and are
    found, with the same size and content fingerprint, at a path this run reads instead (a project folder moved
    or a corpus renamed): the same input, so a resume goes on with it. A copy beside an original that still
    exists is another file, and stays refused."""
    old, new = _recorded_inputs(stored), expected.get(INPUT_FILES) or {}
    fresh = [path for path in new if path not in old]
    moves: dict[str, str] = {}
    for path in (p for p in old if p not in new and not os.path.exists(p)):
        match = next((q for q in fresh if new[q] == old[path] and q not in moves.values()), None)
        if match is not None:
            moves[path] = match
    return moves


def _all_moved(stored: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Whether this run reads exactly the checkpoint's input files, some of them moved (see ``moved_inputs``)."""
    moves = moved_inputs(stored, expected)
    new = expected.get(INPUT_FILES) or {}
    return bool(moves) and {moves.get(path, path) for path in _recorded_inputs(stored)} == set(new)


def check_same_inputs(checkpoint: Path, stored: dict[str, Any], expected: dict[str, Any],
                      accept_edits: bool = False, tokenizer: str | None = None) -> None:
    """Refuse to resume when a local input file (dataset, tokenizer) changed, appeared or vanished since the
    checkpoint's run started (checkpoints written before fingerprints were kept are not checked). With
    ``accept_edits`` a dataset file edited in place (e.g. converted to UTF-8) is accepted; one that appeared or
    vanished never is (it would move text between training and validation), nor is a changed file of the
    ``tokenizer`` folder (another token mapping makes the checkpoint's embeddings meaningless)."""
    if not isinstance(stored.get(INPUT_FILES), dict):
        return
    old, new = _recorded_inputs(stored), expected.get(INPUT_FILES) or {}
    for before, after in moved_inputs(stored, expected).items():
        print(f"note: {before} is read from {after} now (the same size and content): the run goes on with it")
        old[after] = old.pop(before)
    tokenizer_root = os.path.realpath(tokenizer) if tokenizer else None
    for path in sorted(set(old) | set(new), key=lambda path: (path not in old, path)):  # the run's own first
        edited = path in old and path in new
        of_tokenizer = tokenizer_root is not None and Path(path).is_relative_to(tokenizer_root)
        if old.get(path) == new.get(path) or (edited and accept_edits and not of_tokenizer):
            continue
        unread = path not in new and os.path.exists(path)  # still there: this resume reads others (a copied folder)
        how = ("changed (size or content)" if edited else "is not among this resume's inputs" if unread
               else "is gone" if path not in new else "is new")
        if of_tokenizer:
            raise ValueError(
                f"tokenizer file {path} {how} since the run in checkpoint {checkpoint} started: the checkpoint's "
                "embeddings belong to the old token mapping, so no resume can go on with another tokenizer "
                "(--accept_changed_inputs included); restore the --tokenizer folder, or start a new run in another "
                "--output_dir")
        fix = ("restore the file, or pass --accept_changed_inputs to go on with the edited file, or start a new "
               "run in another --output_dir") if edited else ("resume with the files the run read (a copied run "
               "folder reads its own copies: resume the original), or start a new run in another --output_dir"
               ) if unread else "restore it, or start a new run in another --output_dir"
        raise ValueError(
            f"input file {path} {how} since the run in checkpoint {checkpoint} started; resuming would go on "
            f"with other data than the run (and its tokenizer) began with: {fix}"
        )


def rotate_checkpoints(output_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest checkpoints; returns the deleted folders."""
    checkpoints = list_checkpoints(output_dir)
    doomed = checkpoints[: max(0, len(checkpoints) - max(keep, 1))]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def write_failure(error: BaseException, where: Path, output_dir: Path) -> BaseException:
    """One-line error for a write that failed (disk full, read-only, quota): the folder, its free space and the
    last good checkpoint. ``error`` itself is returned when it is not a failure to write."""
    torch_write = isinstance(error, RuntimeError) and any(
        text in str(error) for text in ("file write failed", "unexpected pos", "PytorchStreamWriter"))
    code = write_errno(error)
    if code is None and not torch_write:
        return error
    reason = os.strerror(code) if code is not None else "the file write failed"
    free = free_mib(where) * 2**20
    last = list_checkpoints(output_dir) if output_dir.is_dir() else []
    resume = (f"the last good checkpoint, {last[-1]}, is intact: free some space, then resume with the same "
              "command plus --resume_from_checkpoint latest" if last else
              "no checkpoint was saved before: free some space and start the run again with the same command"
              f"{' plus --overwrite_output_dir' if output_dir.is_dir() and holds_run_files(output_dir) else ''}")
    return OSError(f"cannot write {where.parent} ({reason}; {free / 2**20:,.0f} MiB free there); the unfinished "
                   f"{where.name} was removed and {resume}")


def save_checkpoint(run: TrainingRun, state: RunState, stream_state: dict[str, Any] | None = None) -> Path:
    """Accelerator state (model, optimizer, scheduler, every process's RNG), the RunState and, streaming, the
    stream position (``stream_state``, or where the stream stands now); the oldest checkpoints are rotated.

    Everything is written into a hidden ``.checkpoint-STEP.partial`` folder that is renamed once complete,
    so a kill at any moment leaves no half-written ``checkpoint-STEP``; a full disk removes it and is one
    error naming the folder and its free space.
    """
    accelerator, path = run.accelerator, run.output_dir / f"{CHECKPOINT_PREFIX}{state.step}"
    partial = path.with_name(f".{path.name}{PARTIAL_SUFFIX}")
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state(str(partial), safe_serialization=False)  # every process saves its RNG state
        if run.stream is not None:  # and, streaming, its position in the stream
            save_stream_position(stream_state or run.stream.state_dict(), partial, accelerator.process_index)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            if run.best is not None:
                run.best.save(partial)
            write_run_state(partial, {**run.checkpoint_fields, "total_steps": run.settings.total_steps,
                                      **asdict(state)})
            honour_umask(partial)  # the best weights' safetensors file, written 0600, as readable as the rest
    except (OSError, RuntimeError) as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise write_failure(error, partial, run.output_dir) from None
    if accelerator.is_main_process:
        if path.exists():  # a checkpoint of an earlier session at the same step
            shutil.rmtree(path)
        partial.rename(path)
        rotate_checkpoints(run.output_dir, run.settings.save_total_limit)
    accelerator.wait_for_everyone()
    return path
