"""Out of memory costs only what cannot fit: the failed attempt's tensors are gone before the retry.

An injected stage (the talker's ``generate``, the flow's ``inference``) allocates a tensor, keeps a
weak reference to it and raises ``torch.OutOfMemoryError``; every later call first looks whether
those tensors are still alive. Recovery inside the ``except`` block would keep them (the traceback
holds the failed call's frames); recovery after it finds them dead. A row that cannot fit alone
fails; its batch-mates do not.
"""

from __future__ import annotations

import re
import weakref
from pathlib import Path
from typing import Any

import torch
from typing_extensions import override

from cosyclone.base.device import resolve
from cosyclone.engine import isolation
from cosyclone.engine import stages as pipeline
from cosyclone.engine.outcome import Failure
from cosyclone.manifest import ManifestRow
from cosyclone.model.config import released_config
from cosyclone.options import RunOptions
from tests.engine.test_pipeline_stub import Flow, Frontend, Hift, StubOps, generate

ROOT = Path(__file__).resolve().parents[2]


class Spy:
    """The failed attempts' big tensors (weakly) and, at each call, whether any was still alive."""

    def __init__(self) -> None:
        self.failed: list[weakref.ref[torch.Tensor]] = []
        self.alive_at_call: list[int] = []
        self.sizes: list[int] = []

    def enter(self, size: int) -> None:
        self.sizes.append(size)
        self.alive_at_call.append(sum(r() is not None for r in self.failed))

    def oom(self) -> None:
        big = torch.empty(1 << 18)  # the attempt's activations / KV cache
        self.failed.append(weakref.ref(big))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def _rows(ids: list[str]) -> list[ManifestRow]:
    return [ManifestRow(i + 1, rid, Path("p.wav"), "ref", f"text {rid}") for i, rid in enumerate(ids)]


def _stages(flow: Flow | None = None) -> pipeline.Stages:
    """Stub stages (the talker is a :class:`StubOps`' talker); the stubs stand in for the models."""
    stubs: Any = (Frontend(), None, flow or Flow(), Hift())
    return pipeline.Stages(released_config(), resolve("cpu", "fp32"), *stubs)


def _batch(stages: pipeline.Stages, rows: list[ManifestRow], opts: RunOptions,
           talker: Any = None) -> dict[str, Any]:
    """One batch through every stage at once, failures confined, on the stub stages' calls."""
    calls = StubOps(stages, opts, talker=talker)
    return {r.id: r for r in isolation.synthesize_batch(calls, stages, rows, opts)}


def test_talker_oom_frees_the_failed_attempt_before_halving_and_fails_only_what_cannot_fit() -> None:
    spy = Spy()

    def small_device(model: object, requests: list, options: object) -> list:
        spy.enter(len(requests))
        if len(requests) > 2 or any(r.row_id == "huge" for r in requests):
            spy.oom()
        return generate(model, requests, options)

    rows = _rows(["a", "b", "huge", "c", "d", "e"])
    out = _batch(_stages(), rows, RunOptions(max_tokens=4), talker=small_device)
    assert spy.sizes == [6, 3, 1, 2, 1, 1, 3, 1, 2]  # halves until what fits; "huge" alone still fails
    assert spy.alive_at_call == [0] * len(spy.sizes)  # every retry started with the failed tensors freed
    assert spy.failed and all(r() is None for r in spy.failed)
    assert out["huge"].status == "failed" and out["huge"].error_type == "OutOfMemoryError"
    assert "Traceback" in (out["huge"].traceback or "")  # the record keeps the text, not the frames
    assert [k for k, r in out.items() if r.status == "ok"] == ["a", "b", "c", "d", "e"]


class OomFlow(Flow):
    """The flow of a small device: more than one row, or the row marked ``huge``, does not fit."""

    def __init__(self, spy: Spy, huge: int) -> None:
        self.spy, self.huge = spy, huge

    @override
    def inference(self, token: torch.Tensor, token_len: torch.Tensor, prompt_token: torch.Tensor,
                  prompt_token_len: torch.Tensor, prompt_feat: torch.Tensor, embedding: torch.Tensor, *,
                  n_timesteps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        self.spy.enter(int(token.shape[0]))
        if token.shape[0] > 1 or int(token_len[0]) == self.huge:
            self.spy.oom()
        return super().inference(token, token_len, prompt_token, prompt_token_len, prompt_feat, embedding)


def test_code2wav_oom_frees_the_failed_call_and_fails_only_the_row_that_cannot_fit() -> None:
    spy = Spy()
    rows = _rows(["a", "bb", "ccc", "dddd"])  # segments of 2 + len("text " + id) tokens: 8, 9, 10, 11
    stages = _stages(OomFlow(spy, huge=10))
    out = _batch(stages, rows, RunOptions(max_tokens=50))
    assert spy.sizes == [4, 1, 1, 1, 1]
    assert spy.alive_at_call == [0, 0, 0, 0, 0]
    assert [k for k, r in out.items() if r.status == "failed"] == ["ccc"]
    assert out["ccc"].error_type == "OutOfMemoryError"
    assert "the batch raised OutOfMemoryError" in (out["ccc"].error or "")


def test_a_failure_keeps_the_record_and_no_frame() -> None:
    def deep() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    try:
        deep()
    except Exception as exc:
        f = Failure.of(exc)
    assert f.oom and not f.user and f.type_name == "OutOfMemoryError"
    assert "in deep" in (f.trace or "") and f.describe() == "OutOfMemoryError: CUDA out of memory"
    assert all(isinstance(v, (str, bool, type(None))) for v in vars(f).values())  # text only: no frame


def test_no_module_empties_the_cache_but_free_device_cache() -> None:
    """Every OOM path goes through ``graph_pool.free_device_cache`` (after a failed capture it must
    not empty the cache)."""
    calls = [str(p.relative_to(ROOT)) for p in (ROOT / "cosyclone").rglob("*.py")
             if re.search(r"\bempty_cache\(\)", p.read_text()) and p.name != "graph_pool.py"]
    assert calls == []
