"""A request to stop a run early: who asked (a signal), and whether rows in flight may still finish.

Why an object rather than an exception: a night's job is stopped by SIGTERM (Slurm, Kubernetes,
a spot instance) with a kill following some seconds later. Raising at the signal would tear the
run wherever it was; instead the run looks at this request between rows, stops admitting new
ones, lets the rows in flight finish until the grace period ends, and then writes its accounts.
A second signal (or the end of the grace period) makes the request ``immediate``: whatever is
still outstanding is dropped, unrecorded, and runs on the resume. Thread-safe: a signal handler
sets it, the engine's threads read it.
"""

from __future__ import annotations

import threading
import time


class StopRequest:
    """Set once by the first signal (then ``immediate`` by a second, or when ``grace`` runs out)."""

    def __init__(self, grace: float = 25.0) -> None:
        self.grace = float(grace)  # seconds the rows in flight get after the first signal
        self._lock = threading.Lock()
        self._signal: str | None = None
        self._at: float | None = None
        self._immediate = False

    def request(self, signal_name: str) -> None:
        """A signal arrived: the first asks for a graceful stop, any later one for an immediate one."""
        with self._lock:
            if self._signal is None:
                self._signal, self._at = signal_name, time.monotonic()
            else:
                self._immediate = True

    @property
    def requested(self) -> bool:
        """True once a stop was asked for: admit no new rows."""
        return self._signal is not None

    @property
    def immediate(self) -> bool:
        """True after a second signal or once the grace period ran out: drop what is still in flight."""
        if self._immediate:
            return True
        at = self._at
        return at is not None and time.monotonic() - at >= self.grace

    @property
    def signal_name(self) -> str | None:
        """The first signal's name (SIGTERM, SIGINT); None while no stop was asked for."""
        return self._signal

    def seconds_left(self) -> float | None:
        """Seconds of grace left (None: no stop asked for)."""
        at = self._at
        return None if at is None else max(0.0, self.grace - (time.monotonic() - at))
