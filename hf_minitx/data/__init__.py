"""Data: corpora (`load_corpus`), the byte-level BPE tokenizer, tokenization and packing.

A row of a causal-lm corpus is a piece of text; `doc_end` marks the row that ends a document (a sample),
and packing puts EOS only there.
"""

from .builtin import BUILTIN_CORPORA
from .corpus import TASKS, corpus_task, iter_training_texts, load_corpus
from .documents import as_samples, rows_from_lines
from .preprocessing import (
           BlockCollator,
           block_collator,
           preprocess_seq2seq,
           seq2seq_collator,
           tokenize_and_pack,
)
from .streaming import PackedBlockStream, held_out_blocks
from .tokenizer import load_tokenizer, train_bpe_tokenizer

__all__ = ["BUILTIN_CORPORA", "TASKS", "load_corpus", "as_samples", "rows_from_lines", "corpus_task",
           "iter_training_texts", "tokenize_and_pack", "BlockCollator", "block_collator", "PackedBlockStream",
           "held_out_blocks", "preprocess_seq2seq", "seq2seq_collator",
           "train_bpe_tokenizer", "load_tokenizer"]
