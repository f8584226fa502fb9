"""Stage 1 of code2wav: speech tokens -> mel (CosyVoice3 ``CausalMaskedDiffWithDiT``), batched.

Each row's sequence is ``[its prompt tokens, its target tokens]`` packed contiguously and then
right-padded to the batch maximum. Everything that could leak padding into real frames is causal
or masked: the embedding is multiplied by the length mask (so the pre-lookahead conv sees the same
zero right-padding as a row alone), the DiT's conv position embedding is left-padded/causal, and
attention hides padded keys. Every row uses the same noise prefix ``rand_noise[:, :, :T]`` as the
official single-row call, so a row's mel equals the row run alone within float32 rounding.

The CFM solve (Euler, cosine schedule, classifier-free guidance 0.7) runs conditional and
unconditional halves as one ``2B`` estimator batch, like the official solver. What does not
change between steps (attention masks, rotary tables, and the time embedding with every AdaLN
projection for all steps at once) is computed once per solve (:meth:`DiT.context`,
:meth:`DiT.modulations`).
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosyclone.base import cpu_gemm
from cosyclone.base.device import DevicePolicy
from cosyclone.code2wav.dit import DiT
from cosyclone.code2wav.noise import flow_noise
from cosyclone.model.checkpoint import init_dummy, load_module_file
from cosyclone.model.config import CFMConfig, FlowConfig, ModelConfig
from cosyclone.options import LoadFormat


class PreLookaheadLayer(nn.Module):
    """``(B, L, 80) -> (B, L, 80)``: right-pad 3 zeros, conv k4, leaky ReLU, left-pad 2, conv k3, +x."""

    def __init__(self, in_channels: int, channels: int, pre_lookahead_len: int) -> None:
        super().__init__()
        self.pre_lookahead_len = pre_lookahead_len
        self.conv1 = nn.Conv1d(in_channels, channels, pre_lookahead_len + 1)
        self.conv2 = nn.Conv1d(channels, in_channels, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = F.pad(x.transpose(1, 2), (0, self.pre_lookahead_len))
        h = F.leaky_relu(self.conv1(h), 0.01)
        h = self.conv2(F.pad(h, (self.conv2.kernel_size[0] - 1, 0)))
        return cast(Tensor, h.transpose(1, 2) + x)


def cosine_time_grid(n_timesteps: int, *, device: torch.device) -> Tensor:
    """``(n+1,)`` float32: ``1 - cos(linspace(0, 1, n+1) * pi/2)`` (t=0 noise, t=1 data)."""
    s = torch.linspace(0, 1, n_timesteps + 1, device=device, dtype=torch.float32)
    return 1 - torch.cos(s * 0.5 * math.pi)


class CausalConditionalCFM(nn.Module):
    """Holds the estimator (key prefix ``decoder.estimator.``); no parameters of its own."""

    def __init__(self, cfg: CFMConfig, estimator: DiT) -> None:
        super().__init__()
        self.cfg = cfg
        self.estimator = estimator

    @torch.inference_mode()
    def forward(self, mu: Tensor, mask: Tensor, spks: Tensor, cond: Tensor, *, n_timesteps: int) -> Tensor:
        """Euler-solve the ODE from the fixed noise (the table's first T frames, shared by every row).

        Args:
            mu, cond: ``(B, 80, T)``; mask: ``(B, 1, T)``; spks: ``(B, 80)``.
        Returns:
            ``(B, 80, T)`` float32.
        """
        b, _, seq = mu.shape
        dev = mu.device
        dtype = self.estimator.proj_out.weight.dtype
        noise = flow_noise(seq, self.cfg.noise_seed, total_frames=self.cfg.noise_frames)
        x = noise.to(device=dev, dtype=torch.float32).expand(b, -1, -1).clone()
        t_span = cosine_time_grid(n_timesteps, device=dev)
        rate = self.cfg.inference_cfg_rate
        # Constant halves of the CFG batch, built once: [cond rows, uncond rows (zeros)].
        mask_in = torch.cat([mask, mask], dim=0).to(dtype)
        mu_in = torch.cat([mu, torch.zeros_like(mu)], dim=0).to(dtype)
        spks_in = torch.cat([spks, torch.zeros_like(spks)], dim=0).to(dtype)
        cond_in = torch.cat([cond, torch.zeros_like(cond)], dim=0).to(dtype)
        # The step times, accumulated exactly as the official loop does (t += dt, then
        # dt = t_span[step + 1] - t), so every per-step constant can be built up front.
        t, dt = t_span[0], t_span[1] - t_span[0]
        times: list[Tensor] = []
        steps: list[Tensor] = []
        for step in range(1, n_timesteps + 1):
            times.append(t)
            steps.append(dt)
            t = t + dt
            if step < n_timesteps:
                dt = t_span[step + 1] - t
        if not times:
            return x
        est = self.estimator
        ctx = est.context(mask_in)
        blocks, final = est.modulations(torch.stack(times))
        for i, dt in enumerate(steps):
            x_in = torch.cat([x, x], dim=0).to(dtype)
            v = est.velocity(x_in, mu_in, spks_in, cond_in, ctx, ([m[i] for m in blocks], final[i])).float()
            x = x + dt * ((1.0 + rate) * v[:b] - rate * v[b:])
        return x


class CausalMaskedDiffWithDiT(nn.Module):
    """Token embedding, speaker projection, pre-lookahead layer and the CFM decoder."""

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.pre_lookahead_layer = PreLookaheadLayer(cfg.input_size, cfg.pre_lookahead_channels,
                                                     cfg.pre_lookahead_len)
        self.decoder = CausalConditionalCFM(cfg.cfm, DiT(cfg.dit))

    def reset_buffers(self) -> None:
        """Recompute the computed buffers (after ``to_empty``); inv_freq stays float32."""
        self.decoder.estimator.rotary_embed.reset_buffers()

    def conditions(self, token: Tensor, token_len: Tensor, prompt_token: Tensor, prompt_token_len: Tensor,
                   prompt_feat: Tensor, embedding: Tensor, *,
                   pad_to: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Pack rows and build the CFM conditions.

        Returns ``mu (B, 80, T)``, ``mask (B, 1, T)`` float, ``spks (B, 80)``, ``cond (B, 80, T)`` and
        ``pre (B, L, 80)`` (pre-lookahead output) with ``T = 2 * L``, ``L = max(P_b + N_b, pad_to)``:
        ``pad_to`` widens the padding (masked like any other) so that a device that builds kernels
        per shape (MIOpen) sees few widths; a row's values change only by the rounding of the wider shape.
        """
        dev = self.input_embedding.weight.device
        dtype = self.input_embedding.weight.dtype
        token, prompt_token = token.to(dev).long(), prompt_token.to(dev).long()
        n = token_len.to(dev).long()
        p = prompt_token_len.to(dev).long()
        ratio = self.cfg.token_mel_ratio
        total = p + n
        seq = max(int(total.max().item()) if total.numel() else 0, int(pad_to))
        pos = torch.arange(seq, device=dev).unsqueeze(0)  # (1, L)
        in_prompt = pos < p.unsqueeze(1)
        valid = pos < total.unsqueeze(1)
        p_idx = pos.clamp(max=max(prompt_token.shape[1] - 1, 0)).expand(len(p), -1)
        t_idx = (pos - p.unsqueeze(1)).clamp(min=0, max=max(token.shape[1] - 1, 0))
        from_prompt = prompt_token.gather(1, p_idx) if prompt_token.shape[1] else torch.zeros_like(p_idx)
        from_token = token.gather(1, t_idx) if token.shape[1] else torch.zeros_like(t_idx)
        all_tok = torch.where(in_prompt, from_prompt, from_token)
        emb = self.input_embedding(all_tok.clamp(min=0)) * valid.unsqueeze(-1).to(dtype)
        pre = self.pre_lookahead_layer(emb)
        frames = ratio * seq
        fpos = torch.arange(frames, device=dev).unsqueeze(0)
        fvalid = fpos < (ratio * total).unsqueeze(1)
        mu = pre.repeat_interleave(ratio, dim=1) * fvalid.unsqueeze(-1).to(dtype)
        feat = prompt_feat.to(device=dev, dtype=dtype)
        fprompt = fpos < (ratio * p).unsqueeze(1)
        if feat.shape[1]:
            f_idx = fpos.clamp(max=feat.shape[1] - 1).expand(len(p), -1)
            cond = feat.gather(1, f_idx.unsqueeze(-1).expand(-1, -1, feat.shape[2]))
            cond = cond * fprompt.unsqueeze(-1).to(dtype)
        else:
            cond = torch.zeros(len(p), frames, self.cfg.output_size, device=dev, dtype=dtype)
        spks = self.spk_embed_affine_layer(F.normalize(embedding.to(device=dev, dtype=dtype), dim=1))
        mask = fvalid.unsqueeze(1).to(dtype)
        return mu.transpose(1, 2), mask, spks, cond.transpose(1, 2), pre

    @torch.inference_mode()
    def inference(self, token: Tensor, token_len: Tensor, prompt_token: Tensor, prompt_token_len: Tensor,
                  prompt_feat: Tensor, embedding: Tensor, *, n_timesteps: int | None = None,
                  pad_to: int = 0) -> tuple[Tensor, Tensor]:
        """Tokens -> mel for a batch of rows with different prompt and target lengths.

        Args:
            token: ``(B, N)`` long target speech tokens (row b uses its first ``token_len[b]``).
            token_len: ``(B,)``; prompt_token ``(B, P)``, prompt_token_len ``(B,)``.
            prompt_feat: ``(B, 2P, 80)`` prompt mel, time-major (row b: first ``2 P_b`` frames).
            embedding: ``(B, 192)`` speaker embedding (L2-normalized here).
            n_timesteps: Euler steps (default ``cfg.cfm.n_timesteps`` = 10).
            pad_to: pad the rows to at least this many token positions (see :meth:`conditions`).
        Returns:
            ``mel (B, 80, 2 * max N_b)`` float32 (zero past each row's end) and ``mel_len (B,)``.
        """
        steps = self.cfg.cfm.n_timesteps if n_timesteps is None else n_timesteps
        mu, mask, spks, cond, _ = self.conditions(token, token_len, prompt_token, prompt_token_len,
                                                  prompt_feat, embedding, pad_to=pad_to)
        dev = mu.device
        ratio = self.cfg.token_mel_ratio
        n = token_len.to(dev).long()
        p = prompt_token_len.to(dev).long()
        feat = self.decoder(mu, mask, spks, cond, n_timesteps=steps)
        out_frames = ratio * int(n.max().item()) if n.numel() else 0
        opos = torch.arange(out_frames, device=dev).unsqueeze(0)
        src = (ratio * p).unsqueeze(1) + opos
        keep = opos < (ratio * n).unsqueeze(1)
        src = src.clamp(max=max(feat.shape[2] - 1, 0))
        mel = feat.gather(2, src.unsqueeze(1).expand(-1, feat.shape[1], -1)) if out_frames else \
            feat.new_zeros(feat.shape[0], feat.shape[1], 0)
        mel = mel * keep.unsqueeze(1).to(mel.dtype)
        return mel.float(), ratio * n


def build_flow(cfg: ModelConfig, policy: DevicePolicy,
               load_format: LoadFormat = "auto") -> CausalMaskedDiffWithDiT:
    """Build the flow on ``policy.device`` in ``policy.dit_dtype`` (the run dtype, bf16 under ``mixed``), eval
    mode.

    Built on the meta device and materialized with ``to_empty`` (no wasted default init of 330 M
    parameters); ``inv_freq`` is then recomputed in float32. ``"auto"`` strict-loads
    ``<model_dir>/flow.pt``; ``"dummy"`` fills seeded random weights without reading any file.
    """
    with torch.device("meta"):
        model = CausalMaskedDiffWithDiT(cfg.flow)
    model = model.to_empty(device=policy.device)
    model.reset_buffers()
    if load_format == "dummy":
        init_dummy(model)
    elif load_format == "auto":
        load_module_file(model, cfg.path("flow.pt"))
    else:
        raise ValueError(f"load_format must be 'auto' or 'dummy', not {load_format!r}")
    model = model.to(dtype=policy.dit_dtype)
    model.reset_buffers()
    cpu_gemm.apply(model, policy.cpu_gemm, bf16=True)  # bf16 layers too: bias and GELU fused
    return model.eval().requires_grad_(False)
