"""The page's plots: matplotlib (Agg, no display) rendered to SVG and carried as ``data:`` URIs.

Why histograms only: 100,000 rows drawn as points make an SVG of megabytes that a browser chews on; their
histogram is a few dozen bars, drawn in milliseconds whatever the row count. The outlier limits of
:mod:`cosyclone.report.outliers` are drawn on the measures they screen, so the plot shows why a row is listed.
matplotlib is the optional extra ``pip install -e '.[report]'`` (from the checkout).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from cosyclone.base.fences import Fences
from cosyclone.errors import CosycloneError
from cosyclone.report.figures import SAMPLER_EVENTS, Figures, FloatArray

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

BINS = 60  # bars per histogram
SIZE = (6.4, 3.2)  # inches of one plot (at the page's width, two sit side by side)


@dataclass(frozen=True)
class Plot:
    """One rendered plot: its title, a caption and the image as a data: URI."""

    key: str  # a stable name (the page's anchor)
    title: str  # what it shows
    caption: str  # how many rows it counts, and what the lines are
    uri: str  # data:image/svg+xml;base64,...


def _figure() -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=SIZE, layout="constrained")
    return fig, fig.add_subplot()


def _uri(fig: Figure) -> str:
    from matplotlib import rc_context

    buf = io.BytesIO()
    with rc_context({"svg.fonttype": "none"}):  # text as text (the reader's sans-serif), not glyph outlines
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _finite(values: FloatArray) -> FloatArray:
    return values[np.isfinite(values)]


def histogram(
    key: str,
    title: str,
    xlabel: str,
    values: FloatArray,
    *,
    spread: Fences | None = None,
    log_y: bool = False,
) -> Plot | None:
    """A histogram of the finite ``values`` (None when there are none); ``spread`` draws its limits."""
    x = _finite(values)
    if x.size == 0:
        return None
    fig, ax = _figure()
    ax.hist(x, bins=BINS, color="#4c78a8")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("rows")
    if log_y:
        ax.set_yscale("log")
    caption = f"{x.size} rows; median {np.median(x):.3g}"
    limits = spread.limits() if spread is not None else None
    if spread is not None and limits is not None:
        ax.axvline(spread.median, color="#333333", linewidth=1)
        for edge in limits:
            ax.axvline(edge, color="#d62728", linestyle="--", linewidth=1)
        outside = int(((x < limits[0]) | (x > limits[1])).sum())
        caption += f"; red: outlier limits {limits[0]:.3g} and {limits[1]:.3g} ({outside} rows outside)"
    ax.set_title(title)
    return Plot(key, title, caption, _uri(fig))


def stage_plot(figures: Figures) -> Plot | None:
    """Each stage's seconds per row, one outline per stage on a shared log axis."""
    series = {k: _finite(v) for k, v in figures.stage_seconds.items()}
    series = {k: v[v > 0] for k, v in series.items() if (v > 0).any()}
    if not series:
        return None
    fig, ax = _figure()
    lo = min(float(v.min()) for v in series.values())
    hi = max(float(v.max()) for v in series.values())
    edges = np.geomspace(lo, hi if hi > lo else lo * 10, BINS).tolist()
    for stage, v in series.items():
        ax.hist(v, bins=edges, histtype="step", linewidth=1.5, label=f"{stage} (median {np.median(v):.3g} s)")
    ax.set_xscale("log")
    ax.set_xlabel("seconds per row")
    ax.set_ylabel("rows")
    ax.legend(fontsize="small")
    ax.set_title("Seconds per row, by stage")
    rows = max(v.size for v in series.values())
    return Plot(
        "stages",
        "Seconds per row, by stage",
        f"{rows} rows; wall seconds each stage spent on a row",
        _uri(fig),
    )


def sampler_plot(figures: Figures) -> Plot:
    """Sampler events: the rows with each kind (bars) and the events per affected row (histogram)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(SIZE[0] * 2, SIZE[1]), layout="constrained")
    bars, hist = fig.subplots(1, 2)
    labels = [label for _, label in SAMPLER_EVENTS]
    rows = [int((figures.events[name] > 0).sum()) for name, _ in SAMPLER_EVENTS]
    calls = [int(figures.events[name].sum()) for name, _ in SAMPLER_EVENTS]
    pos = np.arange(len(labels))
    bars.bar(pos - 0.2, rows, width=0.4, label="rows", color="#4c78a8")
    bars.bar(pos + 0.2, calls, width=0.4, label="steps", color="#f58518")
    bars.set_xticks(pos, labels, fontsize="small")
    if max(calls) >= 100:  # the steps dwarf the rows
        bars.set_yscale("log")
        bars.set_ylim(bottom=0.5)  # a kind with a single row still shows
    bars.legend(fontsize="small")
    bars.set_title("Sampler events, totals")
    total = figures.event_total
    hit = total[total > 0]
    if hit.size:
        top = int(hit.max())
        edges = (np.arange(0.5, top + 1.5) if top <= BINS else np.linspace(0.5, top + 0.5, BINS + 1)).tolist()
        hist.hist(hit, bins=edges, color="#f58518")
        hist.set_yscale("log")
        hist.set_ylim(bottom=0.5)
    else:
        hist.text(0.5, 0.5, "no row had a sampler event", ha="center", va="center", transform=hist.transAxes)
    hist.set_xlabel("events per row (rows with any)")
    hist.set_ylabel("rows")
    hist.set_title("Sampler events per row")
    caption = ", ".join(
        f"{label} {r} rows / {c} steps" for label, r, c in zip(labels, rows, calls, strict=True)
    )
    return Plot("sampler", "Sampler events", caption, _uri(fig))


def all_plots(figures: Figures, spreads: dict[str, Fences]) -> list[Plot]:
    """Every plot the folder's figures allow, in the page's order."""
    try:
        import matplotlib  # noqa: F401  (Figure objects draw with Agg: no display, no global state)
    except ImportError:  # the optional extra is missing
        raise CosycloneError("report --html draws with matplotlib: from the cosyclone checkout, "
                             "pip install -e '.[report]'") from None
    ok = figures.ok
    made: Sequence[Plot | None] = (
        histogram("duration", "Duration", "seconds of audio", figures.duration[ok]),
        histogram(
            "chars_per_s",
            "Characters per second of audio",
            "characters / s",
            figures.chars_per_s[ok],
            spread=spreads.get("chars_per_s"),
        ),
        histogram(
            "tokens_per_text_token",
            "Speech tokens per text token",
            "speech tokens / text token",
            figures.tokens_per_text_token[ok],
            spread=spreads.get("tokens_per_text_token"),
        ),
        stage_plot(figures),
        histogram("error_rate", "WER / CER (eval)", "error rate", figures.error_rate[ok]),
        histogram(
            "similarity",
            f"Speaker similarity (eval, {figures.evals.backend})",
            "cosine similarity",
            figures.similarity[ok],
        ),
        histogram("dnsmos", "DNSMOS OVRL (eval)", "DNSMOS P.835 overall (1..5)", figures.dnsmos[ok]),
        sampler_plot(figures),
    )
    return [p for p in made if p is not None]
