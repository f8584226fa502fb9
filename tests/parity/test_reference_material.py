"""The reference resolver: one location rule, failures that name what is missing, skips said once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import reference


def _fake_set(root: Path, *, drop: tuple[str, ...] = ()) -> Path:
    """A two-set vector folder laid out like the shared one (index.json + per-set json)."""
    files = ["flow/vectors.json", "flow/vectors.safetensors", "flow/weights.safetensors",
             "token2wav/vectors.json", "token2wav/vectors.safetensors", "index.json"]
    meta = {"flow/vectors.json": {"weights_file": "flow/weights.safetensors (float32)"},
            "token2wav/vectors.json": {"weights": ["flow/weights.safetensors", "hift/weights.safetensors"],
                                       "inputs": "flow/vectors.safetensors: inputs.token, inputs.embedding"}}
    for f in files:
        if f in drop:
            continue
        path = root / f
        path.parent.mkdir(parents=True, exist_ok=True)
        if f == "index.json":
            path.write_text(json.dumps({"files": files}))
        elif f in meta:
            path.write_text(json.dumps(meta[f]))
        else:
            path.write_bytes(b"")
    return root


@pytest.fixture()
def env(monkeypatch: pytest.MonkeyPatch):
    for name in (reference.ENV_VECTORS, reference.ENV_STATE_DICTS, reference.ENV_REQUIRE):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_default_is_shared_beside_the_checkout(env) -> None:
    assert reference.vectors_dir() == (reference.REPO.parent / "shared" / "reference" / "vectors").resolve()
    assert not reference.required()


def test_complete_set_resolves_and_json_references_count(env, tmp_path: Path) -> None:
    env.setenv(reference.ENV_VECTORS, str(_fake_set(tmp_path)))
    assert reference.reference_set("flow") == tmp_path.resolve() / "flow"
    # token2wav names hift/weights.safetensors, which this folder does not have
    assert reference.missing_in_set("token2wav") == ("hift/weights.safetensors",)


def test_required_and_incomplete_fails_naming_the_file(env, tmp_path: Path) -> None:
    env.setenv(reference.ENV_VECTORS, str(_fake_set(tmp_path, drop=("flow/weights.safetensors",))))
    env.setenv(reference.ENV_REQUIRE, "1")
    with pytest.raises(pytest.fail.Exception, match=r"'flow'.*missing flow/weights\.safetensors"):
        reference.reference_set("flow")
    env.setenv(reference.ENV_VECTORS, str(tmp_path / "nowhere"))
    with pytest.raises(pytest.fail.Exception, match="no such folder"):
        reference.load_vector_set("flow")


def test_not_required_skips_with_one_shared_reason(env, tmp_path: Path) -> None:
    env.setenv(reference.ENV_VECTORS, str(tmp_path / "nowhere"))
    reasons = set()
    for name in ("flow", "llm", "text"):
        with pytest.raises(pytest.skip.Exception) as info:
            reference.reference_set(name)
        reasons.add(str(info.value))
    assert len(reasons) == 1 and reference.ENV_REQUIRE in reasons.pop()
    assert "INCOMPLETE" in reference.header_lines()[0]


def test_state_dicts_beside_the_vectors_or_by_env(env, tmp_path: Path) -> None:
    env.setenv(reference.ENV_VECTORS, str(tmp_path / "vectors"))
    (tmp_path / "state_dicts").mkdir()
    assert reference.state_dicts_dir() == tmp_path.resolve() / "state_dicts"
    env.setenv(reference.ENV_REQUIRE, "1")
    with pytest.raises(pytest.fail.Exception, match="llm.json"):
        reference.state_dict_manifest("llm")
    env.setenv(reference.ENV_STATE_DICTS, str(tmp_path / "elsewhere"))
    assert reference.state_dicts_dir() == tmp_path.resolve() / "elsewhere"


def test_the_reference_material_is_complete() -> None:
    """With COSYCLONE_REQUIRE_REFERENCE=1 (CI) this fails and names every missing file."""
    for name in reference.listed_sets():
        reference.reference_set(name)
    reference.state_dict_summary()
    reference.reference_tokenizer("qwen2")
