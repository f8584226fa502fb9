"""Read a synthesis output folder as eval sees it: the manifest's rows, their WAVs and their status.

Only the row records of the manifest's rows are read, found through the folder's index as synth
finds them (the latest record of an id wins, a line that does not parse is skipped), and the audio
file each names. The rows, their
order and their fields come from the manifest the user names, so eval needs no other file of the
folder and keeps working while the folder's bookkeeping evolves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosyclone.errors import CosycloneError, ManifestError
from cosyclone.folder.current import current_records, reading
from cosyclone.folder.layout import audio_path, flat_path, record_sources, wav_path
from cosyclone.folder.row_record import RowRecord
from cosyclone.manifest import ManifestRow, read_manifest

# Why a manifest row is not scored.
NOT_SYNTHESIZED = "not_synthesized"  # no diagnostics line for the id
SYNTH_FAILED = "synth_failed"  # its latest diagnostics line says the row failed
WAV_MISSING = "wav_missing"  # diagnostics say ok but the WAV is not there


@dataclass(frozen=True)
class FolderRow:
    """One valid manifest row and what the folder holds for it."""

    row: ManifestRow  # the validated manifest row (prompt_audio already absolute)
    raw: dict[str, Any]  # the manifest line's JSON object as written (for redo.jsonl)
    wav: Path  # the row's audio file (the one its record names, else where it would lie; may not exist)
    record: RowRecord | None  # the row's latest record (diagnostics.jsonl)
    skip: str | None  # None when the row is scored, else one of the reasons above

    @property
    def seed(self) -> int | None:
        """The seed that made the WAV (diagnostics), else the manifest's; None when neither says."""
        if self.record is not None and self.record.seed >= 0:
            return self.record.seed
        return self.row.seed


@dataclass
class Folder:
    """The rows of a manifest as found in one output folder."""

    out_dir: Path  # the synthesis output folder
    manifest: Path  # the manifest that names the rows
    rows: list[FolderRow] = field(default_factory=list)  # valid manifest rows, manifest order
    invalid: list[ManifestError] = field(default_factory=list)  # manifest lines rejected by validation
    unknown_ids: list[str] = field(default_factory=list)  # ids with diagnostics but not in the manifest


def read_folder(out_dir: str | Path, manifest: str | Path) -> Folder:
    """Pair every valid row of ``manifest`` with its WAV and latest status in ``out_dir``."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise CosycloneError(f"{out_dir}: output folder not found")
    m = read_manifest(manifest)
    # manifest lines end at \n only (as it is read)
    lines = Path(m.path).read_text(encoding="utf-8").split("\n")
    status = current_records(out_dir, [row.id for row in m.rows])  # looked up, not every record read
    folder = Folder(out_dir=out_dir, manifest=Path(m.path), invalid=list(m.errors))
    for row in m.rows:
        raw = json.loads(lines[row.line - 1])
        rec = status.get(row.id)
        wav = (audio_path(out_dir, rec) if rec is not None else None) or _unnamed(out_dir, row.id)
        if rec is None:
            skip: str | None = NOT_SYNTHESIZED
        elif not rec.ok:
            skip = SYNTH_FAILED
        elif not wav.is_file():
            skip = WAV_MISSING
        else:
            skip = None
        folder.rows.append(FolderRow(row=row, raw=raw, wav=wav, record=rec, skip=skip))
    known = {r.row.id for r in folder.rows}
    if record_sources(out_dir):
        with reading(out_dir) as index:
            folder.unknown_ids = [i for i in index.ids() if i not in known]  # streamed, in id order
    return folder


def _unnamed(out_dir: Path, row_id: str) -> Path:
    """Where a row's WAV lies when no record names it: an earlier version's flat place if it is there."""
    flat = flat_path(out_dir, row_id)
    return flat if flat.is_file() else wav_path(out_dir, row_id)
