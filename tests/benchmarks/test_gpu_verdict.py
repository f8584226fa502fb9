"""What the GPU check counts as a pass (benchmarks/gpu_verdict.py), on CPU: a skipped gpu test,
an e2e run without graph steps and a decode part whose graphs never replayed are failures; two
runs are compared tokens first (first differing row and step), then WAV bytes by how far they
differ; part 3 keeps whatever runs.jsonl says of sizing, memory, dtypes and graphs."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from benchmarks import gpu_verdict as gv
from cosyclone.cli import app
from tests.run_tokens import run_difference, talker_tokens


def _wav(samples: list[int]) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(np.asarray(samples, dtype="<i2").tobytes())
    return buf.getvalue()


def test_token_difference_names_the_first_row_and_step() -> None:
    assert gv.token_difference([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]]) is None
    assert gv.token_difference([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]]) == "row 1 step 1: 5 vs 9"
    assert (
        gv.token_difference([[1, 2]], [[1, 2, 3]], names=["r7"])
        == "row r7: 2 tokens vs 3 (equal up to step 2)"
    )
    assert gv.token_difference([[1]], [[1], [2]]) == "1 rows vs 2"


def test_wav_difference_says_how_far_bytes_and_samples_differ() -> None:
    a = _wav([0, 100, -100, 5])
    assert gv.wav_difference(a, a) is None
    said = gv.wav_difference(a, _wav([0, 100, -103, 7]))
    assert said is not None and said.startswith("2 of 52 bytes differ (first at byte 48)"), said
    assert "2 of 4 samples differ, max |difference| 3 (of 32767)" in said, said
    assert "4 samples vs 3" in (gv.wav_difference(a, _wav([0, 100, -100])) or "")
    assert gv.wav_difference(b"abc", b"abd") == "1 of 3 bytes differ (first at byte 2)"
    files = gv.files_difference({"x.wav": a, "y.wav": a}, {"x.wav": a, "y.wav": _wav([0, 100, -100, 6])})
    assert files is not None and files.startswith("1 of 2 WAVs differ; y.wav: 1 of 52 bytes differ"), files


def test_pytest_verdict_fails_skips_and_empty_runs() -> None:
    ok, why = gv.pytest_verdict("...\n6 skipped, 21 deselected in 2.22s\n")
    assert not ok and "6 skipped" in why
    ok, why = gv.pytest_verdict("===== 5 passed, 1 skipped, 21 deselected in 9.10s =====")
    assert not ok and "1 skipped" in why
    assert gv.pytest_verdict("5 passed, 1 skipped in 9.10s", allow_skips=True) == (
        True,
        "5 passed, 1 skipped",
    )
    assert gv.pytest_verdict("6 passed, 21 deselected in 75.03s (0:01:15)") == (
        True,
        "6 passed, 21 deselected",
    )
    assert not gv.pytest_verdict("1 failed, 5 passed in 3.0s")[0]
    assert gv.pytest_verdict("no tests ran in 0.01s") == (False, "no test ran (none selected)")
    assert gv.pytest_verdict("27 deselected in 1.0s") == (False, "no test ran (27 deselected)")
    assert gv.pytest_verdict("Traceback ... KeyboardInterrupt") == (
        False,
        "no pytest summary line in the log",
    )
    assert gv.pytest_verdict("6/27 tests collected (21 deselected) in 2.44s", collect_only=True)[0]
    assert not gv.pytest_verdict("no tests collected (27 deselected) in 0.5s", collect_only=True)[0]


def test_decode_and_e2e_verdicts_need_graphs_and_equal_tokens(tmp_path: Path) -> None:
    good = {"ms_per_step": {"1": {"tokens_equal": True, "graphs_used": True}}}
    assert gv.decode_verdict(good)[0]
    bad = {"ms_per_step": {"1": {"tokens_equal": True, "graphs_used": True},
                           "16": {"tokens_equal": False, "graphs_used": False,
                                  "token_difference": "eager vs graphs: row 3 step 40: 11 vs 12"}}}
    ok, why = gv.decode_verdict(bad)
    assert not ok and "row 3 step 40" in why and "batch 16: no decode step ran as a graph" in why
    assert gv.decode_verdict(None) == (False, "the decode part left no figures")
    fig = {"rows": 48, "ok": 48, "graph_steps": 0, "decode_steps": 9600, "capture_errors": [],
           "frontend_prompts_per_s": 5.2}
    assert gv.e2e_verdict(fig, require_graphs=False)[0]  # the CPU dry run: no CUDA graph there
    no_frontend = {k: v for k, v in fig.items() if k != "frontend_prompts_per_s"}
    assert gv.e2e_verdict(no_frontend, require_graphs=False) == (
        False, "the frontend of the released geometry did not run (no frontend prompts/s)")
    assert gv.e2e_verdict(fig) == (False, "no decode step ran as a CUDA graph (graph steps 0/9600)")
    assert not gv.e2e_verdict({**fig, "graph_steps": 9000, "capture_errors": ["oom"]})[0]
    assert not gv.e2e_verdict({**fig, "graph_steps": 9000, "ok": 47})[0]
    within = {**fig, "graph_steps": 9000, "peak_vs_plan": 0.62, "peak_reserved_gib": 40.1, "plan_gib": 64.7}
    assert gv.e2e_verdict(within) == (
        True, "48/48 rows, graph steps 9000/9600, frontend 5.2 prompts/s, peak 0.62 of the plan")
    over = gv.e2e_verdict({**within, "peak_vs_plan": 1.08, "peak_reserved_gib": 69.9})
    assert over == (False, "peak GPU memory 69.9 GiB reserved is 1.08 of the sizing plan's 64.7 GiB")
    figures = tmp_path / "figures.jsonl"
    figures.write_text('{"part": "e2e", "rows": 1}\nnot json\n{"part": "e2e", "rows": 2}\n{"part": "env"}\n')
    assert gv.last_figures(figures, "e2e") == {"part": "e2e", "rows": 2}
    assert gv.last_figures(tmp_path / "none.jsonl", "e2e") is None


def test_e2e_keeps_what_runs_jsonl_says_of_sizing_memory_and_graphs() -> None:
    from benchmarks.gpu_e2e import engine_fields

    record = {"rtf": 0.1, "dtype": "bf16", "options": {"talker_slots": 64, "seed": 0},
              "cuda_graphs": {"graph_steps": 10, "captures": 3},
              "engine_report": {"code2wav_batch": 24, "peak_gpu_gib": 30.5, "stage_dtypes": {"hift": "fp32"}}}
    assert engine_fields(record) == {"dtype": "bf16", "options.talker_slots": 64,
                                     "cuda_graphs": {"graph_steps": 10, "captures": 3},
                                     "engine_report.code2wav_batch": 24, "engine_report.peak_gpu_gib": 30.5,
                                     "engine_report.stage_dtypes": {"hift": "fp32"}}


def test_two_synth_runs_are_compared_tokens_first(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The helper the gpu tests compare runs with: it sees each segment's token ids in a real run
    (the stage-0 checkpoint seam), names where tokens part, and sizes a byte difference."""
    from tests.engine.test_batch_invariance import _manifest
    from tests.run_folders import wav_bytes

    with talker_tokens() as tokens:
        res = CliRunner().invoke(
            app,
            [
                "synth",
                str(_manifest(tmp_path)),
                "--model-dir",
                str(tiny_model_dir),
                "--out",
                str(tmp_path / "out"),
                "--device",
                "cpu",
                "--n-timesteps",
                "2",
            ],
        )
    assert res.exit_code == 0, res.output
    wavs = wav_bytes(tmp_path / "out")
    assert tokens and len(tokens) >= len(wavs) > 1
    run = (tokens, wavs)
    assert run_difference(run, (dict(tokens), dict(wavs))) is None
    key = sorted(tokens)[0]
    other = {**tokens, key: [*tokens[key][:2], tokens[key][2] + 1, *tokens[key][3:]]}
    assert run_difference(run, (other, wavs)) == (f"tokens part at row {key[0]}/seg{key[1]} step 2: "
                                                  f"{tokens[key][2]} vs {tokens[key][2] + 1}")
    name = sorted(wavs)[0]
    data = bytearray(wavs[name])
    data[-1] ^= 1
    said = run_difference(run, (tokens, {**wavs, name: bytes(data)}))
    assert said is not None and said.startswith(
        f"tokens equal, WAV bytes differ: 1 of {len(wavs)} WAVs differ; {name}: 1 of {len(data)} bytes differ"
    ), said
    assert run_difference(({}, wavs), run) is not None  # nothing recorded proves nothing


def test_no_cuda_is_said_in_the_drivers_words_and_never_falls_back(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CPU build, and a CUDA build whose driver is missing: each says why; ``--device cuda``
    without a device exits 3 at once (the check's parts never measure the CPU in its place)."""
    import torch

    from benchmarks import gpu_step

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert gpu_step.no_cuda_reason().endswith("is a CPU build (no CUDA in it)")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

    def init() -> None:
        raise RuntimeError(
            "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU\nmore"
        )

    monkeypatch.setattr(torch.cuda, "init", init)
    assert gpu_step.no_cuda_reason() == (f"torch {torch.__version__} (CUDA 13.0) finds no usable GPU, "
                                         "CUDA_VISIBLE_DEVICES='': Found no NVIDIA driver on your system. "
                                         "Please check that you have an NVIDIA GPU")
    with pytest.raises(SystemExit) as exc:
        gpu_step.require_device("cuda")
    assert exc.value.code == 3
    assert capsys.readouterr().out.startswith("SUMMARY: --device cuda: torch ")
    assert gpu_step.require_device("cpu").type == "cpu"
