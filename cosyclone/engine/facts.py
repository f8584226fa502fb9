"""What an engine chose and measured, in one typed record: the part of a run's account that only the
engine knows (device and stage dtypes, the sizes it ran at, what its CUDA graphs did, peak memory).

Why one object: the run folder (``runs.jsonl``, ``summary.json``), ``--dry-run`` and the GPU check
each want these, and each used to dig them out of the engine's internals. :meth:`Engine.facts`
builds an :class:`EngineFacts` at any time (during a run it reflects the run so far);
:meth:`EngineFacts.as_record` is its JSON form and :meth:`EngineFacts.describe` its printed lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cosyclone.base.memory import PeakMemory
from cosyclone.engine.sizing import Sizing
from cosyclone.talker.occupancy import OccupancyFigures


@dataclass(frozen=True)
class GraphFacts:
    """CUDA graphs in this process: what was asked, what ran, and whether they went off."""

    resolved: str  # the engine's --cuda-graphs as resolved: "on" | "off" (what was asked and allowed)
    captures: int  # graphs captured in this process (one per slot count and kv_len bucket met)
    replays: int  # decode steps that ran as a replayed graph in this process
    sessions: int  # talker sessions that decoded through pooled graphs
    reused: int  # of those, sessions that reused a step (and graphs) an earlier session captured
    disabled: str | None  # why graphs went off for the process (a failed capture; eager since), None: never

    def as_record(self) -> dict[str, Any]:
        return {"resolved": self.resolved, "captures": self.captures, "replays": self.replays,
                "sessions": self.sessions, "reused": self.reused, "disabled": self.disabled}


@dataclass(frozen=True)
class StageTime:
    """One stage's seconds in a run."""

    busy: float
    # seconds it worked (the frontend: its batch thread, or its prompt workers' seconds / workers)
    waiting: float  # seconds it had nothing to do (waited for its input)


#: The pipeline's stages, in the order a row passes them.
STAGES = ("frontend", "talker", "code2wav")
#: What ``bound_by`` names when the talker and code2wav share one device and the two together bound
#: the run: their busy seconds are one device's, so neither alone says what sets the pace.
DEVICE = "device"


@dataclass(frozen=True)
class StageSeconds:
    """Where a run's time went: each stage's busy and waiting seconds, the talker's idle-with-work,
    and each stage's share of the wall clock.

    Why the device stages count together: on one GPU (or one CPU) the talker's decode steps and
    code2wav's flow and HiFT take the same SMs (cores); a night whose talker is busy 60% of the wall
    and code2wav 35% is bound by the device at 95%, not by the talker. Read apart (two devices, or
    stand-in stages that only wait), the stage with the most busy seconds is the bound.
    """

    wall: float  # seconds from the pipeline's first work to now
    frontend: StageTime  # prompts and texts (prompt workers and the batch thread)
    talker: StageTime  # decode windows (busy); no row in its slots or queue (waiting)
    code2wav: StageTime  # flow and HiFT per finished batch
    talker_idle_with_work: float  # seconds the talker held rows in its slots but did not step
    shared_device: bool = True  # talker and code2wav on one device: their busy seconds add up on it

    @staticmethod
    def empty() -> StageSeconds:
        zero = StageTime(busy=0.0, waiting=0.0)
        return StageSeconds(wall=0.0, frontend=zero, talker=zero, code2wav=zero, talker_idle_with_work=0.0)

    def _busy(self) -> dict[str, float]:
        """The busy seconds ``bound_by`` compares: the frontend and the device (talker + code2wav)
        when they share it, else each stage."""
        if self.shared_device:
            return {"frontend": self.frontend.busy, DEVICE: self.talker.busy + self.code2wav.busy}
        return {name: getattr(self, name).busy for name in STAGES}

    @property
    def bound_by(self) -> str | None:
        """What set the run's pace: the stage (or, on a shared device, ``"device"``: talker and
        code2wav together) busy for the largest share of the run; None before any work."""
        busy = self._busy()
        return max(busy, key=lambda k: busy[k]) if any(busy.values()) else None

    @property
    def shares(self) -> dict[str, float]:
        """Each stage's busy seconds over the wall clock (0 to 1; the talker's and code2wav's may
        overlap in time, so ``device``, their sum on a shared device, may pass 1 where kernels run
        side by side)."""
        wall = max(self.wall, 1e-9)
        out = {name: getattr(self, name).busy / wall for name in STAGES}
        if self.shared_device:
            out[DEVICE] = out["talker"] + out["code2wav"]
        return out

    def as_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"wall": self.wall, "bound_by": self.bound_by,
                               "talker_idle_with_work": self.talker_idle_with_work,
                               "shared_device": self.shared_device,
                               "shares": {k: round(v, 4) for k, v in self.shares.items()}}
        for name in STAGES:
            t = getattr(self, name)
            out[name] = {"busy": t.busy, "waiting": t.waiting}
        return out

    def describe(self) -> str:
        """One printed line: what bounds the run and each stage's busy share."""
        if self.bound_by is None:
            return "stages: no work yet"
        sh = self.shares
        parts = [f"{name} busy {sh[name]:.0%}" for name in STAGES]
        if self.shared_device:
            parts.append(f"talker + code2wav on one device {sh[DEVICE]:.0%}")
        return (f"bound by {self.bound_by} ({', '.join(parts)}; talker idle with rows in its slots "
                f"{self.talker_idle_with_work:.1f} s)")


@dataclass(frozen=True)
class EngineFacts:
    """The engine's own account of a run (see the module docstring)."""

    device: str  # the torch device the stages run on ("cpu", "cuda")
    backend: str  # "cpu" | "cuda" | "rocm"
    dtype: str  # the resolved --dtype word: "fp32" | "bf16" | "fp16" | "mixed"
    stage_dtypes: dict[str, str]  # {"talker": backbone dtype, "flow": the DiT's, "hift": "fp32"}
    sizing: Sizing  # batch rows, talker slots, HiFT/flow budgets, prompt workers and where they came from
    talker_slots_used: int | None  # the slots of the last continuous session (None: none ran yet)
    graphs: GraphFacts  # CUDA graphs: resolved, captured, reused, disabled and why
    peak: PeakMemory  # host RSS peak; on a GPU max allocated and reserved (None on CPU)
    stages: StageSeconds = StageSeconds.empty()  # where the last pipeline's time went (busy, waiting, bound)
    occupancy: OccupancyFigures = OccupancyFigures()
    # the last pipeline's decode steps: live rows per step (mean_live_slots), steps per slot bucket

    def as_record(self) -> dict[str, Any]:
        """JSON form for ``runs.jsonl`` / ``summary.json`` (a ``engine`` field)."""
        return {"device": self.device, "backend": self.backend, "dtype": self.dtype,
                "stage_dtypes": dict(self.stage_dtypes), "sizing": self.sizing.as_record(),
                "talker_slots_used": self.talker_slots_used, "graphs": self.graphs.as_record(),
                "peak_memory": self.peak.as_record(), "stages": self.stages.as_record(),
                **self.occupancy.as_record()}

    def describe(self) -> list[str]:
        """Printed lines: dtypes, sizes, graphs, peak memory."""
        dtypes = ", ".join(f"{k} {v}" for k, v in self.stage_dtypes.items())
        g = self.graphs
        graphs = (
            f"CUDA graphs {g.resolved}: {g.captures} captured, "
            f"{g.reused} of {g.sessions} sessions reused them"
        )
        if g.disabled:
            graphs += f"; off for the process since: {g.disabled}"
        return [f"engine: {self.backend} {self.dtype} ({dtypes})", *self.sizing.describe(), graphs,
                self.peak.describe(), self.stages.describe(), self._describe_occupancy()]

    def _describe_occupancy(self) -> str:
        occ = self.occupancy
        if occ.mean_live_slots is None:
            return "decode: no step yet"
        buckets = ", ".join(f"{b} slots x {n}" for b, n in sorted(occ.buckets.items()))
        return (f"decode: {occ.steps} steps, {occ.mean_live_slots:.1f} live slots per step on average; "
                f"steps per bucket: {buckets}; {occ.moves} rows moved down")
