"""The manifest layer: one JSONL line in, a validated :class:`ManifestRow` (or that line's error) out.

``rows`` the row schema and per-field checks · ``reader`` a file or the API's objects read as rows ·
``lines`` one line's JSON decoding · ``stream`` the file in chunks, texts normalized ahead
(``text_pool``, ``text_cache``) · ``text_check`` validate's plan of each text as the LLM reads it.
Above the frontend (validation asks its normalizer), below the engine (which runs rows).
"""

from cosyclone.manifest.reader import iter_manifest, read_manifest, rows_from_dicts
from cosyclone.manifest.rows import Manifest, ManifestRow, check_id, id_key

__all__ = [
    "Manifest",
    "ManifestRow",
    "check_id",
    "id_key",
    "iter_manifest",
    "read_manifest",
    "rows_from_dicts",
]
