"""How often a bf16/fp16 talker picks the token the fp32 talker picks, with the speech-token head
in the run dtype (before) and in fp32 (now), on dummy weights.

Method. The fp32 talker decodes ``rows`` rows of ``steps`` tokens with the RAS sampler; that
trajectory is then fed back (teacher forcing) through the low-precision backbone, so every
variant scores exactly the same contexts, and each step's logits are turned into a token two ways:

* ``greedy``: arg-max;
* ``sampled``: the sampler's first draw (nucleus top_p/top_k, then the exponential race) with the
  *same* counter-based noise as the fp32 decision (same stream key, step and draw), so only the
  logits differ.

Rows of the report, per run dtype and head scale:

* ``before``: run-dtype backbone, head weights and matmul in the run dtype (the old talker);
* ``now``: run-dtype backbone, fp32 head (what ``cosyclone/talker/model.py`` does; checked
  bit-exactly against the talker's own output);
* ``the head's share``: fp32 backbone, only the head (and its input) in the run dtype: the
  disagreement the head alone causes, which the fp32 head removes;

and the fraction of the rows x steps decisions equal to fp32's is reported, with the max logit
error. Dummy weights give flat logits (std ~0.6 over 6761 ids, top-1 probability ~0.1%), where
tiny errors reorder candidates; ``--head-scale 4`` multiplies the head (both precisions) so the
distribution is closer to a trained model's peakedness. A trained model's agreement is higher.

Run: ``python -m benchmarks.bench_dtype_agreement [--layers N] [--rows R] [--steps T]``
(released geometry by default; about 2 minutes on 2 cores with ``--layers 24``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F

from cosyclone.base.device import DevicePolicy, dtype_name
from cosyclone.model.config import ModelConfig, released_config
from cosyclone.talker import DecodeOptions, TalkerRequest, generate
from cosyclone.talker.model import CosyVoice3LM, build_talker
from cosyclone.talker.sampler import SamplerOptions, nucleus_keep, race_keys, stream_key, uniform_noise


def _config(layers: int):
    cfg = released_config()
    q = replace(cfg.talker.qwen, num_hidden_layers=layers)
    return replace(cfg, talker=replace(cfg.talker, qwen=q))


def _requests(rows: int, text: int, prompt: int, vocab: int, speech: int) -> list[TalkerRequest]:
    g = torch.Generator().manual_seed(1)
    return [
        TalkerRequest(
            row_id=f"r{i}",
            text_ids=torch.randint(0, vocab, (text,), generator=g),
            target_len=text,
            prompt_speech_tokens=torch.randint(0, speech, (prompt,), generator=g),
            seed=1000 + i,
        )
        for i in range(rows)
    ]


def _inputs(model: CosyVoice3LM, reqs: list[TalkerRequest], traj: list[list[int]]) -> torch.Tensor:
    """(B, L + T, D) teacher-forced inputs in the model's dtype: prompt assembly ++ trajectory."""
    rows = [
        torch.cat(
            [
                model.assemble(r.text_ids, r.prompt_speech_tokens),
                model.embed_speech(torch.tensor(t, device=model.device)),
            ]
        )
        for r, t in zip(reqs, traj, strict=True)
    ]
    return torch.stack(rows)


@torch.no_grad()
def _prenorm_forward(model: CosyVoice3LM, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone's final-norm input (B, T, D) and output (B, T, D), run dtype."""
    seen: list[torch.Tensor] = []
    handle = model.backbone.norm.register_forward_hook(lambda _m, args, _out: seen.append(args[0]))
    try:
        hidden, _ = model(x)
    finally:
        handle.remove()
    return seen[0], hidden


def _decide(
    logits: torch.Tensor, keys: torch.Tensor, steps: int, opts: SamplerOptions
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, V) logits -> greedy (B, T) and sampled (B, T) tokens with the sampler's first draw."""
    greedy = logits.argmax(-1)
    picks = []
    for k in range(steps):
        x = logits[:, k]
        logp = torch.log_softmax(x, -1)
        keep = nucleus_keep(logp.exp(), opts.top_p, opts.top_k)
        race = torch.where(keep, race_keys(logp, uniform_noise(keys, k, 0, x.shape[-1])), float("-inf"))
        picks.append(race.argmax(-1))
    return greedy, torch.stack(picks, 1)


def _agreement(
    got: torch.Tensor,
    ref: tuple[torch.Tensor, torch.Tensor],
    want: torch.Tensor,
    keys: torch.Tensor,
    steps: int,
    opts: SamplerOptions,
) -> tuple[float, float, float]:
    g, s = _decide(got, keys, steps, opts)
    return ((g == ref[0]).float().mean().item(), (s == ref[1]).float().mean().item(),
            (got - want).abs().max().item())


def run(report: Callable[[str], None] = print, *, layers: int = 24, rows: int = 8, steps: int = 96,
        dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16),
        head_scales: tuple[float, ...] = (1.0, 4.0), cfg: ModelConfig | None = None) -> dict[str, float]:
    """Run the measurement; ``report`` gets each line; returns {label: agreement fraction}.

    ``cfg`` replaces the released geometry with ``layers`` layers (tests use a tiny one).
    """
    cfg = cfg or _config(layers)
    layers = cfg.talker.qwen.num_hidden_layers
    cpu = torch.device("cpu")
    ref = build_talker(cfg, DevicePolicy(cpu, torch.float32, "cpu"), load_format="dummy", seed=11)
    reqs = _requests(rows, 40, 50, min(4096, cfg.talker.qwen.vocab_size), cfg.talker.speech_token_size)
    opts = SamplerOptions.from_config(cfg.talker.sampling)
    keys = torch.tensor([stream_key(r.seed, 0) for r in reqs], dtype=torch.int64)
    W = ref.llm_decoder.weight.detach().clone()
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    traj = [r.raw_tokens for r in generate(ref, reqs, DecodeOptions(sampler=opts, max_len_override=steps,
                                                                     min_len_override=steps))]
    L = int(ref.assemble(reqs[0].text_ids, reqs[0].prompt_speech_tokens).shape[0])
    window = slice(L - 1, L - 1 + steps)  # the positions whose logits chose trajectory tokens 0..steps-1
    _, h32 = _prenorm_forward(ref, _inputs(ref, reqs, traj))
    h32 = h32[:, window]
    q = cfg.talker.qwen
    report(f"talker hidden {q.hidden_size}, {layers} layers, head {cfg.talker.decoder_size} x "
           f"{cfg.talker.llm_output_size}, dummy weights; {rows} rows x {steps} steps "
           f"= {rows * steps} decisions teacher-forced on the fp32 RAS trajectory; top_p {opts.top_p}, "
           f"top_k {opts.top_k}")
    for dtype in dtypes:
        name = dtype_name(dtype)
        low = build_talker(cfg, DevicePolicy(cpu, dtype, "cpu"), load_format="dummy", seed=11)
        x = _inputs(low, reqs, traj)
        _, hid = _prenorm_forward(low, x)
        hid = hid[:, window]
        _, now = low(x)  # the talker's own logits: fp32 head on the run-dtype hidden state
        torch.testing.assert_close(now[:, window], F.linear(hid.float(), W), rtol=0, atol=0)
        for scale in head_scales:
            w = W * scale
            want = F.linear(h32, w)
            top1 = torch.softmax(want, -1).amax(-1).mean().item()
            decided = _decide(want, keys, steps, opts)
            rows_out = {
                f"{name} backbone, {name} head (before)": F.linear(hid, w.to(dtype)).float(),
                f"{name} backbone, fp32 head (now)": F.linear(hid.float(), w),
                f"fp32 backbone, {name} head (the head's share)": F.linear(
                    h32.to(dtype), w.to(dtype)
                ).float(),
            }
            report(f"{name}, head x{scale:g} (fp32 mean top-1 probability {top1:.3f}):")
            for label, got in rows_out.items():
                ga, sa, err = _agreement(got, decided, want, keys, steps, opts)
                out[f"{label} x{scale:g} greedy"], out[f"{label} x{scale:g} sampled"] = ga, sa
                report(
                    f"  {label}: greedy {ga:.1%}, sampled {sa:.1%} same token as fp32; max |dlogit| {err:.3g}"
                )
        del low
    report(f"({time.perf_counter() - t0:.0f} s)")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--steps", type=int, default=96)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    run(layers=args.layers, rows=args.rows, steps=args.steps)


if __name__ == "__main__":
    main()
