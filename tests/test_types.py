"""The type check catches a test double that outlives the product method it overrides.

tests/ and benchmarks/ run under mypy with ``explicit-override`` (pyproject.toml): a double marks each
override with ``@override``, so renaming the product's method leaves the double's ``@override``
pointing at nothing, and that is an error, not a silent new method the product never calls.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PRODUCT = """
class Session:
    def _choice(self) -> int:  # renamed from _graphs
        return 1
"""
DOUBLE = """
from typing_extensions import override

from product import Session


class HostSession(Session):
    @override
    def _graphs(self) -> int:  # still the old name
        return 2
"""


def test_tests_and_benchmarks_are_checked_with_explicit_overrides() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["strict"] is True and set(config["files"]) == {"cosyclone", "tests", "benchmarks"}
    doubles = next(o for o in config["overrides"] if "tests.*" in o["module"])
    assert "explicit-override" in doubles["enable_error_code"] and doubles["check_untyped_defs"] is True


def test_a_double_of_a_renamed_method_fails_the_check(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    (tmp_path / "product.py").write_text(textwrap.dedent(PRODUCT))
    (tmp_path / "double.py").write_text(textwrap.dedent(DOUBLE))
    out, _, status = api.run([str(tmp_path / "double.py"), "--enable-error-code", "explicit-override",
                              "--python-version", f"{sys.version_info.major}.{sys.version_info.minor}",
                              "--no-incremental", "--cache-dir", str(tmp_path / "cache")])
    assert status == 1 and '"_graphs" is marked as an override, but no base method was found' in out, out
