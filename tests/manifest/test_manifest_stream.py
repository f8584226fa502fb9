"""The manifest read as a stream: texts from the content cache, normalized on a pool, same rows and errors.

Pinned: a second dry run normalizes nothing (a spy on the real ``_normalize``), a changed text is
normalized again and only it, entries are keyed by content (new ids, same texts: nothing
normalized), a corrupt entry or cache file is ignored and recomputed, errors name their manifest
lines across chunk boundaries exactly as one pass over the file does, and the pool gives what one
process gives.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from cosyclone.frontend.normalize import get_normalizer
from cosyclone.manifest import read_manifest, text_cache, text_pool
from cosyclone.manifest import stream as manifest_stream
from cosyclone.manifest.rows import _REFUSED, BIDI_CONTROLS

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["It costs $5.20, or 3 pounds.", "Meet me at 10:30 pm, room 12.", "今天是2024年3月15日。",
         "Chapter 7, page 256.", "The quick brown fox jumps over 2 lazy dogs!"]


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test its own cache file, and a normalizer whose memo does not remember earlier tests."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("COSYCLONE_CACHE_DIR", str(cache))
    monkeypatch.delenv("COSYCLONE_TEXT_CACHE", raising=False)
    _forget()
    return cache


def _forget() -> None:
    """What a new process would not know: the normalizer's memo (the cache file stays)."""
    norm = get_normalizer("wetext")
    with norm._lock:
        norm._memo.clear()
        norm._memo_chars = 0
    norm.overlay = {}




def write(folder: Path, rows: list[dict[str, Any]], raw_lines: dict[int, str] | None = None) -> Path:
    """``folder/m.jsonl`` of ``rows`` (one per line; ``raw_lines`` puts text verbatim at 0-based
    positions)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "prompts").exists():
        shutil.copytree(ROOT / "manifests" / "prompts", folder / "prompts")
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    for at, text in sorted((raw_lines or {}).items()):
        lines.insert(at, text)
    path = folder / "m.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def rows_of(texts: list[str], prefix: str = "r") -> list[dict[str, Any]]:
    return [
        {
            "id": f"{prefix}{i}",
            "prompt_audio": f"prompts/speaker{i % 3 + 1}.wav",
            "prompt_text": "reference words",
            "text": t,
        }
        for i, t in enumerate(texts)
    ]


def summary(m: Any) -> tuple[list[Any], list[tuple[int | None, str | None, str]], int]:
    return ([(r.line, r.id, r.text, r.mode, r.prompt_audio) for r in m.rows],
            [(e.line, e.field, str(e)) for e in m.errors], m.total_lines)


def test_second_dry_run_normalizes_nothing(tmp_path: Path, normalized: list[str],
                                           tiny_model_dir: Path) -> None:
    from cosyclone.run.job import SynthJob

    path = write(tmp_path / "m", rows_of(TEXTS))
    first = SynthJob.open(path, tmp_path / "out", model_dir=tiny_model_dir, device="cpu").plan()
    assert sorted(normalized) == sorted(t.strip() for t in TEXTS)  # each text normalized once, for real
    normalized.clear()
    _forget()
    second = SynthJob.open(path, tmp_path / "out", model_dir=tiny_model_dir, device="cpu").plan()
    assert normalized == []
    assert second == first
    cache = text_cache.text_cache_for(get_normalizer("wetext"))
    assert cache is not None and cache.hits >= len(TEXTS)


def test_a_changed_text_alone_is_normalized_again(tmp_path: Path, normalized: list[str]) -> None:
    read_manifest(write(tmp_path / "m", rows_of(TEXTS)))
    changed = [*TEXTS[:2], "Now it costs $7.50.", *TEXTS[3:]]
    normalized.clear()
    _forget()
    m = read_manifest(write(tmp_path / "m", rows_of(changed)))
    assert normalized == ["Now it costs $7.50."]
    assert [r.text for r in m.rows] == changed


def test_entries_are_keyed_by_content_not_by_id_or_line(tmp_path: Path, normalized: list[str]) -> None:
    read_manifest(write(tmp_path / "a", rows_of(TEXTS, prefix="a")))
    normalized.clear()
    _forget()
    renamed = list(reversed(rows_of(TEXTS, prefix="other-")))  # new ids, other lines, another folder
    m = read_manifest(write(tmp_path / "b", renamed))
    assert normalized == []
    assert [r.id for r in m.rows] == [r["id"] for r in renamed]
    db = sqlite3.connect(tmp_path / "cache" / text_cache.CACHE_NAME)
    # one entry per text, not per row
    assert db.execute("SELECT count(*) FROM norm").fetchone()[0] == len(TEXTS)


def test_a_corrupt_entry_is_ignored_and_recomputed(tmp_path: Path, normalized: list[str]) -> None:
    texts = ["I have 2 cats.", "Hello there."]
    path = write(tmp_path / "m", rows_of(texts))
    read_manifest(path)
    db = sqlite3.connect(tmp_path / "cache" / text_cache.CACHE_NAME)
    db.execute("UPDATE norm SET text = '...'")  # nothing to speak, were it believed; its checksum fails
    db.commit()
    db.close()
    normalized.clear()
    _forget()
    m = read_manifest(path)
    assert sorted(normalized) == sorted(texts)  # recomputed, not believed
    assert [r.text for r in m.rows] == texts and m.errors == []
    assert get_normalizer("wetext").normalize("I have 2 cats.").text == "I have two cats."
    normalized.clear()
    _forget()
    read_manifest(path)  # and written back sound
    assert normalized == []


def test_a_cache_file_that_is_not_a_database_is_set_aside(tmp_path: Path, normalized: list[str]) -> None:
    path = write(tmp_path / "m", rows_of(TEXTS[:2]))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / text_cache.CACHE_NAME).write_bytes(b"not a database at all" * 100)
    text_cache._CACHES.clear()
    m = read_manifest(path)
    assert len(m.rows) == 2 and sorted(normalized) == sorted(TEXTS[:2])
    assert list((tmp_path / "cache").glob(f"{text_cache.CACHE_NAME}.corrupt-*"))


def test_errors_name_their_lines_across_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = rows_of([*TEXTS, "...", "Fine again 3."])
    rows.append({**rows[1], "text": "A duplicate id, found in a later chunk."})
    path = write(tmp_path / "m", rows, raw_lines={2: "{not json", 4: "", 7: '{"id": "x", "id": "y"}'})
    whole = summary(read_manifest(path))  # one chunk
    _forget()
    monkeypatch.setattr(manifest_stream, "CHUNK_LINES", 2)
    chunked = summary(read_manifest(path))
    assert chunked == whole
    lines = {(line, field) for line, field, _ in chunked[1]}
    # file lines: 1 r0, 2 r1, 3 bad JSON, 4 r2, 5 blank, 6 r3, 7 r4, 8 duplicate keys, 9 "...", 10 r6, 11 dup
    # id
    assert lines == {(3, None), (8, "id"), (9, "text"), (11, "id")}
    assert "first used on line 2" in next(msg for line, _, msg in chunked[1] if line == 11)
    assert [r[0] for r in chunked[0]] == [1, 2, 4, 6, 7, 10]


def test_the_stream_reads_the_lines_splitting_the_file_gives(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b"\xef\xbb\xbfa\r\n\n  \nb\r\r\nc")
    assert list(manifest_stream.iter_lines(path)) == [(1, b"a"), (4, b"b\r"), (5, b"c")]


def check_pool_equals_serial(tmp: str) -> None:
    """The pool's results equal one process's, text by text and for a whole manifest (run by the test
    below in a fresh interpreter: the pool forks only while no other Python thread runs)."""
    import os

    tmp_path = Path(tmp)
    texts = [
        f"{t} Row {i}, {i * 37} items at {i % 12 + 1}:{i % 50 + 10}." for i in range(40) for t in TEXTS[:1]
    ]
    texts += ["今天是2024年3月15日，第1名。", "two  spaces 5", "item #3 and x\n\ny"]
    pool = text_pool.NormalizePool("wetext", workers=2)
    try:
        futures = pool.submit(texts)
        assert futures and not pool.broken  # really forked workers
        parallel = pool.gather(futures)
    finally:
        pool.close()
    assert parallel == text_pool.normalize_serial(get_normalizer("wetext"), texts)
    assert len(parallel) == len(texts)
    # and a whole manifest read with the pool equals one read without it
    path = write(tmp_path / "m", rows_of([*texts, "...", "😀 😀."]))
    os.environ["COSYCLONE_TEXT_CACHE"] = "0"
    os.environ["COSYCLONE_TEXT_WORKERS"] = "1"
    serial = summary(read_manifest(path))
    _forget()
    os.environ["COSYCLONE_TEXT_WORKERS"] = "2"
    text_pool.MIN_POOL_TEXTS = 1
    submitted: list[int] = []
    real_submit = text_pool.NormalizePool.submit

    def counting(self: text_pool.NormalizePool, batch: Any) -> Any:
        out = real_submit(self, batch)
        submitted.append(len(out))
        return out

    text_pool.NormalizePool.submit = counting  # type: ignore[method-assign,assignment]
    assert summary(read_manifest(path)) == serial
    assert submitted and all(submitted)  # the pool really ran
    assert len(serial[1]) == 2  # the two rows with nothing to speak


def test_the_pool_gives_what_one_process_gives(tmp_path: Path) -> None:
    """In a fresh interpreter, where the pool really forks (in this one, threads an earlier test left
    running would make it fall back to this process, and the comparison could not fail)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = (
        "from tests.manifest.test_manifest_stream import check_pool_equals_serial; "
        f"check_pool_equals_serial({str(tmp_path)!r})"
    )
    env = {**os.environ, "COSYCLONE_CACHE_DIR": str(tmp_path / "cache")}
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=900
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_refused_characters_pattern_matches_the_character_rules() -> None:
    for code in range(0x110000):
        refused = (
            0xD800 <= code <= 0xDFFF
            or (code < 0x20 and chr(code) not in "\t\n")
            or 0x7F <= code <= 0x9F
            or code in BIDI_CONTROLS
        )
        assert (_REFUSED.search(chr(code)) is not None) == refused, hex(code)
