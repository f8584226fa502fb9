"""Continuous batching through the real pipeline and CLI.

Within a batch (``--talker-slots``): segments take the talker's slots a few at a time and write
byte-identical WAVs, tokens and sampler counters to the batch decoded all at once. Across the
manifest (``--schedule continuous``, the default): one talker session for the run, the next
batches' rows take freed slots while earlier batches are still decoding, and each batch goes to
code2wav as soon as its last row leaves the talker; the WAV bytes equal ``--schedule static``
(batch by batch) whatever the slot count, with code2wav inline or on its worker thread, and with
prompt-cache hits or misses.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner
from typing_extensions import override

from cosyclone.cli import app
from cosyclone.engine import Engine
from cosyclone.engine.stage_ops import RealOps
from cosyclone.engine.stages import decode_options
from cosyclone.folder.layout import wav_path
from tests.engine.test_batch_invariance import _manifest
from tests.run_folders import ROOT, diags, wav_bytes

TEXTS = ["Hi.", "A much longer sentence, with a comma and a few more words in it.", "Short one.",
         "Numbers like 42 and 7 get read out.", "The end.", "Another line of middling size here.",
         "Okay.", "The very last line, which is also long enough to need more tokens than most."]


def _run(manifest: Path, model_dir: Path, out: Path, *extra: str) -> dict[str, dict]:
    res = CliRunner().invoke(app, ["synth", str(manifest), "--model-dir", str(model_dir), "--out", str(out),
                                   "--device", "cpu", "--n-timesteps", "2", "--batch-size", "8",
                                   "--seed", "3", *extra])
    assert res.exit_code == 0, res.output
    return diags(out)


def test_talker_slots_give_byte_identical_wavs(tiny_model_dir: Path, tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    static = _run(manifest, tiny_model_dir, tmp_path / "all", "--schedule", "static")
    assert len({sum(d["tokens"]) for d in static.values()}) > 1  # rows of different lengths
    for slots in (1, 3):
        cont = _run(manifest, tiny_model_dir, tmp_path / f"s{slots}", "--talker-slots", str(slots))
        assert set(cont) == set(static)
        for rid, want in static.items():
            got = cont[rid]
            assert got["tokens"] == want["tokens"] and got["sampler"] == want["sampler"], (slots, rid)
            a = wav_path(tmp_path / "all", rid).read_bytes()
            b = wav_path(tmp_path / f"s{slots}", rid).read_bytes()
            assert a == b and len(a) > 44, (slots, rid)


@pytest.fixture(scope="module")
def tts(tiny_model_dir: Path) -> Any:
    from cosyclone import CosyClone

    return CosyClone(tiny_model_dir, device="cpu", n_timesteps=2, batch_size=2, seed=11)


def _rows(tts: Any) -> list:
    return tts.validate([{"id": f"row{i}", "text": text, "prompt_text": "reference words " * (1 + i % 3),
                          "prompt_audio": str(ROOT / "manifests" / "prompts" / f"speaker{i % 3 + 1}.wav")}
                         for i, text in enumerate(TEXTS)])


class _SpySession:
    """A talker session that notes each admission ("add", first row id) in ``events``."""

    def __init__(self, session: Any, events: list[tuple[str, str]]) -> None:
        self.session, self.events = session, events

    def add(self, requests: Any) -> list[int]:
        self.events.append(("add", requests[0].row_id))
        return list(self.session.add(requests))

    def poll(self) -> Any:
        return self.session.poll()

    @property
    def waiting(self) -> int:
        return int(self.session.waiting)

    @property
    def idle(self) -> bool:
        return bool(self.session.idle)

    def close(self) -> None:
        self.session.close()


class _SpyOps(RealOps):
    """The loaded stages' calls, noting the talker's admissions (a session's or a static batch's) and
    code2wav's batches ("code2wav", first row id) in ``events``."""

    def __init__(self, engine: Engine, events: list[tuple[str, str]]) -> None:
        stages = engine.stages
        super().__init__(stages, engine.opts, decode_options(stages.cfg, engine.opts, engine.sizing), None)
        self.events = events

    @override
    def talk(self, requests: Any, dec: Any) -> Any:
        self.events.append(("add", requests[0].row_id))
        return super().talk(requests, dec)

    @override
    def session(self, slots: int) -> Any:
        return _SpySession(super().session(slots), self.events)

    @override
    def finish(self, prepared: Any, results: Any) -> Any:
        self.events.append(("code2wav", prepared.rows[0].id))
        return super().finish(prepared, results)


def _synth(tts: Any, **opts: Any) -> tuple[dict[str, tuple], list[tuple]]:
    """Records (diagnostics without wall times, WAV bytes) by id, and the order of talker admissions
    ("add", first row id) and code2wav batches ("code2wav", first row id)."""
    events: list[tuple[str, str]] = []
    engine = Engine(tts.stages, replace(tts.options, **opts))
    # wall times differ
    got = {rec.id: (replace(rec, seconds={}), b"" if rec.audio is None else rec.audio.tobytes())
           for rec in engine.run(_rows(tts), ops=_SpyOps(engine, events))}
    return got, events


def test_continuous_across_batches_gives_the_static_bytes(tts: Any) -> None:
    static, static_events = _synth(tts, schedule="static")
    assert len(static) == len(TEXTS) and all(d.ok and w for d, w in static.values())
    assert len({sum(d.tokens) for d, _ in static.values()}) > 3  # rows of many lengths
    batches = [rid for kind, rid in static_events if kind == "code2wav"]
    assert len(batches) == 4  # 8 rows, batch size 2
    # static: a batch's talker work starts only after the batch before it went through code2wav
    assert [k for k, _ in static_events] == ["add", "code2wav"] * 4

    fe = tts.stages.frontend
    for variant in ({"talker_slots": None}, {"talker_slots": 1}, {"talker_slots": 3},
                    {"code2wav_thread": True}, {"prompt_cache": "cold"}):
        cache = fe.prompt_cache
        if variant.get("prompt_cache"):
            fe.prompt_cache = type(cache)(0)  # every prompt encoded again: misses only
        try:
            opts = {k: v for k, v in variant.items() if k != "prompt_cache"}
            cont, events = _synth(tts, schedule="continuous", **opts)
        finally:
            fe.prompt_cache = cache
        assert cont.keys() == static.keys(), variant
        for rid, (diag, wav) in static.items():
            assert cont[rid][0] == diag, (variant, rid)  # tokens, stop reasons, sampler counters, ...
            assert cont[rid][1] == wav, (variant, rid)  # the same float32 audio, bit for bit
        # same code2wav batches
        assert [rid for kind, rid in events if kind == "code2wav"] == batches, variant
        first_c2w = [k for k, _ in events].index("code2wav")
        assert [k for k, _ in events[:first_c2w]].count("add") >= 2, (variant, events)  # the talker ran ahead


def test_schedule_static_and_continuous_write_the_same_files(tiny_model_dir: Path, tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    a = _run(manifest, tiny_model_dir, tmp_path / "static", "--schedule", "static", "--batch-size", "2")
    b = _run(manifest, tiny_model_dir, tmp_path / "cont", "--batch-size", "2")
    assert wav_bytes(tmp_path / "static") == wav_bytes(tmp_path / "cont") and len(a) == len(b) > 2
    strip = ("seconds", "finished_at", "run_id")  # wall times and which run wrote the row
    assert {k: {f: v for f, v in d.items() if f not in strip} for k, d in a.items()} == \
        {k: {f: v for f, v in d.items() if f not in strip} for k, d in b.items()}
    summary = (tmp_path / "cont" / "summary.json").read_text()
    assert '"schedule": "continuous"' in summary


@pytest.mark.gpu
def test_continuous_on_cuda_with_code2wav_on_its_stream_writes_the_static_bytes(tiny_model_dir: Path,
                                                                                 tmp_path: Path) -> None:
    """On CUDA code2wav runs on a worker thread and its own stream while the talker goes on: the
    files equal a static run's (same device, fp32). One row per batch and one talker slot, so both
    schedules run every row through the same kernel shapes: across shapes CUDA promises logits to
    rounding, not tokens bit for bit (tests/talker/test_cuda_graphs.py, near ties)."""
    from tests.run_tokens import run_difference, talker_tokens

    manifest = _manifest(tmp_path)
    cuda = ("--device", "cuda", "--dtype", "fp32", "--batch-size", "1", "--talker-slots", "1")
    runs = []
    for name, extra in (("static", ("--schedule", "static")), ("cont", ())):
        with talker_tokens() as tokens:
            _run(manifest, tiny_model_dir, tmp_path / name, *cuda, *extra)
        runs.append((tokens, wav_bytes(tmp_path / name)))
    diff = run_difference(*runs)  # token ids first, then how far the WAV bytes differ
    assert diff is None, f"static vs continuous on CUDA: {diff}"
