"""What every command-line script shares: bad input ends in one clear line, not a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, ImportError, KeyError)


def run_cli(main: Callable[..., Any], *args: Any) -> int:
    """Call `main(*args)`; print `error: ...` and return 2 for errors in what the user asked for.

    Set HF_MINITX_TRACEBACK=1 to see the full traceback instead.
    """
    import os

    try:
        result = main(*args)
    except USER_ERRORS as error:
        if os.environ.get("HF_MINITX_TRACEBACK"):
            raise
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"error: {message}", file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0
