"""A trace written down: one JSONL file (every step, every layer call) and a short terminal table.

The file's first line is the verdict (``"kind": "verdict"``), then one line per segment, per draw
(``"kind": "step"``) and, with ``--layers``, per layer call (``"kind": "layer"``), each tagged with
the replay it belongs to (``"replay": "row"``, or ``"compare"`` for a ``--dtype`` or
``--nonfinite-policy`` replay beside it). The terminal shows the verdict and the steps that matter:
the first few, the first non-finite one, the first divergence and the last.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cosyclone.folder.layout import write_bytes_atomic
from cosyclone.trace.probes import LayerFacts, StepFacts
from cosyclone.trace.replay import Replay
from cosyclone.trace.verdict import Divergence, Verdict

SHOWN_FIRST = 6  # steps shown from the start of each segment


@dataclass(frozen=True)
class Trace:
    """Everything one ``cosyclone trace`` found."""

    row_id: str
    source: str  # where the row came from: "OUT/diagnostics.jsonl line 3" or "manifest.jsonl line 3"
    replay: Replay  # the row as it was made
    verdict: Verdict
    compare: Replay | None = None  # the same row under --dtype / --nonfinite-policy
    compare_label: str = ""  # what the comparison changed ("dtype fp32")
    divergence: Divergence | None = None  # where the two part


def lines(trace: Trace) -> Iterator[dict[str, Any]]:
    """The JSON objects of the trace file, verdict first."""
    v = trace.verdict
    head: dict[str, Any] = {"kind": "verdict", "id": trace.row_id, "source": trace.source, **asdict(v),
                            "options": _opts(trace.replay), "stage_dtypes": trace.replay.stage_dtypes}
    if trace.compare is not None:
        head["compare"] = {"changed": trace.compare_label, "options": _opts(trace.compare),
                           "stage_dtypes": trace.compare.stage_dtypes,
                           "divergence": asdict(trace.divergence) if trace.divergence else None}
    yield head
    for name, rep in (("row", trace.replay), ("compare", trace.compare)):
        if rep is None:
            continue
        for seg in rep.segments:
            yield {"kind": "segment", "replay": name, "segment": seg.segment, "text": seg.text,
                   "layout": dict(seg.layout), "tokens": list(seg.tokens), "stop_reason": seg.stop_reason}
            for s in seg.steps:
                yield {"kind": "step", "replay": name, "segment": seg.segment, **asdict(s)}
            for c in seg.layers:
                yield {"kind": "layer", "replay": name, "segment": seg.segment, **asdict(c)}
        for c in rep.code2wav_layers:
            yield {"kind": "layer", "replay": name, "segment": None, **asdict(c)}


def write(trace: Trace, path: Path) -> Path:
    """The trace file, written whole (a rerun replaces it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(obj, ensure_ascii=False, allow_nan=False, default=str) + "\n"
                   for obj in lines(trace))
    write_bytes_atomic(path, text.encode())
    return path


def _opts(rep: Replay) -> dict[str, Any]:
    o = rep.opts
    return {"dtype": o.dtype, "device": o.device, "nonfinite_policy": o.nonfinite_policy, "draw": o.draw,
            "seed": o.seed, "max_tokens": o.max_tokens, "top_k": o.top_k, "top_p": o.top_p}


def verdict_lines(trace: Trace) -> list[str]:
    """The verdict in a few lines, as the terminal shows it first."""
    v, rep = trace.verdict, trace.replay
    res = rep.result
    out = [f"cosyclone trace: row {trace.row_id!r} ({trace.source}); {rep.opts.dtype} on {rep.opts.device}, "
           f"nonfinite-policy {rep.opts.nonfinite_policy}, seed {res.seed}"]
    made = f"tokens {list(res.tokens)}, stop {list(res.stop_reasons)}, {res.status}"
    if v.reproduced is None:
        out.append(f"replayed: {made} (no record to compare with)")
    elif v.reproduced:
        out.append(f"reproduced: yes ({made}; sampler counters equal)")
    else:
        out.append(f"reproduced: NO ({made}); differs from the record in: {', '.join(v.mismatches)}")
    out.append(f"audio: {v.audio}")
    b = v.talker_break
    if b is None:
        layers = ", every traced layer finite)" if rep.segments and rep.segments[0].layers else ")"
        out.append("first non-finite: none (every logit finite" + layers)
    else:
        at = f" at position {b.position} ({b.part})" if b.position is not None else ""
        step = "step 0 (the prompt's pass)" if b.step == 0 else f"step {b.step}"
        out.append(f"first non-finite: segment {b.segment} {step}, {b.where}{at}: {b.detail}")
    if v.flat is not None:
        seg, at_step, value = v.flat
        out.append(f"flat logits: from segment {seg} step {at_step} every logit is {value:g}, so the draws "
                   "are uniform though nothing is NaN (a hidden state whose square overflows a norm is "
                   "zeroed: --layers shows each layer's abs max)")
    if v.audio_break:
        out.append(f"first non-finite in code2wav: {v.audio_break}")
    out.append(f"touched: {v.touched}")
    if v.sharing is not None:
        s = v.sharing
        out.append(f"shared: same prompt {s.same_prompt[1]} of {s.same_prompt[0]} rows non-finite, same text "
                   f"{s.same_text[1]} of {s.same_text[0]}, folder {s.folder[1]} of {s.folder[0]}")
    if trace.compare is not None and trace.divergence is not None:
        d = trace.divergence
        numbers = ("the same logits at every step" if d.numbers_step is None else
                   f"logits first differ at segment {d.numbers_segment} step {d.numbers_step} "
                   f"(max |difference| {_num(d.max_abs_diff)})")
        draws = ("the same draws at every step" if d.step is None else
                 f"first diverging draw at segment {d.segment} step {d.step}: {d.a} vs {d.b}")
        out.append(f"compare ({trace.compare_label}): {draws}; {numbers}")
    return out


def step_table(trace: Trace) -> list[str]:
    """The steps that matter, one line each (both replays side by side when comparing)."""
    brk, div = trace.verdict.talker_break, trace.divergence
    comparing = trace.compare is not None
    rows = ["seg step  token  top id:p        logits [min, max]      NaN  +inf  -inf  events"
            + ("   | compare token" if comparing else "")]
    for k, seg in enumerate(trace.replay.segments):
        other = trace.compare.segments[k].steps \
            if trace.compare is not None and k < len(trace.compare.segments) else ()
        n = max(len(seg.steps), len(other))
        keep = set(range(min(SHOWN_FIRST, n)))
        for mark in (brk, div):
            if mark is not None and mark.segment == seg.segment and mark.step is not None:
                keep |= {mark.step - 1, mark.step, mark.step + 1}
        keep.add(n - 1)
        last = -1
        for step in sorted(k for k in keep if 0 <= k < n):
            if step > last + 1:
                rows.append("  ...")
            mine = _step_line(seg.segment, seg.steps[step]) if step < len(seg.steps) else \
                f"{seg.segment:>3} {step:>4}  ended"
            if comparing:
                mine = f"{mine:<88}| " + (_token(other[step]) if step < len(other) else "ended")
            rows.append(mine)
            last = step
    return rows


def layer_table(calls: Sequence[LayerFacts], call: int) -> list[str]:
    """Each traced layer's output at one call (the step the verdict names)."""
    rows = [f"layers at step {call}: name  abs max  finite"]
    rows += [f"  {c.name:<10} {_num(c.absmax):>10}  {'yes' if c.finite else f'NO ({c.nonfinite})'}"
             for c in calls if c.call == call]
    return rows


def _step_line(segment: int, s: StepFacts) -> str:
    top = f"{s.top[0][0]}:{s.top[0][1]:.3g}" if s.top else "-"
    rng = f"[{_num(s.logit_min)}, {_num(s.logit_max)}]"
    flags = (("fallback", s.ras_fallback), ("sole-restore", s.ras_sole_restore),
             ("min-len", s.min_len_suppressed))
    events = ",".join(name for name, on in flags if on)
    return (f"{segment:>3} {s.step:>4}  {_token(s):>5}  {top:<14} {rng:<22} {s.nan:>4} {s.posinf:>5} "
            f"{s.neginf:>5}  {events or '-'}")


def _token(s: StepFacts) -> str:
    return "ABORT" if s.aborted else ("stop" if s.stop else str(s.token))


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"
