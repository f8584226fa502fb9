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

    def as_record(self) -> dict[str, Any]:
        """JSON form for ``runs.jsonl`` / ``summary.json`` (a ``engine`` field)."""
        return {"device": self.device, "backend": self.backend, "dtype": self.dtype,
                "stage_dtypes": dict(self.stage_dtypes), "sizing": self.sizing.as_record(),
                "talker_slots_used": self.talker_slots_used, "graphs": self.graphs.as_record(),
                "peak_memory": self.peak.as_record()}

    def describe(self) -> list[str]:
        """Printed lines: dtypes, sizes, graphs, peak memory."""
        dtypes = ", ".join(f"{k} {v}" for k, v in self.stage_dtypes.items())
        g = self.graphs
        graphs = f"CUDA graphs {g.resolved}: {g.captures} captured, {g.reused} of {g.sessions} sessions reused them"
        if g.disabled:
            graphs += f"; off for the process since: {g.disabled}"
        return [f"engine: {self.backend} {self.dtype} ({dtypes})", *self.sizing.describe(), graphs,
                self.peak.describe()]
