"""`python -m hf_minitx SUBCOMMAND ...` is the `minitx` command (and `accelerate launch -m hf_minitx train ...`)."""

import os
import sys

if __name__ == "__main__":
    try:
        from .cli import main
    except KeyboardInterrupt:  # Ctrl-C while the libraries load
        print("interrupted while starting; nothing was written", file=sys.stderr, flush=True)
        os._exit(130)
    sys.exit(main())
