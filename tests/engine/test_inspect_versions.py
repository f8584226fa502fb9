"""`cosyclone inspect` prints the text normalizers' installed versions (wetext has no __version__)."""

from __future__ import annotations

from importlib import metadata

from cosyclone.engine.inspect import environment_checks, import_status


def test_the_version_is_the_installed_distribution_s() -> None:
    assert import_status("wetext") == (True, f"version {metadata.version('wetext')}")
    assert import_status("inflect") == (True, f"version {metadata.version('inflect')}")
    ok, detail = import_status("cosyclone_no_such_module")
    assert not ok and detail.startswith("ModuleNotFoundError")


def test_inspect_names_no_unknown_version() -> None:
    lines = [line for line, _ in environment_checks() if line.startswith("text normalizer")]
    assert len(lines) == 2 and not any("unknown" in line for line in lines), lines
