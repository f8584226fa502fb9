"""What a run should take before it runs: each stage's rows per second from a cost table, and the
stage that bounds the pipeline.

Why: the pipeline (:mod:`.schedule`) overlaps its stages, so a run goes at its slowest stage's
pace, not at the sum of their costs. Given what one unit of work costs each stage on a device
(:class:`StageCosts`) and the run's sizes (talker slots, prompt workers), :func:`project` gives
each stage's rows per second, the bound and the time for N rows. ``--dry-run`` prints it and
``make bench`` prints it for 10,000 distinct-prompt rows of 10 s on an H100; the real scheduler,
run over stand-in stages of set costs, is bound where this projects.

On one device the talker and code2wav share the SMs (the cores): a row costs the device its decode
steps plus its flow and HiFT, so the device's rows per second is the two stages' together (the
harmonic sum, :func:`project` with ``shared_device``), and the run is bound by the frontend or by
that device, never by the talker alone. Counting them as two devices projected a pace one card
cannot keep. (Kernels of the two can overlap a little on a GPU; the sum is the safe side.)

Every figure in a table says where it comes from; an estimate says so, a measurement names its machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from cosyclone.engine.facts import DEVICE

#: Speech tokens per second of audio (25 Hz FSQ tokens).
TOKENS_PER_SECOND = 25


@dataclass(frozen=True)
class StageCosts:
    """Seconds one unit of work costs each stage on a device."""

    device: str  # what the figures are for
    prompt_s: float
    # frontend: one distinct prompt (decode, mels, speech tokenizer, CAM++) on one prompt worker
    text_s: float  # frontend: one row's text (normalization, tokenizer) on the batch thread
    step_s: float  # talker: one decode step of every slot together, at the sized slot count
    code2wav_s: float  # code2wav: flow and HiFT per second of audio, batched
    sources: tuple[str, ...]  # where each figure comes from, one line each

    def scaled(self, factor: float) -> StageCosts:
        """Every cost times ``factor`` (the same shape in milliseconds, for stand-in stages)."""
        return StageCosts(self.device, self.prompt_s * factor, self.text_s * factor, self.step_s * factor,
                          self.code2wav_s * factor, self.sources)


#: What one distinct 10 s prompt costs the frontend on one CPU core: MEASURED, not estimated, by
#: ``python -m benchmarks.released_frontend`` over the frontend of the released geometry (the v3 speech
#: tokenizer, 242M weights, and CAM++, 6.8M, random weights: cost follows the geometry) through the
#: product's own ``Frontend.prompt_features`` (resampling, whisper and kaldi features, both ONNX sessions
#: at one intra-op thread, the flow's prompt mel): the median of 8 distinct prompts, on cores shared under
#: load (an idle core's cost is lower: the figure is on the safe side).
MEASURED_PROMPT_S = 2.87
MEASURED_PROMPT_SOURCE = (
    "prompt_s 2.87 s: MEASURED (benchmarks/released_frontend.py, the released geometry with random weights, "
    "one worker on one core, CPU provider, 10 s prompts, median of 8) on AMD EPYC (Zen 5, AVX-512, no AMX), "
    "2 cores shared with other work at load average 7-8 (mean 2.95 s, best 2.34 s)")

#: One H100 (80 GB), 16 host cores (14 prompt workers), fp32 talker at 256 slots with CUDA graphs,
#: the frontend on CPU workers at the measured per-core cost above (the device image's onnxruntime
#: build is the CPU one; the GPU check measures whichever provider it offers). Talker and code2wav:
#: ESTIMATES until a GPU run measures them (none has yet).
H100 = StageCosts(
    device="H100 (talker and code2wav estimated)", prompt_s=MEASURED_PROMPT_S, text_s=0.005, step_s=0.041,
    code2wav_s=0.005,
    sources=(MEASURED_PROMPT_SOURCE + "; the H100 host's cores stand in as this one's",
             "text_s 5 ms: ESTIMATE, wetext normalization and the tokenizer of a short row",
             "step_s 41 ms: ESTIMATE, 256 slots x 250 tokens per 10 s row at 25 rows/s (issue 46: talker and "
             "code2wav est. 17-25 rows/s of 10 s)",
             "code2wav_s 5 ms per audio second: ESTIMATE, 20 rows/s of 10 s (issue 46, as above)"))

#: A CPU of two cores. The talker and code2wav figures are the OFFICIAL code's per request
#: (BASELINE_CPU.md: 10.96 s talker and 13.98 s flow + HiFT for 4.0 s of audio, batch 1), an upper
#: bound for cosyclone's batched stages; the prompt figure is the measurement above.
CPU = StageCosts(
    device="CPU (official per-request figures, an upper bound)", prompt_s=MEASURED_PROMPT_S, text_s=0.005,
    step_s=0.11, code2wav_s=3.5,
    sources=(MEASURED_PROMPT_SOURCE,
             "text_s 5 ms: ESTIMATE",
             "step_s 0.11 s: the official talker's 10.96 s for 100 tokens at batch 1 (BASELINE_CPU.md)",
             "code2wav_s 3.5 s per audio second: the official 13.98 s for 4.0 s (BASELINE_CPU.md)"))


@dataclass(frozen=True)
class Projection:
    """Each stage's rows per second for a workload, and what bounds it."""

    costs: StageCosts
    rows: int  # rows projected
    row_seconds: float  # audio seconds per row
    rows_per_s: dict[str, float]  # stage -> rows per second it can take
    bound_by: str  # the slowest stage ("device": talker and code2wav together on their one device)

    @property
    def run_rows_per_s(self) -> float:
        return self.rows_per_s[self.bound_by]

    @property
    def seconds(self) -> float:
        """Wall seconds for :attr:`rows` at the bound's pace (start-up and the tail not counted)."""
        return self.rows / self.run_rows_per_s

    def describe(self) -> str:
        stages = ", ".join(f"{k} {v:.3g}" for k, v in self.rows_per_s.items())
        return (f"projected on {self.costs.device}: {self.rows} rows of {self.row_seconds:g} s at "
                f"{self.run_rows_per_s:.3g} rows/s, bound by {self.bound_by} (rows/s: {stages}); "
                f"{self.seconds / 60:.0f} min")


def project(costs: StageCosts, *, rows: int, row_seconds: float, slots: int, prompt_workers: int,
            distinct_prompts: float = 1.0, tokens_per_row: float | None = None,
            shared_device: bool = True) -> Projection:
    """Rows per second per stage: the frontend's prompt workers and batch thread work side by side
    (``distinct_prompts``: the share of rows with a prompt of their own), the talker decodes
    ``slots`` rows per step for ``tokens_per_row`` steps each (default: 25 per audio second),
    code2wav takes each row's audio seconds. ``shared_device``: the talker and code2wav run on one
    device (every real run), whose rows per second (``"device"``) is theirs together and may bound
    the run; False: two devices (or stand-in stages that only wait), each stage its own bound."""
    tokens = TOKENS_PER_SECOND * row_seconds if tokens_per_row is None else tokens_per_row
    prompts = max(distinct_prompts, 1e-9) * costs.prompt_s / max(1, prompt_workers)
    frontend = 1.0 / max(prompts, costs.text_s, 1e-12)
    talker = max(1, slots) / max(tokens * costs.step_s, 1e-12)
    code2wav = 1.0 / max(row_seconds * costs.code2wav_s, 1e-12)
    per = {"frontend": frontend, "talker": talker, "code2wav": code2wav}
    bounds = ["frontend", "talker", "code2wav"]
    if shared_device:  # one device's seconds per row: the talker's and code2wav's, added
        per[DEVICE] = 1.0 / (1.0 / talker + 1.0 / code2wav)
        bounds = ["frontend", DEVICE]
    return Projection(costs=costs, rows=rows, row_seconds=row_seconds, rows_per_s=per,
                      bound_by=min(bounds, key=lambda k: per[k]))
