"""`minitx visualize` from a checkout: python scripts/visualize.py ARGS (see --help)."""
import _minitx

_minitx.run("visualize")
