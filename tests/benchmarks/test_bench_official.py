"""The bench's official-vocoder door: unset means the constant, a wrong path is an error, not a skip."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.official_hift import ENV, official_repo


def test_unset_means_no_official_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert official_repo() is None


def test_a_path_without_the_official_vocoder_is_refused_by_name(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.setenv(ENV, str(tmp_path))
    with pytest.raises(SystemExit, match="cosyvoice/hifigan/generator.py"):
        official_repo()


def test_a_checkout_layout_is_accepted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "cosyvoice" / "hifigan").mkdir(parents=True)
    (tmp_path / "cosyvoice" / "hifigan" / "generator.py").write_text("")
    monkeypatch.setenv(ENV, str(tmp_path))
    assert official_repo() == tmp_path
