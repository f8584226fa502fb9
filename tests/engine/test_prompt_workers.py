"""Prompt preparation off the critical path (``cosyclone/engine/prefetch.py``): the prompts of the rows
ahead run on worker threads with their own thread count, each distinct prompt once, a bad prompt
fails only its own row (inline, with its own message), and a run writes the same records and bytes
with the workers as without them."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from cosyclone.engine import RowResult
from cosyclone.engine.prefetch import PromptAhead
from cosyclone.frontend.prompt_cache import LRUCache
from cosyclone.manifest import ManifestRow

ROOT = Path(__file__).resolve().parents[2]


class _Frontend:
    """Computes a prompt's "features" from its name, noting where and with how many threads."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()

    def prompt_features(self, audio: Any, *, row_id: str | None = None) -> dict[str, torch.Tensor]:
        with self.lock:
            self.calls.append((str(audio), threading.current_thread().name, torch.get_num_threads()))
        if "bad" in str(audio):
            raise ValueError(f"row {row_id!r}: cannot read {audio}")
        return {"speech_token": torch.tensor([len(str(audio))]), "embedding": torch.ones(3)}


def _rows(prompts: list[str]) -> list[ManifestRow]:
    return [ManifestRow(line=i + 1, id=f"r{i}", prompt_audio=Path(p), prompt_text="", text="x")
            for i, p in enumerate(prompts)]


def test_each_prompt_is_prepared_once_on_the_workers_ahead_of_its_rows() -> None:
    fe = _Frontend()
    rows = _rows(["a.wav", "b.wav", "a.wav", "bad.wav", "b.wav", "c.wav", "a.wav", "d.wav"])
    batches = [rows[i:i + 2] for i in range(0, len(rows), 2)]
    ahead = PromptAhead(fe, batches, workers=2, threads=1, ahead_rows=4)
    try:
        ahead.keep_ahead(0)
        assert ahead.submitted == 6  # batch 0 and the 4 rows after it (whole batches)
        got = {}
        for k, batch in enumerate(batches):
            ahead.keep_ahead(k)
            for row in batch:
                got[row.id] = ahead.take(row)
    finally:
        ahead.close()
    assert sorted(c[0] for c in fe.calls) == ["a.wav", "b.wav", "bad.wav", "c.wav", "d.wav"]  # once each
    assert {c[1].split("_")[0] for c in fe.calls} == {"cosyclone-prompt"} and {c[2] for c in fe.calls} == {1}
    assert got["r3"] == (None, 0.0)  # the row computes it inline and fails there with its own message
    feats_a = [got[r][0] for r in ("r0", "r2", "r6")]
    assert all(torch.equal(f["speech_token"], torch.tensor([5])) for f in feats_a)
    feats_a[0]["embedding"].add_(1)  # each row gets its own copy: nothing one row does reaches another
    assert torch.equal(feats_a[1]["embedding"], torch.ones(3))
    charged = [got[r][1] > 0 for r in ("r0", "r2", "r6")]
    assert charged == [True, False, False]  # the compute time is charged to the first row only
    assert ahead.jobs == {}  # every job was taken by all its rows and forgotten


def test_a_row_not_submitted_ahead_computes_its_own_prompt() -> None:
    fe = _Frontend()
    rows = _rows(["a.wav", "b.wav"])
    ahead = PromptAhead(fe, [rows], workers=1, threads=1, ahead_rows=1)
    try:
        assert ahead.take(rows[0]) == (None, 0.0)  # nothing was submitted: the caller computes inline
    finally:
        ahead.close()
    assert fe.calls == []


def test_the_prompt_cache_computes_a_key_once_when_two_threads_miss_it_together() -> None:
    cache: LRUCache[int] = LRUCache(4)
    started, release = threading.Event(), threading.Event()
    computed: list[int] = []

    def slow() -> int:
        computed.append(1)
        started.set()
        release.wait(5)
        return 42

    out: list[int] = []
    first = threading.Thread(target=lambda: out.append(cache.get_or_compute("k", slow)))
    first.start()
    started.wait(5)
    def other() -> int:
        computed.append(2)
        return 7

    second = threading.Thread(target=lambda: out.append(cache.get_or_compute("k", other)))
    second.start()
    release.set()
    first.join(5)
    second.join(5)
    assert out == [42, 42] and computed == [1] and cache.stats() == {"hits": 1, "misses": 1, "entries": 1}


def test_a_failed_computation_lets_the_waiting_thread_compute_its_own() -> None:
    cache: LRUCache[int] = LRUCache(4)

    def boom() -> int:
        raise OSError("unreadable")

    with pytest.raises(OSError):
        cache.get_or_compute("k", boom)
    assert cache.get_or_compute("k", lambda: 3) == 3 and len(cache) == 1


class _SpyOnnx:
    """The loaded frontend's ONNX models, noting in ``where`` the thread of each speech-token call."""

    def __init__(self, onnx: Any, where: list[str]) -> None:
        self.onnx, self.where = onnx, where

    def speech_tokens(self, wave16: torch.Tensor) -> torch.Tensor:
        self.where.append(threading.current_thread().name)
        return self.onnx.speech_tokens(wave16)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.onnx, name)


def test_a_run_with_prompt_workers_writes_what_a_run_without_them_writes(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """Real tiny model: every row its own prompt file (so the prompts are the frontend's main cost),
    two workers: the ONNX models run on the workers, once per prompt content, and the records and
    WAV bytes equal a run that prepares everything inline."""
    import shutil

    from cosyclone.engine import Engine
    from cosyclone.manifest import rows_from_dicts
    from cosyclone.options import RunOptions

    for k in range(6):  # six files, three contents
        shutil.copy(ROOT / "manifests" / "prompts" / f"speaker{k % 3 + 1}.wav", tmp_path / f"p{k}.wav")
    rows = rows_from_dicts(
        [
            {
                "id": f"r{k}",
                "prompt_audio": str(tmp_path / f"p{k}.wav"),
                "prompt_text": "reference words",
                "text": f"Line number {k}.",
            }
            for k in range(6)
        ]
    ).rows
    engine = Engine.load(tiny_model_dir, RunOptions(device="cpu", max_tokens=6, n_timesteps=1, batch_size=2,
                                                    frontend_workers=2, frontend_threads=1))
    where: list[str] = []
    engine.stages.frontend.onnx = cast(Any, _SpyOnnx(engine.stages.frontend.onnx, where))
    engine.stages.frontend.prompt_cache._data.clear()

    def run(prefetch: bool) -> list[tuple[str, RowResult, bytes]]:
        # wall times differ
        return [(r.id, replace(r, seconds={}), b"" if r.audio is None else r.audio.tobytes())
                for r in engine.run(rows, prefetch=prefetch)]

    ahead = run(True)
    assert len(where) == 3 and all(w.startswith("cosyclone-prompt") for w in where), where
    assert engine.facts().sizing.frontend_workers == 2
    engine.stages.frontend.prompt_cache._data.clear()
    assert run(False) == ahead
