"""`minitx explore` from a checkout: python scripts/explore.py ARGS (see --help)."""
import _minitx

_minitx.run("explore")
