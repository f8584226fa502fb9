"""CUDA graphs for the decode step (``cosyclone/talker/graphs.py``).

On CPU: ``auto`` resolves to off with the reason, ``off`` and ``auto`` give identical tokens, and
the graph wrapper's whole state machine (per-key warm-up, capture, replay, static input/output
buffers, fallback on a failed capture) runs through :class:`EagerCapture` and gives the plain
step's tokens. The ``gpu`` tests compare real captured graphs with eager decoding on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import pytest
import torch
from typing_extensions import override

from benchmarks.gpu_verdict import token_difference
from cosyclone.options import CudaGraphs
from cosyclone.talker import DecodeOptions, StepMechanics, generate
from cosyclone.talker.graph_pool import PROCESS
from cosyclone.talker.graphs import (
    EagerCapture,
    GraphChoice,
    GraphedStep,
    resolve_cuda_graphs,
)
from cosyclone.talker.sampler import SamplerOptions
from tests.capture import captured_with, graph_reports
from tests.samplers import diag
from tests.talker.test_engine_equivalence import _key, _requests
from tests.talker.test_talker_decode import _model

SAMPLER = SamplerOptions(top_k=40, top_p=0.9)


def _run(
    model: Any, reqs: list, backend: Any = None, **kw: Any
) -> tuple[list, list[tuple[GraphChoice, int]]]:
    """Each row's tokens, stop reason and sampler diagnostics; ``graph_steps`` (what ran as a
    replay, which differs by mode) goes to ``GRAPH_STEPS[-1]`` instead. ``backend``: the process
    captures with it (any device)."""
    opts = DecodeOptions(sampler=SAMPLER, slots=3, mechanics=StepMechanics(kv_bucket=8))
    with captured_with(backend), graph_reports() as seen:
        rows = _key(generate(model, reqs, replace(opts, **kw)))
    GRAPH_STEPS.append([d.pop("graph_steps") for *_, d in rows])
    return rows, seen


GRAPH_STEPS: list[list[int]] = []


def test_resolve_rules() -> None:
    cpu = resolve_cuda_graphs("auto", "cpu")
    assert cpu == GraphChoice(False, "device is cpu: CUDA graphs need a CUDA/ROCm device")
    assert cpu.value == "off"
    assert resolve_cuda_graphs("off", "cpu").reason == "off requested"
    with pytest.raises(ValueError, match="cuda_graphs must be one of auto, on, off"):
        resolve_cuda_graphs("yes", "cpu")
    assert resolve_cuda_graphs("on", "cpu") == cpu  # a resolved run's word for the same choice
    assert resolve_cuda_graphs("auto", "cpu", anywhere=True).value == "on"
    assert "legacy" in resolve_cuda_graphs("auto", "cpu", draw="legacy-multinomial", anywhere=True).reason
    assert not resolve_cuda_graphs("auto", "cpu", compile="eager", anywhere=True).enabled
    assert not resolve_cuda_graphs("off", "cpu", anywhere=True).enabled


def test_auto_on_cpu_is_off_and_equals_off() -> None:
    model = _model()
    reqs = _requests(7, 2)
    off, seen_off = _run(model, reqs, cuda_graphs="off")
    auto, seen_auto = _run(model, reqs, cuda_graphs="auto")
    assert auto == off
    assert GRAPH_STEPS[-2:] == [[0] * 7, [0] * 7]  # nothing replayed
    assert seen_auto == [(GraphChoice(False, "device is cpu: CUDA graphs need a CUDA/ROCm device"), 0)]
    assert seen_off == [(GraphChoice(False, "off requested"), 0)]


def test_graph_wrapper_state_machine_gives_plain_tokens() -> None:
    """Every step goes through GraphedStep (warm-up, "capture", replays per kv_len key): same
    tokens, stop reasons and counters as the plain step, and several keys were captured."""
    model = _model()
    reqs = _requests(9, 1)
    plain, _ = _run(model, reqs, cuda_graphs="off")
    be = EagerCapture()
    graphed, seen = _run(model, reqs, be, cuda_graphs="auto")
    assert graphed == plain
    (choice, captured), = seen
    assert choice.enabled and captured == be.captures and captured >= 2  # several kv_len buckets
    assert be.replays > captured  # later steps of a key only replay
    plain_steps, graph_steps = GRAPH_STEPS[-2:]
    assert plain_steps == [0] * 9
    # each row counts the replays its slot ran: at least one, at most its steps, never a warm-up step
    assert all(0 < g <= d["steps"] for g, (*_, d) in zip(graph_steps, graphed, strict=True)), graph_steps
    assert max(graph_steps) <= be.replays


class _Refuses(EagerCapture):
    @override
    def capture(self, thunk: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
        raise RuntimeError("operation not permitted when stream is capturing")


def test_failed_capture_falls_back_to_eager_with_reason() -> None:
    model = _model()
    reqs = _requests(6, 3)
    plain, _ = _run(model, reqs, cuda_graphs="off")
    got, seen = _run(model, reqs, _Refuses(), cuda_graphs="auto")
    assert got == plain
    (choice, captured), = seen
    assert not choice.enabled and captured == 0
    assert GRAPH_STEPS[-1] == [0] * 6  # the rows say that nothing ran as a graph
    assert choice.reason.startswith("capture failed for key ")
    assert choice.reason.endswith(": RuntimeError: operation not permitted when stream is capturing")


def test_session_says_what_really_ran() -> None:
    """A session reports what ran, not what was asked: ``graphs_used`` once a step replayed,
    ``graph_capture_error`` when a capture failed (the decode went on eagerly)."""
    from cosyclone.talker import TalkerSession

    model = _model()
    reqs = _requests(4, 5)
    for mode, backend, used, error in (
        ("auto", EagerCapture(), True, None),
        ("off", EagerCapture(), False, None),
        ("auto", _Refuses(), False, "capture failed for key "),
    ):
        PROCESS.reset()  # each mode in a fresh process (pooled steps keep what an earlier mode captured)
        with captured_with(backend):
            opts = DecodeOptions(sampler=SAMPLER, cuda_graphs=cast(CudaGraphs, mode),
                                 mechanics=StepMechanics(kv_bucket=8))
            session = TalkerSession(model, opts, slots=2)
            session.add(reqs)
            res = [r for _, r in session.drain()]
            session.close()
        assert len(res) == 4 and session.runner.graphs_used is used, mode
        assert (session.graph_capture_error or "").startswith(error or "") and (error is None) == (
            session.graph_capture_error is None)
        assert (sum(diag(r).graph_steps for r in res) > 0) is used


def test_static_buffers_copy_inputs_and_alias_outputs() -> None:
    """A callable with tensor inputs: each call's arguments reach the static buffers by copy, the
    outputs are the same static tensors every call (valid until the next call), per key."""
    calls: list[tuple[int, ...]] = []

    def fn(k: int, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append((a.data_ptr(), b.data_ptr()))
        return a * 2 + b, a - b

    key = {"k": 0}
    step = GraphedStep(fn, backend=EagerCapture(), warmup=1)
    outs = []
    for i in range(5):
        a, b = torch.full((3,), float(i)), torch.arange(3.0)
        y, z = step(key["k"], a, b)
        assert torch.equal(y, a * 2 + b) and torch.equal(z, a - b)
        outs.append(y)
    assert len({p for p in calls}) == 1  # fn always read the key's static buffers, never the arguments
    assert outs[1] is outs[2] is outs[4]  # replays return the same static output tensors
    assert step.captured == 1
    key["k"] = 1  # a new step shape: its own buffers, warm-up and capture
    y, _ = step(key["k"], torch.ones(3), torch.zeros(3))
    assert torch.equal(y, torch.full((3,), 2.0)) and step.captured == 1 and len(step.inputs) == 2


# -- on a GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_the_process_streams_are_drawn_once_and_distinct_on_cuda() -> None:
    """code2wav's stream and the capture stream: the same objects on every call, three different
    device streams (theirs and the default), and every pooled capture runs on the one capture stream."""
    from cosyclone.base.streams import capture_stream, code2wav_stream
    from cosyclone.talker.graphs import CudaGraphCapture

    dev = torch.device("cuda")
    c2w, cap = code2wav_stream(dev), capture_stream(dev)
    for _ in range(40):  # more draws than the pool holds: a fresh draw would have wrapped by now
        torch.cuda.Stream(device=dev)
        assert code2wav_stream(dev) is c2w and capture_stream(dev) is cap
    handles = {c2w.cuda_stream, cap.cuda_stream, torch.cuda.default_stream(dev).cuda_stream}
    assert len(handles) == 3
    assert CudaGraphCapture(dev).stream is cap and CudaGraphCapture(dev).stream is cap


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_tokens_equal_eager_on_cuda(dtype: torch.dtype) -> None:
    """Captured graphs replay the eager step exactly: same tokens and counters (fp32 and bf16:
    the same kernels run either way), with several kv_len buckets captured."""
    model = _model().to(device="cuda", dtype=dtype)
    model.llm_decoder.to(torch.float32)
    reqs = _requests(9, 1)
    with torch.inference_mode():
        eager, seen_e = _run(model, reqs, cuda_graphs="off")
        graphed, seen_g = _run(model, reqs, cuda_graphs="auto")
    assert seen_e[0][0].reason == "off requested"
    (choice, captured), = seen_g
    assert choice.enabled, choice.reason
    assert captured >= 2
    diff = token_difference([r[1] for r in eager], [r[1] for r in graphed], names=[r[0] for r in eager])
    assert diff is None, f"graphs vs eager: {diff}"  # tokens first: where they part is the finding
    assert graphed == eager  # the same shapes both ways: a replay runs the eager step's own kernels
    eager_steps, graph_steps = GRAPH_STEPS[-2:]
    assert eager_steps == [0] * 9 and sum(graph_steps) > 0, graph_steps  # graphs really ran


@pytest.mark.gpu
def test_batch_shapes_agree_up_to_near_ties_on_cuda() -> None:
    """What CUDA can promise across batch shapes, and no more: a different slot count runs other
    kernels (cuBLAS and attention pick theirs by shape), so a row's logits agree with its logits
    alone to rounding, not bit for bit, and a greedy token can only flip where its two candidates'
    logits were that close. Checked (fp32, greedy, every row alone vs all together): at every step
    up to a row's first differing token its logits agree within tolerance, so the two ids chosen
    where the tokens part were a near tie."""
    from cosyclone.base.device import apply_precision
    from tests.host_session import host_generate
    from tests.samplers import GreedySampler

    apply_precision()  # fp32 is fp32 (no TF32), as every run sets it
    model = _model().to(device="cuda", dtype=torch.float32)
    reqs = _requests(6, 4)

    def run(slots: int) -> tuple[list[list[int]], dict[tuple[int, int], torch.Tensor]]:
        seen: dict[tuple[int, int], torch.Tensor] = {}

        def hook(logits: torch.Tensor, rows: torch.Tensor, step: int) -> torch.Tensor:
            for i, r in enumerate(rows.tolist()):
                seen[(r, step)] = logits[i].float().cpu()
            return logits

        sampler = GreedySampler([int(2 * r.target_len) for r in reqs], model.cfg.speech_token_size)
        opts = DecodeOptions(slots=slots, max_len_override=24, mechanics=StepMechanics(kv_bucket=8))
        return [
            r.raw_tokens for r in host_generate(model, reqs, opts, sampler=sampler, logits_hook=hook)
        ], seen

    with torch.inference_mode():
        alone, logits_alone = run(1)
        together, logits_together = run(6)
    for r, (a, b) in enumerate(zip(alone, together, strict=True)):
        part = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        for step in range(part + 1):
            if (r, step) not in logits_alone or (r, step) not in logits_together:
                break  # the row ended
            la, lb = logits_alone[(r, step)], logits_together[(r, step)]
            tol = 1e-4 * (1.0 + la.abs().max().item())
            assert torch.allclose(la, lb, rtol=0, atol=tol), (r, step, (la - lb).abs().max().item())
            if step == part and part < min(len(a), len(b)):  # where the tokens part: a near tie
                assert abs(la[a[part]] - la[b[part]]).item() <= 2 * tol, (r, part)


@pytest.mark.gpu
def test_synth_on_cuda_records_graphs_on_and_matches_off(tiny_model_dir: Any, tmp_path: Any) -> None:
    """The real CLI on CUDA: ``--cuda-graphs auto`` resolves to on (recorded in summary.json) and
    writes the tokens and WAV bytes ``--cuda-graphs off`` writes (token ids compared first)."""
    import json

    from typer.testing import CliRunner

    from cosyclone.cli import app
    from tests.engine.test_batch_invariance import _manifest
    from tests.run_folders import diags, wav_bytes
    from tests.run_tokens import run_difference, talker_tokens

    assert resolve_cuda_graphs("auto", "cuda").enabled
    manifest = _manifest(tmp_path)
    runs = {}
    for mode in ("off", "auto"):
        out = tmp_path / mode
        with talker_tokens() as tokens:
            res = CliRunner().invoke(
                app,
                [
                    "synth",
                    str(manifest),
                    "--model-dir",
                    str(tiny_model_dir),
                    "--out",
                    str(out),
                    "--device",
                    "cuda",
                    "--dtype",
                    "fp32",
                    "--n-timesteps",
                    "2",
                    "--cuda-graphs",
                    mode,
                ],
            )
        assert res.exit_code == 0, res.output
        summary = json.loads((out / "summary.json").read_text())
        assert summary["last_run"]["options"]["cuda_graphs"] == ("on" if mode == "auto" else "off")
        replayed = [seg["graph_steps"] for d in diags(out).values() for seg in d["sampler"]]
        assert (sum(replayed) > 0) is (mode == "auto"), (mode, replayed)  # graphs really ran, or none did
        graphs = summary["last_run"]["cuda_graphs"]  # the run's own account agrees with its rows
        assert graphs["used"] is (mode == "auto") and graphs["graph_steps"] == sum(replayed)
        assert graphs["capture_errors"] == []
        runs[mode] = (tokens, wav_bytes(out))
    diff = run_difference(runs["off"], runs["auto"])
    assert diff is None, f"--cuda-graphs auto vs off: {diff}"


def test_cuda_capture_protocol_with_fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """CudaGraphCapture's calls, checked on CPU against stand-ins (real semantics need a GPU, see the ``gpu``
    tests): the ONE side stream it is handed serves every warm-up and capture; it first waits for the current
    stream and is waited on after; a capture waits only on its own stream (no device-wide synchronize: that
    would wait for code2wav's stream too), brackets the step with ``capture_begin``/``capture_end`` in
    thread-local error mode (no ``torch.cuda.graph``: its ``__enter__`` synchronizes and empties the caches
    every capture), the first graph's pool is shared by later captures, replay is the graph's own, and a step
    that raises during capture still ends it and its own error propagates. The keyword arguments used exist in
    this torch's ``capture_begin``."""
    import inspect

    from cosyclone.talker.graphs import CudaGraphCapture

    inspect.signature(torch.cuda.CUDAGraph.capture_begin).bind(
        None, pool=None, capture_error_mode="thread_local"
    )
    events: list[Any] = []
    made: list[str] = []

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait_stream(self, other: Stream) -> None:
            events.append(("wait", self.name, other.name))

    current = Stream("current")

    def new_stream(device: Any = None) -> Stream:
        made.append("side")
        return Stream(f"side{len(made)}")

    def no_new_stream(device: Any = None) -> Stream:
        raise AssertionError("a capture draws no stream: it is handed the process's capture stream")

    class StreamCtx:
        def __init__(self, s: Stream) -> None:
            self.s = s

        def __enter__(self) -> None:
            events.append(("enter", self.s.name))

        def __exit__(self, *exc: object) -> None:
            events.append(("exit", self.s.name))

    class Graph:
        n = 0

        def __init__(self) -> None:
            Graph.n += 1
            self.id = Graph.n

        def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
            events.append(("begin", self.id, pool, capture_error_mode))

        def capture_end(self) -> None:
            events.append(("end", self.id))

        def pool(self) -> str:
            return f"pool{self.id}"

        def replay(self) -> None:
            events.append(("replay", self.id))

    def no_graph_cm(*a: Any, **k: Any) -> None:
        raise AssertionError("torch.cuda.graph empties the caches on every capture: not used")

    monkeypatch.setattr(torch.cuda, "Stream", no_new_stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(torch.cuda, "stream", StreamCtx)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(("sync",)))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", no_graph_cm)

    cap = CudaGraphCapture("cpu", stream=new_stream())  # type: ignore[arg-type]
    side = [("wait", "side1", "current"), ("enter", "side1")]
    back = [("exit", "side1"), ("wait", "current", "side1")]
    def run() -> int:
        events.append(("run",))
        return 7

    def step() -> str:
        events.append(("step",))
        return "o1"

    assert cap.warmup(run) == 7
    assert cap.warmup(lambda: 8) == 8
    assert events == [*side, ("run",), *back, *side, *back]
    events.clear()
    replay1, out1 = cap.capture(step)
    replay2, out2 = cap.capture(lambda: "o2")
    assert events == [*side, ("begin", 1, None, "thread_local"), ("step",), ("end", 1), *back,
                      *side, ("begin", 2, "pool1", "thread_local"), ("end", 2), *back]
    assert (out1, out2) == ({"out": "o1"}, {"out": "o2"}) and len(cap.graphs) == 2
    events.clear()
    replay2()
    replay1()
    assert events == [("replay", 2), ("replay", 1)]
    events.clear()

    def bad() -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    with pytest.raises(RuntimeError, match="operation not permitted"):
        cap.capture(bad)
    assert events == [*side, ("begin", 3, "pool1", "thread_local"), ("end", 3), *back]
    assert len(cap.graphs) == 2 and made == ["side"]  # one side stream for every warm-up and capture
