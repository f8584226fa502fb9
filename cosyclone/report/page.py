"""The page's HTML: one file, its style inline, no script, every text escaped.

Why no script: the page is read on a laptop long after the run, from a file: URL, by whatever
browser is there; plain HTML with ``<img>`` plots and ``<audio>`` players needs nothing to run,
so nothing can fail or reach the network (the icon is an empty data: URI, so not even that is
fetched).
"""

from __future__ import annotations

import html
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cosyclone.report.audio import AudioSource
from cosyclone.report.history import RunLine
from cosyclone.report.outliers import Outlier
from cosyclone.report.plots import Plot
from cosyclone.report.target import GENERATOR

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1320px;padding:16px 24px;color:#222}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top}th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(460px,1fr));gap:12px}
figure{margin:0;border:1px solid #eee;padding:6px}figure img{width:100%;height:auto}
figcaption{font-size:12px;color:#555}.wide{grid-column:1/-1}
.rows{display:grid;grid-template-columns:repeat(auto-fill,minmax(460px,1fr));gap:12px}
.row{border:1px solid #ddd;border-radius:6px;padding:8px 12px}.row h3{font-size:15px;margin:0 0 4px}
.why span{display:inline-block;background:#fde2c8;border-radius:3px;padding:0 6px;margin:0 4px 4px 0;
font-size:12px}.text{margin:2px 0}.label{color:#777;font-size:12px}.players{display:flex;gap:12px}
.players div{flex:1}audio{width:100%}.figs{font-size:12px;color:#444}.note{color:#a33;font-size:12px}
"""


@dataclass(frozen=True)
class Card:
    """A listed row as the page shows it."""

    id: str  # the row's id
    folder: str  # the folder its record is in
    why: tuple[str, ...]  # why it is listed
    text: str  # the manifest's text
    normalized: str  # what the LLM read
    stop_reason: str  # the talker's stop reason(s)
    transcript: str  # what eval's ASR heard ("" without eval)
    figures: tuple[tuple[str, str], ...]  # (label, value) pairs
    output: AudioSource  # the row's audio
    prompt: AudioSource  # the prompt's audio
    meta: str  # the record's meta, as JSON ("" without)


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def table(
    header: Sequence[str] | None, rows: Iterable[Sequence[object]], *, numeric: set[int] | None = None
) -> str:
    """An HTML table; cells escaped, ``numeric`` columns right-aligned."""
    num = numeric or set()
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>")
    for row in rows:
        cells = "".join(
            f"<td class=n>{esc(c)}</td>" if i in num else f"<td>{esc(c)}</td>" for i, c in enumerate(row)
        )
        out.append(f"<tr>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def history_table(runs: Sequence[RunLine], *, several: bool) -> str:
    if not runs:
        return "<p>No runs.jsonl in the folders.</p>"
    header = (["folder"] if several else []) + [
        "started (UTC)",
        "shard",
        "done",
        "failed",
        "skipped",
        "rows/s",
        "audio-s/s",
        "device",
        "talker",
        "peak memory",
        "bound by",
        "stopped by",
    ]
    rows = [
        ([r.folder] if several else [])
        + [
            r.started,
            r.shard,
            r.done,
            r.failed,
            r.skipped,
            f"{r.rows_per_s:.3f}",
            f"{r.audio_s_per_s:.3f}",
            r.device,
            r.talker,
            r.peak_memory,
            r.bound_by,
            r.stopped_by,
        ]
        for r in runs
    ]
    first = 1 if several else 0
    return table(header, rows, numeric={first + i for i in (2, 3, 4, 5, 6)})


def eval_tables(evals: Mapping[str, Mapping[str, Any]]) -> str:
    parts = []
    for folder, summary in evals.items():
        metrics = summary.get("metrics") or {}
        rows = [
            (name, s.get("n"), *(_num(s.get(k)) for k in ("mean", "p10", "p50", "p90")))
            for name, s in metrics.items()
            if isinstance(s, dict) and s.get("n")
        ]
        pooled = summary.get("pooled") or {}
        parts.append(
            f"<h3>eval of {esc(folder)}</h3><p>{esc(summary.get('scored'))} rows scored, "
            f"{esc(summary.get('failing'))} failing its thresholds; pooled WER "
            f"{esc(_num(pooled.get('wer')))}, CER {esc(_num(pooled.get('cer')))}</p>"
        )
        parts.append(table(("metric", "n", "mean", "p10", "p50", "p90"), rows, numeric={1, 2, 3, 4, 5}))
    return "\n".join(parts)


def _num(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else "-"


def plot_grid(plots: Sequence[Plot]) -> str:
    figs = []
    for p in plots:
        wide = " class=wide" if p.key == "sampler" else ""
        figs.append(
            f'<figure id="plot-{esc(p.key)}"{wide}><img class=plot alt="{esc(p.title)}" '
            f'src="{p.uri}"><figcaption>{esc(p.caption)}</figcaption></figure>'
        )
    return '<div class="plots">' + "\n".join(figs) + "</div>"


OUTLIERS_SHOWN = 200  # outlier lines the page lists (the redo manifest holds every flagged row)


def outlier_table(outliers: Sequence[Outlier], ids: Sequence[str], redo_name: str) -> str:
    if not outliers:
        return f"<p>No row lies outside the folder's spread ({esc(redo_name)} is empty).</p>"
    rows = [
        (ids[o.index], o.label, f"{o.value:.3g}", f"{o.excess:+.1f}", o.meaning)
        for o in outliers[:OUTLIERS_SHOWN]
    ]
    more = f" The {OUTLIERS_SHOWN} most extreme:" if len(outliers) > OUTLIERS_SHOWN else ""
    return (
        f"<p>{len(outliers)} flagged ({len(set(ids[o.index] for o in outliers))} rows), all written as a "
        f"redo manifest: <code>cosyclone synth {esc(shlex.quote(redo_name))} --out OUT</code>.{more}</p>"
        + table(("id", "measure", "value", "IQRs past the fence", "suggests"), rows, numeric={2, 3})
    )


def _player(label: str, src: AudioSource) -> str:
    note = f"<div class=note>{esc(src.note)}</div>" if src.note else ""
    if src.src is None:
        return f"<div><span class=label>{esc(label)}</span>{note}</div>"
    return (
        f'<div><span class=label>{esc(label)}</span><audio controls preload="metadata" '
        f'src="{esc(src.src)}"></audio>{note}</div>'
    )


def card(c: Card) -> str:
    why = "".join(f"<span>{esc(w)}</span>" for w in c.why)
    figs = " · ".join(f"{esc(k)} {esc(v)}" for k, v in c.figures)
    lines = [
        f'<div class="row" id="row-{esc(c.id)}"><h3>{esc(c.id)}</h3><div class=why>{why}</div>',
        f"<div class=text><span class=label>text</span> {esc(c.text)}</div>",
        f"<div class=text><span class=label>normalized</span> {esc(c.normalized)}</div>",
    ]
    if c.transcript:
        lines.append(f"<div class=text><span class=label>ASR heard</span> {esc(c.transcript)}</div>")
    lines.append(f"<div class=figs>stop: {esc(c.stop_reason)} · {figs}</div>")
    if c.meta:
        lines.append(f"<div class=figs>meta: {esc(c.meta)}</div>")
    lines.append(f"<div class=players>{_player('output', c.output)}{_player('prompt', c.prompt)}</div></div>")
    return "\n".join(lines)


def render(
    *,
    title: str,
    totals: str,
    evals: str,
    history: str,
    plots: str,
    outliers: str,
    cards: Sequence[Card],
    failed: str,
    footer: str,
) -> str:
    """The whole page."""
    body = "\n".join(card(c) for c in cards) or "<p>No ok row to listen to.</p>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
{GENERATOR}
<link rel="icon" href="data:,"><style>{STYLE}</style></head>
<body><h1>{esc(title)}</h1>
<h2 id="totals">Totals</h2>{totals}{evals}
<h2 id="runs">Run history</h2>{history}
<h2 id="plots">Plots</h2>{plots}
<h2 id="outliers">Outliers without ASR</h2>{outliers}
<h2 id="listen">Rows to listen to ({len(cards)})</h2><div class="rows">{body}</div>
<h2 id="failed">Failed rows</h2>{failed}
<footer><p class=label>{esc(footer)}</p></footer>
</body></html>
"""
