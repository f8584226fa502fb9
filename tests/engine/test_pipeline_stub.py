"""Pipeline + writer + CLI wiring on stub stages (runs before/without the real stage modules).

The stubs follow docs/INTERFACES.md shapes; they make the scheduling, row isolation, resume and
output-file logic testable in milliseconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import soundfile as sf
import torch
from typer.testing import CliRunner
from typing_extensions import override

from cosyclone.base.device import resolve
from cosyclone.cli import app
from cosyclone.engine import Engine
from cosyclone.engine import stages as pipeline
from cosyclone.engine.batches import plan_batches, row_cost
from cosyclone.engine.stage_ops import RealOps
from cosyclone.folder.layout import wav_path
from cosyclone.model.config import released_config
from cosyclone.options import RunOptions
from cosyclone.run.job import SynthJob
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


SEEN_OPTIONS: list = []


def generate(model, requests, options):
    SEEN_OPTIONS.append(options)
    out = []
    for r in requests:
        g = torch.Generator().manual_seed(r.seed)
        n = min(options.max_len_override or 50, max(options.min_len_override or 0, 2 + r.target_len))
        toks = torch.randint(0, 6561, (n,), generator=g).tolist()
        stop = "no_finite_logits" if r.row_id.startswith("nan") else "max_len"
        out.append(
            Res(
                r.row_id,
                toks,
                toks,
                stop,
                SamplerRowDiagnostics(
                    row_id=r.row_id, seed=r.seed, steps=n, all_nan_steps=n if stop != "max_len" else 0
                ),
            )
        )
    return out


class GenerateSession:
    """A stand-in for TalkerSession over ``talk`` (a :class:`StubOps`' talker), else over whatever
    ``decode.generate`` is now: each poll decodes the next ``slots`` waiting requests with one call."""

    def __init__(self, model, options, *, slots, talk=None, **kw):
        self.model, self.options, self.slots, self.talk = model, options, slots, talk
        self.queue: list = []
        self.n = 0

    def add(self, requests):
        tickets = list(range(self.n, self.n + len(requests)))
        self.n += len(requests)
        self.queue.extend(zip(tickets, requests, strict=True))
        return tickets

    @property
    def waiting(self):
        return len(self.queue)

    @property
    def idle(self):
        return not self.queue

    def poll(self):
        import cosyclone.talker.decode as dec

        take, self.queue = self.queue[:self.slots], self.queue[self.slots:]
        requests = [r for _, r in take]
        talk = self.talk or (lambda reqs, options: dec.generate(self.model, reqs, options))
        found = talk(requests, self.options)
        return list(zip([t for t, _ in take], found, strict=True))

    def close(self):
        return []


class StubOps(RealOps):
    """The pipeline's stage calls over stub stages (:meth:`stages`): frontend, flow and HiFT are the
    stubs' real calls, the talker is ``talker`` (``generate``'s signature; a test's spy or failure)
    and a segment is its own talker request. Given to the engine (``Engine.run(ops=...)``), so no
    module is patched."""

    def __init__(self, stages: pipeline.Stages, opts: RunOptions, *, talker: Any = None, tokens: Any = None):
        super().__init__(stages, opts, pipeline.decode_options(stages.cfg, opts, stages.sizing), tokens)
        self.talker = talker if talker is not None else generate

    @override
    def request(self, segment: Any) -> Any:
        return segment

    @override
    def talk(self, requests: Any, dec: Any) -> list[Any]:
        return list(self.talker(None, list(requests), dec))

    @override
    def session(self, slots: int) -> Any:
        return GenerateSession(None, self.dec, slots=slots, talk=self.talk)


class Flow:
    def inference(
        self, token, token_len, prompt_token, prompt_token_len, prompt_feat, embedding, *, n_timesteps=None
    ):
        mel = token[:, None, :].float().repeat(1, 80, 2) / 6561.0
        return mel, token_len * 2


class Hift:
    def inference(self, mel, mel_len):
        wav = torch.sin(mel[:, 0, :].repeat_interleave(480, dim=1) * 100) * 0.3
        return wav, mel_len * 480


class StubEngine(Engine):
    """An engine over the stub stages whose every pipeline runs :class:`StubOps`: a whole run (a
    :class:`~cosyclone.run.job.SynthJob` given it as its loaded engine) from manifest to folder,
    with no module patched."""

    def __init__(self, opts: RunOptions, stages: pipeline.Stages | None = None) -> None:
        stages = stages or pipeline.Stages(released_config(), resolve("cpu", "fp32"), cast(Any, Frontend()),
                                           cast(Any, None), cast(Any, Flow()), cast(Any, Hift()))
        super().__init__(stages, opts)

    @override
    def pipeline(self, **kw: Any) -> Any:
        opts = kw.get("opts") or self.opts
        kw["ops"] = StubOps(self.stages, opts, tokens=kw.get("tokens"))
        return super().pipeline(**kw)


MODEL: dict[str, Any] = {"load_format": "dummy", "device": "cpu"}


def stub_job(manifest: Path, out: Path, stages: pipeline.Stages | None = None, **options: Any) -> SynthJob:
    """A job over the manifest run on a fresh :class:`StubEngine` over ``stages`` (default: the stub
    stages; model options as the CLI tests' ``--load-format dummy --device cpu``)."""
    engine = StubEngine(RunOptions(cuda_graphs="off", **MODEL), stages)
    return SynthJob.open(manifest, out, loaded=engine, **MODEL, **options)


def make_manifest(tmp: Path, texts: dict[str, str]) -> Path:
    sf.write(str(tmp / "p.wav"), np.zeros(16000, np.float32), 16000)
    rows = [{"id": k, "prompt_audio": "p.wav", "prompt_text": "ref", "text": v} for k, v in texts.items()]
    (tmp / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "{oops\n")
    return tmp / "m.jsonl"


def test_run_on_stub_stages(tmp_path: Path) -> None:
    m = make_manifest(tmp_path, {"a": "one|two", "b": "three", "nan1": "x", "c": "frontend-fail"})
    out = tmp_path / "out"
    stub_job(m, out, max_tokens=4).run()
    d = {x["id"]: x for x in map(json.loads, (out / "diagnostics.jsonl").read_text().splitlines())}
    assert d["a"]["status"] == "ok" and len(d["a"]["stop_reasons"]) == 2
    assert d["nan1"]["status"] == "failed" and "no_finite_logits" in d["nan1"]["error"]
    assert d["c"]["status"] == "failed" and "frontend" in d["c"]["error"]
    wav, sr = sf.read(str(wav_path(out, "a")))
    assert sr == 24000 and len(wav) == 2 * 4 * 2 * 480
    summary = json.loads((out / "summary.json").read_text())
    assert summary["done"] == 2 and summary["failed"] == 2 and summary["last_run"]["invalid"] == 1
    assert summary["nan_summary"].endswith("entirely NaN")
    before = wav_path(out, "a").read_bytes()
    wav_path(out, "b").unlink()
    text = (out / "diagnostics.jsonl").read_text()
    (out / "diagnostics.jsonl").write_text(text[:-5])  # killed mid-line
    stub_job(m, out, max_tokens=4).run()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["last_run"]["skipped"] == 1 and wav_path(out, "b").is_file()
    assert wav_path(out, "a").read_bytes() == before


def test_min_tokens_reaches_decode_options(tmp_path: Path) -> None:
    m = make_manifest(tmp_path, {"a": "one", "b": "three"})
    out = tmp_path / "out"
    SEEN_OPTIONS.clear()
    stub_job(m, out, max_tokens=9, min_tokens=9).run()
    assert SEEN_OPTIONS and all(o.min_len_override == 9 and o.max_len_override == 9 for o in SEEN_OPTIONS)
    d = {x["id"]: x for x in map(json.loads, (out / "diagnostics.jsonl").read_text().splitlines())}
    assert d["a"]["tokens"] == [9] and d["b"]["tokens"] == [9]
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["last_run"]["options"]["min_tokens"] == 9
        and summary["last_run"]["options"]["token_budget"] is None
    )
    args = ["synth", str(m), "--load-format", "dummy", "--out", str(out), "--device", "cpu"]
    bad = CliRunner().invoke(app, [*args, "--max-tokens", "4", "--min-tokens", "5"])
    assert bad.exit_code == 2 and "--min-tokens 5 is above --max-tokens 4" in bad.output
    assert "--min-tokens" not in CliRunner().invoke(app, ["synth", "--help"]).output  # advanced: hidden


def _rows(costs: list[int], prompt_seconds: float = 0.0) -> list:
    from cosyclone.manifest import ManifestRow

    return [ManifestRow(i + 1, f"r{i}", Path("p"), "", "x" * n, prompt_seconds=prompt_seconds)
            for i, n in enumerate(costs)]


def _ids(batches: list) -> list[list[str]]:
    return [[r.id for r in b] for b in batches]


def test_plan_batches_groups_by_length_longest_batch_first() -> None:
    rows = _rows([9, 1, 5, 2])
    assert _ids(plan_batches(rows, 2)) == [["r2", "r0"], ["r1", "r3"]]
    assert _ids(plan_batches(rows, 8)) == [["r1", "r3", "r2", "r0"]]
    assert _ids(plan_batches(list(reversed(rows)), 2)) == [["r2", "r0"], ["r1", "r3"]]


def test_row_cost_counts_characters_and_prompt_tokens() -> None:
    from cosyclone.manifest import ManifestRow

    row = ManifestRow(1, "a", Path("p"), "abc", "hello", instruct="xy", prompt_seconds=3.0)
    assert row_cost(row) == 3 + 5 + 2 + 75
    assert row_cost(ManifestRow(1, "a", Path("p"), "", "")) == 1


def test_plan_batches_with_token_budget() -> None:
    rows = _rows([10, 30, 10, 20, 10, 40])
    # sorted: r0 r2 r4 (10) r3 (20) r1 (30) r5 (40); padded work = rows x widest row
    assert _ids(plan_batches(rows, 8, token_budget=40)) == [["r5"], ["r1"], ["r3"], ["r0", "r2", "r4"]]
    assert _ids(plan_batches(rows, 8, token_budget=60)) == [["r5"], ["r3", "r1"], ["r0", "r2", "r4"]]
    assert _ids(plan_batches(rows, 2, token_budget=1000)) == [["r1", "r5"], ["r4", "r3"], ["r0", "r2"]]
    # a single row over the budget still gets a batch of its own
    assert _ids(plan_batches(rows, 8, token_budget=5)) == [["r5"], ["r1"], ["r3"], ["r4"], ["r2"], ["r0"]]
    # the prompt counts: 25 tokens per second of prompt audio
    assert _ids(plan_batches(_rows([10, 10], prompt_seconds=2.0), 8, token_budget=119)) == [["r1"], ["r0"]]
    assert _ids(plan_batches(_rows([10, 10], prompt_seconds=2.0), 8, token_budget=120)) == [["r0", "r1"]]
    # deterministic, and every row lands in exactly one batch
    for budget in (1, 25, 47, 90, 10**6):
        for size in (1, 3, 8):
            a, b = plan_batches(rows, size, budget), plan_batches(rows[::-1], size, budget)
            assert _ids(a) == _ids(b)
            assert sorted(r.id for batch in a for r in batch) == sorted(r.id for r in rows)
            assert all(len(batch) <= size for batch in a)
            assert all(len(batch) == 1 or len(batch) * max(map(row_cost, batch)) <= budget for batch in a)


def test_cli_token_budget_plans_batches(tmp_path: Path) -> None:
    m = make_manifest(tmp_path, {"a": "one", "b": "three", "c": "seven"})
    args = ["synth", str(m), "--load-format", "dummy", "--out", str(tmp_path / "o"), "--device", "cpu"]
    wide = CliRunner().invoke(app, [*args, "--dry-run"])
    assert "3 to synthesize in 1 batches" in wide.output, wide.output
    # row costs: 3 (prompt_text) + text + 25 (1 s prompt) = 31, 33, 33 -> [a, b] (2 x 33), [c]
    tight = CliRunner().invoke(app, [*args, "--dry-run", "--token-budget", "66"])
    assert "3 to synthesize in 2 batches" in tight.output, tight.output
    stub_job(m, tmp_path / "o", token_budget=66).run()
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["last_run"]["done"] == 3 and summary["last_run"]["options"]["token_budget"] == 66
    assert CliRunner().invoke(app, [*args, "--token-budget", "0"]).exit_code == 2


def test_released_config_loads_without_dir() -> None:
    assert released_config().model_dir is None and resolve("cpu", "fp32").device.type == "cpu"


def test_writer_atomic_float_and_torn_line(tmp_path: Path) -> None:
    from cosyclone.engine import RowResult
    from cosyclone.folder.audio_out import AudioOutput
    from cosyclone.folder.layout import is_complete, journal_path
    from cosyclone.folder.row_record import RowStamp
    from cosyclone.folder.writer import BackgroundWriter, WriterOptions
    from tests.every_record import read_records

    stamp = RowStamp(
        fingerprint=None,
        fingerprint_parts=None,
        run_id="r",
        text="t",
        prompt_text="",
        prompt_audio="p",
        mode="zero_shot",
        instruct="",
        speed=1.0,
        manifest="m",
        shard=None,
    )

    (tmp_path / "diagnostics.jsonl").write_text('{"id": "old", "status": "ok"}\n{"id": "torn", "sta')
    (tmp_path / "wavs").mkdir()
    # an earlier version's place
    (tmp_path / "wavs" / "y.wav").write_bytes(b"stale audio of an earlier attempt")
    w = BackgroundWriter(
        WriterOptions(out_dir=tmp_path, output=AudioOutput(encoding="float")), journal_path(tmp_path, "all")
    )
    w.submit(RowResult(id="x", line=1, seed=0, audio=np.full(480, 0.25, np.float32)), stamp)
    w.submit(
        RowResult(id="y", line=2, seed=0, status="failed", error="boom", traceback="Traceback..."), stamp
    )
    w.close()
    data, sr = sf.read(str(wav_path(tmp_path, "x")), dtype="float32")
    assert (
        sr == 24000
        and np.allclose(data, 0.25)
        and sf.info(str(wav_path(tmp_path, "x"))).subtype == "FLOAT"
    )
    assert not list((tmp_path / "wavs").rglob(".*tmp*"))
    records = read_records(tmp_path)
    assert set(records) == {"old", "x", "y"} and records["x"].samples == 480
    assert [r for r in records if is_complete(tmp_path, records[r])] == ["x"]
    # no stale WAV left
    assert not wav_path(tmp_path, "y").exists() and not (tmp_path / "wavs" / "y.wav").exists()
    errors = [json.loads(x) for x in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert errors[0]["id"] == "y" and errors[0]["traceback"] == "Traceback..."
    assert records["y"].traceback == "see errors.jsonl"
