"""`minitx benchmark` and `minitx benchmark-report`: hf_minitx measured side by side with the implementations users
would otherwise pick, and the docs' figures rendered from what it measured.

The command lives in `run`; each section in a module of its own: `models` (the implementations, at one shared
shape), `generation` (their `generate()` steps), `data_prep` (raw text to packed blocks), `quality` (bits per
byte at equal wall time); `report` rewrites docs/benchmark-results.md and README.md from the JSON `run` writes.

Nothing is imported here, so that a subprocess running one module (`python -m hf_minitx.tools.benchmark.data_prep`)
imports only what that module needs.
"""
