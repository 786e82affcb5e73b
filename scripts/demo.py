"""`make demo`: train a KJV language model and an English->French number translator offline, reload both
with the Auto classes and generate. Logic in hf_minitx/demo.py; run files in scripts/configs/runs/."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    from hf_minitx.demo import run_demo
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from hf_minitx.demo import run_demo

if __name__ == "__main__":
    sys.exit(run_demo(sys.argv[1] if len(sys.argv) > 1 else "runs"))
