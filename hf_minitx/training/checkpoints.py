"""Checkpoint folders (``checkpoint-STEP/``): finding, validating and rotating them, and guarding an
output folder that already holds a run."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

CHECKPOINT_PREFIX = "checkpoint-"
RUN_STATE_FILE = "run_state.json"
RUN_MARKERS = ("metrics.jsonl", "training_summary.json", "model.safetensors")
_CHECKPOINT_NAME = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """``checkpoint-STEP`` folders of ``output_dir`` holding a run state, oldest (lowest step) first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _CHECKPOINT_NAME.match(p.name))]
    return [p for _, p in sorted(found) if (p / RUN_STATE_FILE).is_file()]


def resolve_checkpoint(spec: str, output_dir: str | Path) -> Path:
    """``latest`` (the newest checkpoint in ``output_dir``) or a checkpoint folder path."""
    if spec == "latest":
        checkpoints = list_checkpoints(output_dir)
        if not checkpoints:
            raise FileNotFoundError(
                f"--resume_from_checkpoint latest: {output_dir} holds no checkpoint-STEP folder; "
                "train with --checkpointing_steps N first, or start without --resume_from_checkpoint"
            )
        return checkpoints[-1]
    path = Path(spec)
    if not (path / RUN_STATE_FILE).is_file():
        raise FileNotFoundError(
            f"--resume_from_checkpoint {spec}: not a checkpoint folder (no {RUN_STATE_FILE}); "
            f"pass 'latest' or a {CHECKPOINT_PREFIX}STEP folder written by this training script"
        )
    return path


def read_run_state(checkpoint: Path) -> dict[str, Any]:
    """The training position and settings stored with a checkpoint."""
    return json.loads((checkpoint / RUN_STATE_FILE).read_text())


def write_run_state(checkpoint: Path, state: dict[str, Any]) -> None:
    """Store the training position and settings next to the accelerator state."""
    (checkpoint / RUN_STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))


def check_compatible(checkpoint: Path, stored: dict[str, Any], expected: dict[str, Any]) -> None:
    """Refuse to resume when the checkpoint was made with other model/data settings."""
    different = {}
    for key, value in expected.items():
        old = stored.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            for sub in sorted(set(old) | set(value)):
                if old.get(sub) != value.get(sub):
                    different[f"{key}.{sub}"] = (old.get(sub), value.get(sub))
        elif old != value:
            different[key] = (old, value)
    if different:
        lines = "\n".join(f"  {k}: checkpoint has {old!r}, this run has {new!r}" for k, (old, new) in different.items())
        raise ValueError(
            f"checkpoint {checkpoint} comes from another configuration:\n{lines}\n"
            "Resume with the same settings, or start a new run in another --output_dir."
        )


def rotate_checkpoints(output_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest checkpoints; returns the deleted folders."""
    checkpoints = list_checkpoints(output_dir)
    doomed = checkpoints[: max(0, len(checkpoints) - max(keep, 1))]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def check_output_dir(output_dir: str | Path, *, overwrite: bool, resuming: bool) -> None:
    """Refuse an output folder that holds another run, unless overwriting or resuming."""
    root = Path(output_dir)
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"--output_dir {root} is a file; give a folder path")
    if overwrite or resuming or not root.is_dir():
        return
    markers = [name for name in RUN_MARKERS if (root / name).exists()]
    markers += [p.name for p in root.glob(f"{CHECKPOINT_PREFIX}*")]
    if markers:
        raise FileExistsError(
            f"--output_dir {root} already holds a run ({', '.join(sorted(markers)[:4])}). Pass "
            "--overwrite_output_dir to replace it, --resume_from_checkpoint latest to continue it, "
            "or choose another --output_dir."
        )


def clear_previous_run(output_dir: str | Path) -> None:
    """With --overwrite_output_dir: remove the previous run's checkpoints and metrics (nothing else)."""
    root = Path(output_dir)
    for path in root.glob(f"{CHECKPOINT_PREFIX}*"):
        if path.is_dir():
            shutil.rmtree(path)
    for name in RUN_MARKERS:
        (root / name).unlink(missing_ok=True)
