"""`minitx generate` from a checkout: python scripts/generate.py --model runs/kjv-gpt --prompt "And God said"."""
import _minitx

_minitx.run("generate")
