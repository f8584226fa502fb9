"""A request to stop a run early: who asked (a signal), and whether rows in flight may still finish.

Why an object rather than an exception: a night's job is stopped by SIGTERM (Slurm, Kubernetes,
a spot instance) with a kill following some seconds later. Raising at the signal would tear the
run wherever it was; instead the run looks at this request between rows, stops admitting new
ones, lets the rows in flight finish until the grace period ends, and then writes its accounts.
A second signal (or the end of the grace period) makes the request ``immediate``: whatever is
still outstanding is dropped, unrecorded, and runs on the resume. Thread-safe: a signal handler
sets it, the engine's threads read it.

The doors (``cosyclone synth``, ``say``, the API) catch SIGINT and SIGTERM into a request with
:func:`catch_signals` for the length of their work only, and put the process's handlers back as
they were; the API then hands the interrupt on with :func:`propagate`, after its cleanup.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

#: The signals a run stops on: Ctrl-C, and what schedulers send before SIGKILL.
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """Set once by the first signal (then ``immediate`` by a second, or when ``grace`` runs out)."""

    def __init__(self, grace: float = 25.0) -> None:
        self.grace = float(grace)  # seconds the rows in flight get after the first signal
        # re-entrant: a second signal's handler may run on the main thread while it is inside request()
        self._lock = threading.RLock()
        self._signal: str | None = None
        self._at: float | None = None
        self._immediate = False

    def request(self, signal_name: str) -> None:
        """A signal arrived: the first asks for a graceful stop, any later one for an immediate one."""
        with self._lock:
            if self._signal is None:
                self._at = time.monotonic()
                self._signal = signal_name
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


class Interrupted(KeyboardInterrupt):
    """Work stopped by ``signal_name``, cleaned up, whose restored handler did not end the process.

    A KeyboardInterrupt, so that ``except Exception`` in a caller's code does not swallow it, as it
    would not swallow Ctrl-C."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


@contextmanager
def catch_signals(stop: StopRequest, *, notice: bool = False) -> Iterator[StopRequest]:
    """While inside, SIGINT and SIGTERM set ``stop`` instead of what they did; on leaving, the handlers
    that were there before are put back (whatever happened inside).

    The handler only records the signal (no I/O that could tear a file, no exception in the middle of
    a write). ``notice``: it also writes one line to stderr saying what happens now (``os.write``:
    safe even when the signal lands inside a print). Off the main thread Python cannot set handlers:
    then nothing is installed and the signals keep their effect.
    """
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}

    def handler(signum: int, frame: FrameType | None) -> None:
        first = not stop.requested
        name = signal.Signals(signum).name
        stop.request(name)
        if notice:
            what = (f"{name}: stopping; no new rows start, rows in flight get {stop.grace:g} s "
                    "(a second signal stops at once)" if first else f"{name}: stopping at once")
            with contextlib.suppress(OSError):  # stderr closed: the run's end says it anyway
                os.write(2, (what + "\n").encode())

    for s in SIGNALS:
        signal.signal(s, handler)
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def propagate(stop: StopRequest) -> None:
    """After the cleanup (and :func:`catch_signals` left): hand a caught signal on to the handler restored.

    Python's own handlers do what the signal would have done at once (SIGINT raises KeyboardInterrupt,
    the default SIGTERM ends the process); a caller's own handler runs. If that returns, :class:`Interrupted`
    is raised all the same: the work was not done, so the call must not return as if it were.
    """
    name = stop.signal_name
    if name is None:
        return
    signal.raise_signal(signal.Signals[name])
    raise Interrupted(name)
