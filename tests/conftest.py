"""Session-wide test setup: where the reference material is, said once (header and summary).

Fixtures: ``reference_set`` (a function: ``reference_set("text")`` → that set's folder, failing or
skipping as ``tests/reference.py`` describes) and ``reference_vectors`` (the vectors root, only
when every listed set is complete).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests import reference


def pytest_report_header(config: pytest.Config) -> list[str]:
    return reference.header_lines()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Say once, at the end (``-q`` hides the header), what reference material was missing."""
    lines = [line for line in reference.header_lines() if "INCOMPLETE" in line]
    if lines and (terminalreporter.stats.get("skipped") or terminalreporter.stats.get("failed")
                  or terminalreporter.stats.get("error")):
        terminalreporter.write_sep("-", "reference material")
        for line in lines:
            terminalreporter.write_line(line)


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
