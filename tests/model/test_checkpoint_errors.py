"""Checkpoint and model-directory errors say what happened, and only what applies."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner
from typing_extensions import override

from cosyclone.cli import app
from cosyclone.errors import ModelDirError
from cosyclone.model.checkpoint import read_state_file
from cosyclone.model.config import QWEN_DIR, QwenGeometry, TalkerConfig
from cosyclone.talker.model import CosyVoice3LM, load_talker_weights

SMALL = TalkerConfig(qwen=QwenGeometry(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=48, vocab_size=72),
                     llm_input_size=32, llm_output_size=32, speech_token_size=40)
GEOMETRY_HINT = "does not match that geometry"


def _message(exc: pytest.ExceptionInfo, path: Path) -> str:
    """The error text after the file name (the temp path contains the test's own name)."""
    text = str(exc.value)
    assert text.startswith(str(path))
    return text[len(str(path)):]


class _Code:
    @override
    def __reduce__(self):
        return (print, ("this must never run",))


@pytest.mark.parametrize(("payload", "named"), [({"w": _Code()}, "print"),
                                                ({"w": torch.zeros(1), "args": argparse.Namespace(lr=1)},
                                                 "argparse.Namespace")])
def test_refused_object_says_why_and_never_suggests_unsafe_loading(tmp_path: Path, payload, named: str,
                                                                   capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "x.pt"
    torch.save(payload, path)
    with pytest.raises(ModelDirError) as err:
        read_state_file(path)
    msg = _message(err, path)
    assert f"holds an object of type {named}, not only tensors" in msg
    assert "weights_only" not in msg and "trust" not in msg and err.value.__cause__ is None
    assert "this must never run" not in capsys.readouterr().out


def test_the_eval_speaker_weights_are_refused_the_same_way(tmp_path: Path) -> None:
    """Every ``.pt`` cosyclone reads goes through the same weights-only reader (here the eval's
    speaker encoder weights): the refusal names the type and gives no unsafe advice."""
    from cosyclone.errors import CosycloneError
    from cosyclone.eval.speaker import ResemblyzerEncoder

    path = tmp_path / "pretrained.pt"
    torch.save({"model_state": {}, "args": argparse.Namespace(lr=1)}, path)
    with pytest.raises(CosycloneError) as err:
        ResemblyzerEncoder(weights=path)
    assert "holds an object of type argparse.Namespace, not only tensors" in str(err.value)
    assert "weights_only" not in str(err.value) and err.value.__cause__ is None


def test_non_tensor_entries_are_named(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    torch.save({"w": torch.zeros(2), "epoch": 3, "note": "hi"}, path)
    with pytest.raises(ModelDirError, match=r"not tensors: 'epoch' \(int\), 'note' \(str\)"):
        read_state_file(path)
    path.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ModelDirError, match="cannot read as a torch checkpoint"):
        read_state_file(path)


def _talker_file(tmp_path: Path, edit) -> Path:
    state = dict(CosyVoice3LM(SMALL).state_dict())
    edit(state)
    path = tmp_path / "llm.pt"
    torch.save(state, path)
    return path


def test_geometry_hint_only_for_geometry_errors(tmp_path: Path) -> None:
    model = CosyVoice3LM(SMALL)
    conf = tmp_path / "config.json"
    cases = {
        "refused file": (lambda s: s.update(extra=argparse.Namespace()), False),
        "missing final norm": (lambda s: s.pop("llm.model.model.norm.weight"), False),
        "extra unrelated key": (lambda s: s.update({"something.else": torch.zeros(1)}), False),
        "other kv heads": (
            lambda s: s.update({"llm.model.model.layers.0.self_attn.k_proj.weight": torch.zeros(4, 32)}),
            True,
        ),
        "one layer more": (
            lambda s: s.update({"llm.model.model.layers.2.input_layernorm.weight": torch.zeros(32)}),
            True,
        ),
    }
    for name, (edit, hint) in cases.items():
        path = _talker_file(tmp_path, edit)
        with pytest.raises(ModelDirError) as err:
            load_talker_weights(model, path, qwen_config=conf)
        assert (GEOMETRY_HINT in str(err.value)) == hint, (name, str(err.value))


def test_inspect_reports_text_normalizers(tiny_model_dir: Path) -> None:
    res = CliRunner().invoke(app, ["inspect", str(tiny_model_dir), "--device", "cpu"])
    lines = res.output.splitlines()
    for name in ("wetext", "inflect"):
        (line,) = [x for x in lines if x.startswith(f"text normalizer {name} ")]
        assert ": ok, version" in line or ": NOT importable" in line, line


def test_inspect_fails_when_a_stage_or_a_required_normalizer_does_not_import(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cosyclone.engine import inspect as model_check

    with monkeypatch.context() as m:
        m.setitem(sys.modules, "cosyclone.code2wav.flow", None)  # import of this module now fails
        res = CliRunner().invoke(app, ["inspect", str(tiny_model_dir), "--device", "cpu"])
    assert res.exit_code == 2 and "stage modules: NOT importable" in res.output
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "wetext", None)
        m.setattr(model_check, "declared_requirements", lambda: {"wetext"})
        res = CliRunner().invoke(app, ["inspect", str(tiny_model_dir), "--device", "cpu"])
    assert res.exit_code == 2 and "text normalizer wetext (required): NOT importable" in res.output
    # modules and packages a run imports only when it gets there (frontend, tokenizer) count too
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "cosyclone.frontend", None)
        res = CliRunner().invoke(app, ["inspect", str(tiny_model_dir), "--device", "cpu"])
    assert res.exit_code == 2 and "stage modules: NOT importable" in res.output
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "safetensors", None)
        m.setattr(model_check, "declared_requirements", lambda: {"safetensors", "pyyaml"})
        res = CliRunner().invoke(app, ["inspect", str(tiny_model_dir), "--device", "cpu"])
    assert res.exit_code == 2 and "required package safetensors: NOT importable" in res.output
    assert "pyyaml" not in res.output  # the module of pyyaml is yaml, which imports


def test_inspect_verifies_the_tied_head(tiny_model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "m"
    shutil.copytree(tiny_model_dir, broken)
    state = torch.load(broken / "llm.pt", weights_only=True)
    state["llm.model.lm_head.weight"] = state["llm.model.lm_head.weight"] + 1.0
    torch.save(state, broken / "llm.pt")
    res = CliRunner().invoke(app, ["inspect", str(broken), "--device", "cpu"])
    assert res.exit_code == 2 and "differs from llm.model.model.embed_tokens.weight" in res.output
    assert json.loads((broken / QWEN_DIR / "config.json").read_text())["tie_word_embeddings"] is True
