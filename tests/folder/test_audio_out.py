"""A row's audio on disk: the default output is byte for byte what cosyclone always wrote; resampling
keeps a tone's frequency and level and lets nothing alias; the trim cuts silence by its documented
rule and never speech; WAV and FLAC, PCM16 and PCM24 decode to the same integers and encode the
same audio to the same bytes."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from cosyclone.errors import CosycloneError
from cosyclone.eval.audio_checks import check_audio
from cosyclone.folder import audio_out
from cosyclone.folder.audio_out import AudioOutput, encode, process, resample, trim_silence
from cosyclone.folder.row_record import FileFacts

RATE = 24000


def fixture_signal() -> np.ndarray:
    """A tone pair with samples out of range, at full scale and near zero (the PCM16/float digests below)."""
    t = np.arange(2400) / RATE
    x = (0.8 * np.sin(2 * np.pi * 440 * t) + 0.3 * np.sin(2 * np.pi * 3000 * t)).astype(np.float32)
    x[:10] = [1.5, -1.5, 1.0, -1.0, 0.5, -0.5, 1e-6, -1e-6, 0, 0.99999]
    return x


def tone(freq: float, seconds: float, rate: int = RATE, amp: float = 0.5) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * freq * np.arange(int(round(seconds * rate))) / rate)).astype(np.float32)


def rms_db(x: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(np.asarray(x, np.float64) ** 2)) + 1e-30))


# ----------------------------------------------------------------------------- the default stays what it was

# sha256 of the fixture as the writer encoded it before this module existed (writer.encode_wav at 2214413)
PCM16_DIGEST = "fbb6fcef06d8adbae6de5d6d5a9ab9602fd89ff56210adb5b63a2c5d19cfa24e"
FLOAT_DIGEST = "c6ee45b0fdf944d42e3b76e9ec03e7155375a1eb3bb54af314f3b77ffb82de40"


def test_pcm16_and_float_wav_bytes_are_the_ones_cosyclone_always_wrote() -> None:
    x = fixture_signal()
    assert hashlib.sha256(encode(x, sample_rate=RATE)).hexdigest() == PCM16_DIGEST
    assert hashlib.sha256(encode(x, sample_rate=RATE, encoding="float")).hexdigest() == FLOAT_DIGEST


def test_the_default_output_is_the_model_audio_encoded_with_nothing_in_between() -> None:
    x = fixture_signal()
    assert resample(x, RATE, RATE) is x  # no filter on the default path
    data, facts = process(x, model_rate=RATE, out=AudioOutput())
    assert hashlib.sha256(data).hexdigest() == PCM16_DIGEST
    assert facts == FileFacts(
        file=None,
        samples=x.size,
        sample_rate=RATE,
        audio_format="wav",
        encoding="pcm16",
        trimmed_lead_seconds=0.0,
        trimmed_trail_seconds=0.0,
    )
    assert AudioOutput().is_default and not AudioOutput(sample_rate=16000).is_default


# ----------------------------------------------------------------------------- resampling

@pytest.mark.parametrize("dst", [8000, 16000, 22050, 44100, 48000])
def test_resampling_keeps_a_tones_frequency_and_level(dst: int) -> None:
    x = tone(1000.0, 1.0)
    y = resample(x, RATE, dst)
    assert y.dtype == np.float32 and y.size == round(x.size * dst / RATE)
    mid = slice(y.size // 10, y.size * 9 // 10)  # away from the ends, where the filter sees the cut
    reference = 0.5 * np.sin(2 * np.pi * 1000.0 * np.arange(y.size) / dst)  # the tone sampled at dst itself
    assert rms_db(y[mid] - reference[mid]) - rms_db(reference[mid]) < -120  # measured about -150 dB
    spectrum = np.abs(np.fft.rfft(y[mid] * np.hanning(y[mid].size)))
    assert np.fft.rfftfreq(y[mid].size, 1 / dst)[spectrum.argmax()] == pytest.approx(
        1000.0, abs=dst / y[mid].size
    )
    assert abs(rms_db(y[mid]) - rms_db(x)) < 0.01


@pytest.mark.parametrize(("dst", "freq"), [(8000, 6000.0), (16000, 10000.0)])
def test_nothing_above_the_new_nyquist_aliases_into_the_band(dst: int, freq: float) -> None:
    y = resample(tone(freq, 1.0), RATE, dst)
    assert rms_db(y[y.size // 10: -y.size // 10]) < -120  # a 0.5 tone that cannot exist at dst: gone


@pytest.mark.parametrize("n", [0, 1, 2, 479, 480, 24001, 36123])
@pytest.mark.parametrize("dst", [8000, 16000, 22050, 44100])
def test_resampled_length_is_the_rounded_ratio(n: int, dst: int) -> None:
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 0.1
    assert resample(x, RATE, dst).size == round(n * dst / RATE)


RESAMPLE_DIGEST_SNIPPET = ("import hashlib, numpy as np; from cosyclone.folder.audio_out import resample; "
                           "x = (np.random.default_rng(7).standard_normal(30011) * 0.2).astype(np.float32); "
                           "print(hashlib.sha256(resample(x, 24000, 16000).tobytes()).hexdigest())")


def test_resampling_is_deterministic_within_and_across_processes() -> None:
    x = (np.random.default_rng(7).standard_normal(30011) * 0.2).astype(np.float32)
    first = resample(x, RATE, 16000)
    assert resample(x.copy(), RATE, 16000).tobytes() == first.tobytes()
    root = Path(__file__).resolve().parents[2]
    other = subprocess.run([sys.executable, "-c", RESAMPLE_DIGEST_SNIPPET], cwd=root, capture_output=True,
                           text=True, check=True, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert other.stdout.strip() == hashlib.sha256(first.tobytes()).hexdigest()


# ----------------------------------------------------------------------------- trimming

def noise(seconds: float, level_db: float, seed: int = 0) -> np.ndarray:
    """Gaussian noise whose RMS is ``level_db`` dBFS: the vocoder's silence, roughly."""
    n = int(round(seconds * RATE))
    return (np.random.default_rng(seed).standard_normal(n) * 10 ** (level_db / 20)).astype(np.float32)


def test_trim_cuts_silence_below_the_level_and_keeps_the_margin() -> None:
    speech = tone(220.0, 1.0)
    row = np.concatenate([noise(0.83, -60.0), speech, noise(0.35, -60.0, seed=1)])
    kept, lead, trail = trim_silence(row, RATE)
    assert lead == pytest.approx(0.83 - audio_out.TRIM_MARGIN_S, abs=0.0101)  # whole 10 ms frames
    assert trail == pytest.approx(0.35 - audio_out.TRIM_MARGIN_S, abs=0.0101)
    assert kept.size == row.size - round((lead + trail) * RATE)
    assert np.shares_memory(kept, row) and np.array_equal(
        kept, row[round(lead * RATE) : round(lead * RATE) + kept.size]
    )
    measured = check_audio(kept, RATE)  # eval's silence figure on the trimmed row: about the margin
    assert measured.lead_silence_s <= audio_out.TRIM_MARGIN_S + 0.011
    assert measured.trail_silence_s <= audio_out.TRIM_MARGIN_S + 0.011


def test_a_soft_onset_inside_the_margin_is_kept() -> None:
    onset = noise(0.06, -45.0, seed=2)  # a breathy 60 ms start under the level, then the voice
    row = np.concatenate([noise(0.5, -70.0), onset, tone(300.0, 0.5)])
    kept, lead, _ = trim_silence(row, RATE)
    assert lead == pytest.approx(0.5 + 0.06 - audio_out.TRIM_MARGIN_S, abs=0.0101)
    onset_at = round(0.5 * RATE) - round(lead * RATE)  # where the onset lies in the kept samples
    assert np.array_equal(kept[onset_at: onset_at + onset.size], onset)


@pytest.mark.parametrize("row", [np.zeros(RATE, np.float32), noise(1.0, -55.0), np.zeros(0, np.float32)],
                         ids=["digital-zero", "noise-only", "empty"])
def test_an_all_silent_row_is_left_whole(row: np.ndarray) -> None:
    kept, lead, trail = trim_silence(row, RATE)
    assert kept.size == row.size and (lead, trail) == (0.0, 0.0)


def test_a_row_without_silence_or_with_less_than_the_margin_is_untouched() -> None:
    for row in (tone(440.0, 0.7), np.concatenate([noise(0.05, -70.0), tone(440.0, 0.7), noise(0.08, -70.0)])):
        kept, lead, trail = trim_silence(row, RATE)
        assert kept.size == row.size and (lead, trail) == (0.0, 0.0)


def test_trim_runs_at_the_model_rate_before_resampling() -> None:
    row = np.concatenate([noise(0.6, -60.0), tone(500.0, 1.0), noise(0.4, -60.0, seed=3)])
    out = AudioOutput(sample_rate=16000, format="flac", trim_silence=True)
    data, facts = process(row, model_rate=RATE, out=out)
    kept, lead, trail = trim_silence(row, RATE)
    # seconds of the model's time base
    assert (facts.trimmed_lead_seconds, facts.trimmed_trail_seconds) == (lead, trail)
    assert facts.samples == round(kept.size * 16000 / RATE) == sf.info(io.BytesIO(data)).frames
    assert facts.duration == pytest.approx(kept.size / RATE, abs=1e-4)


# ----------------------------------------------------------------------------- encodings

@pytest.mark.parametrize("encoding", ["pcm16", "pcm24"])
def test_flac_and_wav_hold_the_same_integers(encoding: str) -> None:
    x = np.concatenate([fixture_signal(), tone(700.0, 0.2)])
    flac = encode(x, sample_rate=16000, fmt="flac", encoding=encoding)  # type: ignore[arg-type]
    wav = encode(x, sample_rate=16000, fmt="wav", encoding=encoding)  # type: ignore[arg-type]
    info = sf.info(io.BytesIO(flac))
    assert (info.format, info.samplerate, info.frames) == ("FLAC", 16000, x.size)
    assert info.subtype == ("PCM_16" if encoding == "pcm16" else "PCM_24")
    from_flac, _ = sf.read(io.BytesIO(flac), dtype="int32")
    from_wav, _ = sf.read(io.BytesIO(wav), dtype="int32")
    assert np.array_equal(from_flac, from_wav)
    bits = 16 if encoding == "pcm16" else 24
    assert np.array_equal(from_wav >> (32 - bits), audio_out.pcm_ints(x, bits))
    assert len(flac) < len(wav)


@pytest.mark.parametrize("n", [1, 2401])  # odd PCM24 bodies get RIFF's pad byte
def test_pcm24_wav_reads_back_exactly(n: int) -> None:
    x = (np.random.default_rng(n).uniform(-1, 1, n)).astype(np.float32)
    data = encode(x, sample_rate=RATE, encoding="pcm24")
    info = sf.info(io.BytesIO(data))
    assert (info.subtype, info.frames) == ("PCM_24", n)
    back, _ = sf.read(io.BytesIO(data), dtype="float64")
    assert np.abs(back - x).max() <= 1.0 / 8388607  # one 24-bit step at most (scaling 2**23 - 1 vs 2**23)


@pytest.mark.parametrize(("fmt", "encoding"), [("flac", "pcm16"), ("flac", "pcm24"), ("wav", "pcm24")])
def test_the_same_audio_encodes_to_the_same_bytes(fmt: str, encoding: str) -> None:
    x = tone(330.0, 0.3)
    first = encode(x, sample_rate=RATE, fmt=fmt, encoding=encoding)  # type: ignore[arg-type]
    if (fmt, encoding) == ("flac", "pcm16"):
        time.sleep(1.05)  # a time stamp (whole seconds) would differ across this
    assert encode(x, sample_rate=RATE, fmt=fmt, encoding=encoding) == first  # type: ignore[arg-type]
    assert b"DATE" not in first.upper()


def test_non_finite_samples_are_refused_by_every_encoder() -> None:
    x = tone(330.0, 0.1)
    x[5] = np.nan
    for fmt in ("wav", "flac"):
        with pytest.raises(ValueError, match="1 non-finite"):
            encode(x, sample_rate=RATE, fmt=fmt)


# ----------------------------------------------------------------------------- options and paths

@pytest.mark.parametrize(("kwargs", "flag"), [
    ({"sample_rate": 7999}, "--sample-rate"), ({"sample_rate": 48001}, "--sample-rate"),
    ({"sample_rate": "16000"}, "--sample-rate"), ({"sample_rate": True}, "--sample-rate"),
    ({"format": "mp3"}, "--audio-format"), ({"encoding": "pcm8"}, "--audio-encoding"),
    ({"format": "flac", "encoding": "float"}, "--audio-format"),
])
def test_unusable_outputs_are_refused_naming_the_flag(kwargs: dict, flag: str) -> None:
    with pytest.raises(CosycloneError, match=flag):
        AudioOutput(**kwargs)


def test_float_wav_is_the_float_encoding_of_wav() -> None:
    from cosyclone.options import FolderOptions

    assert AudioOutput.of(FolderOptions(float_wav=True)) == AudioOutput(encoding="float")
    assert AudioOutput.of(FolderOptions(sample_rate=16000)) == AudioOutput(sample_rate=16000)
    with pytest.raises(CosycloneError, match="--float-wav is --audio-encoding float"):
        FolderOptions(float_wav=True, audio_encoding="pcm24")
    with pytest.raises(CosycloneError, match="--audio-format flac stores integer samples only"):
        FolderOptions(float_wav=True, audio_format="flac")
    with pytest.raises(CosycloneError, match="--sample-rate must be at least 8000"):
        FolderOptions(sample_rate=4000)
    assert (AudioOutput().suffix, AudioOutput(format="flac").suffix) == (".wav", ".flac")


def test_a_records_file_gives_only_the_suffix_of_its_audio_path(tmp_path: Path) -> None:
    from cosyclone.folder.layout import audio_path
    from cosyclone.folder.row_record import RowRecord

    def path(**fields: object) -> Path | None:
        rec = RowRecord.from_json({"id": "a", "status": "ok", **fields})
        assert rec is not None
        return audio_path(tmp_path, rec)

    assert path() is None  # no file named: a failed row's record
    assert path(file="wavs/a.flac") == tmp_path / "wavs" / "a.flac"
    assert path(wav="wavs/a.wav") == tmp_path / "wavs" / "a.wav"  # written before audio formats
    assert path(file="../../etc/passwd") == tmp_path / "wavs" / "a.wav"  # never outside wavs/


def test_the_default_output_keeps_the_fingerprints_folders_already_have() -> None:
    tagged = "synthetic speech"  # a run's files carry its provenance statement by default
    # what runs always put into "options"
    assert AudioOutput(tag=tagged).fingerprint_values() == {"float_wav": False}
    assert AudioOutput(encoding="float", tag=tagged).fingerprint_values() == {"float_wav": True}
    changed = AudioOutput(sample_rate=16000, format="flac", encoding="pcm24", trim_silence=True, tag=tagged)
    assert changed.fingerprint_values() == {"float_wav": False, "sample_rate": 16000, "audio_format": "flac",
                                            "audio_encoding": "pcm24", "trim_silence": True}
    # untagged files (--no-provenance-tag) have other bytes: a rerun that switches the tag redoes its rows
    assert AudioOutput().fingerprint_values() == {"float_wav": False, "provenance_tag": False}
