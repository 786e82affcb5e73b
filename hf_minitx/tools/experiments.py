"""Small experiments from the paper, each a few seconds to a minute on a CPU.

- The copy and reverse tasks: random token sequences, the encoder-decoder model learns to output the
  source (or the source reversed). No tokenizer: token ids are the data (0 pad, 1 bos, 2 eos, 3 unused).
- Post-LN (the paper) against pre-LN on the same data and seed, drawn side by side.
- Label smoothing and the paper's inverse-square-root warmup schedule, both selectable.

Runs go through the training loop of `minitx train` (`hf_minitx.training.loop.fit`) with an in-memory
dataset of token ids, so they write the same `metrics.jsonl` and `training_summary.json` (and
`loss_curve.png`), and the model (`save_pretrained`), so `plot_attention` can show its cross-attention.
"""

from __future__ import annotations

import signal
from argparse import ArgumentTypeError
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import get_args, get_type_hints

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers.hf_argparser import string_to_bool

from ..cli import Interrupted
from ..device import check_thread_count
from ..folders import check_output_folder, replace_folder, unlock_folder
from ..launch import process_count
from ..models.configuration_minitx import HIDDEN_ACTS, NORM_TYPES, POSITION_KINDS, MiniTxConfig
from ..models.modeling_minitx import IGNORE_INDEX, MiniTxForConditionalGeneration
from ..training.arguments import TrainArguments
from ..training.end_of_run import finish, run_summary
from ..training.evaluation import evaluate_loss
from ..training.loop import fit
from ..training.loss import Objective
from ..training.model_presets import shipped_presets
from ..training.optim import OPTIMIZERS, build_optimizer, build_scheduler, check_optimizer_name, describe_schedule
from ..training.state import LoopSettings, RunState, TrainingRun

TASKS = ("copy", "reverse")
SCHEDULES = get_args(get_type_hints(TrainArguments)["lr_scheduler_type"])  # as `minitx train --lr_scheduler_type`
FIRST_TOKEN = 4  # ids below are special: 0 pad, 1 bos, 2 eos, 3 kept free
MAX_TOY_LENGTH = 512  # longest sequence of a toy task: room for any study, not for a run of hours
MAX_TOY_SEQUENCES = 2**20  # training rows (steps x batch_size) or held-out ones: all are drawn up front, in memory
MAX_TOY_PARAMETERS = 50_000_000  # a toy model trains on a CPU in minutes; past this it would fill memory first


def _one_of(names: Sequence[str]) -> str:
    """"a, b or c": the choices of a registry, for a help line that stays in step with it."""
    names = list(names)
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


@dataclass
class ExperimentConfig:
    """One toy seq2seq run. Defaults: the copy task, which a CPU learns to exact match in a short run."""

    task: str = field(default="copy", metadata={
        "help": "toy task: copy (output = input) or reverse (output = input reversed)"})
    vocab_size: int = field(default=16, metadata={"help": "token ids in the task, the 4 special ids included"})
    min_length: int = field(default=4, metadata={"help": "shortest sequence"})
    max_length: int = field(default=10, metadata={"help": "longest sequence"})
    hidden_size: int = field(default=64, metadata={"help": "model width"})
    num_layers: int = field(default=2, metadata={"help": "layers in the encoder and in the decoder"})
    num_heads: int = field(default=4, metadata={"help": "attention heads"})
    intermediate_size: int = field(default=128, metadata={"help": "feed-forward width"})
    norm_position: str = field(default="pre", metadata={"help": "pre (x + f(LN(x))) or post (LN(x + f(x)), the paper)"})
    position_embedding_type: str = field(default="sinusoidal", metadata={"help": _one_of(POSITION_KINDS)})
    norm_type: str = field(default="layernorm", metadata={"help": _one_of(NORM_TYPES)})
    hidden_act: str = field(default="gelu", metadata={"help": f"feed-forward activation: {_one_of(HIDDEN_ACTS)}"})
    qk_norm: bool = field(default=False, metadata={"help": "normalise each head's queries and keys"})
    final_logit_softcap: float | None = field(default=None, metadata={
        "help": "soft cap c of the logits, c·tanh(logits/c) (none: off)"})
    initializer_range: float = field(default=0.02, metadata={
        "help": "std of the weights at init; 1/sqrt(hidden_size) is the paper's scale"})
    steps: int = field(default=600, metadata={"help": "optimizer steps"})
    batch_size: int = field(default=64, metadata={"help": "sequences per step"})
    optimizer: str = field(default="adamw", metadata={
        "help": f"{_one_of(OPTIMIZERS)} (muon: Muon on the hidden matrices, AdamW on the rest)"})
    learning_rate: float = field(default=1e-3, metadata={"help": "peak learning rate (with muon: of the AdamW groups)"})
    muon_learning_rate: float = field(default=0.02, metadata={"help": "optimizer muon: peak learning rate of Muon"})
    schedule: str = field(default="inverse_sqrt", metadata={
        "help": f"{_one_of(SCHEDULES)} (inverse_sqrt: the paper's)"})
    warmup_steps: int = field(default=100, metadata={"help": "linear warmup steps"})
    label_smoothing: float = field(default=0.0, metadata={"help": "label smoothing (paper: 0.1)"})
    max_grad_norm: float | None = field(default=1.0, metadata={"help": "gradient clipping norm (none: no clipping)"})
    eval_every: int = field(default=50, metadata={"help": "evaluate every N steps"})
    log_every: int = field(default=10, metadata={"help": "log a train record every N steps"})
    eval_examples: int = field(default=256, metadata={"help": "held-out sequences for evaluation"})
    stop_at_exact_match: float | None = field(default=100.0, metadata={
        "help": "stop when validation exact match (percent) reaches this (none: run all steps)"})
    seed: int = field(default=0, metadata={"help": "seed of the data and the weights"})
    output_dir: str | None = field(default=None, metadata={
        "help": "folder for metrics.jsonl, the model and training_summary.json"})
    overwrite: bool = field(default=False, metadata={"help": "replace a non-empty --output_dir (refused otherwise)"})


    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task={self.task!r} is not known; choose one of {TASKS}.")
        check_optimizer_name(self.optimizer, "optimizer")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r} is not known; choose one of {SCHEDULES}.")
        if self.vocab_size <= FIRST_TOKEN + 1:
            raise ValueError(f"vocab_size must exceed {FIRST_TOKEN + 1} (ids 0-3 are special), got {self.vocab_size}.")
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(f"Need 1 <= min_length <= max_length, got {self.min_length} and {self.max_length}.")
        if self.max_length > MAX_TOY_LENGTH:
            raise ValueError(f"max_length must be at most {MAX_TOY_LENGTH} (a toy task; attention grows with the "
                             f"square of the length), got {self.max_length}.")
        for name in ("steps", "batch_size", "eval_every", "log_every", "eval_examples"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}.")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be 0 (none) or more, got {self.warmup_steps}.")
        if self.stop_at_exact_match is not None and not 0.0 < self.stop_at_exact_match <= 100.0:
            raise ValueError(f"stop_at_exact_match is a percentage in (0, 100] (none: run all steps), got "
                             f"{self.stop_at_exact_match}.")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}.")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be positive or None (no clipping), got {self.max_grad_norm}.")
        if self.initializer_range <= 0:
            raise ValueError(f"initializer_range must be positive, got {self.initializer_range}.")
        for name in ("learning_rate", "muon_learning_rate"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}.")
        for name, rows in (("steps x batch_size", self.steps * self.batch_size),
                           ("eval_examples", self.eval_examples)):
            if rows > MAX_TOY_SEQUENCES:
                raise ValueError(f"{name} asks for {rows:,} sequences, more than a toy task draws "
                                 f"({MAX_TOY_SEQUENCES:,}: they are made up front, in memory); lower it")
        try:
            config = self.model_config()  # norm_position, position_embedding_type, the head split: checked by it
        except (TypeError, ValueError) as err:
            raise ValueError(f"invalid model settings: {err}") from None
        with torch.device("meta"):  # counted without memory
            parameters = MiniTxForConditionalGeneration(config).num_parameters()
        if parameters > MAX_TOY_PARAMETERS:
            raise ValueError(f"the model would have {parameters:,} parameters, more than a toy task trains "
                             f"({MAX_TOY_PARAMETERS:,}); lower hidden_size, intermediate_size, num_layers or "
                             "vocab_size")

    def optimizer_arguments(self) -> TrainArguments:
        """The run's optimizer and schedule as `minitx train` arguments (no weight decay, the paper's betas)."""
        return TrainArguments(optimizer=self.optimizer, learning_rate=self.learning_rate, weight_decay=0.0,
                              adam_beta2=0.98, adam_epsilon=1e-9, muon_learning_rate=self.muon_learning_rate,
                              lr_scheduler_type=self.schedule, warmup_steps=self.warmup_steps)

    def model_config(self) -> MiniTxConfig:
        """The MiniTx encoder-decoder for this run (room for the source and target + EOS)."""
        return MiniTxConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads, intermediate_size=self.intermediate_size,
            max_position_embeddings=self.max_length + 2, norm_position=self.norm_position,
            position_embedding_type=self.position_embedding_type, norm_type=self.norm_type,
            hidden_act=self.hidden_act, qk_norm=self.qk_norm, final_logit_softcap=self.final_logit_softcap,
            is_encoder_decoder=True,
            tie_word_embeddings=True, scale_embeddings=True, initializer_range=self.initializer_range,
        )


# --- data ----------------------------------------------------------------------------------------


def make_batch(config: ExperimentConfig, batch_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random sequences and their targets, padded on the right.

    Returns input_ids and attention_mask (batch, max_length + 1) — tokens then EOS then padding — and
    labels (batch, max_length + 1): the copied or reversed tokens, EOS, then IGNORE_INDEX.
    """
    width = config.max_length + 1
    lengths = torch.randint(config.min_length, config.max_length + 1, (batch_size,), generator=generator)
    tokens = torch.randint(FIRST_TOKEN, config.vocab_size, (batch_size, config.max_length), generator=generator)
    input_ids = torch.zeros(batch_size, width, dtype=torch.long)
    labels = torch.full((batch_size, width), IGNORE_INDEX, dtype=torch.long)
    for row, n in enumerate(lengths.tolist()):
        seq = tokens[row, :n]
        input_ids[row, :n] = seq
        labels[row, :n] = seq if config.task == "copy" else seq.flip(0)
        input_ids[row, n] = labels[row, n] = 2  # EOS
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels}


def make_scheduler(config: ExperimentConfig, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate schedule (`minitx train`'s own, ``training.optim.build_scheduler``).

    inverse_sqrt is the paper's: linear warmup for `warmup_steps` to `learning_rate`, then decay as
    1/sqrt(step); constant_with_warmup stays at the peak; cosine and linear decay to 0 at `steps`;
    warmup_stable_decay holds the peak and decays over the last steps.
    """
    return build_scheduler(optimizer, config.optimizer_arguments(), config.steps)


# --- evaluation ----------------------------------------------------------------------------------


@dataclass
class ToyTaskEvaluation:
    """Teacher-forced loss and greedy-decoding exact match on held-out sequences: the whole output, EOS
    included, must be right. Token ids in, token ids out: no tokenizer is involved."""

    batch: dict[str, torch.Tensor]  # input_ids, attention_mask, labels: (examples, max_length + 1)

    def __call__(self, model: torch.nn.Module, accelerator: Accelerator) -> tuple[dict[str, float], list[dict]]:
        batch = {key: value.to(accelerator.device) for key, value in self.batch.items()}
        objective = Objective.for_seq2seq(accelerator.unwrap_model(model).config)
        metrics = evaluate_loss(model, [dict(batch)], accelerator, shift=False, inputs=objective.model_inputs)
        unwrapped = accelerator.unwrap_model(model).eval()
        width = batch["labels"].size(1)
        with torch.no_grad():
            generated = unwrapped.generate(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=width,
                do_sample=False, num_beams=1,
            )[:, 1:]  # drop the decoder start token -> (examples, <= width)
        generated = torch.nn.functional.pad(generated, (0, width - generated.size(1)), value=0)  # (examples, width)
        known = batch["labels"] != IGNORE_INDEX
        correct = ((generated == batch["labels"]) | ~known).all(dim=1)
        return {**metrics, "eval_exact_match": 100.0 * correct.float().mean().item()}, []  # percent



# --- training: the package's one loop --------------------------------------------------------------


class TokenRows(torch.utils.data.Dataset):
    """An in-memory dataset of equal-length token-id rows: {name: (rows, width)} tensors, one dict per row."""

    def __init__(self, columns: dict[str, torch.Tensor]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: column[index] for name, column in self.columns.items()}


def training_rows(config: ExperimentConfig) -> TokenRows:
    """`steps` batches of fresh sequences drawn one batch after the other from one seeded generator; read
    in order, step i trains on batch i."""
    generator = torch.Generator().manual_seed(config.seed)
    batches = [make_batch(config, config.batch_size, generator) for _ in range(config.steps)]
    return TokenRows({name: torch.cat([b[name] for b in batches]) for name in batches[0]})  # (steps * batch, width)


def build_run(config: ExperimentConfig, output_dir: Path | None) -> TrainingRun:
    """The experiment as a TrainingRun over an in-memory dataset of token ids (see `training_rows`)."""
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(config.seed)
    model = MiniTxForConditionalGeneration(config.model_config())
    model.generation_config.max_length = None
    optimizer = build_optimizer(model, config.optimizer_arguments())
    scheduler = make_scheduler(config, optimizer)
    loader = DataLoader(training_rows(config), batch_size=config.batch_size, shuffle=False)
    eval_batch = make_batch(config, config.eval_examples, torch.Generator().manual_seed(config.seed + 1))
    model, optimizer = accelerator.prepare(model, optimizer)
    target = config.stop_at_exact_match
    settings = LoopSettings(
        total_steps=config.steps, batches_per_epoch=len(loader), logging_steps=config.log_every,
        eval_steps=config.eval_every, max_grad_norm=config.max_grad_norm, show_progress=False,
        stop_when=("eval_exact_match", target) if target is not None else None,
    )
    recipe = {"optimizer": config.optimizer, "schedule": describe_schedule(config.optimizer_arguments(), config.steps),
              "max_grad_norm": config.max_grad_norm, "label_smoothing": config.label_smoothing,
              "global_batch_size": config.batch_size, "max_source_length": config.max_length + 1}
    return TrainingRun(accelerator, model, optimizer, scheduler, iter(loader),
                       Objective.for_seq2seq(accelerator.unwrap_model(model).config, config.label_smoothing),
                       ToyTaskEvaluation(eval_batch), settings, output_dir, recipe=recipe)


def run_experiment(config: ExperimentConfig) -> dict:
    """Train one toy model with the training loop; returns the summary (also written to output_dir with
    metrics.jsonl, the loss curve and the model).

    Summary keys: those of `minitx train`'s training_summary.json, plus seconds_to_exact_match (None if the
    target was never reached) and experiment (the config); "model" holds the trained model.
    """
    out = Path(config.output_dir) if config.output_dir else None
    if out is not None:
        out = check_output_folder(out, flag="--overwrite", overwrite=config.overwrite, command="experiment")
    run, state = build_run(config, out), RunState()
    if out is not None:
        replace_folder(out, command="experiment")  # every check passed: only now is anything removed
    outcome = fit(run, state)
    if outcome.interrupted_by is not None:
        raise Interrupted(f"experiment stopped by {signal.Signals(outcome.interrupted_by).name} after step "
                          f"{state.step}; toy runs are short, so nothing was saved: run it again",
                          128 + outcome.interrupted_by)
    summary = {
        "task": "seq2seq", "dataset": f"toy:{config.task}", "dataset_config": None, "hub_dataset": False,
        **run_summary(run, state, outcome), "preset": f"experiment-{config.task}", "seed": config.seed,
        "seconds_to_exact_match": outcome.target_seconds, "experiment": asdict(config),
    }
    finish(run, None, summary, max_new_tokens=config.max_length + 1, card=False)
    if out is not None:
        unlock_folder(out)
    summary["model"] = run.accelerator.unwrap_model(run.model)
    return summary


def compare(config: ExperimentConfig, field: str, values: list, output_dir: str | Path,
            out: str | Path | None = None) -> dict[str, dict]:
    """Train one run per value of `field` (e.g. norm_position: post, pre) on the same data and seed and
    draw their curves in the same axes. Returns {"<field>=<value>": summary}; the picture goes to `out`
    (default output_dir/comparison.png).
    """
    from ..training.curves import plot_training

    if field not in ExperimentConfig.__dataclass_fields__ or field in ("output_dir", "seed", "overwrite"):
        raise ValueError(f"Cannot compare on {field!r}; pick an ExperimentConfig field such as norm_position.")
    if len(values) < 2:
        raise ValueError(f"Give at least two values of {field} to compare, got {values}.")
    if len(set(map(str, values))) < len(values):
        raise ValueError(f"--compare {field}: each value once, got {values}")
    root = check_output_folder(output_dir, flag="--overwrite", overwrite=config.overwrite, command="experiment")
    # every run's configuration is built (and checked) before anything is created
    runs = {f"{field}={v}": replace(config, **{field: v}, output_dir=str(root / f"{field}-{v}")) for v in values}
    replace_folder(root, command="experiment")
    summaries = {label: run_experiment(run) for label, run in runs.items()}
    plot_training({label: run.output_dir for label, run in runs.items()}, out or root / "comparison.png",
                  title=f"{config.task} task: {field} compared (same data, seed {config.seed})")
    unlock_folder(root)
    return summaries


PRESET_FILES = resources.files(__package__) / "experiment_presets"  # JSON files shipped inside the package
# each: ExperimentConfig fields over its defaults, and a `description`
PRESETS = {name: ExperimentConfig(**{key: value for key, value in preset.items() if key != "description"})
           for name, preset in shipped_presets(PRESET_FILES).items()}


@dataclass
class ExperimentArguments:
    """`minitx experiment`: which preset, and an optional comparison; every ExperimentConfig field overrides."""

    preset: str = field(default="copy", metadata={"help": f"starting configuration: {', '.join(PRESETS)}"})
    compare: list[str] | None = field(default=None, metadata={
        "help": "FIELD VALUE VALUE ...: train one run per value on the same data and seed, "
                "e.g. norm_position post pre"})
    threads: int | None = field(default=None, metadata={"help": "torch CPU threads (default: torch's choice)"})


# fields where the word `none` means "off"
NONE_FIELDS = ("stop_at_exact_match", "max_grad_norm", "final_logit_softcap")


def _take_none_values(argv: list[str]) -> tuple[list[str], dict[str, None]]:
    """Remove `--FIELD none` for NONE_FIELDS from argv; return the rest and those fields set to None."""
    rest, nones, i = [], {}, 0
    while i < len(argv):
        name = argv[i].lstrip("-")
        if argv[i].startswith("--") and name in NONE_FIELDS and i + 1 < len(argv) and argv[i + 1].lower() == "none":
            nones[name] = None
            i += 2
            continue
        rest.append(argv[i])
        i += 1
    return rest, nones


def _describe(label: str, summary: dict) -> str:
    final = summary["final_metrics"]
    reached = summary["seconds_to_exact_match"]
    when = f", target reached after {reached:.1f}s" if reached is not None else ""
    return (f"{label}: {summary['steps']} steps in {summary['train_seconds']:.1f}s{when}; "
            f"eval loss {final['eval_loss']:.4f}, exact match {final['eval_exact_match']:.1f}%")


def _convert(name: str, values: list[str]) -> list:
    """Command-line strings as the type of ExperimentConfig field `name` (the word `none` gives None)."""
    kind = type(ExperimentConfig.__dataclass_fields__[name].default)
    if kind is bool:  # read as HfArgumentParser reads a bool flag
        try:
            return [string_to_bool(v) for v in values]
        except ArgumentTypeError:
            raise ValueError(f"--compare {name}: values must be true or false, got {values}") from None
    convert = float if name in NONE_FIELDS else kind if kind in (int, float, str) else str
    try:
        return [None if name in NONE_FIELDS and v.lower() == "none" else convert(v) for v in values]
    except ValueError:
        raise ValueError(f"--compare {name}: values must be {'numbers' if convert is float else 'whole numbers'}"
                         f"{' or none' if name in NONE_FIELDS else ''}, got {values}") from None


def main(argv: Sequence[str] | None = None) -> dict:
    """`minitx experiment`: run the experiment or the comparison; returns {label: summary}."""
    from ..cli import parse_arguments

    argv, nones = _take_none_values(list(argv or []))
    preset = argv[argv.index("--preset") + 1] if "--preset" in argv[:-1] else "copy"
    if preset not in PRESETS:
        raise ValueError(f"unknown experiment preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    defaults = {**asdict(PRESETS[preset]), **nones}
    args, config = parse_arguments([ExperimentArguments, ExperimentConfig], argv, prog="minitx experiment",
                                   defaults=defaults, description=__doc__.split("\n\n")[0])
    config = replace(config, **nones)  # re-run the checks with the `none` values in place
    check_thread_count(args.threads, "--threads")
    if process_count() > 1:  # every process would claim the same folder and train alone
        raise ValueError("minitx experiment trains its toy models in one process: run it without accelerate launch "
                         "(--threads N uses more cores)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.compare is None:
        summaries = {config.task: run_experiment(config)}
    else:
        if len(args.compare) < 3:
            raise ValueError("--compare needs a field and at least two values, e.g. --compare norm_position post pre")
        if not config.output_dir:
            raise ValueError("--compare needs --output_dir (one sub-folder per run goes there)")
        name, values = args.compare[0], args.compare[1:]
        if name not in ExperimentConfig.__dataclass_fields__:
            raise ValueError(f"--compare: unknown field {name!r}; use an ExperimentConfig field such as norm_position")
        summaries = compare(config, name, _convert(name, values), config.output_dir)
        print(f"comparison picture: {Path(config.output_dir) / 'comparison.png'}")
    for label, summary in summaries.items():
        print(_describe(label, summary))
    return summaries


__all__ = ["ExperimentConfig", "PRESETS", "make_batch", "make_scheduler", "ToyTaskEvaluation", "run_experiment",
           "compare"]
