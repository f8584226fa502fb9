"""`cosyclone make-tiny-model` writes the released Fun-CosyVoice3-0.5B layout, not just our own.

The official ``CosyVoice3.__init__`` (FunAudioLLM/CosyVoice at the commit of the reference) opens
``cosyvoice3.yaml``, builds the Qwen2 with ``Qwen2ForCausalLM.from_pretrained(<dir>/CosyVoice-BlankEN)``
(which needs ``config.json`` and ``model.safetensors`` there), loads the tokenizer from the same
folder, the two ONNX models, and then strict-loads ``llm.pt``, ``flow.pt`` and ``hift.pt`` (the
latter with ``generator.`` removed from every key). The checks below compare a tiny directory
with the reference manifests of those state dicts, key for key once the block indices are set
aside (a tiny model has fewer blocks), and load the Qwen2 folder with transformers itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from cosyclone.base.device import DevicePolicy
from cosyclone.errors import ModelDirError
from cosyclone.model.config import load_model_config
from cosyclone.talker.model import TIED_LM_HEAD, TIED_TO, build_talker
from tests.reference import state_dict_manifest, state_dict_summary

CPU = DevicePolicy(torch.device("cpu"), torch.float32, "cpu")
# what the official constructor opens (spk2info.pt is optional: it falls back to an empty dict)
OFFICIAL_FILES = (
    "cosyvoice3.yaml",
    "llm.pt",
    "flow.pt",
    "hift.pt",
    "campplus.onnx",
    "speech_tokenizer_v3.onnx",
    "CosyVoice-BlankEN/config.json",
    "CosyVoice-BlankEN/model.safetensors",
    "CosyVoice-BlankEN/vocab.json",
    "CosyVoice-BlankEN/merges.txt",
    "CosyVoice-BlankEN/tokenizer_config.json",
)


@pytest.fixture()
def tiny(tiny_model_dir: Path) -> Path:
    return tiny_model_dir


def _official_keys(tiny: Path, name: str) -> dict[str, torch.Tensor]:
    """The file as the official loader sees it (hift: ``generator.`` removed)."""
    state = torch.load(tiny / name, map_location="cpu", weights_only=True)
    if name == "hift.pt":
        state = {k.replace("generator.", ""): v for k, v in state.items()}
    return state


def _blockless(key: str) -> str:
    return re.sub(r"\.\d+\.", ".#.", key)


def test_every_file_the_official_constructor_opens_exists(tiny: Path) -> None:
    missing = [f for f in OFFICIAL_FILES if not (tiny / f).is_file()]
    assert not missing


@pytest.mark.parametrize("component", ["llm", "flow", "hift"])
def test_checkpoint_keys_are_the_released_ones(tiny: Path, component: str) -> None:
    ref = {e["key"]: e for e in state_dict_manifest(component)}
    got = _official_keys(tiny, f"{component}.pt")
    assert {_blockless(k) for k in got} == {_blockless(k) for k in ref}  # the same keys, block for block
    assert set(got) <= set(ref), sorted(set(got) - set(ref))[:5]  # and only indices the release has
    for key, tensor in got.items():
        assert tensor.dim() == len(ref[key]["shape"]) and str(tensor.dtype) == f"torch.{ref[key]['dtype']}", (
            key
        )


def test_llm_pt_carries_the_tied_head_the_official_strict_load_needs(tiny: Path) -> None:
    summary = state_dict_summary()["loader_checks_with_official_strict_load"]
    assert (
        summary["llm_without_lm_head_key"].startswith("FAIL")
        and TIED_LM_HEAD in summary["llm_without_lm_head_key"]
    )
    state = _official_keys(tiny, "llm.pt")
    assert torch.equal(state[TIED_LM_HEAD], state[TIED_TO])


def test_qwen_folder_loads_with_transformers_from_pretrained(tiny: Path) -> None:
    """What the official Qwen2Encoder does, and the backbone it gets computes what ours computes."""
    import transformers  # a declared dependency (the tokenizer and Qwen2 config go through it too)

    loaded: Any = transformers.Qwen2ForCausalLM.from_pretrained(str(tiny / "CosyVoice-BlankEN"),
                                                                output_loading_info=True)
    hf, info = loaded  # with output_loading_info: (model, {missing, unexpected, mismatched keys})
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
    llm = _official_keys(tiny, "llm.pt")
    for key, value in hf.state_dict().items():
        assert torch.equal(value, llm[f"llm.model.{key}"]), key
    ours = build_talker(load_model_config(tiny), CPU)
    x = torch.randn(1, 7, hf.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf.eval()(inputs_embeds=x, attention_mask=torch.ones(1, 7, dtype=torch.long),
                        output_hidden_states=True).hidden_states[-1]
        hidden, _ = ours(x)
    torch.testing.assert_close(hidden, ref, atol=1e-5, rtol=0)


def test_our_loader_accepts_the_tied_head_and_refuses_a_different_one(tiny: Path, tmp_path: Path) -> None:
    cfg = load_model_config(tiny)
    build_talker(cfg, CPU)  # the directory as written
    state = torch.load(tiny / "llm.pt", map_location="cpu", weights_only=True)
    state[TIED_LM_HEAD] = state[TIED_LM_HEAD].clone()
    state[TIED_LM_HEAD][0, 0] += 1.0
    bad = tmp_path / "untied.pt"
    torch.save(state, bad)
    from cosyclone.talker.model import CosyVoice3LM, load_talker_weights

    with torch.device("cpu"):
        model = CosyVoice3LM(cfg.talker)
    with pytest.raises(ModelDirError, match="differs from llm.model.model.embed_tokens.weight"):
        load_talker_weights(model, bad)
    state.pop(TIED_LM_HEAD)  # files without the copy (older cosyclone tiny dirs) still load
    torch.save(state, bad)
    assert load_talker_weights(model, bad).ok


def test_qwen_folder_tokenizer_loads_as_the_official_get_qwen_tokenizer_loads_it(tiny: Path) -> None:
    """The official tokenizer is ``AutoTokenizer.from_pretrained(<dir>/CosyVoice-BlankEN)`` plus its
    special tokens; the folder's files must load that way and give ids inside the tiny vocabulary."""
    import json

    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(tiny / "CosyVoice-BlankEN"))
    ids = tok.encode("hello world, 你好")
    vocab = json.loads((tiny / "CosyVoice-BlankEN" / "config.json").read_text())["vocab_size"]
    assert ids and all(0 <= i < vocab for i in ids)
