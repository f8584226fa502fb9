"""A killed run leaves temporary files behind wherever it was writing (WAVs, the journal, the
stage-0 token checkpoint); the next run removes those of dead processes on this host, and only
those: a live writer's temporary and other files stay."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from cosyclone.folder import layout as runfolder
from cosyclone.folder.token_store import TokenStore
from cosyclone.talker import TalkerResult


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(proc.stdout)


def test_stale_temporaries_of_dead_writers_are_removed_everywhere(tmp_path: Path) -> None:
    host, dead = socket.gethostname(), _dead_pid()
    tokens = runfolder.state_dir(tmp_path) / runfolder.TOKEN_DIR
    store = TokenStore(tokens, {"a": "f00d"})
    store.put("a", 0, TalkerResult(row_id="a", tokens=[1, 2], raw_tokens=[1, 2], stop_reason="eos"))
    store.close()  # its I/O thread wrote it
    written = tokens / "f00d-0.cch"
    assert written.is_file() and not list(tokens.glob("*.tmp"))  # the put renamed its temporary
    stale = [
        tmp_path / "wavs" / f".a.wav.{host}.{dead}.tmp",
        runfolder.state_dir(tmp_path) / f".j.{host}.{dead}.tmp",
        tokens / f".f00d-1.cch.{host}.{dead}.tmp",
    ]
    live = tokens / f".f00d-2.cch.{host}.{os.getpid()}.tmp"  # this process is still writing it
    for p in [*stale, live]:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"torn")
    removed = runfolder.remove_stale_temporaries(tmp_path)
    assert sorted(removed) == sorted(stale)
    assert live.exists() and written.is_file()
    got = store.get("a", 0)
    assert (
        got is not None
        and got.tokens == [1, 2]
        and torch.equal(torch.tensor(got.raw_tokens), torch.tensor([1, 2]))
    )
