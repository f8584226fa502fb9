"""The README and docs/ cannot drift: their marked blocks run, and they name every option, field and exit code.

The README is the first screen (at most 200 lines); everything else lives in docs/, each page
reachable from the README's documentation table. A fenced block right after a line
``<!-- readme-test -->`` is run as written (bash: with ``set -euo pipefail``; python: by this
interpreter) in one scratch folder holding a copy of ``manifests/``: the README's blocks first, then
each docs/ page's in name order, so a later block sees what an earlier one wrote (the tiny model the
README makes). The marker may say ``replace OLD=NEW ...``: those literal substitutions are made
first (the API example names the released model's path; here it runs on the tiny model an earlier
block wrote). ``cosyclone`` on PATH runs this checkout's code.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from cosyclone.cli import app
from cosyclone.manifest.rows import KNOWN
from cosyclone.run.folder import wav_path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))}
CLI_DOC = DOCS["cli.md"]  # the options reference
MANIFEST_DOC = DOCS["manifest.md"]  # the manifest reference
MAX_README_LINES = 200
MARK = re.compile(r"^<!-- readme-test(?P<args>[^>]*)-->\n```(?P<lang>\w+)\n(?P<body>.*?)^```$", re.M | re.S)
LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?:#[^)]*)?\)")


def marked_blocks() -> list[tuple[str, str]]:
    """(language, body after the marker's replacements) of every marked block: README, then docs/ by name."""
    out = []
    for text in [README, *DOCS.values()]:
        out.extend(_marked(text))
    return out


def _marked(text: str) -> list[tuple[str, str]]:
    out = []
    for m in MARK.finditer(text):
        body = m.group("body")
        args = m.group("args").split()
        if args:
            assert args[0] == "replace", f"unknown readme-test marker arguments: {args}"
            for pair in args[1:]:
                old, new = pair.split("=", 1)
                assert old in body, f"marker replaces {old!r}, which the block does not contain"
                body = body.replace(old, new)
        out.append((m.group("lang"), body))
    return out


def test_the_readme_has_marked_blocks_of_both_kinds() -> None:
    langs = [lang for lang, _ in _marked(README)]
    assert "bash" in langs and "python" in langs, langs


def test_the_readme_is_a_first_screen_and_links_every_docs_page() -> None:
    assert len(README.splitlines()) <= MAX_README_LINES, len(README.splitlines())
    table = README.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    linked = {m.group("target") for m in LINK.finditer(table)}
    missing = sorted(f"docs/{name}" for name in DOCS if f"docs/{name}" not in linked)
    assert not missing, f"docs pages the README's documentation table does not link: {missing}"


def test_every_relative_link_resolves() -> None:
    broken = []
    for where, text, base in [("README.md", README, ROOT)] + [(f"docs/{n}", t, ROOT / "docs") for n, t in DOCS.items()]:
        for m in LINK.finditer(text):
            target = m.group("target")
            if "://" in target:
                continue
            if not (base / target).resolve().exists():
                broken.append(f"{where}: {target}")
    assert not broken, broken


@pytest.mark.slow
def test_marked_readme_blocks_run(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(ROOT / "manifests", work / "manifests")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "cosyclone"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m cosyclone.cli "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env.pop("COSYCLONE_MODEL_DIR", None)
    for i, (lang, body) in enumerate(marked_blocks()):
        if lang == "bash":
            cmd = ["bash", "-c", "set -euo pipefail\n" + body]
        elif lang == "python":
            cmd = [sys.executable, "-c", body]
        else:
            pytest.fail(f"marked README block {i} is {lang!r}; only bash and python blocks can be run")
        res = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, (
            f"README block {i} ({lang}) exited {res.returncode}:\n{body}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}")
    import soundfile as sf

    for wav in (work / "hello.wav", wav_path(work / "demo", "hello")):
        assert sf.info(str(wav)).samplerate == 24000, wav  # what the blocks say they write


def _options(name: str) -> set[str]:
    sub = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {opt for p in sub.params if p.param_type_name == "option" for opt in p.opts
            if opt.startswith("--") and opt != "--help"}


@pytest.mark.parametrize("command", ["synth", "say", "validate", "inspect", "export", "make-tiny-model"])
def test_every_option_is_documented(command: str) -> None:
    missing = sorted(o for o in _options(command) if not re.search(re.escape(o) + r"(?![\w-])", CLI_DOC))
    assert not missing, f"docs/cli.md does not document these `{command}` options: {missing}"


def test_every_manifest_field_and_exit_code_is_documented() -> None:
    table = MANIFEST_DOC.split("## Fields", 1)[1].split("\n## ", 1)[0]
    assert all(f"| `{name}` |" in table for name in KNOWN), sorted(KNOWN)
    codes = README.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    for code in ("0", "2", "3", "4", "5"):
        assert f"\n| {code} |" in codes
    assert "0-based" in README and "COSYCLONE_MODEL_DIR" in README and "--version" in README


def test_shard_examples_use_the_shard_syntax_the_code_takes() -> None:
    """Every ``--shard i/N`` shown parses (shards are 0-based: ``2/2`` is refused)."""
    from cosyclone.base.shard import Shard

    shown = re.findall(r"--shard (\d+/\d+)", README + "".join(DOCS.values()))
    assert shown
    for text in shown:
        Shard.parse(text)


def test_makefile_uses_torch_index_and_the_demo_says_it_makes_noise(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    dry = subprocess.run(["make", "-n", "install", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert '--no-deps --index-url "https://download.pytorch.org/whl/cpu" "torch==2.13.0"' in dry.stdout
    plain = subprocess.run(["make", "-n", "install", f"VENV={venv}", "TORCH_INDEX="], cwd=ROOT,
                           capture_output=True, text=True)
    assert "--index-url" not in plain.stdout and '"torch==2.13.0"' in plain.stdout
    demo = subprocess.run(["make", "-n", "demo", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True)
    assert "noise, not speech" in demo.stdout and f"{venv}/bin/activate" in demo.stdout
