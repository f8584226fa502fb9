"""The dataset card (``README.md``) of a Parquet or WebDataset export: its features and splits.

Why: ``datasets`` infers a WebDataset's types from its first five rows, so a column null there (a
speaker only later rows have, an eval score of a stale row) breaks the load at the first row that
has a value. The card's YAML header states every column's type and each split's files, the way
the Hub does: ``datasets.load_dataset(TARGET)`` reads it (3.x to 5.x) and loads the export, splits
included, with exact types; the Hub shows the same card when the folder is uploaded. Written by
every export of these formats (a README.md of one's own in the target is replaced).

The card also says what made the rows (:func:`made_by`, from the run records of the runs that made the
exported rows): that they are synthetic speech, cosyclone's version, the talker, each model file's size
and SHA-256, the options and the model folder's licence, so a dataset passed on keeps its provenance.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cosyclone.folder.columns import Column, ColumnSet
from cosyclone.folder.layout import RUNS_NAME, iter_jsonl
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


def made_by(runs_of: Mapping[Path, Iterable[str | None]]) -> list[dict[str, Any]]:
    """What made the exported rows, once per distinct maker: each folder's ``runs.jsonl`` lines of the runs
    that made its rows (``runs_of``: folder -> the rows' ``run_id``), as ``{"provenance", "options", "output",
    "run_ids"}``; a run recorded before cosyclone stated provenance has ``provenance`` null."""
    makers: dict[str, dict[str, Any]] = {}
    for folder, ids in runs_of.items():
        wanted = {i for i in ids if i}
        for run in iter_jsonl(Path(folder) / RUNS_NAME):
            if run.get("run_id") not in wanted:
                continue
            made = {"provenance": run.get("provenance"), "options": run.get("options"),
                    "output": run.get("output")}
            key = json.dumps(made, sort_keys=True, default=str)
            makers.setdefault(key, {**made, "run_ids": []})["run_ids"].append(run["run_id"])
    return list(makers.values())


def _maker_lines(made: Mapping[str, Any]) -> list[str]:
    """One maker's section of the card: statement, talker, files, licence, options."""
    prov = made.get("provenance")
    runs = ", ".join(f"`{r}`" for r in made["run_ids"])
    if not isinstance(prov, Mapping):
        return [f"Runs {runs} were recorded before cosyclone stated provenance: their model files are "
                "not known here (their `runs.jsonl` lines hold `model_hash` and the options).", ""]
    lines = [f"Runs {runs}: {prov.get('statement')}.", "",
             f"- cosyclone: `{prov.get('cosyclone')}`", f"- talker: `{prov.get('llm')}`",
             f"- tagged audio files: {'yes' if prov.get('tagged') else 'no (--no-provenance-tag)'}", ""]
    files = prov.get("model_files") or []
    if files:
        lines += ["| model file | bytes | sha256 |", "|---|---|---|"]
        lines += [f"| `{f.get('file')}` | {f.get('bytes')} | `{f.get('sha256')}` |" for f in files]
        lines += [""]
    licence = prov.get("licence")
    if isinstance(licence, Mapping):
        ident = f" ({licence.get('id')})" if licence.get("id") else ""
        lines += [f"Model licence{ident}: `{licence.get('file')}` of the model folder, sha256 "
                  f"`{licence.get('sha256')}`. Whether these outputs may train or be sold is its to say.", ""]
        if licence.get("text"):
            text = str(licence["text"]).rstrip()
            lines += ["<details><summary>licence text</summary>", "", "```text", text, "```", "",
                      "</details>", ""]
    else:
        lines += ["The model folder held no licence file: see the model's own page for its terms.", ""]
    options = {"options": made.get("options"), "output": made.get("output")}
    lines += ["```json", json.dumps(options, indent=1, sort_keys=True, default=str), "```", ""]
    return lines


def provenance_section(makers: Sequence[Mapping[str, Any]]) -> list[str]:
    """The card's provenance: the synthetic-speech statement and what made the rows."""
    lines = ["## Provenance", "",
             "Every row is **synthetic speech** made by cosyclone (voice cloning with CosyVoice3), not a "
             "recording. Each audio file says so itself: a WAV's INFO chunk (`ICMT`), a FLAC's Vorbis "
             "`COMMENT`, which `soundfile` reads as `comment` (unless the run gave `--no-provenance-tag`). "
             "The `llm` and `run_id` columns name each row's talker and run.", ""]
    for made in makers:
        lines += _maker_lines(made)
    return lines


def card(cols: ColumnSet, fmt: ExportFormat, *, sample_rate: int, audio_ext: str, prompt_ext: str | None,
         splits: Sequence[str], rows: dict[str, int], sizes: dict[str, int],
         makers: Sequence[Mapping[str, Any]] = ()) -> str:
    """The README.md of an export: YAML features, split sizes and data files, then a few lines for a reader.

    The split sizes (rows and bytes) are there for ``datasets``' cache too: it keys a folder's load
    by its card, so a re-export whose rows or bytes differ is read anew, not from the cache.
    """
    lines = ["---", "tags:", "- synthetic-speech", "- cosyclone", "dataset_info:", "  features:"]
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
        *provenance_section(makers),
    ]
    return "\n".join(lines)
