"""The issue's "done when", through a real synth run of the tiny model: a manifest with seeds 2^63
and 2^64-1, a Chinese text with a newline and an emoji (and a ``meta`` speaker, where the manifest
takes ``meta``) exports to Parquet, WebDataset, NeMo and Lhotse, and every loader reads the exact
seed, text and speaker back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.manifest.rows import KNOWN
from tests.run_folders import ROOT

FAST = ["--max-tokens", "8", "--n-timesteps", "2", "--device", "cpu", "--quiet"]
PROMPT = str(ROOT / "manifests" / "prompts" / "speaker1.wav")
META = "meta" in KNOWN  # the manifest's meta object (a row's user fields)
ROWS: list[dict[str, Any]] = [
    {"id": "big", "seed": 2**63, "text": "你好，\n世界 🎉", "meta": {"speaker": "说话人", "language": "zh"}},
    {"id": "max", "seed": 2**64 - 1, "text": "Hello there.", "meta": {"speaker": "spk_b", "language": "en"}},
]


@pytest.fixture(scope="module")
def run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("real")
    manifest = work / "m.jsonl"
    lines = [{"prompt_audio": PROMPT, "prompt_text": "This is the reference speaker talking.",
              **{k: v for k, v in r.items() if k != "meta" or META}} for r in ROWS]
    manifest.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    res = CliRunner().invoke(app, ["synth", str(manifest), "--model-dir", str(tiny_model_dir), "--out",
                                   str(work / "out"), *FAST])
    assert res.exit_code == 0, res.output
    return work / "out"


def _same(rows: list[dict], seed_text: bool) -> None:
    got = {r["id"]: r for r in rows}
    assert sorted(got) == sorted(r["id"] for r in ROWS)
    for want in ROWS:
        r = got[want["id"]]
        assert r["seed"] == (str(want["seed"]) if seed_text else want["seed"]) and r["text"] == want["text"]
        if META:
            assert r["speaker"] == want["meta"]["speaker"]


def test_every_format_reads_back_the_exact_seed_text_and_speaker(run: Path, tmp_path: Path) -> None:
    import datasets
    import webdataset as wds

    for fmt in ("parquet", "webdataset", "nemo", "lhotse"):
        prompt = ["--include-prompt-audio"] if fmt == "parquet" else []
        res = CliRunner().invoke(
            app, ["export", str(run), "--format", fmt, "--to", str(tmp_path / fmt), *prompt]
        )
        assert res.exit_code == 0, res.output
    ds = datasets.load_dataset(str(tmp_path / "parquet"), split="train")
    _same([{k: v for k, v in r.items() if k not in ("audio", "prompt")} for r in ds], seed_text=False)
    raw = ds.cast_column("prompt", datasets.Audio(decode=False))
    assert all(r["prompt"]["bytes"] == Path(PROMPT).read_bytes() for r in raw)  # the recording itself
    _same([dict(r["json"]) for r in datasets.load_dataset(str(tmp_path / "webdataset"), split="train")], True)
    urls = sorted(str(p) for p in (tmp_path / "webdataset").glob("*.tar"))
    _same([json.loads(s["json"]) for s in wds.WebDataset(urls, shardshuffle=False)], seed_text=True)
    nemo = (tmp_path / "nemo" / "manifest.jsonl").read_text(encoding="utf-8").splitlines()
    _same([json.loads(x) for x in nemo], seed_text=True)
    lhotse = pytest.importorskip("lhotse")
    sups = lhotse.load_manifest(tmp_path / "lhotse" / "supervisions.jsonl.gz")
    _same([{"id": s.id, "text": s.text, "speaker": s.speaker, "seed": s.custom["seed"]} for s in sups], True)
