"""The run record's options are the values the run used: no `null` where a default stood in."""

from __future__ import annotations

from dataclasses import replace

from cosyclone.engine.setup import recorded_options, resolve_options
from cosyclone.model.config import released_config
from cosyclone.options import RunOptions, audio_values


def test_none_becomes_the_default_the_run_used() -> None:
    cfg = released_config()
    opts, _ = resolve_options(RunOptions(device="cpu"), cfg=cfg)
    rec = recorded_options(opts, cfg)
    sampling = cfg.talker.sampling
    assert (rec["top_k"], rec["top_p"], rec["win_size"], rec["tau_r"]) == (
        sampling.top_k, sampling.top_p, sampling.win_size, sampling.tau_r)
    assert (rec["min_len_ratio"], rec["max_len_ratio"], rec["n_timesteps"]) == (2.0, 20.0, 10)
    assert rec["threads"] >= 1 and rec["frontend_workers"] >= 1 and rec["frontend_threads"] == 1
    assert rec["gpu_memory_fraction"] == 0.9 and rec["code2wav_thread"] is False and rec["batch_size"] == 8
    # what stays null means "none": no cap, no budget, slots a batch's worth
    nulls = {k for k, v in rec.items() if v is None}
    assert nulls == {"token_budget", "max_tokens", "min_tokens", "talker_slots"}


def test_given_values_are_kept_and_the_fingerprint_is_untouched() -> None:
    cfg = released_config()
    opts, _ = resolve_options(RunOptions(device="cpu", top_k=7, threads=1, max_tokens=30), cfg=cfg)
    rec = recorded_options(opts, cfg)
    assert (rec["top_k"], rec["threads"], rec["max_tokens"]) == (7, 1, 30)
    # the fingerprint keeps the options as given, so recording them resolved redoes no row
    assert audio_values(opts)["top_p"] is None
    assert audio_values(replace(opts, top_k=7)) == audio_values(opts)
