"""Reading a saved model folder without loading it: config.json and the safetensors header.

These are the checks the one folder loader (`hf_minitx.inference.load_model_folder`) runs before it loads
anything, and that the Hub checks (`hf_minitx.hub.folder`) and the explorer reuse: they read only small
files and file headers, so they are fast for any model size, and each refusal names the file and the fix.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any

from .folders import describe_owner, lock_holder

MODEL_TYPE = "minitx"
MODEL_KINDS = ("causal-lm", "seq2seq")  # the two models: a decoder-only language model and an encoder-decoder
WEIGHTS_FILE = "model.safetensors"
# Bytes per element of each safetensors dtype.
SAFETENSORS_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8,
}


def model_kind(config: dict | Any) -> str:
    """"seq2seq" for an encoder-decoder config (config.json read as a dict, or a config object), else "causal-lm"."""
    encoder_decoder = config.get("is_encoder_decoder") if isinstance(config, dict) else config.is_encoder_decoder
    return MODEL_KINDS[1] if encoder_decoder else MODEL_KINDS[0]


class ModelFolderError(ValueError):
    """A model folder is missing a file or holds a broken one; the message names each file."""


def is_interrupted_run(folder: Path) -> bool:
    """Whether ``folder`` is a training run that was interrupted: checkpoints, and no final config.json."""
    return not (folder / "config.json").is_file() and any(folder.glob("checkpoint-*/run_state.json"))


def refuse_interrupted_run(folder: Path) -> None:
    """A training run that was interrupted (checkpoints, no final config.json) is refused, saying how to finish it
    and how to look at its checkpoints meanwhile."""
    if is_interrupted_run(folder):
        owner = lock_holder(folder)
        if owner is not None:  # not interrupted: its run is still going
            raise FileNotFoundError(f"{folder} holds checkpoints but no final model yet: its run is still going "
                                    f"({describe_owner(owner)}). Wait for it to finish; `minitx explore --model "
                                    f"{folder} --run {folder}` shows its checkpoints meanwhile")
        raise FileNotFoundError(f"{folder} holds checkpoints but no final model (no config.json): its run was "
                                "interrupted. Resume it with the same `minitx train` command plus "
                                "--resume_from_checkpoint latest; its final folder can then be read. `minitx "
                                f"explore --model {folder} --run {folder}` shows its checkpoints meanwhile")


def check_model_path(folder: Path) -> None:
    """Refuse a model path that does not exist or is a file, saying so (rather than "no config.json")."""
    if not folder.exists():
        raise FileNotFoundError(f"{folder} does not exist; pass the folder of a saved model (the --output_dir of a "
                                "training run)")
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file, not a model folder; pass the folder of a saved model (the "
                                 "--output_dir of a training run)")


def read_folder_config(folder: Path) -> dict:
    """config.json of a MiniTx folder as a dict; anything else is refused with the reason and the fix."""
    path = folder / "config.json"
    check_model_path(folder)
    if not path.is_file():
        refuse_interrupted_run(folder)
        if re.fullmatch(r"checkpoint-\d+", folder.name) and (folder / "run_state.json").is_file():
            raise FileNotFoundError(f"{folder} is a training checkpoint (the state a run resumes from), not a model "
                                    f"folder; pass its run's folder {folder.parent}, or see the run's checkpoints "
                                    f"with `minitx explore --model {folder.parent} --run {folder.parent}`")
        raise FileNotFoundError(f"{folder} is not a model folder (no config.json); "
                                "pass the --output_dir of a training run")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); save the model again with save_pretrained") from None
    if not isinstance(config, dict) or config.get("model_type") != MODEL_TYPE:
        found = config.get("model_type") if isinstance(config, dict) else None
        raise ValueError(f"{folder} is not a MiniTx folder: config.json has model_type {found!r}, not {MODEL_TYPE!r}; "
                         "pass a folder written by minitx train or MiniTx*.save_pretrained")
    return config


def read_safetensors_header(path: str | Path) -> dict:
    """Parse and check the header of a .safetensors file without reading the tensor data.

    Returns {tensor name: {"dtype", "shape", "data_offsets"}} (the "__metadata__" entry removed).
    Raises ModelFolderError naming the file when it is truncated, corrupted or inconsistent.
    """
    path = Path(path)
    size = path.stat().st_size
    fix = f"Save the model again (model.save_pretrained) or re-download {path.name}."
    if size < 8:
        raise ModelFolderError(f"{path} is truncated: {size} bytes, too short for a safetensors header. {fix}")
    with path.open("rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        if header_len > size - 8:
            raise ModelFolderError(
                f"{path} is truncated or corrupted: its header claims {header_len} bytes but the file has "
                f"only {size - 8} after the length field. {fix}"
            )
        raw = handle.read(header_len)
    try:
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (UnicodeDecodeError, ValueError) as error:
        raise ModelFolderError(f"{path} is corrupted: its header is not valid JSON ({error}). {fix}") from None
    header.pop("__metadata__", None)
    data_end = 0
    for name, entry in header.items():
        try:
            itemsize = SAFETENSORS_ITEMSIZE[entry["dtype"]]
            begin, end = (int(x) for x in entry["data_offsets"])
            numel = math.prod(int(d) for d in entry["shape"])
        except (KeyError, TypeError, ValueError):
            raise ModelFolderError(
                f"{path} is corrupted: the header entry of tensor {name!r} is malformed. {fix}") from None
        if end - begin != numel * itemsize or begin < 0:
            raise ModelFolderError(
                f"{path} is corrupted: tensor {name!r} of shape {entry['shape']} ({entry['dtype']}) spans "
                f"{end - begin} bytes instead of {numel * itemsize}. {fix}"
            )
        data_end = max(data_end, end)
    expected = 8 + header_len + data_end
    if size < expected:
        raise ModelFolderError(f"{path} is truncated: expected {expected} bytes, found {size}. {fix}")
    if size > expected:
        raise ModelFolderError(f"{path} is corrupted: {size - expected} unexpected bytes after the tensor data. {fix}")
    return header


def count_parameters(header: dict) -> int:
    """Number of stored values in a safetensors header (tied weights are stored, and counted, once)."""
    return sum(math.prod(int(d) for d in entry["shape"]) for entry in header.values())
