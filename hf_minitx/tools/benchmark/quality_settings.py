"""The quality comparison's settings and what they are checked against before any training: the corpora
(each cut into the comparison's own splits), the arguments of our side's `minitx train`, and the folder that
keeps each finished side's figures across an interruption (--quality_work_dir)."""

from __future__ import annotations

import json
import math
import os
import shlex
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ...device import check_thread_count
from ...folders import folder_path, write_file

QUALITY_CORPORA = ("builtin:kjv", "builtin:pydocs")
SHAPE_OVERRIDES = "hidden_size={hidden},num_attention_heads={heads},num_hidden_layers={layers}"
CURVE_POINTS = 10
MIN_CORPUS_CHARS = 20_000  # a tenth of it is the validation text: enough blocks to score, a tokenizer to train
# `minitx train` arguments the comparison itself sets: the corpus, the tokenizer, the equal wall time, the threads
# and the folder it scores; --quality_ours_args may change the recipe, not these
RUN_CONTROLS = ("--task", "--dataset", "--tokenizer", "--max_minutes", "--max_steps", "--num_epochs",
                "--num_threads", "--output_dir", "--overwrite_output_dir", "--resume_from_checkpoint",
                "--keep_phases", "--checkpointing_steps", "--save_total_limit")
SETTINGS_FILE = "quality-settings.json"  # marks a --quality_work_dir as this section's, with the settings it ran


@dataclass(frozen=True)
class QualitySettings:
    """One quality comparison: the reference's shape, the budget, the threads, and what may change our side's recipe."""

    seconds: float = 180.0
    corpora: tuple[str, ...] = QUALITY_CORPORA
    layers: int = 4
    heads: int = 4
    hidden: int = 128
    threads: int | None = None  # None: every core, as users train
    ours_args: str = ""  # extra `minitx train` arguments for our side, e.g. "--optimizer adamw"
    shared_shape: bool = False  # our side at layers x hidden too, rather than the shape its budget plans
    max_chars: int = 3_000_000  # of each corpus: tokenizer training and scoring stay short
    curve_tokens: int = 16_384  # validation tokens the curve's snapshots are scored on
    seed: int = 0

    def check(self) -> None:
        """Every setting that could fail, and every corpus, before any training."""
        if not math.isfinite(self.seconds) or self.seconds <= 0:
            raise ValueError(f"--quality_seconds must be a finite number > 0, got {self.seconds}")
        if self.hidden % self.heads:
            raise ValueError(f"quality: hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        check_thread_count(self.threads, "--quality_threads")
        controls = changed_controls(self)
        if controls:
            raise ValueError(f"--quality_ours_args may not set {', '.join(controls)}: the comparison sets them "
                             "itself (the corpus, the equal wall time, the threads, the folder it scores); give "
                             "--quality_seconds, --quality_threads or --quality_corpora instead")
        our_arguments(self, Path("data"), Path("tokenizer"), Path("out"))
        named = [corpus if corpus.startswith("builtin:") else str(Path(corpus).expanduser().resolve())
                 for corpus in self.corpora]  # ./a.txt and a.txt are one file
        repeated = sorted({corpus for corpus, key in zip(self.corpora, named, strict=True) if named.count(key) > 1})
        if repeated:
            raise ValueError(f"--quality_corpora names {', '.join(repeated)} more than once; give each corpus once")
        for corpus in self.corpora:
            check_corpus(corpus, self.max_chars)

    @property
    def num_threads(self) -> int:
        return self.threads or os.cpu_count() or 1


def our_arguments(settings: QualitySettings, data: Path, tokenizer: Path, out: Path) -> list[str]:
    """The `minitx train` arguments of our side (checked: unknown or bad --quality_ours_args fail here)."""
    from ...training.arguments import parse_training_args

    shape = ["--config_overrides", SHAPE_OVERRIDES.format(**asdict(settings))] if settings.shared_shape else []
    args = ["--task", "causal-lm", "--dataset", str(data), "--tokenizer", str(tokenizer), *shape, "--keep_phases",
            "--max_minutes", f"{settings.seconds / 60:.6g}", "--num_threads", str(settings.num_threads),
            "--eval_steps", "0", "--checkpointing_steps", str(1 / CURVE_POINTS), "--save_total_limit",
            str(CURVE_POINTS + 1), "--disable_tqdm", "--output_dir", str(out), *shlex.split(settings.ours_args)]
    try:
        parse_training_args(args)
    except (ValueError, SystemExit) as err:
        raise ValueError(f"--quality_ours_args {settings.ours_args!r}: {err}; give minitx train arguments") from None
    return args


def changed_controls(settings: QualitySettings) -> list[str]:
    """The comparison's own `minitx train` settings (``RUN_CONTROLS``) that --quality_ours_args would change,
    read from the parsed arguments, so that `--max-minutes` and `--max_minutes=5` are both seen (a prefix such as
    `--max_min` is refused as unrecognized)."""
    from ...training.arguments import parse_training_args

    paths = (Path("data"), Path("tokenizer"), Path("out"))
    try:
        given = parse_training_args(our_arguments(settings, *paths))
    except ValueError:
        return []  # our_arguments names the bad argument itself
    plain = parse_training_args(our_arguments(replace(settings, ours_args=""), *paths))
    fields = [flag.removeprefix("--") for flag in RUN_CONTROLS]
    return [f"--{name}" for name in fields
            if any(getattr(a, name, None) != getattr(b, name, None) for a, b in zip(given, plain, strict=True))]


def our_data_arguments(settings: QualitySettings) -> Any:
    """Our side's data arguments: its block size and tokenizer vocabulary, which both sides share."""
    from ...training.arguments import parse_training_args

    return parse_training_args(our_arguments(settings, Path("data"), Path("tokenizer"), Path("out")))[1]


def corpus_text(corpus: str, max_chars: int) -> str:
    """The text of a builtin corpus (its rows joined by blank lines) or of a text file, cut at ``max_chars``."""
    if corpus.startswith("builtin:"):
        from ...data.builtin import load_builtin

        text = "\n\n".join(row["text"] for row in load_builtin(corpus.removeprefix("builtin:")))
    else:
        try:
            text = Path(corpus).expanduser().read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"--quality_corpora {corpus} is not UTF-8 text (byte {error.start}: "
                             f"{error.reason}); convert it, e.g. `iconv -f latin1 -t utf-8`") from None
    return text[:max_chars]


def check_corpus(corpus: str, max_chars: int) -> None:
    """A corpus the comparison can cut into its own splits: a language-model built-in, or one UTF-8 text file
    of at least ``MIN_CORPUS_CHARS`` characters (a folder, a glob or records would each need their own split)."""
    if corpus.startswith("builtin:"):
        from ...data.builtin import get_builtin

        if get_builtin(corpus).task != "causal-lm":
            raise ValueError(f"--quality_corpora {corpus} is a translation corpus; the comparison trains language "
                             "models: give builtin:kjv, builtin:pydocs or a .txt file")
        return
    path = Path(corpus).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"--quality_corpora {corpus} does not exist; give builtin:NAME or a UTF-8 .txt file")
    if not path.is_file():
        raise ValueError(f"--quality_corpora {corpus} is a folder; the comparison cuts its own training and "
                         "validation text from one file: give one UTF-8 .txt file (join a folder's files into one)")
    if path.suffix.lower() in (".json", ".jsonl", ".csv", ".parquet"):
        raise ValueError(f"--quality_corpora {corpus} holds records ({path.suffix}); the comparison reads plain "
                         "text: give the text as one UTF-8 .txt file")
    size = len(corpus_text(corpus, max_chars))
    if size < MIN_CORPUS_CHARS:
        raise ValueError(f"--quality_corpora {corpus} has {size:,} characters; the comparison needs at least "
                         f"{MIN_CORPUS_CHARS:,} (a tenth of them is the validation text): give a longer text")


def check_work_dir(work: Path, settings: QualitySettings) -> None:
    """A --quality_work_dir is new, empty, or one this section made for the same settings."""
    folder_path(work, option="--quality_work_dir")
    if not work.is_dir() or not any(work.iterdir()):
        return
    marker = work / SETTINGS_FILE
    if not marker.is_file():
        raise ValueError(f"--quality_work_dir {work} is not empty and holds no quality comparison; give a new or "
                         "empty folder")
    try:
        kept = json.loads(marker.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"--quality_work_dir {work}: {SETTINGS_FILE} cannot be read ({error}); delete the folder "
                         "to start over") from None
    differ = sorted(key for key, value in _settings_record(settings).items() if kept.get(key) != value)
    if differ:
        raise ValueError(f"--quality_work_dir {work} holds a comparison of other settings ({', '.join(differ)}); "
                         "give the same settings to finish it, or another folder")


def claim_work_dir(work: Path, settings: QualitySettings) -> None:
    """Checked (``check_work_dir``), made, and marked with the settings its figures belong to."""
    check_work_dir(work, settings)
    work.mkdir(parents=True, exist_ok=True)
    if not (work / SETTINGS_FILE).is_file():
        write_file(work / SETTINGS_FILE, lambda tmp: tmp.write_text(json.dumps(_settings_record(settings))))


def _settings_record(settings: QualitySettings) -> dict[str, Any]:
    """The settings as JSON stores them (tuples as lists), with the threads they resolve to."""
    return json.loads(json.dumps({**asdict(settings), "num_threads": settings.num_threads}))
