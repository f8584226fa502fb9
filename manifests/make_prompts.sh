#!/usr/bin/env sh
# Regenerate the example prompt recordings in manifests/prompts/ with espeak-ng.
#
# Each file says its row's prompt_text from manifests/example.jsonl in a different espeak-ng voice
# (speaker3 serves a cross_lingual row, which needs no transcript, but it still says a sentence).
# Output: mono 16-bit PCM WAV at espeak-ng's native 22050 Hz, 2-4 s each. espeak-ng is only needed
# to regenerate them: the WAVs are committed, and nothing in the tests calls this script.
#
#   sudo apt-get install espeak-ng   # Debian/Ubuntu
#   sh manifests/make_prompts.sh
set -eu

command -v espeak-ng >/dev/null 2>&1 || { echo "espeak-ng not found (apt-get install espeak-ng)" >&2; exit 1; }
out="$(cd "$(dirname "$0")" && pwd)/prompts"
mkdir -p "$out"

say() {  # say FILE VOICE TEXT
    espeak-ng -v "$2" -s 150 -w "$out/$1" "$3"
    echo "wrote $out/$1 ($2)"
}

say speaker1.wav en-us+m3 "This is the reference speaker talking."
say speaker2.wav en-gb+f3 "I recorded this sentence for you."
say speaker3.wav en+m7 "Good morning, my name is Sam and I live by the sea."
