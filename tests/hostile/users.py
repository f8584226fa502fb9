"""Commands run as an unprivileged user, for the hostile cases where a permission is the point.

As root (CI): the child process drops to ``nobody`` (uid/gid 65534, no groups; the user made with
``useradd`` when the system has none) before it runs (``setpriv``, else subprocess's ``user``), in
folders made world-readable under ``/tmp`` (pytest's own ``tmp_path`` is root's alone). As another user:
that user is already unprivileged, and a folder is made read-only with ``chmod``. Skipped only where
neither works (no root, and ``chmod`` does not stop this user).
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.run_folders import ROOT

NOBODY = 65534


def _ensure_nobody() -> None:
    try:
        pwd.getpwuid(NOBODY)
    except KeyError:
        subprocess.run(["useradd", "--uid", str(NOBODY), "--no-create-home", "--shell", "/usr/sbin/nologin",
                        "cosyclone-nobody"], check=True, capture_output=True)


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A temporary folder every user may read (and write into: 1777), removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="cosyclone-hostile-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        for p in [path, *path.rglob("*")]:  # a test may leave a folder read-only
            if p.is_dir() and not p.is_symlink():
                p.chmod(p.stat().st_mode | stat.S_IWUSR | stat.S_IXUSR)
        shutil.rmtree(path, ignore_errors=True)


def make_read_only(folder: Path) -> None:
    """``folder`` and everything in it read-only for the unprivileged user (root owns it; else chmod)."""
    for p in [folder, *folder.rglob("*")]:
        if p.is_symlink():
            continue
        mode = p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
        p.chmod(mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH | (0o111 if p.is_dir() else 0))
    if os.geteuid() != 0 and os.access(folder, os.W_OK):
        pytest.skip("this user can still write a read-only folder: no way to test as an unprivileged user")


def run_unprivileged(args: list[str], *, cwd: Path, timeout: float = 600,
                     code: str = "import sys; from cosyclone.cli import app; sys.argv[0] = 'cosyclone'; app()"
                     ) -> subprocess.CompletedProcess[str]:
    """``cosyclone ARGS`` (or Python ``code`` with ARGS) as an unprivileged user (nobody, where this is
    root), in ``cwd``."""
    who: dict[str, object] = {}
    prefix: list[str] = []
    if os.geteuid() == 0:  # the child drops to nobody before it runs: setpriv, else subprocess's own
        _ensure_nobody()
        if shutil.which("setpriv"):
            prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        else:
            who = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    home = cwd / "home"
    home.mkdir(exist_ok=True)
    home.chmod(0o1777)
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / "cache"),
           "MPLCONFIGDIR": str(home / "mpl"), "PYTHONPATH": str(ROOT)}
    return subprocess.run([*prefix, sys.executable, "-c", code, *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout, **who)  # type: ignore[call-overload]
