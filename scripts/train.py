"""Train a MiniTx model (decoder-only or encoder-decoder) with Accelerate.

    python scripts/train.py --task seq2seq --dataset builtin:numbers-en-fr --preset numbers-demo \
        --output_dir runs/numbers --max_steps 1500
    python scripts/train.py scripts/configs/runs/kjv-gpt.json --max_minutes 5
    accelerate launch --multi_gpu --num_processes 2 scripts/train.py --dataset builtin:pydocs --output_dir runs/py

Arguments: `python scripts/train.py --help`. The logic lives in hf_minitx/train.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from hf_minitx.train import main
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from hf_minitx.train import main

if __name__ == "__main__":
    from hf_minitx.cli import run_cli

    sys.exit(run_cli(main, sys.argv[1:]))
