"""Check that a folder is a complete, loadable hf_minitx model before it is shared.

`verify_model_folder` reads only small files and file headers (config.json, the safetensors header,
tokenizer.json), so it is fast even for large models, and reports every problem at once, each naming
the file that is wrong and how to fix it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..folders import SUMMARY_FILE
from ..model_files import (
    MODEL_KINDS,
    WEIGHTS_FILE,
    ModelFolderError,
    check_model_path,
    count_parameters,
    model_kind,
    read_safetensors_header,
    refuse_interrupted_run,
)

KINDS = MODEL_KINDS
AUTO_CLASSES = {"causal-lm": "AutoModelForCausalLM", "seq2seq": "AutoModelForSeq2SeqLM"}
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
REQUIRED_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
OPTIONAL_TOKENIZER_FILES = ("special_tokens_map.json", "added_tokens.json", "chat_template.jinja")
_RELATIVE_IMPORT = re.compile(r"^\s*from\s+\.(\w+)\s+import\s", re.MULTILINE)


@dataclass(frozen=True)
class ModelFolderInfo:
    """What `verify_model_folder` found in a complete model folder (file names are relative)."""

    path: Path
    kind: str
    config: dict
    weight_files: tuple[str, ...]
    code_files: tuple[str, ...]
    tokenizer_files: tuple[str, ...]
    num_parameters: int

    @property
    def auto_class(self) -> str:
        """Name of the transformers Auto class that loads this model."""
        return AUTO_CLASSES[self.kind]


JSON_KINDS = {"list": "a list", "str": "a string", "int": "a number", "float": "a number", "bool": "true or false",
              "NoneType": "null"}


def _load_json(path: Path, problems: list[str], fix: str = "save the folder again with save_pretrained") -> dict | None:
    """Read a JSON object, recording a problem that names the file when it is invalid (and ``fix``)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        problems.append(f"{path.name}: not valid JSON ({error}); {fix}.")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path.name}: holds {JSON_KINDS.get(type(data).__name__, 'something else')}, not a JSON "
                        f"object; {fix}.")
        return None
    return data


def _check_config(folder: Path, kind: str | None, problems: list[str]) -> tuple[dict | None, str | None]:
    """Validate config.json; return (config, kind) or (None, None) after recording problems."""
    if not (folder / "config.json").is_file():
        problems.append("config.json: missing. A model folder is written by model.save_pretrained(folder).")
        return None, None
    config = _load_json(folder / "config.json", problems)
    if config is None:
        return None, None
    if config.get("model_type") != "minitx":
        problems.append(
            f"config.json: model_type is {config.get('model_type')!r}, not 'minitx'; this folder is not an "
            "hf_minitx model."
        )
        return None, None
    found = model_kind(config)
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    if kind is not None and kind != found:
        problems.append(f"config.json: describes a {found} model, but a {kind} model was expected.")
    auto_map = config.get("auto_map") or {}
    for auto_name in ("AutoConfig", AUTO_CLASSES[found]):
        if auto_name not in auto_map:
            problems.append(
                f"config.json: auto_map has no {auto_name} entry, so trust_remote_code loading fails. Save the "
                "model after `import hf_minitx` (it registers the classes for auto_map)."
            )
    return config, found


def _code_files(folder: Path, config: dict, problems: list[str]) -> tuple[str, ...]:
    """The .py files auto_map points to plus everything they import relatively, checking each exists."""
    pending = sorted({ref.split(".")[0] + ".py" for ref in (config.get("auto_map") or {}).values()
                      if isinstance(ref, str)})
    found: list[str] = []
    while pending:
        name = pending.pop()
        if name in found:
            continue
        found.append(name)
        path = folder / name
        if not path.is_file():
            problems.append(f"{name}: missing custom code (named in config.json's auto_map or imported by it); "
                            "save the model again with save_pretrained.")
            continue
        pending.extend(f"{module}.py" for module in _RELATIVE_IMPORT.findall(path.read_text(encoding="utf-8")))
    return tuple(sorted(found))


def _check_weights(folder: Path, config: dict, kind: str, problems: list[str]) -> tuple[tuple[str, ...], int]:
    """Check the safetensors weights (single file or sharded); return (files, parameter count)."""
    if (folder / WEIGHTS_INDEX_FILE).is_file():
        index = _load_json(folder / WEIGHTS_INDEX_FILE, problems) or {}
        shards = sorted(set((index.get("weight_map") or {}).values()))
        files = (WEIGHTS_INDEX_FILE, *shards)
    elif (folder / WEIGHTS_FILE).is_file():
        shards = [WEIGHTS_FILE]
        files = (WEIGHTS_FILE,)
    else:
        extra = (" (found pytorch_model.bin: re-save with safe_serialization)"
                 if (folder / "pytorch_model.bin").exists() else "")
        problems.append(f"{WEIGHTS_FILE}: missing, so there are no weights to load{extra}.")
        return (), 0
    header: dict = {}
    for shard in shards:
        if not (folder / shard).is_file():
            problems.append(f"{shard}: missing (listed in {WEIGHTS_INDEX_FILE}).")
            continue
        try:
            header.update(read_safetensors_header(folder / shard))
        except ModelFolderError as error:
            problems.append(f"{shard}: {error}")
    if not header:
        return files, 0
    stack = "encoder" if kind == "seq2seq" else "decoder"
    embed_name = f"model.{stack}.embed_tokens.weight"
    embed = header.get(embed_name)
    if embed is None:
        problems.append(f"{shards[0]}: has no {embed_name!r} tensor; these weights do not belong to a {kind} "
                        "hf_minitx model.")
    elif list(embed["shape"]) != [config.get("vocab_size"), config.get("hidden_size")]:
        problems.append(f"{shards[0]}: {embed_name} has shape {embed['shape']}, but config.json says "
                        f"vocab_size={config.get('vocab_size')}, hidden_size={config.get('hidden_size')}.")
    return files, count_parameters(header)


def _check_tokenizer(folder: Path, config: dict | None, problems: list[str]) -> tuple[str, ...]:
    """Check the fast-tokenizer files; return the tokenizer files present."""
    missing = [name for name in REQUIRED_TOKENIZER_FILES if not (folder / name).is_file()]
    if missing:
        problems.append(f"{', '.join(missing)}: missing, so the folder has no tokenizer. Save it next to the "
                        "model with tokenizer.save_pretrained(folder).")
        return ()
    from tokenizers import Tokenizer

    try:
        vocab = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    except Exception as error:  # tokenizers raises a bare Exception for unreadable files
        problems.append(f"tokenizer.json: cannot be read ({error}); save the tokenizer again.")
        return ()
    _load_json(folder / "tokenizer_config.json", problems)
    if config is not None and isinstance(config.get("vocab_size"), int) and vocab > config["vocab_size"]:
        problems.append(f"tokenizer.json: has {vocab} tokens but config.json's vocab_size is {config['vocab_size']}; "
                        "ids past the embedding table would crash. Use the tokenizer the model was trained with.")
    present = [name for name in (*REQUIRED_TOKENIZER_FILES, *OPTIONAL_TOKENIZER_FILES) if (folder / name).is_file()]
    return tuple(present)


def verify_model_folder(model_dir: str | Path, kind: str | None = None) -> ModelFolderInfo:
    """Check that `model_dir` holds a complete hf_minitx model: config, custom code, weights, tokenizer.

    `kind` ("causal-lm" | "seq2seq") additionally requires that model kind. Raises ModelFolderError
    listing every missing or broken file; returns what was found otherwise.
    """
    folder = Path(model_dir)
    check_model_path(folder)
    refuse_interrupted_run(folder)
    problems: list[str] = []
    config, found_kind = _check_config(folder, kind, problems)
    code = _code_files(folder, config, problems) if config else ()
    weights, num_parameters = _check_weights(folder, config, found_kind, problems) if config else ((), 0)
    tokenizer = _check_tokenizer(folder, config, problems)
    _load_json(folder / SUMMARY_FILE, problems,  # the card reads it: a hand-edited one is named in the user's folder
               fix="put back the one the training run wrote, or remove it (the card then shows no training figures)")
    has_weights = (folder / WEIGHTS_FILE).is_file() or (folder / WEIGHTS_INDEX_FILE).is_file()
    if config is None and not has_weights:  # weights were not checked without a config: still say so
        problems.append(f"{WEIGHTS_FILE}: missing, so there are no weights to load.")
    if problems:  # one line: each problem names its file and the fix
        listing = "; ".join(problem.rstrip(".") for problem in problems)
        raise ModelFolderError(f"{folder} is not a complete hf_minitx model folder: {listing}")
    return ModelFolderInfo(
        path=folder, kind=found_kind, config=config, weight_files=weights, code_files=code,
        tokenizer_files=tokenizer, num_parameters=num_parameters,
    )


__all__ = [
    "KINDS",
    "AUTO_CLASSES",
    "ModelFolderError",
    "ModelFolderInfo",
    "read_safetensors_header",
    "count_parameters",
    "verify_model_folder",
]
