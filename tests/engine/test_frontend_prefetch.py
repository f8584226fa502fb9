"""The frontend ahead of the talker: with prefetch, :meth:`cosyclone.engine.Engine.run` prepares the next
batch on a worker thread, and hands ``submit`` the same records and audio bytes, in the same order,
as without it; a row whose frontend raises fails alone, with the same record either way."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cosyclone.engine.outcome import EXCEPTION
from tests.engine_run import run as engine_run

if TYPE_CHECKING:
    from cosyclone.engine import RowResult

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["Hello there.", "A longer sentence, with a comma in it.", "Short.", "One more line to speak.",
         "Numbers like 42 get read.", "The end."]


@pytest.fixture(scope="module")
def tts(tiny_model_dir: Path):
    from cosyclone import CosyClone

    return CosyClone(tiny_model_dir, device="cpu", max_tokens=8, n_timesteps=2, batch_size=2)


Ran = list[tuple[str, "RowResult", bytes]]


class _Frontend:
    """The loaded frontend, noting in ``threads`` the thread of each ``prepare`` and failing the
    row ``boom`` there; anything else is the frontend's own."""

    def __init__(self, fe: Any, threads: set[str]) -> None:
        self.fe, self.threads = fe, threads

    def prepare(self, row_id: str, *args: Any, **kwargs: Any) -> Any:
        self.threads.add(threading.current_thread().name)
        if row_id == "boom":
            raise RuntimeError("frontend stub: cannot read this prompt")
        return self.fe.prepare(row_id, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fe, name)


def _run(tts: Any, prefetch: bool) -> tuple[Ran, set[str]]:
    threads: set[str] = set()
    stages = replace(tts.stages, frontend=_Frontend(tts.stages.frontend, threads))
    rows = tts.validate([{"id": "boom" if i == 3 else f"row{i}", "text": text,
                          "prompt_audio": str(ROOT / "manifests" / "prompts" / f"speaker{i % 3 + 1}.wav"),
                          "prompt_text": "reference words"} for i, text in enumerate(TEXTS)])
    got: list[tuple[str, RowResult, bytes]] = []

    def submit(rec: RowResult) -> None:
        # wall times differ
        got.append((rec.id, replace(rec, seconds={}), b"" if rec.audio is None else rec.audio.tobytes()))

    engine_run(stages, rows, tts.options, submit, prefetch=prefetch)
    return got, threads


def test_prefetch_gives_the_same_records_and_bytes(tts: Any) -> None:
    plain, plain_threads = _run(tts, False)
    ahead, ahead_threads = _run(tts, True)
    assert plain_threads == {threading.current_thread().name}
    assert ahead_threads and all(t.startswith("cosyclone-frontend") for t in ahead_threads)  # never inline
    assert [r for r, _, _ in ahead] == [r for r, _, _ in plain] and len(plain) == len(TEXTS)
    for (rid, d_plain, w_plain), (_, d_ahead, w_ahead) in zip(plain, ahead, strict=True):
        assert d_ahead == d_plain, rid
        assert w_ahead == w_plain, rid
    boom = next(d for r, d, _ in ahead if r == "boom")
    assert boom.status == "failed" and boom.reason == EXCEPTION
    assert "RuntimeError: frontend stub" in (boom.error or "") and "prepare" in (boom.traceback or "")
    assert sum(1 for _, d, w in ahead if d.ok and len(w) > 0) == len(TEXTS) - 1
