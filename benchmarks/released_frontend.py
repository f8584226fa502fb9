"""The frontend of the released geometry, with random weights: its two ONNX files built once, and
what a distinct prompt costs through them.

Why: the built-in frontend (``frontend/tiny_assets.py``) has the released files' signatures but a
few thousand weights, so a run over it never pays for the frontend, the likely bound of a
distinct-prompt night. The released ``speech_tokenizer_v3.onnx`` is a Whisper-style encoder of
about 240M weights (12 blocks of width 1280, 20 heads, FSMN memory and rotary positions, an FSQ of
3^8 codes) and ``campplus.onnx`` a CAM++ x-vector net of about 7M (80 fbank bins in, 192 dims
out); their cost follows that geometry, not their weights. ``s3tokenizer`` (PyPI) implements the v3
tokenizer in torch and ``speakerlab-slim`` the CAM++ net: both are built here at the released sizes,
seeded, and exported with ``torch.onnx`` to the input and output layout ``frontend/onnx.py`` reads
(the tokenizer: ``feats`` float32 (1, 128, T), ``feats_length`` int32 (1,) -> int64 tokens (1, P);
CAM++: ``input`` float32 (1, T, 80) -> (1, 192)). No network: the packages travel in the GPU
bundle (``benchmarks/gpu_bundle_pins.txt``).

:func:`measure` runs distinct prompts through the product's own :class:`~cosyclone.frontend.Frontend`
(resampling, whisper and kaldi features, both sessions, the flow's prompt mel) on one worker with
one intra-op thread: prompts per second per core on the CPU provider, per worker on CUDA's. The
projection's frontend figure (``engine/projection.py``) is this measurement, with its machine.

    python -m benchmarks.released_frontend [--dir DIR] [--prompts 6] [--seconds 10] [--device cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from typing_extensions import override

ROOT = Path(__file__).resolve().parents[1]
#: The released speech tokenizer's blocks (s3tokenizer's ModelConfigV3 default, the released file's).
TOKENIZER_LAYERS = 12
#: What :func:`build` writes last: the folder is whole when it is there.
MARKER = "released_frontend.json"


def _s3tokenizer() -> Any:
    """``s3tokenizer.model_v2`` / ``model_v3``. The package imports torchaudio at load for its audio
    loader, which nothing here calls; where torchaudio cannot load (there is none for torch 2.13), an
    empty module stands in for it during that import only (left in place, it would tell other
    libraries, transformers among them, that torchaudio is there)."""
    stand_in = None
    try:
        import torchaudio  # type: ignore[import-not-found]  # noqa: F401
    except (ImportError, OSError):
        stand_in = sys.modules["torchaudio"] = types.ModuleType("torchaudio")
    try:
        import s3tokenizer.model_v2 as v2
        import s3tokenizer.model_v3 as v3
    finally:
        if stand_in is not None and sys.modules.get("torchaudio") is stand_in:
            del sys.modules["torchaudio"]
    return v2, v3


def _turn(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary_real(xq: torch.Tensor, xk: torch.Tensor,
                 freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """s3tokenizer's rotary step over (cos, sin) pairs stored as real numbers: the same products,
    without the complex tensor the ONNX exporter cannot write."""
    cos = freqs_cis[..., 0].unsqueeze(0).unsqueeze(2).to(xq.dtype)
    sin = freqs_cis[..., 1].unsqueeze(0).unsqueeze(2).to(xq.dtype)
    return xq * cos + _turn(xq) * sin, xk * cos + _turn(xk) * sin


@contextlib.contextmanager
def _real_rotary(v2: Any, encoder: Any) -> Iterator[None]:
    """For the export only: the encoder's rotary table as real (cos, sin) pairs and the package's
    rotary step reading them (tokens unchanged: :func:`build` compares them)."""
    saved, table = v2.apply_rotary_emb, encoder.freqs_cis
    v2.apply_rotary_emb, encoder.freqs_cis = _rotary_real, torch.view_as_real(table).contiguous()
    try:
        yield
    finally:
        v2.apply_rotary_emb, encoder.freqs_cis = saved, table


class _Tokenizer(torch.nn.Module):
    """The v3 tokenizer's encoder and quantizer as one traceable call (the package's ``quantize``
    splits long audio in Python; the frontend refuses prompts over 30 s, so one window holds all)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    @override
    def forward(self, feats: torch.Tensor, feats_length: torch.Tensor) -> torch.Tensor:
        model: Any = self.model
        hidden, _ = model.encoder(feats, feats_length.to(torch.int64))
        return model.quantizer.encode(hidden).to(torch.int64)


def _export(module: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path,
            names: tuple[list[str], list[str]], axes: dict[str, dict[int, str]]) -> None:
    # no constant folding: over 240M weights it doubles the export, and the session folds them at load
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's tracer notices
        torch.onnx.export(module, args, str(path), input_names=names[0], output_names=names[1],
                          dynamic_axes=axes, opset_version=17, dynamo=False, do_constant_folding=False)


def build(folder: str | Path, *, seed: int = 0, layers: int = TOKENIZER_LAYERS) -> dict[str, Any]:
    """Write ``speech_tokenizer_v3.onnx`` and ``campplus.onnx`` of the released geometry (random,
    seeded weights) into ``folder`` unless it holds them already; what was built (weights, seconds)."""
    folder = Path(folder)
    if (folder / MARKER).is_file():
        return dict(json.loads((folder / MARKER).read_text()), built_s=0.0)
    from speakerlab.models.campplus.DTDNN import CAMPPlus

    v2, v3 = _s3tokenizer()
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    tok = v3.S3TokenizerV3("speech_tokenizer_v3", v3.ModelConfigV3(n_audio_layer=layers)).eval()
    wrapped = _Tokenizer(tok).eval()
    feats, length = torch.randn(1, 128, 401), torch.tensor([401], dtype=torch.int32)
    with torch.no_grad():
        before = wrapped(feats, length)
        with _real_rotary(v2, tok.encoder):
            if not torch.equal(before, wrapped(feats, length)):
                raise RuntimeError("the real-valued rotary step changed the tokens")
            _export(wrapped, (feats, length), folder / "speech_tokenizer_v3.onnx",
                    (["feats", "feats_length"], ["indices"]), {"feats": {2: "T"}, "indices": {1: "P"}})
    spk = CAMPPlus(feat_dim=80, embedding_size=192, memory_efficient=False).eval()
    _export(spk, (torch.randn(1, 200, 80),), folder / "campplus.onnx", (["input"], ["output"]),
            {"input": {1: "T"}})
    facts = {"tokenizer_weights": sum(p.numel() for p in tok.parameters()), "tokenizer_layers": layers,
             "campplus_weights": sum(p.numel() for p in spk.parameters()), "seed": seed,
             "bytes": {n: (folder / n).stat().st_size for n in ("speech_tokenizer_v3.onnx", "campplus.onnx")}}
    (folder / MARKER).write_text(json.dumps(facts))
    return dict(facts, built_s=round(time.perf_counter() - t0, 1))


def frontend_folder(onnx_folder: str | Path) -> Path:
    """A model-directory-shaped folder for :class:`~cosyclone.frontend.Frontend`: the built-in
    tokenizer beside the released-geometry ONNX files of ``onnx_folder`` (linked, not copied)."""
    from cosyclone.frontend.tiny_assets import builtin_assets_dir
    from cosyclone.model.config import QWEN_DIR

    onnx_folder = Path(onnx_folder)
    link = onnx_folder / QWEN_DIR
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(builtin_assets_dir() / QWEN_DIR, target_is_directory=True)
    return onnx_folder


def prompt_waves(n: int, seconds: float) -> list[tuple[torch.Tensor, int]]:
    """``n`` distinct prompt waves of ``seconds`` each: the bundled speakers' recordings joined,
    cut at an offset of each one's own (no two alike, as a dataset's prompts)."""
    import soundfile as sf

    waves, rate = [], 24000
    for k in (1, 2, 3):
        data, rate = sf.read(str(ROOT / "manifests" / "prompts" / f"speaker{k}.wav"), dtype="float32")
        waves.append(torch.from_numpy(data if data.ndim == 1 else data.mean(axis=1)))
    loop = torch.cat(waves * max(1, int(seconds * n / 20) + 4))
    length = int(seconds * rate)
    return [(loop[(7919 * i) % (len(loop) - length):][:length].clone(), rate) for i in range(n)]


def measure(onnx_folder: str | Path, *, prompts: int = 6, seconds: float = 10.0,
            providers: list[str] | None = None) -> dict[str, Any]:
    """Prompts per second of one frontend worker (one intra-op thread) over ``prompts`` distinct
    prompts of ``seconds`` each, after one warm-up prompt: the product's
    :meth:`Frontend.prompt_features` on the released-geometry sessions (``providers``: default the CPU's)."""
    from dataclasses import replace

    from cosyclone.frontend import Frontend
    from cosyclone.frontend.onnx import set_intra_op_threads
    from cosyclone.model.config import released_config

    set_intra_op_threads(1)
    provs = providers or ["CPUExecutionProvider"]
    cfg = replace(released_config(), model_dir=frontend_folder(onnx_folder))
    fe = Frontend(cfg, providers=provs, text_frontend="none", prompt_cache_entries=0)
    waves = prompt_waves(prompts + 1, seconds)
    fe.prompt_features(waves[0])  # warm-up: session arenas, first-call allocations
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the features' torch work on one core, as one prompt worker's
    try:
        each, tokens = [], 0
        for w in waves[1:]:
            t0 = time.perf_counter()
            tokens += int(fe.prompt_features(w)["speech_token"].numel())
            each.append(time.perf_counter() - t0)
        wall = sum(each)
    finally:
        torch.set_num_threads(threads)
    return {"prompts": prompts, "prompt_seconds": seconds, "providers": fe.onnx._tok.get_providers(),
            "wall_s": round(wall, 3), "prompt_s": round(wall / prompts, 4),
            "best_prompt_s": round(min(each), 4), "median_prompt_s": round(sorted(each)[len(each) // 2], 4),
            "prompts_per_s": round(prompts / wall, 3),
            "speech_tokens": tokens}


def main(argv: list[str] | None = None) -> int:
    from benchmarks.machine import describe

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="where the ONNX files are built (default: the user cache)")
    ap.add_argument("--prompts", type=int, default=6, help="distinct prompts timed (after one warm-up)")
    ap.add_argument("--seconds", type=float, default=10.0, help="each prompt's length (at most 30)")
    ap.add_argument("--device", default="cpu", help="cpu: the CPU provider | cuda: CUDA's where offered")
    ap.add_argument("--layers", type=int, default=TOKENIZER_LAYERS, help="tokenizer blocks (12: released)")
    args = ap.parse_args(argv)
    if args.dir is None:
        from cosyclone.base.user_cache import cache_dir

        args.dir = str(cache_dir() / f"released-frontend-l{args.layers}")
    built = build(args.dir, layers=args.layers)
    from cosyclone.frontend.onnx import default_providers

    fig = measure(args.dir, prompts=args.prompts, seconds=args.seconds,
                  providers=default_providers(args.device) if args.device != "cpu" else None)
    fig.update(built=built, machine=describe(), per="one worker, one intra-op thread")
    print(f"released-geometry frontend ({built['tokenizer_weights'] / 1e6:.0f}M + "
          f"{built['campplus_weights'] / 1e6:.1f}M weights, built in {built['built_s']} s) "
          f"on {fig['machine']}, "
          f"{fig['providers'][0]}: {fig['prompts']} distinct prompts of {args.seconds:g} s, "
          f"{fig['prompt_s']} s each = {fig['prompts_per_s']} prompts/s per worker")
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
