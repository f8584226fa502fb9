"""The writer lock of a run folder: one writer per folder and shard, stale holders taken over."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cosyclone.errors import CosycloneError
from cosyclone.folder.layout import pid_alive, state_dir


class FolderBusy(CosycloneError):
    """Another live ``synth`` holds the folder (or this shard of it)."""


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks (Linux), to tell a reused pid from the holder."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _holder_alive(info: Mapping[str, Any]) -> bool:
    if info.get("host") != socket.gethostname():
        return True  # another host: cannot tell, so it holds
    pid = int(info.get("pid", -1))
    if pid <= 0 or not pid_alive(pid):
        return False
    ticks = info.get("start_ticks")
    return ticks is None or _start_ticks(pid) in (None, ticks)


class FolderLock:
    """One writer per folder and shard: ``.cosyclone/lock-<tag>.json`` created exclusively.

    A whole-manifest run (tag ``all``) and a shard run exclude each other (their rows overlap);
    two different shards share the folder. A lock whose holder is gone (same host, dead pid) is
    taken over; a holder on another host is respected (remove the file by hand if it is gone).
    """

    def __init__(self, out_dir: Path, tag: str, command: str) -> None:
        self.path = state_dir(out_dir) / f"lock-{tag}.json"
        self.tag, self.command, self._held = tag, command, False

    def _conflicts(self) -> Iterator[tuple[Path, dict[str, Any]]]:
        for path in sorted(self.path.parent.glob("lock-*.json")):
            other = path.name[len("lock-"):-len(".json")]
            if other != self.tag and "all" not in (other, self.tag):
                continue
            try:
                info = json.loads(path.read_text())
            except (OSError, ValueError):
                info = {}
            yield path, info

    def acquire(self) -> None:
        for path, info in self._conflicts():
            young = not info and time.time() - _mtime(path) < 10.0  # being written by a starter right now
            if young or (info and _holder_alive(info)):
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info.get("started", 0))))
                raise FolderBusy(f"{self.path.parent.parent} is being written by another cosyclone synth "
                                 f"(pid {info.get('pid')} on {info.get('host')}, started {when}, "
                                 f"{path.name}): wait for it, use another --out, or another --shard. If "
                                 f"that process is gone, remove {path}")
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # stale: its holder died on this host
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                "start_ticks": _start_ticks(os.getpid()), "command": self.command, "shard": self.tag}
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:  # lost a race to another starter
            raise FolderBusy(f"{self.path} was just taken by another cosyclone synth") from None
        with os.fdopen(fd, "w") as fh:
            json.dump(info, fh)
            fh.flush()
            os.fsync(fh.fileno())
        self._held = True

    def release(self) -> None:
        if self._held:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self._held = False

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()



def live_writers(out_dir: Path) -> list[dict[str, Any]]:
    """The lock files of the ``synth`` processes writing ``out_dir`` now (a holder on another host counts)."""
    held = []
    for path in sorted(state_dir(out_dir).glob("lock-*.json")):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and _holder_alive(info):
            held.append(info)
    return held
