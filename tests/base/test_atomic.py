"""The one atomic write: the target holds the old bytes or the new, never a part, and a failed write
leaves no temporary behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cosyclone.base.atomic import tmp_name, write_atomic


def test_bytes_and_chunks_replace_the_target_whole(tmp_path: Path) -> None:
    target = tmp_path / "f.jsonl"
    target.write_bytes(b"old\n")
    write_atomic(target, b"new\n")
    assert target.read_bytes() == b"new\n"
    write_atomic(target, (f"{i}\n".encode() for i in range(3)))
    assert target.read_bytes() == b"0\n1\n2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.jsonl"]


def test_a_write_that_fails_midway_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "f.jsonl"
    target.write_bytes(b"old\n")

    def chunks() -> Iterator[bytes]:
        yield b"half"
        raise RuntimeError("the producer failed")

    with pytest.raises(RuntimeError, match="producer"):
        write_atomic(target, chunks())
    assert target.read_bytes() == b"old\n"
    assert not tmp_name(target).exists() and sorted(p.name for p in tmp_path.iterdir()) == ["f.jsonl"]


def test_an_exclusive_write_neither_follows_nor_removes_what_lies_at_its_temporary(tmp_path: Path) -> None:
    target, private = tmp_path / "page.html", tmp_path / "private"
    private.write_bytes(b"secret")
    tmp_name(target).symlink_to(private)  # planted where the temporary would go
    with pytest.raises(FileExistsError):
        write_atomic(target, b"page", exclusive=True)
    assert private.read_bytes() == b"secret" and tmp_name(target).is_symlink() and not target.exists()


def test_a_write_that_is_not_durable_still_replaces_whole(tmp_path: Path) -> None:
    target = tmp_path / "seg.cch"
    write_atomic(target, [b"a", b"b"], durable=False)
    assert target.read_bytes() == b"ab" and sorted(p.name for p in tmp_path.iterdir()) == ["seg.cch"]
