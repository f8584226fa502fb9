"""Per-row verdicts of the pipeline on stub stages: seeds derived once, non-finite audio, a speed
that leaves no frames, and exceptions that fail their own rows only (type, message, traceback)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner
from typing_extensions import override

from cosyclone.base.device import resolve
from cosyclone.cli import app
from cosyclone.engine import RowResult
from cosyclone.engine import stages as pipeline
from cosyclone.errors import CosycloneError
from cosyclone.folder.audio_out import AudioOutput
from cosyclone.folder.writer import write_audio_atomic
from cosyclone.manifest import ManifestRow
from cosyclone.model.config import released_config
from cosyclone.options import RunOptions
from cosyclone.talker.sampler import row_seed
from tests.engine.test_pipeline_stub import (
    Flow,
    Frontend,
    Hift,
    StubOps,
    generate,
    make_manifest,
    stub_job,
)
from tests.engine_run import run as engine_run

MARK = {"nanwav": 1.0, "infwav": 2.0, "c2w-boom": 3.0}  # text word -> embedding[0] marker the stubs read


class MarkingFrontend(Frontend):
    """The stub frontend, plus a marker in the speaker embedding so code2wav stubs know the row."""

    @override
    def prepare(self, row_id, prompt_audio, prompt_text, text, mode, instruct, seed, speed=1.0):
        if "user-error" in text:
            raise CosycloneError(f"row {row_id!r}: the text is not speakable")
        reqs = super().prepare(row_id, prompt_audio, prompt_text, text, mode, instruct, seed, speed)
        emb = torch.zeros(192)
        emb[0] = next((v for k, v in MARK.items() if k in text), 0.0)
        out = []
        for r in reqs:
            r = type(r)(
                r.row_id, r.segment, r.text_ids, r.target_len, {**r.embed, "embedding": emb}, r.seed, speed
            )
            out.append(r)
        return out


class MarkedFlow(Flow):
    @override
    def inference(
        self, token, token_len, prompt_token, prompt_token_len, prompt_feat, embedding, *, n_timesteps=None
    ):
        if (embedding[:, 0] == 3.0).any():
            raise IndexError("flow stub: index 99 is out of bounds")
        mel, mel_len = super().inference(
            token, token_len, prompt_token, prompt_token_len, prompt_feat, embedding
        )
        return mel + embedding[:, :1, None] * 1000.0, mel_len  # the marker travels to HiFT in the mel


class MarkedHift(Hift):
    @override
    def inference(self, mel, mel_len):
        wav, wav_len = super().inference(mel, mel_len)
        marker = (mel[:, 0, 0] / 1000.0).round()
        wav[marker == 1.0, 5:17] = float("nan")  # 12 NaN samples in each nanwav segment
        wav[marker == 2.0, :3] = float("inf")
        return wav, wav_len


def _stages() -> pipeline.Stages:
    stand_ins: tuple[Any, ...] = (MarkingFrontend(), None, MarkedFlow(), MarkedHift())  # the stages' shapes
    return pipeline.Stages(released_config(), resolve("cpu", "fp32"), *stand_ins)


def _rows(texts: dict[str, str], **fields: object) -> list[ManifestRow]:
    return [ManifestRow(i + 1, rid, Path("p.wav"), "ref", text, **fields.get(rid, {}))  # type: ignore[arg-type]
            for i, (rid, text) in enumerate(texts.items())]


def _ops(opts: RunOptions, talker: Any = None) -> StubOps:
    """The stage calls over :func:`_stages`, the talker ``talker`` (default: the stub ``generate``)."""
    return StubOps(_stages(), opts, talker=talker)


def _run(rows: list[ManifestRow], ops_type: type[StubOps] = StubOps, talker: Any = None,
         **opts: object) -> dict[str, RowResult]:
    run_opts = RunOptions(max_tokens=4, **opts)  # type: ignore[arg-type]
    stages = _stages()
    recs = engine_run(stages, rows, run_opts, lambda rec: None, ops=ops_type(stages, run_opts, talker=talker))
    return {r.id: r for r in recs}


def test_row_seed_is_derived_once_and_reported_as_used() -> None:
    seen: dict[str, set[int]] = {}

    def spy(model, requests, options):
        for r in requests:
            seen.setdefault(r.row_id, set()).add(r.seed)
        return generate(model, requests, options)

    d = _run(_rows({"given": "one|two", "derived": "three"}, given={"seed": 123}), talker=spy, seed=9)
    assert d["given"].seed == 123 and seen["given"] == {123}  # every segment, as the manifest gave it
    assert d["derived"].seed == row_seed(9, "derived") and seen["derived"] == {row_seed(9, "derived")}
    assert [s.seed for s in d["given"].sampler] == [123, 123]


def test_nonfinite_audio_fails_the_row_by_default_and_counts_it() -> None:
    d = _run(_rows({"ok": "fine", "n": "nanwav|nanwav", "i": "infwav"}), batch_size=8)
    assert d["ok"].status == "ok" and d["ok"].nonfinite_audio_samples == 0
    assert d["n"].status == "failed" and d["n"].reason == "nonfinite_audio"
    assert d["n"].nonfinite_audio_samples == 24 and "12 NaN" in (d["n"].error or "")  # 12 per segment
    assert (
        d["i"].reason == "nonfinite_audio"
        and d["i"].nonfinite_audio_samples == 3
        and "3 inf" in (d["i"].error or "")
    )


def test_nonfinite_audio_zero_keeps_the_old_output_and_still_counts() -> None:
    written: list = []
    opts = RunOptions(max_tokens=4, nonfinite_audio="zero")
    engine_run(_stages(), _rows({"n": "nanwav", "i": "infwav"}), opts, written.append, ops=_ops(opts))
    d = {r.id: r for r in written}
    wav = {r.id: r.audio for r in written}
    assert d["n"].status == d["i"].status == "ok"
    assert d["n"].nonfinite_audio_samples == 12 and d["i"].nonfinite_audio_samples == 3
    assert np.isfinite(wav["n"]).all() and (wav["n"][5:17] == 0).all() and (wav["i"][:3] == 1.0).all()
    with pytest.raises(CosycloneError, match="--nonfinite-audio must be one of fail, zero"):
        RunOptions(nonfinite_audio="ignore")  # type: ignore[arg-type]


def test_the_writer_refuses_nonfinite_samples_instead_of_zeroing_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="non-finite"):
        write_audio_atomic(tmp_path / "x.wav", np.array([0.1, np.nan], np.float32), model_rate=24000,
                           output=AudioOutput(encoding="float"))
    assert not (tmp_path / "x.wav").exists()


def test_a_speed_that_leaves_no_mel_frames_fails_the_row() -> None:
    """1 token = 2 mel frames; at speed 3, int(2 / 3) = 0 frames: an error, not an empty ok WAV."""
    written: list = []
    opts = RunOptions(max_tokens=1)
    engine_run(_stages(), _rows({"fast": "x", "fine": "y"}, fast={"speed": 3.0}, fine={"speed": 2.0}), opts,
               written.append, ops=_ops(opts))
    d = {r.id: r for r in written}
    assert d["fast"].status == "failed" and d["fast"].audio is None
    assert d["fast"].reason == "empty_after_speed" and "speed 3" in (d["fast"].error or "")
    assert d["fine"].status == "ok" and d["fine"].audio is not None and d["fine"].audio.size == 480  # 1 frame


def test_stage_exceptions_fail_their_rows_with_type_message_and_traceback() -> None:
    def talker(model, requests, options):
        if any(r.row_id == "t-boom" for r in requests):
            raise RuntimeError("talker stub: shape mismatch")
        return generate(model, requests, options)

    d = _run(_rows({"a": "one|two", "t-boom": "x", "c": "c2w-boom", "f": "frontend-fail", "u": "user-error",
                    "b": "three"}), talker=talker, batch_size=8)
    assert d["a"].status == d["b"].status == "ok"  # the batch's other rows are produced
    t = d["t-boom"]
    assert (t.status, t.reason, t.error_type) == ("failed", "exception", "RuntimeError")
    assert (t.error or "").startswith("talker: RuntimeError: talker stub: shape mismatch")
    assert "Traceback" in (t.traceback or "") and "in talker" in (t.traceback or "")
    c = d["c"]
    assert (c.reason, c.error_type) == ("exception", "IndexError") and "in inference" in (c.traceback or "")
    assert (c.error or "").startswith("code2wav: IndexError: flow stub")
    f = d["f"]
    assert (f.reason, f.error_type) == ("exception", "ValueError") and "cannot tokenize" in (
        f.traceback or ""
    )
    u = d["u"]  # a user-fixable error: type and message, no traceback
    assert (u.reason, u.error_type, u.traceback) == ("bad_input", "CosycloneError", None)
    assert "not speakable" in (u.error or "")
    assert all(d[k].traceback is None for k in ("a", "b"))


def test_talker_out_of_memory_halves_the_batch_and_gives_the_same_rows() -> None:
    rows = _rows({f"r{i}": f"text{i}|more{i}" for i in range(6)})
    whole = _run(rows, batch_size=8)
    sizes: list[int] = []

    def small_device(model, requests, options):
        sizes.append(len(requests))
        if len(requests) > 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return generate(model, requests, options)

    def same(a: dict[str, RowResult], b: dict[str, RowResult]) -> bool:
        """Equal results but for wall seconds (the audio is not compared here: halving keeps tokens)."""
        return {k: replace(r, seconds={}) for k, r in a.items()} == {
            k: replace(r, seconds={}) for k, r in b.items()
        }

    halved = _run(rows, talker=small_device, batch_size=8, schedule="static")
    assert sizes == [12, 6, 3, 3, 6, 3, 3]  # 12 segments -> halves -> quarters, each retried once
    assert same(halved, whole)
    sizes.clear()
    halved = _run(rows, talker=small_device, batch_size=8, schedule="continuous")
    # the shared session's first window (a slot per segment of the first batch) fails: what it held
    # is decoded the static way
    assert sizes == [12, 12, 6, 3, 3, 6, 3, 3]
    assert same(halved, whole)

    def always_oom(model, requests, options):
        raise torch.OutOfMemoryError("CUDA out of memory")

    d = _run(rows[:2], talker=always_oom, batch_size=8)
    assert all(x.status == "failed" and x.error_type == "OutOfMemoryError" for x in d.values())


def test_a_bug_outside_the_stage_guards_fails_only_its_row() -> None:
    def check(prepared: pipeline.PreparedBatch) -> None:
        if any(row.id == "bug" for row in prepared.rows):
            raise KeyError("bookkeeping bug")

    class BugOps(StubOps):
        """code2wav's bookkeeping raises for any batch holding the row ``bug``."""

        @override
        def finish(self, prepared: pipeline.PreparedBatch, results: dict[int, Any]) -> list[RowResult]:
            check(prepared)
            return super().finish(prepared, results)

    d = _run(_rows({"a": "one", "bug": "two", "b": "three"}), ops_type=BugOps, batch_size=8)
    assert d["a"].status == d["b"].status == "ok"
    assert d["bug"].reason == "exception" and d["bug"].error_type == "KeyError"
    assert (d["bug"].error or "").startswith("pipeline: KeyError") and "in check" in (
        d["bug"].traceback or ""
    )


@pytest.mark.parametrize("schedule", ["continuous", "static"])
def test_a_frontend_bug_outside_the_row_guards_loses_no_row(schedule: str) -> None:
    """A batch whose frontend call raises as a whole (not per row) goes through every stage row by
    row; with the talker session busy with other batches, nothing is lost or mixed up."""
    calls: list[list[str]] = []

    class BugOps(StubOps):
        """The frontend's batch bookkeeping raises for a batch of several rows holding ``bug``."""

        @override
        def prepare(self, rows: Any, prompts: Any) -> pipeline.PreparedBatch:
            calls.append([r.id for r in rows])
            if len(rows) > 1 and any(r.id == "bug" for r in rows):
                raise KeyError("batch bookkeeping bug")
            return super().prepare(rows, prompts)

    texts = {f"r{i}": f"text number {i}|more" for i in range(5)}
    texts["bug"] = "text number x|more"
    rows = _rows(texts)
    d = _run(rows, ops_type=BugOps, batch_size=2, schedule=schedule)
    clean = _run(rows, batch_size=2, schedule=schedule)
    assert d.keys() == clean.keys() == texts.keys()
    for rid in texts:
        assert replace(d[rid], seconds={}) == replace(clean[rid], seconds={}), rid
    assert ["bug"] in calls  # its batch was retried row by row


def test_run_summary_counts_nonfinite_audio_and_failure_reasons(tmp_path: Path) -> None:
    """A whole run (the job on an engine over the marking stubs) to its folder's summary."""
    m = make_manifest(tmp_path, {"a": "fine", "n": "nanwav", "i": "infwav"})
    stages = replace(_stages(), policy=resolve("cpu", "auto"))  # as a run given no --dtype resolves it
    stub_job(m, tmp_path / "fail", stages, max_tokens=4).run()
    s = json.loads((tmp_path / "fail" / "summary.json").read_text())
    assert (s["nonfinite_audio_rows"], s["nonfinite_audio_samples"]) == (2, 15)
    run = s["last_run"]
    assert s["failed_reasons"] == {"nonfinite_audio": 2} and run["options"]["nonfinite_audio"] == "fail"
    assert run["options"]["dtype"] == "fp32" and run["dtype"] == "fp32" and run["dtype_requested"] == "auto"
    stub_job(m, tmp_path / "zero", _stages(), max_tokens=4, nonfinite_audio="zero").run()
    s = json.loads((tmp_path / "zero" / "summary.json").read_text())
    assert s["done"] == 3 and (s["nonfinite_audio_rows"], s["nonfinite_audio_samples"]) == (2, 15)
    base = ["synth", str(m), "--load-format", "dummy", "--device", "cpu", "--max-tokens", "4"]
    res = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "y"), "--nonfinite-audio", "zero",
                                   "--dry-run"])
    assert "--nonfinite-audio zero" in res.output, res.output  # the command warns of it
    assert (
        CliRunner().invoke(app, [*base, "--out", str(tmp_path / "x"), "--nonfinite-audio", "skip"]).exit_code
        == 2
    )
