"""`minitx train` from a checkout: python scripts/train.py ARGS (see --help)."""
import _minitx

_minitx.run("train")
