"""Tiny model directories in the released Fun-CosyVoice3-0.5B layout.

The released weights cannot be downloaded here, so the real loading code is exercised on small
directories this module writes: the same file names, the same yaml structure (HyperPyYAML tags
included) and the same checkpoint key names, at a size that runs in seconds on two CPU cores.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cosyclone.base.atomic import write_atomic
from cosyclone.model.config import CHECKPOINTS, QWEN_DIR, YAML_NAME

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class TinySizes:
    """Sizes of a tiny model directory (released values in comments)."""

    llm_hidden: int = 64  # 896
    llm_layers: int = 2  # 24
    llm_heads: int = 4  # 14
    llm_kv_heads: int = 2  # 2
    llm_intermediate: int = 128  # 4864
    text_vocab: int = 151936  # 151936 (kept: the tokenizer's special ids must fit)
    speech_token_size: int = 6561  # 6561 (kept: the FSQ code space and silent ids are fixed)
    pre_lookahead_channels: int = 32  # 1024
    dit_dim: int = 64  # 1024
    dit_depth: int = 2  # 22
    dit_heads: int = 4  # 16
    dit_dim_head: int = 16  # 64
    hift_base_channels: int = 16  # 512
    f0_cond_channels: int = 32  # 512


def render_yaml(sizes: TinySizes) -> str:
    """The released ``cosyvoice3.yaml`` structure with the sizes of ``sizes`` (inference entries), section
    by section as the release orders them."""
    s = sizes
    return _head_yaml(s) + _llm_yaml(s) + _flow_yaml(s) + _hift_yaml(s) + _frontend_yaml()


def _head_yaml(s: TinySizes) -> str:
    """The seeds and the shared sizes."""
    return f"""# cosyclone tiny model: the released cosyvoice3.yaml layout at tiny size.
__set_seed1: !apply:random.seed [1986]
__set_seed2: !apply:numpy.random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]
__set_seed4: !apply:torch.cuda.manual_seed_all [1986]

sample_rate: 24000
llm_input_size: {s.llm_hidden}
llm_output_size: {s.llm_hidden}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: 25
num_decoding_left_chunks: -1

"""


def _llm_yaml(s: TinySizes) -> str:
    """The talker: CosyVoice3LM around Qwen2, its RAS sampling."""
    return f"""llm: !new:cosyvoice.llm.llm.CosyVoice3LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {s.speech_token_size}
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

"""


def _flow_yaml(s: TinySizes) -> str:
    """The flow: the pre-lookahead layer, the CFM and its DiT estimator."""
    return f"""flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {s.speech_token_size}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: {s.pre_lookahead_channels}
        pre_lookahead_len: 3
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {s.dit_dim}
            depth: {s.dit_depth}
            heads: {s.dit_heads}
            dim_head: {s.dit_dim_head}
            ff_mult: 2
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

"""


def _hift_yaml(s: TinySizes) -> str:
    """The causal HiFT vocoder and its F0 predictor."""
    return f"""hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    in_channels: 80
    base_channels: {s.hift_base_channels}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    conv_pre_look_right: 4
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: {s.f0_cond_channels}

"""


def _frontend_yaml() -> str:
    """The mel extractor and the tokenizer."""
    return """feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: null
    center: False
get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True
    version: cosyvoice3
allowed_special: 'all'
"""


def qwen_config_json(sizes: TinySizes) -> dict[str, Any]:
    """A Qwen2 ``config.json`` for ``CosyVoice-BlankEN`` at tiny size."""
    s = sizes
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": s.llm_hidden,
        "num_hidden_layers": s.llm_layers,
        "num_attention_heads": s.llm_heads,
        "num_key_value_heads": s.llm_kv_heads,
        "intermediate_size": s.llm_intermediate,
        "vocab_size": s.text_vocab,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "use_sliding_window": False,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "torch_dtype": "float32",
    }


def write_tiny_config(root: str | Path, sizes: TinySizes | None = None) -> Path:
    """Write ``cosyvoice3.yaml`` and ``CosyVoice-BlankEN/config.json`` (no weights, no tokenizer)."""
    sizes = sizes or TinySizes()
    root = Path(root)
    (root / QWEN_DIR).mkdir(parents=True, exist_ok=True)
    (root / YAML_NAME).write_text(render_yaml(sizes), encoding="utf-8")
    (root / QWEN_DIR / "config.json").write_text(json.dumps(qwen_config_json(sizes), indent=2) + "\n")
    return root


def _released_hift_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The released hift.pt carries every key under ``generator.`` (the official loader strips it)."""
    return {f"generator.{k}": v for k, v in state.items()}


def _released_llm_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """llm.pt as the official ``state_dict()`` writes it: the tied ``llm.model.lm_head.weight``
    is a second key for the embedding tensor (same storage), and the official strict load needs it."""
    from cosyclone.talker.model import TIED_LM_HEAD, TIED_TO

    return {**state, TIED_LM_HEAD: state[TIED_TO]}


HF_PREFIX = "llm.model."  # llm.pt's Qwen2ForCausalLM lives here; Hugging Face files drop the prefix


def qwen_pretrained_state(llm_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Qwen2 backbone of ``llm.pt`` in Hugging Face layout (``model.embed_tokens.weight``, ...).

    That is what ``CosyVoice-BlankEN/model.safetensors`` holds: the official ``Qwen2Encoder``
    builds its model with ``Qwen2ForCausalLM.from_pretrained(<model_dir>/CosyVoice-BlankEN)``
    before ``llm.pt`` is loaded over it. The tied ``lm_head.weight`` is left out, as
    ``save_pretrained`` leaves out tied copies (``tie_word_embeddings`` restores it).
    """
    from cosyclone.talker.model import TIED_LM_HEAD

    return {k[len(HF_PREFIX):]: v.detach().cpu().clone().contiguous() for k, v in llm_state.items()
            if k.startswith(HF_PREFIX) and k != TIED_LM_HEAD}


def write_qwen_pretrained(qwen_dir: Path, llm_state: dict[str, torch.Tensor]) -> Path:
    """Write ``model.safetensors`` (metadata ``format: pt``, as transformers writes it)."""
    from safetensors.torch import save

    path = qwen_dir / "model.safetensors"
    write_atomic(path, save(qwen_pretrained_state(llm_state), metadata={"format": "pt"}))
    if (qwen_dir / "config.json").is_file():
        shutil.copymode(qwen_dir / "config.json", path)  # the other files' mode
    return path


#: Cap on the std of the tiny flow's and HiFT's matrices: at 1.0 :func:`init_dummy` gives every
#: matrix its variance-keeping ``fan_in ** -0.5``. Its default cap (0.02, the talker's scale) made
#: the DiT's velocity ~0 (the mel stayed the flow's fixed noise) and HiFT's weight-norm gains ~0.02
#: (conv_post ~0, so the iSTFT saw magnitude 1 and phase 0 whatever the mel): every wav was the
#: same ~5e-3 peak waveform, tokens changed its float samples by ~1e-10 and its PCM16 bytes not at
#: all, so no byte-identity test on the tiny model could see a wrong token.
CODE2WAV_INIT_STD = 1.0
#: The tiny flow's token embedding is N(0, 1) (an embedding has no fan-in to scale by): the target
#: tokens then move the mel by about as much as the fixed noise does, so they decide the audio.
TOKEN_EMBEDDING_STD = 1.0


def audible_init(module: nn.Module, seed: int) -> None:
    """Re-fill a tiny flow or HiFT so its audio follows its input (see
    :data:`CODE2WAV_INIT_STD`); seeded and CPU-drawn like :func:`~cosyclone.model.checkpoint.init_dummy`."""
    import torch
    from torch import nn

    from cosyclone.model.checkpoint import init_dummy

    init_dummy(module, seed=seed, std=CODE2WAV_INIT_STD)
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, nn.Embedding):
                values = torch.randn(sub.weight.shape, generator=gen) * TOKEN_EMBEDDING_STD
                sub.weight.copy_(values.to(sub.weight.dtype))


RL_TALKER = "llm.rl.pt"  # the release's second talker file: the same architecture, RL-tuned weights


def make_tiny_model(root: str | Path, sizes: TinySizes | None = None, seed: int = 0, *,
                    rl_talker: bool = False) -> Path:
    """Write a complete tiny model directory in the released layout (weights dummy-initialized).

    yaml + ``CosyVoice-BlankEN`` (config, tokenizer and the Qwen2 weights as ``model.safetensors``),
    both ONNX models, and ``llm.pt`` / ``flow.pt`` / ``hift.pt`` as ``torch.save`` of the state
    dicts of the stages' own modules built with ``load_format="dummy"``, in the key forms of the
    released files (``llm.pt`` with the tied lm_head key, ``hift.pt`` under ``generator.``), so
    both cosyclone's loaders and the official strict loads read them back. The flow and HiFT are
    re-filled by :func:`audible_init`, so the audio depends on the speech tokens (tests compare
    wav bytes to catch wrong tokens); the talker keeps the dummy scale, whose near-uniform logits
    make every seed sample different tokens. ``rl_talker`` also writes ``llm.rl.pt`` as the release has
    it beside ``llm.pt``: the same keys and shapes, other weights (a talker drawn from another seed), so
    ``--llm llm.rl.pt`` gives other tokens.
    """
    import torch

    from cosyclone.base.device import resolve
    from cosyclone.code2wav.flow import build_flow
    from cosyclone.code2wav.hift import CausalHiFTGenerator
    from cosyclone.frontend.tiny_assets import write_tiny_onnx, write_tiny_tokenizer
    from cosyclone.model.config import load_model_config
    from cosyclone.talker.model import build_talker

    root = Path(root)
    write_tiny_config(root, sizes)
    write_tiny_tokenizer(root / QWEN_DIR)
    write_tiny_onnx(root)
    cfg = load_model_config(root)
    policy = resolve("cpu", "fp32")
    torch.manual_seed(seed)
    for name in CHECKPOINTS:
        module: nn.Module
        if name == "hift.pt":
            # build_hift folds weight norm; the released file holds the unfolded g/v parametrizations
            module = CausalHiFTGenerator(cfg.hift)
            audible_init(module, seed)
        elif name == "flow.pt":
            module = build_flow(cfg, policy, load_format="dummy")
            audible_init(module, seed)
        else:
            module = build_talker(cfg, policy, load_format="dummy")
        state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
        if name == "hift.pt":
            state = _released_hift_keys(state)
        if name == "llm.pt":
            write_qwen_pretrained(root / QWEN_DIR, state)
            state = _released_llm_keys(state)
        _save_state(state, root / name)
    if rl_talker:
        torch.manual_seed(seed + 7919)
        module = build_talker(cfg, policy, load_format="dummy", seed=seed + 7919)
        state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
        _save_state(_released_llm_keys(state), root / RL_TALKER)
    return root


def _save_state(state: dict[str, Any], path: Path) -> None:
    """``torch.save`` of ``state`` to ``path`` by way of a temporary name (never a torn checkpoint)."""
    import torch

    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(state, tmp)
    tmp.replace(path)
