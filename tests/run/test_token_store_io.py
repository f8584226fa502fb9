"""The stage-0 token checkpoint off the decode thread (issue 55): puts queue for the store's own I/O
thread, lookups answer from the names listed once, removals go by name, a torn file is caught."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cosyclone.folder.token_store import TokenStore
from cosyclone.talker import TalkerResult


def _res(row: str, tokens: list[int]) -> TalkerResult:
    return TalkerResult(row_id=row, tokens=tokens, raw_tokens=tokens, stop_reason="eos")


def test_puts_are_written_by_the_io_thread_and_read_back_by_the_next_store(tmp_path: Path) -> None:
    root = tmp_path / "tokens"
    store = TokenStore(root, {"a": "k1", "b": "k2"})
    store.put("a", 0, _res("a", [1, 2]))
    store.put("a", 1, _res("a", [3]))
    store.put("b", 0, _res("b", [4]))
    assert store.get("a", 1) is not None  # queued or written: this run's own put is found
    store.close()
    assert sorted(p.name for p in root.iterdir()) == ["k1-0.cch", "k1-1.cch", "k2-0.cch"]

    again = TokenStore(root, {"a": "k1", "b": "k2", "c": "k3"})
    got = again.get("a", 1)
    assert got is not None and got.tokens == [3] and again.hits == 1
    assert again.get("c", 0) is None and again.get("a", 7) is None  # never stored: no file looked at
    again.discard("a")  # by name, segments 0, 1, ... until one is missing
    again.close()
    assert sorted(p.name for p in root.iterdir()) == ["k2-0.cch"]


def test_lookups_of_segments_never_stored_make_no_file_system_call(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store = TokenStore(tmp_path / "tokens", {"a": "k1"})
    calls: list[str] = []

    def spy(name: str) -> Any:
        real = getattr(os, name)

        def call(*a: Any, **kw: Any) -> Any:
            calls.append(name)
            return real(*a, **kw)
        return call

    for name in ("stat", "open"):
        monkeypatch.setattr(os, name, spy(name))
    assert store.get("a", 0) is None and store.get("zz", 0) is None
    assert calls == []
    monkeypatch.undo()
    store.close()


def test_a_torn_file_is_caught_by_its_checksum_and_prune_keeps_live_keys(tmp_path: Path) -> None:
    root = tmp_path / "tokens"
    store = TokenStore(root, {"a": "k1", "b": "k2"})
    store.put("a", 0, _res("a", [1, 2, 3]))
    store.put("b", 0, _res("b", [4]))
    store.close()
    data = (root / "k1-0.cch").read_bytes()
    (root / "k1-0.cch").write_bytes(data[: len(data) // 2])  # torn: no fsync, a crash mid-write
    (root / "old-0.cch").write_bytes(b"stray")
    again = TokenStore(root, {"a": "k1", "b": "k2"})
    assert again.get("a", 0) is None  # the talker runs again
    again.discard_done({"x": "k2"})  # a row done before this run: its leftover goes
    again.prune()
    again.close()
    assert sorted(p.name for p in root.iterdir()) == ["k1-0.cch"]  # k1 is live (its row is in flight)


def test_a_put_whose_row_went_down_before_the_io_thread_reached_it_is_never_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from cosyclone.base import handoff

    release, dumped = threading.Event(), []
    real = handoff.dumps

    def held(payload: Any) -> bytes:  # the I/O thread held on the first write, as one that lags
        dumped.append(payload["tokens"].tolist())
        release.wait(30)
        return real(payload)

    monkeypatch.setattr(handoff, "dumps", held)
    store = TokenStore(tmp_path / "tokens", {"a": "k1", "b": "k2"})
    store.put("a", 0, _res("a", [1]))
    store.put("b", 0, _res("b", [2]))
    store.discard("b")  # b's record went down while its put waited behind a's
    release.set()
    store.close()
    assert dumped == [[1]]
    assert sorted(p.name for p in (tmp_path / "tokens").iterdir()) == ["k1-0.cch"]
