"""``cosyclone eval``: score every synthesized row of a folder, write scores.jsonl, the summary and
redo.jsonl.

One pass over the manifest's rows in batches of the ASR batch size: read the WAVs, run the signal
checks, transcribe the batch (without ``--asr-model``: no transcript, no WER/CER), score
DNSMOS (:mod:`cosyclone.eval.dnsmos`), the text and the speaking rate, embed prompt and output
with each speaker backend; then flag the speaking rates against each language's rows
(:mod:`cosyclone.eval.rate`) and judge every row against the thresholds. A row that cannot be
scored (unreadable WAV, a backend error) gets an ``error`` record and the others go on; rows the
folder has no audio for get a ``skipped`` record naming why (each an
:class:`~cosyclone.eval.record.EvalRecord`). Nothing is downloaded and nothing in the folder but
``scores.jsonl``, ``scores_summary.json`` and (with thresholds) ``redo.jsonl`` is written (names
:mod:`cosyclone.folder.scores` chooses so that the folder still loads as an audiofolder dataset; an
older ``eval.jsonl`` is read, then replaced).

Transcripts are reused from the folder's previous scores when the WAV's sha256 and the ASR
key (model hashes, decoding options, language hint) are unchanged: in a nightly
synth -> eval -> synth redo -> eval loop only the redone rows are transcribed again. DNSMOS
scores are reused the same way (same file, same ONNX models).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cosyclone.base.atomic import write_atomic
from cosyclone.base.version import __version__
from cosyclone.errors import CosycloneError
from cosyclone.eval.asr import AsrOptions, Transcript, WhisperASR
from cosyclone.eval.audio_checks import AudioCheckOptions, check_audio
from cosyclone.eval.dnsmos import Dnsmos
from cosyclone.eval.folder import Folder, FolderRow, read_folder
from cosyclone.eval.metrics import infer_language, score
from cosyclone.eval.rate import flag_rates, rate_fields
from cosyclone.eval.record import EvalRecord, unknown_fields
from cosyclone.eval.redo import REDO_NAME, current_seed, redo_seed, write_redo
from cosyclone.eval.speaker import SpeakerEncoder, build_encoder, cosine
from cosyclone.eval.summary import summarize, write_summary
from cosyclone.eval.thresholds import Thresholds, failures
from cosyclone.folder.layout import iter_jsonl
from cosyclone.folder.scores import SCORES_NAME, remove_legacy, scores_path

EVAL_NAME = SCORES_NAME  # the records' file (docs and scripts name it; an older folder's is eval.jsonl)
ASR_RATE = 16000
BATCH_WITHOUT_ASR = 16  # rows read and scored together when no ASR batch size applies
DNSMOS_FIELDS = ("dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl", "dnsmos_p808")


@dataclass(frozen=True)
class EvalOptions:
    """What ``cosyclone eval`` measures and how it judges."""

    asr: AsrOptions | None  # the ASR model and its decoding options (None: no WER/CER)
    speaker_models: tuple[str, ...] = ("resemblyzer",)  # speaker backends, in order (first = thresholded)
    model_dir: Path | None = None  # CosyVoice3 model directory (for the campplus backend)
    thresholds: Thresholds = Thresholds()  # what a good row stays within (redo.jsonl when any is set)
    audio: AudioCheckOptions = AudioCheckOptions()  # silence / clipping detector settings
    redo_unsynthesized: bool = False  # also list rows that failed or are missing in redo.jsonl
    reuse_transcripts: bool = True  # reuse the previous scores' transcript of an unchanged WAV
    dnsmos: bool = True  # score DNSMOS (speechmos's ONNX models)
    language: str | None = None  # one language for every row without ASR (with it: the ASR options')


@dataclass
class EvalResult:
    """The records written, the summary, and where redo.jsonl went (None without thresholds)."""

    records: list[EvalRecord]  # one per valid manifest row, manifest order
    summary: dict[str, Any]  # what scores_summary.json holds
    redo_path: Path | None = None  # OUT/redo.jsonl when thresholds were given
    redo_ids: list[str] = field(default_factory=list)  # the rows it lists, manifest order


def _read_wave(path: Path) -> tuple[np.ndarray, int]:
    import soundfile as sf

    data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    return (data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]).astype(np.float32), int(sr)


def _to_16k(wave: np.ndarray, sr: int) -> np.ndarray:
    import torch

    from cosyclone.frontend.audio import resample

    x = np.nan_to_num(wave, nan=0.0, posinf=1.0, neginf=-1.0)
    if sr == ASR_RATE:
        return np.ascontiguousarray(x, dtype=np.float32)
    return resample(torch.from_numpy(np.ascontiguousarray(x)), sr, ASR_RATE).numpy().astype(np.float32)


def _previous(out_dir: Path) -> dict[str, dict[str, Any]]:
    """The previous scores' records by id (empty when there are none)."""
    path = scores_path(out_dir)
    found: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return found
    for obj in iter_jsonl(path):  # the run folder's reader: lines end at \n only, torn ones skipped
        if isinstance(obj.get("id"), str):
            found[obj["id"]] = obj
    return found


def _asr_key(asr_info: dict[str, Any], hint: str | None) -> str:
    core = {k: asr_info.get(k) for k in ("backend", "model", "sha256", "beam_size", "compute_type", "device",
                                         "language")}
    blob = json.dumps({"asr": core, "hint": hint}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


class _Scorer:
    """The loaded models and caches of one eval run (``asr`` None: no WER/CER; ``dnsmos`` None: no DNSMOS)."""

    def __init__(self, options: EvalOptions, models: Models, previous: dict[str, dict[str, Any]],
                 out_dir: Path) -> None:
        self.options, self.previous, self.out_dir = options, previous, out_dir
        self.asr, self.encoders, self.dnsmos = models.asr, list(models.encoders), models.dnsmos
        self.asr_info = self.asr.info() if self.asr is not None else None
        self.models = {"asr": self.asr_info, "speaker": {e.name: e.info() for e in self.encoders},
                       "dnsmos": self.dnsmos.info() if self.dnsmos is not None else None}
        self.backend = options.thresholds.similarity_backend or (
            self.encoders[0].name if self.encoders else None
        )
        self._prompt_cache: dict[tuple[str, str], np.ndarray] = {}
        self.reused = 0
        self.dnsmos_reused = 0
        self.language = options.asr.language if options.asr is not None else options.language

    def prompt_embedding(self, enc: SpeakerEncoder, path: Path) -> np.ndarray:
        key = (enc.name, str(path))
        if key not in self._prompt_cache:
            wave, sr = _read_wave(path)
            self._prompt_cache[key] = enc.embed(_to_16k(wave, sr))
        return self._prompt_cache[key]

    def batch(self, rows: Sequence[FolderRow]) -> list[dict[str, Any]]:
        """Score a batch of rows that have audio (one ASR call and one DNSMOS pass for those not reused)."""
        records: list[dict[str, Any]] = []
        waves: list[np.ndarray | None] = []
        for frow in rows:
            rec = _base_record(frow, self.out_dir)
            try:
                data = frow.wav.read_bytes()
                rec["wav_sha256"] = hashlib.sha256(data).hexdigest()
                wave, sr = _read_wave(frow.wav)
                rec.update(check_audio(wave, sr, self.options.audio).to_dict())
                waves.append(_to_16k(wave, sr))
            except Exception as exc:  # unreadable or truncated WAV: this row only
                rec.update(status="error", error=f"cannot read {frow.wav}: {type(exc).__name__}: {exc}")
                waves.append(None)
            records.append(rec)
        hints = [infer_language(f.row.text) for f in rows]
        transcripts = self._transcripts(records, waves, hints) if self.asr is not None else {}
        if self.dnsmos is not None:
            self._dnsmos(records, waves)
        for i, (frow, rec) in enumerate(zip(rows, records, strict=True)):
            if rec["status"] == "error" or (self.asr is not None and i not in transcripts):
                continue
            try:
                self._score_row(frow, rec, transcripts.get(i), waves[i], hints[i])  # type: ignore[arg-type]
            except Exception as exc:  # a backend error on one row
                rec.update(status="error", error=f"{type(exc).__name__}: {exc}")
        return records

    def _transcripts(self, records: list[dict[str, Any]], waves: list[np.ndarray | None],
                     hints: list[tuple[str | None, str]]) -> dict[int, Transcript]:
        """Each readable row's transcript: the previous one for an unchanged file, else one ASR call."""
        assert self.asr is not None and self.asr_info is not None
        todo: list[int] = []
        transcripts: dict[int, Transcript] = {}
        for i, (rec, (hint, _)) in enumerate(zip(records, hints, strict=True)):
            if waves[i] is None:
                continue
            rec["asr_key"] = _asr_key(self.asr_info, self.language or hint)
            prev = self.previous.get(rec["id"]) if self.options.reuse_transcripts else None
            if (prev and prev.get("wav_sha256") == rec["wav_sha256"] and prev.get("asr_key") == rec["asr_key"]
                    and isinstance(prev.get("transcript"), str)):
                transcripts[i] = Transcript(
                    prev["transcript"],
                    str(prev.get("asr_language")),
                    str(prev.get("asr_language_source")),
                    prev.get("asr_language_probability"),
                )
                rec["transcript_reused"] = True
                self.reused += 1
            else:
                todo.append(i)
        if todo:
            try:
                got = self.asr.transcribe([waves[i] for i in todo],  # type: ignore[misc]
                                          [self.language or hints[i][0] for i in todo])
                transcripts.update(zip(todo, got, strict=True))
            except Exception as exc:  # an ASR failure fails the rows of this batch, not the run
                for i in todo:
                    records[i].update(status="error", error=f"asr: {type(exc).__name__}: {exc}")
        return transcripts

    def _dnsmos(self, records: list[dict[str, Any]], waves: list[np.ndarray | None]) -> None:
        """DNSMOS of each readable, non-empty row: the previous scores of an unchanged file under the
        same models, else one batched pass over the rest."""
        assert self.dnsmos is not None
        todo: list[int] = []
        for i, rec in enumerate(records):
            wave = waves[i]
            if rec["status"] == "error" or wave is None or wave.size == 0:
                continue
            prev = self.previous.get(rec["id"])
            if (prev and prev.get("wav_sha256") == rec["wav_sha256"] and prev.get("dnsmos_ovrl") is not None
                    and (prev.get("models") or {}).get("dnsmos") == self.models["dnsmos"]):
                rec.update({k: prev.get(k) for k in DNSMOS_FIELDS})
                self.dnsmos_reused += 1
            else:
                todo.append(i)
        if not todo:
            return
        try:
            got = self.dnsmos.score([waves[i] for i in todo])  # type: ignore[misc]
        except Exception as exc:  # a model failure fails the rows of this batch, not the run
            for i in todo:
                records[i].update(status="error", error=f"dnsmos: {type(exc).__name__}: {exc}")
            return
        for i, sc in zip(todo, got, strict=True):
            records[i].update(dnsmos_sig=sc.sig, dnsmos_bak=sc.bak, dnsmos_ovrl=sc.ovrl, dnsmos_p808=sc.p808)

    def _score_row(self, frow: FolderRow, rec: dict[str, Any], tr: Transcript | None, wave16: np.ndarray,
                   hint: tuple[str | None, str]) -> None:
        forced = self.language
        language, source = (forced, "forced") if forced else hint
        if language is None and tr is not None:
            language, source = tr.language, f"asr ({tr.language_source})"
        rec.update(language=language, language_source=source if language is not None else None)
        if tr is not None:
            s = score(frow.row.text, tr.text, language)
            rec.update(transcript=tr.text, asr_language=tr.language, asr_language_source=tr.language_source,
                       asr_language_probability=tr.language_probability, metric=s.metric,
                       reference_norm=s.reference, transcript_norm=s.hypothesis, wer=s.wer, cer=s.cer,
                       error_rate=s.error_rate, similarity_ratio=s.similarity_ratio, ref_words=s.ref_words,
                       word_edits=s.word_edits, ref_chars=s.ref_chars, char_edits=s.char_edits)
        rec.update(rate_fields(frow.row.text, language, rec))
        sims: dict[str, float] = {}
        for enc in self.encoders:
            sims[enc.name] = cosine(
                self.prompt_embedding(enc, Path(frow.row.prompt_audio)), enc.embed(wave16)
            )
        rec["speaker_similarity"] = sims
        rec["models"] = self.models


def _base_record(frow: FolderRow, out_dir: Path) -> dict[str, Any]:
    """The fields every record of ``frow`` has, as the dict the scoring fills in (an :class:`EvalRecord` at
    the end)."""
    wav = frow.wav.relative_to(out_dir).as_posix() if frow.wav.is_relative_to(out_dir) else str(frow.wav)
    return {"id": frow.row.id, "line": frow.row.line, "status": "ok", "seed": current_seed(frow), "wav": wav,
            "text": frow.row.text, "mode": frow.row.mode, "prompt_audio": str(frow.row.prompt_audio)}


@dataclass(frozen=True)
class Models:
    """The models one eval scores with (tests share one loaded set across evals)."""

    asr: WhisperASR | None  # None: no --asr-model, WER/CER are skipped
    encoders: Sequence[SpeakerEncoder]  # the speaker backends, in order
    dnsmos: Dnsmos | None = None  # None: DNSMOS is off


def load_models(options: EvalOptions) -> Models:
    """The models ``options`` name (raises CosycloneError on bad input)."""
    if options.thresholds.min_similarity is not None and not options.speaker_models:
        raise CosycloneError("--min-similarity needs a speaker model (--speaker-model resemblyzer|campplus)")
    if options.thresholds.max_wer is not None and options.asr is None:
        raise CosycloneError("--max-wer needs an ASR model (--asr-model DIR)")
    if options.thresholds.min_dnsmos is not None and not options.dnsmos:
        raise CosycloneError("--min-dnsmos needs DNSMOS (drop --no-dnsmos)")
    if len(set(options.speaker_models)) != len(options.speaker_models):
        raise CosycloneError("--speaker-model lists a backend twice")
    encoders = [build_encoder(name, model_dir=options.model_dir) for name in options.speaker_models]
    b = options.thresholds.similarity_backend
    if b is not None and b not in options.speaker_models:
        raise CosycloneError(
            f"--similarity-backend {b} is not among --speaker-model {list(options.speaker_models)}"
        )
    asr = WhisperASR(options.asr) if options.asr is not None else None
    return Models(asr=asr, encoders=encoders, dnsmos=Dnsmos() if options.dnsmos else None)


def evaluate(out_dir: str | Path, manifest: str | Path, options: EvalOptions, *,
             models: Models | None = None, progress: Callable[[int], None] | None = None) -> EvalResult:
    """Score the folder, write scores.jsonl + scores_summary.json (+ redo.jsonl with thresholds).

    ``models`` are loaded from ``options`` unless given (tests share one loaded set).
    """
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    folder = read_folder(out_dir, manifest)
    scorer = _Scorer(options, models or load_models(options), _previous(out_dir), out_dir)
    by_id: dict[str, dict[str, Any]] = {}
    scorable = [f for f in folder.rows if f.skip is None]
    bs = max(1, options.asr.batch_size if options.asr is not None else BATCH_WITHOUT_ASR)
    for start in range(0, len(scorable), bs):
        batch = scorable[start:start + bs]
        for rec in scorer.batch(batch):
            by_id[rec["id"]] = rec
        if progress is not None:
            progress(len(batch))
    records = []
    for frow in folder.rows:
        found = by_id.get(frow.row.id)
        rec = found if found is not None else _base_record(frow, out_dir)
        if found is None:
            rec.update(status="skipped", skip_reason=frow.skip,
                       synth_error=frow.record.error if frow.record is not None else None)
        elif rec["status"] == "error":
            rec["models"] = scorer.models
        records.append(rec)
    flag_rates(records)
    for rec in records:
        if rec["status"] == "ok":
            rec["fails"] = failures(rec, options.thresholds, scorer.backend)
    return _finish(out_dir, folder, records, options, scorer, time.perf_counter() - t0)


def _finish(out_dir: Path, folder: Folder, records: list[dict[str, Any]], options: EvalOptions,
            scorer: _Scorer, wall: float) -> EvalResult:
    t = options.thresholds
    redo_rows: list[FolderRow] = []
    if t.any:
        for frow, rec in zip(folder.rows, records, strict=True):
            bad = (rec["status"] == "ok" and rec.get("fails")) or (
                options.redo_unsynthesized and rec["status"] == "skipped")
            if bad:
                rec["redo_seed"] = redo_seed(frow.row.id, current_seed(frow))
                redo_rows.append(frow)
    typed = [_typed(rec) for rec in records]
    path = out_dir / SCORES_NAME
    lines = (json.dumps(one.to_json(), ensure_ascii=False, sort_keys=True) + "\n" for one in typed)
    write_atomic(path, (line.encode("utf-8") for line in lines))
    redo_path = write_redo(out_dir, redo_rows) if t.any else None
    extra = {"out_dir": str(out_dir), "manifest": str(folder.manifest), "invalid_rows": len(folder.invalid),
             "not_in_manifest": len(folder.unknown_ids), "transcripts_reused": scorer.reused,
             "dnsmos_reused": scorer.dnsmos_reused,
             "asr_skipped": scorer.asr is None,
             "redo": {"path": REDO_NAME, "rows": len(redo_rows)} if redo_path is not None else None,
             "models": scorer.models, "wall_seconds": wall, "cosyclone": __version__}
    summary = summarize([one.to_json() for one in typed], thresholds=t, backend=scorer.backend, extra=extra)
    write_summary(out_dir, summary)
    remove_legacy(out_dir)  # both files are written under their new names
    return EvalResult(records=typed, summary=summary, redo_path=redo_path,
                      redo_ids=[f.row.id for f in redo_rows])


def _typed(rec: dict[str, Any]) -> EvalRecord:
    """The scoring's dict as its declared record (a key it set that the record lacks is a bug here)."""
    assert not unknown_fields(rec), f"EvalRecord does not declare {unknown_fields(rec)}"
    typed = EvalRecord.from_json(rec)
    assert typed is not None
    return typed
