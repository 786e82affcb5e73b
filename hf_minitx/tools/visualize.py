"""Pictures of what happens inside a MiniTx model: attention maps, positional encodings, masks, parameter
counts and training curves.

Every `plot_*` function writes one PNG (matplotlib, Agg backend) and returns the numbers it drew as NumPy
arrays, so the pictures can be checked, not only looked at. Attention weights come from the model itself
(`attn_implementation="eager"`, `output_attentions=True`); nothing here recomputes attention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from ..folders import check_output_file  # noqa: E402
from ..inference import load_model_folder  # noqa: E402
from ..models.attention_minitx import causal_mask, padding_mask, self_attention_mask  # noqa: E402
from ..models.positions_minitx import rope_inverse_frequencies, sinusoidal_table  # noqa: E402
from ..training.curves import (  # noqa: E402
    DPI,
    check_png_path,
    plot_training,
    read_metrics,
    save_figure,
    written_by_us,
)
from .model_reading import (  # noqa: E402
    check_fits_positions,
    encode_text,
    format_param_table,
    parameter_component,
    parameter_counts,
    token_labels,
)

ATTENTION_CMAP = "viridis"
MAX_PICTURE_POSITIONS = 4096  # positions (and dimensions) a positions picture draws: (length, length) similarities
MAX_MASK_POSITIONS = 512  # a mask picture draws one cell per pair of positions

PathLike = str | Path


# --- loading ---------------------------------------------------------------------------------------


def _load(model_dir: PathLike) -> tuple[Any, Any | None]:
    """A saved folder on the CPU in float32 with the eager attention path, which returns weights; the
    tokenizer is None for a model trained on raw token ids (the copy task)."""
    return load_model_folder(model_dir, device="cpu", dtype=torch.float32, attn_implementation="eager",
                             need_tokenizer=False)


def _as_model(model: Any, tokenizer: Any | None) -> tuple[Any, Any | None]:
    """Accept a folder or a ready model; make sure the model returns attention weights."""
    if isinstance(model, (str, Path)):
        loaded, loaded_tokenizer = _load(model)
        return loaded, tokenizer if tokenizer is not None else loaded_tokenizer
    if getattr(model.config, "_attn_implementation", "eager") != "eager":
        model.set_attn_implementation("eager")
    return model.eval(), tokenizer


# --- attention -----------------------------------------------------------------------------------


def _stack(per_layer: Sequence[torch.Tensor] | None, kind: str) -> np.ndarray:
    """Tuple over layers of (batch=1, heads, q, k) -> (layers, heads, q, k) float array."""
    if not per_layer or any(weights is None for weights in per_layer):
        raise RuntimeError(
            f"The model returned no {kind} weights; load it with attn_implementation='eager' "
            "(loading a folder here does)."
        )
    return torch.stack([w[0] for w in per_layer]).float().numpy()  # (layers, heads, q, k)


@torch.no_grad()
def attention_weights(
    model: Any,
    tokenizer: Any | None = None,
    text: str | None = None,
    source: str | None = None,
    target: str | None = None,
) -> dict[str, Any]:
    """Run the model once and collect its attention weights.

    Decoder-only models take `text`; encoder-decoder models take `source` and `target` (teacher forcing:
    the decoder reads the start token + target, as in training).

    Returns a dict with arrays of shape (layers, heads, queries, keys) under "self" (decoder-only) or
    "encoder", "decoder", "cross" (seq2seq), and the tick labels of each axis under "labels".
    """
    model, tokenizer = _as_model(model, tokenizer)
    config = model.config
    if not config.is_encoder_decoder:
        if text is None or source is not None or target is not None:
            raise ValueError("A decoder-only model reads one text (--text, or text=...)"
                             + (": it is missing" if text is None else "")
                             + ("; a source and a target (--source/--target) are for encoder-decoder models"
                                if source is not None or target is not None else ""))
        ids = encode_text(text, tokenizer, config)
        check_fits_positions("--text", ids, config)
        out = model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
        tokens = token_labels(ids, tokenizer, config)
        return {"self": _stack(out.attentions, "self-attention"), "labels": {"self": (tokens, tokens)}}

    if source is None or target is None or text is not None:
        missing = [name for name, value in (("--source", source), ("--target", target)) if value is None]
        raise ValueError("An encoder-decoder model reads a source and a target (--source and --target, or "
                         "source=... and target=...)"
                         + (f": {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing" if missing
                            else "")
                         + ("; a single text (--text) is for decoder-only models" if text is not None else ""))
    eos = config.eos_token_id
    source_ids = encode_text(source, tokenizer, config) + [eos]
    labels = encode_text(target, tokenizer, config, option="--target") + [eos]
    decoder_ids = [config.decoder_start_token_id] + labels[:-1]
    for name, ids in (("--source", source_ids), ("--target", decoder_ids)):
        check_fits_positions(name, ids, config)
    out = model(
        input_ids=torch.tensor([source_ids]), decoder_input_ids=torch.tensor([decoder_ids]),
        output_attentions=True, use_cache=False,
    )
    src = token_labels(source_ids, tokenizer, config)
    predicted = token_labels(labels, tokenizer, config)
    decoder_in = token_labels(decoder_ids, tokenizer, config)
    return {
        "encoder": _stack(out.encoder_attentions, "encoder self-attention"),
        "decoder": _stack(out.decoder_attentions, "decoder self-attention"),
        "cross": _stack(out.cross_attentions, "cross-attention"),
        "labels": {"encoder": (src, src), "decoder": (predicted, decoder_in), "cross": (predicted, src)},
    }


_TITLES = {
    "self": ("self-attention", "key (attended) token", "query token"),
    "encoder": ("encoder self-attention", "source token", "source token"),
    "decoder": ("decoder self-attention", "decoder input token", "predicting token"),
    "cross": ("cross-attention", "source token", "predicting token"),
}


def _ticks(ax: Any, rows: Sequence[str], cols: Sequence[str], show_rows: bool) -> None:
    size = 7 if max(len(rows), len(cols)) <= 24 else 5
    step = max(1, math.ceil(max(len(rows), len(cols)) / 40))
    ax.set_xticks(range(0, len(cols), step))
    ax.set_xticklabels(cols[::step], rotation=90, fontsize=size)
    ax.set_yticks(range(0, len(rows), step))
    ax.set_yticklabels(rows[::step] if show_rows else [], fontsize=size)


def plot_attention(
    model: Any,
    tokenizer: Any | None = None,
    *,
    text: str | None = None,
    source: str | None = None,
    target: str | None = None,
    out: PathLike,
    kinds: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Heatmaps of attention weights, one row per layer, one column per head plus the head average.

    `model` is a folder written by save_pretrained or a loaded model (with `tokenizer`, or None for a model
    trained on raw token ids, whose text is then whitespace-separated ids). `kinds` picks the maps of a
    seq2seq model (default: encoder, decoder, cross). Returns `attention_weights(...)`'s dict.
    """
    check_png_path(out)
    data = attention_weights(model, tokenizer, text=text, source=source, target=target)
    available = [k for k in ("self", "encoder", "decoder", "cross") if k in data]
    kinds = list(kinds) if kinds else available
    unknown = [k for k in kinds if k not in available]
    if unknown:
        raise ValueError(f"Unknown attention kind(s) {unknown} for this model; choose from {available}.")
    layers, heads = data[kinds[0]].shape[:2]
    rows = sum(data[k].shape[0] for k in kinds)
    cols = heads + 1
    fig, axes = plt.subplots(rows, cols, figsize=(2.3 * cols + 1.0, 2.5 * rows + 0.6), squeeze=False)
    image = None
    row = 0
    for kind in kinds:
        title, xlabel, ylabel = _TITLES[kind]
        q_labels, k_labels = data["labels"][kind]
        for layer, per_head in enumerate(data[kind]):
            maps = [*per_head, per_head.mean(0)]  # heads, then their average
            for col, weights in enumerate(maps):
                ax = axes[row, col]
                image = ax.imshow(weights, cmap=ATTENTION_CMAP, vmin=0.0, vmax=1.0, aspect="auto")
                name = f"head {col}" if col < heads else "mean of heads"
                ax.set_title(f"{title}\nlayer {layer} · {name}", fontsize=8)
                _ticks(ax, q_labels, k_labels, show_rows=col == 0)
                if row == rows - 1 or kind != kinds[-1] and layer == data[kind].shape[0] - 1:
                    ax.set_xlabel(xlabel, fontsize=7)
                if col == 0:
                    ax.set_ylabel(ylabel, fontsize=7)
            row += 1
    fig.suptitle("Attention weights (rows: queries, each row sums to 1)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 0.93, 0.98))
    cax = fig.add_axes((0.945, 0.15, 0.012, 0.7))
    fig.colorbar(image, cax=cax, label="attention weight")
    save_figure(fig, out)
    return data


# --- positions -----------------------------------------------------------------------------------


def plot_positions(
    dim: int = 128,
    length: int = 100,
    out: PathLike = "positions.png",
    *,
    rope_theta: float = 10000.0,
    head_dim: int | None = None,
    curves: Sequence[int] | None = None,
) -> dict[str, np.ndarray]:
    """The paper's sinusoidal table, a few of its dimensions as curves, the similarity of positions, and
    the rotation frequencies of rotary embeddings (RoPE) for a head of `head_dim` (default `dim`).

    Returns "table" (length, dim), "similarity" (length, length) = table · tableᵀ, "rope_inv_freq"
    (head_dim // 2,) in radians per position, "rope_wavelength" (head_dim // 2,) in positions.
    """
    check_png_path(out)
    head_dim = dim if head_dim is None else head_dim
    if dim <= 0 or dim % 2 or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"dim and head_dim must be positive even numbers, got dim={dim}, head_dim={head_dim}.")
    if not 2 <= length <= MAX_PICTURE_POSITIONS or max(dim, head_dim) > MAX_PICTURE_POSITIONS:
        raise ValueError(f"length must be 2 to {MAX_PICTURE_POSITIONS} positions and dim and head_dim at most "
                         f"{MAX_PICTURE_POSITIONS} (a picture, not a model), got length={length}, dim={dim}, "
                         f"head_dim={head_dim}.")
    if not 1 < rope_theta < math.inf:
        raise ValueError(f"rope_theta must be greater than 1 (the base of the rotation wavelengths; 10000 in "
                         f"RoPE), got {rope_theta:g}.")
    if curves is None:  # a fast, a middle and a slow pair (sin and cos of each)
        curves = sorted({0, 1, 2 * (dim // 16), 2 * (dim // 16) + 1, 2 * (dim // 4), 2 * (dim // 4) + 1})
    bad = [c for c in curves if not 0 <= c < dim]
    if bad:
        raise ValueError(f"curve dimensions {bad} are outside [0, {dim}); pick dimensions below dim.")
    table = sinusoidal_table(length, dim).numpy()  # (length, dim)
    similarity = table @ table.T  # (length, length)
    inv_freq = rope_inverse_frequencies(head_dim, rope_theta).numpy()  # (head_dim // 2,)
    wavelength = 2 * np.pi / inv_freq

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    ax = axes[0, 0]
    im = ax.imshow(table, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.set(title=f"Sinusoidal encoding PE[pos, i]\n(dim={dim}, {length} positions)", xlabel="dimension i",
           ylabel="position")
    fig.colorbar(im, ax=ax, label="value")

    ax = axes[0, 1]
    for c in curves:
        kind = "sin" if c % 2 == 0 else "cos"
        ax.plot(np.arange(length), table[:, c], label=f"dim {c} ({kind})")
    ax.set(title="A few dimensions over positions\n(low dimensions turn fast, high ones slowly)",
           xlabel="position", ylabel="PE value", ylim=(-1.15, 1.6))
    ax.legend(fontsize=8, ncol=3, loc="upper right")

    ax = axes[1, 0]
    im = ax.imshow(similarity, cmap="magma", aspect="auto", interpolation="nearest")
    ax.set(title="Similarity PE[p]·PE[q]\n(depends only on the distance p − q)",
           xlabel="position q", ylabel="position p")
    fig.colorbar(im, ax=ax, label="dot product")

    ax = axes[1, 1]
    pairs = np.arange(len(inv_freq))
    ax.semilogy(pairs, inv_freq, marker=".", color="tab:blue", label="angle per position (rad)")
    ax.set(title=f"Rotary (RoPE) rotation frequencies\n(head_dim={head_dim}, theta={rope_theta:g})",
           xlabel="channel pair i", ylabel="radians per position (log)")
    twin = ax.twinx()
    twin.semilogy(pairs, wavelength, color="tab:orange", linestyle="--", label="wavelength (positions)")
    twin.set_ylabel("wavelength in positions (log)")
    lines = ax.get_lines() + twin.get_lines()
    ax.legend(lines, [line.get_label() for line in lines], fontsize=8, loc="center right")
    fig.tight_layout()
    save_figure(fig, out)
    return {"table": table, "similarity": similarity, "rope_inv_freq": inv_freq, "rope_wavelength": wavelength}


# --- masks ---------------------------------------------------------------------------------------


def plot_masks(length: int = 10, out: PathLike = "masks.png", *, num_padding: int = 3) -> dict[str, np.ndarray]:
    """The masks a decoder layer uses, built by hf_minitx.models.attention_minitx (True = may attend).

    A batch row of `length` positions is left-padded with `num_padding` pad tokens (as in batched
    generation). Returns boolean (length, length) arrays "causal", "padding" and "combined" (what the
    layer applies: causal and not padding, plus each query's own position so no row is empty).
    """
    check_png_path(out)
    if not 2 <= length <= MAX_MASK_POSITIONS:
        raise ValueError(f"length must be 2 to {MAX_MASK_POSITIONS} (one cell per pair of positions), got {length}.")
    if not 0 <= num_padding < length:
        raise ValueError(f"num_padding must be in [0, {length}) so at least one real token remains, got {num_padding}.")
    attention_mask = torch.ones(1, length, dtype=torch.long)
    attention_mask[0, :num_padding] = 0  # left padding
    causal = causal_mask(length, length)[0, 0].numpy()
    padding = padding_mask(attention_mask, length)[0, 0].numpy()
    combined = self_attention_mask(attention_mask, length, 0, length, causal=True)[0, 0].numpy()

    fig, axes = plt.subplots(1, 3, figsize=(13, 4.8))
    cmap = matplotlib.colors.ListedColormap(["#d9d9d9", "#2b6cb0"])
    titles = ("Causal mask\n(query sees itself and the past)",
              f"Padding mask\n({num_padding} left-padding tokens hidden)",
              "Combined (what the decoder applies)\npadded queries keep their own position")
    image = None
    for ax, mask, title in zip(axes, (causal, padding, combined), titles, strict=True):
        image = ax.imshow(mask.astype(int), cmap=cmap, vmin=0, vmax=1)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        ax.set_xticks(range(length))
        ax.set_yticks(range(length))
        ax.tick_params(labelsize=7)
    fig.tight_layout(rect=(0, 0, 0.88, 1))
    cax = fig.add_axes((0.9, 0.2, 0.012, 0.6))
    bar = fig.colorbar(image, cax=cax, ticks=[0.25, 0.75])
    bar.ax.set_yticklabels(["blocked", "may attend"])
    save_figure(fig, out)
    return {"causal": causal, "padding": padding, "combined": combined}


# --- parameters ----------------------------------------------------------------------------------


def plot_params(model: Any, out: PathLike = "params.png") -> dict[str, int]:
    """Bar chart and table of parameter counts per component (embeddings, attention, FFN, norms, head).

    `model` is a folder written by save_pretrained or a loaded model. Returns the counts.
    """
    check_png_path(out)
    if isinstance(model, (str, Path)):
        model, _ = _load(model)
    counts = parameter_counts(model)
    total = sum(counts.values())
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    names = list(counts)
    fig, (ax, tax) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    bars = ax.bar(names, [counts[n] for n in names], color="tab:blue")
    for bar, name in zip(bars, names, strict=True):
        ax.annotate(f"{counts[name]:,}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    kind = "encoder-decoder" if model.config.is_encoder_decoder else "decoder-only"
    ax.set(title=f"Parameters per component ({kind}, total {total:,})", ylabel="parameters")
    ax.tick_params(axis="x", labelrotation=20)
    ax.margins(y=0.15)
    rows = [[n, f"{counts[n]:,}", f"{100 * counts[n] / max(total, 1):.1f}%"] for n in names]
    rows.append(["total", f"{total:,}", "100.0%"])
    tax.axis("off")
    table = tax.table(cellText=rows, colLabels=["component", "parameters", "share"], loc="center")
    table.scale(1, 1.5)
    note = "output head tied to the token embeddings (counted once)" if tied else "output head has its own weights"
    tax.set_title(note, fontsize=9)
    fig.tight_layout()
    save_figure(fig, out)
    return counts


# --- the `minitx visualize` command ---------------------------------------------------------------


@dataclass
class AttentionPlotArguments:
    """attention weights per layer and head (+ head average), tokens on the axes"""

    model: str = field(metadata={"help": "folder written by save_pretrained"})
    out: str = field(metadata={"help": "PNG file to write"})
    text: str | None = field(default=None, metadata={"help": "input text (decoder-only model)"})
    source: str | None = field(default=None, metadata={"help": "source text (encoder-decoder model)"})
    target: str | None = field(default=None, metadata={
        "help": "target text (encoder-decoder model), read with teacher forcing"})
    kinds: list[str] | None = field(default=None, metadata={
        "help": "which maps of a seq2seq model to draw: self, encoder, decoder, cross (default: all)"})


@dataclass
class PositionsPlotArguments:
    """sinusoidal table, a few dimensions as curves, position similarity, rotary frequencies"""

    out: str = field(metadata={"help": "PNG file to write"})
    dim: int = field(default=128, metadata={"help": "model width (hidden_size)"})
    length: int = field(default=100, metadata={"help": "number of positions"})
    head_dim: int | None = field(default=None, metadata={"help": "rotary head width (default: --dim)"})
    rope_theta: float = field(default=10000.0, metadata={"help": "rotary base"})


@dataclass
class TrainingPlotArguments:
    """train/validation loss, learning rate, throughput, task metric from metrics.jsonl"""

    run: list[str] = field(metadata={"help": "run folder(s); several are drawn in the same axes"})
    out: str = field(metadata={"help": "PNG file to write"})


@dataclass
class MasksPlotArguments:
    """causal, padding and combined masks"""

    out: str = field(metadata={"help": "PNG file to write"})
    length: int = field(default=10, metadata={"help": "sequence length"})
    num_padding: int = field(default=3, metadata={"help": "left-padding tokens in the padding mask"})


@dataclass
class ParamsPlotArguments:
    """parameter counts per component (embeddings, attention, FFN, norms, head)"""

    model: str = field(metadata={"help": "folder written by save_pretrained"})
    out: str = field(metadata={"help": "PNG file to write"})


@dataclass
class OutputFileArguments:
    """What may be replaced."""

    overwrite: bool = field(default=False, metadata={
        "help": "replace an existing --out file that minitx did not write (its own PNGs are replaced anyway)"})


PICTURES = {"attention": AttentionPlotArguments, "positions": PositionsPlotArguments,
            "training": TrainingPlotArguments, "masks": MasksPlotArguments, "params": ParamsPlotArguments}
ATTENTION_KINDS = ("self", "encoder", "decoder", "cross")


def draw(args: Any) -> None:
    """Draw the picture that `args` (one of the PICTURES dataclasses) asks for."""
    if isinstance(args, AttentionPlotArguments):
        unknown = sorted(set(args.kinds or ()) - set(ATTENTION_KINDS))
        if unknown:
            raise ValueError(f"--kinds {unknown} unknown; choose among {', '.join(ATTENTION_KINDS)}")
        plot_attention(args.model, text=args.text, source=args.source, target=args.target, out=args.out,
                       kinds=args.kinds)
    elif isinstance(args, PositionsPlotArguments):
        plot_positions(args.dim, args.length, args.out, rope_theta=args.rope_theta, head_dim=args.head_dim)
    elif isinstance(args, TrainingPlotArguments):
        plot_training(args.run[0] if len(args.run) == 1 else args.run, args.out)
    elif isinstance(args, MasksPlotArguments):
        plot_masks(args.length, args.out, num_padding=args.num_padding)
    else:
        print(format_param_table(plot_params(args.model, args.out)))


def main(argv: Sequence[str] | None = None) -> Path | int:
    """`minitx visualize PICTURE --out FILE.png ...`; returns the PNG path (the exit code where no picture is named)."""
    from ..cli import EXIT_USAGE, parse_arguments

    argv = list(argv or [])
    if not argv or argv[0] in ("-h", "--help"):
        listing = "\n".join(f"  {name:<10} {cls.__doc__}" for name, cls in PICTURES.items())
        print(f"usage: minitx visualize PICTURE --out FILE.png [ARGS ...]\n\npictures:\n{listing}\n\n"
              "`minitx visualize PICTURE --help` lists its arguments.")
        return EXIT_USAGE if not argv else Path()  # no picture named: a usage error, as `minitx` alone is
    if argv[0] not in PICTURES:
        raise ValueError(f"unknown picture {argv[0]!r}; choose one of: {', '.join(PICTURES)}")
    args, output = parse_arguments([PICTURES[argv[0]], OutputFileArguments], argv[1:],
                                   prog=f"minitx visualize {argv[0]}", description=PICTURES[argv[0]].__doc__)
    if not args.out.lower().endswith(".png"):
        raise ValueError(f"--out must name a .png file, got {args.out}")
    check_output_file(args.out, overwrite=output.overwrite, option="--out", is_ours=written_by_us)
    draw(args)
    print(f"wrote {args.out}")
    return Path(args.out)


__all__ = [
    "DPI",
    "attention_weights",
    "plot_attention",
    "plot_positions",
    "plot_masks",
    "parameter_component",
    "parameter_counts",
    "format_param_table",
    "plot_params",
    "read_metrics",
    "plot_training",
]
