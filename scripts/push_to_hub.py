"""`minitx push` from a checkout: python scripts/push_to_hub.py ARGS (see --help)."""
import _minitx

_minitx.run("push")
