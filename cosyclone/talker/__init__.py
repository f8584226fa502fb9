"""The talker: CosyVoice3's Qwen2 speech-token LM, decoding rows in slots with the RAS sampler.

``model`` the network · ``step`` the fixed-shape slot step · ``session`` slots, admission, graphs ·
``decode`` generate(): a session handed every request · ``request``/``results`` what goes in and
comes out · ``sampler``/``slot_sampler`` RAS and the non-finite policy · ``graphs``/``graph_pool``
CUDA graphs captured once per process · ``diagnostics`` the per-row counters.
"""

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

__all__ = ["MAX_SILENT", "SILENT_TOKENS", "DecodeOptions", "StepMechanics", "TalkerRequest", "TalkerResult",
           "TalkerSession", "generate", "length_limits", "prompt_batch", "prompt_length", "silent_filter"]
