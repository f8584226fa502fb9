"""HiFT's layers: causal convs (with their prepared channels-last form), Snake, ResBlock, F0 predictor.

Parameters keep the official names (``X.parametrizations.weight.original0/1`` under weight norm)
so released ``hift.pt`` files load strictly into :class:`~cosyclone.code2wav.hift.CausalHiFTGenerator`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrizations

from .fft_conv import dft_matrices, fft_causal_conv, spectral_weight
from .hift_dsp import polyphase_upsample_weight, snake


def _wn(conv: nn.Conv1d) -> nn.Conv1d:
    """Weight-norm (dim 0) with the parametrization API, giving the official key names."""
    return parametrizations.weight_norm(conv)


def causal_pad_amount(kernel_size: int, dilation: int) -> int:
    """Zeros a causal conv pads so that output length equals input length."""
    return 2 * ((kernel_size * dilation - dilation) // 2) + ((kernel_size + 1) % 2)


def _to_rows(weight: Tensor) -> Tensor:
    """(Cout, Cin, k) conv weight -> (Cout, Cin, 1, k) channels-last, the layout :meth:`prepare` installs."""
    return weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)


class _Prepared:
    """Mixin of the generator's fp32 convs: after :meth:`prepare` they run as 2-D convs on (B, C, 1, T)
    channels-last activations (oneDNN's fastest fp32 conv layout on CPU, kept end to end so nothing
    is reordered between layers; cuDNN runs it natively too). Before it (weight-norm or plain 3-D
    weights: loading, tests of the modules alone) they are the plain (B, C, T) convs."""

    weight: nn.Parameter
    bias: nn.Parameter | None

    def prepare(self) -> None:
        """Replace the folded (Cout, Cin, k) weight by its channels-last 4-D form (once, after loading)."""
        self.weight = nn.Parameter(_to_rows(self.weight.detach()), requires_grad=False)

    def _conv4(self, x: Tensor, pad: tuple[int, int], stride: int = 1, dilation: int = 1) -> Tensor:
        return F.conv2d(F.pad(x, pad), self.weight, self.bias, (1, stride), 0, (1, dilation))


class CausalConv1d(_Prepared, nn.Conv1d):
    """Conv1d, stride 1, padding 0 plus explicit zero padding on one side.

    ``causal_type='left'`` pads before (pure causal); ``'right'`` pads after (look-ahead).
    Input/output (B, C, T) with equal T, or (B, C, 1, T) channels-last once prepared.
    """

    def __init__(self, cin: int, cout: int, kernel_size: int, dilation: int = 1,
                 causal_type: str = "left", bias: bool = True) -> None:
        super().__init__(cin, cout, kernel_size, stride=1, padding=0, dilation=dilation, bias=bias)
        self.causal_pad = causal_pad_amount(kernel_size, dilation)
        self.causal_type = causal_type
        for name in ("fft_spec", "fft_forward", "fft_inverse"):  # set by prepare(fft_size=N)
            self.register_buffer(name, None, persistent=False)

    fft_spec: Tensor | None
    fft_forward: Tensor | None
    fft_inverse: Tensor | None

    def prepare(self, *, fft_size: int = 0) -> None:
        """The channels-last weight; with ``fft_size`` (left-causal only) also the overlap-save
        spectra and DFT matrices (:mod:`.fft_conv`), which the prepared forward then uses.
        Non-persistent buffers: they are derived, never in a checkpoint, and follow ``.to()``."""
        weight = self.weight.detach()
        if fft_size:
            if self.causal_type != "left":
                raise ValueError("the FFT path serves left-causal convs only")
            forward, inverse = dft_matrices(fft_size, self.kernel_size[0])
            self.register_buffer("fft_spec", spectral_weight(weight, fft_size), persistent=False)
            self.register_buffer("fft_forward", forward, persistent=False)
            self.register_buffer("fft_inverse", inverse, persistent=False)
        super().prepare()

    def forward(self, x: Tensor) -> Tensor:  # (B, Cin, T) -> (B, Cout, T)
        pad = (self.causal_pad, 0) if self.causal_type == "left" else (0, self.causal_pad)
        if self.weight.dim() == 4:
            if self.fft_spec is not None:
                return self._fft4(x)
            return self._conv4(x, pad, dilation=self.dilation[0])
        return super().forward(F.pad(x, pad))

    def _fft4(self, x: Tensor) -> Tensor:
        """(B, Cin, 1, T) channels-last -> (B, Cout, 1, T) channels-last, by :func:`fft_causal_conv`."""
        assert self.fft_spec is not None and self.fft_forward is not None and self.fft_inverse is not None
        rows = x.squeeze(2).transpose(1, 2).contiguous()  # (B, T, Cin): free when x is channels-last
        y = fft_causal_conv(rows, self.fft_spec, self.fft_forward, self.fft_inverse, self.bias,
                            kernel=self.kernel_size[0], dilation=self.dilation[0])
        return y.transpose(1, 2).unsqueeze(2)


class CausalConv1dUpsample(_Prepared, nn.Conv1d):
    """Nearest upsample ×stride, left-pad k−1 zeros, conv k. (B, Cin, T) -> (B, Cout, stride·T).

    Prepared, it is the equivalent polyphase conv (:func:`polyphase_upsample_weight`): ``up·Cout``
    outputs per input frame, whose channels-last memory (B, T, up, Cout) already is (B, up·T, Cout).
    The summed taps round differently from the upsampled conv (relative ~1e-7).
    """

    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int) -> None:
        super().__init__(cin, cout, kernel_size, stride=1, padding=0)
        self.up = stride

    def prepare(self) -> None:
        weight = polyphase_upsample_weight(self.weight.detach(), self.up)
        self.weight = nn.Parameter(_to_rows(weight), requires_grad=False)
        if self.bias is not None:
            self.bias = nn.Parameter(self.bias.detach().repeat(self.up), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.weight.dim() == 4:  # (B, Cin, 1, T) -> (B, Cout, 1, up·T), channels-last
            bsz, _, _, frames = x.shape
            y = self._conv4(x, (self.weight.shape[-1] - 1, 0)).permute(0, 2, 3, 1)  # (B, 1, T, up·Cout)
            return y.reshape(bsz, 1, frames * self.up, -1).permute(0, 3, 1, 2)
        x = F.interpolate(x, scale_factor=float(self.up), mode="nearest")
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class CausalConv1dDownSample(_Prepared, nn.Conv1d):
    """Left-pad stride−1 zeros, conv k with stride. (B, Cin, T) -> (B, Cout, ~T/stride)."""

    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int) -> None:
        super().__init__(cin, cout, kernel_size, stride=stride, padding=0)

    def forward(self, x: Tensor) -> Tensor:
        if self.weight.dim() == 4:
            return self._conv4(x, (self.stride[0] - 1, 0), stride=self.stride[0])
        return super().forward(F.pad(x, (self.stride[0] - 1, 0)))


class Snake(nn.Module):
    """y = x + sin²(αx)/(α + 1e-9), α per channel (alpha_logscale False). x (B, C, T)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: Tensor) -> Tensor:  # (B, C, ...) -> same
        return snake(x, self.alpha)


class ResBlock(nn.Module):
    """Snake residual block with left-causal dilated convs (key names as official)."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(_wn(CausalConv1d(channels, channels, kernel_size, d)) for d in dilations)
        self.convs2 = nn.ModuleList(_wn(CausalConv1d(channels, channels, kernel_size, 1)) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, T) -> (B, C, T)
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2, strict=True):
            x = x + c2(a2(c1(a1(x))))
        return x


class CausalConvRNNF0Predictor(nn.Module):
    """Mel (B, 80, T) -> F0 (B, T); condnet0 looks 3 frames right, the rest are left-causal."""

    def __init__(self, in_channels: int = 80, cond_channels: int = 512, num_class: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = [_wn(CausalConv1d(in_channels, cond_channels, 4, causal_type="right")), nn.ELU()]
        for _ in range(4):
            layers += [_wn(CausalConv1d(cond_channels, cond_channels, 3)), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, num_class)

    def forward(self, x: Tensor) -> Tensor:
        x = self.condnet(x).transpose(1, 2)
        return torch.abs(self.classifier(x).squeeze(-1))


class SourceModuleHnNSF(nn.Module):
    """Holds the 9→1 merge layer (``m_source.l_linear``); the sine math lives in the generator."""

    def __init__(self, harmonics: int) -> None:
        super().__init__()
        self.l_linear = nn.Linear(harmonics, 1)
