"""bench_engine's ops-per-step comparison runs each tree through that tree's own API.

The "before" tree predates the package layout and StepMechanics; a snippet written against this
tree's names alone fails there, and the benchmark must then fail rather than print no figure.
"""

from __future__ import annotations

import subprocess

import pytest

from benchmarks.bench_engine import BEFORE_REV, ROOT, ops_per_step


def _has_revision(rev: str) -> bool:
    probe = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{rev}^{{commit}}"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _has_revision(BEFORE_REV), reason="a shallow clone without the compared revision")
def test_ops_per_step_gives_a_number_for_the_tree_before_and_this_one() -> None:
    res = ops_per_step(BEFORE_REV, 2)
    for key in ("ops_per_step_before", "ops_per_step_after", "us_per_step_before", "us_per_step_after"):
        assert isinstance(res[key], float) and res[key] > 0, (key, res[key])


def test_a_tree_that_cannot_run_the_snippet_fails_the_benchmark() -> None:
    empty_tree = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # git's empty tree: no cosyclone to import
    with pytest.raises((RuntimeError, subprocess.CalledProcessError)):
        ops_per_step(empty_tree, 2)
