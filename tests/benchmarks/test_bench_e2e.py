"""benchmarks/run_all.py's end-to-end run, shrunk onto a tiny model: rows, arguments, summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks import run_all
from cosyclone.cli import app


def test_config_from_env() -> None:
    cfg = run_all.E2EConfig.from_env({})
    assert (cfg.rows, cfg.tokens, cfg.batch_size, cfg.dtype, cfg.model_dir, cfg.n_timesteps) == \
        (16, 100, 16, "fp32", None, None)
    cfg = run_all.E2EConfig.from_env({"COSYCLONE_BENCH_ROWS": "2", "COSYCLONE_BENCH_TOKENS": "4",
                                      "COSYCLONE_BENCH_DTYPE": "bf16", "COSYCLONE_BENCH_MODEL_DIR": "/m",
                                      "COSYCLONE_BENCH_N_TIMESTEPS": "2"})
    assert (cfg.rows, cfg.tokens, cfg.batch_size, cfg.dtype, cfg.model_dir, cfg.n_timesteps) == \
        (2, 4, 2, "bf16", Path("/m"), 2)
    args = run_all.synth_args(cfg, Path("m.jsonl"), Path("o"))
    assert args[args.index("--max-tokens") + 1] == args[args.index("--min-tokens") + 1] == "4"
    assert args[args.index("--dtype") + 1] == "bf16" and args[args.index("--model-dir") + 1] == "/m"
    assert "--load-format" in run_all.synth_args(run_all.E2EConfig(), Path("m"), Path("o"))


def test_end_to_end_rows_and_summary_on_a_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tiny_model_dir
    cfg = run_all.E2EConfig(rows=3, tokens=5, batch_size=3, device="cpu", model_dir=model, n_timesteps=2)
    shape = run_all.build_manifest(cfg, tmp_path / "bench")
    # the baseline's request: 3.0 s prompt = 75 tokens, prompt text 20 ids, text 30 ids
    assert shape["prompt_tokens"] == [75] and shape["prompt_ids"] == 20 and shape["text_ids"] == [30]
    rows = [json.loads(x) for x in (tmp_path / "bench" / "m.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["prompt_text"].endswith("<|endofprompt|>") for r in rows)

    res = CliRunner().invoke(app, run_all.synth_args(cfg, tmp_path / "bench" / "m.jsonl", tmp_path / "out"))
    assert res.exit_code == 0, res.output
    fig = run_all.summarize(cfg, tmp_path / "out")
    assert fig["rows_ok"] == 3 and fig["tokens_per_row"] == (5, 5) and fig["sampled_per_row"] == (5, 5)
    assert fig["audio_s"] == pytest.approx(3 * 5 * 2 * 480 / 24000)
    assert set(fig["stage_s"]) == {"frontend", "talker", "flow", "hift"} and fig["stage_wall_s"] > 0
    assert fig["ratio_vs_official"] == pytest.approx(
        fig["audio_s_per_wall_s"] / fig["official_audio_s_per_wall_s"]
    )
    line = run_all.render({**fig, **shape, "process_wall_s": 1.0})
    assert "3 rows x 5 tokens" in line and "differs from the baseline" in line and "flow steps 2" in line
    # make bench prints the frontend's rate beside the talker's and code2wav's, on the same rows
    rates = fig["rates"]
    assert rates["frontend_per_worker"] == pytest.approx(3 / fig["stage_s"]["frontend"])
    assert rates["code2wav"] == pytest.approx(3 / (fig["stage_s"]["flow"] + fig["stage_s"]["hift"]))
    assert "rows/s on these rows (3 distinct prompts): frontend " in line and "; talker " in line
    assert fig["frontend_workers"] >= 1
