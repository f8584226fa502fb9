"""The ``cosyclone`` command: synth, validate, eval, make-tiny-model, inspect.

Exit codes: 0 = every row done; 3 = some rows failed or were rejected by validation (the others
were produced); 2 = unusable input (manifest or model directory unreadable, bad options).
"""

from __future__ import annotations

import json
import platform
import re
import sys
import time
from pathlib import Path

import typer

from . import __version__
from .errors import CosycloneError
from .eval.command import eval_command

EXIT_OK, EXIT_USAGE, EXIT_ROWS_FAILED = 0, 2, 3
app = typer.Typer(add_completion=False, help="Offline batched CosyVoice3 voice cloning.")


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(EXIT_USAGE)


def _load_cfg(model_dir: Path | None, load_format: str):
    from .config import load_model_config, released_config

    if model_dir is not None:
        return load_model_config(model_dir)
    if load_format != "dummy":
        _fail("give --model-dir DIR, or --load-format dummy for random weights at released size")
    return released_config()


TEXT_FRONTEND_HELP = ("wetext (the official normalizer: numbers, dates, units spelled out) | none (the official "
                      "code without a normalizer: inflect spells digits only)")


@app.command()
def validate(
    manifest: Path = typer.Argument(..., help="JSONL manifest"),
    model_dir: Path | None = typer.Option(None, "--model-dir",
                                          help="model directory: its tokenizer gives the real token counts "
                                               "(default: a built-in stand-in tokenizer)"),
    show_text: bool = typer.Option(False, "--show-text", help="print each row's normalized segments and token counts"),
    json_out: bool = typer.Option(False, "--json", help="one JSON object per manifest row on stdout: {id, mode, "
                                                        "prompt_ids, segments: [{text, ids}]} or {id, error}"),
    text_frontend: str = typer.Option("wetext", "--text-frontend", help=TEXT_FRONTEND_HELP),
) -> None:
    """Validate a manifest (no model weights are read); exit 3 when any row is rejected.

    With --model-dir, --show-text or --json each row's text is also planned as the LLM will read
    it (normalized, split, tokenized) and checked against the model's position limit.
    """
    from .errors import ManifestError
    from .manifest import ManifestRow, read_manifest
    from .pipeline import PROMPT_TOKENS_PER_SECOND

    try:
        m = read_manifest(manifest, text_frontend=text_frontend)
        text, cfg = _text_side(model_dir, text_frontend) if (show_text or json_out or model_dir) else (None, None)
    except CosycloneError as exc:
        _fail(str(exc))
    report = sys.stderr if json_out else sys.stdout
    if text is not None and model_dir is None:
        typer.echo("note: no --model-dir: token counts come from the built-in stand-in tokenizer (bytes, not the "
                   "model's vocabulary), so English segments can differ; give --model-dir for real counts",
                   err=True)
    entries: list[tuple[int, object]] = [(e.line or 0, e) for e in m.errors] + [(r.line, r) for r in m.rows]
    rejected = len(m.errors)
    for _, item in sorted(entries, key=lambda e: e[0]):
        if not isinstance(item, ManifestRow):
            _emit_row_error(manifest, item, json_out)
            continue
        if text is None:
            continue
        try:
            plan = text.plan(item.mode, item.prompt_text, item.text, item.instruct, row_id=item.id)
            speech = round(PROMPT_TOKENS_PER_SECOND * item.prompt_seconds) if item.mode == "zero_shot" else 0
            plan.check_fit(max_positions=cfg.talker.qwen.max_position_embeddings,
                           max_len_ratio=cfg.talker.max_len_ratio, prompt_speech_tokens=speech, row_id=item.id)
        except CosycloneError as exc:
            rejected += 1
            reason = str(exc).removeprefix(f"row {item.id!r}: ")
            _emit_row_error(manifest, ManifestError(reason, line=item.line, field="text", row_id=item.id), json_out)
            continue
        if json_out:
            typer.echo(json.dumps({"id": item.id, "mode": item.mode, "prompt_ids": list(plan.prompt_ids),
                                   "segments": [{"text": s.text, "ids": list(s.ids)} for s in plan.segments]},
                                  ensure_ascii=False))
        elif show_text:
            typer.echo(f"line {item.line}, id {item.id!r}, {item.mode}: prompt {len(plan.prompt_ids)} tokens"
                       + (f" {plan.prompt_text!r}" if plan.prompt_text else ""))
            for i, seg in enumerate(plan.segments, start=1):
                typer.echo(f"  segment {i}/{len(plan.segments)}, {len(seg.ids)} tokens: {seg.text}")
    typer.echo(f"{len(m.rows) + len(m.errors) - rejected} valid rows, {rejected} rejected", file=report)
    raise typer.Exit(EXIT_ROWS_FAILED if rejected else EXIT_OK)


def _text_side(model_dir: Path | None, text_frontend: str):
    """(TextFrontend, the config whose position limits apply) for ``validate``; no weights are read.

    Without a model directory the built-in stand-in tokenizer is used, as dummy runs do.
    """
    from .config import QWEN_DIR, load_model_config, released_config
    from .frontend.text import TextFrontend

    if model_dir is not None:
        cfg = load_model_config(model_dir)
        return TextFrontend(model_dir / QWEN_DIR, text_frontend=text_frontend), cfg
    import tempfile

    from .frontend.tiny_assets import write_tiny_tokenizer

    qwen = write_tiny_tokenizer(Path(tempfile.mkdtemp(prefix="cosyclone-validate-")) / QWEN_DIR)
    return TextFrontend(qwen, text_frontend=text_frontend), released_config()


def _emit_row_error(manifest: Path, err, json_out: bool) -> None:
    if json_out:
        typer.echo(json.dumps({"id": err.row_id, "error": str(err)}, ensure_ascii=False))
    else:
        typer.echo(f"{manifest}: {err}")


@app.command()
def synth(
    manifest: Path = typer.Argument(..., help="JSONL manifest (see README for the schema)"),
    model_dir: Path | None = typer.Option(None, "--model-dir", help="Fun-CosyVoice3-0.5B directory"),
    load_format: str = typer.Option("auto", help="auto (read weights) | dummy (random weights)"),
    out: Path = typer.Option(Path("out"), "--out", help="output folder"),
    device: str = typer.Option("auto", help="auto | cuda | rocm | cpu"),
    dtype: str = typer.Option("auto", help="auto | bf16 | fp16 | fp32 (auto: bf16 on GPUs with bf16, else fp32; "
                                           "head, sampler and HiFT always fp32; see README)"),
    batch_size: int = typer.Option(8, help="max rows per batch"),
    talker_slots: int | None = typer.Option(
        None, help="rows the talker decodes at once; the batch's other segments take a slot as one frees "
                   "(continuous batching, same output; default: the whole batch at once)"),
    token_budget: int | None = typer.Option(
        None, help="max padded work per batch: rows x the largest row estimate, where a row's estimate is "
                   "the characters of prompt_text + text + instruct plus 25 per second of prompt audio; "
                   "a row over budget runs alone (default: --batch-size only)"),
    seed: int = typer.Option(0, help="run seed (row seeds derive from it and the row id)"),
    top_p: float | None = typer.Option(None, help="sampler top-p (default: model yaml)"),
    top_k: int | None = typer.Option(None, help="sampler top-k"),
    win_size: int | None = typer.Option(None, help="RAS window"),
    tau_r: float | None = typer.Option(None, help="RAS threshold ratio"),
    nonfinite_policy: str = typer.Option("exclude", help="exclude | error | legacy-zero (LEGACY, official)"),
    draw: str = typer.Option("race", help="race | legacy-multinomial (LEGACY, official)"),
    nonfinite_audio: str = typer.Option("fail", help="fail | zero (LEGACY): what NaN/inf audio samples do; "
                                                     "counted per row either way"),
    shard: str | None = typer.Option(None, help="i/N: this machine's contiguous slice"),
    overwrite: bool = typer.Option(False, help="redo every row (default: resume)"),
    dry_run: bool = typer.Option(False, help="validate and plan only"),
    max_tokens: int | None = typer.Option(None, help="cap speech tokens per segment (tests, bench)"),
    min_tokens: int | None = typer.Option(None, hidden=True,
                                          help="ADVANCED: block stop ids below this many tokens per segment "
                                               "(with --max-tokens equal: exactly that many, for benchmarks)"),
    n_timesteps: int | None = typer.Option(None, help="flow Euler steps"),
    float_wav: bool = typer.Option(False, help="32-bit float WAVs instead of PCM16"),
    text_frontend: str = typer.Option("wetext", "--text-frontend", help=TEXT_FRONTEND_HELP),
) -> None:
    """Synthesize every row of MANIFEST into OUT/wavs/<id>.wav plus diagnostics and a summary."""
    from .device import resolve
    from .manifest import Shard, read_manifest
    from .pipeline import RunOptions, load_stages, plan_batches, run
    from .writer import BackgroundWriter, WriterOptions, completed_rows, render_summary, write_summary

    t_start = time.perf_counter()
    try:
        m = read_manifest(manifest, text_frontend=text_frontend)
        if shard:
            m = m.shard(Shard.parse(shard))
        for name, value, allowed in (("--nonfinite-policy", nonfinite_policy, ("exclude", "error", "legacy-zero")),
                                     ("--draw", draw, ("race", "legacy-multinomial")),
                                     ("--nonfinite-audio", nonfinite_audio, ("fail", "zero")),
                                     ("--load-format", load_format, ("auto", "dummy"))):
            if value not in allowed:
                raise CosycloneError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
        for name, value, low in (("--batch-size", batch_size, 1), ("--token-budget", token_budget, 1),
                                 ("--max-tokens", max_tokens, 1), ("--min-tokens", min_tokens, 0),
                                 ("--n-timesteps", n_timesteps, 1)):
            if value is not None and value < low:
                raise CosycloneError(f"{name} must be at least {low}, not {value}")
        if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
            raise CosycloneError(f"--min-tokens {min_tokens} is above --max-tokens {max_tokens}")
        policy = resolve(device, dtype)
        cfg = _load_cfg(model_dir, load_format)
    except CosycloneError as exc:
        _fail(str(exc))
    for err in m.errors:
        typer.echo(f"{manifest}: {err}", err=True)
    if "legacy" in nonfinite_policy or "legacy" in draw:
        typer.echo("warning: LEGACY sampler behaviour requested (official, pre-fix); diagnostics are labelled",
                   err=True)
    if nonfinite_audio == "zero":
        typer.echo("warning: --nonfinite-audio zero: NaN/inf audio samples are written as 0/+-1 (LEGACY); "
                   "counted per row (nonfinite_audio_samples)", err=True)
    for warning in policy.warnings:
        typer.echo(f"warning: {warning}", err=True)
    done = set() if overwrite else completed_rows(out, [r.id for r in m.rows])
    todo = [r for r in m.rows if r.id not in done]
    if dry_run:
        n_batches = len(plan_batches(todo, batch_size, token_budget))
        typer.echo(f"{len(m.rows)} valid rows, {len(m.errors)} rejected, {len(done)} already done, "
                   f"{len(todo)} to synthesize in {n_batches} batches on {policy.device} ({policy.dtype_name})")
        raise typer.Exit(EXIT_ROWS_FAILED if m.errors else EXIT_OK)

    opts = RunOptions(seed=seed, batch_size=batch_size, token_budget=token_budget, top_p=top_p, top_k=top_k,
                      win_size=win_size, tau_r=tau_r, nonfinite_policy=nonfinite_policy, draw=draw,
                      max_tokens=max_tokens, min_tokens=min_tokens, n_timesteps=n_timesteps,
                      load_format="dummy" if load_format == "dummy" else "auto", nonfinite_audio=nonfinite_audio,
                      device=policy.device.type, dtype=policy.dtype_name, text_frontend=text_frontend,
                      talker_slots=talker_slots)
    try:
        stages = load_stages(cfg, policy, opts.load_format, text_frontend=opts.text_frontend) if todo else None
    except CosycloneError as exc:
        _fail(str(exc))
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    writer = BackgroundWriter(WriterOptions(out_dir=out, float_wav=float_wav, sample_rate=cfg.hift.sampling_rate),
                              truncate=overwrite)
    bar = tqdm(total=len(todo), desc="synth", unit="row", disable=not tty)
    t_model = time.perf_counter()
    try:
        records = run(stages, todo, opts, writer.submit, progress=bar.update) if todo else []
    finally:
        bar.close()
        writer.close()
    wall = time.perf_counter() - t_model
    summary = _summary(records, m, done, opts, cfg, policy, out, wall, time.perf_counter() - t_start, model_dir,
                       load_format, shard, float_wav)
    write_summary(out, summary)
    for rec in records:  # the rows that failed after validation, by manifest line (details in diagnostics)
        d = rec.diagnostics
        if d.get("status") != "ok":
            typer.echo(f"{manifest}: line {d.get('line')}, row {rec.row_id!r}: {d.get('error')}", err=True)
    render_summary(summary, tty=sys.stdout.isatty())
    failed = summary["failed"] + summary["invalid"]
    raise typer.Exit(EXIT_ROWS_FAILED if failed else EXIT_OK)


def _summary(records, m, done, opts, cfg, policy, out, wall, total_wall, model_dir, load_format, shard,
             float_wav) -> dict:
    from dataclasses import asdict

    import torch

    sampler_rows = [s for r in records for s in r.diagnostics.get("sampler", [])]
    calls = sum(int(s.get("steps", 0)) for s in sampler_rows)
    all_nan = sum(int(s.get("all_nan_steps", 0)) for s in sampler_rows)
    nan_rows = sum(1 for r in records if any(s.get("nan_steps", 0) for s in r.diagnostics.get("sampler", [])))
    bad_audio = [int(r.diagnostics.get("nonfinite_audio_samples", 0)) for r in records]
    reasons: dict[str, int] = {}
    for r in records:
        if r.diagnostics.get("status") != "ok":
            key = str(r.diagnostics.get("reason"))
            reasons[key] = reasons.get(key, 0) + 1
    audio = sum(float(r.diagnostics.get("audio_seconds", 0.0)) for r in records)
    ok = sum(1 for r in records if r.diagnostics.get("status") == "ok")
    return {
        "rows": len(m.rows), "done": ok, "skipped": len(done), "failed": len(records) - ok,
        "invalid": len(m.errors), "invalid_rows": [str(e) for e in m.errors],
        "failed_rows": {r.row_id: r.diagnostics.get("error") for r in records if r.diagnostics.get("status") != "ok"},
        "failed_reasons": reasons,
        "nan_rows": nan_rows, "nan_summary": f"{calls} sampler calls, {all_nan} entirely NaN",
        "nonfinite_audio_rows": sum(1 for n in bad_audio if n), "nonfinite_audio_samples": sum(bad_audio),
        "audio_seconds": audio, "wall_seconds": wall, "total_wall_seconds": total_wall,
        "throughput_audio_s_per_s": audio / wall if wall > 0 else 0.0,
        "rtf": wall / audio if audio > 0 else None,
        "versions": {"cosyclone": __version__, "torch": torch.__version__, "python": platform.python_version(),
                     **_text_versions(opts.text_frontend)},
        "model_dir": str(model_dir) if model_dir else None, "model_yaml_sha256": cfg.yaml_sha256 or None,
        "load_format": load_format, "device": str(policy.device), "dtype": policy.dtype_name,
        "dtype_requested": policy.requested_dtype,
        "shard": shard, "float_wav": float_wav, "options": asdict(opts), "out_dir": str(out),
    }


app.command("eval")(eval_command)  # cosyclone/eval/command.py (models from the optional eval extra)


def _text_versions(text_frontend: str) -> dict[str, str]:
    """The text normalizer's package versions (they change what the model reads)."""
    from .frontend.normalize import get_normalizer

    return {k: v for k, v in get_normalizer(text_frontend).version().items() if k != "text_frontend"}


@app.command("make-tiny-model")
def make_tiny_model_cmd(directory: Path = typer.Argument(...),
                        force: bool = typer.Option(False, help="replace an existing directory's files")) -> None:
    """Write a complete tiny model directory in the released layout."""
    from .tiny import make_tiny_model

    if directory.exists() and any(directory.iterdir()) and not force:
        _fail(f"{directory} exists and is not empty (use --force)")
    make_tiny_model(directory)
    typer.echo(f"tiny model written to {directory}")


TEXT_NORMALIZERS = ("wetext", "inflect")  # what the official frontend normalizes with when ttsfrd is absent


def _declared_requirements() -> set[str]:
    """Names of the installed cosyclone distribution's required dependencies (extras excluded)."""
    from importlib import metadata

    try:
        reqs = metadata.requires("cosyclone") or []
    except metadata.PackageNotFoundError:
        return set()
    names = set()
    for req in reqs:
        marker = req.split(";", 1)[1] if ";" in req else ""
        if "extra" in marker:  # e.g. 'pytest>=8; extra == "dev"'
            continue
        names.add(re.split(r"[\s<>=!~;\[(]", req.strip(), maxsplit=1)[0].lower().replace("_", "-"))
    return names


def _import_status(name: str) -> tuple[bool, str]:
    """(importable, "version x" or the import error) without letting an error escape."""
    import importlib

    try:
        mod = importlib.import_module(name)
    except Exception as exc:  # ImportError, or a broken install raising anything at import time
        return False, f"{type(exc).__name__}: {exc}"
    return True, f"version {getattr(mod, '__version__', 'unknown')}"


@app.command()
def inspect(model_dir: Path = typer.Argument(...), device: str = typer.Option("auto"),
            dtype: str = typer.Option("auto")) -> None:
    """Geometry, parameter counts, key check against the expected layout, device, providers and
    the text normalizers. Exits 2 when a checkpoint does not match, a stage module or a required
    package does not import."""
    from .checkpoint import check_keys, check_tied, read_state_file
    from .config import load_model_config
    from .device import resolve

    try:
        cfg = load_model_config(model_dir)
        policy = resolve(device, dtype)
    except CosycloneError as exc:
        _fail(str(exc))
    q = cfg.talker.qwen
    typer.echo(f"model dir: {model_dir} (yaml sha256 {cfg.yaml_sha256[:16]})")
    typer.echo(f"talker: hidden {q.hidden_size}, layers {q.num_hidden_layers}, heads {q.num_attention_heads}/"
               f"{q.num_key_value_heads}, speech tokens {cfg.talker.speech_token_size}")
    typer.echo(f"flow DiT: dim {cfg.flow.dit.dim}, depth {cfg.flow.dit.depth}; hift base {cfg.hift.base_channels}")
    typer.echo(f"device: {policy.device} ({policy.backend}, {policy.dtype})")
    bad = False
    try:
        import onnxruntime as ort

        typer.echo(f"onnxruntime providers: {', '.join(ort.get_available_providers())}")
    except ImportError as exc:
        typer.echo(f"onnxruntime: NOT importable ({exc})")
        bad = True
    required = _declared_requirements()
    for name in TEXT_NORMALIZERS:
        ok, detail = _import_status(name)
        need = "required" if name in required else "optional"
        typer.echo(f"text normalizer {name} ({need}): {'ok, ' + detail if ok else 'NOT importable: ' + detail}")
        bad = bad or (not ok and need == "required")
    try:
        import torch

        from .code2wav.flow import CausalMaskedDiffWithDiT
        from .code2wav.hift import CausalHiFTGenerator
        from .talker.model import TIED_LM_HEAD, TIED_TO, CosyVoice3LM
    except Exception as exc:  # a stage that does not import is a broken install, not a pass
        typer.echo(f"stage modules: NOT importable ({type(exc).__name__}: {exc})")
        raise typer.Exit(EXIT_USAGE) from None
    # Each file is checked the way its stage loads it: the same key adapter and tied keys,
    # against modules built on the meta device (shapes only, no memory, no random init).
    checks = (
        ("llm.pt", lambda: CosyVoice3LM(cfg.talker), None, {TIED_LM_HEAD: TIED_TO}),
        ("flow.pt", lambda: CausalMaskedDiffWithDiT(cfg.flow), None, {}),
        ("hift.pt", lambda: CausalHiFTGenerator(cfg.hift), CausalHiFTGenerator.adapt_keys, {}),
    )
    for name, factory, adapter, tied in checks:
        with torch.device("meta"):
            module = factory()
        n = sum(p.numel() for p in module.parameters())
        try:
            state = read_state_file(model_dir / name)
            state = adapter(state) if adapter else state
            check_tied(state, tied, name)
            rep = check_keys(module, state, name, tuple(tied))
            status = "keys ok" if rep.ok else rep.render(limit=5)
            absent = [k for k in tied if k not in state]
            if rep.ok and absent:
                status += f" (no {', '.join(absent)}: the official strict load needs it)"
            bad = bad or not rep.ok
        except CosycloneError as exc:
            status, bad = str(exc), True
        typer.echo(f"{name}: {n / 1e6:.2f} M parameters; {status}")
    raise typer.Exit(EXIT_USAGE if bad else EXIT_OK)


if __name__ == "__main__":  # pragma: no cover
    app()
