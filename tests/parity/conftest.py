"""Parity tests read the reference vectors through the one resolver, ``tests/reference.py``.

``VECTORS`` (the vectors root) and ``load_vector_set`` stay importable from here for the parity
modules; new code should import them from ``tests.reference``.
"""

from __future__ import annotations

from tests.reference import load_vector_set, reference_set, vectors_dir

VECTORS = vectors_dir()

__all__ = ["VECTORS", "load_vector_set", "reference_set"]
