"""The options of the doors' own commands, declared in the option registry like a run's.

``synth`` and ``say`` take a run's options from :mod:`cosyclone.options`; what is theirs alone (the
model directory, where the output goes, how much they print, ``say``'s one utterance) is declared
here, one field per option with its flag, help line and panel, so ``--help``, docs/cli.md and the
bounds check read one table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cosyclone.options import MODEL, OUTPUT, SAMPLING, SAY, SYNTH, Mode, check, opt

MODEL_DIR_ENV = "COSYCLONE_MODEL_DIR"  # the default --model-dir of synth and say
INPUT, RUN = "Input", "Run"
MAKE_TINY_MODEL = "make-tiny-model"


@dataclass(frozen=True)
class ModelDirOptions:
    """Where the model is read from (synth and say; the environment variable saves typing it)."""

    # the model directory as downloaded (None: $COSYCLONE_MODEL_DIR, else the built-in tiny assets)
    model_dir: Path | None = opt(None, f"the model folder (or ${MODEL_DIR_ENV})", panel=MODEL, metavar="DIR",
                                 envvar=MODEL_DIR_ENV, commands=(SYNTH, SAY))

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class SynthDoorOptions:
    """Where ``synth`` writes, whether it only plans, and how much it prints."""

    # the output folder: WAVs, records, summary (a rerun into it resumes)
    out: Path = opt(
        Path("out"), "output folder (default: out)", panel=OUTPUT, metavar="DIR", commands=(SYNTH,)
    )
    # validate and plan the run, print the plan and the engine's sizes; nothing is written
    dry_run: bool = opt(False, "validate and plan only", panel=RUN, commands=(SYNTH,))
    # print only the end summary and errors
    quiet: bool = opt(False, "print only the end summary and errors", panel=RUN, commands=(SYNTH,))
    # seconds between progress lines when stderr is not a terminal
    progress_interval: float = opt(30.0, "seconds between progress lines off a terminal", panel=RUN, low=0.1,
                                   metavar="S", commands=(SYNTH,))

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class UtteranceOptions:
    """``say``'s one utterance: the voice, what is said and how, and the file it goes to."""

    # the voice to clone: a clean recording of up to 30 s, at least 16 kHz
    prompt_audio: Path | None = opt(None, "the voice to clone (>= 16 kHz, <= 30 s)", panel=INPUT,
                                    metavar="FILE", required=True, commands=(SAY,))
    # the recording's transcript (zero_shot needs it)
    prompt_text: str | None = opt(None, "its transcript (zero_shot needs it)", panel=INPUT, metavar="TEXT",
                                  commands=(SAY,))
    # how the prompt conditions the model
    mode: Mode = opt("zero_shot", "zero_shot | cross_lingual | instruct2", panel=INPUT, metavar="MODE",
                     commands=(SAY,))
    # the style instruction (instruct2)
    instruct: str | None = opt(
        None, "the instruction (instruct2)", panel=INPUT, metavar="TEXT", commands=(SAY,)
    )
    # the utterance's seed (None: derived from the run seed and the file's name, as synth derives a row's)
    seed: int | None = opt(
        None, "the utterance's seed (default: derived)", panel=SAMPLING, low=0, metavar="N", commands=(SAY,)
    )
    # the speaking-rate factor
    speed: float = opt(1.0, "speaking-rate factor in [0.25, 4]", panel=INPUT, low=0.25, high=4.0, metavar="X",
                       commands=(SAY,))
    # the file to write: its suffix (.wav, .flac) is the container
    out: Path = opt(Path("say.wav"), "output .wav or .flac (default: say.wav)", panel=OUTPUT, metavar="FILE",
                    short="-o",
                    commands=(SAY,))

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class TinyModelOptions:
    """What ``make-tiny-model`` may do to the folder it writes."""

    # replace the files of a folder that is not empty
    force: bool = opt(False, "replace an existing folder's files", panel=OUTPUT, commands=(MAKE_TINY_MODEL,))
    # also write llm.rl.pt beside llm.pt, as the release has it: the talker's shape, other weights (--llm)
    rl_talker: bool = opt(False, "also write llm.rl.pt (other talker weights)", panel=OUTPUT,
                          commands=(MAKE_TINY_MODEL,))


#: The doors' own option groups.
DOOR_GROUPS: tuple[type, ...] = (ModelDirOptions, SynthDoorOptions, UtteranceOptions, TinyModelOptions)
