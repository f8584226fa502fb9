"""The dataset card (``README.md``) of a Parquet or WebDataset export: its features and splits.

Why: ``datasets`` infers a WebDataset's types from its first five rows, so a column null there (a
speaker only later rows have, an eval score of a stale row) breaks the load at the first row that
has a value. The card's YAML header states every column's type and each split's files, the way
the Hub does: ``datasets.load_dataset(TARGET)`` reads it (3.x to 5.x) and loads the export, splits
included, with exact types; the Hub shows the same card when the folder is uploaded. Written by
every export of these formats (a README.md of one's own in the target is replaced).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from cosyclone.folder.columns import Column, ColumnSet
from cosyclone.options import ExportFormat

CARD = "README.md"


def _dtype(column: Column, json_member: bool) -> list[str]:
    """The YAML lines of one column's feature (a uint64 in a JSON member is a string)."""
    kind = "string" if json_member and column.type == "uint64" else column.type
    if kind.startswith("list<"):
        return [f"sequence: {kind[5:-1]}"]
    return [f"dtype: {kind}"]


def _feature(name: str, body: list[str], indent: str) -> list[str]:
    return [f"{indent}- name: {json.dumps(name)}", *(f"{indent}  {line}" for line in body)]


def _audio(rate: int | None) -> list[str]:
    return ["dtype:", "  audio:", f"    sampling_rate: {rate}"] if rate else ["dtype: audio"]


def card(cols: ColumnSet, fmt: ExportFormat, *, sample_rate: int, audio_ext: str, prompt_ext: str | None,
         splits: Sequence[str], rows: dict[str, int], sizes: dict[str, int]) -> str:
    """The README.md of an export: YAML features, split sizes and data files, then a few lines for a reader.

    The split sizes (rows and bytes) are there for ``datasets``' cache too: it keys a folder's load
    by its card, so a re-export whose rows or bytes differ is read anew, not from the cache.
    """
    lines = ["---", "dataset_info:", "  features:"]
    if fmt == "parquet":
        lines += _feature("audio", _audio(sample_rate), "  ")
        if prompt_ext is not None:
            lines += _feature("prompt", _audio(None), "  ")
        for c in cols.columns:
            lines += _feature(c.name, _dtype(c, json_member=False), "  ")
        ext = ".parquet"
    else:
        lines += _feature(audio_ext.lstrip("."), _audio(sample_rate), "  ")
        if prompt_ext is not None:
            lines += _feature("prompt" + prompt_ext, _audio(None), "  ")
        lines += _feature("json", ["struct:"], "  ")
        for c in cols.columns:
            lines += _feature(c.name, _dtype(c, json_member=True), "    ")
        lines += _feature("__key__", ["dtype: string"], "  ") + _feature("__url__", ["dtype: string"], "  ")
        ext = ".tar"
    lines += ["  splits:"]
    for split in splits:
        lines += [f"  - name: {'train' if split == 'data' else split}", f"    num_bytes: {sizes[split]}",
                  f"    num_examples: {rows[split]}"]
    lines += [f"  download_size: {sum(sizes.values())}", f"  dataset_size: {sum(sizes.values())}"]
    lines += ["configs:", "- config_name: default", "  data_files:"]
    for split in splits:
        prefix = "data" if split == "data" else split
        lines += [f"  - split: {'train' if split == 'data' else split}", f"    path: \"{prefix}-*{ext}\""]
    lines += [
        "---",
        "",
        "# cosyclone export",
        "",
        f"Written by `cosyclone export --format {fmt}`: rows "
        + ", ".join(f"{'train' if k == 'data' else k} {v}" for k, v in rows.items())
        + f", audio at {sample_rate} Hz. `export.json` names the source folders and every row left out.",
        "",
        "```python",
        "import datasets",
        'ds = datasets.load_dataset("path/to/this/folder")',
        "```",
        "",
    ]
    return "\n".join(lines)
