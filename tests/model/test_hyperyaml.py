"""The HyperPyYAML reader: ``!ref`` arithmetic is on bounded numbers only, resolved once per key."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosyclone.errors import ModelDirError
from cosyclone.model import hyperyaml
from cosyclone.model.hyperyaml import load_hyperyaml


def _load(tmp_path: Path, text: str) -> dict:
    (tmp_path / "x.yaml").write_text(text)
    return load_hyperyaml(tmp_path / "x.yaml")


def test_numeric_refs_as_the_released_yaml_uses_them(tmp_path: Path) -> None:
    doc = _load(tmp_path, "chunk_size: 25\ntoken_mel_ratio: 2\nrate: 1e-06\nname: 'abc'\n"
                          "static: !ref <chunk_size> * <token_mel_ratio>\nhalf: !ref <rate> / 2\n"
                          "same: !ref <name>\nneg: !ref -<chunk_size> // 2\n")
    assert doc["static"] == 50 and doc["half"] == 5e-07 and doc["same"] == "abc" and doc["neg"] == -13


@pytest.mark.parametrize("text", [
    "s: 'ab'\nbig: !ref <s> * 1000000000\n",  # string repetition: a gigabyte from a short file
    "n: 1000000000\nbig: !ref <n> * 'ab'\n",
    "s: [1, 2]\nbig: !ref <s> * 100000000\n",  # list repetition
    "t: true\nx: !ref <t> * 3\n",  # bool is not a number here
])
def test_arithmetic_on_anything_but_numbers_is_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(ModelDirError, match="only numbers"):
        _load(tmp_path, text)


def test_results_are_bounded(tmp_path: Path) -> None:
    lines = ["x0: 1000000000"] + [f"x{k}: !ref <x{k - 1}> * <x{k - 1}>" for k in range(1, 8)]
    with pytest.raises(ModelDirError, match="out of range"):
        _load(tmp_path, "\n".join(lines) + "\n")  # would be a 10**9 * 2**7-digit integer
    with pytest.raises(ModelDirError, match="out of range"):
        _load(tmp_path, "a: 1e308\nb: !ref <a> * 10\n")  # inf


def test_each_key_is_resolved_once_and_cycles_are_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = hyperyaml._lookup
    monkeypatch.setattr(hyperyaml, "_lookup", lambda doc, key: calls.append(key) or real(doc, key))  # type: ignore[func-returns-value]
    n = 40  # each key refers twice to the previous one: 2**40 lookups without memoization
    lines = ["x0: 1"] + [f"x{k}: !ref <x{k - 1}> + <x{k - 1}>" for k in range(1, n + 1)]
    doc = _load(tmp_path, "\n".join(lines) + "\n")
    assert doc[f"x{n}"] == 2**n and len(calls) == n
    with pytest.raises(ModelDirError, match="cycle"):
        _load(tmp_path, "a: !ref <b>\nb: !ref <a> + 1\n")
