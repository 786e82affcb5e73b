"""`minitx train-tokenizer` from a checkout: python scripts/train_tokenizer.py ARGS (see --help)."""
import _minitx

_minitx.run("train-tokenizer")
