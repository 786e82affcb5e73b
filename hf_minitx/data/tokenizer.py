"""Train and load the byte-level BPE tokenizer used by hf_minitx.

The tokenizer is a stock ``tokenizers`` byte-level BPE wrapped in a transformers fast tokenizer, so
a saved folder loads with ``AutoTokenizer.from_pretrained(folder)`` and needs no custom code.

Special tokens have fixed ids, so model configs can rely on them:
``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<unk>`` = 3. They come only from the pipeline (the
post-processor, EOS at document ends), never from the text: a literal ``"<eos>"`` in a text is encoded
as ordinary bytes (``split_special_tokens=True``, saved in ``tokenizer_config.json``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ..cli import check_at_least
from ..folders import output_folder, write_folder, write_marker
from .builtin import check_num_examples

logger = logging.getLogger(__name__)

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
# The order fixes the ids: the trainer gives special tokens the first ids, in this order.
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256  # the special tokens and the 256 byte symbols
# Encode special-token text ("<eos>" written in a document, a prompt, code or HTML) as the bytes it is, so a
# special id only ever comes from the pipeline. transformers saves the flag and applies it on every call.
AS_TEXT = {"split_special_tokens": True}


def _post_processor(add_bos: bool, add_eos: bool) -> processors.TemplateProcessing:
    """A template that wraps each sequence in the requested bos/eos tokens."""
    single = " ".join(
        ([f"{BOS_TOKEN}:0"] if add_bos else []) + ["$A:0"] + ([f"{EOS_TOKEN}:0"] if add_eos else [])
    )
    pair_b = " ".join(
        ([f"{BOS_TOKEN}:1"] if add_bos else []) + ["$B:1"] + ([f"{EOS_TOKEN}:1"] if add_eos else [])
    )
    return processors.TemplateProcessing(
        single=single,
        pair=f"{single} {pair_b}",
        special_tokens=[(BOS_TOKEN, BOS_ID), (EOS_TOKEN, EOS_ID)],
    )


# the side each model pads a batch on: a decoder-only model generates from the prompts' ends (left), an
# encoder-decoder's labels are padded after them (right), as transformers' DataCollatorForSeq2Seq pads
PADDING_SIDES = {"causal-lm": "left", "seq2seq": "right"}


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    *,
    min_frequency: int = 2,
    model_max_length: int = 1024,
    add_bos_token: bool = False,
    add_eos_token: bool = False,
    show_progress: bool = False,
    padding_side: Literal["left", "right"] = "left",  # PADDING_SIDES[task]
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` and return it as a transformers fast tokenizer.

    ``padding_side``: "left" for a decoder-only model (a batch of prompts generates from their ends), "right" for
    an encoder-decoder one, as BART's: transformers' `DataCollatorForSeq2Seq` pads the labels on this side too.

    ``texts`` is consumed once, lazily: pass an iterator over a sample of a large corpus to keep
    memory bounded. The 256 byte symbols are always in the vocabulary, so any Unicode text
    round-trips through ``encode``/``decode``; no normalizer is applied for the same reason.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: a byte-level BPE needs at least "
            f"{MIN_VOCAB_SIZE} entries (256 bytes + {len(SPECIAL_TOKENS)} special tokens)."
        )
    backend = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    backend.train_from_iterator(checked_texts(texts, "the texts"), trainer=trainer)  # names a bad text
    if backend.get_vocab_size() < vocab_size:
        logger.warning("note: the texts hold merges for only %d tokens, so the tokenizer has %d, not the %d asked "
                       "(more text makes more merges)", backend.get_vocab_size(), backend.get_vocab_size(), vocab_size)
    for token, expected in zip(SPECIAL_TOKENS, range(len(SPECIAL_TOKENS)), strict=True):
        if backend.token_to_id(token) != expected:  # pragma: no cover - guards a tokenizers change
            raise RuntimeError(f"special token {token} got id {backend.token_to_id(token)}, expected {expected}")
    backend.post_processor = _post_processor(add_bos_token, add_eos_token)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        add_bos_token=add_bos_token,
        add_eos_token=add_eos_token,
        model_max_length=model_max_length,
        padding_side=padding_side,
        clean_up_tokenization_spaces=False,
        **AS_TEXT,
    )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# how a tokenizer was loaded, which transformers keeps in init_kwargs and save_pretrained would write out
LOAD_TIME_KEYS = ("is_local", "local_files_only", "cache_dir", "force_download", "token", "revision", "subfolder",
                  "trust_remote_code", "_commit_hash")


def _loaded(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """The tokenizer without the load-time keys, so saving it again writes only what defines it."""
    for key in LOAD_TIME_KEYS:
        tokenizer.init_kwargs.pop(key, None)
    return tokenizer


def load_tokenizer(path_or_name: str | Path) -> PreTrainedTokenizerFast:
    """Load a saved tokenizer folder (or a cached Hub id) with ``AutoTokenizer``.

    Special-token text in what it encodes stays text (``split_special_tokens=True``), also for a folder saved
    without that setting (before it existed, or by another library); saving the tokenizer again writes it out.

    A folder must hold our files (``tokenizer.json``, ``tokenizer_config.json``) and they must parse: a
    missing or damaged file is one error that names it, not a library message about other formats.
    """
    folder = Path(path_or_name)
    if not folder.is_dir():
        return _loaded(AutoTokenizer.from_pretrained(path_or_name, **AS_TEXT))
    missing = [name for name in TOKENIZER_FILES if not (folder / name).is_file()]
    if len(missing) == len(TOKENIZER_FILES):
        raise FileNotFoundError(f"{folder} holds no tokenizer (no tokenizer.json or tokenizer_config.json); pass a "
                                "folder written by minitx train-tokenizer or tokenizer.save_pretrained, or leave "
                                "--tokenizer out to train one")
    slow = [name for name in ("vocab.json", "merges.txt", "spiece.model", "vocab.txt") if (folder / name).is_file()]
    if missing == ["tokenizer.json"] and slow:
        raise FileNotFoundError(f"{folder} holds a tokenizer in a slow format ({', '.join(slow)}) without "
                                "tokenizer.json, which minitx reads: write one with `AutoTokenizer.from_pretrained"
                                "(folder).save_pretrained(folder)` (where that loads it), or leave --tokenizer out "
                                "to train one")
    if missing:
        raise FileNotFoundError(f"{folder / missing[0]} is missing: the tokenizer folder is incomplete; save the "
                                "tokenizer again (tokenizer.save_pretrained) or copy the file back")
    for name in TOKENIZER_FILES:
        try:
            json.loads((folder / name).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            raise ValueError(f"{folder / name} is damaged (not valid JSON: {error}); save the tokenizer again "
                             "or copy an intact file back") from None
    try:
        return _loaded(AutoTokenizer.from_pretrained(folder, **AS_TEXT))
    except Exception as error:  # the library's own reasons for a file that parses but is not a tokenizer
        raise ValueError(f"{folder / 'tokenizer.json'} could not be loaded as a tokenizer "
                         f"({type(error).__name__}: {str(error).splitlines()[0][:200]}); "
                         "save the tokenizer again") from None


def check_training_tokenizer(folder: str | Path) -> None:
    """``--tokenizer FOLDER`` of ``minitx train`` loads and defines ``<pad>``, ``<bos>`` and ``<eos>`` (EOS ends each
    document, pad fills a last block, BOS starts seq2seq decoding): said when the run is planned, before any
    corpus is read or tokenized."""
    tokenizer = load_tokenizer(folder)
    missing = [name for name in ("eos", "pad", "bos") if getattr(tokenizer, f"{name}_token_id") is None]
    if missing:
        names = [name.upper() if name != "pad" else name for name in missing]
        names = " or ".join(filter(None, [", ".join(names[:-1]), names[-1]]))
        raise ValueError(f"--tokenizer {folder} has no {names} token (minitx needs {PAD_TOKEN}, {BOS_TOKEN} and "
                         f"{EOS_TOKEN}); use a tokenizer made by minitx train-tokenizer, or leave --tokenizer out "
                         "to train one")


def checked_texts(texts: Iterable[str], what: str = "the corpus", option: str | None = None) -> Iterator[str]:
    """Yield `texts`, raising a ValueError that names the first one UTF-8 cannot encode (a lone surrogate
    such as "\\ud800") and its position; the tokenizer itself would fail without saying where. ``option``: the
    command-line option the texts came from (a byte the shell could not decode), named instead of a row."""
    for row, text in enumerate(texts):
        try:
            text.encode("utf-8")
            yield text
        except UnicodeEncodeError as error:
            at = f"{text[error.start]!r} at character {error.start}"
            if option is not None:
                raise ValueError(f"{option} {text[:40]!r} has {at}, a byte that is not UTF-8 (the shell passed it "
                                 "undecoded), so it is not valid Unicode text; pass the text in UTF-8") from None
            raise ValueError(
                f"row {row} of {what} (starting {text[:40]!r}) has {at}, a lone surrogate that is not valid Unicode "
                "text; fix the data (e.g. decode the file with errors='replace') or drop that row") from None


@dataclass
class TokenizerArguments:
    """`minitx train-tokenizer`: which corpus, which vocabulary size, where to save."""

    output_dir: str = field(metadata={"help": "folder to write the tokenizer to"})
    dataset: str = field(default="builtin:kjv", metadata={
        "help": "builtin:NAME, a local file/glob/comma-separated list, a folder or a Hub id"})
    dataset_config: str | None = field(default=None, metadata={"help": "config name passed to datasets.load_dataset"})
    task: Literal["causal-lm", "seq2seq"] | None = field(default=None, metadata={
        "help": "default: seq2seq for builtin seq2seq corpora or when source/target columns are given, else "
                "causal-lm. seq2seq trains on source and target text"})
    text_column: str = field(default="text", metadata={"help": "text column (causal-lm)"})
    source_column: str | None = field(default=None, metadata={"help": "source column (seq2seq)"})
    target_column: str | None = field(default=None, metadata={"help": "target column (seq2seq)"})
    sample_by: Literal["document", "paragraph", "line"] = field(default="document", metadata={
        "help": "what ends a sample, as in training (causal-lm); the text is the same either way"})
    num_examples: int | None = field(default=None, metadata={"help": "size of generated builtin tasks"})
    vocab_size: int = field(default=8192, metadata={"help": "vocabulary size, special tokens included"})
    min_frequency: int = field(default=2, metadata={"help": "minimum pair count for a merge"})
    max_texts: int | None = field(default=None, metadata={
        "help": "train on a sample of at most this many texts (rows) of the train split"})
    model_max_length: int = field(default=1024, metadata={"help": "saved model_max_length"})
    seed: int = field(default=42, metadata={"help": "seed of the validation carve-out and sampling"})
    streaming: bool = field(default=False, metadata={"help": "stream the corpus (use with --max_texts)"})
    skip_bad_rows: bool = field(default=False, metadata={
        "help": "replace bytes that are not UTF-8 with U+FFFD and skip rows without text, as `minitx train` does, "
                "instead of stopping with an error that names them"})
    overwrite: bool = field(default=False, metadata={
        "help": "replace a tokenizer folder minitx train-tokenizer made (refused otherwise)"})
    overwrite_any_folder: bool = field(default=False, metadata={
        "help": "with --overwrite: replace --output_dir even when minitx did not make it (deletes every file in it)"})


MAX_VOCAB_SIZE = 2**20  # the BPE trainer sizes its tables for the whole vocabulary up front (a billion: 70 GB);
# the largest published vocabularies hold about 262,000 tokens


def check_vocab_size(vocab_size: int, option: str) -> None:
    """A BPE's size ``option`` (a flag's name, for the message): the bytes and special tokens at least, and at
    most MAX_VOCAB_SIZE (past it the trainer's allocation ends the process in native code, naming nothing)."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"{option} must be >= {MIN_VOCAB_SIZE} (256 bytes + {len(SPECIAL_TOKENS)} special "
                         f"tokens; more makes merges), got {vocab_size}")
    if vocab_size > MAX_VOCAB_SIZE:
        raise ValueError(f"{option} must be at most {MAX_VOCAB_SIZE:,} (the trainer allocates for every token up "
                         f"front), got {vocab_size}")


def check_tokenizer_arguments(args: TokenizerArguments) -> None:
    """Sizes and counts that can train a tokenizer; checked before anything is read or written."""
    check_vocab_size(args.vocab_size, "--vocab_size")
    if args.min_frequency < 0:
        raise ValueError(f"--min_frequency must be >= 0 (the pair count a merge needs), got {args.min_frequency}")
    check_at_least({name: getattr(args, name) for name in ("max_texts", "num_examples", "model_max_length")}, 1,
                   hint=" (or left out for the default)")
    check_num_examples(args.dataset, args.num_examples)


def _save_marked(tokenizer: PreTrainedTokenizerFast, folder: Path) -> None:
    """Save the tokenizer and its run marker into ``folder`` (write_folder's working copy, which says a full or
    read-only disk in one line)."""
    tokenizer.save_pretrained(folder)
    write_marker(folder, command="train-tokenizer", run_id=uuid.uuid4().hex[:12])


def _train_and_save(args: TokenizerArguments, output_dir: Path) -> str:
    """Read the corpus, train the tokenizer and write it into ``output_dir``; returns the line that says so."""
    from .corpus import corpus_task, iter_training_texts, load_corpus
    from .splits import TooSmallToSplit

    task = args.task or corpus_task(args.dataset) or (
        "seq2seq" if args.source_column or args.target_column else "causal-lm"
    )
    options = dict(task=task, dataset_config=args.dataset_config, text_column=args.text_column,
                   source_column=args.source_column, target_column=args.target_column, seed=args.seed,
                   streaming=args.streaming, num_examples=args.num_examples, sample_by=args.sample_by,
                   skip_bad_rows=args.skip_bad_rows)
    try:  # the train split training will read, when the corpus is large enough to carve a validation split
        corpus = load_corpus(args.dataset, **options)
    except TooSmallToSplit:  # a tokenizer needs no validation: train on the whole small corpus
        corpus = load_corpus(args.dataset, validation_split=None, **options)
    start = time.perf_counter()
    tokenizer = train_bpe_tokenizer(
        iter_training_texts(corpus["train"], max_texts=args.max_texts, seed=args.seed),
        args.vocab_size, min_frequency=args.min_frequency, model_max_length=args.model_max_length,
        add_eos_token=task == "seq2seq",  # seq2seq sources end with EOS, as training encodes them
        padding_side=PADDING_SIDES[task],
    )
    write_folder(output_dir, lambda folder: _save_marked(tokenizer, folder))
    return (f"trained a {len(tokenizer)}-token BPE on {args.dataset} ({task}) in {time.perf_counter() - start:.1f}s; "
            f"saved to {output_dir}")


def main(argv: Sequence[str] | None = None) -> Path:
    """`minitx train-tokenizer`: train and save the tokenizer; returns the output folder."""
    from ..cli import parse_arguments
    from .sources import local_inputs

    (args,) = parse_arguments([TokenizerArguments], argv, prog="minitx train-tokenizer", description=(
        "Train hf_minitx's byte-level BPE on a corpus and save it as a stock transformers tokenizer folder "
        "(loads with AutoTokenizer.from_pretrained, no custom code)."))
    check_tokenizer_arguments(args)
    with output_folder(args.output_dir, command="train-tokenizer", flag="--overwrite", overwrite=args.overwrite,
                       inputs=[("--dataset", path) for path in local_inputs(args.dataset)],
                       any_flag="--overwrite_any_folder", overwrite_any=args.overwrite_any_folder) as output_dir:
        print(_train_and_save(args, output_dir))  # the folder's lock is held from before the corpus is read
    return output_dir
