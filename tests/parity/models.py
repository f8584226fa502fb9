"""Small reference-size models built from the vectors' JSON, shared by the parity tests.

The flow, HiFT and token2wav tests must build the very same reduced modules (token2wav composes the
other two), so the construction lives here once instead of in each test file.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from cosyclone.code2wav.flow import CausalMaskedDiffWithDiT
from cosyclone.code2wav.hift import CausalHiFTGenerator, FFTRule, load_hift_file
from cosyclone.model.checkpoint import load_module_file
from cosyclone.model.config import DiTConfig, FlowConfig, HiFTConfig

from .conftest import VECTORS


def weights_path(meta: dict[str, Any]) -> Path:
    """``<VECTORS>/<weights_file>``; the JSON may append a remark after the file name (hift does)."""
    return VECTORS / meta["weights_file"].split()[0]


def small_flow_config(meta: dict[str, Any]) -> FlowConfig:
    """The reduced FlowConfig described by ``small_config`` in flow/vectors.json."""
    sc = meta["small_config"]
    est = sc["estimator"]
    cfm = sc["decoder"]["cfm_params"]
    defaults = FlowConfig()
    return FlowConfig(
        input_size=sc["input_size"],
        output_size=sc["output_size"],
        spk_embed_dim=sc["spk_embed_dim"],
        vocab_size=sc["vocab_size"],
        token_mel_ratio=sc["token_mel_ratio"],
        pre_lookahead_len=sc["pre_lookahead_len"],
        pre_lookahead_channels=sc["pre_lookahead_layer"]["channels"],
        dit=DiTConfig(
            dim=est["dim"],
            depth=est["depth"],
            heads=est["heads"],
            dim_head=est["dim_head"],
            ff_mult=est["ff_mult"],
            mel_dim=est["mel_dim"],
            mu_dim=est["mu_dim"],
            spk_dim=est["spk_dim"],
            out_channels=est["out_channels"],
        ),
        cfm=type(defaults.cfm)(
            sigma_min=cfm["sigma_min"],
            t_scheduler=cfm["t_scheduler"],
            inference_cfg_rate=cfm["inference_cfg_rate"],
        ),
    )


def small_flow(meta: dict[str, Any], weights: Path | None = None) -> CausalMaskedDiffWithDiT:
    """The reduced flow (flow/vectors.json meta) strict-loaded from ``weights`` (default: the meta's
    ``weights_file``), eval mode."""
    model = CausalMaskedDiffWithDiT(small_flow_config(meta))
    load_module_file(model, weights or weights_path(meta))
    return model.eval()


def small_hift(
    meta: dict[str, Any], weights: Path | None = None, *, fft: FFTRule | None = None
) -> CausalHiFTGenerator:
    """The reduced HiFT (hift/vectors.json meta) loaded from ``weights`` (default: the meta's
    ``weights_file``), folded, eval mode.

    No noise table is installed: callers set the stored ``tables.sine_waves_slice``.
    """
    sc = meta["small_config"]
    cfg = replace(
        HiFTConfig(), base_channels=sc["base_channels"], f0_cond_channels=sc["f0_predictor"]["cond_channels"]
    )
    model = CausalHiFTGenerator(cfg)
    load_hift_file(model, weights or weights_path(meta), fft=fft)
    return model.eval()
