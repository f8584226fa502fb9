"""What the GPU check (``benchmarks/gpu_check.sh``) counts as a pass, in one place, and how it
says where two runs part.

Why a verdict apart from the parts themselves: a part's exit status alone let the check pass when
it proved nothing (every ``gpu`` test skipped, an end-to-end run with no decode step replayed as a
CUDA graph, a part that fell back to the CPU). The script applies these verdicts to what each part
left behind (its figures line, its pytest log) after it exits 0, so a part that "succeeded" without
evidence still reads FAIL; the parts apply the same functions to their own figures, so each tells
the truth when it runs alone too.

Why tokens before bytes: two runs that differ in one sampled token differ in every WAV byte after
it, so the first differing (row, step) is the finding and a byte count only its echo; where tokens
agree and bytes do not, the difference is numeric (a kernel, a stream, cuBLAS's workspace) and its
size (bytes, samples, largest sample difference) says how far.

Subcommands (each prints one ``VERDICT: PASS|FAIL ...`` line, exit 0 on PASS, 1 on FAIL)::

    python -m benchmarks.gpu_verdict decode FIGURES [--require-graphs]
    python -m benchmarks.gpu_verdict e2e FIGURES [--require-graphs]
    python -m benchmarks.gpu_verdict pytest LOG [--collect-only | --allow-skips]

Only the standard library (numpy where WAV samples are compared): it must start in well under a
second, as it runs inside the check's time budget.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Verdict = tuple[bool, str]


def token_difference(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]],
                     names: Sequence[str] | None = None) -> str | None:
    """Where two runs' token rows first part ("row r3 step 17: 1234 vs 1240"), None when equal.

    Rows are compared in order; ``names`` labels them (default: their index)."""
    label = list(names) if names is not None else [str(i) for i in range(max(len(a), len(b)))]
    if len(a) != len(b):
        return f"{len(a)} rows vs {len(b)}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        x, y = list(x), list(y)
        if x == y:
            continue
        step = next((k for k, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
        if step is None:
            return f"row {label[i]}: {len(x)} tokens vs {len(y)} (equal up to step {min(len(x), len(y))})"
        return f"row {label[i]} step {step}: {x[step]} vs {y[step]}"
    return None


def _pcm(data: bytes) -> tuple[bytes, bytes, str | None]:
    """(header, samples' bytes, numpy dtype) of a RIFF/WAVE file; dtype None when not PCM16/float32."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return b"", data, None
    pos, fmt, dtype = 12, None, None
    while pos + 8 <= len(data):
        cid, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
        if cid == b"fmt ":
            tag, bits = (
                struct.unpack("<H", data[pos + 8 : pos + 10])[0],
                struct.unpack("<H", data[pos + 22 : pos + 24])[0],
            )
            fmt = (tag, bits)
        elif cid == b"data":
            if fmt in ((1, 16), (0xFFFE, 16)):
                dtype = "<i2"
            elif fmt in ((3, 32), (0xFFFE, 32)):
                dtype = "<f4"
            return data[:pos + 8], data[pos + 8:pos + 8 + size], dtype
        pos += 8 + size + (size & 1)
    return b"", data, None


def wav_difference(a: bytes, b: bytes) -> str | None:
    """How far two WAV files' bytes differ, None when equal: bytes that differ, then (PCM16 or
    float32 WAVs) samples that differ and the largest sample difference."""
    if a == b:
        return None
    n = min(len(a), len(b))
    diff_bytes = sum(1 for x, y in zip(a[:n], b[:n], strict=True) if x != y) + abs(len(a) - len(b))
    first = next((i for i in range(n) if a[i] != b[i]), n)
    out = f"{diff_bytes} of {max(len(a), len(b))} bytes differ (first at byte {first})"
    (ha, sa, da), (hb, sb, db) = _pcm(a), _pcm(b)
    if da is None or da != db:
        return out + ("" if da == db else f"; sample formats {da} vs {db}")
    import numpy as np

    size = np.dtype(da).itemsize
    xa, xb = (
        np.frombuffer(sa[: len(sa) - len(sa) % size], da),
        np.frombuffer(sb[: len(sb) - len(sb) % size], db),
    )
    if ha[8:-4] != hb[8:-4]:  # beyond the two size fields
        out += "; headers differ"
    if len(xa) != len(xb):
        out += f"; {len(xa)} samples vs {len(xb)}"
    m = min(len(xa), len(xb))
    d = np.abs(xa[:m].astype(np.float64) - xb[:m].astype(np.float64))
    scale = " (of 32767)" if da == "<i2" else ""
    return (
        out + f"; {int((d > 0).sum())} of {m} samples differ, max |difference| {d.max() if m else 0:g}{scale}"
    )


def files_difference(a: Mapping[str, bytes], b: Mapping[str, bytes]) -> str | None:
    """Two runs' WAV files by name: missing names, then how many differ and by how much (the first
    one's :func:`wav_difference`); None when every file is equal."""
    if set(a) != set(b):
        return f"files differ by name: only in the first {sorted(set(a) - set(b))}, only in the second " \
               f"{sorted(set(b) - set(a))}"
    differ = [k for k in sorted(a) if a[k] != b[k]]
    if not differ:
        return None
    return f"{len(differ)} of {len(a)} WAVs differ; {differ[0]}: {wav_difference(a[differ[0]], b[differ[0]])}"


_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed|warnings?)\b")
_SINGULAR = {"errors": "error", "warnings": "warning"}


def pytest_counts(text: str) -> dict[str, int] | None:
    """The counts of pytest's last summary line ("1 failed, 5 passed, 2 skipped in 3.1s",
    "7/27 tests collected (20 deselected) in 1.2s", "no tests ran in 0.1s"), None when there is
    none (pytest never got that far)."""
    for line in reversed(text.splitlines()):
        line = line.strip(" =")
        if not re.search(r"\bin \d+(\.\d+)?s\b", line):
            continue
        collected = re.match(r"(\d+)(?:/\d+)? tests? collected", line)
        if not (collected or line.startswith("no tests ran") or _COUNT.search(line)):
            continue
        counts = {"collected": int(collected.group(1))} if collected else {}
        counts.update({_SINGULAR.get(m.group(2), m.group(2)): int(m.group(1)) for m in _COUNT.finditer(line)})
        return counts
    return None


def pytest_verdict(text: str, collect_only: bool = False, allow_skips: bool = False) -> Verdict:
    """A pytest part passes when tests ran and none failed or skipped (a skipped ``gpu`` test
    proves nothing); a collect-only run (the CPU dry run) when it selected at least one test.
    ``allow_skips`` (the optional parity part, whose files skip what the reference lacks): skips
    are reported, not failed, but some test must still have passed."""
    counts = pytest_counts(text)
    if counts is None:
        return False, "no pytest summary line in the log"
    said = ", ".join(f"{v} {k}" for k, v in counts.items())
    if collect_only:
        return (counts.get("collected", 0) > 0 and not counts.get("error"),
                said if counts.get("collected") else f"no test selected ({said or 'none collected'})")
    kinds = ("failed", "error", "xpassed") if allow_skips else ("failed", "error", "skipped", "xpassed")
    bad = {k: counts[k] for k in kinds if counts.get(k)}
    if bad:
        return (
            False,
            f"{said}: {', '.join(f'{v} {k}' for k, v in bad.items())} (a skipped test proves nothing)",
        )
    if not counts.get("passed"):
        return False, f"no test ran ({said or 'none selected'})"
    return True, said


def last_figures(path: str | Path, part: str) -> dict[str, Any] | None:
    """The last figures line of ``part`` in a figures.jsonl, None when the part left none."""
    found = None
    p = Path(path)
    for line in p.read_text().splitlines() if p.exists() else []:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("part") == part:
            found = rec
    return found


def decode_verdict(fig: Mapping[str, Any] | None, require_graphs: bool = True) -> Verdict:
    """The decode part passes when every batch decoded the same tokens eager and graphed and (where
    graphs are required) at least one step of every batch replayed a graph."""
    if not fig or not fig.get("ms_per_step"):
        return False, "the decode part left no figures"
    bad = []
    for b, row in fig["ms_per_step"].items():
        if not row.get("tokens_equal"):
            bad.append(
                f"batch {b}: graphs and eager decoded different tokens ({row.get('token_difference')})"
            )
        if require_graphs and not row.get("graphs_used"):
            bad.append(f"batch {b}: no decode step ran as a graph")
    if bad:
        return False, "; ".join(bad)
    return True, f"batches {', '.join(map(str, fig['ms_per_step']))}: tokens equal, graphs replayed"


def e2e_verdict(fig: Mapping[str, Any] | None, require_graphs: bool = True) -> Verdict:
    """The end-to-end part passes when every row came out, the frontend of the released geometry
    ran (its prompts/s measured: the night paid for the real frontend), the peak GPU memory stayed
    within the sizing plan (where measured: ``peak_vs_plan`` at most 1) and (where graphs are
    required) some decode steps replayed a CUDA graph and no capture failed."""
    if not fig:
        return False, "the e2e part left no figures"
    bad = []
    if not fig.get("rows") or fig.get("ok") != fig.get("rows"):
        bad.append(f"{fig.get('ok')}/{fig.get('rows')} rows ok {fig.get('errors') or ''}".strip())
    if not fig.get("frontend_prompts_per_s"):
        bad.append("the frontend of the released geometry did not run (no frontend prompts/s)")
    ratio = fig.get("peak_vs_plan")
    if ratio is not None and float(ratio) > 1.0:
        bad.append(f"peak GPU memory {fig.get('peak_reserved_gib')} GiB reserved is {float(ratio):.2f} "
                   f"of the sizing plan's {fig.get('plan_gib')} GiB")
    steps, total = fig.get("graph_steps"), fig.get("decode_steps")
    if require_graphs and not steps:
        bad.append(f"no decode step ran as a CUDA graph (graph steps {steps}/{total})")
    if require_graphs and fig.get("capture_errors"):
        bad.append(f"graph captures failed: {fig['capture_errors'][:2]}")
    if bad:
        return False, "; ".join(bad)
    plan = f", peak {float(ratio):.2f} of the plan" if ratio is not None else ""
    return True, (f"{fig['ok']}/{fig['rows']} rows, graph steps {steps}/{total}, "
                  f"frontend {fig['frontend_prompts_per_s']} prompts/s{plan}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("decode", "e2e", "pytest"))
    ap.add_argument("path", help="figures.jsonl (decode, e2e) or the part's log (pytest)")
    ap.add_argument(
        "--require-graphs", action="store_true", help="fail unless decode steps replayed CUDA graphs"
    )
    ap.add_argument("--collect-only", action="store_true", help="pytest ran --collect-only (the dry run)")
    ap.add_argument("--allow-skips", action="store_true", help="skipped tests do not fail (parity)")
    args = ap.parse_args(argv)
    if args.what == "pytest":
        text = Path(args.path).read_text(errors="replace") if Path(args.path).exists() else ""
        ok, why = pytest_verdict(text, args.collect_only, args.allow_skips)
    else:
        judge = decode_verdict if args.what == "decode" else e2e_verdict
        ok, why = judge(last_figures(args.path, args.what), args.require_graphs)
    print(f"VERDICT: {'PASS' if ok else 'FAIL'} {why}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
