"""Every shell and Python block of README.md and docs/*.md runs, on the tiny model, or says why not.

The rules of the markers are in tests/doc_pages.py. The pages run in one scratch folder holding a
copy of ``manifests/``, the README first and then docs/ by name, so a later page sees what an
earlier one wrote (the README makes ``.tiny-model``; a page run alone gets a copy of the session's
tiny model). ``cosyclone`` on PATH runs this checkout's code and ``COSYCLONE_MODEL_DIR`` names the
session's tiny model, so a block that leaves ``--model-dir`` out runs as a user's would. A failure names the
page, the block's line, the command and what it printed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cosyclone.folder.layout import wav_path
from tests import doc_pages

PAGES = doc_pages.pages()
RUN_PAGES = [p for p, text in PAGES.items() if any(b.runnable for b in doc_pages.blocks(p, text))]
MODEL = ".tiny-model"
BLOCK_TIMEOUT_S = 600


@pytest.fixture(scope="session")
def doc_workspace(tmp_path_factory: pytest.TempPathFactory,
                  tiny_model_dir: Path) -> tuple[Path, dict[str, str]]:
    """(the scratch folder every page runs in, the environment of its blocks)."""
    root = tmp_path_factory.mktemp("docs")
    work = root / "work"
    work.mkdir()
    shutil.copytree(doc_pages.ROOT / "manifests", work / "manifests")
    bindir = root / "bin"
    bindir.mkdir()
    shim = bindir / "cosyclone"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m cosyclone.cli "$@"\n')
    shim.chmod(0o755)
    path = os.pathsep.join([str(bindir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    pythonpath = os.pathsep.join([str(doc_pages.ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "PATH": path, "PYTHONPATH": pythonpath, "COSYCLONE_MODEL_DIR": str(tiny_model_dir)}
    return work, env


#: Runs a page's consecutive Python blocks in one interpreter (names defined in one block are the next
#: one's, as a reader typing them into one session has them), saying which block failed.
PY_SESSION = """
import json, sys, traceback
namespace = {"__name__": "__main__"}
for where, body in json.loads(sys.argv[1]):
    try:
        exec(compile(body, where, "exec"), namespace)
    except BaseException:
        print(f"the python block at {where} raised:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def runs(blocks: list[doc_pages.Block]) -> list[list[doc_pages.Block]]:
    """The runnable blocks in page order, consecutive Python blocks grouped (one interpreter each)."""
    out: list[list[doc_pages.Block]] = []
    for b in blocks:
        if not b.runnable:
            continue
        if b.lang == "python" and out and out[-1][-1].lang == "python":
            out[-1].append(b)
        else:
            out.append([b])
    return out


def run_blocks(group: list[doc_pages.Block], work: Path, env: dict[str, str]) -> None:
    import json

    first = group[0]
    if first.lang == "python":
        cmd = [sys.executable, "-c", PY_SESSION, json.dumps([(b.where, b.body()) for b in group])]
        shown = "\n".join(f"# {b.where}\n{b.body()}" for b in group)
    else:
        shown = first.body()
        cmd = ["bash", "-c", "set -euo pipefail\n" + shown]
    res = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    assert res.returncode == 0, (
        f"{first.where}: the {first.lang} block exited {res.returncode}\n--- block (as run) ---\n{shown}"
        f"--- stdout ---\n{res.stdout[-4000:]}\n--- stderr ---\n{res.stderr[-4000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_page_s_blocks_run(page: str, doc_workspace: tuple[Path, dict[str, str]],
                               tiny_model_dir: Path) -> None:
    work, env = doc_workspace
    if page != "README.md" and not (work / MODEL).exists():  # run alone: the README did not make it
        shutil.copytree(tiny_model_dir, work / MODEL)
    for group in runs(doc_pages.blocks(page, PAGES[page])):
        run_blocks(group, work, env)
    if page == "README.md":
        import soundfile as sf

        for wav in (work / "hello.wav", wav_path(work / "demo", "hello")):
            assert sf.info(str(wav)).samplerate == 24000, wav  # what the blocks say they write


def test_every_marker_is_well_formed_and_every_skip_says_why() -> None:
    """Parsing raises on a marker it cannot read; a skip's reason is what the report shows."""
    blocks = doc_pages.all_blocks()
    assert any(b.runnable for b in blocks)
    for b in blocks:
        if b.skip is not None:
            assert len(b.skip) >= 8, f"{b.where}: say why the block cannot run on the tiny model"
        for old, _ in b.replace:
            b.body()  # each OLD occurs in its block
            assert old, b.where


def test_the_marker_grammar(tmp_path: Path) -> None:
    page = ("<!-- doc-test skip: needs a GPU -->\n```bash\nnvidia-smi\n```\n\n"
            "<!-- doc-test replace \"/models/X Y=.tiny-model\" me.wav=p.wav -->\n"
            "```python\nf('/models/X Y', 'me.wav')\n```\n"
            "<!-- readme-test -->\n```sh\necho hi\n```\n```json\n{}\n```\n")
    skip, repl, legacy, shown = doc_pages.blocks("docs/x.md", page)
    assert skip.skip == "needs a GPU" and not skip.runnable and skip.line == 2
    assert repl.body() == "f('.tiny-model', 'p.wav')\n" and repl.runnable
    assert legacy.runnable and legacy.lang == "sh"
    assert not shown.runnable
    with pytest.raises(AssertionError, match=r"docs/x\.md:1: a skip marker says why"):
        doc_pages.blocks("docs/x.md", "<!-- doc-test skip -->\n```bash\nx\n```\n")
    with pytest.raises(AssertionError, match=r"docs/x\.md:1: unknown marker"):
        doc_pages.blocks("docs/x.md", "<!-- doctest: skip -->\n```bash\nx\n```\n")
    bad = doc_pages.blocks("docs/x.md", "<!-- doc-test replace nothere=x -->\n```bash\nx\n```\n")[0]
    with pytest.raises(AssertionError, match=r"docs/x\.md:2: the marker replaces 'nothere'"):
        bad.body()
