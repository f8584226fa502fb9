"""Tiny stand-ins for the released frontend assets, for ``make-tiny-model`` and runs without a model.

* :func:`write_tiny_onnx` exports two small torch modules with the released ONNX signatures:
  ``speech_tokenizer_v3.onnx`` (feats float32 (1, 128, T), feats_length int32 (1,) → int64
  tokens (1, ceil(T/4)) in 0..6560) and ``campplus.onnx`` (float32 (1, T, 80) → (1, 192)).
* :func:`write_tiny_tokenizer` writes a byte-level BPE Qwen2 tokenizer (256 byte tokens + a few
  merges) whose special tokens sit at the real Qwen2 ids (151643..151645), so adding CosyVoice3's
  tokens gives ``<|endofprompt|>`` = 151646 exactly as with the released BlankEN tokenizer.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import cast

import torch
from torch import nn

SPEECH_TOKEN_SIZE = 6561


class _TinySpeechTokenizer(nn.Module):
    """Two stride-2 convs (T → ceil(T/4)) and a hash of the output into 0..6560."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(128, 8, 3, stride=2, padding=1)
        self.conv2 = nn.Conv1d(8, 4, 3, stride=2, padding=1)
        self.register_buffer("mix", torch.tensor([1.0, 3.0, 9.0, 27.0])[None, :, None])

    def forward(self, feats: torch.Tensor, feats_length: torch.Tensor) -> torch.Tensor:
        """feats (1, 128, T), feats_length (1,) int32 → tokens (1, ceil(T/4)) int64."""
        t = torch.arange(feats.shape[2], device=feats.device)[None, None, :]
        x = feats * (t < feats_length.to(torch.int64)[:, None, None]).to(feats.dtype)
        h = self.conv2(torch.tanh(self.conv1(x)))
        score = (h * self.mix).sum(1).abs() * 997.0
        return torch.remainder(torch.floor(score), float(SPEECH_TOKEN_SIZE)).to(torch.int64)


class _TinyCampplus(nn.Module):
    """Mean + std pooling over time and a linear map to 192 dims."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(160, 192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (1, T, 80) → (1, 192)."""
        mean = x.mean(dim=1)
        std = ((x - mean[:, None]) ** 2).mean(dim=1).sqrt()
        return cast(torch.Tensor, self.proj(torch.cat([mean, std], dim=-1)))


def write_tiny_onnx(model_dir: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """Export ``speech_tokenizer_v3.onnx`` and ``campplus.onnx`` into ``model_dir``; return their paths."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tok, spk = _TinySpeechTokenizer().eval(), _TinyCampplus().eval()
    tok_path, spk_path = model_dir / "speech_tokenizer_v3.onnx", model_dir / "campplus.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notices
        torch.onnx.export(tok, (torch.randn(1, 128, 37), torch.tensor([37], dtype=torch.int32)),
                          str(tok_path), input_names=["feats", "feats_length"], output_names=["indices"],
                          dynamic_axes={"feats": {2: "T"}, "indices": {1: "P"}}, opset_version=17,
                          dynamo=False)
        torch.onnx.export(spk, (torch.randn(1, 50, 80),), str(spk_path), input_names=["input"],
                          output_names=["output"], dynamic_axes={"input": {1: "T"}}, opset_version=17,
                          dynamo=False)
    return tok_path, spk_path


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to U+0100+."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(0x100 + extra)
            extra += 1
    return out


_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("e", "r"), ("a", "n"), ("o", "n"),
           ("Ġ", "a"), ("r", "e"), ("Ġ", "s")]
_QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}


def write_tiny_tokenizer(qwen_dir: str | Path) -> Path:
    """Write vocab.json, merges.txt and tokenizer_config.json of a tiny Qwen2 BPE tokenizer."""
    qwen_dir = Path(qwen_dir)
    qwen_dir.mkdir(parents=True, exist_ok=True)
    alphabet = _bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    for a, b in _MERGES:
        vocab[a + b] = len(vocab)
    # The specials live in the (sparse) BPE vocab too: tokenizers renumbers added tokens the model
    # does not know densely, whereas known ones keep their id and new ones get max(id) + 1.
    vocab.update(_SPECIALS)
    (qwen_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in _MERGES)
    (qwen_dir / "merges.txt").write_text(merges, encoding="utf-8")
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for s, i in _SPECIALS.items()}
    config = {"tokenizer_class": "Qwen2Tokenizer", "added_tokens_decoder": added,
              "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
              "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": None,
              "clean_up_tokenization_spaces": False, "errors": "replace", "model_max_length": 32768,
              "split_special_tokens": False}
    (qwen_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    # tokenizer.json pins the special ids: without it transformers renumbers added tokens densely
    # after the 266-entry vocab, and <|endofprompt|> would not land on 151646.
    fast = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, **{k: v for k, v in added[str(i)].items()}} for i in _SPECIALS.values()],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": _QWEN_SPLIT}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [f"{a} {b}" for a, b in _MERGES],
        },
    }
    (qwen_dir / "tokenizer.json").write_text(json.dumps(fast, ensure_ascii=False), encoding="utf-8")
    return qwen_dir


def builtin_assets_dir() -> Path:
    """A folder with the tiny tokenizer and ONNX models, for runs without a model directory
    (``--load-format dummy``) and for ``validate`` without ``--model-dir``.

    Random-weight models do not care what the frontend's ONNX weights are, so the tiny ones (the
    released models' signatures) stand in. Written once per user into the cache folder
    (:func:`cosyclone.base.user_cache.cache_dir`), keyed by this module's source so an edit writes a
    fresh one, and made whole in a temporary sibling renamed into place: a concurrent process either
    finds it complete or makes its own, and no run leaves a temporary folder behind.
    """
    import hashlib
    import os
    import shutil
    import tempfile

    from cosyclone.base.user_cache import cache_dir
    from cosyclone.model.config import QWEN_DIR

    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    root = cache_dir() / f"builtin-frontend-{digest}"
    if (root / "campplus.onnx").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        write_tiny_tokenizer(tmp / QWEN_DIR)
        write_tiny_onnx(tmp)  # last: its campplus.onnx marks the folder whole
        try:
            os.rename(tmp, root)
        except OSError:  # another process put its own in place first: use that one
            if not (root / "campplus.onnx").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root
