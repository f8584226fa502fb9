"""The stop request and the doors' signal handling (base/stop.py): what a first and a second signal
mean, the grace period, handlers put back as they were, and the interrupt handed on after cleanup."""

from __future__ import annotations

import os
import signal
import time

import pytest

from cosyclone.base.stop import Interrupted, StopRequest, catch_signals, propagate


def test_a_first_signal_asks_for_a_graceful_stop_a_second_for_an_immediate_one() -> None:
    stop = StopRequest(grace=60)
    assert not stop.requested and not stop.immediate and stop.seconds_left() is None
    stop.request("SIGTERM")
    assert stop.requested and not stop.immediate and stop.signal_name == "SIGTERM"
    assert 59 < (stop.seconds_left() or 0) <= 60
    stop.request("SIGINT")
    assert stop.immediate and stop.signal_name == "SIGTERM"  # the first signal names the stop


def test_the_grace_period_running_out_makes_the_stop_immediate() -> None:
    stop = StopRequest(grace=0.1)
    stop.request("SIGINT")
    assert not stop.immediate
    time.sleep(0.15)
    assert stop.immediate and stop.seconds_left() == 0.0


def test_inside_catch_signals_sigterm_and_sigint_only_set_the_request_and_the_handlers_come_back() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stop = StopRequest()
    with catch_signals(stop):
        os.kill(os.getpid(), signal.SIGTERM)  # would end the process by default
        os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt
        time.sleep(0.01)
    assert stop.signal_name == "SIGTERM" and stop.immediate
    assert {s: signal.getsignal(s) for s in before} == before


def test_propagate_hands_sigint_on_as_keyboard_interrupt_after_the_work() -> None:
    stop = StopRequest()
    with pytest.raises(KeyboardInterrupt):
        with catch_signals(stop):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            cleaned = True  # the work's cleanup runs: no exception was raised inside
        assert cleaned
        propagate(stop)


def test_propagate_raises_interrupted_when_the_restored_handler_returns() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        stop = StopRequest()
        with catch_signals(stop):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
        assert seen == []  # caught inside: the caller's handler was not called then
        with pytest.raises(Interrupted) as err:
            propagate(stop)
        assert seen == [signal.SIGTERM] and err.value.signal_name == "SIGTERM"
    finally:
        signal.signal(signal.SIGTERM, previous)
    propagate(StopRequest())  # no signal: nothing happens
