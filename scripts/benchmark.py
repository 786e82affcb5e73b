"""`minitx benchmark` from a checkout: python scripts/benchmark.py ARGS (see --help)."""
import _minitx

_minitx.run("benchmark")
