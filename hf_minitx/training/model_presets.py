"""Model presets and config overrides: ``MiniTxConfig`` fields from the JSON files shipped in the package
(``hf_minitx/training/presets/``, found with ``importlib.resources``) or given as a path, and from
``--config_overrides`` text; an unknown field is refused with the closest names.
"""

from __future__ import annotations

import difflib
import json
import typing
from argparse import ArgumentTypeError
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig
from transformers.hf_argparser import string_to_bool

from ..models import MiniTxConfig

PRESETS = resources.files(__package__) / "presets"  # JSON files shipped inside the package


def shipped_presets(folder: Any = PRESETS) -> dict[str, dict[str, Any]]:
    """{name: JSON object} of the presets shipped in ``folder`` (a resource folder of the package), in name order:
    train's model presets, or experiment's."""
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".json")), key=lambda f: f.name)
    return {f.name.removesuffix(".json"): json.loads(f.read_text()) for f in files}


def available_presets() -> dict[str, str]:
    """Preset names shipped in the package with their one-line descriptions."""
    return {name: preset.get("description", "") for name, preset in shipped_presets().items()}


def preset_path(preset: str) -> Path | None:
    """The JSON file of a preset path, or None for a shipped preset name."""
    path = Path(preset)
    return path if path.suffix == ".json" and path.is_file() else None


def read_preset(preset: str) -> dict[str, Any]:
    """The JSON object of a preset name or path."""
    path = preset_path(preset) or PRESETS / f"{preset}.json"
    if not path.is_file():
        listing = "; ".join(f"{name} ({text})" for name, text in available_presets().items())
        raise ValueError(f"unknown preset {preset!r}: give a JSON file path or one of these names: {listing}")
    try:
        values = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"preset {path} is not valid JSON ({error}); fix the file or pick a shipped preset") from None
    if not isinstance(values, dict):
        raise ValueError(f"preset {path} must hold a JSON object of MiniTxConfig fields")
    return values


def load_preset(preset: str) -> dict[str, Any]:
    """MiniTxConfig fields of a preset name or JSON path (the ``description`` and ``training`` keys are dropped);
    an unknown field is a ValueError with the closest names."""
    values = read_preset(preset)
    values.pop("description", None)
    values.pop(PRESET_TRAINING, None)
    where = preset_path(preset) or PRESETS / f"{preset}.json"
    for name in values:
        check_config_field(name, f"preset {where}")
    return values


PRESET_TRAINING = "training"  # the preset key of its training-argument defaults


# PretrainedConfig's own fields: how transformers calls and files a model, not what the model is. A recipe that set
# them would break training (return_dict=false hands the loop tuples) or be silently undone (dtype: the run's weights
# follow --mixed_precision); is_encoder_decoder stays, as --task's twin, with its own check in the run's plan.
RUNTIME_FIELDS = frozenset(f.name for f in fields(PretrainedConfig)) - {"is_encoder_decoder"}


def check_config_field(name: str, where: str) -> None:
    """Refuse a name that is not a MiniTxConfig field, naming the closest fields (``where``: its source), and one
    of PretrainedConfig's runtime fields, which are not a model's recipe."""
    if name in RUNTIME_FIELDS:
        hint = ("train in bfloat16 or float16 with --mixed_precision bf16/fp16, and load a saved model in another "
                "dtype with from_pretrained(..., dtype=...)") if name == "dtype" else (
                "pass it to the model's call or to from_pretrained instead")
        raise ValueError(f"{where}: {name!r} is how transformers runs or files a model, not part of its recipe; {hint}")
    names = [f.name for f in fields(MiniTxConfig) if f.name not in RUNTIME_FIELDS]
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else "; see MiniTxConfig for the field names"
        raise ValueError(f"{where}: {name!r} is not a MiniTxConfig field{hint}")


def parse_config_overrides(overrides: str | None) -> dict[str, Any]:
    """'a=1,b=0.1,c=rope' -> {'a': 1, 'b': 0.1, 'c': 'rope'}: each value read by the MiniTxConfig field's type.

    An unknown name raises ValueError with the closest field names; so does a value of the wrong type
    (bools take true/false/1/0/yes/no, optional fields take none/null).
    """
    types = {f.name: f.type for f in fields(MiniTxConfig)}
    result: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in (overrides or "").split(","))):
        if "=" not in item:
            raise ValueError(f"config override {item!r} must look like name=value (e.g. hidden_size=128)")
        name, raw = (s.strip() for s in item.split("=", 1))
        check_config_field(name, "--config_overrides")
        options = typing.get_args(types[name]) or (types[name],)  # int | None -> (int, NoneType)
        if type(None) in options and raw.lower() in ("none", "null"):
            result[name] = None
            continue
        kinds = [t for t in options if t is not type(None)]
        kind = kinds[0] if len(kinds) == 1 and kinds[0] in (bool, int, float, str) else None
        try:
            if kind is bool:
                result[name] = string_to_bool(raw)  # the words a flag takes on the command line
            elif kind in (int, float, str):
                result[name] = kind(raw)
            else:
                result[name] = json.loads(raw)
        except (ArgumentTypeError, ValueError):
            raise ValueError(f"config override {name}={raw!r}: expected {getattr(kind, '__name__', 'JSON')}") from None
    return result


__all__ = ["PRESETS", "PRESET_TRAINING", "available_presets", "shipped_presets", "check_config_field", "load_preset",
           "parse_config_overrides", "preset_path", "read_preset"]
