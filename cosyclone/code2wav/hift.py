"""CosyVoice3's causal HiFT vocoder (CausalHiFTGenerator + CausalConvRNNF0Predictor), batched.

Why the structure looks like this:
* parameters keep the official names (``X.parametrizations.weight.original0/1``) so released
  ``hift.pt`` files load strictly; :meth:`CausalHiFTGenerator.fold_weight_norm` then bakes
  ``g * v / ||v||`` into plain conv weights, because recomputing the norm every call is waste
  (the layers live in ``hift_layers``);
* the F0 predictor runs in float64 (the official code does, "precision is crucial");
* the construction-time noise tables are not parameters: they are set with
  :meth:`CausalHiFTGenerator.set_noise_tables` (released ones come from ``noise.py``);
* batching is exact with one padded batch: rows of different lengths run together through the
  conv network, which is left-causal except ``conv_pre`` and the F0 predictor's first conv; those
  look a few frames right and pad zeros there themselves, so :meth:`CausalHiFTGenerator.padded_batch`
  zeroes the mel past each row's end and a row's valid frames see exactly what they see alone.
  The F0 predictor and the sine source (cumulative phase, a noise-table prefix shared by all
  rows) are causal as well and run batched on that zero-padded mel.
  The only non-causal steps work at each row's own length: the centred (reflect-padded) STFT
  of the source (zero past the row's frames) and the iSTFT of the row's valid frames (its end's
  overlap-add must not see the neighbouring padding); ``hift_dsp`` does both for the whole batch
  at once with the lengths on the device. Padded outputs are zeroed. How a batch of rows is cut
  into such padded calls (length-sorted chunks, side by side on CPU threads) is not the
  generator's arithmetic and lives in ``hift_batching``;
* speed (CPU, fp32): the convs are ~90% of the time and the direct ones run near the FMA peak, so
  the long residual convs (kernel 7 at 128 and 256 channels, kernel 11 at 64-256) run as
  overlap-save FFT convs on CPU (:mod:`.fft_conv`, picked by :func:`fft_block_size`: 2-5x fewer
  FLOPs there, ~0.29 GB of spectra); the rest is saved around the convs: once folded, the fp32
  convs hold channels-last (Cout, Cin, 1, k) weights and the activations stay (B, C, 1, T)
  channels-last end to end (no per-call weight-norm or weight/activation reorders), each
  activation writes straight into its conv's zero-margined input (no padded copies), the
  upsampling convs run polyphase (3 taps at the input rate instead of 16/11/7 on the upsampled
  signal), Snake uses one temporary, the sines are computed per frame and the iSTFT's overlap-add
  is four shifted adds. The float64 F0 predictor is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from cosyclone.base.device import DevicePolicy
from cosyclone.code2wav.hift_batching import vocode_in_chunks
from cosyclone.code2wav.hift_dsp import istft_rows, stft_rows
from cosyclone.code2wav.hift_layers import (
    CausalConv1d,
    CausalConv1dDownSample,
    CausalConv1dUpsample,
    CausalConvRNNF0Predictor,
    PreparedConv,
    ResBlock,
    SourceModuleHnNSF,
    leaky_conv,
    reflect_left,
    to_rows,
    typed_modules,
    weight_normed,
)
from cosyclone.model.checkpoint import StateDict, init_dummy, load_module_file
from cosyclone.model.config import HiFTConfig, ModelConfig
from cosyclone.options import LoadFormat


class CausalHiFTGenerator(nn.Module):
    """Mel (B, 80, T) at 50 Hz -> waveform (B, 480·T) at 24 kHz."""

    stft_window: Tensor
    sine_waves: Tensor
    harmonic_numbers: Tensor

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.harmonics = cfg.nb_harmonics + 1
        self.upsample_scale = math.prod(cfg.upsample_rates) * cfg.hop_len
        base = cfg.base_channels
        self.m_source = SourceModuleHnNSF(self.harmonics)
        self.conv_pre = weight_normed(CausalConv1d(cfg.in_channels, base, cfg.conv_pre_look_right + 1,
                                                   causal_type="right"))
        self.ups = nn.ModuleList(
            weight_normed(CausalConv1dUpsample(base // 2**i, base // 2 ** (i + 1), k, u))
            for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True)))
        down_rates = [1, *list(cfg.upsample_rates[::-1][:-1])]
        cum = [math.prod(down_rates[: i + 1]) for i in range(len(down_rates))][::-1]
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        src_ch = cfg.n_fft + 2
        for i, (u, k, d) in enumerate(
            zip(cum, cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes, strict=True)
        ):
            ch = base // 2 ** (i + 1)
            if u == 1:
                self.source_downs.append(CausalConv1d(src_ch, ch, 1))
            else:
                self.source_downs.append(CausalConv1dDownSample(src_ch, ch, u * 2, u))
            self.source_resblocks.append(ResBlock(ch, k, tuple(d)))
        self.resblocks = nn.ModuleList()
        for i in range(len(self.ups)):
            ch = base // 2 ** (i + 1)
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes, strict=True):
                self.resblocks.append(ResBlock(ch, k, tuple(d)))
        self.conv_post = weight_normed(CausalConv1d(base // 2 ** len(self.ups), cfg.n_fft + 2, 7))
        self.f0_predictor = CausalConvRNNF0Predictor(
            cfg.f0_in_channels, cfg.f0_cond_channels, cfg.f0_num_class
        )
        # the released window is scipy's float64 Hann rounded to float32; torch's float32 hann_window
        # differs in the last bit of 9 of 16 values
        window = torch.hann_window(cfg.n_fft, periodic=True, dtype=torch.float64).to(torch.float32)
        self.register_buffer("stft_window", window, persistent=False)
        # (1, N, 9) uniform [0,1) construction-time table (a prefix of the released one), grown on demand
        self.register_buffer("sine_waves", torch.zeros(1, 0, self.harmonics), persistent=False)
        self.register_buffer("harmonic_numbers", torch.arange(1, self.harmonics + 1, dtype=torch.float32),
                             persistent=False)
        self.noise_factory: Callable[[int], Tensor] | None = None  # draws an exact prefix on demand

    # ---- loading -----------------------------------------------------------------------------

    @staticmethod
    def adapt_keys(state: Mapping[str, Tensor]) -> StateDict:
        """Strip ``generator.`` and map legacy ``weight_g``/``weight_v`` to original0/original1."""
        out: StateDict = {}
        for key, val in state.items():
            key = key.replace("generator.", "")
            if key.endswith(".weight_g"):
                key = key[: -len("weight_g")] + "parametrizations.weight.original0"
            elif key.endswith(".weight_v"):
                key = key[: -len("weight_v")] + "parametrizations.weight.original1"
            out[key] = val
        return out

    @torch.no_grad()
    def fold_weight_norm(self, *, fft: FFTRule | None = None) -> CausalHiFTGenerator:
        """Replace every weight-norm parametrization by its plain weight g·v/‖v‖ (after loading), then
        give the fp32 convs their inference layout (:meth:`PreparedConv.prepare`; the float64 F0
        predictor keeps its plain convs). With ``fft`` (a rule such as :func:`fft_block_size`: channels,
        kernel -> block size, 0 for direct), the residual blocks' convs it picks run as overlap-save
        FFT convs (:mod:`.fft_conv`): fewer FLOPs where the direct convs already run at the CPU's peak."""
        for module in self.modules():
            if parametrize.is_parametrized(module, "weight"):
                parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
        f0_convs = set(self.f0_predictor.modules())
        blocks = (*typed_modules(self.resblocks, ResBlock), *typed_modules(self.source_resblocks, ResBlock))
        block_convs = {conv for block in blocks for c1, c2, _, _ in block.layers() for conv in (c1, c2)}
        for module in self.modules():
            if not isinstance(module, PreparedConv) or module in f0_convs or module.weight.dim() != 3:
                continue
            if fft is not None and isinstance(module, CausalConv1d) and module in block_convs:
                module.prepare(fft_size=fft(module.out_channels, module.kernel_size[0]))
            else:
                module.prepare()
        return self

    def set_noise_tables(self, sine_waves: Tensor) -> None:
        """Install the uniform source-noise table (1, N, 9); N must cover 480·T of every call."""
        self.sine_waves = sine_waves.float().to(self.sine_waves.device)

    def reserve_noise(self, samples: int) -> None:
        """Hold the noise table for ``samples`` output samples now (before worker threads that would
        race to grow it: :func:`.hift_batching.vocode_in_chunks`)."""
        self._noise_table(samples)

    def _noise_table(self, length: int) -> Tensor:
        """The first ``length`` rows of the noise table (1, length, 9), drawing a longer prefix when
        needed (at least double the current one, so an accelerator rarely waits for the host)."""
        have = self.sine_waves.shape[1]
        if have < length and self.noise_factory is not None:
            want = max(length, min(2 * have, self.cfg.noise_samples))
            # exact prefix of the released table
            self.sine_waves = self.noise_factory(want).to(self.sine_waves.device)
        if self.sine_waves.shape[1] < length:
            raise RuntimeError(f"HiFT source-noise table missing or shorter than {length} samples; "
                               "call set_noise_tables (build_hift does this)")
        return self.sine_waves[:, :length]

    # ---- stages --------------------------------------------------------------------------------

    def _window_for(self, x: Tensor) -> Tensor:
        """The Hann window on ``x``'s device/dtype; a moved copy replaces the buffer (kept)."""
        if self.stft_window.device != x.device or self.stft_window.dtype != x.dtype:
            self.stft_window = self.stft_window.to(device=x.device, dtype=x.dtype)
        return self.stft_window

    def predict_f0(self, mel: Tensor) -> Tensor:
        """mel (B, 80, T) -> f0 (B, T) float32, computed in float64."""
        p = next(self.f0_predictor.parameters())
        if p.dtype != torch.float64:
            self.f0_predictor.double()
        return cast(Tensor, self.f0_predictor(mel.double()).float())

    def source(self, f0: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """f0 (B, T) -> source (B, 1, L), sine_waves (B, L, 9), uv (B, L, 1), noise (B, L, 9); L = 480·T.

        Causal SineGen2: per-frame phase increments, cumulative sum, nearest-upsampled phase. The
        phase, hence the sines and the voicing, is constant over a frame's 480 samples, so they are
        computed per frame (same values) and only the noise table varies per sample.
        """
        cfg = self.cfg
        up = self.upsample_scale
        bsz, frames = f0.shape
        length = frames * up
        # rad at sample 480k+239/240 equals the frame value, so linear down-sampling is the frame itself.
        rad = (f0.unsqueeze(-1) * self.harmonic_numbers.to(f0) / cfg.sampling_rate) % 1  # (B, T, 9)
        sines = torch.sin(torch.cumsum(rad, dim=1) * 2 * math.pi * up) * cfg.nsf_alpha  # (B, T, 9)
        uv = (f0.unsqueeze(-1) > cfg.nsf_voiced_threshold).to(sines.dtype)  # (B, T, 1)
        noise_amp = uv * cfg.nsf_sigma + (1 - uv) * cfg.nsf_alpha / 3
        table = self._noise_table(length).to(sines.dtype).view(1, frames, up, self.harmonics)
        noise = noise_amp.unsqueeze(2) * table  # (B, T, 480, 9)
        sine_waves = ((sines * uv).unsqueeze(2) + noise).view(bsz, length, self.harmonics)
        merged = torch.tanh(self.m_source.l_linear(sine_waves.to(self.m_source.l_linear.weight.dtype)))
        uv_up = uv.unsqueeze(2).expand(bsz, frames, up, 1).reshape(bsz, length, 1)
        return merged.transpose(1, 2), sine_waves, uv_up, noise.view(bsz, length, self.harmonics)

    def _samples(self, source: Tensor, mel_len: Tensor | None) -> Tensor:
        """(B,) valid source samples per row: ``480·mel_len`` (all of them without ``mel_len``)."""
        if mel_len is None:
            return torch.full((source.shape[0],), source.shape[-1], dtype=torch.long, device=source.device)
        return mel_len.to(device=source.device, dtype=torch.long) * self.upsample_scale

    def source_stft(self, source: Tensor, mel_len: Tensor | None = None) -> Tensor:
        """source (B, 1, 480·T) -> s_stft (B, n_fft+2, 120·T+1): [real; imag] of the centred STFT.

        With ``mel_len`` (B,), row b's STFT is taken of its own ``480·mel_len[b]`` samples (so the
        reflect padding at its end mirrors its own samples, as when it runs alone) and is zero past
        its frames; one batched call (:func:`stft_rows`), the lengths never leave the device.
        """
        sig = source.squeeze(1)
        return stft_rows(sig, self._samples(source, mel_len), self._window_for(sig), self.cfg.hop_len)

    def network(self, mel: Tensor, s_stft: Tensor) -> Tensor:
        """mel (B, 80, T), s_stft (B, n_fft+2, 120·T+1) -> conv_post output (B, n_fft+2, 120·T+1).

        Output frames <= 120·n depend only on STFT frames <= 120·n, on mel frames < n and on the
        few frames after them that the look-ahead convs read (zeros for a row run alone), which is
        what makes padded batching exact once the mel is zero past each row's end. Prepared convs
        run on (B, C, 1, T) channels-last activations; the result is a (B, C, T) view of them.
        """
        cfg = self.cfg
        rows = self.conv_pre.weight.dim() == 4
        if rows:
            mel, s_stft = to_rows(mel), to_rows(s_stft)
        x = self.conv_pre(mel)
        nk = len(cfg.resblock_kernel_sizes)
        for i, up in enumerate(typed_modules(self.ups, CausalConv1dUpsample)):
            x = leaky_conv(x, cfg.lrelu_slope, up) if rows else up(F.leaky_relu(x, cfg.lrelu_slope))
            if i == len(self.ups) - 1:
                x = reflect_left(x)
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            acc = self.resblocks[i * nk](x)
            for j in range(1, nk):
                acc.add_(self.resblocks[i * nk + j](x))
            x = acc.div_(nk)
        if rows:
            return leaky_conv(x, 0.01, self.conv_post).squeeze(2)  # F.leaky_relu's default slope, as official
        return cast(Tensor, self.conv_post(F.leaky_relu(x)))

    def to_wave(self, x: Tensor, mel_len: Tensor | None = None) -> Tensor:
        """conv_post output (B, n_fft+2, 120·T+1) -> waveform (B, 480·T) clamped to ±audio_limit.

        With ``mel_len``, row b's iSTFT runs on its own ``120·mel_len[b]+1`` frames, giving
        ``480·mel_len[b]`` samples (the centred iSTFT's end normalisation and overlap-add must not see
        the padded frames); the rest of the row is zero. One batched call (:func:`istft_rows`).
        """
        half = self.cfg.n_fft // 2 + 1
        hop = self.cfg.hop_len
        if mel_len is None:
            n_frames = torch.full((x.shape[0],), x.shape[-1], dtype=torch.long, device=x.device)
        else:
            n_frames = mel_len.to(device=x.device, dtype=torch.long) * (self.upsample_scale // hop) + 1
        wav = istft_rows(torch.exp(x[:, :half]), torch.sin(x[:, half:]), n_frames, self._window_for(x), hop)
        return torch.clamp(wav, -self.cfg.audio_limit, self.cfg.audio_limit)

    def decode(self, mel: Tensor, source: Tensor, mel_len: Tensor | None = None) -> Tensor:
        """mel (B, 80, T), source (B, 1, 480·T) -> waveform (B, 480·T) clamped to ±audio_limit.

        Without ``mel_len`` every row is taken to fill all T frames (the official single-row call);
        with it, see :meth:`source_stft` and :meth:`to_wave` (the mel must already be zero past each
        row's end, as :meth:`inference` makes it).
        """
        return self.to_wave(self.network(mel, self.source_stft(source, mel_len)), mel_len)

    @torch.inference_mode()
    def inference(self, mel: Tensor, mel_len: Tensor, *, max_frames: int | None = None,
                  bucket: int = 0) -> tuple[Tensor, Tensor]:
        """mel (B, 80, T), mel_len (B,) -> wav (B, 480·T) zero beyond each row, wav_len (B,).

        Rows run in length-sorted padded batches (:meth:`padded_batch`) of at most ``max_frames``
        padded frames, each a multiple of ``bucket`` wide (:func:`.hift_batching.vocode_in_chunks`).
        Default: :data:`CPU_CHUNK_FRAMES` on CPU (a big batch falls out of cache), else one call
        unless the engine sizes a budget (``engine/sizing.py``).
        """
        if max_frames is None:
            max_frames = CPU_CHUNK_FRAMES if mel.device.type == "cpu" else 0
        return vocode_in_chunks(self, mel, mel_len, max_frames=max_frames, bucket=bucket)

    def padded_batch(self, mel: Tensor, mel_len: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`inference` on one padded batch: mel (B, 80, T), mel_len (B,) -> (B, 480·T), (B,).

        Whatever the mel holds past a row's end (the pipeline's padding may be garbage) is replaced
        by zeros, the look-ahead convs' own padding value, so each row equals the row run alone (up
        to batch-size-dependent float rounding of the convs). On CPU the frames past the longest
        row are not computed; elsewhere the batch runs at its padded width (no host sync).
        """
        bsz, _, frames = mel.shape
        up = self.upsample_scale
        lens = mel_len.to(device=mel.device, dtype=torch.long).clamp(min=0, max=frames)
        width = (int(lens.max()) if bsz else 0) if mel.device.type == "cpu" else frames
        if width == 0:
            return torch.zeros(bsz, frames * up, device=mel.device, dtype=torch.float32), lens * up
        sub = mel[:, :, :width].float()
        valid = torch.arange(width, device=mel.device).unsqueeze(0) < lens.unsqueeze(1)  # (B, T')
        sub = torch.where(valid.unsqueeze(1), sub, sub.new_zeros(()))
        f0 = self.predict_f0(sub)
        out = self.decode(sub, self.source(f0)[0], lens).float()
        if width < frames:
            out = torch.cat([out, out.new_zeros(bsz, (frames - width) * up)], dim=1)
        return out, lens * up


#: (channels, kernel) -> overlap-save block size, 0 for a direct conv
FFTRule = Callable[[int, int], int]


def fft_block_size(channels: int, kernel: int) -> int:
    """Overlap-save block for a residual conv of ``kernel`` taps over ``channels``; 0: run it directly.

    Measured per conv at the released sizes (one thread, AMD EPYC Zen 4, 4 s row; direct ms / FFT
    ms at block 32, medians of 9 alternated): k 11 over 256 channels 21.1 / 8.4, over 128 26.6 /
    14.0, over 64 20.4 / 15.2; k 7 over 256 13.7 / 7.4, over 128 17.2 / 11.9, over 64 13.5 / 13.1
    (a tie: direct); k 3 never wins by more than noise (6.4 / 6.0 at 256). Block 32 beat 16 and 64
    for every kernel here (fewer DFT FLOPs than at 64, fewer products per frame than at 16).
    """
    if kernel < 7 or (channels < 128 and kernel < 11):
        return 0
    return 32


#: Padded mel frames per HiFT call on CPU (one row of 4 s, two of 2 s): the working set of a call
#: (activations of 64 channels x 120 samples a frame) is what sets the per-row cost. Measured with
#: the FFT convs (AMD EPYC Zen 4, batch 4 of 4 s rows, alternated): 1.007 s a row at 200 frames
#: against 1.124 at 400 on one thread, 0.590 against 0.632 on two; 2 s rows cost the same alone or
#: in pairs (0.552 / 0.551 s). Before the FFT convs: 0.70 s alone, 0.71 in pairs, 0.78 in fours.
CPU_CHUNK_FRAMES = 200


def load_hift_file(model: CausalHiFTGenerator, path: str | Path, *,
                   fft: FFTRule | None = None) -> CausalHiFTGenerator:
    """Strict-load either weight-norm form (with or without ``generator.``) and fold (``fft``: see
    :meth:`CausalHiFTGenerator.fold_weight_norm`)."""
    load_module_file(model, path, adapter=CausalHiFTGenerator.adapt_keys)
    model.f0_predictor.double()  # fold g·v/‖v‖ in float64, as the official float64 F0 path computes it
    return model.fold_weight_norm(fft=fft)


def fft_rule_for(policy: DevicePolicy) -> FFTRule | None:
    """Which of HiFT's residual convs run as FFT convs: on CPU, where the direct convs are at the FMA
    peak and FLOPs are the cost, :func:`fft_block_size`'s; accelerators keep cuDNN/MIOpen's own
    conv algorithms (None)."""
    return fft_block_size if policy.device.type == "cpu" else None


def build_hift(cfg: ModelConfig, policy: DevicePolicy, load_format: LoadFormat = "auto", *,
               direct: bool = False) -> CausalHiFTGenerator:
    """Build, load (``auto``: <model_dir>/hift.pt; ``dummy``: seeded values), fold, install noise.
    ``direct``: every conv direct, FFT convs or not on the device (what benchmarks compare with)."""
    from cosyclone.code2wav.noise import hift_sine_waves

    model = CausalHiFTGenerator(cfg.hift)
    fft = None if direct else fft_rule_for(policy)
    if load_format == "dummy":
        init_dummy(model)
        model.f0_predictor.double()
        model.fold_weight_norm(fft=fft)
    elif load_format == "auto":
        load_hift_file(model, cfg.path("hift.pt"), fft=fft)
    else:
        raise ValueError(f"load_format must be 'auto' or 'dummy', not {load_format!r}")
    model = model.to(policy.device).eval()
    model.f0_predictor.double()
    model.noise_factory = hift_sine_waves
    return model
