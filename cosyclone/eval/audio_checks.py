"""Signal checks of one output WAV: duration, leading / trailing silence, clipping, non-finite samples.

These need no model. Silence is measured on 10 ms frames: a frame is silent when its RMS is below
``silence_db`` dBFS (-40 by default, quieter than any speech at a normal level and louder than
the vocoder's noise floor). Leading silence runs from the start to the first loud frame, trailing
silence from the last loud frame to the end; a file without a loud frame is all silence (both
figures equal the duration). A sample counts as clipped when ``|x| >= clip_level`` (0.999, i.e.
within 33 PCM16 steps of full scale: the writer clips there, so a run of such samples means the
waveform was cut off).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AudioCheckOptions:
    """Thresholds of the signal checks."""

    silence_db: float = -40.0  # frame RMS (dBFS) under which a 10 ms frame is silent
    frame_ms: float = 10.0  # analysis frame length for the silence measurement
    clip_level: float = 0.999  # |sample| at or above this counts as clipped


@dataclass(frozen=True)
class AudioCheck:
    """What the signal checks found in one WAV."""

    sample_rate: int  # of the file
    duration_s: float  # samples / sample_rate
    lead_silence_s: float  # silence before the first loud frame
    trail_silence_s: float  # silence after the last loud frame
    all_silent: bool  # no frame above the silence threshold
    peak: float  # max |sample| (finite samples only)
    clipped_samples: int  # samples with |x| >= clip_level
    clipped_fraction: float  # clipped_samples / samples
    nonfinite_samples: int  # NaN / inf samples (possible in float WAVs only)

    def to_dict(self) -> dict[str, float | int | bool]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def check_audio(wave: np.ndarray, sample_rate: int, options: AudioCheckOptions = AudioCheckOptions()
                ) -> AudioCheck:
    """Measure ``wave`` (N,) float in [-1, 1] at ``sample_rate`` Hz."""
    x = np.asarray(wave, dtype=np.float64).reshape(-1)
    n = x.size
    finite = np.isfinite(x)
    nonfinite = int(n - finite.sum())
    x = np.where(finite, x, 0.0)
    duration = n / float(sample_rate) if sample_rate > 0 else 0.0
    if n == 0:
        return AudioCheck(sample_rate, 0.0, 0.0, 0.0, True, 0.0, 0, 0.0, nonfinite)
    frame = max(1, int(round(sample_rate * options.frame_ms / 1000.0)))
    n_frames = -(-n // frame)
    padded = np.zeros(n_frames * frame)
    padded[:n] = x
    counts = np.full(n_frames, frame, dtype=np.float64)
    counts[-1] = n - (n_frames - 1) * frame  # the last frame's RMS is over its real samples only
    rms = np.sqrt((padded.reshape(n_frames, frame) ** 2).sum(axis=1) / counts)
    loud = np.flatnonzero(rms >= 10.0 ** (options.silence_db / 20.0))
    if loud.size == 0:
        lead = trail = duration
    else:
        lead = min(duration, loud[0] * frame / sample_rate)
        trail = max(0.0, duration - min(n, (loud[-1] + 1) * frame) / sample_rate)
    clipped = int((np.abs(x) >= options.clip_level).sum())
    return AudioCheck(sample_rate=sample_rate, duration_s=duration, lead_silence_s=float(lead),
                      trail_silence_s=float(trail), all_silent=loud.size == 0, peak=float(np.abs(x).max()),
                      clipped_samples=clipped, clipped_fraction=clipped / n, nonfinite_samples=nonfinite)
