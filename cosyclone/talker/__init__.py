"""The talker: CosyVoice3's Qwen2 speech-token LM, decoding rows in slots with the RAS sampler.

``model`` the network · ``step`` the fixed-shape slot step · ``sequence`` one ``Seq`` per segment ·
``scheduler`` which segment takes which slot · ``step_runner`` model, cache and graphs, window by
window · ``session`` the two joined, requests joining while it decodes ·
``decode`` generate(): a session handed every request · ``request``/``results`` what goes in and
comes out · ``sampler``/``slot_sampler`` RAS and the non-finite policy · ``graphs``/``graph_pool``
CUDA graphs captured once per process · ``diagnostics`` the per-row counters.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cosyclone.talker.decode import generate
    from cosyclone.talker.request import (
        DecodeOptions,
        StepMechanics,
        TalkerRequest,
        length_limits,
        prompt_batch,
        prompt_length,
    )
    from cosyclone.talker.results import MAX_SILENT, SILENT_TOKENS, TalkerResult, silent_filter
    from cosyclone.talker.session import TalkerSession

# Loaded on first use: the per-row counters (``diagnostics``) are read with a folder's records,
# which needs nothing of torch.
_WHERE = {
    "generate": "decode",
    "DecodeOptions": "request",
    "StepMechanics": "request",
    "TalkerRequest": "request",
    "length_limits": "request",
    "prompt_batch": "request",
    "prompt_length": "request",
    "MAX_SILENT": "results",
    "SILENT_TOKENS": "results",
    "TalkerResult": "results",
    "silent_filter": "results",
    "TalkerSession": "session",
}
__all__ = ["MAX_SILENT", "SILENT_TOKENS", "DecodeOptions", "StepMechanics", "TalkerRequest", "TalkerResult",
           "TalkerSession", "generate", "length_limits", "prompt_batch", "prompt_length", "silent_filter"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"cosyclone.talker.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'cosyclone.talker' has no attribute {name!r}")
