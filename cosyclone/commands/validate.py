"""``cosyclone validate``: every row of a manifest checked, no model weights read (exit 3 names each bad
line)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from cosyclone.commands.common import fail
from cosyclone.errors import CosycloneError, Exit
from cosyclone.options import TextFrontendName

if TYPE_CHECKING:
    from cosyclone.errors import ManifestError


def validate_command(
    manifest: Path = typer.Argument(..., help="JSONL manifest", show_default=False),
    **options: Any,
) -> None:
    """Validate a manifest (no model weights are read); exit 3 when any row is rejected.

    With --model-dir, --show-text or --json each row's text is also planned as the LLM will read
    it (normalized, split, tokenized) and checked against the model's position limit.
    """
    from cosyclone.errors import ManifestError
    from cosyclone.manifest import ManifestRow, read_manifest
    from cosyclone.manifest.options import ValidateOptions
    from cosyclone.manifest.text_check import TextCheck

    try:
        opts = ValidateOptions(**{k: v for k, v in options.items() if k != "text_frontend"})
        text_frontend: TextFrontendName = options["text_frontend"]
        model_dir, show_text, json_out = opts.model_dir, opts.show_text, opts.json_out
        # each row's text planned: normalize them all ahead
        planned = bool(show_text or json_out or model_dir)
        m = read_manifest(manifest, text_frontend=text_frontend, normalize_all=planned)
        check = TextCheck(model_dir, text_frontend) if planned else None
    except CosycloneError as exc:
        fail(str(exc))
    report = sys.stderr if json_out else sys.stdout
    if check is not None and check.stand_in:
        typer.echo(
            "note: no --model-dir: token counts come from the built-in stand-in tokenizer (bytes, not the "
            "model's vocabulary), so English segments can differ; give --model-dir for real counts",
            err=True,
        )
    entries: list[tuple[int, ManifestError | ManifestRow]] = [(e.line or 0, e) for e in m.errors]
    entries += [(r.line, r) for r in m.rows]
    rejected = len(m.errors)
    for _, item in sorted(entries, key=lambda e: e[0]):
        if not isinstance(item, ManifestRow):
            _emit_row_error(manifest, item, json_out)
            continue
        if check is None:
            continue
        try:
            plan = check.plan(item)
        except ManifestError as exc:
            rejected += 1
            _emit_row_error(manifest, exc, json_out)
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
    raise typer.Exit(Exit.ROWS_FAILED if rejected else Exit.OK)


def _emit_row_error(manifest: Path, err: ManifestError, json_out: bool) -> None:
    if json_out:
        typer.echo(json.dumps({"id": err.row_id, "error": str(err)}, ensure_ascii=False))
    else:
        typer.echo(f"{manifest}: {err}")
