"""The training curves of a run, drawn from its metrics.jsonl, and the one writer of tagged PNG files.

`plot_training` draws loss (train and validation), learning rate, throughput and the task metric of one or
more runs; the training loop's last step draws a run's `loss_curve.png` with it, and `minitx visualize
training` and `minitx experiment --compare` call it too. `save_figure` writes every PNG the package makes
(atomically, tagged as ours so that it may be replaced without --overwrite).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image, PngImagePlugin  # noqa: E402  (installed with matplotlib)

from ..folders import WRITTEN_BY, write_file  # noqa: E402
from .outputs import read_metrics  # noqa: E402

DPI = 100
MAX_PNG_BYTES = 150_000

PathLike = str | Path


def plot_training(
    run_dir: PathLike | Sequence[PathLike] | Mapping[str, PathLike],
    out: PathLike = "training.png",
    *,
    title: str | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """Loss (train and validation), learning rate, throughput and the task metric of one or more runs.

    `run_dir` is a run folder (or metrics.jsonl), a list of them, or a {label: folder} mapping to draw runs
    side by side in the same axes. Returns {label: read_metrics(folder)}.
    """
    check_png_path(out)
    if isinstance(run_dir, Mapping):
        runs = dict(run_dir)
    elif isinstance(run_dir, (str, Path)):
        runs = {Path(run_dir).name or str(run_dir): run_dir}
    else:
        runs = {Path(r).name: r for r in run_dir}
    if not runs:
        raise ValueError("plot_training needs at least one run folder.")
    data = {label: read_metrics(folder) for label, folder in runs.items()}
    metric = next((m for m in ("eval_exact_match", "eval_bleu", "eval_perplexity", "eval_bits_per_byte")
                   if any(m in d and np.isfinite(d[m]).any() for d in data.values())), None)

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (loss_ax, lr_ax), (speed_ax, metric_ax) = axes
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, d) in enumerate(data.items()):
        color = colors[i % len(colors)]
        lone = {"marker": "o", "markersize": 4} if d["train_step"].size == 1 else {}  # one point draws no line
        loss_ax.plot(d["train_step"], d["train_loss"], color=color, alpha=0.8, label=f"{label} train", **lone)
        if d["eval_step"].size:
            loss_ax.plot(d["eval_step"], d["eval_loss"], color=color, linestyle="--", marker="o", markersize=3,
                         label=f"{label} validation")
        lr_ax.plot(d["train_step"], d["learning_rate"], color=color, label=label, **lone)
        speed_ax.plot(d["train_step"], d["tokens_per_second"], color=color, label=label, **lone)
        if metric and metric in d:
            metric_ax.plot(d["eval_step"], d[metric], color=color, marker="o", markersize=3, label=label)
    loss_ax.set(title="Loss (solid: train, dashed: validation)", xlabel="step", ylabel="cross-entropy")
    if all(np.nanmin(d["train_loss"]) > 0 for d in data.values()):
        loss_ax.set_yscale("log")
    lr_ax.set(title="Learning rate schedule", xlabel="step", ylabel="learning rate")
    speed_ax.set(title="Throughput", xlabel="step", ylabel="tokens / second")
    if metric:
        metric_ax.set(title=f"Validation {metric.removeprefix('eval_').replace('_', ' ')}", xlabel="step",
                      ylabel=metric.removeprefix("eval_"))
    else:
        metric_ax.set_title("No task metric in the eval records")
        metric_ax.axis("off")
    for ax in (loss_ax, lr_ax, speed_ax, metric_ax):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title or "Training curves: " + ", ".join(data), fontsize=12)
    fig.tight_layout()
    save_figure(fig, out)
    return data


def check_png_path(out: PathLike, option: str | None = None) -> None:
    """Reject an output path that is not a PNG file before any work starts (``option``: the flag that named it)."""
    if Path(out).suffix.lower() != ".png":
        if option:
            raise ValueError(f"{option} must be a .png file, got {out}; e.g. {option} curves.png")
        raise ValueError(f"Output must be a .png file, got {out}; e.g. out='attention.png'.")


def save_figure(fig: Any, out: PathLike) -> Path:
    """Write the PNG atomically (a temporary sibling renamed into place), tagged as ours (PNG "Software")."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, lambda tmp: _write_png(fig, tmp))
    plt.close(fig)
    return path


def _write_png(fig: Any, path: Path) -> None:
    fig.savefig(path, dpi=DPI, format="png", metadata={"Software": WRITTEN_BY})
    if path.stat().st_size > MAX_PNG_BYTES:  # busy pictures: a 256-colour palette keeps them commit-friendly
        with Image.open(path) as image:
            small = image.convert("RGB").quantize(colors=256)
        info = PngImagePlugin.PngInfo()
        info.add_text("Software", WRITTEN_BY)
        small.save(path, format="png", optimize=True, pnginfo=info)


def written_by_us(path: Path) -> bool:
    """Whether the PNG at ``path`` carries our tag (so `minitx visualize` may replace it without --overwrite)."""
    try:
        with Image.open(path) as image:
            return image.info.get("Software") == WRITTEN_BY
    except OSError:
        return False


__all__ = ["read_metrics", "plot_training", "check_png_path", "save_figure", "written_by_us", "DPI", "MAX_PNG_BYTES"]
