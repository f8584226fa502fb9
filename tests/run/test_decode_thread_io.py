"""The thread that steps the talker only decodes: no file is opened, written, renamed, removed, listed
or stat'ed on it while it steps (issue 55).

A whole run (:class:`~cosyclone.run.job.SynthJob`: the streamed manifest in several parts, the
fingerprints, the writer, the index, the stage-0 token checkpoint) over stand-in stages, with every
file system call of the process recorded with its thread: Python's audit events (``open``,
``os.rename``, ``os.remove``, ``os.mkdir``, ``os.listdir``, ``os.scandir``...) and, since a stat or an
fsync raises none, ``os.stat``/``os.lstat``/``os.fsync`` wrapped for the test. Between the talker's
first and last decode window, none may come from the thread that polls it.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from cosyclone.folder.token_store import TokenStore
from cosyclone.manifest import stream as manifest_stream
from cosyclone.options import RunOptions
from cosyclone.run.job import SynthJob
from tests.stand_in_stages import Costs, FakeSession, StandInRunEngine

FILE_EVENTS = ("open", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.listdir", "os.scandir",
               "os.truncate", "os.chmod", "os.link", "os.symlink", "os.utime")


class Recorder:
    """Every file system call as (order, thread ident, what), while :attr:`on`."""

    def __init__(self) -> None:
        self.on = False
        self.calls: list[tuple[int, int, str]] = []
        self.order = itertools.count()
        self.polls: list[tuple[int, int]] = []  # (order, thread) of each decode window

    def note(self, what: str) -> None:
        if self.on:
            self.calls.append((next(self.order), threading.get_ident(), what))

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event in FILE_EVENTS:
            self.note(f"{event} {args[0] if args else ''}")

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kw: Any) -> Any:
            self.note(f"{name} {args[0] if args else ''}")
            return fn(*args, **kw)
        return wrapped

    def poll(self, session: FakeSession) -> None:
        self.polls.append((next(self.order), threading.get_ident()))


RECORDER = Recorder()
sys.addaudithook(RECORDER.audit)  # (an audit hook stays for the process: it records only while on)


def _inputs(tmp: Path, n: int) -> Path:
    prompts = tmp / "prompts"
    prompts.mkdir()
    for k in range(3):
        sf.write(prompts / f"p{k}.wav", np.zeros(1600, np.float32), 16000)
    manifest = tmp / "m.jsonl"
    lines = [{"id": f"r{i:04d}", "prompt_audio": str(prompts / f"p{i % 3}.wav"), "prompt_text": "ref",
              "text": f"row {i}"} for i in range(n)]
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return manifest


def test_no_file_write_or_stat_on_the_thread_that_steps_the_talker(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest_stream, "CHUNK_LINES", 40)  # several parts: their boundaries are crossed
    for name in ("stat", "lstat", "fsync"):
        monkeypatch.setattr(os, name, RECORDER.wrap(f"os.{name}", getattr(os, name)))
    rows = 200
    run_opts: dict[str, Any] = {"batch_size": 8, "code2wav_thread": True, "talker_slots": 16}
    # dummy: the stand-in engine reads no talker file
    model: dict[str, Any] = {"load_format": "dummy", "device": "cpu", "dtype": "fp32", "cpu_gemm": "aten",
                             "text_frontend": "none"}
    engine = StandInRunEngine(Costs(steps=3), RunOptions(cuda_graphs="off", **model, **run_opts),
                              on_poll=RECORDER.poll)
    puts: list[int] = []
    put = TokenStore.put
    def spy(self: TokenStore, *a: Any) -> None:
        puts.append(threading.get_ident())
        put(self, *a)

    monkeypatch.setattr(TokenStore, "put", spy)
    job = SynthJob.open(_inputs(tmp_path, rows), tmp_path / "out", loaded=engine, **model, **run_opts)
    RECORDER.on = True
    try:
        summary = job.run()
    finally:
        RECORDER.on = False

    assert summary.written == rows and not summary.failed and summary.write_error is None
    assert RECORDER.polls and puts, "the talker never stepped, or stored no tokens: the test proves nothing"
    talker = {t for _, t in RECORDER.polls}
    assert len(talker) == 1
    assert set(puts) == talker  # the tokens were handed over on the talker's thread, and written elsewhere
    first, last = RECORDER.polls[0][0], RECORDER.polls[-1][0]
    during = [what for order, t, what in RECORDER.calls if first <= order <= last and t in talker]
    assert during == []
    elsewhere = [what for order, t, what in RECORDER.calls if first <= order <= last and t not in talker]
    # the recorder saw the run's file calls, on other threads
    assert any(".cch" in w for w in elsewhere) and any(".wav" in w for w in elsewhere)
    assert not list((tmp_path / "out" / ".cosyclone" / "tokens").glob("*.cch"))  # every ok row's went
