"""The decode engine's figures: host cost per step, compiled-step recompiles, continuous vs static
batching, and how close the flow runs to the machine's own fp32 GEMM rate.

* ``ops_per_step_before`` / ``ops_per_step_after``: aten operations per decode step at tiny
  geometry, batch 16, default RAS sampler (profiler count of the ops that do work: not views,
  allocations, no-op ``to``/``contiguous``/``type_as`` or metadata ops, and calling no other aten
  op that does work: the kernels a GPU would be sent in eager mode; ``*_top`` names the most
  frequent), and microseconds per step. An op whose only aten children are such no-kernel ops
  counts (``mm`` calls ``resolve_conj``, SDPA's CPU kernel ``empty``/``transpose``, ``x >> 16``
  ``lift_fresh``, ``torch.where`` ``empty``): the first version of this count required no aten
  child at all, which dropped every matmul, attention, KV write, shift and ``where`` from both
  trees (its figure stays as ``ops_per_step_*_leaf_rule``). Still counted once, as their one
  working child, are ops that work after a child (``addmm`` after copying its bias, reductions
  after ``fill_``-ing their output), in both trees alike. Measured by the
  same snippet on the code before the engine (``--before-rev``, extracted with ``git archive``
  and run in a subprocess) and on this tree: the difference of two runs of 8 and 24 steps, so
  prefill and setup cancel out.
* ``recompiles`` / ``eager_equal``: ``torch.compile(step, fullgraph=True)`` over a manifest of
  rows of varied lengths flowing through 4 slots; graphs captured beyond the first, and whether
  the tokens equal eager ones. ``--quick`` uses the "eager" backend (dynamo capture and guards
  only; inductor takes about 7 minutes on 2 shared cores).
* ``continuous_vs_static``: wall time of static batches (one ``generate`` each) over continuous
  batching (one ``generate`` with ``slots``), same rows in the pipeline's order (sorted by their
  length estimate, cut into batches of ``slots``, longest batch first), same tokens (checked).
  Each row's cap is 20 x its text ids, spread 20..20*k tokens; its EOS falls where the sampler
  puts it (``rows_at_max_len``: the share that reached its cap). ``*_exact``: stop ids blocked,
  every row runs exactly to its cap, sorted by it (static batching's best case).
  ``*_ceiling``: what any scheduler could gain at most over those static batches if a step cost
  the same whatever it holds: the steps they run (each batch its longest row) over the tokens
  made divided by ``slots`` (every slot busy every step).
* ``flow_gemm_fraction``: the flow's matrix products are recorded during one flow inference
  (full-size dummy weights, fp32, batch 1, 100 tokens, 1 Euler step) with their FLOPs: its matmul/conv calls,
  and attention's two products (QK^T, PV) as plain batched GEMMs of the same shapes. Replayed alone on random
  tensors of the same shapes and strides they give the machine's GEMM rate on the flow's own shapes
  (``gemm_gflops``); the fraction is the flow's rate on all those FLOPs (``flow_gflops``) over that rate: 1.0
  would be a flow that does nothing but its products, at plain GEMM speed (its softmax, norms, activations and
  copies are the loss). ``flow_gemm_fraction_linear`` counts the matmul/conv calls alone and charges
  attention's whole time as loss (the stricter figure printed before attention was counted). The flow's linear
  layers run as a run's do (``--cpu-gemm``
  auto: oneDNN where torch has it); ``*_aten`` keys time the same flow on aten's (MKL) linear
  layers, and ``flow_fraction_of_aten_gemm`` is the flow's rate over plain aten GEMMs' on its shapes.
* ``run_gemm_fraction``: the same for the whole model run of one baseline-shaped row (frontend,
  talker, flow, HiFT): GEMM replay time (attention's products included) over wall time
  (``run_gemm_fraction_linear`` without them, ``run_kernel_fraction`` with attention's fused kernel).
* ``frontend_cache_speedup``: 16 rows sharing 2 prompts through ``Frontend.prepare``, frontend time
  without the prompt cache over time with it (``--model-dir`` for a real model directory's ONNX
  models; else the built-in tiny stand-ins, so the ONNX share, and the speedup, are smaller than
  with the released speech tokenizer and CAM++).

Every figure is measured in this run on this machine; the JSON line names the CPU. Run:
``python -m benchmarks.bench_engine --quick`` (under 3 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from typing_extensions import override

ROOT = Path(__file__).resolve().parents[1]
BEFORE_REV = "5398f88664609b448ef9ec724acfbb8e0841384b"  # main just before the slot engine

# Runs under both trees, each through its own API (the imports below pick the tree's layout).
OPS_SNIPPET = r"""
import json, sys, time, torch
from torch.profiler import ProfilerActivity, profile
try:  # this tree's layout
    from cosyclone.model.checkpoint import init_dummy
    from cosyclone.model.config import QwenGeometry, TalkerConfig
    from cosyclone.talker import DecodeOptions, TalkerRequest, generate
except ImportError:  # the layout of BEFORE_REV: flat modules, the talker's API in talker/decode.py
    from cosyclone.checkpoint import init_dummy
    from cosyclone.config import QwenGeometry, TalkerConfig
    from cosyclone.talker.decode import DecodeOptions, TalkerRequest, generate
from cosyclone.talker.model import CosyVoice3LM
from cosyclone.talker.sampler import SamplerOptions
torch.set_num_threads(2)
BACKEND = sys.argv[2] if len(sys.argv) > 2 else None  # this tree only: the step under torch.compile
if BACKEND == "inductor":
    import torch._inductor.config as icfg
    icfg.cpp.enable_kernel_profile = True  # each generated C++ kernel call becomes a profiler event
cfg = TalkerConfig(qwen=QwenGeometry(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=96, vocab_size=300),
                   llm_input_size=64, llm_output_size=64, speech_token_size=6561)
model = init_dummy(CosyVoice3LM(cfg).eval(), seed=1, std=0.05)
B = int(sys.argv[1])
g = torch.Generator().manual_seed(0)
reqs = [TalkerRequest(row_id=f"r{i}", text_ids=torch.randint(0, 300, (10 + i,), generator=g),
                      target_len=4, prompt_speech_tokens=torch.randint(0, 6561, (8,), generator=g), seed=i)
        for i in range(B)]
def leaf_ops(steps):
    opts = DecodeOptions(sampler=SamplerOptions(), max_len_override=steps, min_len_override=steps)
    if BACKEND:  # this tree only: one fixed shape (the compiled step's), the same tokens as eager
        from dataclasses import replace
        from cosyclone.talker import StepMechanics
        mech = StepMechanics(kv_bucket=None, capacity=80)
        opts = DecodeOptions(sampler=SamplerOptions(), max_len_override=steps, min_len_override=steps,
                             mechanics=mech)
        eager = [r.raw_tokens for r in generate(model, reqs, opts)]
        opts = replace(opts, mechanics=replace(mech, compile=BACKEND))
        assert [r.raw_tokens for r in generate(model, reqs, opts)] == eager, "compiled tokens differ"
    generate(model, reqs, opts)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        generate(model, reqs, opts)
    views = {"aten::" + v for v in ("view", "reshape", "_unsafe_view", "as_strided", "transpose", "t",
             "slice", "select", "expand", "unsqueeze", "squeeze", "permute", "narrow", "split", "chunk",
             "alias", "detach", "empty", "empty_like", "empty_strided", "resolve_conj", "resolve_neg",
             "lift_fresh", "unbind",
             # no kernel either when they are leaves: a to() to the same dtype/device returns self, a
             # contiguous() of a contiguous tensor too; the rest only read or set metadata
             "to", "contiguous", "result_type", "_reshape_alias", "resize_", "is_nonzero", "item",
             "type_as", "as_strided_")}  # type_as: to() under another name; as_strided_: sets metadata
    first_views = views - {"aten::type_as", "aten::as_strided_"}
    names = {}
    for e in prof.events():  # ops that do work and call no aten op that does (views etc. launch no kernel)
        if "cpp_fused" in e.name:  # a kernel inductor generated (fused elementwise/reduction work)
            names["aten::<inductor kernel>"] = names.get("aten::<inductor kernel>", 0) + 1
        if not e.name.startswith("aten::"):
            continue
        children = [c.name for c in e.cpu_children if c.name.startswith("aten::")]
        if e.name not in views and not any(c not in views for c in children):
            names[e.name] = names.get(e.name, 0) + 1
        if e.name not in first_views and not children:  # the first version's rule, kept for comparison
            names["leaf:" + e.name] = names.get("leaf:" + e.name, 0) + 1
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter(); generate(model, reqs, opts); best = min(best, time.perf_counter() - t0)
    return names, best
a, ta = leaf_ops(8)
b, tb = leaf_ops(24)
per = {k: (b.get(k, 0) - a.get(k, 0)) / 16 for k in b}
top = sorted(((v, k[6:]) for k, v in per.items() if v > 0 and k.startswith("aten::")), reverse=True)[:8]
print(json.dumps({"ops_per_step": sum(v for k, v in per.items() if k.startswith("aten::")),
                  "ops_per_step_leaf_rule": sum(v for k, v in per.items() if k.startswith("leaf:")),
                  "us_per_step": (tb - ta) / 16 * 1e6, "top": [f"{k} {v:g}" for v, k in top]}))
"""


def _snippet(tree: Path, batch: int, backend: str | None = None) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    args = [str(batch)] + ([backend] if backend else [])
    out = subprocess.run([sys.executable, "-c", OPS_SNIPPET, *args], env=env, cwd=tree, check=True,
                         capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def ops_per_step(rev: str, batch: int, *, compiled: bool = False) -> dict[str, Any]:
    """Ops and microseconds per step on the tree before the engine and on this one; ``compiled``:
    also this tree's step under ``torch.compile(fullgraph=True)`` with inductor (one fixed shape,
    tokens checked equal to eager; each generated C++ kernel counts as one op; about 3 minutes of
    compiling on 2 cores), what a GPU would be sent per step without CUDA graphs (with them: one
    graph launch)."""
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            arch = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "cosyclone"], check=True,
                                  capture_output=True, timeout=60).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=arch, check=True, timeout=60)
            before = _snippet(Path(tmp), batch)
            res.update(ops_per_step_before=before["ops_per_step"], us_per_step_before=before["us_per_step"],
                       ops_per_step_before_top=before["top"],
                       ops_per_step_before_leaf_rule=before["ops_per_step_leaf_rule"])
        except subprocess.CalledProcessError as exc:  # a figure that cannot be computed fails the benchmark
            raise RuntimeError(f"ops per step: the code of {rev[:10]} failed to run the snippet:\n"
                               f"{exc.stderr}") from exc
    after = _snippet(ROOT, batch)
    res.update(
        ops_per_step_after=after["ops_per_step"],
        us_per_step_after=after["us_per_step"],
        ops_per_step_after_top=after["top"],
        ops_per_step_after_leaf_rule=after["ops_per_step_leaf_rule"],
    )
    if compiled:
        comp = _snippet(ROOT, batch, "inductor")
        res.update(ops_per_step_compiled=comp["ops_per_step"], us_per_step_compiled=comp["us_per_step"],
                   ops_per_step_compiled_top=comp["top"])
    return res


def compile_check(backend: str) -> dict[str, Any]:
    """Recompiles after the first capture over a varied manifest, and equality with eager."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from cosyclone.talker import DecodeOptions, generate
    from cosyclone.talker.request import StepMechanics
    from cosyclone.talker.sampler import SamplerOptions
    from tests.talker.test_engine_equivalence import _key, _requests
    from tests.talker.test_talker_decode import _model

    model = _model()
    reqs = _requests(12, 5)
    opts = DecodeOptions(
        sampler=SamplerOptions(top_k=40, top_p=0.9),
        slots=4,
        mechanics=StepMechanics(kv_bucket=None, capacity=160),
    )
    eager = _key(generate(model, reqs, opts))
    torch._dynamo.reset()
    counters.clear()
    t0 = time.perf_counter()
    compiled = _key(generate(model, reqs, replace(opts, mechanics=replace(opts.mechanics, compile=backend))))
    return {"recompiles": int(counters["stats"]["unique_graphs"]) - 1, "eager_equal": compiled == eager,
            "graph_breaks": sum(counters["graph_break"].values()), "compile_backend": backend,
            "compile_run_s": round(time.perf_counter() - t0, 1)}


def continuous_vs_static(full: bool, slots: int, *, eos: bool = True) -> dict[str, Any]:
    """Static batches of ``slots`` rows vs one continuous run with ``slots`` slots, in the pipeline's
    order (:func:`cosyclone.plan_batches`: rows sorted by their length estimate, cut into
    batches, longest batch first).

    A row's estimate is its cap (``max_len`` = 20 x its text ids, as the pipeline's estimate grows
    with the text). ``eos``: the sampler's stop ids may win, so a row ends where its EOS falls,
    which no scheduler knows in advance (with these dummy weights about half the rows reach their
    cap); else stop ids are blocked (``min_len_override``) and every row runs exactly to its cap,
    sorted by its true length: static batching's best case. Keys of that case end in ``_exact``.
    """
    from cosyclone.base import cpu_gemm
    from cosyclone.base.device import resolve
    from cosyclone.model.checkpoint import init_dummy
    from cosyclone.model.config import QwenGeometry, TalkerConfig, released_config
    from cosyclone.talker import DecodeOptions, TalkerRequest, generate
    from cosyclone.talker.model import CosyVoice3LM
    from cosyclone.talker.sampler import SamplerOptions

    if full:
        cfg, rows, spread, label = released_config().talker, 64, 20, "released geometry"
    else:
        cfg = TalkerConfig(qwen=QwenGeometry(hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                                             num_key_value_heads=2, intermediate_size=384, vocab_size=1000),
                           llm_input_size=128, llm_output_size=128, speech_token_size=6561)
        rows, spread, label = 24, 4, "4 layers x 128 (quick)"
    with torch.device("meta"):
        model = CosyVoice3LM(cfg)
    model = init_dummy(model.to_empty(device="cpu"), seed=3).eval()
    model.backbone.reset_rope()
    cpu_gemm.apply(model, resolve("cpu", "fp32").cpu_gemm)  # linear layers on the library a run uses
    with torch.no_grad():  # stop logits 0: an EOS now and then (random ones would end most rows at min_len)
        model.llm_decoder.weight[cfg.speech_token_size:] = 0.0
    g = torch.Generator().manual_seed(7)
    targets = [1 + int(torch.randint(0, spread, (1,), generator=g)) for _ in range(rows)]
    reqs = [TalkerRequest(row_id=f"r{i}", text_ids=torch.randint(0, 1000, (t,), generator=g), target_len=t,
                          prompt_speech_tokens=torch.randint(0, 6561, (20,), generator=g), seed=i)
            for i, t in enumerate(targets)]
    opts = DecodeOptions(sampler=SamplerOptions(), min_len_override=None if eos else 20 * spread)
    order = sorted(range(rows), key=lambda i: (targets[i], i))  # by estimate, as plan_batches sorts
    batches = [order[k:k + slots] for k in range(0, rows, slots)][::-1]  # cut, then longest batch first
    static: dict[int, list[int]] = {}
    flat = [i for chunk in batches for i in chunk]
    t_static = t_cont = float("inf")
    # the quick geometry's steps are short and host-bound, so one-off costs (first kernel shapes) and
    # a shared machine's noise weigh on one run: best of two there, each side alike
    for _ in range(1 if full else 2):
        t0 = time.perf_counter()
        for chunk in batches:
            for i, r in zip(chunk, generate(model, [reqs[i] for i in chunk], opts), strict=True):
                static[i] = r.raw_tokens
        t_static = min(t_static, time.perf_counter() - t0)
        t0 = time.perf_counter()
        cont = generate(model, [reqs[i] for i in flat], replace(opts, slots=slots))
        t_cont = min(t_cont, time.perf_counter() - t0)
    same = all(cont[j].raw_tokens == static[i] for j, i in enumerate(flat))
    at_max = sum(len(r.raw_tokens) == r.max_len for r in cont) / rows
    # the most any scheduler could gain over these static batches at an equal cost per step: the
    # steps they run (each batch its longest row) over every slot busy every step (tokens / slots)
    made = {i: len(static[i]) for i in flat}
    ceiling = sum(max(made[i] for i in chunk) for chunk in batches) / (sum(made.values()) / slots)
    tag = "" if eos else "_exact"
    out: dict[str, Any] = {f"continuous_vs_static{tag}": round(t_static / t_cont, 3),
                           f"continuous_equal_static{tag}": same,
           f"continuous_vs_static{tag}_ceiling": round(ceiling, 3), f"static{tag}_s": round(t_static, 2),
           f"continuous{tag}_s": round(t_cont, 2), f"rows_at_max_len{tag}": round(at_max, 3)}
    if eos:
        out.update(continuous_geometry=label, continuous_rows=rows, continuous_slots=slots,
                   continuous_lengths=[20, 20 * spread])
    return out


def _like(x: Any) -> Any:
    """A fresh tensor of ``x``'s shape and dtype with normal values (uninitialized memory could hold
    denormals or NaNs, which slow a GEMM down and would understate the machine's rate)."""
    if not isinstance(x, torch.Tensor):
        return x
    if not x.is_floating_point():
        return x.clone()
    try:  # the same strides (a transposed operand stays transposed)
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype).normal_()
    except RuntimeError:  # overlapping strides (an expanded view): a dense copy
        return torch.randn(x.shape, dtype=x.dtype)


def _gemm_flops(func: Any, args: tuple[Any, ...], out: torch.Tensor) -> float:
    """Multiply-add FLOPs (2 per MAC) of one matmul/conv call, from its operands and output."""
    a = torch.ops.aten
    op = func.overloadpacket  # any overload (``.default``, ``.out``) of the op
    if op in (a.addmm, a.baddbmm):
        return 2.0 * out.numel() * args[1].shape[-1]
    if op in (a.mm, a.bmm, a.matmul, a.linear, torch.ops.mkldnn._linear_pointwise):
        return 2.0 * out.numel() * args[0].shape[-1]
    w = args[1]  # conv weight: (Cout, Cin/groups, K) or, transposed, (Cin, Cout/groups, K)
    transposed = func is a.conv_transpose1d.default or (func is a.convolution.default and bool(args[6]))
    per_out = w.shape[1] * w[0, 0].numel()
    return 2.0 * (args[0].numel() if transposed else out.numel()) * per_out


def _best(fn: Any, repeats: int = 2) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


Call = tuple[Any, tuple[Any, ...], dict[str, Any]]


def _record(fn: Any, keep: set[int]) -> dict[str, Any]:
    """Run ``fn()`` once and record its matmul/conv and SDPA calls with their FLOPs (GEMM/conv,
    attention), and any GEMM-like op this count does not know.

    A call is stored once per distinct signature with a count: op, then per operand either the
    tensor itself when its data pointer is in ``keep`` (the models' weights: a replay reads the
    very weights a run reads, none of them from a warm cache it would not have), else a fresh
    tensor of its shape, strides and dtype (activations, caches). ``calls``/``attn_calls`` map a
    signature to ``[call, count]``.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    a = torch.ops.aten  # under inference_mode composite ops (linear, conv1d) reach the mode undecomposed
    gemm_ops = {a.mm.default, a.addmm.default, a.bmm.default, a.baddbmm.default, a.convolution.default,
                a.linear.default, a.matmul.default, a.conv1d.default, a.conv1d.padding,
                a.conv_transpose1d.default, a.mm.out, a.addmm.out, a.bmm.out, a.baddbmm.out,
                torch.ops.mkldnn._linear_pointwise.default}  # --cpu-gemm onednn's linear layers
    sdpa_ops = {a.scaled_dot_product_attention.default, a._scaled_dot_product_flash_attention_for_cpu.default}
    rec: dict[str, Any] = {
        "calls": {},
        "attn_calls": {},
        "attn_gemms": {},
        "flops": [0.0, 0.0],
        "unknown": set(),
    }

    def sig(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return (v.data_ptr() if v.data_ptr() in keep else None, tuple(v.shape), v.stride(), v.dtype)
        return tuple(sig(x) for x in v) if isinstance(v, list | tuple) else repr(v)

    def fresh(v: Any) -> Any:
        return v if isinstance(v, torch.Tensor) and v.data_ptr() in keep else _like(v)

    def store(table: dict[Any, list[Any]], func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # kwargs too: an ``out=`` GEMM (attention writing into its output layout) is replayed into
        # a fresh buffer of the same strides
        key = (func, sig(args), sig(sorted(kwargs.items())))
        if key in table:
            table[key][1] += 1
        else:
            table[key] = [(func, tuple(fresh(v) for v in args), {n: fresh(v) for n, v in kwargs.items()}), 1]

    class Record(TorchDispatchMode):
        @override
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in gemm_ops:
                if func is torch.ops.mkldnn._linear_pointwise.default:  # replayed as a plain GEMM: a fused
                    # epilogue (the DiT's GELU) is the flow's work, not the rate's
                    args = (*args[:3], "none", [], "")
                store(rec["calls"], func, args, kwargs or {})
                rec["flops"][0] += _gemm_flops(func, args, out)
            elif func in sdpa_ops:
                q, k = args[0], args[1]  # (B, H, L, D): QK^T and PV
                store(rec["attn_calls"], func, args, kwargs or {})
                rec["flops"][1] += 4.0 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3]
                # the same two products as plain GEMMs (per query head: GQA's shared K/V heads read
                # as often as the kernel reads them), the machine's GEMM rate on attention's shapes
                bh, (length, dh), cells = q.shape[0] * q.shape[1], q.shape[2:], k.shape[2]
                scores = torch.empty(bh, length, cells, dtype=q.dtype)
                for a_, b_ in (
                    (torch.empty(bh, length, dh, dtype=q.dtype), torch.empty(bh, dh, cells, dtype=q.dtype)),
                    (scores, torch.empty(bh, cells, dh, dtype=q.dtype)),
                ):
                    store(rec["attn_gemms"], a.bmm.default, (a_, b_), {})
            elif "mm" in func.__name__ or "conv" in func.__name__ or "einsum" in func.__name__:
                rec["unknown"].add(func.__name__)  # a GEMM-like op this count does not know
            return out

    with torch.inference_mode(), Record():
        fn()
    return rec


def _replay(recorded: dict[Any, list[Any]]) -> None:
    """Every recorded call, as many times as it was made."""
    for (func, args, kw), count in recorded.values():
        for _ in range(count):
            func(*args, **kw)


def _weights(*modules: Any) -> set[int]:
    return {t.data_ptr() for m in modules for t in (*m.parameters(), *m.buffers())}


def _as_aten(calls: dict[Any, list[Any]]) -> dict[Any, list[Any]]:
    """The same GEMM calls with oneDNN's linear layers replaced by aten's (``F.linear``: MKL)."""
    lin = torch.ops.mkldnn._linear_pointwise.default
    return {key: [(torch.ops.aten.linear.default, args[:3], {}) if func is lin else (func, args, kw), n]
            for key, ((func, args, kw), n) in calls.items()}


def flow_gemm_fraction(tokens: int = 100, rounds: int = 5) -> dict[str, Any]:
    """The flow's achieved matmul/conv FLOP rate over the machine's rate on the same calls alone.

    Every matmul/conv call of one flow inference is recorded (op, operand shapes, FLOPs); replaying
    them alone (the flow's own weights, fresh activations of the same shapes; :func:`_record`)
    gives the machine's fp32 GEMM rate on the flow's own shapes
    (``gemm_gflops``); the flow's rate is those FLOPs over its wall time (``flow_gflops``). The
    fraction is their ratio: 1.0 would be a flow that spends its time in nothing but GEMMs.
    Attention through SDPA is not a GEMM call here; its FLOPs are reported beside
    (``flow_attention_gflop``), while attention spelled bmm - softmax - bmm would count as GEMM
    work (its bmm calls, ``out=`` overloads included, on both sides). So that the figure does not
    depend on how attention is spelled, ``flow_kernel_fraction`` also replays the SDPA calls alone
    and counts their FLOPs on both sides: the share of the flow's time spent in GEMM or attention
    kernels at their standalone speed (what is left is elementwise work, copies and overhead).

    The flow runs as a run on this CPU does (``--cpu-gemm auto``: oneDNN's linear layers where torch
    has it). The same flow on aten's linear layers (MKL; ``--cpu-gemm aten``) is timed beside it:
    ``flow_s_aten``, its own ``flow_gemm_fraction_aten``, and ``gemm_gflops_aten``, the plain aten
    GEMM rate on the flow's shapes, which ``flow_fraction_of_aten_gemm`` divides the run's flow
    rate by (the flow's speed measured against plain fp32 GEMMs).

    Timing: ``rounds`` rounds of (each flow call, each GEMM replay, attention replay), best of each,
    so that load from other processes on a shared machine hits every side of each ratio alike.
    """
    from cosyclone.base.device import resolve
    from cosyclone.code2wav.flow import build_flow
    from cosyclone.model.config import released_config

    cfg = released_config()
    policy = resolve("cpu", "fp32")
    flows = {"run": build_flow(cfg, policy, load_format="dummy")}
    if policy.cpu_gemm != "aten":
        flows["aten"] = build_flow(cfg, replace(policy, cpu_gemm="aten"), load_format="dummy")
    gen = torch.Generator().manual_seed(0)
    x = (torch.randint(0, cfg.flow.vocab_size, (1, tokens), generator=gen), torch.tensor([tokens]),
         torch.randint(0, cfg.flow.vocab_size, (1, 75), generator=gen), torch.tensor([75]),
         torch.randn(1, 150, 80, generator=gen), torch.randn(1, 192, generator=gen))

    with torch.inference_mode():
        for flow in flows.values():
            flow.inference(*x, n_timesteps=1)  # warm-up
    rec = _record(lambda: flows["run"].inference(*x, n_timesteps=1), _weights(flows["run"]))
    work = {
        "run": rec["calls"],
        "aten": _as_aten(rec["calls"]),
        "attn": rec["attn_calls"],
        "attn_gemm": rec["attn_gemms"],
    }
    best = dict.fromkeys([f"flow_{k}" for k in flows] + list(work), float("inf"))
    with torch.inference_mode():
        for jobs in work.values():
            _replay(jobs)
        for _ in range(rounds):
            for k, flow in flows.items():
                best[f"flow_{k}"] = min(
                    best[f"flow_{k}"], _best(lambda f=flow: f.inference(*x, n_timesteps=1), 1)
                )
            for k, jobs in work.items():
                best[k] = min(best[k], _best(lambda j=jobs: _replay(j), 1))
    gemm_flop, attn_flop = rec["flops"]
    t_flow, t_gemm, t_attn, t_attn_gemm = best["flow_run"], best["run"], best["attn"], best["attn_gemm"]
    matmul_flop, t_matmul = gemm_flop + attn_flop, t_gemm + t_attn_gemm
    out = {
        "flow_gemm_fraction": round(t_matmul / t_flow, 3),
        "flow_gflops": round(matmul_flop / t_flow / 1e9, 1),
        "gemm_gflops": round(matmul_flop / t_matmul / 1e9, 1),
        "flow_gemm_fraction_linear": round(t_gemm / t_flow, 3),
        "gemm_gflops_linear": round(gemm_flop / t_gemm / 1e9, 1),
        "flow_gemm_gflop": round(gemm_flop / 1e9, 2),
        "flow_attention_gflop": round(attn_flop / 1e9, 2),
        "flow_s": round(t_flow, 2),
        "flow_gemm_replay_s": round(t_gemm, 2),
        "flow_gemm_calls": sum(n for _, n in rec["calls"].values()),
        "flow_attention_gemm_replay_s": round(t_attn_gemm, 3),
        "flow_kernel_fraction": round((t_gemm + t_attn) / t_flow, 3),
        "flow_attention_replay_s": round(t_attn, 2),
        "flow_attention_calls": sum(n for _, n in rec["attn_calls"].values()),
        "flow_uncounted_ops": sorted(rec["unknown"]),
        "flow_cpu_gemm": policy.cpu_gemm,
        "gemm_gflops_aten": round(matmul_flop / (best["aten"] + t_attn_gemm) / 1e9, 1),
        "flow_fraction_of_aten_gemm": round((best["aten"] + t_attn_gemm) / t_flow, 3),
        "flow_workload": f"batch 1, {tokens} tokens, 75 prompt tokens, 1 Euler step, fp32",
    }
    if "flow_aten" in best:
        out.update(
            flow_s_aten=round(best["flow_aten"], 2),
            flow_onednn_speedup=round(best["flow_aten"] / t_flow, 3),
            flow_gemm_fraction_aten=round((best["aten"] + t_attn_gemm) / best["flow_aten"], 3),
        )
    return out


def run_gemm_fraction(tokens: int = 100, n_timesteps: int | None = None, rounds: int = 2) -> dict[str, Any]:
    """The whole model run's fraction of the GEMM rate: one row of the end-to-end baseline's shape
    (``run_all.build_manifest``: 3.0 s prompt, 20 + 30 text ids, ``tokens`` speech tokens, min =
    max) through the API on full-size dummy weights, frontend, talker, flow and HiFT together.

    Its matmul/conv calls (and attention) are recorded as the flow's are (:func:`_record`) and
    replayed alone; ``run_gemm_fraction`` is the GEMM replay's time over the run's wall time (the
    run's GEMM rate over the machine's on the run's own calls), ``run_kernel_fraction`` the same
    with attention counted as kernel work. The prompt's conditioning is cached after the warm-up
    run, as it is for every row after a speaker's first in a manifest.
    """
    sys.path.insert(0, str(ROOT))
    from benchmarks.run_all import E2EConfig, build_manifest
    from cosyclone.api import CosyClone

    with tempfile.TemporaryDirectory(prefix="cosyclone-run-fraction-") as tmp:
        folder = Path(tmp)
        build_manifest(replace(E2EConfig(), rows=1, tokens=tokens), folder)
        row = json.loads((folder / "m.jsonl").read_text().splitlines()[0])
        tts = CosyClone(
            None,
            load_format="dummy",
            device="cpu",
            dtype="fp32",
            max_tokens=tokens,
            min_tokens=tokens,
            n_timesteps=n_timesteps,
        )
        st = tts.stages

        def once() -> None:
            res = tts.synthesize(row["text"], folder / row["prompt_audio"], row["prompt_text"])
            assert res.ok, res.error

        once()  # warm-up (and the prompt cache)
        rec = _record(once, _weights(st.talker, st.flow, st.hift))
        best = dict.fromkeys(("run", "gemm", "attn", "attn_gemm"), float("inf"))
        for _ in range(rounds):
            best["run"] = min(best["run"], _best(once, 1))
            with torch.inference_mode():
                best["gemm"] = min(best["gemm"], _best(lambda: _replay(rec["calls"]), 1))
                best["attn"] = min(best["attn"], _best(lambda: _replay(rec["attn_calls"]), 1))
                best["attn_gemm"] = min(best["attn_gemm"], _best(lambda: _replay(rec["attn_gemms"]), 1))
    steps = n_timesteps or tts.cfg.flow.cfm.n_timesteps
    return {
        "run_gemm_fraction": round((best["gemm"] + best["attn_gemm"]) / best["run"], 3),
        "run_gemm_fraction_linear": round(best["gemm"] / best["run"], 3),
        "run_kernel_fraction": round((best["gemm"] + best["attn"]) / best["run"], 3),
        "run_s": round(best["run"], 2),
        "run_gemm_replay_s": round(best["gemm"], 2),
        "run_attention_replay_s": round(best["attn"], 2),
        "run_gemm_gflop": round(rec["flops"][0] / 1e9, 1),
        "run_attention_gflop": round(rec["flops"][1] / 1e9, 1),
        "run_gflops": round(rec["flops"][0] / best["run"] / 1e9, 1),
        "run_uncounted_ops": sorted(rec["unknown"]),
        "run_cpu_gemm": tts.policy.cpu_gemm,
        "run_workload": f"1 row, {tokens} tokens, 3.0 s prompt, {steps} flow steps, fp32, "
        "full-size dummy weights, prompt conditioning cached",
    }


def frontend_cache(model_dir: str | None, rows: int = 16, prompts: int = 2) -> dict[str, Any]:
    """Frontend time over ``rows`` rows sharing ``prompts`` prompts, without and with the prompt cache."""
    from cosyclone.frontend import Frontend
    from cosyclone.frontend.tiny_assets import builtin_assets_dir
    from cosyclone.model.config import load_model_config, released_config

    cfg = (
        load_model_config(model_dir)
        if model_dir
        else replace(released_config(), model_dir=builtin_assets_dir())
    )
    audio = [ROOT / "manifests" / "prompts" / f"speaker{k % 3 + 1}.wav" for k in range(prompts)]
    texts = [f"Sentence number {i}, spoken in one of {prompts} voices." for i in range(rows)]

    def once(entries: int) -> tuple[float, list[Any]]:
        fe = Frontend(cfg, prompt_cache_entries=entries)
        fe.prepare("warm", audio[-1], "warm up words", "Warm up.")  # tokenizer and sessions loaded
        fe.prompt_cache = type(fe.prompt_cache)(entries)  # start cold
        t0 = time.perf_counter()
        reqs = [
            fe.prepare(f"r{i}", audio[i % prompts], "reference words", t, seed=i) for i, t in enumerate(texts)
        ]
        return time.perf_counter() - t0, reqs

    t_plain, plain = once(0)
    t_cached, cached = once(256)
    same = all(
        torch.equal(a.text_ids, b.text_ids) and all(torch.equal(a.embed[k], b.embed[k]) for k in a.embed)
        for ra, rb in zip(plain, cached, strict=True)
        for a, b in zip(ra, rb, strict=True)
    )
    return {"frontend_cache_speedup": round(t_plain / t_cached, 2), "frontend_cache_equal": same,
            "frontend_s_without_cache": round(t_plain, 3), "frontend_s_with_cache": round(t_cached, 3),
            "frontend_workload": f"{rows} rows, {prompts} prompts, "
                                 + ("model dir ONNX" if model_dir else "built-in tiny ONNX stand-ins")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small workloads, under 3 minutes on 2 cores")
    ap.add_argument("--before-rev", default=BEFORE_REV)
    ap.add_argument("--batch", type=int, default=16, help="rows for the per-step op count")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--compile-backend", default=None, help="default: eager with --quick, else inductor")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model-dir", default=None, help="frontend assets for the prompt-cache figure")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(ROOT))
    from benchmarks.machine import cpu_name

    out: dict[str, Any] = {
        "device": cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    t0 = time.perf_counter()
    out.update(ops_per_step(args.before_rev, args.batch, compiled=not args.quick))
    print(
        f"ops/step at batch {args.batch}: before {out['ops_per_step_before']}, "
        f"after {out['ops_per_step_after']}; "
        f"us/step before {out['us_per_step_before']}, after {out['us_per_step_after']:.0f} [{out['device']}]"
        + (
            f"; compiled (inductor) {out['ops_per_step_compiled']} ops/step"
            if "ops_per_step_compiled" in out
            else ""
        ),
        flush=True,
    )
    out.update(compile_check(args.compile_backend or ("eager" if args.quick else "inductor")))
    print(f"compile: {out['recompiles']} recompiles, eager_equal={out['eager_equal']}", flush=True)
    out.update(continuous_vs_static(not args.quick, args.slots))
    out.update(continuous_vs_static(not args.quick, args.slots, eos=False))
    print(
        f"continuous vs static ({out['continuous_geometry']}, {out['continuous_rows']} rows, "
        f"{out['continuous_slots']} slots, longest batch first): {out['continuous_vs_static']}x where the "
        f"sampler's EOS ends rows ({out['rows_at_max_len']} reach their cap; ceiling "
        f"{out['continuous_vs_static_ceiling']}x), {out['continuous_vs_static_exact']}x when every row runs "
        f"exactly to its cap (ceiling {out['continuous_vs_static_exact_ceiling']}x); same tokens "
        f"{out['continuous_equal_static'] and out['continuous_equal_static_exact']} [{out['device']}]",
        flush=True,
    )
    out.update(frontend_cache(args.model_dir))
    print(f"frontend, {out['frontend_workload']}: cache {out['frontend_cache_speedup']}x faster, "
          f"same features {out['frontend_cache_equal']}", flush=True)
    try:
        out.update(flow_gemm_fraction())
        print(
            f"flow ({out['flow_workload']}, linear layers on {out['flow_cpu_gemm']}): "
            f"{out['flow_gemm_fraction']} of the GEMM rate on its own matrix products ({out['gemm_gflops']} "
            f"GFLOP/s; {out['flow_gemm_fraction_linear']} on its linear/conv calls alone, "
            f"attention's time a loss), "
            f"{out['flow_kernel_fraction']} counting attention's fused kernel as kernel work, "
            f"{out['flow_fraction_of_aten_gemm']} of plain aten GEMMs on its shapes "
            f"({out['gemm_gflops_aten']} GFLOP/s)"
            + (
                f"; {out['flow_onednn_speedup']}x the flow on aten's linear layers"
                if "flow_onednn_speedup" in out
                else ""
            )
            + f" [{out['device']}]",
            flush=True,
        )
    except Exception as exc:  # a figure that could not be measured is null, with why
        out.update(flow_gemm_fraction=None, flow_gemm_fraction_reason=f"{type(exc).__name__}: {exc}")
    try:
        out.update(run_gemm_fraction(25, 2) if args.quick else run_gemm_fraction(100))
        print(
            f"whole run ({out['run_workload']}, linear layers on {out['run_cpu_gemm']}): "
            f"{out['run_gemm_fraction']} of the GEMM rate on its own matrix products "
            f"({out['run_gemm_fraction_linear']} on its linear/conv calls alone), "
            f"{out['run_kernel_fraction']} counting attention's fused kernel "
            f"[{out['device']}]",
            flush=True,
        )
    except Exception as exc:
        out.update(run_gemm_fraction=None, run_gemm_fraction_reason=f"{type(exc).__name__}: {exc}")
    out["bench_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
