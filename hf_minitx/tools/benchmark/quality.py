"""Quality at equal wall time, as users get it: ``minitx train --max_minutes T`` against GPT-2 trained the nanoGPT way.

For each corpus (its first ``max_chars`` characters: the first 90% is the training text, the rest validation):

1. one tokenizer for both sides, made by ``minitx train-tokenizer`` on the training text (the vocabulary size
   ``minitx train`` trains by default), so that the ratio measures the recipe, not the tokenizer;
2. **ours**: ``minitx train --max_minutes T`` with the default recipe, as users type it: the budget plans the
   shape (and, past the passes one model learns from, a teacher and a student: docs/training.md); with
   ``shared_shape``, at the reference's width and depth instead. In its own process, alone on the machine, on
   every core (``threads``); it checkpoints at each tenth of its planned steps for the curve, and keeps both
   models of a run in two phases (``--keep_phases``) to score each and their averaged pair;
3. **the reference**: transformers' ``GPT2LMHeadModel`` at ``layers`` x ``hidden`` in a plain PyTorch loop, in its
   own process, alone, on the same threads, for T seconds, with nanoGPT's published CPU recipe: batch 12, AdamW
   lr 1e-3 with betas (0.9, 0.99), weight decay 0.1 on every tensor of 2+ dimensions, clipping 1.0, dropout 0,
   100 warmup iterations, cosine decay to 1e-4 over 2000 iterations or as many as fit (nanoGPT's advice:
   ``lr_decay_iters ~= max_iters``), on nanoGPT's random windows of the same tokens; it keeps a copy of its
   weights at each tenth of T for the curve;
4. **one scorer** for both: every validation token with up to ``block - 1`` tokens of context (sliding windows,
   stride half the block), total bits over the UTF-8 bytes of the validation text (the first token costs
   log2(vocab) bits). The curve scores each side's snapshots on the first ``curve_tokens`` validation tokens.

The side that goes first alternates from corpus to corpus; the load average is recorded at each side's start.
"""

from __future__ import annotations

import copy
import json
import math
import multiprocessing
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from ...folders import SUMMARY_FILE, read_summary, write_file
from ...training.outputs import tokens_per_second
from ...training.phases import FOLDERS_KEPT, STUDENT_DIR, TEACHER_DIR
from .quality_settings import (
    CURVE_POINTS,
    QualitySettings,
    claim_work_dir,
    corpus_text,
    our_arguments,
    our_data_arguments,
)

SIDES = ("ours", "reference")
NANOGPT = {"batch": 12, "learning_rate": 1e-3, "betas": (0.9, 0.99), "weight_decay": 0.1, "max_grad_norm": 1.0,
           "warmup": 100, "decay_iters": 2000, "min_lr": 1e-4}  # nanoGPT's CPU (shakespeare_char) optimiser settings


# --- data and the scorer ---------------------------------------------------------------------------


def write_splits(text: str, folder: Path) -> tuple[str, str]:
    """train.txt (the first 90%) and validation.txt (the rest) in ``folder``; returns both texts."""
    cut = int(len(text) * 0.9)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.txt").write_text(text[:cut], encoding="utf-8")
    (folder / "validation.txt").write_text(text[cut:], encoding="utf-8")
    return text[:cut], text[cut:]


def bits_per_byte(total_bits: float, num_bytes: int) -> float:
    """Bits per byte of a text of ``num_bytes`` UTF-8 bytes scored ``total_bits``: independent of the tokenizer."""
    return total_bits / num_bytes


@torch.no_grad()
def score_bits(model: nn.Module, ids: list[int], context: int, vocab_size: int) -> float:
    """Total bits of ``ids`` under ``model``: log2(vocab) for the first token, then each token given up to
    ``context - 1`` earlier ones, in windows of ``context`` tokens that advance by half of it."""
    model.eval()
    stride, bits, start = context // 2, math.log2(vocab_size), 0
    while True:
        end = min(start + context, len(ids))
        window = torch.tensor([ids[start:end]])  # (1, window)
        logp = torch.log_softmax(model(input_ids=window).logits[0, :-1].float(), dim=-1)  # (window - 1, vocab)
        first = 0 if start == 0 else context - stride - 1  # the tokens the previous window did not score
        bits -= logp[first:].gather(1, window[0, 1:][first:, None]).sum().item() / math.log(2)
        if end == len(ids):
            return bits
        start += stride


# --- the two sides, each in its own process ---------------------------------------------------------


def run_ours(settings: QualitySettings, data: Path, tokenizer: Path, out: Path) -> dict[str, Any]:
    """`minitx train --max_minutes T` in a subprocess; returns its training summary (the run is in ``out``)."""
    command = [sys.executable, "-m", "hf_minitx", "train", *our_arguments(settings, data, tokenizer, out)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise ValueError(child_error("our side's `minitx train`", done))
    return json.loads((out / SUMMARY_FILE).read_text())


def child_error(what: str, done: subprocess.CompletedProcess) -> str:
    """One line for a step of the comparison that failed: the child's own ``error:`` line (its advice to resume
    cut: the comparison's runs are its own, and it measures a run whole), and what to change."""
    lines = (done.stdout + done.stderr).strip().splitlines()
    said = next((line.removeprefix("error: ") for line in reversed(lines) if line.startswith("error: ")),
                " | ".join(line.strip() for line in lines[-3:]) or "no output")  # a crash: the end of its traceback
    fix = ""
    if "ran out after" in said:  # the budget was too short to plan the run: its advice is for a run of one's own
        shortest = re.search(r"--max_minutes ([0-9.]+) \(the probe", said)
        said = said.split("; ", 1)[0]
        fix = (f"give --quality_seconds {math.ceil(float(shortest.group(1)) * 60)} or more" if shortest else
               "give a longer --quality_seconds")
    return f"{what} failed (exit {done.returncode}): {said}" + (f"; {fix}" if fix else "")


def nanogpt_lr(iteration: int, decay_iters: int) -> float:
    """nanoGPT's learning rate: linear warmup, cosine to min_lr over ``decay_iters`` iterations, then held."""
    peak, low, warmup = NANOGPT["learning_rate"], NANOGPT["min_lr"], NANOGPT["warmup"]
    if iteration < warmup:
        return peak * (iteration + 1) / (warmup + 1)
    progress = min(1.0, (iteration - warmup) / max(1, decay_iters - warmup))
    return low + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - low)


def reference_model(settings: QualitySettings, vocab_size: int, block: int, special_ids: dict[str, int]) -> nn.Module:
    """GPT2LMHeadModel at ``layers`` x ``hidden``, ``heads`` heads, dropout 0."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab_size, n_positions=block, n_embd=settings.hidden, n_layer=settings.layers,
                        n_head=settings.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **special_ids)
    return GPT2LMHeadModel(config)


def nanogpt_optimizer(model: nn.Module) -> torch.optim.AdamW:
    """AdamW with weight decay on every tensor of 2 or more dimensions, none on the others."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": NANOGPT["weight_decay"]},
                              {"params": others, "weight_decay": 0.0}], lr=NANOGPT["learning_rate"],
                             betas=NANOGPT["betas"])


def train_reference(settings: QualitySettings, tokenizer_dir: str, train_text: str, block: int,
                    seconds: float) -> dict[str, Any]:
    """nanoGPT's loop for ``seconds``: returns the model, its figures and a snapshot at each tenth of the time."""
    from transformers import AutoTokenizer

    torch.set_num_threads(settings.num_threads)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tokenizer(train_text, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"]
    tokens = torch.tensor(ids)  # (n,)
    torch.manual_seed(settings.seed)
    model = reference_model(settings, len(tokenizer), block, {"bos_token_id": tokenizer.bos_token_id,
                                                              "eos_token_id": tokenizer.eos_token_id})
    optimizer = nanogpt_optimizer(model)
    windows = torch.Generator().manual_seed(1337)
    decay_iters, iteration, snapshots, start = NANOGPT["decay_iters"], 0, [], time.perf_counter()
    model.train()
    while (elapsed := time.perf_counter() - start) < seconds:
        if len(snapshots) < CURVE_POINTS - 1 and elapsed >= seconds * (len(snapshots) + 1) / CURVE_POINTS:
            snapshots.append({"seconds": elapsed, "step": iteration, "weights": copy.deepcopy(model.state_dict())})
        if iteration == 50:  # nanoGPT's advice, lr_decay_iters ~= max_iters: as many as fit, never fewer than 2000
            decay_iters = max(NANOGPT["decay_iters"], int(seconds / (elapsed / 50)))
        for group in optimizer.param_groups:
            group["lr"] = nanogpt_lr(iteration, decay_iters)
        starts = torch.randint(len(tokens) - block - 1, (NANOGPT["batch"],), generator=windows)
        x = torch.stack([tokens[i:i + block] for i in starts])  # (batch, block)
        y = torch.stack([tokens[i + 1:i + block + 1] for i in starts])  # (batch, block)
        logits = model(input_ids=x).logits  # (batch, block, vocab)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), NANOGPT["max_grad_norm"])
        optimizer.step()
        iteration += 1
    train_seconds = time.perf_counter() - start
    snapshots.append({"seconds": train_seconds, "step": iteration, "weights": copy.deepcopy(model.state_dict())})
    return {"model": model, "steps": iteration, "train_seconds": train_seconds, "decay_iters": decay_iters,
            "tokens_seen": iteration * NANOGPT["batch"] * block, "snapshots": snapshots}


def reference_side(job: tuple[QualitySettings, str, str, str, int]) -> dict[str, Any]:
    """The reference in its own process: trained for ``seconds``, then scored (the whole text and the curve)."""
    settings, tokenizer_dir, train_text, validation_text, block = job
    from transformers import AutoTokenizer

    trained = train_reference(settings, tokenizer_dir, train_text, block, settings.seconds)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tokenizer(validation_text, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"]
    model = trained["model"]
    curve = score_curve(model, [(s["seconds"], s["step"], s["weights"]) for s in trained["snapshots"]], tokenizer,
                        ids, block, settings)  # the last snapshot is the trained model
    figures = side_figures(model, ids, block, len(tokenizer), validation_text, trained["steps"],
                           trained["tokens_seen"], trained["train_seconds"])
    return {**figures, "curve": curve, "recipe": {"optimizer": "adamw (nanoGPT)", **NANOGPT,
                                                  "decay_iters": trained["decay_iters"], "block_size": block}}


def side_figures(model: nn.Module, ids: list[int], block: int, vocab: int, validation_text: str, steps: int,
                 tokens_seen: int, train_seconds: float) -> dict[str, Any]:
    """One side's figures: bits per byte of the whole validation text, steps, tokens and their rate."""
    bits = score_bits(model, ids, block, vocab)
    return {"bits_per_byte": bits_per_byte(bits, len(validation_text.encode("utf-8"))), "steps": steps,
            "tokens_seen": tokens_seen, "train_seconds": round(train_seconds, 2),
            "tokens_per_second": tokens_per_second(tokens_seen, train_seconds),
            "num_parameters": sum(p.numel() for p in model.parameters())}  # the reference is no PreTrainedModel


def score_curve(model: nn.Module, snapshots: list[tuple[float, int, dict[str, torch.Tensor]]], tokenizer: Any,
                ids: list[int], block: int, settings: QualitySettings) -> list[dict[str, float]]:
    """(seconds, step, bits per byte) of each (seconds, step, weights) snapshot on the first ``curve_tokens``
    validation tokens; ``model`` ends with the last snapshot's weights."""
    subset = ids[: settings.curve_tokens]
    num_bytes = len(tokenizer.decode(subset).encode("utf-8"))  # a byte-level BPE decodes to the text itself
    points = []
    for seconds, step, weights in snapshots:
        model.load_state_dict(weights, strict=False)  # strict=False: a tied head is stored once
        points.append({"seconds": round(seconds, 2), "step": step,
                       "bits_per_byte": bits_per_byte(score_bits(model, subset, block, len(tokenizer)), num_bytes)})
    return points


def score_ours(settings: QualitySettings, out: Path, validation_text: str, summary: dict[str, Any]) -> dict[str, Any]:
    """Our saved model and its checkpoints, scored like the reference; a run in two phases: each model and their
    averaged pair too, the curve through the teacher's checkpoints and model, then the student's checkpoints."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(settings.num_threads)
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    block, vocab = summary["recipe"]["block_size"], len(tokenizer)
    ids = tokenizer(validation_text, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"]
    figures = side_figures(model, ids, block, vocab, validation_text, summary["steps"], summary["tokens_seen"],
                           summary["train_seconds"])
    folders, phases = phase_folders(out, summary), None
    if folders:
        members = [AutoModelForCausalLM.from_pretrained(folder) for folder in folders]
        phases = score_phases(members, ids, block, vocab, validation_text, summary)
        teacher = read_summary(folders[0])
        snapshots = [*checkpoint_snapshots(folders[0]),
                     (teacher["train_seconds"], teacher["steps"], members[0].state_dict()),
                     *checkpoint_snapshots(folders[1], offset=teacher["train_seconds"])]
    else:
        snapshots = checkpoint_snapshots(out)
    # the model users get: a copy, as score_curve loads each snapshot into ``model`` itself
    snapshots.append((summary["train_seconds"], summary["steps"], copy.deepcopy(model.state_dict())))
    curve = score_curve(model, snapshots, tokenizer, ids, block, settings)
    return {**figures, "curve": curve, "time_budget": summary.get("time_budget"), "epochs": summary.get("epochs"),
            "recipe": summary.get("recipe"), **({"phases": phases} if phases else {})}


def phase_folders(out: Path, summary: dict[str, Any]) -> list[Path]:
    """The teacher's and the student's folders a run in two phases kept (--keep_phases); [] for one model."""
    split = summary.get("phases") or {}
    folders = [out / TEACHER_DIR, out / STUDENT_DIR]
    return folders if split.get(FOLDERS_KEPT) and all(folder.is_dir() for folder in folders) else []


def checkpoint_snapshots(folder: Path, offset: float = 0.0) -> list[tuple[float, int, dict[str, torch.Tensor]]]:
    """(training seconds + ``offset``, step, weights) of a run's checkpoints, but the one of its final step."""
    from ...training.checkpoints import list_checkpoints
    from ..explore import find_snapshots, read_weights

    if not list_checkpoints(folder):
        return []
    return [(offset + json.loads((snap.path.parent / "run_state.json").read_text())["train_seconds"], snap.step,
             read_weights(snap.path)) for snap in find_snapshots(folder, str(folder), CURVE_POINTS + 1) if snap.path]


class AveragedModels(nn.Module):
    """Models' next-token probabilities averaged: logits log(mean_k p_k), already normalised."""

    def __init__(self, *members: nn.Module) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, input_ids: torch.Tensor) -> Any:
        logp = torch.stack([torch.log_softmax(member(input_ids=input_ids).logits.float(), dim=-1)
                            for member in self.members])  # (members, batch, seq, vocab)
        return SimpleNamespace(logits=torch.logsumexp(logp, dim=0) - math.log(len(self.members)))


def score_phases(members: list[nn.Module], ids: list[int], block: int, vocab: int, validation_text: str,
                 summary: dict[str, Any]) -> dict[str, Any]:
    """Bits per byte of the teacher, the student and their averaged pair on the whole validation text (the pair
    is not what users take home: two models at inference, no single export)."""
    num_bytes = len(validation_text.encode("utf-8"))
    split = summary["phases"]
    figures = {name: bits_per_byte(score_bits(member, ids, block, vocab), num_bytes)
               for name, member in zip((TEACHER_DIR, STUDENT_DIR), members, strict=True)}
    pair = bits_per_byte(score_bits(AveragedModels(*members), ids, block, vocab), num_bytes)
    return {**figures, "averaged_pair": pair, "model_kept": split["model_kept"],
            "passes_of_one_model": split.get("passes_of_one_model"),
            "steps": {name: (split.get(name) or {}).get("steps") for name in (TEACHER_DIR, STUDENT_DIR)}}


# --- one corpus, every corpus ------------------------------------------------------------------------


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (empty where the system does not say)."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def run_corpus(settings: QualitySettings, corpus: str, work: Path, first: str, log=print) -> dict[str, Any]:
    """Both sides on one corpus, ``first`` going first; the ratio ours / reference. A side whose figures an
    interrupted comparison kept in ``work`` is not measured again; a side it did not finish starts again."""
    data_args = our_data_arguments(settings)
    text = corpus_text(corpus, settings.max_chars)
    check_kept_text(work, corpus, text)
    train_text, validation_text = write_splits(text, work / "data")
    tokenizer_dir = work / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        shutil.rmtree(tokenizer_dir, ignore_errors=True)
        done = subprocess.run([sys.executable, "-m", "hf_minitx", "train-tokenizer", "--dataset", str(work / "data"),
                               "--vocab_size", str(data_args.tokenizer_vocab_size), "--output_dir", str(tokenizer_dir)],
                              capture_output=True, text=True)
        if done.returncode:
            raise ValueError(child_error(f"the shared tokenizer of {corpus} (`minitx train-tokenizer`)", done))
    block = data_args.block_size
    result: dict[str, Any] = {"first": first, "validation_bytes": len(validation_text.encode("utf-8"))}
    for side in (SIDES if first == "ours" else SIDES[::-1]):
        kept = work / f"{side}.json"
        if kept.is_file():
            log(f"[quality] {corpus}: {side}, measured by the interrupted comparison, kept")
            result[side] = json.loads(kept.read_text())
            continue
        log(f"[quality] {corpus}: {side}, {settings.seconds:g} s on {settings.num_threads} threads ...")
        load = load_average()
        if side == "ours":
            shutil.rmtree(work / "ours", ignore_errors=True)  # a run an interruption cut short: measured anew
            summary = run_ours(settings, work / "data", tokenizer_dir, work / "ours")
            result["ours"] = {**score_ours(settings, work / "ours", validation_text, summary), "load_average": load}
        else:
            with multiprocessing.get_context("spawn").Pool(1) as pool:  # a fresh interpreter, alone
                figures = pool.apply(reference_side, ((settings, str(tokenizer_dir), train_text, validation_text,
                                                       block),))
            result["reference"] = {**figures, "load_average": load}
        write_file(kept, lambda tmp, side=side: tmp.write_text(json.dumps(result[side])))
    result["ratio"] = result["ours"]["bits_per_byte"] / result["reference"]["bits_per_byte"]
    if "phases" in result["ours"]:  # a run in two phases: the averaged pair's ratio beside the kept model's
        result["pair_ratio"] = result["ours"]["phases"]["averaged_pair"] / result["reference"]["bits_per_byte"]
    return result


def check_kept_text(work: Path, corpus: str, text: str) -> None:
    """Figures an interrupted comparison kept in ``work`` belong to the text it cut: a corpus edited since
    cannot finish that comparison."""
    if not any((work / f"{side}.json").is_file() for side in SIDES):
        return
    kept = "".join((work / "data" / name).read_text(encoding="utf-8") for name in ("train.txt", "validation.txt"))
    if kept != text:
        raise ValueError(f"--quality_corpora {corpus} changed since the interrupted comparison in {work.parent} "
                         "measured it; give another --quality_work_dir to measure the new text")


def run_quality(settings: QualitySettings, log=print, work: Path | None = None) -> dict[str, Any]:
    """Every corpus, the first side alternating; the results as a JSON-ready dict. In ``work``
    (--quality_work_dir) each finished side's figures are kept, so that the same command after an interruption
    measures only the rest; without it, a temporary folder that goes with the run."""
    settings.check()
    results: dict[str, Any] = {"settings": {**asdict(settings), "num_threads": settings.num_threads}, "corpora": {}}
    with tempfile.TemporaryDirectory(prefix="minitx-quality-") as scratch:
        if work is not None:
            claim_work_dir(work, settings)
        for index, corpus in enumerate(settings.corpora):
            folder = (work or Path(scratch)) / f"corpus{index}"
            results["corpora"][corpus] = run_corpus(settings, corpus, folder, SIDES[index % 2], log=log)
    return results


