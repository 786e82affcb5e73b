"""`python -m hf_minitx SUBCOMMAND ...` is the `minitx` command (and `accelerate launch -m hf_minitx train ...`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
