"""Train hf_minitx's byte-level BPE tokenizer on a corpus and save it as a stock transformers folder.

Example (this is how the repository's ``tokenizer/`` folder was made):

    python scripts/train_tokenizer.py --dataset builtin:kjv --vocab_size 8192 --output_dir tokenizer

The folder loads with ``AutoTokenizer.from_pretrained(output_dir)``, no custom code needed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    from hf_minitx.data import corpus_task, iter_training_texts, load_corpus
    from hf_minitx.tokenization import train_bpe_tokenizer
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from hf_minitx.data import corpus_task, iter_training_texts, load_corpus
    from hf_minitx.tokenization import train_bpe_tokenizer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="builtin:kjv",
                        help="builtin:NAME, a local file/glob/comma-separated list, a folder or a Hub id")
    parser.add_argument("--dataset_config", default=None, help="config name passed to datasets.load_dataset")
    parser.add_argument("--task", choices=["causal-lm", "seq2seq"], default=None,
                        help="default: seq2seq for builtin seq2seq corpora or when source/target columns are "
                             "given, else causal-lm. seq2seq trains on source and target text")
    parser.add_argument("--text_column", default="text", help="text column (causal-lm)")
    parser.add_argument("--source_column", default=None, help="source column (seq2seq)")
    parser.add_argument("--target_column", default=None, help="target column (seq2seq)")
    parser.add_argument("--sample_by", choices=["document", "paragraph", "line"], default="document",
                        help="what ends a sample, as in training (causal-lm); the text is the same either way")
    parser.add_argument("--num_examples", type=int, default=None, help="size of generated builtin tasks")
    parser.add_argument("--vocab_size", type=int, default=8192, help="vocabulary size, special tokens included")
    parser.add_argument("--min_frequency", type=int, default=2, help="minimum pair count for a merge")
    parser.add_argument("--max_texts", type=int, default=None,
                        help="train on a sample of at most this many texts (rows) of the train split")
    parser.add_argument("--model_max_length", type=int, default=1024, help="saved model_max_length")
    parser.add_argument("--seed", type=int, default=42, help="seed of the validation carve-out and sampling")
    parser.add_argument("--streaming", action="store_true", help="stream the corpus (use with --max_texts)")
    parser.add_argument("--output_dir", required=True, help="folder to write the tokenizer to")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    """Train and save the tokenizer; returns the output folder."""
    args = parse_args(argv)
    task = args.task or corpus_task(args.dataset) or (
        "seq2seq" if args.source_column or args.target_column else "causal-lm"
    )
    corpus = load_corpus(
        args.dataset,
        task=task,
        dataset_config=args.dataset_config,
        text_column=args.text_column,
        source_column=args.source_column,
        target_column=args.target_column,
        seed=args.seed,
        streaming=args.streaming,
        num_examples=args.num_examples,
        sample_by=args.sample_by,
    )
    start = time.perf_counter()
    tokenizer = train_bpe_tokenizer(
        iter_training_texts(corpus["train"], max_texts=args.max_texts, seed=args.seed),
        args.vocab_size,
        min_frequency=args.min_frequency,
        model_max_length=args.model_max_length,
        add_eos_token=task == "seq2seq",  # seq2seq sources end with EOS, as training encodes them
    )
    output_dir = Path(args.output_dir)
    tokenizer.save_pretrained(output_dir)
    print(f"trained a {len(tokenizer)}-token BPE on {args.dataset} ({task}) in "
          f"{time.perf_counter() - start:.1f}s; saved to {output_dir}")
    return output_dir


if __name__ == "__main__":
    from hf_minitx.cli import run_cli

    sys.exit(run_cli(main))
