"""DNSMOS as eval computes it (its own mel, speechmos's ONNX models) against speechmos's own function.

speechmos's Python code imports librosa and requests, which its wheel does not declare; the dev
extra installs both so that this comparison runs in CI. The recordings are the project's prompts
(2.3 to 3.7 s: each doubled until it fills a 9.01 s window) and their concatenation, 12 s long (three windows,
one second apart).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("speechmos", reason="DNSMOS's models come with speechmos (the eval extra)")
speechmos_dnsmos = pytest.importorskip("speechmos.dnsmos",
                                       reason="speechmos's own code needs librosa and requests")

from cosyclone.eval.dnsmos import WINDOW, Dnsmos, p808_features, windows  # noqa: E402

PROMPTS = Path(__file__).resolve().parents[2] / "manifests" / "prompts"


def _clips() -> list[np.ndarray]:
    import torch

    from cosyclone.frontend.audio import resample

    clips = []
    for name in ("speaker1", "speaker2", "speaker3"):
        wave, sr = sf.read(str(PROMPTS / f"{name}.wav"), dtype="float32")
        clips.append(resample(torch.from_numpy(wave), sr, 16000).numpy().astype(np.float32))
    clips.append(np.concatenate(clips + clips)[: 12 * 16000])
    return clips


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    return _clips()


def test_scores_match_speechmos_on_the_prompt_recordings(clips: list[np.ndarray]) -> None:
    ours = Dnsmos(threads=2).score(clips)  # all clips' windows in one batch
    assert [s.windows for s in ours] == [1, 1, 5, 3]  # speaker3, doubled twice, is 14.7 s long
    for clip, mine in zip(clips, ours, strict=True):
        ref = speechmos_dnsmos.run(clip, 16000)
        got = {"ovrl_mos": mine.ovrl, "sig_mos": mine.sig, "bak_mos": mine.bak, "p808_mos": mine.p808}
        for key, value in got.items():
            assert value == pytest.approx(float(ref[key]), abs=1e-3), key


def test_the_p808_input_is_librosas_mel_as_speechmos_computes_it(clips: list[np.ndarray]) -> None:
    window = windows(clips[3])[1]
    assert window.shape == (WINDOW,)
    ref = speechmos_dnsmos.DNSMOS.audio_melspec(None, window[:-160])
    ours = p808_features(window)
    assert ours.shape == ref.shape == (900, 120)
    np.testing.assert_allclose(ours, ref, atol=1e-4)


def test_an_empty_clip_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        windows(np.zeros(0, np.float32))
