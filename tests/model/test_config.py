"""The model-directory layer: yaml read as data, geometry checks, strict checkpoint loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from typing_extensions import override

from cosyclone.base.device import resolve
from cosyclone.engine.tiny import TinySizes, write_tiny_config
from cosyclone.errors import CosycloneError, ModelDirError
from cosyclone.model.checkpoint import check_keys, init_dummy, load_module_file, load_strict, read_state_file
from cosyclone.model.config import QWEN_DIR, YAML_NAME, load_model_config, released_config
from cosyclone.model.hyperyaml import Tagged, load_hyperyaml


def test_tiny_dir_reads_into_one_frozen_config(tmp_path: Path) -> None:
    write_tiny_config(tmp_path, TinySizes(llm_hidden=48, llm_heads=4, llm_kv_heads=2))
    cfg = load_model_config(tmp_path)
    assert cfg.talker.qwen.hidden_size == 48 == cfg.talker.llm_input_size
    assert cfg.talker.qwen.head_dim == 12
    assert cfg.talker.qwen.kv_dim == 24
    assert cfg.talker.sampling.top_k == 25 and cfg.talker.sampling.top_p == pytest.approx(0.8)
    assert cfg.flow.cfm.inference_cfg_rate == pytest.approx(0.7)
    assert cfg.flow.cfm.sigma_min == pytest.approx(1e-6)
    assert cfg.hift.upsample_rates == (8, 5, 3)
    assert cfg.hift.resblock_dilation_sizes == ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    assert cfg.frontend.mel.fmax is None
    assert len(cfg.yaml_sha256) == 64
    with pytest.raises(AttributeError):
        cfg.talker.speech_token_size = 1  # type: ignore[misc]


def test_yaml_tags_are_data_never_imported(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "x.yaml").write_text(
        f"boom: !apply:os.system ['touch {marker}']\n"
        "obj: !new:some.module.DoesNotExist\n    a: 1\n"
        "size: 4\nref: !ref <size> * 2\n"
    )
    doc = load_hyperyaml(tmp_path / "x.yaml")
    assert not marker.exists()
    assert isinstance(doc["boom"], Tagged) and doc["boom"].target == "os.system"
    assert doc["obj"].kind == "new" and doc["obj"]["a"] == 1
    assert doc["ref"] == 8


def test_ref_expression_rejects_code(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("a: 1\nb: !ref <a> + __import__('os').getpid()\n")
    with pytest.raises(ModelDirError, match="!ref"):
        load_hyperyaml(tmp_path / "x.yaml")


def test_kv_head_mismatch_names_both_values_and_files(tmp_path: Path) -> None:
    write_tiny_config(tmp_path)
    cfg_file = tmp_path / QWEN_DIR / "config.json"
    data = json.loads(cfg_file.read_text())
    data["num_key_value_heads"] = 3  # does not divide 4 query heads
    cfg_file.write_text(json.dumps(data))
    with pytest.raises(ModelDirError) as err:
        load_model_config(tmp_path)
    assert "num_key_value_heads=3" in str(err.value) and "num_attention_heads=4" in str(err.value)
    assert "config.json" in str(err.value)


def test_hidden_size_mismatch_between_yaml_and_qwen(tmp_path: Path) -> None:
    write_tiny_config(tmp_path)
    yaml_file = tmp_path / YAML_NAME
    yaml_file.write_text(yaml_file.read_text().replace("llm_input_size: 64", "llm_input_size: 896"))
    with pytest.raises(ModelDirError) as err:
        load_model_config(tmp_path)
    message = str(err.value)
    assert "llm_input_size=896" in message and "hidden_size=64" in message
    assert YAML_NAME in message and "config.json" in message


def test_missing_model_dir_parts_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match="cosyvoice3.yaml"):
        load_model_config(tmp_path)
    (tmp_path / YAML_NAME).write_text("llm: 1\n")
    with pytest.raises(ModelDirError, match="config.json"):
        load_model_config(tmp_path)


def test_released_config_geometry() -> None:
    cfg = released_config()
    q = cfg.talker.qwen
    assert (q.hidden_size, q.num_attention_heads, q.num_key_value_heads, q.head_dim) == (896, 14, 2, 64)
    assert cfg.talker.decoder_size == 6761
    assert (cfg.talker.sos, cfg.talker.eos, cfg.talker.task_id, cfg.talker.fill) == (6561, 6562, 6563, 6564)


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.table: torch.Tensor
        self.register_buffer("table", torch.arange(4.0), persistent=False)


def test_strict_load_reports_missing_unexpected_and_misshaped(tmp_path: Path) -> None:
    module = _Tiny()
    bad = {"lin.weight": torch.zeros(2, 4), "extra.key": torch.zeros(1)}
    report = check_keys(module, bad, "x.pt")
    assert report.missing == ["lin.bias"] and report.unexpected == ["extra.key"]
    assert report.mismatched == [("lin.weight", (2, 4), (2, 3))]
    with pytest.raises(ModelDirError) as err:
        load_strict(module, bad, source="x.pt")
    text = str(err.value)
    assert "missing (1): lin.bias" in text and "unexpected (1): extra.key" in text and "(2, 4)" in text


def test_pt_load_is_weights_only_and_casts_to_run_dtype(tmp_path: Path) -> None:
    module = _Tiny().to(torch.float64)
    state = {"lin.weight": torch.ones(2, 3, dtype=torch.bfloat16), "lin.bias": torch.zeros(2),
             "ignored.head": torch.zeros(1)}
    torch.save(state, tmp_path / "w.pt")
    load_module_file(module, tmp_path / "w.pt", ignore=("ignored.head",))
    assert module.lin.weight.dtype == torch.float64 and torch.all(module.lin.weight == 1)

    class Evil:
        @override
        def __reduce__(self):
            return (print, ("executed",))

    torch.save({"x": Evil()}, tmp_path / "evil.pt", _use_new_zipfile_serialization=True)
    with pytest.raises(ModelDirError, match="holds an object of type print, not only tensors") as err:
        read_state_file(tmp_path / "evil.pt")
    # no unsafe advice
    assert "weights_only=False" not in str(err.value).replace(" ", "") and err.value.__cause__ is None


def test_dummy_init_is_seeded_and_leaves_buffers() -> None:
    a, b = init_dummy(_Tiny(), seed=3), init_dummy(_Tiny(), seed=3)
    assert torch.equal(a.lin.weight, b.lin.weight)
    assert not torch.equal(a.lin.weight, init_dummy(_Tiny(), seed=4).lin.weight)
    assert torch.equal(a.table, torch.arange(4.0))


def test_device_policy_cpu_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = resolve("cpu", "bf16")
    assert policy.device.type == "cpu" and policy.dtype == torch.bfloat16
    with pytest.raises(CosycloneError, match="--dtype"):
        resolve("cpu", "int3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without a GPU
    with pytest.raises(CosycloneError, match="no GPU"):
        resolve("cuda")
    assert resolve("auto").device.type == "cpu"


@pytest.mark.gpu
def test_device_policy_finds_the_gpu() -> None:
    """GPU check script only (``make test-gpu``): auto picks the accelerator this torch build drives."""
    policy = resolve("auto")
    assert policy.device.type == "cuda" and policy.backend == ("rocm" if torch.version.hip else "cuda")
