"""The official CosyVoice vocoder beside cosyclone's, on the same weights, for an honest side-by-side.

``make bench`` can only compare with the official figure measured elsewhere unless the official
code is at hand; with ``COSYCLONE_BENCH_OFFICIAL=/path/to/CosyVoice`` (a checkout of
FunAudioLLM/CosyVoice, never vendored here) ``bench_code2wav`` builds its ``CausalHiFTGenerator`` at
the released geometry, gives it seeded weights, loads the very same ``hift.pt`` into cosyclone's
vocoder, and times the two alternated in one window. The official one runs as the official
pipeline does: one request at a time, weight norm left in place, its F0 predictor in float64.
Needs only torch, numpy and scipy beside the checkout (its ``hifigan`` and ``transformer`` modules).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cosyclone.model.config import HiFTConfig

ENV = "COSYCLONE_BENCH_OFFICIAL"


def official_repo() -> Path | None:
    """The checkout named by ``COSYCLONE_BENCH_OFFICIAL``, or None; a wrong path is an error, not a skip."""
    raw = os.environ.get(ENV)
    if not raw:
        return None
    repo = Path(raw).expanduser()
    if not (repo / "cosyvoice" / "hifigan" / "generator.py").is_file():
        raise SystemExit(
            f"{ENV}={raw}: no cosyvoice/hifigan/generator.py there (a FunAudioLLM/CosyVoice checkout?)"
        )
    return repo


def build_official(repo: Path, cfg: HiFTConfig, *, seed: int = 0) -> nn.Module:
    """The official CausalHiFTGenerator at ``cfg``'s geometry, eval mode, seeded weights (weight-norm
    gains scaled so the activations stay in range, as trained weights keep them)."""
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    from cosyvoice.hifigan.f0_predictor import CausalConvRNNF0Predictor  # type: ignore[import-not-found]
    from cosyvoice.hifigan.generator import CausalHiFTGenerator  # type: ignore[import-not-found]

    torch.manual_seed(seed)
    model = CausalHiFTGenerator(
        in_channels=cfg.in_channels, base_channels=cfg.base_channels, nb_harmonics=cfg.nb_harmonics,
        sampling_rate=cfg.sampling_rate, nsf_alpha=cfg.nsf_alpha, nsf_sigma=cfg.nsf_sigma,
        nsf_voiced_threshold=cfg.nsf_voiced_threshold, upsample_rates=list(cfg.upsample_rates),
        upsample_kernel_sizes=list(cfg.upsample_kernel_sizes),
        istft_params={"n_fft": cfg.n_fft, "hop_len": cfg.hop_len},
        resblock_kernel_sizes=list(cfg.resblock_kernel_sizes),
        resblock_dilation_sizes=[list(d) for d in cfg.resblock_dilation_sizes],
        source_resblock_kernel_sizes=list(cfg.source_resblock_kernel_sizes),
        source_resblock_dilation_sizes=[list(d) for d in cfg.source_resblock_dilation_sizes],
        lrelu_slope=cfg.lrelu_slope, audio_limit=cfg.audio_limit, conv_pre_look_right=cfg.conv_pre_look_right,
        f0_predictor=CausalConvRNNF0Predictor(num_class=cfg.f0_num_class, in_channels=cfg.f0_in_channels,
                                              cond_channels=cfg.f0_cond_channels))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("original0", "weight_g")):
                p.mul_(0.3)
    return model.eval()


def official_and_ours(repo: Path, cfg: HiFTConfig, policy) -> tuple[nn.Module, nn.Module, nn.Module]:
    """(official, cosyclone as built for the device, cosyclone with every conv direct) vocoders holding
    the same weights: the official state dict is saved as a ``hift.pt`` and loaded by cosyclone's
    own loader (so the comparison also exercises it)."""
    from cosyclone.code2wav.hift import CausalHiFTGenerator, fft_rule_for, load_hift_file
    from cosyclone.code2wav.noise import hift_sine_waves

    official = build_official(repo, cfg)
    ours = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hift.pt"
        torch.save(official.state_dict(), path)
        for fft in (fft_rule_for(policy), None):
            model = load_hift_file(CausalHiFTGenerator(cfg), path, fft=fft).to(policy.device).eval()
            model.f0_predictor.double()
            model.noise_factory = hift_sine_waves
            ours.append(model)
    return official.to(policy.device), ours[0], ours[1]


def run_official(model: Any, mel: torch.Tensor) -> None:
    """The official pipeline's HiFT call, one request at a time (``finalize=True``: a whole utterance)."""
    for b in range(mel.shape[0]):
        model.inference(speech_feat=mel[b:b + 1], finalize=True)
