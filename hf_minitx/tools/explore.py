"""`minitx explore`: one self-contained HTML file that shows what a model does with a text, and how that
changed while it trained.

    minitx explore --model runs/kjv-gpt --run runs/kjv-gpt --text "And God said" --out explore.html

The page needs no network, no server and no external script: the CSS, the JavaScript and the data (as
inline JSON) are all inside it. It shows the tokens (ids on hover); the attention weights of every layer
and head (seq2seq: encoder, decoder and cross-attention) with a click on a token showing where it looks;
the top-k next tokens at every position and the logit lens (each layer's residual stream read through the
final norm and the head); with `--run`, a slider over the run's checkpoints that redraws attention and
predictions for each one next to the loss curve; and the model (config, parameters per component,
positional-encoding curves).

Attention weights come from the eager attention path (`output_attentions=True`); they are stored as
uint8 (weight x 255), probabilities rounded to 3 decimals, so that a 6-layer model on 64 tokens with a
dozen checkpoints stays well under 5 MB.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from ..data.tokenizer import load_tokenizer
from ..folders import (
    HTML_TAG,
    check_output_file,
    holding_lock,
    html_written_by_us,
    read_marker,
    read_summary,
    weights_digest,
    write_file,
)
from ..inference import NON_FINITE_OUTPUTS, check_finite_weights, load_model_folder
from ..model_files import is_interrupted_run, model_kind, read_safetensors_header
from ..models import MiniTxConfig
from ..models.positions_minitx import rope_inverse_frequencies
from ..training.checkpoints import CHECKPOINT_PREFIX, MODEL_FILES, RUN_STATE_FILE, list_checkpoints
from ..training.outputs import METRICS_FILE, read_metrics
from ..training.setup import build_model
from .model_reading import check_fits_positions, encode_text, parameter_counts, special_names, token_text

LENS_TOP = 3  # tokens kept per layer and position in the logit lens
CURVE_POSITIONS = 128  # positions drawn in the positional-encoding curves
CURVE_DIMS = 6  # dimensions (or rotary pairs) drawn


@dataclass
class ExploreArguments:
    """`minitx explore`: an HTML page of a model's tokens, attention, predictions and training."""

    model: str = field(metadata={"help": "a saved model folder (the --output_dir of a training run)"})
    text: str = field(metadata={"help": "the text to look at (the source, for an encoder-decoder model)"})
    out: str = field(metadata={"help": "HTML file to write, e.g. explore.html"})
    target: str | None = field(default=None, metadata={
        "help": "encoder-decoder models: the target text, read with teacher forcing (required for them)"})
    run: str | None = field(default=None, metadata={
        "help": "a training output folder with checkpoint-STEP folders: adds a slider over them and the loss curve"})
    top_k: int = field(default=5, metadata={"help": "next-token candidates shown at each position (1 to 50)"})
    max_checkpoints: int = field(default=12, metadata={
        "help": "at most this many checkpoints, evenly spread from the first to the last (keeps the file small)"})
    overwrite: bool = field(default=False, metadata={
        "help": "replace an existing --out file that minitx did not write (its own pages are replaced anyway)"})


# --- inputs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """The token ids the model reads: `ids` (decoder-only) or `source` + `decoder` (seq2seq, teacher forcing)."""

    ids: list[int]
    source: list[int] | None = None


def encode_inputs(model: Any, tokenizer: Any | None, text: str, target: str | None) -> Inputs:
    """Token ids for the model, refused when they do not fit its positions or a seq2seq target is missing."""
    config = model.config
    if config.is_encoder_decoder:
        if target is None:
            raise ValueError("this is an encoder-decoder model: give the output text with --target "
                             "(it is read with teacher forcing), and the source with --text")
        source = encode_text(text, tokenizer, config) + [config.eos_token_id]
        decoder = [config.decoder_start_token_id] + encode_text(target, tokenizer, config, option="--target")
        for name, ids in (("--text", source), ("--target", decoder)):
            check_fits_positions(name, ids, config)
        return Inputs(ids=decoder, source=source)
    if target is not None:
        raise ValueError("--target is for encoder-decoder models; this decoder-only model reads --text alone")
    ids = encode_text(text, tokenizer, config)
    check_fits_positions("--text", ids, config)
    return Inputs(ids=ids)


# --- snapshots: the final model and each checkpoint ------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """Weights to look at: the final folder (``path`` None) or a checkpoint's model file."""

    label: str
    step: int | None
    path: Path | None = None


def final_step(model_dir: Path) -> int | None:
    """The step the final model was saved at (training_summary.json), None when unknown."""
    steps = (read_summary(model_dir) or {}).get("steps")
    return steps if isinstance(steps, int) else None


def spread(items: Sequence[Any], most: int) -> list[Any]:
    """At most `most` of `items`, evenly spread, keeping the first and the last (only the last when most is 1)."""
    if len(items) <= most:
        return list(items)
    if most < 2:
        return list(items[-1:])
    return [items[round(i * (len(items) - 1) / (most - 1))] for i in range(most)]


def find_snapshots(model_dir: Path, run: str | None, most: int, latest: int | None = None) -> list[Snapshot]:
    """The final model, preceded by up to `most` checkpoints of `run` (each one's weights checked). ``latest``:
    an interrupted run's model is its checkpoint of that step, shown last in place of a final model."""
    if most < 1:
        raise ValueError(f"--max_checkpoints must be at least 1, got {most}")
    step = final_step(model_dir) if latest is None else latest
    label = (f"step {latest} (latest checkpoint)" if latest is not None
             else "final" if step is None else f"final (step {step})")
    final = Snapshot(label=label, step=step)
    if run is None:
        return [final]
    run_dir = Path(run)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"--run {run} is not a folder; pass the --output_dir of a training run")
    check_same_run_id(model_dir, run_dir)
    checkpoints = [(p, files[0]) for p in list_checkpoints(run_dir)
                   if (files := [p / name for name in MODEL_FILES if (p / name).is_file()])]
    if not checkpoints:
        raise ValueError(f"--run {run} holds no {CHECKPOINT_PREFIX}STEP folder with model weights; train with "
                         "--checkpointing_steps N (and --save_total_limit to keep several), or leave out --run")
    snapshots = []
    for folder, weights in spread(checkpoints, most):
        if weights.suffix == ".safetensors":
            read_safetensors_header(weights)  # a damaged file is named before any work
        number = int(folder.name.removeprefix(CHECKPOINT_PREFIX))
        if number != step:  # the last checkpoint of a finished run holds the final weights
            snapshots.append(Snapshot(label=f"step {number}", step=number, path=weights))
    return sorted(snapshots + [final], key=lambda s: math.inf if s.step is None else s.step)  # a resumed run: by step


def latest_checkpoint_model(run_dir: Path) -> tuple[Any, Any, int]:
    """An interrupted run (checkpoints, no final folder): the eval-mode model of its latest checkpoint, built from
    the run's recorded model settings and its tokenizer, the tokenizer, and that checkpoint's step."""
    folder = next((p for p in reversed(list_checkpoints(run_dir)) if any((p / n).is_file() for n in MODEL_FILES)),
                  None)
    if folder is None:
        raise FileNotFoundError(f"{run_dir} holds checkpoints but no final model, and none of them holds weights; "
                                "resume the run with --resume_from_checkpoint latest")
    if not (run_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{run_dir} holds checkpoints but no final model, and no tokenizer: the run reads "
                                "its tokenizer from elsewhere (--tokenizer), which is copied in with the final model. "
                                "Resume the run with --resume_from_checkpoint latest, then explore the finished folder")
    settings = json.loads((folder / RUN_STATE_FILE).read_text())["model_settings"]
    tokenizer = load_tokenizer(run_dir)
    model = build_model(MiniTxConfig(**settings), tokenizer)
    model.config._attn_implementation = "eager"  # the explorer reads attention weights
    weights = next(folder / n for n in MODEL_FILES if (folder / n).is_file())
    load_snapshot(model, Snapshot(label=folder.name, step=None, path=weights), model.state_dict())  # names only
    return model.eval(), tokenizer, int(folder.name.removeprefix(CHECKPOINT_PREFIX))


def check_same_run_id(model_dir: Path, run_dir: Path) -> None:
    """--run must be the run that trained --model: two runs of the same shapes would mix silently. A model folder
    without a run record (a copy, a staged folder) must hold the run's final weights."""
    ids = {name: (read_marker(folder) or {}).get("run_id") for name, folder in (("--model", model_dir),
                                                                                 ("--run", run_dir))}
    if None not in ids.values() and ids["--model"] != ids["--run"]:
        raise ValueError(f"--run {run_dir} is run {ids['--run']}, but --model {model_dir} was trained by run "
                         f"{ids['--model']}; pass the --run that trained the --model (usually the same folder)")
    trained_by = _summary_run_id(model_dir)  # travels with the weights when a model is copied over another
    for checkpoint in list_checkpoints(run_dir):
        saved_by = json.loads((checkpoint / RUN_STATE_FILE).read_text()).get("run_id")
        if trained_by and saved_by and saved_by != trained_by:
            raise ValueError(f"--model {model_dir} was trained by run {trained_by} (its training_summary.json), but "
                             f"{checkpoint} was saved by run {saved_by}: that run's checkpoints are another model's "
                             "history; pass the --run that trained the --model, or leave --run out")
    unrecorded = ids["--model"] is None and model_dir.resolve() != run_dir.resolve()
    if unrecorded and any(run_dir.glob("*.safetensors")) and weights_digest(model_dir) != weights_digest(run_dir):
        raise ValueError(f"--model {model_dir} has no run record, and its weights are not the final model of --run "
                         f"{run_dir}, so that run's checkpoints are another model's history; pass the --run that "
                         "trained the --model, or leave --run out")


def _summary_run_id(model_dir: Path) -> str | None:
    """The run id training_summary.json records (None: none recorded, or a summary of an older version)."""
    return (read_summary(model_dir) or {}).get("run_id")


def load_snapshot(model: Any, snapshot: Snapshot, final_state: dict[str, torch.Tensor]) -> None:
    """Put the snapshot's weights into `model`; a tied tensor may be stored under either of its names."""
    state = final_state if snapshot.path is None else read_weights(snapshot.path)
    fix = "pass the --run that trained the --model"
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as error:  # tensors of other shapes: another model's checkpoint
        detail = " ".join(str(error).split())[:200]
        raise ValueError(f"{snapshot.path} does not match the model in --model ({detail}); {fix}") from None
    missing = [name for name in missing if name in final_state and not _twin_loaded(model, name, set(missing))]
    if missing or unexpected:
        names = ", ".join((missing + unexpected)[:3])
        raise ValueError(f"{snapshot.path} does not match the model in --model ({len(missing)} missing, "
                         f"{len(unexpected)} unexpected tensors, e.g. {names}); {fix}")
    if snapshot.path is not None:
        check_finite_weights(model, snapshot.path)


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's model tensors (accelerate writes model.safetensors or pytorch_model.bin); a damaged
    file is named."""
    try:
        if path.suffix == ".safetensors":
            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001  safetensors, pickle and zip each raise their own kinds
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{path} cannot be read ({detail}); delete that checkpoint or pass another --run") from None


def _twin_loaded(model: Any, name: str, missing: set[str]) -> bool:
    """Whether a parameter sharing its storage with `name` (tied embeddings) was loaded."""
    params = dict(model.named_parameters(remove_duplicate=False))
    if name not in params:
        return False
    pointer = params[name].data_ptr()
    return any(p.data_ptr() == pointer and other not in missing for other, p in params.items() if other != name)


def quantize(weights: torch.Tensor) -> dict[str, Any]:
    """Attention weights in [0, 1] as uint8 (x 255) in base64, with their shape (layers, heads, q, k)."""
    array = np.rint(weights.float().clamp(0, 1).numpy() * 255).astype(np.uint8)
    return {"shape": list(array.shape), "data": base64.b64encode(array.tobytes()).decode("ascii")}


def _stacked(per_layer: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.stack([weights[0] for weights in per_layer])  # (layers, heads, q, k)


def top_tokens(logits: torch.Tensor, k: int) -> list[list[list[float]]]:
    """(positions, vocab) logits -> per position, [[id, probability], ...] of the k most likely tokens, each to 3
    significant digits (an early checkpoint's are all under 0.001)."""
    probs = torch.softmax(logits.float(), dim=-1)
    values, ids = probs.topk(min(k, probs.shape[-1]), dim=-1)  # (positions, k)
    return [[[int(i), float(f"{p:.3g}")] for i, p in zip(row_ids, row_p, strict=True)]
            for row_ids, row_p in zip(ids.tolist(), values.tolist(), strict=True)]


def logit_lens(model: Any, hidden_states: Sequence[torch.Tensor]) -> list[list[list[list[float]]]]:
    """Each layer's residual stream (embeddings first) read through the final norm and the head.

    The last hidden state already went through the final norm (pre-LN), so it is read by the head alone;
    post-LN stacks have no final norm. Returns [layer][position] -> top tokens as in `top_tokens`.
    """
    norm, head = model.model.decoder.norm, model.get_output_embeddings()
    lens = []
    for index, hidden in enumerate(hidden_states):  # each (1, positions, hidden)
        last = index == len(hidden_states) - 1
        read = hidden if norm is None or last else norm(hidden)
        lens.append(top_tokens(head(read)[0], LENS_TOP))
    return lens


@torch.no_grad()
def look(model: Any, inputs: Inputs, k: int) -> dict[str, Any]:
    """One forward pass: attention maps (quantized), top-k next tokens and the logit lens."""
    flags = {"output_attentions": True, "output_hidden_states": True, "use_cache": False}
    if inputs.source is None:
        out = model(input_ids=torch.tensor([inputs.ids]), **flags)
        attention = {"self": quantize(_stacked(out.attentions))}
        hidden = out.hidden_states
    else:
        out = model(input_ids=torch.tensor([inputs.source]), decoder_input_ids=torch.tensor([inputs.ids]), **flags)
        attention = {"encoder": quantize(_stacked(out.encoder_attentions)),
                     "decoder": quantize(_stacked(out.decoder_attentions)),
                     "cross": quantize(_stacked(out.cross_attentions))}
        hidden = out.decoder_hidden_states
    return {"attention": attention, "top": top_tokens(out.logits[0], k), "lens": logit_lens(model, hidden)}


# --- the model -------------------------------------------------------------------------------------


def position_curves(model: Any) -> dict[str, Any]:
    """A few dimensions of the position table (sinusoidal or learned) or rotary pairs, over positions."""
    config = model.config
    length = min(CURVE_POSITIONS, config.max_position_embeddings)
    stack = model.model.encoder if config.is_encoder_decoder else model.model.decoder
    if not config.position_table:  # rotary: angles, not vectors
        inv_freq = rope_inverse_frequencies(config.head_dim, config.rope_theta)
        pairs = spread(range(len(inv_freq)), CURVE_DIMS)
        angles = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[pairs]  # (positions, pairs)
        return {"kind": "rope", "title": "rotary: cos(position x frequency) of a few channel pairs",
                "labels": [f"pair {p}" for p in pairs], "values": _rounded(torch.cos(angles).T)}
    table = getattr(stack, stack.positions_attribute).weight.detach()[:length].float()  # (positions, hidden)
    dims = spread(range(config.hidden_size), CURVE_DIMS)
    return {"kind": config.position_embedding_type,
            "title": f"{config.position_embedding_type} position vectors: a few dimensions",
            "labels": [f"dim {d}" for d in dims], "values": _rounded(table[:, dims].T)}


def _rounded(values: torch.Tensor) -> list[list[float]]:
    return [[round(float(v), 3) for v in row] for row in values.tolist()]


def model_info(model: Any, model_dir: Path, weights_dir: Path) -> dict[str, Any]:
    """Config fields, parameters per component and the positional-encoding curves; ``weights_dir`` holds the
    weights shown (the model folder, or an interrupted run's latest checkpoint), whose digest names them."""
    config = model.config.to_diff_dict()
    shown = {k: v for k, v in sorted(config.items()) if isinstance(v, (int, float, str, bool)) or v is None}
    return {"name": model_dir.resolve().name, "weights": weights_digest(weights_dir), "config": shown,
            "parameters": parameter_counts(model),
            "total_parameters": model.num_parameters(), "positions": position_curves(model)}


def loss_curve(run: str | None) -> dict[str, list] | None:
    """Train and validation loss of the run (metrics.jsonl), None without a run or a metrics file."""
    if run is None or not (Path(run) / METRICS_FILE).is_file():
        return None
    metrics = read_metrics(run)

    def pairs(steps: np.ndarray, values: np.ndarray) -> list[list[float]]:
        return [[int(s), round(float(v), 4)] for s, v in zip(steps, values, strict=True) if np.isfinite(v)]

    return {"train": pairs(metrics["train_step"], metrics["train_loss"]),
            "eval": pairs(metrics["eval_step"], metrics["eval_loss"])}


def vocabulary(ids: set[int], tokenizer: Any | None, config: Any) -> dict[str, str]:
    """The text of every token id the page shows (special tokens by name)."""
    special = special_names(config)
    if tokenizer is None:
        return {str(i): special.get(i, str(i)) for i in sorted(ids)}
    return {str(i): special.get(i) or token_text(i, tokenizer) for i in sorted(ids)}


def _ids_shown(inputs: Inputs, views: Sequence[dict[str, Any]]) -> set[int]:
    ids = set(inputs.ids) | set(inputs.source or ())
    for view in views:
        ids |= {int(i) for position in view["top"] for i, _ in position}
        ids |= {int(i) for layer in view["lens"] for position in layer for i, _ in position}
    return ids


# --- the page --------------------------------------------------------------------------------------


MAX_TOP_K = 50  # candidates a position's panel lists: more are not read, and a long text's page grows by megabytes


def explore_data(model_dir: str | Path, text: str, *, target: str | None = None, run: str | None = None,
                 top_k: int = 5, max_checkpoints: int = 12) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data (each check done before any forward pass)."""
    if not 1 <= top_k <= MAX_TOP_K:
        raise ValueError(f"--top_k must be from 1 to {MAX_TOP_K} (the page keeps that many candidates for every "
                         f"position of every checkpoint), got {top_k}")
    model_dir = Path(model_dir)
    if is_interrupted_run(model_dir):
        model, tokenizer, latest = latest_checkpoint_model(model_dir)
    else:
        model, tokenizer = load_model_folder(model_dir, device="cpu", dtype=torch.float32,
                                             attn_implementation="eager", need_tokenizer=False)
        latest = None
    inputs = encode_inputs(model, tokenizer, text, target)
    snapshots = find_snapshots(model_dir, run, max_checkpoints, latest)
    curve = loss_curve(run)
    final_state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    views = []
    for snapshot in snapshots:
        load_snapshot(model, snapshot, final_state)
        views.append({"label": snapshot.label, "step": snapshot.step, **look(model, inputs, top_k)})
    load_snapshot(model, next(s for s in snapshots if s.path is None), final_state)  # the final one again
    config = model.config
    weights_dir = model_dir if latest is None else model_dir / f"{CHECKPOINT_PREFIX}{latest}"  # what is shown
    return {
        "kind": model_kind(config),
        "text": text, "target": target,
        "tokens": inputs.ids, "source": inputs.source,
        "vocab": vocabulary(_ids_shown(inputs, views), tokenizer, config),
        "snapshots": views, "loss": curve, "model": model_info(model, model_dir, weights_dir),
    }


def render_page(data: dict[str, Any]) -> str:
    """The HTML page: the template with the data inlined as JSON.

    ``<``, ``>`` and ``&`` are written as JSON escapes, so no text (``</script>``, ``<!--<script>``) can end
    or reshape the data block; the placeholders are filled in one pass, so a text naming one stays text.
    """
    template = resources.files("hf_minitx.tools").joinpath("explorer.html").read_text(encoding="utf-8")
    try:  # a bare NaN would make the data block invalid JSON and the page blank
        payload = json.dumps(data, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except ValueError:
        raise ValueError(NON_FINITE_OUTPUTS.format(on=" on this text", so=", which the page cannot show")) from None
    for char in "<>&":
        payload = payload.replace(char, f"\\u{ord(char):04x}")  # only inside JSON strings: same value
    parts = {"GENERATOR": HTML_TAG, "TITLE": html.escape(f"{data['model']['name']}: {data['text'][:60]}"),
             "DATA": payload}
    return re.sub(r"__(GENERATOR|TITLE|DATA)__", lambda match: parts[match.group(1)], template)


def write_explorer(model_dir: str | Path, text: str, out: str | Path, **options: Any) -> Path:
    """Compute the data and write the page atomically; returns the path. `options`: see `explore_data`."""
    page = render_page(explore_data(model_dir, text, **options))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    return write_file(Path(out), lambda tmp: tmp.write_text(page, encoding="utf-8"))


def main(argv: Sequence[str] | None = None) -> Path:
    """`minitx explore --model DIR [--run DIR] --text "..." [--target "..."] --out explore.html`."""
    from ..cli import parse_arguments

    (args,) = parse_arguments([ExploreArguments], argv, prog="minitx explore", description=__doc__.split("\n\n")[0])
    if not args.out.lower().endswith((".html", ".htm")):
        raise ValueError(f"--out must name an .html file, got {args.out}")
    out = check_output_file(args.out, overwrite=args.overwrite, option="--out", is_ours=html_written_by_us)
    with holding_lock(out, command="explore", option="--out", single_file=True):  # one writer, to the end
        path = write_explorer(args.model, args.text, out, target=args.target, run=args.run, top_k=args.top_k,
                              max_checkpoints=args.max_checkpoints)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return path


__all__ = ["ExploreArguments", "explore_data", "render_page", "write_explorer"]
