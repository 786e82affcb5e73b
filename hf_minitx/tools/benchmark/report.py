"""`minitx benchmark-report`: the benchmark results page's tables and the README's headline, from benchmark JSON.

Figures are produced, not typed: `minitx benchmark --json FILE` writes every figure with the machine, the
versions, the date and the load average, and this command rewrites the marked parts of
`docs/benchmark-results.md` and `README.md` from the files in `docs/benchmark/`. Each marked part lies between
two comments,

    <!-- minitx benchmark-report: NAME begin -->
    ...
    <!-- minitx benchmark-report: NAME end -->

(NAME is `tables` in the results page, `headline` in the README); the prose around them is left as it is.

The results page holds every table of every run. The README's headline keeps a few rows, grouped by the run they
come from, each group under one line with its command, machine and date: on a CPU, decoder-only and seq2seq
training, generation at batch 1 and 8, seq2seq generation and int8 weight-only generation at batch 1 (each from
the run at the largest shape that measured it, so a quick run's figure gives way to the full shape's); on a GPU,
decoder-only training; and quality at equal wall time for every corpus and budget of the quality runs. The rest
is on the results page, which docs/performance.md links to.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .data_prep import format_data_prep
from .quality_report import format_quality
from .speed import format_table

RESULTS_FOLDER = "docs/benchmark"  # the committed benchmark JSON files the docs are rendered from
PAGE_BLOCK = "tables"
HEADLINE_BLOCK = "headline"
# (workload, hf_minitx's implementation, what the row measures), in the headline's order, for runs on a CPU; batch 8
# generation and the rest are on the results page, so the headline stays at 12 rows
HEADLINE_CPU_ROWS = (
    ("train_causal", "minitx-sdpa", "decoder-only training"),
    ("train_seq2seq", "minitx-seq2seq", "seq2seq training"),
    ("generate_b1", "minitx", "generation, batch 1"),
    ("generate_seq2seq", "minitx-seq2seq", "seq2seq generation, batch 1"),
    ("generate_b1", "minitx-int8", "int8 weight-only generation, batch 1"),
)
HEADLINE_GPU_ROWS = (("train_causal", "minitx-sdpa", "decoder-only training"),)  # and for runs on a GPU
REFERENCE_NAMES = {"gpt2": "GPT-2", "bart": "BART"}


def _marker(name: str, end: str) -> str:
    return f"<!-- minitx benchmark-report: {name} {end} -->"


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with the part between the `name` markers replaced by `body` (markers kept)."""
    pattern = re.compile(re.escape(_marker(name, "begin")) + r"\n.*?" + re.escape(_marker(name, "end")), re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"expected one pair of markers {_marker(name, 'begin')} ... {_marker(name, 'end')}; "
                         "add them where the generated part goes")
    return pattern.sub(lambda _: f"{_marker(name, 'begin')}\n{body.strip()}\n{_marker(name, 'end')}", text)


def _load(values: list | None) -> str:
    return "not recorded" if not values else f"{values[0]:.1f}"


def describe_machine(result: dict) -> str:
    """The processor (or GPU), the cores, the device and the torch threads of a benchmark run."""
    machine = result["machine"]
    hardware = machine.get("gpu") or machine["cpu"]
    threads = machine.get("torch_threads")
    if "workloads" not in result and "quality" in result:  # a quality run: each side's threads, not the speed's
        threads = result["quality"]["settings"].get("num_threads") or threads
    return (f"{hardware}, {machine.get('cpu_count')} cores, device {machine.get('device')}, {threads} torch "
            f"thread{'s' if threads != 1 else ''}")


def describe_run(result: dict) -> str:
    """One paragraph: the command, the date, the machine, the versions and the load average of a benchmark run."""
    machine = result["machine"]
    versions = ", ".join(f"{name} {machine[name]}" for name in ("python", "torch", "transformers", "hf_minitx")
                         if machine.get(name))
    return (f"`{result.get('command', 'minitx benchmark')}` on {machine.get('date', 'an unrecorded date')}: "
            f"{describe_machine(result)}; {versions}; load average {_load(machine.get('load_average'))} "
            f"at the start, {_load(machine.get('load_average_end'))} at the end.")


def format_shape(result: dict) -> str:
    """The shared shape and the number of rounds, in one line."""
    shape, settings = result["shape"], result.get("settings", {})
    return (f"Shape: vocabulary {shape['vocab_size']}, context {shape['context']}, {shape['layers']} layers, hidden "
            f"{shape['hidden']}, {shape['heads']} heads, feed-forward {shape['ffn_mult']}x, batch {shape['batch']}; "
            f"seq2seq length {shape['seq2seq_len']}; generation from a {shape['prompt_len']}-token prompt for "
            f"{shape['new_tokens']} new tokens; medians of {settings.get('rounds', '?')} rounds.")


def render_page(result: dict) -> str:
    """One run's part of docs/benchmark-results.md: the run's description, then each section's table."""
    parts = ["Measured by " + describe_run(result)]
    if "workloads" in result:
        parts += ["### Speed", format_shape(result), "Tokens per second (medians) and the paired ratio to the "
                  "reference of each workload (higher is faster); peak memory of two training steps.",
                  format_table(result)]
    if "quality" in result:
        threads = result["quality"]["settings"].get("num_threads") or result["quality"]["settings"].get("threads")
        parts += [f"### Quality at equal wall time, {result['quality']['settings']['seconds']:g} s",
                  "Bits per byte of the whole validation text after the same wall time for both sides, each alone "
                  f"on {threads} threads, one after the other (lower is better); "
                  f"{our_shape(result['quality']['settings'])}.", format_quality(result["quality"])]
    if "data_preparation" in result:
        parts += ["### Data preparation", format_data_prep(result["data_preparation"])]
    return "\n\n".join(parts)


def _on_gpu(result: dict) -> bool:
    return result["machine"].get("device", "cpu") != "cpu"


def _shape_size(result: dict) -> int:
    shape = result.get("shape", {})
    return shape.get("hidden", 0) * shape.get("layers", 0) * shape.get("context", 0)


def headline_speed_picks(results: list[dict]) -> dict[tuple, int]:
    """For each headline speed row (GPU or not, workload, implementation), the index of the run it is taken from:
    of the runs that measured it, the one at the largest shape (hidden x layers x context), the later on a tie."""
    picks: dict[tuple, int] = {}
    for index, result in enumerate(results):
        for workload, ours, _ in HEADLINE_GPU_ROWS if _on_gpu(result) else HEADLINE_CPU_ROWS:
            data = result.get("workloads", {}).get(workload)
            if not data or ours not in data["implementations"]:
                continue
            key = (_on_gpu(result), workload, ours)
            if key not in picks or _shape_size(result) >= _shape_size(results[picks[key]]):
                picks[key] = index
    return picks


def _shared_shape(settings: dict) -> bool:
    """Whether our side trained at the reference's shape (every run before the budget planned it did)."""
    return settings.get("shared_shape", True)


def our_shape(settings: dict) -> str:
    """What shape our side of a quality run trained, in words."""
    if _shared_shape(settings):
        return f"ours at the reference's {settings['layers']} × {settings['hidden']} (`--quality_shared_shape`)"
    return "ours at the shape its budget planned, as users type `minitx train --max_minutes`"


def headline_rows(result: dict, speed: Sequence[tuple[str, str, str]]) -> list[tuple[str, str, str, str]]:
    """(measure, hf_minitx, reference, ratio) for the run's quality figures, then for the `speed` rows
    ((workload, implementation, measure), each of which the run holds); a speed measured on a GPU names it."""
    rows = []
    quality = result.get("quality")
    for corpus, figures in (quality or {}).get("corpora", {}).items():
        seconds = quality["settings"]["seconds"]
        settings = quality["settings"]
        fixed = f", both at {settings['layers']} × {settings['hidden']}" if _shared_shape(settings) else ""
        rows.append((f"quality: bits/byte on `{corpus}` after {seconds:g} s{fixed}",
                     f"{figures['ours']['bits_per_byte']:.3f}", f"GPT-2 {figures['reference']['bits_per_byte']:.3f}",
                     f"{figures['ratio']:.3f}x"))
    where = f", {result['machine']['gpu']}" if _on_gpu(result) and result["machine"].get("gpu") else ""
    for workload, ours, measure in speed:
        data = result["workloads"][workload]
        reference = data["reference"]
        mine, theirs = data["implementations"][ours], data["implementations"][reference]
        rows.append((f"{measure} (tokens/s{where})", f"{mine['tokens_per_second']:,.0f}",
                     f"{REFERENCE_NAMES.get(reference, reference)} {theirs['tokens_per_second']:,.0f}",
                     f"{mine['ratio_vs_reference']:.2f}x"))
    return rows


def headline_groups(results: list[dict]) -> list[tuple[dict, list[tuple[str, str, str, str]]]]:
    """(run, its headline rows) for every run that has some: speed on a CPU first, then quality, then GPUs."""
    picks = headline_speed_picks(results)
    groups = []
    for index, result in enumerate(results):
        speed = [(workload, ours, measure)
                 for workload, ours, measure in (HEADLINE_GPU_ROWS if _on_gpu(result) else HEADLINE_CPU_ROWS)
                 if picks.get((_on_gpu(result), workload, ours)) == index]
        rows = headline_rows(result, speed)
        if rows:
            groups.append((result, rows))
    return sorted(groups, key=lambda group: 2 * _on_gpu(group[0]) + ("workloads" not in group[0]))


def render_headline(results: dict | list[dict]) -> str:
    """The README's headline: per run, one line with its command, machine and date, then its rows' table."""
    results = [results] if isinstance(results, dict) else results
    parts = []
    for result, rows in headline_groups(results):
        date = result["machine"].get("date", "an unrecorded date")
        table = ["| measure | hf_minitx | reference | ratio |", "|---|---:|---:|---:|"]
        table += ["| " + " | ".join(row) + " |" for row in rows]
        parts += [f"`{result.get('command', 'minitx benchmark')}` ({describe_machine(result)}; {date}):",
                  "\n".join(table)]
    return "\n\n".join(parts)


def render_pages(results: list[dict]) -> str:
    """The generated part of docs/benchmark-results.md from several runs, one after the other."""
    return "\n\n".join(render_page(result) for result in results)


@dataclass
class ReportArguments:
    """`minitx benchmark-report`: rewrite the generated parts of the docs from a benchmark JSON."""

    json: list[str] = field(default_factory=lambda: [RESULTS_FOLDER], metadata={
        "help": "files `minitx benchmark --json` wrote, or folders whose *.json files are read in name order"})
    results_page: str = field(default="docs/benchmark-results.md", metadata={
        "help": "the benchmark results page: its part between the 'tables' markers is rewritten"})
    readme: str = field(default="README.md", metadata={
        "help": "the README: its part between the 'headline' markers is rewritten"})


def read_results(paths: Sequence[str | Path]) -> list[dict]:
    """Every benchmark JSON the paths name (a folder: its *.json files in name order)."""
    files = [f for p in map(Path, paths) for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]
    if not files:
        raise FileNotFoundError(f"--json {' '.join(map(str, paths))}: no benchmark JSON there; write one with "
                                "`minitx benchmark --json FILE`")
    return [read_result(f) for f in files]


def read_result(path: str | Path) -> dict:
    """A benchmark JSON as a dict; anything else is refused with the reason and the fix."""
    try:
        result = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        if Path(path).suffix.lower() != ".json":  # a folder of results, as the default docs/benchmark of a checkout
            where = (f"run from the checkout's root (its {RESULTS_FOLDER} holds the results) or "
                     if Path(path) == Path(RESULTS_FOLDER) else "")
            raise FileNotFoundError(f"--json {path}: no such file or folder; {where}write one with `minitx benchmark "
                                    "--json FILE.json` and pass that") from None
        raise FileNotFoundError(
            f"--json {path}: no such file; write it with `minitx benchmark --json {path}`") from None
    except ValueError as error:
        raise ValueError(f"--json {path} is not valid JSON ({error}); write it again with minitx benchmark") from None
    if not isinstance(result, dict) or "machine" not in result:
        raise ValueError(f"--json {path} holds no benchmark results (no 'machine'); pass a file `minitx benchmark "
                         "--json` wrote")
    return result


def main(argv: Sequence[str] | None = None) -> None:
    """Rewrite the marked parts of the benchmark results page and the README from the JSON."""
    from ...cli import parse_arguments

    (args,) = parse_arguments([ReportArguments], argv, prog="minitx benchmark-report", description=(
        "Render docs/benchmark-results.md's tables and README.md's headline from `minitx benchmark --json`."))
    results = read_results(args.json)
    try:
        updates = [("--results_page", args.results_page, PAGE_BLOCK, render_pages(results)),
                   ("--readme", args.readme, HEADLINE_BLOCK, render_headline(results))]
    except (KeyError, TypeError, AttributeError, IndexError) as error:  # a file edited by hand, or another tool's
        raise ValueError(f"--json {' '.join(args.json)}: a field is missing or of the wrong kind "
                         f"({type(error).__name__}: {error}); write the results again with `minitx benchmark --json "
                         "FILE`") from None
    new_texts = {}
    for flag, name, block, body in updates:  # every file checked before any is written
        path = Path(name)
        if path.is_dir():
            raise IsADirectoryError(f"{flag} {path} is a folder; pass the Markdown file to rewrite")
        if not path.is_file():
            default = name == getattr(ReportArguments, flag.lstrip("-"))
            raise FileNotFoundError(f"{flag} {path}: no such file; " + (
                f"run from the checkout's root or pass {flag}" if default else
                "pass a Markdown page that exists and holds the markers of the part to rewrite"))
        try:
            new_texts[path] = replace_block(path.read_text(encoding="utf-8"), block, body)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
    for path, text in new_texts.items():
        path.write_text(text, encoding="utf-8")
        print(f"rewrote the generated part of {path} from {' '.join(args.json)}")


__all__ = ["render_page", "render_pages", "render_headline", "read_results", "headline_rows", "headline_groups",
           "headline_speed_picks", "replace_block", "describe_machine", "describe_run", "read_result", "main"]
