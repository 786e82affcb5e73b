"""Arguments of the training script: three dataclasses parsed by transformers' ``HfArgumentParser``.

Values come from the command line, from a JSON/YAML arguments file, or both: the file gives the
defaults and the command line overrides them::

    minitx train my-run.json --max_steps 500

Model shapes come from presets (``--preset NAME|PATH``, read by ``model_presets.py``): flat JSON files of
``MiniTxConfig`` fields shipped in the package (``hf_minitx/training/presets/``), or a JSON file of your own. A preset
may also hold a
``"training"`` object of training arguments (e.g. ``gpt2-style``'s AdamW and cosine schedule): they replace the
argument defaults, and an arguments file or the command line still overrides them.
"""

from __future__ import annotations

import difflib
import json
import typing
from argparse import ArgumentTypeError
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml
from transformers.hf_argparser import string_to_bool

from .model_presets import PRESET_TRAINING, read_preset

DEFAULT_PRESET = "default"  # the blocks of a run without --preset (a time budget then chooses the shape)
ARGS_FILE_SUFFIXES = (".json", ".yaml", ".yml")


@dataclass
class ModelArguments:
    """What model to build."""

    preset: str | None = field(
        default=None,
        metadata={"help": "Model shape: a preset name (tiny, small, gpt2-small, base, ...) or the path of a JSON file "
                          "of MiniTxConfig fields. None: the default preset (Qwen3's blocks, which export), and with "
                          "--max_minutes (causal-lm) the time budget chooses the width and depth "
                          "(docs/training.md)."},
    )
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "Comma-separated MiniTxConfig overrides applied on top of the preset, e.g. "
                          "'hidden_size=128,num_hidden_layers=2,hidden_dropout=0.1'."},
    )


@dataclass
class DataArguments:
    """Which corpus, which tokenizer, how to cut the data."""

    task: Literal["causal-lm", "seq2seq"] = field(
        default="causal-lm", metadata={"help": "causal-lm (decoder-only) or seq2seq (encoder-decoder)."}
    )
    dataset: str = field(
        default="builtin:pydocs",
        metadata={"help": "builtin:NAME (kjv, pydocs, numbers-en-fr, numbers-en-de), local file(s) or a Hub id."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Config name passed to load_dataset."})
    text_column: str = field(default="text", metadata={"help": "Text column of a causal-lm corpus."})
    source_column: str | None = field(default=None, metadata={"help": "Source column of a seq2seq corpus."})
    target_column: str | None = field(default=None, metadata={"help": "Target column of a seq2seq corpus."})
    validation_split: float = field(
        default=0.05,
        metadata={"help": "Validation carved from train when the corpus has none: a fraction (0.05), or a whole "
                          "number N of samples (with --streaming: a fraction takes every k-th row, k = 1/fraction, so "
                          "0.2 takes every 5th; N the first N rows)."},
    )
    sample_by: Literal["document", "paragraph", "line"] = field(
        default="document",
        metadata={"help": "causal-lm: what ends a sample (EOS). document: a text file, or a record row; paragraph: "
                          "a blank line; line: a line break. Record rows with paragraph/line are lines of one text."},
    )
    num_examples: int | None = field(
        default=None, metadata={"help": "Size of generated built-in tasks (builtin:numbers-*); default 20,000."}
    )
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "Tokenizer folder to use (e.g. tokenizer/). When absent, a byte-level BPE is trained "
                          "on the training split and saved with the model."},
    )
    tokenizer_vocab_size: int = field(
        default=4096, metadata={"help": "Vocabulary size of a freshly trained tokenizer (no --tokenizer)."}
    )
    tokenizer_max_texts: int | None = field(
        default=20000, metadata={"help": "Train a fresh tokenizer on at most this many texts of the train split."}
    )
    tokenizer_max_chars: int | None = field(
        default=10_000_000,
        metadata={"help": "Train a fresh tokenizer on at most this many characters too (text files come in "
                          "~1 MB rows)."},
    )
    streaming: bool = field(
        default=False,
        metadata={"help": "causal-lm: read the corpus as a stream, tokenized and packed on the fly (nothing "
                          "prepared or cached; a corpus larger than memory trains). Needs --max_steps or "
                          "--max_minutes. Resumes at the exact block."},
    )
    skip_bad_rows: bool = field(
        default=False,
        metadata={"help": "Text files: replace bytes that are not UTF-8 with U+FFFD; records: skip rows without text "
                          "(null, an empty CSV cell); both counted in the summary, instead of stopping with an error "
                          "that names the file and the byte offset or row."},
    )
    accept_changed_inputs: bool = field(
        default=False,
        metadata={"help": "Resume although a dataset file was edited in place since the run started (e.g. "
                          "converted to UTF-8 after a decoding error); training goes on with the new content. A file "
                          "added or removed, or a changed --tokenizer file, is still refused."},
    )
    shuffle_buffer: int = field(
        default=10_000,
        metadata={"help": "--streaming: blocks in the seeded shuffle buffer (reseeded each epoch); 0 keeps "
                          "stream order."},
    )
    block_size: int = field(default=128, metadata={"help": "causal-lm: tokens per packed training block."})
    shift_windows: bool | None = field(
        default=None,
        metadata={"help": "causal-lm: each epoch, every training sample starts at a new seeded offset into the packed "
                          "text (the block and the next), so repeated passes are not cut at the same places (nanoGPT's "
                          "random windows). Default: on for causal-lm, off with --streaming (a stream is read once)."},
    )
    max_source_length: int = field(default=64, metadata={"help": "seq2seq: source tokens kept (EOS included)."})
    max_target_length: int = field(default=64, metadata={"help": "seq2seq: target tokens kept (EOS included)."})
    max_eval_samples: int | None = field(
        default=None,
        metadata={"help": "Opt-in subset: score only the first N validation rows (blocks or pairs); by default "
                          "the whole validation split is scored. With --streaming: the held-out blocks read once "
                          "(default 256)."},
    )
    num_proc: int | None = field(
        default=None,
        metadata={"help": "Threads that tokenize a map-style causal-LM corpus, processes for seq2seq pairs "
                          "(default: the machine's cores for causal-LM text, 1 for pairs)."},
    )


@dataclass
class TrainArguments:
    """How to train, evaluate, checkpoint and save."""

    output_dir: str | None = field(default=None, metadata={"help": "Folder for checkpoints and the final model."})
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace a previous run in output_dir (a folder minitx made) instead of "
                                         "refusing to start."}
    )
    overwrite_any_folder: bool = field(
        default=False, metadata={"help": "With --overwrite_output_dir: replace output_dir even when minitx did not "
                                         "make it (deletes every file in it)."}
    )
    resume_from_checkpoint: str | None = field(
        default=None, metadata={"help": "'latest' or the path of a checkpoint-STEP folder to continue from."}
    )
    seed: int = field(default=42, metadata={"help": "Seed of initialisation, data order and dropout."})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Rows per micro-batch per process."})
    per_device_eval_batch_size: int = field(default=32, metadata={"help": "Rows per evaluation batch per process."})
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Micro-batches per optimizer step (accelerator.accumulate)."}
    )
    optimizer: Literal["adamw", "muon"] = field(
        default="muon",
        metadata={"help": "adamw: AdamW on every parameter. muon: torch.optim.Muon on the hidden 2-D matrices "
                          "(--muon_learning_rate), AdamW on embeddings, head, norms and biases (--learning_rate)."},
    )
    learning_rate: float = field(
        default=6e-3, metadata={"help": "Peak learning rate of AdamW (with --optimizer muon: of the AdamW groups)."}
    )
    weight_decay: float = field(
        default=0.1, metadata={"help": "AdamW weight decay (not applied to biases, norms and embeddings)."}
    )
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.98, metadata={"help": "AdamW beta2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    muon_learning_rate: float = field(
        default=0.05, metadata={"help": "--optimizer muon: peak learning rate of Muon (the hidden 2-D matrices)."}
    )
    muon_momentum: float = field(
        default=0.85, metadata={"help": "--optimizer muon: Muon's (Nesterov) momentum; 0.85 follows the gradient "
                                        "sooner than the usual 0.95, which pays off in runs of a few hundred steps."}
    )
    muon_weight_decay: float = field(
        default=0.02, metadata={"help": "--optimizer muon: decoupled weight decay of the Muon matrices (each step "
                                         "shrinks them by lr x this); it pays off in runs that pass over their data "
                                         "many times."}
    )
    cautious_weight_decay: bool = field(
        default=False, metadata={"help": "--optimizer muon: decay only the entries of a matrix whose update has the "
                                          "weight's sign (cautious weight decay), so the decay never works against "
                                          "the step."}
    )
    embedding_weight_decay: float = field(
        default=0.0, metadata={"help": "AdamW weight decay of the embedding tables (a tied head is the token table); "
                                       "0: none, as usual."}
    )
    lr_scheduler_type: Literal[
        "cosine", "inverse_sqrt", "linear", "constant_with_warmup", "warmup_stable_decay"
    ] = field(
        default="warmup_stable_decay",
        metadata={"help": "Warmup then cosine decay, the paper's inverse square root, or warmup_stable_decay "
                          "(warmup, hold the peak, decay over the last --decay_ratio of the steps); transformers' "
                          "schedulers."},
    )
    warmup_steps: int = field(default=20, metadata={"help": "Linear warmup steps."})
    decay_ratio: float = field(
        default=0.3, metadata={"help": "warmup_stable_decay: fraction of the steps spent in the final linear decay."}
    )
    min_lr_ratio: float = field(
        default=0.0, metadata={"help": "warmup_stable_decay: learning rate at the end, as a fraction of the peak."}
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (0 disables)."})
    label_smoothing: float = field(default=0.0, metadata={"help": "Label smoothing of the training loss (paper: 0.1)."})
    input_noise: float = field(
        default=0.0, metadata={"help": "causal-lm: share of the input tokens replaced, at each training step, by "
                                       "tokens drawn from the same batch; the targets are kept, so each pass over a "
                                       "small corpus reads other contexts (0: off)."}
    )
    late_dropout: float | None = field(
        default=None, metadata={"help": "Dropout on the embeddings and on each sub-layer's output, switched on once "
                                        "the run has passed over its training data --late_dropout_passes times: a "
                                        "run that repeats a small corpus overfits without it, and one that does "
                                        "not learns faster without it. Default 0.1 for causal-lm, 0 (off) for "
                                        "seq2seq, where it was not measured; a model with its own hidden_dropout "
                                        "keeps that."}
    )
    late_dropout_passes: float = field(
        default=2.0, metadata={"help": "Passes over the training data after which --late_dropout starts."}
    )
    calibrate_temperature: bool | None = field(default=None, metadata={"help": "At the end, fold into the final "
        "norm the temperature that minimises the validation loss. Default: on for causal-lm, off for seq2seq."})
    distill_from: str | None = field(
        default=None, metadata={"help": "Folder of a finished model with this run's tokenizer (the teacher): the "
                                        "loss adds --distill_weight x T^2 x KL(teacher || model) at temperature T."}
    )
    distill_weight: float = field(
        default=0.45, metadata={"help": "--distill_from: weight (alpha >= 0) of the KL term beside the cross-entropy."}
    )
    distill_temperature: float = field(
        default=1.2, metadata={"help": "--distill_from: temperature T > 0 both distributions are softened by."}
    )
    keep_phases: bool = field(default=False, metadata={
        "help": "A run in two phases (a budget one model cannot use): keep the teacher's and the student's folders, "
                "with their checkpoints, in OUTPUT/teacher and OUTPUT/student (to score them or their average)."})
    max_steps: int | None = field(default=None, metadata={"help": "Optimizer steps to train (overrides num_epochs)."})
    num_epochs: float | None = field(
        default=None, metadata={"help": "Epochs to train when max_steps is unset (default 1; with --max_minutes, "
                                        "an upper bound only when given)."}
    )
    max_minutes: float | None = field(
        default=None, metadata={"help": "Train for this many minutes: the first steps are timed and the schedule "
                                        "(warmup, stable phase, decay) is laid over the steps that fit, recorded as "
                                        "planned_steps (--max_steps planned_steps repeats the run without a clock); "
                                        "the clock stays a cap. Evaluations along the way count, setup does not."}
    )
    load_best_model_at_end: bool = field(
        default=True, metadata={"help": "Save the weights of the evaluation with the lowest eval_loss rather than "
                                        "the last ones, when an earlier evaluation was better (runs that evaluate "
                                        "along the way; the summary says which step was kept)."}
    )
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = field(
        default="auto", metadata={"help": "Accelerate mixed precision; auto = bf16 on CUDA, no elsewhere."}
    )
    compile: bool = field(default=False, metadata={"help": "Compile the model with torch.compile."})
    num_threads: int | None = field(
        default=None, metadata={"help": "torch CPU threads per process (default: cores / processes)."}
    )
    logging_steps: int = field(default=10, metadata={"help": "Write a train record to metrics.jsonl every N steps."})
    eval_steps: float | None = field(
        default=None,
        metadata={"help": "Evaluate every N steps (and always at the end); a value in (0, 1) is a fraction of the "
                          "run's steps (with --max_minutes, of the planned steps); 0: at the end only. Default: "
                          "every 200 steps, or with --max_minutes every quarter of the plan (an evaluation of the "
                          "whole validation split costs the steps it replaces)."}
    )
    generation_eval_samples: int | None = field(
        default=None,
        metadata={"help": "seq2seq: opt-in subset: translate only the first N validation pairs for exact match/BLEU; "
                          "all by default."},
    )
    generation_num_beams: int = field(default=1, metadata={"help": "seq2seq: beams for the generation metrics."})
    num_sample_generations: int = field(default=2, metadata={"help": "Sample generations printed at each eval."})
    sample_prompts: str | None = field(
        default=None, metadata={"help": "'|'-separated prompts for the sample generations (default: validation)."}
    )
    checkpointing_steps: float | None = field(
        default=None,
        metadata={"help": "Save accelerator state to checkpoint-STEP/ every N steps; a value in (0, 1) is a "
                          "fraction of the run's steps (with --max_minutes, of the planned steps)."}
    )
    save_total_limit: int = field(default=2, metadata={"help": "Checkpoints kept (the oldest are deleted)."})
    report_to: str = field(
        default="none", metadata={"help": "Accelerate trackers, a comma list: none, tensorboard, trackio, wandb, aim, "
                                          "comet_ml, mlflow, clearml, dvclive, swanlab (each must be installed)."}
    )
    disable_tqdm: bool = field(default=False, metadata={"help": "Hide the progress bar."})
    push_to_hub: bool = field(default=False, metadata={"help": "Upload the final folder with hf_minitx.hub.push."})
    hub_model_id: str | None = field(default=None, metadata={"help": "Hub repo id USER/NAME for --push_to_hub."})
    arguments_file: str | None = field(default=None, init=False)  # the JSON/YAML file the values came from


ARGUMENT_CLASSES = (ModelArguments, DataArguments, TrainArguments)


def validation_split_value(value: float) -> float | int:
    """``--validation_split`` as ``load_corpus`` takes it: a whole number >= 1 is a count, else a fraction."""
    return int(value) if value >= 1 and float(value).is_integer() else value


def _read_args_file(path: Path) -> dict[str, Any]:
    """A JSON or YAML mapping of argument names to values."""
    if not path.is_file():
        raise FileNotFoundError(f"arguments file {path} does not exist")
    text = path.read_text()
    try:
        values = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        detail = str(error).splitlines()[0]
        raise ValueError(f"arguments file {path} is not valid {path.suffix[1:].upper()} ({detail}); fix it") from None
    if not isinstance(values, dict):
        raise ValueError(f"arguments file {path} must hold a mapping of argument names to values")
    repeated = repeated_keys(text, path.suffix)
    if repeated:  # JSON and YAML readers keep the last value without a word
        raise ValueError(f"arguments file {path} gives {', '.join(repeated)} more than once; keep one of each")
    known = {f.name for cls in ARGUMENT_CLASSES for f in fields(cls) if f.init}
    check_known(values, known, f"arguments file {path}")
    return typed_values(values, f"arguments file {path}")


def repeated_keys(text: str, suffix: str) -> list[str]:
    """The names a JSON or YAML mapping (already read as one) gives more than once, at its top level."""
    if suffix == ".json":
        names = [name for name, _ in json.loads(text, object_pairs_hook=lambda pairs: pairs)]
    else:
        names = [str(key.value) for key, _ in yaml.compose(text, Loader=yaml.SafeLoader).value]
    return sorted({name for name in names if names.count(name) > 1})


def check_known(values: dict[str, Any], known: set[str], where: str, kind: str = "argument") -> None:
    """Refuse names of ``values`` that are not in ``known``, naming for each the argument it resembles (a typo such
    as ``max_stepz``), else pointing at the full list rather than printing its seventy names in the line."""
    unknown = sorted(set(values) - known)
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hints.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    raise ValueError(f"{where}: unknown {kind}{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                     "`minitx train --help` lists them (without the leading --)")


def typed_values(values: dict[str, Any], where: str) -> dict[str, Any]:
    """``values`` (of an arguments file or a preset's training object) typed as the command line types them: a
    whole number for an integer argument (2.5 is refused, not rounded by a range), one of the choices, true or
    false for a flag; a text value is read as the command line reads it. One line names the field otherwise."""
    hints = {name: hint for cls in ARGUMENT_CLASSES for name, hint in typing.get_type_hints(cls).items()}
    typed = {}
    for name, value in values.items():
        hint = hints[name]
        optional = typing.get_origin(hint) is not Literal and type(None) in typing.get_args(hint)
        kind = next(t for t in typing.get_args(hint) if t is not type(None)) if optional else hint
        try:
            typed[name] = None if value is None and optional else _typed(kind, value)
        except (TypeError, ValueError):
            choices = typing.get_args(kind) if typing.get_origin(kind) is Literal else None
            wanted = (f"one of {', '.join(choices)}" if choices else
                      {int: "a whole number", float: "a number", bool: "true or false"}.get(kind, "a text"))
            raise ValueError(f"{where}: {name} must be {wanted} (as --{name} on the command line), got "
                             f"{json.dumps(value)}") from None
    return typed


def _typed(kind: Any, value: Any) -> Any:
    """``value`` as an argument of type ``kind``; TypeError or ValueError when it is not one."""
    if typing.get_origin(kind) is Literal:
        if value in typing.get_args(kind):
            return value
        raise ValueError(value)
    if kind is bool:
        if not isinstance(value, (bool, str)):
            raise ValueError(value)
        try:  # the words a flag takes on the command line: a file that says `compile: y` trains as `--compile y`
            return string_to_bool(value)
        except ArgumentTypeError:
            raise ValueError(value) from None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(value)
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        return int(value)  # int("2.5") raises too
    return float(value) if kind is float else str(value)


def parse_training_args(argv: list[str] | None = None) -> tuple[ModelArguments, DataArguments, TrainArguments]:
    """Parse ``[ARGS_FILE.json|yaml] [--name value ...]``; command-line values override the file."""
    from ..cli import parse_arguments

    argv = list(argv or [])
    file_values, args_file = None, None
    if argv and not argv[0].startswith("-") and Path(argv[0]).suffix in ARGS_FILE_SUFFIXES:
        args_file = argv.pop(0)
        file_values = _read_args_file(Path(args_file))
    check_args_file_first(argv)
    def parse(defaults: dict[str, Any] | None) -> tuple[ModelArguments, DataArguments, TrainArguments]:
        return parse_arguments(
            ARGUMENT_CLASSES, argv, prog="minitx train", defaults=defaults,
            description="Train a MiniTx model (decoder-only or encoder-decoder) with Accelerate. An arguments file "
                        "(JSON or YAML) given first supplies defaults; the command line overrides them.")

    model_args, data_args, train_args = parse(file_values)
    recipe = preset_training(model_args.preset or DEFAULT_PRESET)
    if recipe:  # the preset's training arguments, under the arguments file and the command line
        model_args, data_args, train_args = parse({**recipe, **(file_values or {})})
    train_args.arguments_file = args_file
    return model_args, data_args, train_args


def check_args_file_first(argv: list[str]) -> None:
    """An arguments file given after an option (not as its value) is refused with where it goes: argparse would
    call it an unrecognized argument, or take it for a second path of the option before it."""
    for before, arg in zip(argv, argv[1:], strict=False):
        if not before.startswith("-") and Path(arg).suffix in ARGS_FILE_SUFFIXES and Path(arg).is_file():
            rest = [a for a in argv if a is not arg]
            raise ValueError(f"the arguments file {arg} goes first, before the options: "
                             f"minitx train {arg} {' '.join(rest)}")


def preset_training(preset: str) -> dict[str, Any]:
    """The training-argument defaults a preset brings (``{}`` for none; an unknown preset is left to
    ``load_preset``'s error); an unknown argument name is a ValueError naming the preset."""
    try:
        values = read_preset(preset).get(PRESET_TRAINING) or {}
    except ValueError:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"preset {preset}: {PRESET_TRAINING!r} must be a JSON object of training arguments")
    known = {f.name for cls in ARGUMENT_CLASSES for f in fields(cls) if f.init} - {"preset", "config_overrides"}
    check_known(values, known, f"preset {preset}", kind="training argument")
    return typed_values(values, f"preset {preset}")


