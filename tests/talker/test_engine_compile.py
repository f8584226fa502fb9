"""The decode step is one graph: ``torch.compile(step, fullgraph=True)`` captures it without a
break, a manifest of rows of varied lengths entering and leaving slots triggers no recompile after
the first capture, and the compiled step gives the eager tokens. (Backend "eager": dynamo's capture
and guards are what is tested; inductor's code generation takes minutes on 2 cores.)"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from cosyclone.talker import DecodeOptions, StepMechanics, generate
from cosyclone.talker.sampler import SamplerOptions
from tests.talker.test_engine_equivalence import _key, _requests
from tests.talker.test_talker_decode import _model


def test_compiled_step_zero_recompiles_and_eager_tokens() -> None:
    model = _model()
    reqs = _requests(10, 3)
    assert len({len(r.text_ids) + len(r.prompt_speech_tokens) for r in reqs}) > 3  # varied prompts
    opts = DecodeOptions(
        sampler=SamplerOptions(top_k=40, top_p=0.9),
        slots=4,
        mechanics=StepMechanics(kv_bucket=None, capacity=160),
    )
    eager = _key(generate(model, reqs, opts))
    torch._dynamo.reset()
    counters.clear()
    compiled = _key(generate(model, reqs, replace(opts, mechanics=replace(opts.mechanics, compile="eager"))))
    assert compiled == eager
    assert len({len(k[1]) for k in eager}) > 3  # rows of varied lengths left their slots at different steps
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])  # captured once, never again
    assert not counters["graph_break"], dict(counters["graph_break"])
