"""CUDA graphs captured once per process (``cosyclone/talker/graph_pool.py``), pinned on CPU through the
stand-in capture backend (:class:`EagerCapture`: the same warm-up/capture/replay state machine, no
graph): sessions of one shape share a pooled step and its graphs, a closed or dropped session frees
what it owned, and one failed capture turns graphs off for the whole process (no ``empty_cache``
after it) with its reason recorded on every path."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from typing_extensions import override

from cosyclone.talker import DecodeOptions, StepMechanics, TalkerSession, generate
from cosyclone.talker.graph_pool import PROCESS, free_device_cache
from cosyclone.talker.graphs import EagerCapture
from cosyclone.talker.sampler import SamplerOptions
from tests.capture import captured_with
from tests.talker.test_engine_equivalence import _key, _requests
from tests.talker.test_talker_decode import _model

SAMPLER = SamplerOptions(top_k=40, top_p=0.9)


class _Refuses(EagerCapture):
    @override
    def capture(self, thunk: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
        raise RuntimeError("operation not permitted when stream is capturing")


def _decode(model: Any, reqs: list, backend: Any, **kw: Any) -> tuple[list, TalkerSession]:
    with captured_with(backend):
        session = TalkerSession(
            model, DecodeOptions(sampler=SAMPLER, **kw, mechanics=StepMechanics(kv_bucket=8)), slots=3
        )
        session.add(reqs)
        out = sorted(session.drain(), key=lambda tr: tr[0])
        session.close()
    return _key([r for _, r in out]), session


def _without_graph_steps(rows: list) -> list:
    return [(*r[:-1], {k: v for k, v in r[-1].items() if k != "graph_steps"}) for r in rows]


def test_sessions_of_one_shape_share_one_step_and_capture_each_bucket_once() -> None:
    """With the cache a slot is sized for reserved up front (what the engine asks on a GPU) the
    pooled step never grows: its graphs serve every later session. A ``kv_len`` bucket is captured
    once, by whichever session first calls it past the warm-up (warm-up calls count across sessions)."""
    model, backend = _model(), EagerCapture()
    reqs = _requests(6, 2)
    eager, _ = _decode(model, reqs, None, cuda_graphs="off")
    runs = [_decode(model, reqs, backend, reserve_positions=160) for _ in range(3)]
    (first, s1), (second, s2), (third, s3) = runs
    # one step, one set of graphs
    assert s1.runner.engine is s2.runner.engine is s3.runner.engine and s1.runner.graphed is s3.runner.graphed
    assert s3.runner.graphed is not None
    assert backend.captures == len(s3.runner.graphed.replays) >= 2  # no bucket captured twice
    assert s3.runner.graph_report()[1] == 0 and s3.runner.graphs_used  # the third only replays
    assert _without_graph_steps(first) == _without_graph_steps(third) == _without_graph_steps(eager)
    assert (PROCESS.counts.sessions, PROCESS.counts.reused, PROCESS.counts.captures) == (
        3,
        2,
        backend.captures,
    )


def test_without_a_reserve_a_grown_step_settles_after_one_more_session() -> None:
    """A session that grew its cache captured some buckets on buffers it then replaced; the next
    session recaptures those (on the grown buffers) and from then on nothing is captured again."""
    model, backend = _model(), EagerCapture()
    reqs = _requests(6, 2)
    _decode(model, reqs, backend)
    _decode(model, reqs, backend)
    settled = backend.captures
    _decode(model, reqs, backend)
    assert backend.captures == settled


def test_generate_per_batch_reuses_the_pooled_step_across_batches() -> None:
    """The static schedule's shape: one generate() per batch, each a session of the batch's slot
    count on the process's pooled step. A batch longer than any before grows the step (its graphs
    are captured again on the new buffers); once it has met the longest batch, every batch replays."""
    model, backend = _model(), EagerCapture()
    opts = DecodeOptions(sampler=SAMPLER, mechanics=StepMechanics(kv_bucket=8))
    reqs = _requests(9, 4)
    batches = [reqs[:3], reqs[3:6], reqs[6:9]]
    want = [_key(generate(model, b, replace(opts, cuda_graphs="off"))) for b in batches]
    with captured_with(backend):
        # warm-up calls count across sessions: a (slot bucket, kv_len) key met once per pass is warmed up
        # twice and captured in the third pass
        for _ in range(3):
            assert [_without_graph_steps(_key(generate(model, b, opts))) for b in batches] == [
                _without_graph_steps(w) for w in want]
        settled = backend.captures
        got = [_key(generate(model, b, opts)) for b in batches]
    assert backend.captures == settled and PROCESS.counts.reused == 11 and len(PROCESS._pools[model]) == 1
    assert all(sum(r[-1]["graph_steps"] for r in g) > 0 for g in got)  # each batch replayed graphs


def test_a_closed_or_dropped_session_frees_what_it_owned_without_a_full_gc() -> None:
    model, backend = _model(), EagerCapture()
    reqs = _requests(4, 1)
    gc.disable()
    try:
        _, session = _decode(model, reqs, backend)
        ref = weakref.ref(session)
        del session
        assert ref() is None  # no reference cycle keeps a finished session (and its graphs) alive
        with captured_with(backend):
            dropped = TalkerSession(
                model, DecodeOptions(sampler=SAMPLER, mechanics=StepMechanics(kv_bucket=8)), slots=3
            )
            step = dropped.runner.engine
            del dropped  # never closed: its pooled step still goes back
            again = TalkerSession(
                model, DecodeOptions(sampler=SAMPLER, mechanics=StepMechanics(kv_bucket=8)), slots=3
            )
            assert again.runner.engine is step
            again.close()
    finally:
        gc.enable()
    session = TalkerSession(
        model,
        DecodeOptions(sampler=SAMPLER, cuda_graphs="off", mechanics=StepMechanics(kv_bucket=8)),
        slots=3,
    )
    session.add(reqs)
    session.drain()
    session.close()
    assert session.runner.engine.cache.capacity == 1  # an eager session's own cache goes at close


def test_a_failed_capture_turns_graphs_off_for_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    emptied: list[int] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    # before any failure, OOM recovery may empty the cache
    assert free_device_cache("cuda") and emptied == [1]
    model = _model()
    reqs = _requests(5, 3)
    eager, _ = _decode(model, reqs, None, cuda_graphs="off")
    failed, s1 = _decode(model, reqs, _Refuses())
    assert s1.graph_capture_error is not None and PROCESS.disabled == s1.graph_capture_error
    later, s2 = _decode(model, reqs, EagerCapture())  # a capture that would work: not tried again
    assert not s2.runner.graphs.enabled and s2.runner.graphs.reason.startswith(
        "off for this process since a capture failed"
    )
    assert not s2.runner.graphs_used and s2.graph_capture_error is None
    assert _without_graph_steps(failed) == _without_graph_steps(later) == _without_graph_steps(eager)
    # the allocator may still be capturing: no empty_cache
    assert not free_device_cache("cuda") and emptied == [1]
    assert not free_device_cache("cpu")


def test_out_of_memory_recovery_forgets_idle_pooled_steps() -> None:
    model, backend = _model(), EagerCapture()
    _decode(model, _requests(3, 0), backend)
    pooled = PROCESS._pools[model]
    assert len(pooled) == 1 and not pooled[0].in_use
    free_device_cache("cpu")
    assert PROCESS._pools[model] == []


def test_the_process_capture_backend_serves_every_session() -> None:
    """What engine-level tests use: with another capture backend for the process, a session asked
    for graphs (auto) captures through it on any device, as it would through CUDA on a GPU."""
    model = _model()
    made: list[EagerCapture] = []

    def factory() -> EagerCapture:
        made.append(EagerCapture())
        return made[-1]

    with captured_with(factory=factory):
        _, session = _decode(model, _requests(3, 5), None)
    assert session.runner.graphs.enabled and session.runner.graphs_used and made and made[-1].captures >= 1
    _, plain = _decode(model, _requests(3, 5), None)
    assert not plain.runner.graphs.enabled  # CPU without the stand-in: off


def test_every_path_of_an_engine_run_records_a_failed_capture(tiny_model_dir: Any) -> None:
    """Static batches, isolation retries and the continuous session decode through pooled graphs;
    a capture failure in any of them is in the engine's graph errors and its facts."""
    from cosyclone.engine import Engine
    from cosyclone.manifest import rows_from_dicts
    from cosyclone.options import RunOptions
    from tests.frontend.test_prompt_cache import ROOT

    engine = Engine.load(tiny_model_dir, RunOptions(device="cpu", max_tokens=6, n_timesteps=1, batch_size=2))
    rows = rows_from_dicts(
        [
            {
                "id": f"r{i}",
                "prompt_audio": str(ROOT / "manifests" / "prompts" / "speaker1.wav"),
                "prompt_text": "reference words",
                "text": t,
            }
            for i, t in enumerate(["Hello there.", "Short.", "One more line.", "The end."])
        ]
    ).rows
    runs = {}
    for schedule in ("static", "continuous"):
        for mode, factory in (("plain", None), ("graphs", EagerCapture), ("refused", _Refuses)):
            PROCESS.reset()
            on = Engine(engine.stages, replace(engine.opts, cuda_graphs="off" if factory is None else "on",
                                               schedule=schedule))
            if factory is None:
                recs = list(on.run(rows))
            else:
                with captured_with(factory=factory):
                    recs = list(on.run(rows))
            facts = on.facts().graphs
            runs[(schedule, mode)] = [(r.id, None if r.audio is None else r.audio.tobytes()) for r in recs]
            if mode == "graphs":
                assert facts.captures >= 1 and facts.disabled is None and not on.graph_errors
                assert schedule == "continuous" or facts.reused >= 1  # batch 2 replays batch 1's graphs
            if mode == "refused":
                assert facts.disabled and on.graph_errors == [facts.disabled], (schedule, on.graph_errors)
    for key, got in runs.items():
        assert got == runs[("static", "plain")], key  # graphs or not, failed or not: the same bytes
