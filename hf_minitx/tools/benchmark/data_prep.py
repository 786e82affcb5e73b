"""Data-preparation benchmark: raw ``.txt`` files to packed training blocks, hf_minitx against the usual
``run_clm`` recipe read two ways, on the same files with the same tokenizer, in the same run.

- ``minitx``: ``load_corpus`` (files are documents in ~1 MB rows, validation carved as in training) then
  ``tokenize_and_pack`` (batched tokenization on every core, ids in the smallest dtype, one cached packed
  copy, labels derived by the collator).
- ``run_clm-lines`` and ``run_clm-paragraphs``: datasets' ``text`` builder with a row per line (line breaks
  kept, as run_clm reads text) or per paragraph (``sample_by="paragraph"``), ``map(tokenizer,
  batched=True, num_proc=cores)``, then a batched ``map`` that concatenates, cuts blocks and stores
  ``labels`` (``group_texts``).

Each side runs in a fresh subprocess with its own empty datasets cache folder; reported are text MB/s
(text bytes over the seconds from raw files to packed blocks, imports excluded), the CPU seconds of the side
and its pool workers (less sensitive to other load on the machine than the wall time), the tokens in blocks
and the bytes the cache holds afterwards per text byte. Sides rotate order round by round. The speed-up
is taken against the faster baseline of each round.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SIDES = ("minitx", "run_clm-lines", "run_clm-paragraphs")
BASELINES = SIDES[1:]
LABELS = {"minitx": "hf_minitx", "run_clm-lines": "run_clm, a row per line",
          "run_clm-paragraphs": "run_clm, a row per paragraph"}


def write_text_corpus(folder: Path, megabytes: float, files: int = 4, seed: int = 0) -> list[Path]:
    """``files`` text files of ``megabytes`` MB in all: lines of Zipf-distributed made-up words, blank
    lines between paragraphs. Returns their paths."""
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "de", "an", "ve", "or", "ul", "eb", "zi"]
    words = np.array(sorted({"".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(20000)}))
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    per_file = int(megabytes * 1e6 / files)
    draw = max(1000, min(50_000, per_file // 70))  # words a draw (7 bytes each): at least ten draws a file
    for index in range(files):
        path, size = folder / f"part{index}.txt", 0
        with open(path, "w", encoding="utf-8") as handle:
            while size < per_file:
                picks = words[rng.choice(len(words), size=draw, p=weights)]
                lengths = rng.integers(6, 18, size=len(picks) // 6)
                lines, start = [], 0
                for n in lengths:
                    lines.append(" ".join(picks[start : start + n]).capitalize() + ".")
                    start += n
                    if rng.random() < 0.15:
                        lines.append("")
                chunk = "\n".join(lines) + "\n"
                handle.write(chunk)
                size += len(chunk)
        paths.append(path)
    return paths


def prepare_minitx(files: list[str], tokenizer_dir: str, block_size: int) -> int:
    """hf_minitx's preparation; returns the number of packed training rows."""
    from ...data import load_corpus, load_tokenizer, tokenize_and_pack

    tokenizer = load_tokenizer(tokenizer_dir)
    packed = tokenize_and_pack(load_corpus(",".join(files)), tokenizer, block_size)
    return sum(len(split) for split in packed.values())


def _group_blocks(batch: dict[str, list], block_size: int) -> dict[str, list]:
    """run_clm's group_texts: join the batch's lists per column, cut equal blocks, copy ids to labels."""
    joined = {key: list(itertools.chain.from_iterable(values)) for key, values in batch.items()}
    usable = len(joined["input_ids"]) // block_size * block_size
    blocks = {key: [values[i : i + block_size] for i in range(0, usable, block_size)] for key, values in joined.items()}
    blocks["labels"] = [list(ids) for ids in blocks["input_ids"]]
    return blocks


def prepare_run_clm(files: list[str], tokenizer_dir: str, block_size: int, sample_by: str = "line") -> int:
    """The recipe most scripts copy: the ``text`` builder's rows (``sample_by`` ``line``, line breaks kept, or
    ``paragraph``), tokenize with map, group with map. Returns the number of blocks."""
    import datasets

    from ...data import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    procs = os.cpu_count() or 1
    raw = datasets.load_dataset("text", data_files={"train": files}, sample_by=sample_by, keep_linebreaks=True)
    tokenized = raw.map(lambda batch: tokenizer(batch["text"]), batched=True, num_proc=procs, remove_columns=["text"])
    grouped = tokenized.map(_group_blocks, batched=True, num_proc=procs, fn_kwargs={"block_size": block_size})
    return sum(len(split) for split in grouped.values())


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def measure_side(side: str, files: list[str], tokenizer_dir: str, block_size: int) -> dict:
    """Run one side in a fresh subprocess with an empty datasets cache; its seconds and cache bytes."""
    cache = Path(tempfile.mkdtemp(prefix=f"prep-{side}-"))
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "hf_minitx.tools.benchmark.data_prep", "--side", side,
               "--block_size", str(block_size), "--tokenizer", tokenizer_dir, *files]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"data-preparation side {side} failed:\n{done.stderr[-3000:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        figures["cache_bytes"] = _folder_bytes(cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return figures


def run_data_prep(*, megabytes: float = 100.0, files: list[str] | None = None, rounds: int = 1, block_size: int = 256,
                  vocab_size: int = 8192, log=print) -> dict:
    """Every side on the same text and tokenizer; MB/s, tokens and cache/text ratios per side, and the
    speed-up of minitx over the faster baseline, paired round by round."""
    from ...data import train_bpe_tokenizer

    work, trained = Path(tempfile.mkdtemp(prefix="data-prep-")), vocab_size
    try:
        paths = [Path(f) for f in files] if files else write_text_corpus(work / "text", megabytes)
        text_bytes = sum(p.stat().st_size for p in paths)
        with open(paths[0], encoding="utf-8") as handle:
            sample = handle.read(2_000_000)
        tokenizer = train_bpe_tokenizer(sample.splitlines(keepends=True), vocab_size=vocab_size)
        tokenizer.save_pretrained(work / "tokenizer")
        trained = len(tokenizer)  # a small text holds fewer merges than asked
        raw: dict[str, list[dict]] = {side: [] for side in SIDES}
        for round_index in range(rounds):
            shift = round_index % len(SIDES)
            for side in SIDES[shift:] + SIDES[:shift]:
                log(f"[benchmark] data preparation: {side}, round {round_index + 1}/{rounds} ...")
                raw[side].append(measure_side(side, [str(p) for p in paths], str(work / "tokenizer"), block_size))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sides = {}
    for side, runs in raw.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        sides[side] = {"seconds": seconds, "text_mb_per_second": text_bytes / 1e6 / seconds,
                       "cpu_seconds": statistics.median(r["cpu_seconds"] for r in runs),
                       "cache_bytes_per_text_byte": statistics.median(r["cache_bytes"] for r in runs) / text_bytes,
                       "rows": runs[0]["rows"], "tokens": runs[0]["rows"] * block_size}
    speedups = {side: [b["seconds"] / a["seconds"] for a, b in zip(raw["minitx"], raw[side], strict=True)]
                for side in BASELINES}
    stronger = [min(per_round) for per_round in zip(*speedups.values(), strict=True)]
    return {"text_bytes": text_bytes, "files": len(paths), "block_size": block_size, "vocab_size": trained,
            "cores": os.cpu_count(), "sides": sides,
            "speedup_vs": {side: statistics.median(values) for side, values in speedups.items()},
            "speedup_vs_stronger_baseline": statistics.median(stronger)}


def format_data_prep(result: dict) -> str:
    """A Markdown table of the data-preparation figures."""
    lines = [f"data preparation: {result['text_bytes'] / 1e6:.3g} MB of text in {result['files']} .txt files, "
             f"block {result['block_size']}, vocab {result['vocab_size']}, {result['cores']} cores", "",
             "| preparation | seconds | CPU seconds | text MB/s | tokens in blocks | cache bytes / text byte |",
             "|---|---:|---:|---:|---:|---:|"]
    for side, figures in result["sides"].items():
        lines.append(f"| {LABELS[side]} | {figures['seconds']:.1f} | {figures['cpu_seconds']:.1f} | "
                     f"{figures['text_mb_per_second']:.2f} | {figures['tokens']:,} | "
                     f"{figures['cache_bytes_per_text_byte']:.2f} |")
    for side, speedup in result["speedup_vs"].items():
        lines.append(f"| speed-up of hf_minitx over {LABELS[side]} | {speedup:.2f}x | | | | |")
    lines.append(f"| speed-up over the faster baseline | {result['speedup_vs_stronger_baseline']:.2f}x | | | | |")
    return "\n".join(lines)


def _side_main(argv: list[str]) -> None:
    """Subprocess entry: time one side, print its figures as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m hf_minitx.tools.benchmark.data_prep")
    parser.add_argument("--side", choices=SIDES, required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--block_size", type=int, default=256)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    if args.side == "minitx":
        prepare = prepare_minitx
    else:
        prepare = functools.partial(prepare_run_clm, sample_by="line" if args.side == "run_clm-lines" else "paragraph")
    import datasets  # noqa: F401  imports are not timed

    from ... import data  # noqa: F401
    start = time.perf_counter()
    cpu = _cpu_seconds()
    rows = prepare(args.files, args.tokenizer, args.block_size)
    print(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": _cpu_seconds() - cpu, "rows": rows}))


def _cpu_seconds() -> float:
    """CPU seconds used by this process and its finished children (pool workers), user and system."""
    return sum(usage.ru_utime + usage.ru_stime for usage in (resource.getrusage(resource.RUSAGE_SELF),
                                                              resource.getrusage(resource.RUSAGE_CHILDREN)))


if __name__ == "__main__":
    _side_main(sys.argv[1:])
