"""The README is a first screen that links every docs/ page, and names every option, field and exit code.

The README is at most 200 lines; everything else lives in docs/, each page reachable from the
README's documentation table. Its blocks (and every page's) run in tests/docs/test_doc_blocks.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import typer.main

from cosyclone.cli import app
from cosyclone.manifest.rows import KNOWN

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))}
CLI_DOC = DOCS["cli.md"]  # the options reference
MANIFEST_DOC = DOCS["manifest.md"]  # the manifest reference
MAX_README_LINES = 200
LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_a_first_screen_and_links_every_docs_page() -> None:
    assert len(README.splitlines()) <= MAX_README_LINES, len(README.splitlines())
    table = README.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    linked = {m.group("target") for m in LINK.finditer(table)}
    missing = sorted(f"docs/{name}" for name in DOCS if f"docs/{name}" not in linked)
    assert not missing, f"docs pages the README's documentation table does not link: {missing}"


def test_every_relative_link_resolves() -> None:
    broken = []
    for where, text, base in [("README.md", README, ROOT)] + [
        (f"docs/{n}", t, ROOT / "docs") for n, t in DOCS.items()
    ]:
        for m in LINK.finditer(text):
            target = m.group("target")
            if "://" in target:
                continue
            if not (base / target).resolve().exists():
                broken.append(f"{where}: {target}")
    assert not broken, broken


def _options(name: str) -> set[str]:
    sub = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {opt for p in sub.params if p.param_type_name == "option" for opt in p.opts
            if opt.startswith("--") and opt != "--help"}


@pytest.mark.parametrize("command", ["synth", "say", "validate", "inspect", "export", "trace",
                                     "make-tiny-model"])
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
