"""An export's target: one export at a time, built beside the old one and swapped in only when whole.

Why: readers glob a target's shards (``load_dataset("parquet", data_files=...)``), so a target must
never hold half of a new export or a mix of two. An export takes ``.<name>.lock`` beside the target
(an ``flock``: the kernel drops it when its holder dies, so a killed export leaves no stale lock),
writes everything into ``.<name>.new-<pid>`` beside it, writes the marker ``export.json`` last, and
swaps the two folders in one ``renameat2(RENAME_EXCHANGE)`` (Linux); where that call is missing, by
two renames, the old folder parked as ``.<name>.old-<pid>`` between them and put back by the next
export should a kill fall in that gap. A failed or killed export leaves the old target as it was;
its staging folder is removed by the next export of that target (which holds the lock, so no live
export owns it).

A target is accepted before anything is touched, the lock included: it is new (its parent must
exist), empty, or an earlier export of cosyclone (its marker present). Anything else (a folder of the
user's holding a ``README.md`` or a ``manifest.jsonl``, a file, ``/``) is refused, so an export never
removes a file it did not write. Files in an earlier export that its marker does not list (notes of
one's own, whatever their names) are carried into the new one (hard links, else copies); one whose
name the new export writes itself refuses the export. A target holding folders is refused, as not an
export's.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cosyclone.base.atomic import fsync_dir
from cosyclone.errors import CosycloneError
from cosyclone.folder import layout as runfolder

MARKER = "export.json"  # what the export holds; written last, so its presence means the export is whole
CARD_NAME = "README.md"  # the dataset card a Parquet or WebDataset export writes (listed in no marker)


class ExportBusy(CosycloneError):
    """Another ``cosyclone export`` is writing the same target."""


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where the call is missing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a))


class ExportTarget:
    """The lock, the staging folder and the swap of one export target (a context manager)."""

    def __init__(self, target: Path) -> None:
        self.target = Path(os.path.abspath(target))
        self.parent, name = self.target.parent, self.target.name
        self.lock_path = self.parent / f".{name}.lock"
        self.staging = self.parent / f".{name}.new-{os.getpid()}"
        self._lock_fd: int | None = None
        self._committed = False

    def __enter__(self) -> ExportTarget:
        accept(self.target)  # before the lock: a refused target leaves nothing behind
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise runfolder.OutputFolderError(
                f"cannot create {self.lock_path}: {exc.strerror or exc}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            raise ExportBusy(
                f"{self.target} is being written by another cosyclone export ({holder or 'pid ?'}): "
                "wait for it to finish, or give another --to"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        self._lock_fd = fd
        try:
            self._recover()
            self._check_target()
            self.staging.mkdir()
        except OSError as exc:
            self._release()
            raise runfolder.OutputFolderError(
                f"cannot prepare {self.staging}: {exc.strerror or exc}"
            ) from exc
        except BaseException:
            self._release()
            raise
        return self

    def _recover(self) -> None:
        """Leftovers of dead exports of this target (the lock is ours: none is alive)."""
        name = re.escape(self.target.name)
        for path in sorted(self.parent.iterdir()):
            if re.match(rf"^\.{name}\.old-\d+$", path.name):
                if not self.target.exists():  # killed between the two renames: the old export goes back
                    os.replace(path, self.target)
                else:
                    shutil.rmtree(path, ignore_errors=True)
            elif re.match(rf"^\.{name}\.new-\d+$", path.name):
                shutil.rmtree(path, ignore_errors=True)

    def _check_target(self) -> None:
        accept(self.target)  # again under the lock: another process may have changed it meanwhile

    def foreign(self) -> list[Path]:
        """The old target's entries that its export did not write (carried into the new one)."""
        if not self.target.is_dir():
            return []
        marker = read_marker(self.target) or {}
        ours = {MARKER, *_listed(marker)}
        if marker.get("format") in ("parquet", "webdataset"):
            ours.add(CARD_NAME)
        return [p for p in sorted(self.target.iterdir()) if p.name not in ours]

    def commit(self, marker: Mapping[str, Any]) -> None:
        """Carry the user's files over, write the marker, and swap the staging folder in."""
        try:
            for path in self.foreign():
                _carry(path, self.staging / path.name)
            runfolder.write_bytes_atomic(self.staging / MARKER, (json.dumps(
                marker, ensure_ascii=False, indent=1) + "\n").encode())
            fsync_dir(self.staging)
            if not self.target.exists():
                os.replace(self.staging, self.target)
            elif not _exchange(self.staging, self.target):
                parked = self.parent / f".{self.target.name}.old-{os.getpid()}"
                os.replace(self.target, parked)
                os.replace(self.staging, self.target)
                self.staging = parked
            fsync_dir(self.parent)
        except FileExistsError as exc:
            raise CosycloneError(
                f"{self.target}: your file {Path(exc.filename or '').name} has the name of a file this "
                "export writes; move it aside and export again (the earlier export is kept)"
            ) from None
        except OSError as exc:
            raise runfolder.OutputFolderError(f"cannot put the export in place at {self.target}: "
                                              f"{exc.strerror or exc}") from exc
        self._committed = True

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # the flock goes with it
            self._lock_fd = None

    def __exit__(self, *exc: object) -> None:
        # the new export unfinished, or the old one swapped out
        shutil.rmtree(self.staging, ignore_errors=True)
        self._release()


def read_marker(target: Path) -> dict[str, Any] | None:
    """A target's ``export.json`` (None: no whole export there)."""
    with contextlib.suppress(OSError, ValueError):
        obj = json.loads((Path(target) / MARKER).read_text())
        if isinstance(obj, dict):
            return obj
    return None


def _listed(marker: Mapping[str, Any]) -> set[str]:
    """The file names an export's marker lists as its own."""
    shards = marker.get("shards")
    return {str(s["file"]) for s in shards if isinstance(s, dict) and "file" in s} if isinstance(
        shards, list) else set()


def accept(target: Path) -> None:
    """Refuse a target an export may not write: it must be new (its parent existing), empty, or an earlier
    export (its marker present), and hold no folders."""
    if not target.exists() and not target.is_symlink():
        if not target.parent.is_dir():
            raise CosycloneError(f"--to {target}: its parent folder {target.parent} does not exist; make it "
                                 "first (an export makes no folders but its own)")
        return
    if target.is_symlink() or not target.is_dir():
        raise CosycloneError(f"--to {target} is not a folder: give a new or empty folder, or an earlier "
                             "export's")
    try:
        entries = sorted(p.name for p in target.iterdir())
    except OSError as exc:
        raise CosycloneError(f"--to {target}: cannot list it ({exc.strerror or exc})") from None
    if not entries:
        return
    if read_marker(target) is None:
        raise CosycloneError(
            f"--to {target} holds files ({', '.join(entries[:3])}{' ...' if len(entries) > 3 else ''}) and "
            f"no {MARKER}: it is not an earlier export, and an export writes over nothing it did not write; "
            "give a new or empty folder"
        )
    folders = [n for n in entries if (target / n).is_dir() and not (target / n).is_symlink()]
    if folders:
        raise CosycloneError(f"--to {target} holds folders ({', '.join(folders[:3])}) that no export wrote: "
                             "give an empty or new folder, or an earlier export's")


def _carry(path: Path, dst: Path) -> None:
    """One of the user's entries into the new export: a hard link (a link or a FIFO as itself), else a copy;
    FileExistsError when the new export wrote a file of that name."""
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "exists", str(path))
    try:
        os.link(path, dst, follow_symlinks=False)
    except OSError:
        if path.is_symlink():
            os.symlink(os.readlink(path), dst)
        else:
            shutil.copy2(path, dst, follow_symlinks=False)
