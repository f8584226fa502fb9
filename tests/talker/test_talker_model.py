"""Talker module: state_dict conformance, loading reports, geometry errors, dummy mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from cosyclone.base.device import DevicePolicy
from cosyclone.engine.tiny import TinySizes, write_tiny_config
from cosyclone.errors import ModelDirError
from cosyclone.model.config import QWEN_DIR, QwenGeometry, TalkerConfig, load_model_config, released_config
from cosyclone.talker.model import TIED_LM_HEAD, CosyVoice3LM, build_talker, load_talker_weights
from tests.reference import state_dict_manifest

CPU = DevicePolicy(torch.device("cpu"), torch.float32, "cpu")
SMALL = TalkerConfig(qwen=QwenGeometry(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=48, vocab_size=72),
                     llm_input_size=32, llm_output_size=32, speech_token_size=40)


def _tiny_dir(tmp_path: Path) -> Path:
    return write_tiny_config(tmp_path / "m", TinySizes(text_vocab=300, speech_token_size=60))


def test_state_dict_matches_llm_json_at_released_size() -> None:
    ref = {e["key"]: tuple(e["shape"]) for e in state_dict_manifest("llm")}
    with torch.device("meta"):
        model = CosyVoice3LM(released_config().talker)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert TIED_LM_HEAD in ref and TIED_LM_HEAD not in got
    assert got == {k: v for k, v in ref.items() if k != TIED_LM_HEAD}
    assert not any("lm_head" in name for name, _ in model.named_modules())


def test_dummy_needs_no_files_and_buffers_follow_device(tmp_path: Path) -> None:
    cfg = load_model_config(_tiny_dir(tmp_path))  # no llm.pt in this directory
    model = build_talker(cfg, CPU, load_format="dummy")
    assert all(b.device.type == "cpu" for b in model.buffers())
    assert all(p.device.type == "cpu" and torch.isfinite(p).all() for p in model.parameters())
    assert model.backbone.rope_table.dtype == torch.float32
    with pytest.raises(ModelDirError, match="llm.pt"):
        build_talker(cfg, CPU, load_format="auto")


def test_roundtrip_load_accepts_tied_head(tmp_path: Path) -> None:
    cfg = load_model_config(_tiny_dir(tmp_path))
    src = build_talker(cfg, CPU, load_format="dummy", seed=3)
    state = dict(src.state_dict())
    state[TIED_LM_HEAD] = state["llm.model.model.embed_tokens.weight"]
    torch.save(state, cfg.path("llm.pt"))
    model = build_talker(cfg, CPU)
    for k, v in src.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def test_strict_load_reports(tmp_path: Path) -> None:
    model = CosyVoice3LM(SMALL)
    state = dict(model.state_dict())
    state.pop("llm.model.model.norm.weight")
    state["llm.extra.weight"] = torch.zeros(1)
    state["speech_embedding.weight"] = torch.zeros(3, 32)
    path = tmp_path / "bad.safetensors"
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    with pytest.raises(ModelDirError) as err:
        load_talker_weights(model, path)
    msg = str(err.value)
    assert "missing (1): llm.model.model.norm.weight" in msg
    assert "unexpected (1): llm.extra.weight" in msg
    assert "speech_embedding.weight file (3, 32)" in msg


def test_geometry_mismatch_names_both_files(tmp_path: Path) -> None:
    root = _tiny_dir(tmp_path)
    cfg = load_model_config(root)
    torch.save(build_talker(cfg, CPU, load_format="dummy").state_dict(), cfg.path("llm.pt"))
    conf = root / QWEN_DIR / "config.json"
    data = json.loads(conf.read_text())
    data["num_key_value_heads"] = 1
    conf.write_text(json.dumps(data))
    with pytest.raises(ModelDirError) as err:
        build_talker(load_model_config(root), CPU)
    msg = str(err.value)
    assert "llm.pt" in msg and "config.json" in msg and "num_key_value_heads=1" in msg
    assert "k_proj.weight" in msg


def test_lm_head_never_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    """No linear layer with the text vocabulary's width runs in a forward or decode step."""
    model = CosyVoice3LM(SMALL).eval()
    widths: list[int] = []
    real = torch.nn.functional.linear

    def spy(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        widths.append(w.shape[0])
        return real(x, w, b)

    monkeypatch.setattr(torch.nn.functional, "linear", spy)
    with torch.no_grad():
        model(torch.randn(1, 5, 32))
    assert widths and SMALL.qwen.vocab_size not in widths
    assert SMALL.decoder_size in widths


def test_bf16_logits_are_fp32() -> None:
    model = CosyVoice3LM(SMALL).eval().to(torch.bfloat16)
    with torch.no_grad():
        _, logits = model(torch.randn(1, 4, 32, dtype=torch.bfloat16))
    assert logits.dtype == torch.float32


def test_fused_projections_keep_released_names_both_ways() -> None:
    """q/k/v and gate/up run as one matmul each, yet state_dict and load_state_dict use llm.pt names."""
    src = CosyVoice3LM(SMALL)
    keys = set(src.state_dict())
    layer = "llm.model.model.layers.0."
    for name in ("self_attn.q_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight"):
        assert layer + name in keys
    assert not any("qkv_proj" in k or "gate_up_proj" in k for k in keys)
    state = {k: torch.randn_like(v) for k, v in src.state_dict().items()}
    dst = CosyVoice3LM(SMALL)
    dst.load_state_dict(state, strict=True)
    attn = dst.llm.model.model.layers[0].self_attn
    joined = torch.cat([state[layer + f"self_attn.{p}_proj.weight"] for p in "qkv"])
    assert isinstance(attn, nn.Module) and isinstance(attn.qkv_proj, nn.Linear)
    assert torch.equal(attn.qkv_proj.weight, joined)
    for k, v in dst.state_dict().items():
        assert torch.equal(v, state[k]), k
