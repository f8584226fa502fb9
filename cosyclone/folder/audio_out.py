"""What a row's audio becomes on disk: silence trimmed, resampled, encoded as WAV or FLAC.

Why one module: the sample rate, the container, the sample encoding and the trim all change the
bytes of a row's file, so they travel together (:class:`AudioOutput`) into the fingerprint and the
record, and :func:`process` is the one way from the model's samples to a file's bytes. The order is
fixed and matters:

1. **trim** (:func:`trim_silence`, only with ``trim_silence``) at the model's own rate, so the
   seconds it cut are in the model's time base whatever rate is written;
2. **resample** (:func:`resample`, libsoxr) to ``sample_rate``; the model's rate is left untouched,
   so the default output is byte for byte what cosyclone always wrote;
3. **encode** (:func:`encode`): WAV by the hand-written encoder below (libsndfile puts the time of
   writing into float WAVs), FLAC by libsndfile (checked deterministic: its only variable block is
   libFLAC's vendor string, a version, not a time).

Every step is deterministic on one machine: the same samples give the same bytes. libsoxr picks
its SIMD kernels by CPU, so a resampled float sample may differ in its last bits between machines,
as torch's kernels already do (the fingerprint leaves the machine out; PCM16 absorbs the gap).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, get_args

import numpy as np

from cosyclone.base.version import __version__
from cosyclone.errors import CosycloneError
from cosyclone.folder.row_record import FileFacts
from cosyclone.options import AudioEncoding as Encoding
from cosyclone.options import AudioFormat, FolderOptions

SOFTWARE = f"cosyclone {__version__}"  # the software a tagged file names (WAV ISFT, FLAC's software comment)
MODEL_RATE = 24000  # CosyVoice3's HiFT writes 24 kHz: the default, written without resampling
MIN_RATE, MAX_RATE = 8000, 48000  # telephone band to studio rate; outside it nothing sensible is asked
SUFFIXES: dict[str, str] = {"wav": ".wav", "flac": ".flac"}  # the one definition of a format's file suffix
FLAGS = {"sample_rate": "--sample-rate", "format": "--audio-format", "encoding": "--audio-encoding",
         "trim_silence": "--trim-silence"}  # how the CLI names each field (errors name the flag)

# The trim rule (see trim_silence): 10 ms frames, silent below -40 dBFS, 100 ms kept beside speech.
TRIM_FRAME_S = 0.010
TRIM_LEVEL_DB = -40.0
TRIM_MARGIN_S = 0.100
RESAMPLE_QUALITY = "VHQ"  # libsoxr's very high quality: passband to 95 % of Nyquist, > 170 dB stopband


@dataclass(frozen=True)
class AudioOutput:
    """How a row's audio is written; every field changes the file, so all of them go into the fingerprint."""

    sample_rate: int = MODEL_RATE
    # Hz of the written file (8000-48000); the model's 24000 means no resampling
    format: AudioFormat = "wav"  # container: wav (RIFF, hand-written) | flac (lossless, about half the size)
    encoding: Encoding = "pcm16"  # samples: pcm16 | pcm24 | float (32-bit IEEE, wav only: FLAC has no float)
    trim_silence: bool = False  # cut leading/trailing silence (TRIM_LEVEL_DB), keeping TRIM_MARGIN_S
    tag: str | None = None  # the provenance statement each file carries (WAV INFO ICMT, FLAC COMMENT); None:
    # no tag (--no-provenance-tag, or a caller that states none)

    def __post_init__(self) -> None:
        check_output(self)

    @property
    def suffix(self) -> str:
        """The file suffix of this output's files (``.wav`` / ``.flac``)."""
        return SUFFIXES[self.format]

    @property
    def is_default(self) -> bool:
        """True for the output cosyclone always wrote (24 kHz PCM16 WAV, untrimmed; the tag aside)."""
        return replace(self, tag=None) == AudioOutput()

    def fingerprint_values(self) -> dict[str, Any]:
        """This output's entries in a row fingerprint's ``options`` part.

        ``float_wav`` as runs have always recorded it, and each other field only where it differs from
        the default: a folder written before these options keeps its fingerprints (no row redone by an
        upgrade), while a rerun at another rate, format, encoding or trim redoes every row. A run without
        the provenance tag (``--no-provenance-tag``) adds ``provenance_tag: false``: its files' bytes differ,
        so switching the tag off (or on again) redoes every row; the statement's text itself is made of
        the model files' hashes and the talker, which the fingerprint holds already.
        """
        values: dict[str, Any] = {"float_wav": self.encoding == "float"}
        for key, value, default in (
            ("sample_rate", self.sample_rate, MODEL_RATE),
            ("audio_format", self.format, "wav"),
            ("audio_encoding", self.encoding if self.encoding == "pcm24" else "pcm16", "pcm16"),
            ("trim_silence", self.trim_silence, False),
        ):
            if value != default:
                values[key] = value
        if self.tag is None:
            values["provenance_tag"] = False
        return values

    @classmethod
    def of(cls, folder: FolderOptions, tag: str | None = None) -> AudioOutput:
        """The output a run's folder options ask for (``--float-wav`` is ``--audio-encoding float``), its
        files tagged with ``tag`` unless ``--no-provenance-tag``."""
        encoding: Encoding = "float" if folder.float_wav else folder.audio_encoding
        return cls(sample_rate=folder.sample_rate, format=folder.audio_format, encoding=encoding,
                   trim_silence=folder.trim_silence, tag=None if folder.no_provenance_tag else tag)

    @classmethod
    def for_file(cls, path: Path, folder: FolderOptions, tag: str | None = None) -> AudioOutput:
        """The output for one named file (``say -o``): a ``.flac`` name writes FLAC, and a name whose
        suffix says another container than ``--audio-format`` is refused, so a file's bytes are
        always what its name says (a ``.flac`` file holding WAV bytes fools players and datasets)."""
        suffix = path.suffix.lower()
        named = next((fmt for fmt, suf in SUFFIXES.items() if suf == suffix), None)
        if named == "flac" and folder.audio_format == "wav":  # the name chooses; wav is only the default
            if folder.float_wav or folder.audio_encoding == "float":
                raise CosycloneError(f"-o {path.name} names a FLAC file, which stores integer samples only: "
                                     f"give {FLAGS['encoding']} pcm16 or pcm24, or name a .wav file")
            return cls.of(replace(folder, audio_format="flac"), tag)
        if named is not None and named != folder.audio_format:
            raise CosycloneError(f"-o {path.name} names a {named.upper()} file, but {FLAGS['format']} "
                                 f"{folder.audio_format} writes {folder.audio_format.upper()}: name it "
                                 f"{path.stem}{SUFFIXES[folder.audio_format]}")
        return cls.of(folder, tag)

    def as_record(self) -> dict[str, Any]:
        """What a run records of its output (runs.jsonl ``output``)."""
        return {"sample_rate": self.sample_rate, "audio_format": self.format, "audio_encoding": self.encoding,
                "trim_silence": self.trim_silence, "float_wav": self.encoding == "float",
                "provenance_tag": self.tag is not None}


def check_output(out: AudioOutput) -> None:
    """Refuse an output no file can have, naming the flag (:class:`CosycloneError`)."""
    rate = out.sample_rate
    if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
        raise CosycloneError(f"{FLAGS['sample_rate']} must be a whole number of Hz from {MIN_RATE} to "
                             f"{MAX_RATE}, not {rate!r}")
    if out.format not in SUFFIXES:
        raise CosycloneError(f"{FLAGS['format']} must be one of {', '.join(SUFFIXES)}, not {out.format!r}")
    if out.encoding not in get_args(Encoding):
        raise CosycloneError(f"{FLAGS['encoding']} must be one of {', '.join(get_args(Encoding))}, "
                             f"not {out.encoding!r}")
    if out.format == "flac" and out.encoding == "float":
        raise CosycloneError(f"{FLAGS['format']} flac stores integer samples only: give "
                             f"{FLAGS['encoding']} pcm16 or pcm24 (float needs {FLAGS['format']} wav)")


# ----------------------------------------------------------------------------- samples

def resample(wav: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """``wav`` (N,) float32 from ``src_rate`` to ``dst_rate`` Hz: ``round(N * dst / src)`` samples.

    libsoxr at VHQ (its linear-phase, very high quality filter): the passband is flat to 95 % of
    the lower Nyquist and what lies above the new Nyquist is attenuated by more than 170 dB, far
    below a PCM24 step, so nothing aliases into the band people train on. Equal rates return
    ``wav`` itself, untouched: the default output never passes through a filter.
    """
    if src_rate == dst_rate:
        return wav
    import soxr

    x = np.ascontiguousarray(wav, dtype=np.float32).reshape(-1)
    want = int(round(x.size * dst_rate / src_rate))
    if x.size == 0:
        return np.zeros(0, dtype=np.float32)
    y = np.asarray(soxr.resample(x, src_rate, dst_rate, quality=RESAMPLE_QUALITY), dtype=np.float32)
    if y.size != want:  # libsoxr rounds the same way today; the length is a contract, so it is pinned here
        y = np.pad(y, (0, want - y.size)) if y.size < want else y[:want]
    return y


def frame_levels_db(wav: np.ndarray, rate: int, frame_s: float = TRIM_FRAME_S) -> tuple[np.ndarray, int]:
    """(RMS in dBFS of each ``frame_s`` frame, the frame length in samples); the last frame is over
    its real samples only, as eval measures silence."""
    x = np.asarray(wav, dtype=np.float64).reshape(-1)
    frame = max(1, int(round(rate * frame_s)))
    n_frames = -(-x.size // frame)
    padded = np.zeros(n_frames * frame)
    padded[:x.size] = x
    counts = np.full(n_frames, float(frame))
    if n_frames:
        counts[-1] = x.size - (n_frames - 1) * frame
    power = (padded.reshape(n_frames, frame) ** 2).sum(axis=1) / counts
    return 10.0 * np.log10(np.maximum(power, 1e-30)), frame


def trim_silence(wav: np.ndarray, rate: int, *, level_db: float = TRIM_LEVEL_DB,
                 margin_s: float = TRIM_MARGIN_S) -> tuple[np.ndarray, float, float]:
    """Cut leading and trailing silence: (kept samples, seconds cut before, seconds cut after).

    The rule: ``wav`` is cut into 10 ms frames from its first sample; a frame is loud when its RMS
    reaches ``level_db`` dBFS (relative to full scale, 1.0). Everything before the first loud frame
    and after the last one is silence; of it, ``margin_s`` next to the speech is kept, the rest cut.

    Why -40 dBFS: CosyVoice3 speech peaks near 0.5-0.9 of full scale and its voiced frames sit
    around -10 to -30 dBFS, while the vocoder's output between words and before the first one is
    low-level noise well under -40; it is also the level ``cosyclone eval`` calls silence
    (``AudioCheckOptions.silence_db``), so a trimmed row measures at most the margin of silence
    there. Why a 100 ms margin: a word's soft onset (a breathy /h/, a weak /f/) and a final
    consonant's decay can fall under the level for a few frames; 100 ms keeps them and leaves a
    natural pause at each end for models that learn where speech starts.

    A row with no loud frame (all silence, or empty) is returned whole with 0.0 cut: a row is never
    trimmed to nothing, and eval's ``all_silent`` still finds it. The samples kept are a view of
    ``wav``; trimming runs at the model's rate, before any resampling.
    """
    x = np.asarray(wav).reshape(-1)
    if x.size == 0:
        return x, 0.0, 0.0
    levels, frame = frame_levels_db(x, rate)
    loud = np.flatnonzero(levels >= level_db)
    if loud.size == 0:
        return x, 0.0, 0.0
    margin = int(round(margin_s * rate))
    start = max(0, int(loud[0]) * frame - margin)
    end = min(x.size, (int(loud[-1]) + 1) * frame + margin)
    return x[start:end], start / float(rate), (x.size - end) / float(rate)


# ----------------------------------------------------------------------------- encoding

PCM_SCALE = {16: 32767.0, 24: 8388607.0}  # symmetric scaling: +1.0 and -1.0 map to +-full scale - 1


def pcm_ints(wav: np.ndarray, bits: int) -> np.ndarray:
    """Samples (clipped to [-1, 1]) as integers of ``bits`` bits: ``round(x * (2**(bits-1) - 1))``;
    int16 for 16 bits, int32 holding the 24-bit value for 24."""
    data = np.clip(np.asarray(wav, dtype=np.float32).reshape(-1), -1.0, 1.0)
    if bits == 16:  # in float32, as cosyclone always quantized (the PCM16 bytes stay what they were)
        ints: np.ndarray = np.rint(data * PCM_SCALE[16]).astype(np.int16)
    else:  # float32 lacks the steps of 24 bits
        ints = np.rint(data.astype(np.float64) * PCM_SCALE[bits]).astype(np.int32)
    return ints


def _finite(wav: np.ndarray) -> np.ndarray:
    data = np.asarray(wav, dtype=np.float32).reshape(-1)
    if not np.isfinite(data).all():
        raise ValueError(f"{int((~np.isfinite(data)).sum())} non-finite samples reached the writer "
                         "(the pipeline fails such rows or zeroes them under --nonfinite-audio zero)")
    return data


def info_chunk(tag: str) -> bytes:
    """A RIFF ``LIST``/``INFO`` chunk stating ``tag`` (``ICMT``, the comment) and the software (``ISFT``):
    what libsndfile (``soundfile``'s ``comment`` and ``software``), ffprobe and most editors show.

    Each value is NUL-terminated and word-aligned as RIFF asks; UTF-8 (the INFO fields have no declared
    encoding; libsndfile hands the bytes through). No date field: equal runs write equal bytes.
    """
    body = b"INFO"
    for key, value in ((b"ICMT", tag), (b"ISFT", SOFTWARE)):
        data = value.encode("utf-8", "replace") + b"\x00"
        body += key + struct.pack("<I", len(data)) + data + (b"\x00" if len(data) % 2 else b"")
    return b"LIST" + struct.pack("<I", len(body)) + body


def encode_wav(wav: np.ndarray, *, sample_rate: int, float_wav: bool = False, pcm_bits: int = 16,
               tag: str | None = None) -> bytes:
    """The WAV file's bytes: mono PCM16 (``round(x * 32767)``), PCM24 (``round(x * 8388607)``) or IEEE
    float32, samples clipped to [-1, 1].

    Written here rather than by libsndfile because its float files carry a PEAK chunk with the
    time of writing, so the same audio gave different bytes on every run. A non-finite sample is
    refused, never silently zeroed: the pipeline decides what NaN/inf audio means
    (``--nonfinite-audio``) and counts it per row. PCM16 and float bytes are those cosyclone has
    always written (tests pin their digests). ``tag`` (the provenance statement) goes in a ``LIST``/``INFO``
    chunk after the samples (:func:`info_chunk`), where readers that expect the samples at byte 44 still
    find them.
    """
    data = _finite(wav)
    if float_wav:
        # WAVE_FORMAT_IEEE_FLOAT
        body, fmt_tag, width = np.clip(data, -1.0, 1.0).astype("<f4").tobytes(), 3, 4
        fmt = struct.pack("<HHIIHHH", fmt_tag, 1, sample_rate, sample_rate * width, width, 8 * width, 0)
        extra = b"fact" + struct.pack("<II", 4, data.size)  # non-PCM formats carry a fact chunk
    else:
        if pcm_bits not in PCM_SCALE:
            raise ValueError(f"PCM WAVs hold 16 or 24 bits per sample, not {pcm_bits}")
        ints = pcm_ints(data, pcm_bits)
        if pcm_bits == 16:
            body = ints.astype("<i2").tobytes()
        else:  # the low three bytes of each little-endian int32
            body = ints.astype("<i4").view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
        fmt_tag, width = 1, pcm_bits // 8  # WAVE_FORMAT_PCM
        fmt = struct.pack("<HHIIHH", fmt_tag, 1, sample_rate, sample_rate * width, width, 8 * width)
        extra = b""
    if len(body) % 2:  # RIFF chunks are word-aligned: an odd PCM24 body gets one pad byte after it
        body_chunk = b"data" + struct.pack("<I", len(body)) + body + b"\x00"
    else:
        body_chunk = b"data" + struct.pack("<I", len(body)) + body
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra + body_chunk
    if tag is not None:
        chunks += info_chunk(tag)
    riff: bytes = b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks
    return riff


def encode_flac(wav: np.ndarray, *, sample_rate: int, pcm_bits: int = 16, tag: str | None = None) -> bytes:
    """The FLAC file's bytes (libsndfile/libFLAC), holding exactly the integers the WAV would hold.

    Quantized here, not by libsndfile, so a FLAC and a WAV of the same audio decode to the same
    samples. Deterministic: libFLAC's STREAMINFO carries the audio's MD5 and its vendor comment the
    library version, never a time. ``tag`` (the provenance statement) becomes the Vorbis comment
    ``COMMENT`` beside the software's name, which ``soundfile`` reads back as ``comment`` and ``software``.
    """
    import soundfile as sf

    if pcm_bits not in PCM_SCALE:
        raise ValueError(f"FLAC files hold 16 or 24 bits per sample here, not {pcm_bits}")
    ints = pcm_ints(_finite(wav), pcm_bits)
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", sample_rate, 1, format="FLAC", subtype=f"PCM_{pcm_bits}") as fh:
        if tag is not None:  # before the samples: libFLAC writes its metadata blocks first
            fh.comment, fh.software = tag, SOFTWARE
        # libsndfile reads an int32 sample's top 24 bits for PCM_24
        fh.write(ints if pcm_bits == 16 else ints.astype(np.int32) << 8)
    return buf.getvalue()


def encode(
    wav: np.ndarray, *, sample_rate: int, fmt: AudioFormat = "wav", encoding: Encoding = "pcm16",
    tag: str | None = None,
) -> bytes:
    """The bytes of a ``fmt`` file holding ``wav`` (N,) float32 at ``sample_rate`` as ``encoding``, stating
    ``tag`` (None: no tag)."""
    check_output(AudioOutput(sample_rate=MODEL_RATE, format=fmt, encoding=encoding))
    bits = 24 if encoding == "pcm24" else 16
    if fmt == "flac":
        return encode_flac(wav, sample_rate=sample_rate, pcm_bits=bits, tag=tag)
    return encode_wav(wav, sample_rate=sample_rate, float_wav=encoding == "float", pcm_bits=bits, tag=tag)


def process(wav: np.ndarray, *, model_rate: int, out: AudioOutput) -> tuple[bytes, FileFacts]:
    """A row's samples at ``model_rate`` into its file's bytes and the facts its record keeps (the
    file's name is the writer's to fill in).

    Trim (at the model's rate), resample, encode, in that order (module docstring). Raises
    ``ValueError`` for non-finite samples, as the writer always did.
    """
    lead = trail = 0.0
    x = np.asarray(wav, dtype=np.float32).reshape(-1)
    if out.trim_silence:
        x, lead, trail = trim_silence(x, model_rate)
    y = resample(x, model_rate, out.sample_rate)
    data = encode(y, sample_rate=out.sample_rate, fmt=out.format, encoding=out.encoding, tag=out.tag)
    facts = FileFacts(file=None, samples=int(y.size), sample_rate=out.sample_rate, audio_format=out.format,
                      encoding=out.encoding, trimmed_lead_seconds=lead, trimmed_trail_seconds=trail)
    return data, facts
