"""What every script in this folder shares: run one `minitx` subcommand, from a checkout or an install.

Each script is a one-line wrapper, so `python scripts/NAME.py ARGS` is `minitx SUBCOMMAND ARGS`.
"""

import sys
from pathlib import Path

try:
    import hf_minitx  # noqa: F401
except ImportError:  # a checkout without `pip install -e .`: use the package next to this folder
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run(subcommand: str) -> None:
    """Exit with `minitx SUBCOMMAND` applied to this script's arguments."""
    from hf_minitx.cli import main

    sys.exit(main([subcommand, *sys.argv[1:]]))
