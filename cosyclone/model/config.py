"""One frozen configuration for the whole model, read once from a model directory.

A model directory in the released layout holds ``cosyvoice3.yaml`` (HyperPyYAML, read as data by
:mod:`cosyclone.model.hyperyaml`), ``CosyVoice-BlankEN/config.json`` (the nested Qwen2 config, read through
``transformers.AutoConfig``), ``llm.pt``, ``flow.pt``, ``hift.pt``, ``campplus.onnx`` and
``speech_tokenizer_v3.onnx``. :func:`load_model_config` turns the two config files into a
:class:`ModelConfig` whose parts (talker, flow, hift, frontend) are passed down to every stage;
nothing re-reads the files later.

Geometry is validated here, once: the yaml's ``llm_input_size``/``llm_output_size`` must equal the
Qwen2 ``hidden_size``, heads must divide the width and KV heads must divide query heads. The KV
cache is later sized from the very :class:`QwenGeometry` that builds the attention layers.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cosyclone.errors import ModelDirError
from cosyclone.model.hyperyaml import Tagged, load_hyperyaml

YAML_NAME = "cosyvoice3.yaml"
QWEN_DIR = "CosyVoice-BlankEN"
CHECKPOINTS = ("llm.pt", "flow.pt", "hift.pt")
ONNX_MODELS = ("campplus.onnx", "speech_tokenizer_v3.onnx")
#: The CosyVoice3 system prefix; without it the model re-speaks the reference.
SYSTEM_PREFIX = "You are a helpful assistant.<|endofprompt|>"
ENDOFPROMPT = "<|endofprompt|>"


@dataclass(frozen=True)
class QwenGeometry:
    """The Qwen2 backbone's shape, from ``CosyVoice-BlankEN/config.json``."""

    hidden_size: int = 896
    num_hidden_layers: int = 24
    num_attention_heads: int = 14
    num_key_value_heads: int = 2
    intermediate_size: int = 4864
    vocab_size: int = 151936
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = True
    hidden_act: str = "silu"
    head_dim: int = 0  # 0 = hidden_size // num_attention_heads (Qwen2's default)

    def __post_init__(self) -> None:
        if self.head_dim == 0 and self.num_attention_heads > 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @property
    def kv_dim(self) -> int:
        """Width of one K (or V) projection: ``num_key_value_heads * head_dim``."""
        return self.num_key_value_heads * self.head_dim


@dataclass(frozen=True)
class SamplingConfig:
    """RAS sampler parameters (yaml ``llm.sampling``)."""

    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1


@dataclass(frozen=True)
class TalkerConfig:
    """CosyVoice3LM: Qwen2 backbone plus speech embedding / decoder of ``speech_token_size + 200``."""

    qwen: QwenGeometry = field(default_factory=QwenGeometry)
    llm_input_size: int = 896
    llm_output_size: int = 896
    speech_token_size: int = 6561
    num_extra_ids: int = 200  # sos, eos, task_id, fill and reserved ids; all of them stop decoding
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    min_len_ratio: float = 2.0  # min tokens = int(ratio * target text tokens)
    max_len_ratio: float = 20.0  # max tokens = int(ratio * target text tokens)

    @property
    def sos(self) -> int:
        return self.speech_token_size

    @property
    def eos(self) -> int:
        return self.speech_token_size + 1

    @property
    def task_id(self) -> int:
        return self.speech_token_size + 2

    @property
    def fill(self) -> int:
        return self.speech_token_size + 3

    @property
    def decoder_size(self) -> int:
        """Rows of ``speech_embedding`` and outputs of ``llm_decoder``."""
        return self.speech_token_size + self.num_extra_ids


@dataclass(frozen=True)
class DiTConfig:
    """The flow's DiT estimator."""

    dim: int = 1024
    depth: int = 22
    heads: int = 16
    dim_head: int = 64
    ff_mult: int = 2
    mel_dim: int = 80
    mu_dim: int = 80
    spk_dim: int = 80
    out_channels: int = 80


@dataclass(frozen=True)
class CFMConfig:
    """CausalConditionalCFM solver settings."""

    sigma_min: float = 1e-6
    t_scheduler: str = "cosine"
    inference_cfg_rate: float = 0.7
    n_timesteps: int = 10
    noise_frames: int = 15000  # frames of the fixed construction-time noise
    noise_seed: int = 0


@dataclass(frozen=True)
class FlowConfig:
    """CausalMaskedDiffWithDiT."""

    input_size: int = 80
    output_size: int = 80
    spk_embed_dim: int = 192
    vocab_size: int = 6561
    token_mel_ratio: int = 2
    pre_lookahead_len: int = 3
    pre_lookahead_channels: int = 1024
    dit: DiTConfig = field(default_factory=DiTConfig)
    cfm: CFMConfig = field(default_factory=CFMConfig)


@dataclass(frozen=True)
class HiFTConfig:
    """CausalHiFTGenerator (with its CausalConvRNNF0Predictor)."""

    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8  # the source uses nb_harmonics + 1 sines
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    n_fft: int = 16
    hop_len: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    conv_pre_look_right: int = 4
    f0_in_channels: int = 80
    f0_cond_channels: int = 512
    f0_num_class: int = 1
    noise_samples: int = 7_200_000  # length of the fixed construction-time source noise


@dataclass(frozen=True)
class MelConfig:
    """The matcha mel extractor (flow prompt mel, what flow predicts and HiFT consumes)."""

    n_fft: int = 1920
    num_mels: int = 80
    sampling_rate: int = 24000
    hop_size: int = 480
    win_size: int = 1920
    fmin: float = 0.0
    fmax: float | None = None
    center: bool = False


@dataclass(frozen=True)
class FrontendConfig:
    """Constants the frontend needs."""

    sample_rate: int = 24000
    token_frame_rate: int = 25
    token_mel_ratio: int = 2
    spk_embed_dim: int = 192
    mel: MelConfig = field(default_factory=MelConfig)
    max_prompt_seconds: float = 30.0
    min_prompt_sample_rate: int = 16000


@dataclass(frozen=True)
class ModelConfig:
    """Everything the stages need, read once. ``model_dir`` is None for dummy/built-in configs."""

    talker: TalkerConfig = field(default_factory=TalkerConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    hift: HiFTConfig = field(default_factory=HiFTConfig)
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    model_dir: Path | None = None
    yaml_sha256: str = ""

    def path(self, name: str) -> Path:
        """Path of a file inside the model directory (an error for a dir-less config)."""
        if self.model_dir is None:
            raise ModelDirError(f"no model directory: cannot open {name} (dummy weights were requested)")
        return self.model_dir / name

    def talker_file(self, name: str) -> Path:
        """The talker checkpoint ``name`` (``--llm``) of the model directory; a missing one is a
        :class:`ModelDirError` naming the talker files the folder does hold."""
        path = self.path(name)
        if not path.is_file():
            held = sorted(p.name for p in path.parent.glob("llm*.pt")) if path.parent.is_dir() else []
            raise ModelDirError(f"--llm {name}: no such file in {self.model_dir} (talker files there: "
                                f"{', '.join(held) or 'none'})")
        return path


def released_config() -> ModelConfig:
    """The released Fun-CosyVoice3-0.5B geometry, for ``--load-format dummy`` without a directory."""
    return ModelConfig()


# ---------------------------------------------------------------------------------------------
# Reading a model directory


def _as_dict(node: Any, what: str, src: Path) -> dict[str, Any]:
    if isinstance(node, Tagged):
        return node.args
    if isinstance(node, dict):
        return node
    raise ModelDirError(f"{src}: expected {what} to be a mapping or a !new: node, got {type(node).__name__}")


def _pick(cls: type, values: dict[str, Any], **renames: str) -> dict[str, Any]:
    """Keep the keys of ``values`` that are fields of dataclass ``cls`` (after renames)."""
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for key, value in values.items():
        key = renames.get(key, key)
        if key in names and not isinstance(value, (Tagged, dict)):
            out[key] = tuple(tuple(v) if isinstance(v, list) else v for v in value) if isinstance(
                value, list) else value
    return out


def read_qwen_geometry(qwen_dir: Path) -> QwenGeometry:
    """Read ``CosyVoice-BlankEN/config.json`` through ``transformers.AutoConfig``."""
    cfg_file = qwen_dir / "config.json"
    if not cfg_file.is_file():
        raise ModelDirError(f"{cfg_file}: missing (the Qwen2 config of the talker backbone)")
    from transformers import AutoConfig

    try:
        hf = AutoConfig.from_pretrained(str(qwen_dir), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # transformers raises many types for a broken config
        raise ModelDirError(f"{cfg_file}: transformers.AutoConfig cannot read it: {exc}") from exc
    rope_theta = getattr(hf, "rope_theta", None)
    if rope_theta is None:  # transformers 5 keeps it under rope_parameters
        params = getattr(hf, "rope_parameters", None) or {}
        rope_theta = params.get("rope_theta", 1_000_000.0)
    head_dim = getattr(hf, "head_dim", None) or 0
    return QwenGeometry(
        hidden_size=int(hf.hidden_size),
        num_hidden_layers=int(hf.num_hidden_layers),
        num_attention_heads=int(hf.num_attention_heads),
        num_key_value_heads=int(getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads),
        intermediate_size=int(hf.intermediate_size),
        vocab_size=int(hf.vocab_size),
        rope_theta=float(rope_theta),
        rms_norm_eps=float(hf.rms_norm_eps),
        max_position_embeddings=int(getattr(hf, "max_position_embeddings", 32768)),
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", True)),
        hidden_act=str(getattr(hf, "hidden_act", "silu")),
        head_dim=int(head_dim),
    )


def validate_geometry(talker: TalkerConfig, *, yaml_file: str = YAML_NAME,
                      qwen_file: str = f"{QWEN_DIR}/config.json") -> None:
    """Check the outer (yaml) and nested (Qwen2) configs agree; raise naming both values and files."""
    q = talker.qwen
    problems: list[str] = []
    for name in ("llm_input_size", "llm_output_size"):
        value = getattr(talker, name)
        if value != q.hidden_size:
            problems.append(f"{yaml_file} {name}={value} but {qwen_file} hidden_size={q.hidden_size}")
    if q.num_attention_heads <= 0 or q.hidden_size % q.num_attention_heads:
        problems.append(f"{qwen_file} num_attention_heads={q.num_attention_heads} does not divide "
                        f"hidden_size={q.hidden_size}")
    if q.num_key_value_heads <= 0 or q.num_attention_heads % q.num_key_value_heads:
        problems.append(f"{qwen_file} num_key_value_heads={q.num_key_value_heads} does not divide "
                        f"num_attention_heads={q.num_attention_heads}")
    if q.head_dim * q.num_attention_heads != q.hidden_size:
        problems.append(f"{qwen_file} head_dim={q.head_dim} x num_attention_heads={q.num_attention_heads} "
                        f"!= hidden_size={q.hidden_size}")
    if q.head_dim % 2:
        problems.append(f"{qwen_file} head_dim={q.head_dim} must be even for rotary embeddings")
    if problems:
        raise ModelDirError("model geometry mismatch: " + "; ".join(problems))


def config_from_yaml(doc: dict[str, Any], qwen: QwenGeometry, *, src: Path) -> ModelConfig:
    """Build a :class:`ModelConfig` from a parsed yaml document and the Qwen geometry."""
    for key in ("llm", "flow", "hift"):
        if key not in doc:
            raise ModelDirError(f"{src}: missing top-level entry {key!r}")
    llm = _as_dict(doc["llm"], "llm", src)
    sampling_node = llm.get("sampling")
    sampling = SamplingConfig(**_pick(SamplingConfig, _as_dict(sampling_node, "llm.sampling", src))) \
        if sampling_node is not None else SamplingConfig()
    talker = TalkerConfig(
        qwen=qwen,
        llm_input_size=int(llm.get("llm_input_size", doc.get("llm_input_size", qwen.hidden_size))),
        llm_output_size=int(llm.get("llm_output_size", doc.get("llm_output_size", qwen.hidden_size))),
        speech_token_size=int(llm.get("speech_token_size", 6561)),
        sampling=sampling,
    )

    flow = _as_dict(doc["flow"], "flow", src)
    pll = _as_dict(flow.get("pre_lookahead_layer", {}), "flow.pre_lookahead_layer", src)
    decoder = _as_dict(flow.get("decoder", {}), "flow.decoder", src)
    cfm_params = decoder.get("cfm_params", {})
    if isinstance(cfm_params, Tagged):  # !new:omegaconf.DictConfig with a `content:` mapping
        cfm_params = cfm_params.args.get("content", cfm_params.args)
    estimator = _as_dict(decoder.get("estimator", {}), "flow.decoder.estimator", src)
    flow_cfg = FlowConfig(
        **_pick(FlowConfig, flow),
        pre_lookahead_channels=int(pll.get("channels", 1024)),
        dit=DiTConfig(**_pick(DiTConfig, estimator)),
        cfm=CFMConfig(**_pick(CFMConfig, cfm_params)),
    )

    hift = _as_dict(doc["hift"], "hift", src)
    f0 = _as_dict(hift.get("f0_predictor", {}), "hift.f0_predictor", src)
    istft = hift.get("istft_params", {}) or {}
    hift_cfg = HiFTConfig(
        **_pick(HiFTConfig, hift),
        n_fft=int(istft.get("n_fft", 16)),
        hop_len=int(istft.get("hop_len", 4)),
        f0_in_channels=int(f0.get("in_channels", 80)),
        f0_cond_channels=int(f0.get("cond_channels", 512)),
        f0_num_class=int(f0.get("num_class", 1)),
    )

    feat = doc.get("feat_extractor")
    mel = MelConfig()
    if feat is not None:
        fe = _as_dict(feat, "feat_extractor", src)
        mel = MelConfig(n_fft=int(fe.get("n_fft", 1920)), num_mels=int(fe.get("num_mels", 80)),
                        sampling_rate=int(fe.get("sampling_rate", 24000)),
                        hop_size=int(fe.get("hop_size", 480)), win_size=int(fe.get("win_size", 1920)),
                        fmin=float(fe.get("fmin", 0) or 0), fmax=fe.get("fmax"),
                        center=bool(fe.get("center", False)))
    frontend = FrontendConfig(
        sample_rate=int(doc.get("sample_rate", 24000)),
        token_frame_rate=int(doc.get("token_frame_rate", 25)),
        token_mel_ratio=int(doc.get("token_mel_ratio", 2)),
        spk_embed_dim=int(doc.get("spk_embed_dim", 192)),
        mel=mel,
    )
    return ModelConfig(talker=talker, flow=flow_cfg, hift=hift_cfg, frontend=frontend)


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Read and validate a model directory's configuration (no weights are touched)."""
    root = Path(model_dir).expanduser()
    if not root.is_dir():
        raise ModelDirError(f"{root}: not a directory (expected the Fun-CosyVoice3-0.5B layout)")
    yaml_file = root / YAML_NAME
    if not yaml_file.is_file():
        raise ModelDirError(f"{yaml_file}: missing (is {root} a CosyVoice3 model directory?)")
    doc = load_hyperyaml(yaml_file, overrides={"qwen_pretrain_path": str(root / QWEN_DIR)})
    qwen = read_qwen_geometry(root / QWEN_DIR)
    cfg = config_from_yaml(doc, qwen, src=yaml_file)
    validate_geometry(cfg.talker, yaml_file=str(yaml_file), qwen_file=str(root / QWEN_DIR / "config.json"))
    digest = hashlib.sha256(yaml_file.read_bytes()).hexdigest()
    return replace(cfg, model_dir=root, yaml_sha256=digest)
