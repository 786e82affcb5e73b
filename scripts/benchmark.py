"""Side-by-side benchmark of hf_minitx vs GPT-2, BART and torch.nn.Transformer (see hf_minitx/benchmark.py).

    python scripts/benchmark.py --quick --json bench.json
"""

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its thread pool; --threads sets torch's
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hf_minitx.benchmark import main  # noqa: E402

if __name__ == "__main__":
    from hf_minitx.cli import run_cli

    sys.exit(run_cli(main))
