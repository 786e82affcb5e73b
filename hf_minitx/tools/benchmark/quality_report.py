"""The quality comparison as people read it: a Markdown table per run and the curves of both sides."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def format_quality(quality: dict[str, Any]) -> str:
    """Markdown: per corpus, the wall time, both sides' bits/byte, steps and tokens/s, and the ratio ours /
    reference."""
    seconds = quality["settings"]["seconds"]
    lines = ["| corpus | seconds per side | GPT-2, nanoGPT recipe: bits/byte | steps | tokens/s | hf_minitx, `minitx "
             "train --max_minutes`: bits/byte | steps | tokens/s | ratio (lower is better) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for corpus, figures in quality["corpora"].items():
        cells = [f"{_figure(side, 'bits_per_byte', 3)} | {_steps(side)} | {_figure(side, 'tokens_per_second', 0)}"
                 for side in (figures["reference"], figures["ours"])]
        lines.append(f"| `{corpus}` | {seconds:g} | {cells[0]} | {cells[1]} | {figures['ratio']:.3f}x |")
    pairs = {corpus: figures for corpus, figures in quality["corpora"].items() if "pair_ratio" in figures}
    if pairs:
        lines += ["", "Runs in two phases (a teacher, then a student learning from it; the kept model is in the table "
                  "above; the averaged pair is two models at inference, not what users take home):", "",
                  "| corpus | passes of one model | steps: teacher + student | teacher: bits/byte | student | kept | "
                  "the pair averaged | ratio of the pair |", "|---|---:|---:|---:|---:|---|---:|---:|"]
        for corpus, figures in pairs.items():
            split = figures["ours"]["phases"]
            steps = " + ".join(str(split.get("steps", {}).get(name, "-")) for name in ("teacher", "student"))
            lines.append(f"| `{corpus}` | {_figure(split, 'passes_of_one_model', 1)} | {steps} | "
                         f"{split['teacher']:.3f} | {split['student']:.3f} | {split['model_kept']} | "
                         f"{split['averaged_pair']:.3f} | "
                         f"{figures['pair_ratio']:.3f}x |")
    return "\n".join(lines)


def _steps(side: dict[str, Any]) -> str:
    """A side's steps; a run in two phases: the teacher's + the student's, the steps its tokens/s count."""
    steps = (side.get("phases") or {}).get("steps") or {}
    if steps.get("teacher") is not None and steps.get("student") is not None:
        return f"{steps['teacher']} + {steps['student']}"
    return str(side.get("steps", "-"))


def _figure(values: dict[str, Any], key: str, digits: int) -> str:
    value = values.get(key)
    return "-" if value is None else f"{value:,.{digits}f}"


def plot_curves(result: dict[str, Any], path: Path) -> Path:
    """Validation bits per byte against training seconds, both sides, one panel per corpus."""
    from ...training.curves import plt, save_figure  # matplotlib on the Agg backend, loaded when a plot is asked

    corpora = result["corpora"]
    fig, axes = plt.subplots(1, len(corpora), figsize=(5.5 * len(corpora), 4), squeeze=False)
    for ax, (corpus, figures) in zip(axes[0], corpora.items(), strict=True):
        for side, label in (("reference", "GPT-2, nanoGPT recipe"), ("ours", "hf_minitx, minitx train")):
            points = figures[side]["curve"]
            ax.plot([p["seconds"] for p in points], [p["bits_per_byte"] for p in points], marker="o", label=label)
        ax.set(title=f"{corpus}: ratio {figures['ratio']:.3f}", xlabel="training seconds",
               ylabel="validation bits/byte (first tokens)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return save_figure(fig, path)
