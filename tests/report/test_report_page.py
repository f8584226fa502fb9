"""``cosyclone report OUT --html``: a tiny-model folder with eval results, rendered in headless Chromium.

The folder is real (the tiny model's synth of the example manifest, then ``evaluate`` with a
stand-in ASR and speaker encoder, so scores.jsonl and scores_summary.json are eval's own); the page
must load with no console error and no request beyond itself, show every plot, and give every
listed row an output and a prompt player whose audio decodes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.eval.asr import AsrOptions, Transcript
from cosyclone.eval.evaluate import EvalOptions, Models, evaluate
from cosyclone.eval.thresholds import Thresholds
from tests.browser import open_page, require_chromium

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "manifests" / "example.jsonl"
PLOTS = ("duration", "chars_per_s", "tokens_per_text_token", "stages", "error_rate", "similarity", "sampler")


class HeardEverything:
    """A stand-in ASR: hears every row's text, but one word of the first row wrong."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.calls = 0

    def info(self) -> dict[str, Any]:
        return {"backend": "stand-in", "model": "none"}

    def transcribe(self, waves: list[np.ndarray], languages: list[str | None]) -> list[Transcript]:
        out = []
        for _ in waves:
            text = self.texts[self.calls % len(self.texts)]
            out.append(Transcript(text.replace("welcome", "become"), "en", "forced", None))
            self.calls += 1
        return out


class Loudness:
    """A stand-in speaker encoder: a wave's level and spread."""

    name = "loudness"

    def embed(self, wave16: np.ndarray) -> np.ndarray:
        return np.array([float(np.abs(wave16).mean()) + 1e-3, float(wave16.std()) + 1e-3, 0.5], np.float32)

    def info(self) -> dict[str, Any]:
        return {"backend": "loudness"}


@pytest.fixture(scope="module")
def evaluated(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_chromium()  # before the synthesis: without a browser there is nothing to check
    out = tmp_path_factory.mktemp("night") / "out"
    res = CliRunner().invoke(
        app,
        ["synth", str(MANIFEST), "--model-dir", str(tiny_model_dir), "--out", str(out), "--max-tokens", "40"],
    )
    assert res.exit_code == 0, res.output
    texts = [line.split('"text": "')[1].split('"')[0] for line in MANIFEST.read_text().splitlines() if line]
    evaluate(
        out,
        MANIFEST,
        EvalOptions(
            asr=AsrOptions(model="none", batch_size=8),
            speaker_models=("loudness",),
            thresholds=Thresholds(max_wer=0.1),
        ),
        models=Models(asr=HeardEverything(texts), encoders=[Loudness()]),  # type: ignore[arg-type]
    )
    assert (out / "scores.jsonl").is_file() and (out / "scores_summary.json").is_file()
    return out


def _report(args: list[str]) -> Any:
    res = CliRunner().invoke(app, ["report", *args])
    assert res.exit_code == 0, res.output
    return res


def test_the_page_of_an_evaluated_folder_renders_offline_with_every_plot_and_player(
    evaluated: Path, tmp_path: Path
) -> None:
    page = tmp_path / "laptop" / "night.html"
    page.parent.mkdir()
    res = _report([str(evaluated), "--html", str(page)])
    assert f"wrote {page}" in res.output and "rows to listen to" in res.output
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", text)  # nothing to fetch
    listed = text.count('class="row"')
    assert listed == 4  # the example's four rows: every one is cut at the tiny model's cap
    visit = open_page(
        page,
        {
            "plots": "[...document.querySelectorAll('figure')].map(f => [f.id, "
            "f.querySelector('img').complete && f.querySelector('img').naturalWidth > 0])",
            "players": "[...document.querySelectorAll('.row')].map(r => "
            "[...r.querySelectorAll('audio')].map(a => [a.readyState, a.duration, a.error === null]))",
            "heard": "[...document.querySelectorAll('.row .text')]"
            ".some(t => t.textContent.includes('become'))",
        },
        settle="[...document.querySelectorAll('audio')].every(a => a.readyState >= 1 || a.error)",
    )
    assert visit.console_errors == []
    others = [u[:80] for u in visit.requests if not u.startswith("data:") and u != page.resolve().as_uri()]
    assert others == []
    assert visit.probes["plots"] == [[f"plot-{key}", True] for key in PLOTS]
    players = visit.probes["players"]
    assert len(players) == listed
    for row in players:
        assert len(row) == 2  # the output and its prompt
        for ready, duration, ok in row:
            assert ok and ready >= 1 and duration > 0.5
    assert visit.probes["heard"]  # eval's transcript is on the card


def test_linked_audio_plays_from_the_folder_beside_the_page(evaluated: Path) -> None:
    page = evaluated.parent / "linked.html"
    _report([str(evaluated), "--html", str(page), "--link-audio"])
    text = page.read_text(encoding="utf-8")
    assert 'src="out/wavs/' in text and "data:audio" not in text
    visit = open_page(
        page,
        {"players": "[...document.querySelectorAll('audio')].map(a => [a.readyState, a.duration])"},
        settle="[...document.querySelectorAll('audio')].every(a => a.readyState >= 1 || a.error)",
    )
    assert visit.console_errors == []
    assert all(not u.startswith(("http:", "https:")) for u in visit.requests)
    assert visit.probes["players"] and all(r >= 1 and d > 0.5 for r, d in visit.probes["players"])
