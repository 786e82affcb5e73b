"""Data: corpora (`load_corpus`), the byte-level BPE tokenizer, tokenization and packing."""

from .builtin import BUILTIN_CORPORA
from .corpus import TASKS, corpus_task, iter_training_texts, load_corpus
from .preprocessing import preprocess_seq2seq, seq2seq_collator, tokenize_and_pack
from .tokenizer import load_tokenizer, train_bpe_tokenizer

__all__ = ["BUILTIN_CORPORA", "TASKS", "load_corpus", "corpus_task", "iter_training_texts", "tokenize_and_pack",
           "preprocess_seq2seq", "seq2seq_collator", "train_bpe_tokenizer", "load_tokenizer"]
