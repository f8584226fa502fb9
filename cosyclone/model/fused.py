"""Same-input projections stored as one matrix, with the checkpoint's separate names kept.

Released checkpoints keep ``q_proj``/``k_proj``/``v_proj`` (talker), ``to_q``/``to_k``/``to_v``
(DiT) and ``gate_proj``/``up_proj`` (talker MLP) as separate tensors. Running them as one matmul
reads the input once and launches one kernel instead of two or three: at batch-1 decoding (bound
by weight reads and per-op overhead) and in the DiT (many mid-sized matmuls) that is measurable.
Rather than concatenating weights on every call, the module *stores* them concatenated along the
output dim, and two hooks translate at the boundary:

* ``state_dict()`` splits the fused tensor back into the released keys (detached row views, so a
  loader that ``copy_``-s into ``state_dict(keep_vars=True)`` writes straight into the fused
  storage, and the checkpoint key set stays exactly that of the released file);
* ``load_state_dict()`` joins the released keys into the fused one before the normal load.

So strict loading, key reports, meta-device construction and ``.to()`` all see one tensor
per fused group and the released names, with no duplicated memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

Parts = tuple[tuple[str, int], ...]  # (released name, output rows) in concatenation order


def split_fused(state: dict[str, Any], prefix: str, fused: str, parts: Parts) -> None:
    """Replace ``prefix+fused.{weight,bias}`` in ``state`` by the released per-part keys (views)."""
    for leaf in ("weight", "bias"):
        key = f"{prefix}{fused}.{leaf}"
        if key not in state:
            continue
        whole = state.pop(key)
        start = 0
        for name, rows in parts:
            state[f"{prefix}{name}.{leaf}"] = whole.detach()[start:start + rows]
            start += rows


def join_fused(state: dict[str, Any], prefix: str, fused: str, parts: Parts) -> None:
    """Replace the released per-part keys in ``state`` by their concatenation under ``fused``."""
    for leaf in ("weight", "bias"):
        keys = [f"{prefix}{name}.{leaf}" for name, _ in parts]
        if all(k in state for k in keys):
            state[f"{prefix}{fused}.{leaf}"] = torch.cat([state.pop(k) for k in keys], dim=0)


class FusedLinears(nn.Module):
    """Mixin base: :meth:`fused_linear` builds one ``nn.Linear`` for several released projections."""

    def fused_linear(self, fused: str, in_features: int, parts: Sequence[tuple[str, int]], *,
                     bias: bool = False) -> nn.Linear:
        """An ``nn.Linear(in_features, sum(rows))`` stored as ``self.<fused>`` under released names.

        Call once per fused group in ``__init__`` and assign the result to ``self.<fused>``.
        """
        frozen: Parts = tuple((str(n), int(r)) for n, r in parts)
        self.register_state_dict_post_hook(  # type: ignore[no-untyped-call]
            lambda _mod, state, prefix, _meta: split_fused(state, prefix, fused, frozen))
        self.register_load_state_dict_pre_hook(  # type: ignore[no-untyped-call]
            lambda _mod, state, prefix, *_rest: join_fused(state, prefix, fused, frozen))
        return nn.Linear(in_features, sum(r for _, r in frozen), bias=bias)
