"""Session-wide test setup: where the reference material is, said once (header and summary).

Fixtures: ``tiny_model_dir`` (one ``cosyclone make-tiny-model`` directory per session; tests must
not modify it), ``reference_set`` (a function: ``reference_set("text")`` → that set's folder, failing or
skipping as ``tests/reference.py`` describes) and ``reference_vectors`` (the vectors root, only
when every listed set is complete).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import reference

# OpenMP threads that wait for work sleep instead of spinning. The suite runs on small shared CI
# machines (2 cores, other jobs beside it); there torch's spinning intra-op threads fight each
# other and the neighbours: the tiny-model CLI runs took 4-6x longer (batch-invariance test: 9.4 s
# and 4.0 s per run spinning, 2.7 s and 2.1 s passive, AMD EPYC 2 cores at load 5). Numerics do
# not change. libgomp reads this when torch loads it, which is after this file is imported.
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``gpu`` tests need an accelerator: without one they are skipped (``make test`` deselects them)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA/ROCm device: run `make test-gpu` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return reference.header_lines()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Say once, at the end (``-q`` hides the header), what reference material was missing."""
    reports = [r for kind in ("skipped", "failed", "error") for r in terminalreporter.stats.get(kind, [])]
    if not any(reference.ENV_REQUIRE in str(getattr(r, "longrepr", "")) for r in reports):
        return  # no test was skipped or failed for want of reference material
    lines = [line for line in reference.header_lines() if "INCOMPLETE" in line]
    if lines:
        terminalreporter.write_sep("-", "reference material")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny model directory in the released layout per session, written by the real command."""
    from typer.testing import CliRunner

    from cosyclone.cli import app

    d = tmp_path_factory.mktemp("tiny")
    res = CliRunner().invoke(app, ["make-tiny-model", str(d), "--force"])
    assert res.exit_code == 0, res.output
    return d


@pytest.fixture(scope="session")
def reference_set() -> Callable[[str], Path]:
    """``reference_set(name)`` → the complete vector set's folder (fails/skips otherwise)."""
    return reference.reference_set


@pytest.fixture(scope="session")
def reference_vectors() -> Path:
    """The vectors root, when every set it lists is complete."""
    for name in reference.listed_sets():
        reference.reference_set(name)
    return reference.vectors_dir()


@pytest.fixture(autouse=True)
def _fresh_process_graphs():
    """Each test starts with the CUDA-graph state of a fresh process: graphs allowed, no pooled
    step. A failed capture turns graphs off for the whole process by design
    (``cosyclone/talker/graph_pool.py``), which must not leak from one test into the next."""
    yield
    if "cosyclone.talker.graph_pool" in sys.modules:
        sys.modules["cosyclone.talker.graph_pool"].PROCESS.reset()


@pytest.fixture()
def normalized(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts the real normalization (``TextNormalizer._normalize``) runs on in this process, each
    call recorded, then done: what a run or a dry run paid wetext for."""
    seen: list[str] = []
    from cosyclone.frontend.normalize import TextNormalizer

    real = TextNormalizer._normalize

    def recording(self: Any, text: str) -> Any:
        seen.append(text)
        return real(self, text)

    monkeypatch.setattr(TextNormalizer, "_normalize", recording)
    return seen
