"""The trace's probes read the sampler's own counters and each module's output, and leave nothing
attached once the ``with`` block ends (a run never pays for a trace)."""

from __future__ import annotations

import torch
from torch import nn

from cosyclone.talker.sampler import SamplerOptions, stream_key
from cosyclone.talker.slot_sampler import SlotSampler
from cosyclone.trace.probes import LayerProbe, StepFacts, StepProbe
from cosyclone.trace.replay import part_at

VOCAB, SPEECH = 16, 12  # ids 12..15 are stop ids


def _global_hooks() -> int:
    m = nn.modules.module
    return len(m._global_forward_hooks) + len(m._global_forward_pre_hooks)


def _sampler(min_len: int) -> SlotSampler:
    s = SlotSampler(SamplerOptions(top_k=3, win_size=2, tau_r=0.5), slots=1, vocab=VOCAB,
                    speech_token_size=SPEECH, device="cpu")
    s.reset(torch.tensor([0]), torch.tensor([stream_key(7)]), torch.tensor([min_len]))
    return s


def test_the_step_probe_reports_what_the_sampler_counted() -> None:
    sampler = _sampler(min_len=5)
    probe = StepProbe(speech_token_size=SPEECH, top=2)
    logits = torch.zeros(1, VOCAB)
    logits[0, 3] = 9.0  # one candidate dominates: drawn, then a repeat the window catches
    logits[0, 13] = 8.0  # a stop id, blocked below min_len
    logits[0, 5] = float("nan")
    logits[0, 6] = float("-inf")
    live = torch.tensor([True])
    with probe.attached():
        for step in range(3):
            sampler(logits, live, torch.tensor([step]))
    assert _global_hooks() == 0
    first, second = probe.steps[0], probe.steps[1]
    assert isinstance(first, StepFacts) and first.token == 3 and not first.stop
    assert (first.nan, first.posinf, first.neginf) == (1, 0, 1)
    assert first.min_len_suppressed and first.top[0][0] == 3 and len(first.top) == 2
    assert first.logit_max == 9.0 and first.logit_min == 0.0
    assert second.ras_fallback and second.token != 3  # the repetition check replaced the repeat
    counted = sampler.counters[:, 0].tolist()
    # the sampler's own nan_steps and ras_fallbacks agree with what the probe reported per step
    assert counted[2] == 3 and counted[6] == sum(s.ras_fallback for s in probe.steps)


def test_layer_probes_record_each_call_and_detach() -> None:
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    net = nn.Sequential(first, second)
    with torch.no_grad():  # a finite first layer whose output the second scales past float32's range
        first.weight.fill_(1.0)
        first.bias.zero_()
        second.weight.fill_(1e38)
    probe = LayerProbe("talker", [("a", first), ("b", second)])
    x = torch.ones(1, 3, 4)
    with probe.attached():
        net(x)
        net(x)
    net(x)  # after the block: nothing recorded
    assert [(c.name, c.call) for c in probe.calls] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert probe.calls[0].finite and not probe.calls[1].finite and probe.calls[1].first_bad_position == 0
    assert not first._forward_hooks and not second._forward_hooks


def test_a_position_is_named_by_the_part_of_the_prompt_it_holds() -> None:
    layout = (("sos", 1), ("prompt text", 3), ("text", 2), ("task", 1), ("prompt speech", 4))
    assert [part_at(layout, p) for p in (0, 1, 3, 4, 6, 7, 10, 11)] == [
        "sos", "prompt text", "prompt text", "text", "task", "prompt speech", "prompt speech", "generated"]
