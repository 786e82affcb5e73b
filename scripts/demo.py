"""`minitx demo` from a checkout: python scripts/demo.py ARGS (see --help)."""
import _minitx

_minitx.run("demo")
