
# =============================================================================================
# HiFT construction-time noise tables (owner: HiFT engineer). The flow section (``flow_noise``)
# belongs at the top of this file and is written by the flow engineer.
# =============================================================================================
#
# The released module draws, from the global CPU generator right after the CFM's seed-0 reset:
# randn(1,80,15000); default inits of Embedding(6561,80), Linear(192,80), Conv1d(80,512,4),
# 4x Conv1d(512,512,3), Linear(512,1); rand(1,9) [rand_ini]; rand(1,7200000,9) [sine_waves].
# We replay exactly that RNG consumption on a private generator (identical draws: same shapes,
# same distributions, same order) and keep the generator state from just before sine_waves, so
# any prefix rand(1, L, 9) can be drawn without holding the 259 MB table.

import torch as _torch  # noqa: E402


def _hift_state_before_sine_waves() -> _torch.Tensor:
    """Private CPU generator state right before the released ``sine_waves`` draw."""
    gen = _torch.Generator(device="cpu").manual_seed(0)
    _torch.randn(1, 80, 15000, generator=gen)  # CFM rand_noise
    _torch.empty(6561, 80).normal_(generator=gen)  # Embedding default init
    shapes = [((80, 192), 192), ((512, 80, 4), 320), *[((512, 512, 3), 1536)] * 4, ((1, 512), 512)]
    for shape, fan_in in shapes:  # kaiming_uniform(a=sqrt 5) weight then uniform bias, per layer
        bound = 1.0 / fan_in ** 0.5
        _torch.empty(shape).uniform_(-bound, bound, generator=gen)
        _torch.empty(shape[0]).uniform_(-bound, bound, generator=gen)
    global _HIFT_INI_STATE
    _HIFT_INI_STATE = gen.get_state()
    _torch.rand(1, 9, generator=gen)  # rand_ini
    return gen.get_state()


_HIFT_STATE: _torch.Tensor | None = None
_HIFT_INI_STATE: _torch.Tensor | None = None


def hift_rand_ini() -> _torch.Tensor:
    """The released ``rand_ini`` (1, 9) with harmonic 0 set to 0 (no effect on the causal output)."""
    gen = _torch.Generator(device="cpu")
    gen.set_state(_HIFT_INI_STATE if _HIFT_INI_STATE is not None else (hift_state(), _HIFT_INI_STATE)[1])
    out = _torch.rand(1, 9, generator=gen)
    out[:, 0] = 0
    return out


def hift_state() -> _torch.Tensor:
    """Cached generator state before ``sine_waves`` (computed once per process, ~1.3 M draws)."""
    global _HIFT_STATE
    if _HIFT_STATE is None:
        _HIFT_STATE = _hift_state_before_sine_waves()
    return _HIFT_STATE.clone()


def hift_sine_waves(n_samples: int) -> _torch.Tensor:
    """First ``n_samples`` rows of the released ``sine_waves`` table: (1, n_samples, 9) float32."""
    gen = _torch.Generator(device="cpu")
    gen.set_state(hift_state())
    return _torch.rand(1, n_samples, 9, generator=gen)
