"""Run folders for the tests: made without the model (records and audio files as a run leaves them,
through the real writer, with the row fields a test chooses), and read back as a test checks them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cosyclone.engine import RowResult
from cosyclone.engine.outcome import RowStatus
from cosyclone.folder import layout as runfolder
from cosyclone.folder.audio_out import AudioOutput
from cosyclone.folder.row_record import RowStamp
from cosyclone.folder.settle import settle
from cosyclone.folder.writer import BackgroundWriter, WriterOptions
from cosyclone.talker.diagnostics import StopReason

RATE = 24000
ROOT = Path(__file__).resolve().parents[1]  # the repository


@dataclass(frozen=True)
class Row:
    """One row to write: what the export should carry back."""

    id: str
    line: int
    seed: int = 7
    text: str = "words"
    status: RowStatus = "ok"
    meta: dict[str, Any] | None = None
    stop_reasons: tuple[StopReason, ...] = ("eos",)
    prompt_audio: str = "prompts/speaker1.wav"
    extra: dict[str, Any] = field(default_factory=dict)  # more record fields, written into the line


def tone(i: int, seconds: float = 0.2) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.4 * np.sin(2 * np.pi * (200 + 20 * i) * t)).astype(np.float32)


def write(out: Path, rows: list[Row], *, output: AudioOutput = AudioOutput()) -> None:
    """The rows through the writer (file first, then record), settled like a run's end; then each
    row's ``meta`` and ``extra`` fields written into its line, as a manifest's meta travels."""
    writer = BackgroundWriter(WriterOptions(out_dir=out, output=output), runfolder.journal_path(out, "all"))
    try:
        for r in rows:
            wav = tone(r.line) if r.status == "ok" else None
            result = RowResult(
                id=r.id,
                line=r.line,
                seed=r.seed,
                status=r.status,
                audio=wav,
                reason=None if r.status == "ok" else "exception",
                audio_seconds=0.0 if wav is None else wav.size / RATE,
                stop_reasons=r.stop_reasons,
                tokens=(25,) * len(r.stop_reasons),
            )
            stamp = RowStamp(
                fingerprint=None,
                fingerprint_parts=None,
                run_id="r",
                text=r.text,
                prompt_text="ref",
                prompt_audio=r.prompt_audio,
                mode="zero_shot",
                instruct="",
                speed=1.0,
                manifest="m.jsonl",
                shard=None,
            )
            writer.write_now(result, stamp)
    finally:
        writer.close()
    settle(out, "all")
    extra = {r.id: {**({"meta": r.meta} if r.meta is not None else {}), **r.extra} for r in rows}
    path = out / runfolder.DIAG_NAME
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    path.write_text(
        "".join(json.dumps({**x, **extra.get(x["id"], {})}, ensure_ascii=False) + "\n" for x in lines),
        encoding="utf-8",
    )


def metadata_lines(out: Path) -> dict[str, dict[str, Any]]:
    """id -> line of every ``metadata.jsonl`` in a folder (one per ``wavs/<shard>`` directory, and the root's
    for flat files), with ``file_name`` made relative to the folder."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(out).rglob(runfolder.METADATA_NAME)):
        for text in path.read_text(encoding="utf-8").splitlines():
            line = json.loads(text)
            line["file_name"] = (path.parent / line["file_name"]).relative_to(out).as_posix()
            found[line["id"]] = line
    return found


def diag_lines(out: Path) -> list[dict]:
    """Every diagnostics line that parses (a torn line from a kill is skipped, as resume does)."""
    found = []
    for raw in (out / "diagnostics.jsonl").read_text().splitlines():
        try:
            found.append(json.loads(raw))
        except json.JSONDecodeError:
            continue
    return found


def diags(out: Path) -> dict[str, dict]:
    return {d["id"]: d for d in diag_lines(out)}


def wav_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "wavs").rglob("*.wav"))}


def samples_per_token(model_dir: Path) -> int:
    """Audio samples one speech token becomes: token_mel_ratio mel frames x HiFT's samples per frame."""
    from cosyclone.model.config import load_model_config

    cfg = load_model_config(model_dir)
    hop = 1
    for r in cfg.hift.upsample_rates:
        hop *= int(r)
    return cfg.flow.token_mel_ratio * hop * cfg.hift.hop_len


FAST_SYNTH = ["--max-tokens", "8", "--n-timesteps", "2", "--device", "cpu", "--quiet"]  # a short CLI run
PROMPT = str(ROOT / "manifests" / "prompts" / "speaker1.wav")  # the project's own prompt recording


def two_row_manifest(tmp: Path) -> Path:
    """A manifest of two short rows of the project's prompt recording, in ``tmp``."""
    m = tmp / "m.jsonl"
    rows = [{"id": f"r{i}", "prompt_audio": PROMPT, "prompt_text": "This is the reference speaker talking.",
             "text": text} for i, text in enumerate(("Hello there.", "A second row to say."))]
    m.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return m


def synth_cli(manifest: Path, model: Path, out: Path, *extra: str) -> dict[str, Any]:
    """``cosyclone synth`` in-process, short (:data:`FAST_SYNTH`); its exit 0 asserted; the run's
    ``summary.json`` ``last_run``."""
    from typer.testing import CliRunner

    from cosyclone.cli import app

    res = CliRunner().invoke(app, ["synth", str(manifest), "--model-dir", str(model), "--out", str(out),
                                   *FAST_SYNTH, *extra])
    assert res.exit_code == 0, res.output
    last_run: dict[str, Any] = json.loads((out / "summary.json").read_text())["last_run"]
    return last_run

