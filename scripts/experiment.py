"""`minitx experiment` from a checkout: python scripts/experiment.py ARGS (see --help)."""
import _minitx

_minitx.run("experiment")
