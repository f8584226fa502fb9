"""``cosyclone report OUT... --html PAGE``: read the folders once, write the page and its redo manifest.

The folders are merged as ``report`` merges them (shards of one dataset: the later attempt of an id
wins), so the page's totals are the table's.
Only the listed rows' audio is read; every other figure comes from the row records, eval's
records and ``runs.jsonl``. The folders are only read: the page and ``<page>.redo.jsonl`` are
the only files written, where :mod:`cosyclone.report.target` allows (never inside a run folder, never
over a file report did not write).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosyclone.base.version import __version__
from cosyclone.eval.summary import load_eval_summary
from cosyclone.export.rows import prompt_blob
from cosyclone.folder import layout as runfolder
from cosyclone.folder import totals as totals_mod
from cosyclone.folder.checked_read import audio_cap, read_checked
from cosyclone.folder.current import current_records
from cosyclone.folder.row_record import RowRecord
from cosyclone.report import page as html_page
from cosyclone.report.audio import Reader, sources
from cosyclone.report.figures import Figures, measure, normalized_text, read_eval, stop_reason
from cosyclone.report.history import read_history
from cosyclone.report.listing import Listed, select
from cosyclone.report.outliers import find_outliers, redo_bytes, redo_path_for
from cosyclone.report.target import check_page, check_redo, write_new

FAILED_SHOWN = 200  # failed rows the page lists by name (the totals count them all)


@dataclass(frozen=True)
class HtmlReport:
    """What ``--html`` wrote."""

    path: Path  # the page
    bytes: int  # its size
    rows: int  # rows in the merged folders
    listed: int  # rows to listen to
    plots: int  # plots drawn
    outliers: int  # rows flagged without ASR
    redo_path: Path  # their redo manifest
    seconds: float  # wall seconds to build it
    warnings: tuple[str, ...]  # ids found in two folders
    folders: tuple[Path, ...]  # the folders read

    def describe(self) -> list[str]:
        """The lines the command prints."""
        return [
            f"wrote {self.path}: {self.bytes / 1e6:.1f} MB, {self.rows} rows, {self.plots} plots, "
            f"{self.listed} rows to listen to, in {self.seconds:.1f} s",
            f"wrote {self.redo_path}: {self.outliers} outlier rows (cosyclone synth "
            f"{shlex.quote(str(self.redo_path))} --out "
            f"{shlex.quote(str(self.folders[0])) if len(self.folders) == 1 else 'OUT'} redoes them)",
        ]


def merge_records(folders: Sequence[Path]) -> tuple[dict[str, RowRecord], dict[str, Path], list[str]]:
    """The folders' current records as ``report`` merges shards: (id -> record, id -> its folder,
    warnings about ids in two folders); the later attempt of an id wins, a tie the folder named later."""
    merged: dict[str, RowRecord] = {}
    where: dict[str, Path] = {}
    warnings = []
    for folder in folders:
        for rid, rec in current_records(folder).items():
            if rid in merged:
                warnings.append(f"row {rid!r} is in {where[rid]} and {folder}: the later attempt counts")
                if rec.finished_at < merged[rid].finished_at:
                    continue
            merged[rid], where[rid] = rec, folder
    return merged, where, warnings


def _figures_of(figures: Figures, i: int) -> tuple[tuple[str, str], ...]:
    rec = figures.records[i]
    pairs = [
        ("duration", f"{figures.duration[i]:.2f} s"),
        ("chars/s", f"{figures.chars_per_s[i]:.3g}"),
        ("tokens/text token", f"{figures.tokens_per_text_token[i]:.3g}"),
        ("speech tokens", "+".join(str(t) for t in rec.tokens) or "0"),
    ]
    scored = figures.evals.rows.get(rec.id)
    if scored is not None:
        pairs += [
            ("WER", _fmt(scored.wer)),
            ("CER", _fmt(scored.cer)),
            ("similarity", _fmt(scored.similarity)),
            ("DNSMOS OVRL", _fmt(scored.dnsmos)),
        ]
        if scored.fails:
            pairs.append(("eval fails", "; ".join(scored.fails)))
    events = {name: int(counts[i]) for name, counts in figures.events.items() if counts[i]}
    if events:
        pairs.append(("sampler", ", ".join(f"{k} {v}" for k, v in events.items())))
    pairs.append(("seconds", ", ".join(f"{k} {v:.2f}" for k, v in rec.seconds.items()) or "-"))
    pairs.append(("seed", str(rec.seed)))
    return tuple(pairs)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _meta(rec: RowRecord) -> str:
    meta = getattr(rec, "meta", None)
    return json.dumps(meta, ensure_ascii=False, sort_keys=True) if meta else ""


def _cards(
    figures: Figures, listed: Sequence[Listed], where: Mapping[str, Path], page_dir: Path, *, link_audio: bool
) -> list[html_page.Card]:
    recs = [figures.records[item.index] for item in listed]
    outputs = [(runfolder.audio_path(where[rec.id], rec), _audio_reader(rec.samples)) for rec in recs]
    prompts = [(Path(rec.prompt_audio) if rec.prompt_audio else None, _prompt_reader(rec)) for rec in recs]
    audio = sources(outputs + prompts, page_dir, link_audio=link_audio)
    cards = []
    for k, (item, rec) in enumerate(zip(listed, recs, strict=True)):
        scored = figures.evals.rows.get(rec.id)
        cards.append(
            html_page.Card(
                id=rec.id,
                folder=str(where[rec.id]),
                why=item.why,
                text=rec.text,
                normalized=normalized_text(rec),
                stop_reason=stop_reason(rec),
                transcript=scored.transcript if scored else "",
                figures=_figures_of(figures, item.index),
                meta=_meta(rec),
                output=audio[k],
                prompt=audio[len(listed) + k],
            )
        )
    return cards


@functools.cache
def _audio_reader(samples: int | None) -> Reader:
    """A row's audio as its record allows: a regular file, no symlink, at most its samples' bytes."""
    return functools.partial(_read_audio, cap=audio_cap(samples))


def _read_audio(path: Path, *, cap: int) -> bytes:
    return read_checked(path, cap)


def _prompt_reader(rec: RowRecord) -> Reader:
    """The row's prompt, only when its bytes are the prompt the row was made from (its recorded hash)."""
    parts = rec.fingerprint_parts

    def read(path: Path) -> bytes:
        got = prompt_blob(str(path), parts)
        if isinstance(got, tuple):
            raise OSError(0, got[1].removeprefix(f"{path}: "), str(path))
        return got.data

    return read


def _totals_table(totals: Mapping[str, Any]) -> str:
    rows = [(label, _cell(totals.get(key))) for key, label in totals_mod.TABLE_ROWS]
    rows += [
        (k.replace("_", " "), _cell(v))
        for k, v in (totals.get("sampler") or {}).items()
        if k != "sampler_calls" and v
    ]
    return html_page.table(None, rows)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
    return "" if value is None else str(value)


def _failed_table(records: Sequence[RowRecord]) -> str:
    failed = [r for r in records if not r.ok]
    if not failed:
        return "<p>None.</p>"
    more = f"<p>The first {FAILED_SHOWN} of {len(failed)}.</p>" if len(failed) > FAILED_SHOWN else ""
    return more + html_page.table(
        ("id", "line", "reason", "error"),
        ((r.id, r.line, r.reason or "-", r.error or "-") for r in failed[:FAILED_SHOWN]),
    )


def _write_both(page: Path, data: bytes, redo_path: Path, redo: bytes) -> None:
    """The redo manifest, then the page; a new redo manifest is taken back when the page cannot be written."""
    existed = os.path.lexists(redo_path)
    write_new(redo_path, redo)
    try:
        write_new(page, data)
    except BaseException:
        if not existed:
            with contextlib.suppress(OSError):
                os.unlink(redo_path)
        raise


def write_html_report(folders: Sequence[Path], page: Path, *, link_audio: bool = False) -> HtmlReport:
    """Write ``page`` (and ``<page stem>.redo.jsonl`` beside it) for the merged ``folders``."""
    from cosyclone.report.plots import all_plots  # matplotlib: only when a page is asked for

    t0 = time.perf_counter()
    folders = [Path(f) for f in folders]
    page = Path(page)
    check_page(page, folders)
    redo_path = redo_path_for(page)
    check_redo(page, redo_path)
    records, where, warnings = merge_records(folders)
    totals = totals_mod.folder_totals(records.values())
    figures = measure(records.values(), read_eval(folders, records))
    outliers, spreads = find_outliers(figures)
    plots = all_plots(figures, spreads)
    listed = select(figures, outliers)
    cards = _cards(figures, listed, where, page.parent, link_audio=link_audio)
    evals = {str(f): e for f in folders if (e := load_eval_summary(f)) is not None}
    ids = [r.id for r in figures.records]
    title = "cosyclone report: " + ", ".join(str(f) for f in folders)
    text = html_page.render(
        title=title,
        totals=_totals_table(totals),
        evals=html_page.eval_tables(evals),
        history=html_page.history_table(read_history(folders), several=len(folders) > 1),
        plots=html_page.plot_grid(plots),
        outliers=html_page.outlier_table(outliers, ids, redo_path.name),
        cards=cards,
        failed=_failed_table(figures.records),
        footer=f"cosyclone {__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"audio {'linked relative to this page' if link_audio else 'embedded (Ogg Vorbis, 16 kHz)'}",
    )
    data = text.encode("utf-8")
    _write_both(page, data, redo_path, redo_bytes([figures.records[o.index] for o in outliers]))
    return HtmlReport(
        path=page,
        bytes=len(data),
        rows=len(figures.records),
        listed=len(cards),
        plots=len(plots),
        outliers=len({o.index for o in outliers}),
        redo_path=redo_path,
        seconds=time.perf_counter() - t0,
        warnings=tuple(warnings),
        folders=tuple(folders),
    )
