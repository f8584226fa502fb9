"""An out-of-memory error in the shared talker session costs only the rows that cannot fit, and the
retry starts after the failed attempt's tensors are gone (recovery runs after the ``except`` block:
a traceback keeps every frame of the failed attempt alive)."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

from cosyclone.engine import Engine
from cosyclone.engine import stages as stage_calls
from cosyclone.manifest import rows_from_dicts
from cosyclone.options import RunOptions
from cosyclone.talker.request import prompt_length

ROOT = Path(__file__).resolve().parents[2]
TEXTS = {
    "a": "Hi.",
    "b": "Short.",
    "long": "One two three four five six seven eight nine ten eleven.",
    "c": "Yes.",
}


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    return Engine.load(tiny_model_dir, RunOptions(device="cpu", max_tokens=6, n_timesteps=1, batch_size=4))


def test_an_oom_in_the_talker_frees_the_failed_attempt_and_fails_only_what_cannot_fit(engine: Engine) -> None:
    rows = rows_from_dicts([{"id": k, "prompt_audio": str(ROOT / "manifests" / "prompts" / "speaker1.wav"),
                             "prompt_text": "reference words", "text": t} for k, t in TEXTS.items()]).rows
    prepared = stage_calls.prepare_batch(engine.stages, rows, engine.opts)
    lengths = {rid: prompt_length(stage_calls.to_talker_request(req)) for rid, req in prepared.segments}
    assert len(lengths) == len(prepared.segments) == 4  # one segment per row
    fits = max(n for rid, n in lengths.items() if rid != "long")
    assert lengths["long"] > fits

    model: Any = engine.stages.talker
    real = model.prefill
    failed: list[weakref.ref[torch.Tensor]] = []  # a tensor each failed attempt held in its frame
    alive_at_retry: list[bool] = []

    def prefill(
        embeds: torch.Tensor, lengths: torch.Tensor, idx: torch.Tensor, *, cache: Any
    ) -> torch.Tensor:
        if len(failed) == 1 and not alive_at_retry:  # the first call after the shared session failed
            alive_at_retry.append(failed[0]() is not None)
        if int(lengths.max()) > fits:  # the long row does not fit the "device"
            scratch = torch.ones(1 << 16)
            failed.append(weakref.ref(scratch))
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected; {scratch.numel()} held)")
        return real(embeds, lengths, idx, cache=cache)

    model.prefill = prefill
    try:
        out = {r.id: r for r in engine.run(rows)}
    finally:
        del model.prefill
    assert alive_at_retry == [False], "the retry started while the failed attempt's tensors were alive"
    assert [k for k, r in out.items() if not r.ok] == ["long"]
    assert "out of memory" in (out["long"].error or "") and out["long"].reason
    assert all(out[k].ok and out[k].audio is not None for k in ("a", "b", "c"))
