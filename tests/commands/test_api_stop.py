"""Ctrl-C in the Python API (a notebook's interrupt is SIGINT): the call cleans up first, then the
interrupt goes on as KeyboardInterrupt, and the process's own handlers are back as they were.

``synth_folder`` stops as ``cosyclone synth`` does (rows in flight finish, the accounts are written,
the lock released); ``synthesize_rows`` drops its rows at once, and the loaded model still works.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cosyclone import CosyClone
from tests.run.test_graceful_stop import assert_folder_whole
from tests.run.test_runfolder import journal_lines, write_manifest

OPTIONS = {"device": "cpu", "max_tokens": 6, "n_timesteps": 1}


def interrupt_when(ready: Callable[[], bool]) -> threading.Thread:
    """SIGINT this process (its main thread gets it, as from Ctrl-C) once ``ready()`` holds."""
    def send() -> None:
        t0 = time.time()
        while not ready() and time.time() - t0 < 120:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_ctrl_c_in_synth_folder_writes_the_accounts_then_raises_keyboard_interrupt(tiny_model_dir: Path,
                                                                                  tmp_path: Path) -> None:
    tts = CosyClone(tiny_model_dir, **OPTIONS)
    manifest, out = write_manifest(tmp_path, 40), tmp_path / "out"
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    sender = interrupt_when(lambda: (out / ".cosyclone").is_dir() and journal_lines(out) >= 2)
    with pytest.raises(KeyboardInterrupt):
        tts.synth_folder(manifest, out, batch_size=4)
    sender.join()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    done = assert_folder_whole(out)  # records, files and metadata agree; no lock, no journal
    assert 2 <= len(done) < 40
    last = json.loads((out / "summary.json").read_text())["last_run"]
    assert last["stopped_by"] == "SIGINT" and last["done"] == len(done)

    summary = tts.synth_folder(manifest, out, batch_size=4)  # the resume, on the same loaded model
    assert summary.exit_code == 0 and summary.last_run.skipped == len(done)
    assert sorted(d["id"] for d in assert_folder_whole(out)) == [f"r{i:02d}" for i in range(40)]


def test_ctrl_c_in_synthesize_rows_drops_the_rows_and_the_model_still_works(tiny_model_dir: Path,
                                                                          tmp_path: Path) -> None:
    # rows of 400 tokens each: the 30 take some 15 s, the interrupt comes after 1
    tts = CosyClone(tiny_model_dir, device="cpu", max_tokens=400, min_tokens=400, n_timesteps=1, batch_size=2)
    prompt = str(Path(__file__).resolve().parents[2] / "manifests" / "prompts" / "speaker1.wav")
    rows = [{"id": f"u{i}", "prompt_audio": prompt, "prompt_text": "reference words",
             "text": f"sentence number {i} of many."} for i in range(30)]
    before = signal.getsignal(signal.SIGINT)
    started = time.monotonic()
    sender = interrupt_when(lambda: time.monotonic() - started > 1.0)
    with pytest.raises(KeyboardInterrupt):
        tts.synthesize_rows(rows)
    interrupted = time.monotonic() - started
    sender.join()
    assert interrupted < 4  # the rows in flight were dropped at once
    assert signal.getsignal(signal.SIGINT) == before
    one = tts.synthesize("hello again.", prompt_audio=prompt, prompt_text="reference words")
    # the engine's session was closed cleanly
    assert one.ok and one.audio is not None and one.tokens == (400,)
