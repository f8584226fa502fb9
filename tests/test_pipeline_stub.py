"""Pipeline + writer + CLI wiring on stub stages (runs before/without the real stage modules).

The stubs follow docs/INTERFACES.md shapes; they make the scheduling, row isolation, resume and
output-file logic testable in milliseconds.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from typer.testing import CliRunner

from cosyclone import pipeline
from cosyclone.cli import app
from cosyclone.config import released_config
from cosyclone.device import resolve
from cosyclone.talker.diagnostics import SamplerRowDiagnostics


@dataclass(frozen=True)
class Req:
    row_id: str
    segment: int
    text_ids: torch.Tensor
    target_len: int
    embed: dict = field(default_factory=dict)
    seed: int = 0
    speed: float = 1.0


@dataclass
class Res:
    row_id: str
    tokens: list
    raw_tokens: list
    stop_reason: str
    diagnostics: SamplerRowDiagnostics


class Frontend:
    def prepare(self, row_id, prompt_audio, prompt_text, text, mode, instruct, seed, speed=1.0):
        if "frontend-fail" in text:
            raise ValueError("cannot tokenize")
        embed = {"speech_token": torch.zeros(5, dtype=torch.long), "speech_feat": torch.zeros(10, 80),
                 "embedding": torch.zeros(192)}
        return [Req(row_id, k, torch.arange(len(part)), len(part), embed, seed)
                for k, part in enumerate(text.split("|"))]


def generate(model, requests, options):
    out = []
    for r in requests:
        g = torch.Generator().manual_seed(r.seed)
        n = min(options.max_len_override or 50, 2 + r.target_len)
        toks = torch.randint(0, 6561, (n,), generator=g).tolist()
        stop = "no_finite_logits" if r.row_id.startswith("nan") else "max_len"
        out.append(Res(r.row_id, toks, toks, stop, SamplerRowDiagnostics(row_id=r.row_id, seed=r.seed, steps=n,
                                                                           all_nan_steps=n if stop != "max_len" else 0)))
    return out


class Flow:
    def inference(self, token, token_len, prompt_token, prompt_token_len, prompt_feat, embedding, *, n_timesteps=None):
        mel = token[:, None, :].float().repeat(1, 80, 2) / 6561.0
        return mel, token_len * 2


class Hift:
    def inference(self, mel, mel_len):
        wav = torch.sin(mel[:, 0, :].repeat_interleave(480, dim=1) * 100) * 0.3
        return wav, mel_len * 480


@pytest.fixture()
def stubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    cond = types.ModuleType("cosyclone.conditioning")
    cond.to_talker_request = lambda r: r
    dec = types.ModuleType("cosyclone.talker.decode")

    @dataclass(frozen=True)
    class DecodeOptions:
        sampler: object
        silent_filter: bool = True
        max_len_override: int | None = None

    dec.DecodeOptions, dec.generate = DecodeOptions, generate
    monkeypatch.setitem(sys.modules, "cosyclone.conditioning", cond)
    monkeypatch.setitem(sys.modules, "cosyclone.talker.decode", dec)
    monkeypatch.setattr(pipeline, "load_stages", lambda cfg, policy, fmt: pipeline.Stages(
        cfg, policy, Frontend(), None, Flow(), Hift()))


def make_manifest(tmp: Path, texts: dict[str, str]) -> Path:
    sf.write(str(tmp / "p.wav"), np.zeros(16000, np.float32), 16000)
    rows = [{"id": k, "prompt_audio": "p.wav", "prompt_text": "ref", "text": v} for k, v in texts.items()]
    (tmp / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "{oops\n")
    return tmp / "m.jsonl"


def test_cli_on_stub_stages(stubbed: None, tmp_path: Path) -> None:
    m = make_manifest(tmp_path, {"a": "one|two", "b": "three", "nan1": "x", "c": "frontend-fail"})
    out = tmp_path / "out"
    args = ["synth", str(m), "--load-format", "dummy", "--out", str(out), "--device", "cpu", "--max-tokens", "4"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 3, res.output
    d = {x["id"]: x for x in map(json.loads, (out / "diagnostics.jsonl").read_text().splitlines())}
    assert d["a"]["status"] == "ok" and len(d["a"]["stop_reasons"]) == 2
    assert d["nan1"]["status"] == "failed" and "no_finite_logits" in d["nan1"]["error"]
    assert d["c"]["status"] == "failed" and "frontend" in d["c"]["error"]
    wav, sr = sf.read(str(out / "wavs" / "a.wav"))
    assert sr == 24000 and len(wav) == 2 * 4 * 2 * 480
    summary = json.loads((out / "summary.json").read_text())
    assert summary["done"] == 2 and summary["failed"] == 2 and summary["invalid"] == 1
    assert summary["nan_summary"].endswith("entirely NaN")
    before = (out / "wavs" / "a.wav").read_bytes()
    (out / "wavs" / "b.wav").unlink()
    text = (out / "diagnostics.jsonl").read_text()
    (out / "diagnostics.jsonl").write_text(text[:-5])  # killed mid-line
    res = CliRunner().invoke(app, args)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped"] == 1 and (out / "wavs" / "b.wav").is_file()
    assert (out / "wavs" / "a.wav").read_bytes() == before


def test_plan_batches_groups_by_length() -> None:
    from cosyclone.manifest import ManifestRow

    rows = [ManifestRow(i, f"r{i}", Path("p"), "", "x" * n) for i, n in enumerate([9, 1, 5, 2])]
    assert [[r.id for r in b] for b in pipeline.plan_batches(rows, 2)] == [["r1", "r3"], ["r2", "r0"]]


def test_released_config_loads_without_dir() -> None:
    assert released_config().model_dir is None and resolve("cpu", "fp32").device.type == "cpu"


def test_writer_atomic_float_and_torn_line(tmp_path: Path) -> None:
    from cosyclone.writer import BackgroundWriter, RowRecord, WriterOptions, completed_rows, read_diagnostics

    (tmp_path / "diagnostics.jsonl").write_text('{"id": "old", "status": "ok"}\n{"id": "torn", "sta')
    w = BackgroundWriter(WriterOptions(out_dir=tmp_path, float_wav=True))
    w.submit(RowRecord("x", np.full(480, 0.25, np.float32), {"id": "x", "status": "ok"}))
    w.submit(RowRecord("y", None, {"id": "y", "status": "failed", "error": "boom"}))
    w.close()
    data, sr = sf.read(str(tmp_path / "wavs" / "x.wav"), dtype="float32")
    assert sr == 24000 and np.allclose(data, 0.25) and sf.info(str(tmp_path / "wavs" / "x.wav")).subtype == "FLOAT"
    assert not list((tmp_path / "wavs").glob(".*tmp*"))
    assert set(read_diagnostics(tmp_path)) == {"old", "x", "y"}
    assert completed_rows(tmp_path, ["old", "x", "y"]) == {"x"}
