"""Stop signals of a run, Ctrl-C (SIGINT) and SIGTERM, handled where stopping at once would lose work.

During the steps and the final save (``StopSignals``) a signal asks the run to stop once the work in hand is
safe: after the current step and a checkpoint, or after the final save. Before the first step
(``TermDuringSetup``) a SIGTERM stops like Ctrl-C, so that setup is abandoned cleanly.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from ..launch import is_first_process

SAME_STOP_SECONDS = 1.0  # a different signal this soon after the first is its echo from a launcher


class StopSignals:
    """SIGINT and SIGTERM ask ``fit`` to stop after the current step (and save); a second one quits at once.

    Installed only in the main thread (signal handlers cannot be set elsewhere); the previous handlers
    come back when ``fit`` ends.
    """

    def __init__(self, then: str = "finishing this step, then saving a checkpoint", *, quit_on_second: bool = True
                 ) -> None:
        self.received: int | None = None
        self.received_at = 0.0
        self.previous: dict[int, Any] = {}
        self.then = then  # what happens before the stop, said when a signal arrives
        self.quit_on_second = quit_on_second  # False: the work in progress is the only copy of the run (final save)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def handle(self, signum: int, frame: object) -> None:
        first = self.received is None
        # a launcher (torchrun) sends SIGTERM right after the terminal's SIGINT: the same stop, not a second one;
        # Ctrl-C again, or any signal a moment later, is a second one
        repeated = not first and (signum == self.received or time.monotonic() - self.received_at > SAME_STOP_SECONDS)
        if repeated and self.quit_on_second:  # nothing half-written is left by design, so quit now
            if is_first_process(on_this_machine=True):
                print(f"\n{signal.Signals(signum).name} again: quitting at once, without saving; the last checkpoint, "
                      "if any, continues with --resume_from_checkpoint latest", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        if first:
            self.received, self.received_at = signum, time.monotonic()
        elif self.quit_on_second:
            return  # a launcher's echo of the first signal
        again = ("press Ctrl-C again to quit at once" if self.quit_on_second
                 else "it takes seconds; quitting now would lose the run")
        if is_first_process(on_this_machine=True):  # a launch's other processes on this machine would repeat it
            print(f"\n{signal.Signals(signum).name}: {self.then} ({again})", file=sys.stderr, flush=True)


class TermDuringSetup:
    """SIGTERM before the first step stops like Ctrl-C (a KeyboardInterrupt), so that setup is abandoned cleanly
    instead of the process dying with half-written staging folders."""

    def __init__(self) -> None:
        self.received = False
        self.previous: Any = None

    def __enter__(self) -> TermDuringSetup:
        # a launch's other processes write nothing in setup, and one waiting for the first in the process group's
        # start (a C call, where no Python handler runs) must die at the launcher's SIGTERM, not linger for 30 s
        if threading.current_thread() is threading.main_thread() and is_first_process():
            self.previous = signal.signal(signal.SIGTERM, self.handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)

    def handle(self, signum: int, frame: object) -> None:
        self.received = True
        raise KeyboardInterrupt
