"""``minitx demo`` (``make demo`` in a checkout): train a tokenizer-backed decoder-only model on the King James Bible
and an encoder-decoder that translates English number words to French, offline, then reload both through
the Auto classes and generate.

The two trainings run side by side, one CPU thread each (on a 2-core machine two single-threaded jobs
use the cores better than one two-threaded job, and never oversubscribe them). The KJV run shows its
progress bar; the numbers run writes its log to ``runs/numbers-en-fr.log``. The two run recipes are
argument files shipped in the package (``hf_minitx/tools/recipes/``); everything is written under the
runs folder, so the demo works from any directory with the installed package alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ..folders import SUMMARY_FILE

RECIPES = resources.files(__package__) / "recipes"
KJV_PROMPTS = ("And God said", "Blessed are the")
NUMBERS = (42, 1984, 700_017, 999_999, 80)
EXACT_MATCH_TARGET = 99.0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    return env


def _minitx(*args: str) -> list[str]:
    """The command line of `minitx ARGS` in this Python (works in a checkout and from the wheel alone)."""
    return [sys.executable, "-m", "hf_minitx", *args]


def _train_command(recipe: str, output_dir: Path, *extra: str) -> list[str]:
    """A run of ``recipe`` into ``output_dir``: a finished one is trained again, an interrupted one (checkpoints, no
    summary yet) goes on from its last checkpoint."""
    with resources.as_file(RECIPES / recipe) as path:
        recipe_path = str(path)  # a real file inside the installed package
    unfinished = any(output_dir.glob("checkpoint-*")) and not (output_dir / SUMMARY_FILE).is_file()
    start = ("--resume_from_checkpoint", "latest") if unfinished else ("--overwrite_output_dir",)
    return _minitx("train", recipe_path, "--output_dir", str(output_dir), *start, *extra)


def _finish(process: subprocess.Popen) -> int:
    """``process``'s exit status. A Ctrl-C reaches it too (the terminal signals the whole process group), and it
    then ends its step and saves a checkpoint: it is waited for, not killed in the middle of the save (as
    ``subprocess.run`` would); a second Ctrl-C kills it."""
    try:
        return process.wait()
    except KeyboardInterrupt:
        try:
            process.wait()
        except KeyboardInterrupt:
            process.kill()
            process.wait()
        raise


def _banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def ensure_tokenizer(folder: Path) -> str:
    """Reuse the demo's KJV tokenizer, or train it (vocab 8192, about a second) when the folder has none.

    Training is deterministic: the result is byte-identical to the repository's `tokenizer/` folder.
    """
    if (folder / "tokenizer.json").is_file():
        return f"reused {folder}/"
    subprocess.run(_minitx("train-tokenizer", "--dataset", "builtin:kjv", "--vocab_size", "8192",
                           "--output_dir", str(folder)), check=True, env=_env())
    return f"trained into {folder}/"


def train_both(kjv_dir: Path, numbers_dir: Path, tokenizer_dir: Path) -> dict[str, float]:
    """Both trainings at once; returns each one's wall time in seconds."""
    numbers_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = numbers_dir.parent / f"{numbers_dir.name}.log"
    start, ended = time.perf_counter(), {}  # each run's end
    with open(log_path, "w") as log:
        numbers = subprocess.Popen(_train_command("numbers-en-fr.json", numbers_dir, "--disable_tqdm"),
                                   stdout=log, stderr=subprocess.STDOUT, env=_env())
        def time_numbers() -> None:  # its own end, timed when it comes (the KJV run may still be going then)
            numbers.wait()
            ended["numbers"] = time.perf_counter()

        waiter = threading.Thread(target=time_numbers, daemon=True)
        waiter.start()
        print(f"numbers-en-fr: training in the background, log in {log_path}", flush=True)
        try:
            kjv = subprocess.Popen(_train_command("kjv-gpt.json", kjv_dir, "--tokenizer", str(tokenizer_dir)),
                                   env=_env())
            if _finish(kjv):
                raise subprocess.CalledProcessError(kjv.returncode, kjv.args)
            ended["kjv"] = time.perf_counter()
            if numbers.poll() is None:
                print("kjv-gpt done; waiting for numbers-en-fr ...", flush=True)
            waiter.join()
        except KeyboardInterrupt:
            _finish(numbers)  # saving its own checkpoint
            raise
        finally:
            if numbers.poll() is None:
                numbers.terminate()
    if numbers.returncode != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-20:])
        raise RuntimeError(f"numbers-en-fr training failed (exit {numbers.returncode}); end of {log_path}:\n{tail}")
    return {name: ended[name] - start for name in ("kjv", "numbers")}


def generate_with_both(kjv_dir: Path, numbers_dir: Path) -> dict[str, list]:
    """Reload the saved folders (AutoModelForCausalLM / AutoModelForSeq2SeqLM, through the package's one
    loader) and generate with the package's one generation helper."""
    import torch
    from num2words import num2words

    from ..inference import generate, load_model_folder

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    lm, lm_tokenizer = load_model_folder(kjv_dir, device="cpu")
    # sampling settings come from generation_config.json
    texts = generate(lm, lm_tokenizer, list(KJV_PROMPTS), seed=0, max_new_tokens=60)
    continuations = list(zip(KJV_PROMPTS, texts, strict=True))

    translator, mt_tokenizer = load_model_folder(numbers_dir, device="cpu")
    sources = [num2words(n, lang="en") for n in NUMBERS]
    outputs = generate(translator, mt_tokenizer, sources, do_sample=False, max_new_tokens=48)
    translations = [(s, o, num2words(n, lang="fr")) for s, o, n in zip(sources, outputs, NUMBERS, strict=True)]
    return {"kjv": continuations, "numbers": translations}


def _metrics(folder: Path) -> dict:
    return json.loads((folder / SUMMARY_FILE).read_text())


def run_demo(runs_dir: str | Path = "runs") -> int:
    """The whole demo; returns the exit status (1 if the translator misses its exact-match target)."""
    runs = Path(runs_dir).resolve()
    kjv_dir, numbers_dir, tokenizer_dir = runs / "kjv-gpt", runs / "numbers-en-fr", runs / "kjv-tokenizer"
    timings: dict[str, float] = {}
    start = time.perf_counter()

    _banner("1/4 tokenizer")
    tokenizer_note = ensure_tokenizer(tokenizer_dir)
    print(f"KJV tokenizer: {tokenizer_note}")
    timings["tokenizer"] = time.perf_counter() - start

    _banner("2/4 + 3/4 training kjv-gpt (decoder-only, builtin:kjv) and numbers-en-fr (encoder-decoder)")
    trained = train_both(kjv_dir, numbers_dir, tokenizer_dir)
    timings.update(kjv_training=trained["kjv"], numbers_training=trained["numbers"])

    _banner("4/4 reloading with the Auto classes and generating")
    phase = time.perf_counter()
    samples = generate_with_both(kjv_dir, numbers_dir)
    timings["generation"] = time.perf_counter() - phase
    for prompt, text in samples["kjv"]:
        print(f"[kjv-gpt] {prompt} ... {' '.join(text.split())}")
    for source, output, reference in samples["numbers"]:
        mark = "ok" if output == reference else f"expected: {reference}"
        print(f"[numbers-en-fr] {source} -> {output}   ({mark})")
    timings["total"] = time.perf_counter() - start

    kjv, numbers = _metrics(kjv_dir), _metrics(numbers_dir)
    km, nm = kjv["final_metrics"], numbers["final_metrics"]
    exact = nm.get("eval_exact_match") or 0.0
    _banner("summary")
    rel = {path: os.path.relpath(path, Path.cwd()) for path in (kjv_dir, numbers_dir)}
    print(f"models:      {rel[kjv_dir]}/  and  {rel[numbers_dir]}/  (weights, config, tokenizer, model card, "
          "metrics.jsonl, loss_curve.png)")
    print(f"kjv-gpt:     {kjv['num_parameters'] / 1e6:.1f}M params, {kjv['steps']} steps, "
          f"{kjv['tokens_seen'] / 1e6:.2f}M tokens in {kjv['train_seconds'] / 60:.1f} min "
          f"({kjv['tokens_per_second']:.0f} tok/s); validation loss {km['eval_loss']:.3f}, "
          f"perplexity {km['eval_perplexity']:.1f}, {km['eval_bits_per_byte']:.3f} bits/byte "
          f"(validation split: {kjv['evaluation']['tokens']:,} tokens, {kjv['evaluation']['bytes']:,} bytes)")
    print(f"numbers:     {numbers['num_parameters'] / 1e6:.2f}M params, {numbers['steps']} steps in "
          f"{numbers['train_seconds'] / 60:.1f} min; validation exact match {exact:.1f}% "
          f"(target >= {EXACT_MATCH_TARGET:.0f}%), BLEU {nm['eval_bleu']:.1f}, loss {nm['eval_loss']:.4f}")
    print("time:        " + ", ".join(f"{name} {seconds / 60:.1f} min" for name, seconds in timings.items()))
    print(f"generate:    minitx generate --model {rel[kjv_dir]} --prompt 'And the LORD spake'")
    print(f"             minitx generate --model {rel[numbers_dir]} --prompt 'three hundred and twelve'")
    print(f"explore:     minitx explore --model {rel[kjv_dir]} --run {rel[kjv_dir]} "
          "--text 'And God said, Let there be light' --out explore.html")
    print(f"push:        minitx push --model_dir {rel[kjv_dir]} --repo_id USER/kjv-gpt "
          "(or --dry_run DIR to check the upload offline)")
    (runs / "demo_summary.json").write_text(json.dumps(
        {"timings_seconds": timings, "kjv": km, "numbers": nm, "samples": samples}, indent=2) + "\n")
    if exact < EXACT_MATCH_TARGET:
        print(f"numbers-en-fr reached {exact:.1f}% exact match, below the {EXACT_MATCH_TARGET:.0f}% target")
        return 1
    return 0


@dataclass
class DemoArguments:
    """`minitx demo`: where the runs go."""

    runs_dir: str = field(default="runs", metadata={
        "help": "folder for the tokenizer, both models, the numbers log and demo_summary.json"})


def main(argv: Sequence[str] | None = None) -> int:
    """`minitx demo`: the whole demo, offline; exit status 1 if the translator misses its target."""
    from ..cli import EXIT_INTERRUPTED, parse_arguments
    from ..folders import folder_path

    (args,) = parse_arguments([DemoArguments], argv, prog="minitx demo", description=__doc__.split("\n\n")[0])
    runs = folder_path(args.runs_dir, option="--runs_dir")  # a demo run again into it goes on there: no policy
    for name, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(name, value)
    try:
        return run_demo(runs)
    except subprocess.CalledProcessError as error:  # the step's command said why, in its own error line
        return error.returncode
    except KeyboardInterrupt:
        print(f"demo interrupted: `minitx demo --runs_dir {args.runs_dir}` again goes on from the checkpoints the "
              "training runs saved", file=sys.stderr)
        return EXIT_INTERRUPTED
