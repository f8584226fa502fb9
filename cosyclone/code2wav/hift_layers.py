"""HiFT's layers: causal convs (with their prepared channels-last form), Snake, ResBlock, F0 predictor.

Parameters keep the official names (``X.parametrizations.weight.original0/1`` under weight norm)
so released ``hift.pt`` files load strictly into :class:`~cosyclone.code2wav.hift.CausalHiFTGenerator`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrizations

from cosyclone.code2wav.fft_conv import (
    dft_matrices,
    fft_causal_conv_padded,
    fft_margins,
    spectral_weight,
    zero_margined,
)
from cosyclone.code2wav.hift_dsp import polyphase_upsample_weight, snake

ConvT = TypeVar("ConvT", bound=nn.Conv1d)
ModuleT = TypeVar("ModuleT", bound=nn.Module)


def weight_normed(conv: ConvT) -> ConvT:
    """Weight-norm (dim 0) with the parametrization API, giving the official key names.

    The module keeps its class for the checker (torch swaps in a subclass of it)."""
    return cast("ConvT", parametrizations.weight_norm(conv))


def typed_modules(modules: nn.ModuleList, kind: type[ModuleT]) -> Iterator[ModuleT]:
    """The members of ``modules``, each checked to be a ``kind`` (a ModuleList yields plain Modules)."""
    for module in modules:
        assert isinstance(module, kind)
        yield module


def causal_pad_amount(kernel_size: int, dilation: int) -> int:
    """Zeros a causal conv pads so that output length equals input length."""
    return 2 * ((kernel_size * dilation - dilation) // 2) + ((kernel_size + 1) % 2)


def to_rows(x: Tensor) -> Tensor:
    """(B, C, T) activations or a (Cout, Cin, k) conv weight -> (B, C, 1, T) / (Cout, Cin, 1, k)
    channels-last (memory (B, T, C)): the layout prepared convs and their activations keep."""
    return x.unsqueeze(2).contiguous(memory_format=torch.channels_last)


class PreparedConv:
    """Mixin of the generator's fp32 convs: after :meth:`prepare` they run as 2-D convs on (B, C, 1, T)
    channels-last activations (oneDNN's fastest fp32 conv layout on CPU, kept end to end so nothing
    is reordered between layers; cuDNN runs it natively too). Before it (weight-norm or plain 3-D
    weights: loading, a module used alone) they are the plain (B, C, T) convs.

    Prepared, a conv reads its input from a zero-margined buffer (:meth:`margins` zeros before and
    after the frames, :meth:`forward_padded`): the activation in front of it writes straight into
    one (:func:`act_conv`), so no padded copy is made; :meth:`forward` pads a plain input itself."""

    weight: Tensor
    bias: Tensor | None

    def prepare(self) -> None:
        """Replace the folded (Cout, Cin, k) weight by its channels-last 4-D form (once, after loading)."""
        self.weight = nn.Parameter(to_rows(self.weight.detach()), requires_grad=False)

    def margins(self, frames: int) -> tuple[int, int]:
        """Zero frames (before, after) ``frames`` input frames that :meth:`forward_padded` reads."""
        raise NotImplementedError

    def forward_padded(self, xp: Tensor, frames: int) -> Tensor:
        """(B, Cin, 1, before + frames + after) channels-last, zero margins -> (B, Cout, 1, T')
        channels-last."""
        raise NotImplementedError

    def _pad4(self, x: Tensor) -> Tensor:
        """x (B, C, 1, T) channels-last -> the zero-margined input :meth:`forward_padded` reads."""
        frames = x.shape[-1]
        lead, trail = self.margins(frames)
        if not lead and not trail:
            return x
        buf = margined_rows(x.shape[0], x.shape[1], frames, lead, trail, like=x)
        buf[..., lead:lead + frames] = x
        return buf

    def _conv4(self, xp: Tensor, stride: int = 1, dilation: int = 1) -> Tensor:
        return F.conv2d(xp, self.weight, self.bias, (1, stride), 0, (1, dilation))


def margined_rows(bsz: int, channels: int, frames: int, lead: int, trail: int, *, like: Tensor) -> Tensor:
    """(B, C, 1, lead + T + trail) channels-last, zero in the margins, uninitialised in between."""
    return zero_margined(bsz, frames, channels, lead, trail, like=like).transpose(1, 2).unsqueeze(2)


def act_conv(x: Tensor, act: Callable[[Tensor, Tensor], object], conv: PreparedConv) -> Tensor:
    """``conv(act(x))`` for a prepared conv on (B, C, 1, T) channels-last ``x``: ``act(x, out)`` writes
    its result straight into the conv's zero-margined input (one pass saved per conv)."""
    frames = x.shape[-1]
    lead, trail = conv.margins(frames)
    buf = margined_rows(x.shape[0], x.shape[1], frames, lead, trail, like=x)
    act(x, buf[..., lead:lead + frames])
    return conv.forward_padded(buf, frames)


def leaky_conv(x: Tensor, slope: float, conv: PreparedConv) -> Tensor:
    """``conv(leaky_relu(x, slope))`` on prepared (B, C, 1, T) rows, the activation written straight
    into the conv's zero-margined input (:func:`act_conv`; same bytes as ``F.leaky_relu``)."""
    return act_conv(x, lambda v, out: torch.ops.aten.leaky_relu.out(v, slope, out=out), conv)


def reflect_left(x: Tensor) -> Tensor:
    """Reflect-pad one frame on the left of (B, C, T) or (B, C, 1, T), keeping the memory layout."""
    if x.dim() == 3:
        return F.pad(x, (1, 0), mode="reflect")
    return torch.cat([x[..., 1:2], x], dim=-1).contiguous(memory_format=torch.channels_last)


class CausalConv1d(PreparedConv, nn.Conv1d):
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

    def margins(self, frames: int) -> tuple[int, int]:
        if self.causal_type != "left":
            return 0, self.causal_pad
        if self.fft_forward is not None:
            return fft_margins(frames, self.fft_forward.shape[1], self.kernel_size[0], self.dilation[0])
        return self.causal_pad, 0

    def forward(self, x: Tensor) -> Tensor:  # (B, Cin, T) -> (B, Cout, T)
        if self.weight.dim() == 4:
            return self.forward_padded(self._pad4(x), x.shape[-1])
        pad = (self.causal_pad, 0) if self.causal_type == "left" else (0, self.causal_pad)
        return super().forward(F.pad(x, pad))

    def forward_padded(self, xp: Tensor, frames: int) -> Tensor:
        if self.fft_spec is None:
            return self._conv4(xp, dilation=self.dilation[0])
        assert self.fft_forward is not None and self.fft_inverse is not None
        rows = xp.squeeze(2).transpose(1, 2)  # (B, T', Cin): contiguous when xp is channels-last
        y = fft_causal_conv_padded(
            rows.contiguous(),
            frames,
            self.fft_spec,
            self.fft_forward,
            self.fft_inverse,
            self.bias,
            kernel=self.kernel_size[0],
            dilation=self.dilation[0],
        )
        return y.transpose(1, 2).unsqueeze(2)


class CausalConv1dUpsample(PreparedConv, nn.Conv1d):
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
        self.weight = nn.Parameter(to_rows(weight), requires_grad=False)
        if self.bias is not None:
            self.bias = nn.Parameter(self.bias.detach().repeat(self.up), requires_grad=False)

    def margins(self, frames: int) -> tuple[int, int]:
        return self.weight.shape[-1] - 1, 0

    def forward(self, x: Tensor) -> Tensor:
        if self.weight.dim() == 4:
            return self.forward_padded(self._pad4(x), x.shape[-1])
        x = F.interpolate(x, scale_factor=float(self.up), mode="nearest")
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))

    def forward_padded(self, xp: Tensor, frames: int) -> Tensor:
        """(B, Cin, 1, P−1+T) -> (B, Cout, 1, up·T) channels-last: the polyphase outputs of a frame,
        (up, Cout) in memory, are ``up`` consecutive frames already."""
        bsz = xp.shape[0]
        y = self._conv4(xp).permute(0, 2, 3, 1)  # (B, 1, T, up·Cout)
        return y.reshape(bsz, 1, frames * self.up, -1).permute(0, 3, 1, 2)


class CausalConv1dDownSample(PreparedConv, nn.Conv1d):
    """Left-pad stride−1 zeros, conv k with stride. (B, Cin, T) -> (B, Cout, ~T/stride)."""

    def __init__(self, cin: int, cout: int, kernel_size: int, stride: int) -> None:
        super().__init__(cin, cout, kernel_size, stride=stride, padding=0)

    def margins(self, frames: int) -> tuple[int, int]:
        return self.stride[0] - 1, 0

    def forward(self, x: Tensor) -> Tensor:
        if self.weight.dim() == 4:
            return self.forward_padded(self._pad4(x), x.shape[-1])
        return super().forward(F.pad(x, (self.stride[0] - 1, 0)))

    def forward_padded(self, xp: Tensor, frames: int) -> Tensor:
        return self._conv4(xp, stride=self.stride[0])


class Snake(nn.Module):
    """y = x + sin²(αx)/(α + 1e-9), α per channel (alpha_logscale False). x (B, C, T)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: Tensor) -> Tensor:  # (B, C, ...) -> same
        return snake(x, self.alpha)

    def into(self, x: Tensor, out: Tensor) -> None:
        """Snake of x written into ``out`` (x's shape; a view into a conv's padded input)."""
        snake(x, self.alpha, out=out)


class ResBlock(nn.Module):
    """Snake residual block with left-causal dilated convs (key names as official)."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(weight_normed(CausalConv1d(channels, channels, kernel_size, d))
                                    for d in dilations)
        self.convs2 = nn.ModuleList(weight_normed(CausalConv1d(channels, channels, kernel_size, 1))
                                    for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def layers(self) -> Iterator[tuple[CausalConv1d, CausalConv1d, Snake, Snake]]:
        """``(convs1[i], convs2[i], activations1[i], activations2[i])`` per dilation."""
        return zip(
            typed_modules(self.convs1, CausalConv1d),
            typed_modules(self.convs2, CausalConv1d),
            typed_modules(self.activations1, Snake),
            typed_modules(self.activations2, Snake),
            strict=True,
        )

    def forward(self, x: Tensor) -> Tensor:  # (B, C, T) -> (B, C, T), or prepared (B, C, 1, T)
        prepared = x.dim() == 4
        for i, (c1, c2, a1, a2) in enumerate(self.layers()):
            if not prepared:
                x = x + c2(a2(c1(a1(x))))
                continue
            y = act_conv(act_conv(x, a1.into, c1), a2.into, c2)
            x = x + y if i == 0 else x.add_(y)  # the first x is the caller's (shared by the blocks)
        return x


class CausalConvRNNF0Predictor(nn.Module):
    """Mel (B, 80, T) -> F0 (B, T); condnet0 looks 3 frames right, the rest are left-causal."""

    def __init__(self, in_channels: int = 80, cond_channels: int = 512, num_class: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            weight_normed(CausalConv1d(in_channels, cond_channels, 4, causal_type="right")),
            nn.ELU(),
        ]
        for _ in range(4):
            layers += [weight_normed(CausalConv1d(cond_channels, cond_channels, 3)), nn.ELU()]
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
