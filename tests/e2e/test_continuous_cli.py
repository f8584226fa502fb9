"""Continuous batching through the real CLI: a batch whose segments take the talker's slots a few
at a time (``--talker-slots``) writes byte-identical WAVs, tokens and sampler counters to the same
batch decoded all at once, whatever the slot count (segments of different lengths leave their
slots at different steps, so later ones are admitted while others are mid-decode)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from cosyclone.cli import app

from .test_batch_invariance import _manifest
from .test_cli import diags


def _run(manifest: Path, model_dir: Path, out: Path, slots: int | None) -> dict[str, dict]:
    extra = [] if slots is None else ["--talker-slots", str(slots)]
    res = CliRunner().invoke(app, ["synth", str(manifest), "--model-dir", str(model_dir), "--out", str(out),
                                   "--device", "cpu", "--n-timesteps", "2", "--batch-size", "8",
                                   "--seed", "3", *extra])
    assert res.exit_code == 0, res.output
    return diags(out)


def test_talker_slots_give_byte_identical_wavs(tiny_model_dir: Path, tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    static = _run(manifest, tiny_model_dir, tmp_path / "all", None)
    assert len({sum(d["tokens"]) for d in static.values()}) > 1  # rows of different lengths
    for slots in (1, 3):
        cont = _run(manifest, tiny_model_dir, tmp_path / f"s{slots}", slots)
        assert set(cont) == set(static)
        for rid, want in static.items():
            got = cont[rid]
            assert got["tokens"] == want["tokens"] and got["sampler"] == want["sampler"], (slots, rid)
            a = (tmp_path / "all" / "wavs" / f"{rid}.wav").read_bytes()
            b = (tmp_path / f"s{slots}" / "wavs" / f"{rid}.wav").read_bytes()
            assert a == b and len(a) > 44, (slots, rid)
