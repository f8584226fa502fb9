"""Shared fixtures of the CLI tests: one tiny model directory per test session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from typer.testing import CliRunner

    from cosyclone.cli import app

    d = tmp_path_factory.mktemp("tiny")
    res = CliRunner().invoke(app, ["make-tiny-model", str(d), "--force"])
    assert res.exit_code == 0, res.output
    return d
