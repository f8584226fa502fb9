"""Where cosyclone keeps what it can recompute: the user cache folder (file hashes, normalized texts).

``$COSYCLONE_CACHE_DIR``, else ``$XDG_CACHE_HOME/cosyclone``, else ``~/.cache/cosyclone``. Everything
there is advisory: deleting the folder only costs recomputation.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The user cache folder (not created here)."""
    env = os.environ.get("COSYCLONE_CACHE_DIR")
    return Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cosyclone"
