"""Toy experiments from the paper: the copy and reverse tasks, post-LN vs pre-LN, label smoothing, schedules.

Examples:

    python scripts/experiment.py --preset copy --output_dir runs/copy          # 100% exact match, < 1 min
    python scripts/experiment.py --preset reverse --output_dir runs/reverse
    python scripts/experiment.py --preset norm-position --compare norm_position post pre \\
        --output_dir runs/norm-position                                            # side-by-side curves
    python scripts/experiment.py --preset copy --compare label_smoothing 0.0 0.1 --stop_at_exact_match none \\
        --output_dir runs/smoothing
    python scripts/experiment.py --preset copy --compare schedule inverse_sqrt constant_with_warmup \\
        --output_dir runs/schedules

Every field of hf_minitx.experiments.ExperimentConfig can be overridden (--learning_rate 3e-3 ...).
Each run folder holds metrics.jsonl (draw it with `scripts/visualize.py training --run DIR`), the model
and training_summary.json; a comparison also writes comparison.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

try:
    from hf_minitx.experiments import PRESETS, ExperimentConfig, compare, run_experiment
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from hf_minitx.experiments import PRESETS, ExperimentConfig, compare, run_experiment


FIELD_HELP = {
    "stop_at_exact_match": "stop when validation exact match (percent) reaches this (none: run all steps)",
    "max_grad_norm": "gradient clipping norm (none: no clipping)",
    "output_dir": "folder for metrics.jsonl, the model and training_summary.json",
}


def _optional_float(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def _field_type(name: str):
    """The converter of an ExperimentConfig field's command-line value."""
    if name in ("stop_at_exact_match", "max_grad_norm"):
        return _optional_float
    if name == "output_dir":
        return str
    return type(ExperimentConfig.__dataclass_fields__[name].default)


def parse_args(argv: list[str] | None = None) -> tuple[ExperimentConfig, argparse.Namespace]:
    """Options: a preset, field overrides, and an optional comparison."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="copy", help="starting configuration")
    parser.add_argument("--compare", nargs="+", metavar=("FIELD", "VALUE"),
                        help="train one run per value of FIELD on the same data and seed, e.g. norm_position post pre")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    for field in dataclasses.fields(ExperimentConfig):
        parser.add_argument(f"--{field.name}", type=_field_type(field.name), default=argparse.SUPPRESS,
                            help=FIELD_HELP.get(field.name, f"default: {field.default}"))
    args = parser.parse_args(argv)
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(ExperimentConfig) if hasattr(args, f.name)}
    if args.compare is not None and len(args.compare) < 3:
        parser.error("--compare needs a field and at least two values, e.g. --compare norm_position post pre")
    if args.compare is not None and not overrides.get("output_dir"):
        parser.error("--compare needs --output_dir (one sub-folder per run goes there)")
    try:
        config = dataclasses.replace(PRESETS[args.preset], **overrides)
    except ValueError as err:
        parser.error(str(err))
    return config, args


def _convert(field: str, values: list[str]) -> list:
    """Turn command-line strings into the field's type."""
    return [_field_type(field)(v) for v in values]


def _describe(label: str, summary: dict) -> str:
    final = summary["final_metrics"]
    reached = summary["seconds_to_exact_match"]
    when = f", target reached after {reached:.1f}s" if reached is not None else ""
    return (f"{label}: {summary['steps']} steps in {summary['train_seconds']:.1f}s{when}; "
            f"eval loss {final['eval_loss']:.4f}, exact match {final['eval_exact_match']:.1f}%")


def main(argv: list[str] | None = None) -> dict:
    """Run the experiment(s); returns {label: summary}."""
    config, args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.compare:
        field, values = args.compare[0], args.compare[1:]
        if field not in ExperimentConfig.__dataclass_fields__:
            raise SystemExit(f"--compare: unknown field {field!r}; use an ExperimentConfig field such as norm_position")
        summaries = compare(config, field, _convert(field, values), config.output_dir)
        print(f"comparison picture: {Path(config.output_dir) / 'comparison.png'}")
    else:
        summaries = {config.task: run_experiment(config)}
    for label, summary in summaries.items():
        print(_describe(label, summary))
    return summaries


if __name__ == "__main__":
    from hf_minitx.cli import run_cli

    sys.exit(run_cli(main))
