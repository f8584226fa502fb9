"""Construction-time noise tables of the released modules, rebuilt exactly on private generators.

The official constructors reseed the global RNG with 0 and then draw their tables; we replay the
same draws on a private ``torch.Generator`` (same seed, shapes, order), so the global RNG is never
touched and the values are bit-identical.
"""

from __future__ import annotations

import torch

# =============================================================================================
# Flow (CausalConditionalCFM) noise
# =============================================================================================
#
# ``rand_noise = torch.randn(1, 80, 15000)`` right after ``set_all_random_seed(0)``. randn's first
# columns are *not* a prefix of a smaller draw (values are laid out row-major over 80 x 15000), so
# the whole table is drawn once per (seed, frames) and cached (4.8 MB).

_FLOW_TABLES: dict[tuple[int, int], torch.Tensor] = {}


def flow_noise_table(*, seed: int = 0, total_frames: int = 15000) -> torch.Tensor:
    """The full ``(1, 80, total_frames)`` float32 CPU table (cached; do not modify in place)."""
    key = (seed, total_frames)
    table = _FLOW_TABLES.get(key)
    if table is None:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        table = torch.randn(1, 80, total_frames, generator=gen)
        _FLOW_TABLES[key] = table
    return table


def flow_noise(frames: int, seed: int = 0, *, total_frames: int = 15000) -> torch.Tensor:
    """First ``frames`` columns of the CFM table: ``(1, 80, frames)`` float32 on the CPU.

    Equals ``torch.manual_seed(seed); torch.randn(1, 80, total_frames)[:, :, :frames]``.
    More than ``total_frames`` frames is an error (the official code fails there too).
    """
    if frames > total_frames:
        raise ValueError(f"flow noise: {frames} mel frames requested but the fixed table has only "
                         f"{total_frames} (prompt + target speech longer than {total_frames / 50:.0f} s)")
    return flow_noise_table(seed=seed, total_frames=total_frames)[:, :, :frames]


# =============================================================================================
# HiFT construction-time noise tables
# =============================================================================================
#
# The released module draws, from the global CPU generator right after the CFM's seed-0 reset:
# randn(1,80,15000); default inits of Embedding(6561,80), Linear(192,80), Conv1d(80,512,4),
# 4x Conv1d(512,512,3), Linear(512,1); rand(1,9) [rand_ini]; rand(1,7200000,9) [sine_waves].
# We replay exactly that RNG consumption on a private generator (identical draws: same shapes,
# same distributions, same order) and keep the generator state from just before sine_waves, so
# any prefix rand(1, L, 9) can be drawn without holding the 259 MB table. rand_ini is drawn and
# dropped: the causal source never reads it.


def hift_generator_before_rand_ini() -> torch.Generator:
    """A private CPU generator in the global one's state right before the released ``rand_ini`` draw."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    torch.randn(1, 80, 15000, generator=gen)  # CFM rand_noise
    torch.empty(6561, 80).normal_(generator=gen)  # Embedding default init
    shapes = [((80, 192), 192), ((512, 80, 4), 320), *[((512, 512, 3), 1536)] * 4, ((1, 512), 512)]
    for shape, fan_in in shapes:  # kaiming_uniform(a=sqrt 5) weight then uniform bias, per layer
        bound = 1.0 / fan_in ** 0.5
        torch.empty(shape).uniform_(-bound, bound, generator=gen)
        torch.empty(shape[0]).uniform_(-bound, bound, generator=gen)
    return gen


_HIFT_STATE: torch.Tensor | None = None


def hift_state() -> torch.Tensor:
    """Generator state before ``sine_waves`` (computed once per process, ~1.3 M draws; a copy)."""
    global _HIFT_STATE
    if _HIFT_STATE is None:
        gen = hift_generator_before_rand_ini()
        torch.rand(1, 9, generator=gen)  # rand_ini
        _HIFT_STATE = gen.get_state()
    return _HIFT_STATE.clone()


def hift_sine_waves(n_samples: int) -> torch.Tensor:
    """First ``n_samples`` rows of the released ``sine_waves`` table: (1, n_samples, 9) float32."""
    gen = torch.Generator(device="cpu")
    gen.set_state(hift_state())
    return torch.rand(1, n_samples, 9, generator=gen)
