"""How ``cosyclone eval`` scores a folder, declared in the option registry.

Like a run's options (:mod:`cosyclone.options`): one field per option with its flag, help line and
panel, so ``--help``, docs/cli.md and the bounds check read one table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cosyclone.options import EVAL, check, opt

ASR, SPEAKER, QUALITY, THRESHOLDS, REDO = "ASR", "Speaker similarity", "Quality", "Thresholds", "Redo"

AsrDevice = Literal["auto", "cpu", "cuda"]  # where CTranslate2 runs the ASR model


@dataclass(frozen=True)
class ScoringOptions:
    """How ``cosyclone eval`` scores a folder: the ASR, the speaker encoders, the pass thresholds."""

    # the manifest the folder was synthesized from (its texts are the references)
    manifest: Path | None = opt(None, "the manifest the folder was synthesized from", panel=ASR,
                                metavar="FILE", commands=(EVAL,))
    # a local CTranslate2 Whisper directory (e.g. a large-v3 conversion; none: no WER/CER, the rest is
    # scored); nothing is downloaded by default
    asr_model: str | None = opt(None, "local CTranslate2 Whisper directory (none: no WER/CER)", panel=ASR,
                                metavar="DIR",
                                envvar="COSYCLONE_ASR_MODEL", commands=(EVAL,))
    # let --asr-model name a model that faster-whisper downloads
    asr_download: bool = opt(False, "allow --asr-model to name a model faster-whisper downloads", panel=ASR,
                             commands=(EVAL,))
    # one language for every row (None: from the row's text, else detected by the ASR)
    language: str | None = opt(None, "one language for every row (default: per row)", panel=ASR,
                               metavar="LANG", commands=(EVAL,))
    # where CTranslate2 runs
    asr_device: AsrDevice = opt("auto", "auto | cpu | cuda", panel=ASR, metavar="DEV", commands=(EVAL,))
    # CTranslate2's compute type (auto: int8 on CPU, the weights' precision on GPU)
    compute_type: str = opt("auto", "CTranslate2 compute type (auto)", panel=ASR, metavar="TYPE",
                            commands=(EVAL,))
    # the ASR's beam width
    beam_size: int = opt(5, "ASR beam width (5)", panel=ASR, low=1, metavar="N", commands=(EVAL,))
    # rows per ASR call
    asr_batch_size: int = opt(8, "rows per ASR call (8)", panel=ASR, low=1, metavar="N", commands=(EVAL,))
    # resemblyzer | campplus | none, repeatable; the first is the one --min-similarity reads
    speaker_model: list[str] | None = opt(None, "resemblyzer | campplus | none; repeatable (resemblyzer)",
                                          panel=SPEAKER, metavar="NAME", commands=(EVAL,))
    # the CosyVoice3 model directory (campplus.onnx, for --speaker-model campplus)
    model_dir: Path | None = opt(None, "model folder (campplus.onnx for --speaker-model campplus)",
                                 panel=SPEAKER, metavar="DIR", commands=(EVAL,))
    # score DNSMOS (the speechmos wheel's ONNX models)
    dnsmos: bool = opt(True, "score DNSMOS (P.835, P.808)", panel=QUALITY, flag="--dnsmos/--no-dnsmos",
                       commands=(EVAL,))
    # rows above this error rate (WER; CER for zh/ja) fail
    max_wer: float | None = opt(None, "rows above this WER (CER for zh/ja) fail", panel=THRESHOLDS, low=0.0,
                                metavar="X", commands=(EVAL,))
    # rows below this speaker similarity fail
    min_similarity: float | None = opt(None, "rows below this similarity fail", panel=THRESHOLDS,
                                       metavar="X", commands=(EVAL,))
    # rows with more leading or trailing silence (seconds) fail
    max_silence: float | None = opt(None, "rows with more edge silence (s) fail", panel=THRESHOLDS, low=0.0,
                                    metavar="S", commands=(EVAL,))
    # rows with a larger fraction of clipped samples fail
    max_clipping: float | None = opt(None, "rows with a larger clipped fraction fail", panel=THRESHOLDS,
                                     low=0.0, high=1.0, metavar="F", commands=(EVAL,))
    # rows below this DNSMOS OVRL fail (Emilia-Pipe keeps 3.0 and above)
    min_dnsmos: float | None = opt(None, "rows below this DNSMOS OVRL fail", panel=THRESHOLDS, low=1.0,
                                   high=5.0, metavar="X", commands=(EVAL,))
    # rows whose seconds per character lie outside their language's IQR fences fail
    rate_outliers: bool = opt(False, "rows with a speaking rate outside their language's fences fail",
                              panel=THRESHOLDS, commands=(EVAL,))
    # also put the rows that failed or are missing in redo.jsonl
    redo_unsynthesized: bool = opt(False, "also redo failed / missing rows", panel=REDO, commands=(EVAL,))
    # reuse the previous eval's transcript of a WAV whose bytes did not change
    reuse_transcripts: bool = opt(True, "reuse the transcript of an unchanged WAV", panel=REDO,
                                  flag="--reuse-transcripts/--no-reuse-transcripts", commands=(EVAL,))

    def __post_init__(self) -> None:
        check(self)

    @property
    def speakers(self) -> tuple[str, ...]:
        """The speaker encoders to run, in the order given (``none`` alone: no similarity)."""
        return tuple(s for s in (self.speaker_model or ["resemblyzer"]) if s != "none")
