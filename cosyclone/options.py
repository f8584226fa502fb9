"""Every option of a run, defined once: typed, with its allowed values, its help line and its flag.

Why one place: an option travels CLI -> job -> run options -> API -> decode options, and hand-kept
lists of which options belong to the model, which change the audio (and so a row's fingerprint) and
which values are allowed drift apart. Here each option is one
dataclass field whose metadata says everything the other layers need:

* ``help``: one short line (``--help`` at 80 columns; details live in docs/);
* ``panel``: the ``--help`` group (model, sampling, batching, output, scale-out);
* ``audio``: True when the value changes a row's samples (part of the row fingerprint);
* ``low``/``high``: inclusive numeric bounds, ``choices`` come from the ``Literal`` annotation;
* ``commands``: which CLI commands offer it (``synth``, ``say``, ``trace``); none: API/internal only.

The CLI (:mod:`cosyclone.cli_options`) derives its parameters from these fields, the API takes
them as keywords, :func:`check` validates them for every door with the flag named, runs record
:func:`as_record` and fingerprints use :func:`audio_values`. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

from cosyclone.errors import CosycloneError

SYNTH, SAY, INSPECT, EXPORT, VALIDATE, EVAL, REPORT, TRACE = (
    "synth", "say", "inspect", "export", "validate", "eval", "report", "trace")
BOTH = (SYNTH, SAY)
ROW = (SYNTH, SAY, TRACE)  # the options that make a row's audio: `trace` replays a manifest line with them

# the --help groups, in the order --help shows them
MODEL, SAMPLING, BATCHING, OUTPUT, SCALE_OUT = "Model", "Sampling", "Batching", "Output", "Scale-out"
SHARDS, SOURCES = "Shards", "Sources"  # export's --help groups

LoadFormat = Literal["auto", "dummy"]
DEFAULT_LLM = "llm.pt"  # the released talker checkpoint (--llm's default)
DUMMY_TALKER = "dummy"  # what a --load-format dummy run records as its talker: random weights, no file read
TextFrontendName = Literal["wetext", "none"]  # wetext: the official normalizer; none: no normalizer
#: How a row's prompt conditions the model: a transcribed prompt, an untranscribed one, an instruction.
Mode = Literal["zero_shot", "cross_lingual", "instruct2"]
MODES: tuple[Mode, ...] = get_args(Mode)
TEXT_FRONTENDS: tuple[TextFrontendName, ...] = get_args(TextFrontendName)
DeviceName = Literal["auto", "cuda", "rocm", "cpu"]
DtypeName = Literal["auto", "mixed", "bf16", "fp16", "fp32"]
CpuGemm = Literal["auto", "onednn", "aten"]
NonfinitePolicy = Literal["exclude", "error", "legacy-zero"]
Draw = Literal["race", "legacy-multinomial"]
NonfiniteAudio = Literal["fail", "zero"]
Schedule = Literal["continuous", "static"]
CudaGraphs = Literal["auto", "on", "off"]
Engine = Literal["local", "ray"]
AudioFormat = Literal["wav", "flac"]
AudioEncoding = Literal["pcm16", "pcm24", "float"]
# what `cosyclone export` writes: Parquet or WebDataset shards, a NeMo manifest, Lhotse manifests
ExportFormat = Literal["parquet", "webdataset", "nemo", "lhotse"]
EXPORT_FORMATS: tuple[ExportFormat, ...] = get_args(ExportFormat)


def opt(default: Any, help: str, *, panel: str, audio: bool = False, commands: tuple[str, ...] = BOTH,
        low: float | None = None, high: float | None = None, metavar: str | None = None,
        flag: str | None = None, hidden: bool = False, envvar: str | None = None, short: str | None = None,
        required: bool = False, fingerprint_default: bool = True) -> Any:
    """A dataclass field carrying what every door needs to know about one option (``short``: a
    one-letter alias such as ``-o``; ``required``: the command line must give it;
    ``fingerprint_default=False``: an audio option added after folders were written, fingerprinted only
    away from its default, so those folders keep their fingerprints and no row is redone by an upgrade)."""
    return field(default=default, metadata={
        "help": help, "panel": panel, "audio": audio, "commands": commands, "low": low, "high": high,
        "metavar": metavar, "flag": flag, "hidden": hidden, "envvar": envvar, "short": short,
        "required": required, "fingerprint_default": fingerprint_default})


@dataclass(frozen=True)
class ModelOptions:
    """What the model is loaded as: fixed for a loaded :class:`~cosyclone.api.CosyClone`."""

    # auto: read the model directory's weights; dummy: random weights at the released size
    load_format: LoadFormat = opt("auto", "auto (read weights) | dummy (random)", panel=MODEL, audio=True,
                                  metavar="FMT", commands=ROW)
    # wetext: the official normalizer (numbers, dates, units spelled out); none: inflect digits only
    text_frontend: TextFrontendName = opt("wetext", "wetext (official normalizer) | none", panel=MODEL,
                                          audio=True, metavar="NAME", commands=(*ROW, VALIDATE))
    # the talker checkpoint, a file of the model directory: llm.pt (released default) | llm.rl.pt (the
    # RL-tuned talker of the same architecture, where the folder holds it) | another file of its shape
    llm: str = opt(DEFAULT_LLM, "talker file: llm.pt | llm.rl.pt", panel=MODEL,
                   audio=True, metavar="FILE", commands=(*ROW, INSPECT), fingerprint_default=False)
    # the device the stages run on; "auto" until resolved (a run records the resolved type)
    device: DeviceName = opt("auto", "auto | cuda | rocm | cpu", panel=MODEL, metavar="DEV",
                             commands=(*ROW, INSPECT))
    # the run dtype; auto: mixed (talker fp32, DiT bf16) on GPUs with bf16, else fp32 (head, sampler, HiFT:
    # fp32)
    dtype: DtypeName = opt("auto", "auto | mixed | bf16 | fp16 | fp32", panel=MODEL, metavar="TYPE",
                           commands=(SYNTH, SAY, INSPECT))
    # the library of the talker's and flow's fp32 linear layers on CPU (rounding differs by ~1e-6)
    cpu_gemm: CpuGemm = opt("auto", "CPU fp32 GEMMs: auto | onednn | aten", panel=MODEL, audio=True,
                            metavar="LIB", commands=ROW)
    # torch's and ONNX's intra-op threads (None: torch's own default, ONNX 1 as upstream)
    threads: int | None = opt(None, "CPU threads (default: one per core)", panel=MODEL, low=1, metavar="N",
                              commands=ROW)


@dataclass(frozen=True)
class SamplingOptions:
    """What the talker samples and how code2wav renders it: every field here changes the audio."""

    # run seed: a row's seed is row_seed(seed, id) unless the row gives its own
    seed: int = opt(0, "run seed (row seeds derive from it and the id)", panel=SAMPLING, low=0, metavar="N",
                    commands=(SYNTH, TRACE))
    # RAS nucleus mass (None: the model yaml's, released 0.8)
    top_p: float | None = opt(None, "RAS top-p in (0, 1] (default: model's 0.8)", panel=SAMPLING, audio=True,
                              low=1e-6, high=1.0, metavar="P", commands=ROW)
    # RAS top-k (None: the model yaml's, released 25)
    top_k: int | None = opt(None, "RAS top-k (default: model's 25)", panel=SAMPLING, audio=True, low=1,
                            metavar="K", commands=ROW)
    # RAS repetition window (None: the model yaml's, released 10)
    win_size: int | None = opt(None, "RAS window (default: model's 10)", panel=SAMPLING, audio=True, low=1,
                               metavar="N", commands=ROW)
    # RAS threshold ratio (None: the model yaml's, released 0.1)
    tau_r: float | None = opt(None, "RAS threshold ratio (default: model's 0.1)", panel=SAMPLING, audio=True,
                              low=0.0, metavar="R", commands=ROW)
    # stop ids are blocked below int(ratio x target text ids) tokens (None: 2, the official default)
    min_len_ratio: float | None = opt(None, "min tokens per text token (default 2)", panel=SAMPLING,
                                      audio=True, low=0.0, metavar="R", commands=ROW)
    # a segment stops at int(ratio x target text ids) tokens (None: 20, the official default)
    max_len_ratio: float | None = opt(None, "max tokens per text token (default 20)", panel=SAMPLING,
                                      audio=True, low=1e-6, metavar="R", commands=ROW)
    # what non-finite logits do: exclude (default), error, legacy-zero (LEGACY, official)
    nonfinite_policy: NonfinitePolicy = opt("exclude", "NaN logits: exclude | error | legacy-zero",
                                            panel=SAMPLING, audio=True, metavar="P", commands=(SYNTH,))
    # how a token is drawn: race (exponential race) | legacy-multinomial (LEGACY, official)
    draw: Draw = opt("race", "race | legacy-multinomial (LEGACY)", panel=SAMPLING, audio=True, metavar="D",
                     commands=(SYNTH, TRACE))
    # a cap on speech tokens per segment (short runs, benchmarks)
    max_tokens: int | None = opt(None, "cap speech tokens per segment", panel=SAMPLING, audio=True, low=1,
                                 metavar="N", commands=ROW)
    # stop ids blocked below this many tokens per segment (benchmarks: min = max gives exact lengths)
    min_tokens: int | None = opt(None, "block stop ids below N tokens (bench)", panel=SAMPLING, audio=True,
                                 low=0, metavar="N", hidden=True, commands=(SYNTH, TRACE))
    # flow Euler steps (None: the model yaml's, 10)
    n_timesteps: int | None = opt(None, "flow Euler steps (default: model's 10)", panel=SAMPLING, audio=True,
                                  low=1, metavar="N", commands=ROW)
    # what a NaN/inf audio sample does: fail the row (default) | zero it (LEGACY); counted either way
    nonfinite_audio: NonfiniteAudio = opt("fail", "NaN audio: fail | zero (LEGACY)", panel=SAMPLING,
                                          audio=True, metavar="P", commands=(SYNTH, TRACE))


@dataclass(frozen=True)
class EngineOptions:
    """How rows are batched and scheduled: none of these change a row's WAV bytes."""

    # max rows per batch (all of a row's segments travel together); None: 8 on CPU, on CUDA/ROCm sized
    # from the memory free after load (engine/sizing.py); resolved before a run plans its batches
    batch_size: int | None = opt(None, "max rows per batch (default: 8; GPU: sized)", panel=BATCHING, low=1,
                                 metavar="N", commands=(SYNTH,))
    # max padded work per batch: rows x the largest row estimate (None: rows only)
    token_budget: int | None = opt(None, "max padded work per batch", panel=BATCHING, low=1, metavar="N",
                                   commands=(SYNTH,))
    # segments the talker decodes at once (None: a batch's worth on CPU, sized from free memory on
    # CUDA/ROCm); the others wait for a free slot
    talker_slots: int | None = opt(None, "segments decoded at once", panel=BATCHING, low=1, metavar="N",
                                   commands=(SYNTH,))
    # continuous: one talker session for the run, rows take freed slots across batches; static: per batch
    schedule: Schedule = opt("continuous", "continuous | static (same bytes)", panel=BATCHING, metavar="S",
                             commands=(SYNTH,))
    # auto (or on): replay the decode step as CUDA graphs where the device allows (CUDA/ROCm, the race
    # draw, no torch.compile); off: eager. Resolved once per run to on | off, which the run records
    cuda_graphs: CudaGraphs = opt(
        "auto", "decode as CUDA graphs: auto | on | off", panel=BATCHING, metavar="M"
    )
    # code2wav of a finished batch on a worker thread (None: on CUDA/ROCm, off on CPU)
    code2wav_thread: bool | None = opt(None, "", panel=BATCHING, commands=())
    # threads that prepare upcoming rows' prompts (decode, resample, features, speech tokens, CAM++)
    # ahead of the talker; None: the cores torch leaves / frontend_threads, at least 1 (engine/sizing.py)
    frontend_workers: int | None = opt(
        None,
        "prompt workers (default: the cores left)",
        panel=BATCHING,
        low=1,
        metavar="N",
        commands=(SYNTH,),
    )
    # torch and ONNX intra-op threads of each prompt worker (None: 1: rows in parallel scale better)
    frontend_threads: int | None = opt(None, "threads per prompt worker (default 1)", panel=BATCHING, low=1,
                                       metavar="N", commands=(SYNTH,))
    # share of the GPU memory free after load that sizing may plan for (None: 0.9); CPU: unused
    gpu_memory_fraction: float | None = opt(None, "GPU memory share to size for (0.9)", panel=BATCHING,
                                            low=0.05, high=1.0, metavar="F", commands=(SYNTH,))


@dataclass(frozen=True)
class RunOptions(EngineOptions, SamplingOptions, ModelOptions):
    """Every option of a synthesis run, flat (``opts.top_k``), grouped by the classes it derives from."""

    def __post_init__(self) -> None:
        check(self)  # a run's options are valid wherever they were made (CLI, API, a Ray actor)


@dataclass(frozen=True)
class FolderOptions:
    """How a run treats its output folder and where it runs (the audio fields change a file's bytes)."""

    # "i/N" (0-based i): this machine's contiguous slice of the manifest's lines
    shard: str | None = opt(None, "i/N: this machine's slice (i from 0)", panel=SCALE_OUT, metavar="I/N",
                            commands=(SYNTH,))
    # redo every row of the manifest (default: resume, skipping finished rows)
    overwrite: bool = opt(False, "redo every row (default: resume)", panel=OUTPUT, commands=(SYNTH,))
    # 32-bit float WAVs instead of PCM16: the same as --audio-encoding float (part of the fingerprint)
    float_wav: bool = opt(False, "float32 WAV (= --audio-encoding float)", panel=OUTPUT)
    # Hz of the written files (8000-48000); 24000, the model's, writes its samples as they are
    sample_rate: int = opt(24000, "output Hz, 8000-48000 (default 24000)", panel=OUTPUT, low=8000,
                           high=48000, metavar="HZ")
    # the files' container: wav | flac (lossless, about half the size)
    audio_format: AudioFormat = opt("wav", "wav | flac", panel=OUTPUT, metavar="FMT")
    # the files' samples: pcm16 | pcm24 | float (wav only)
    audio_encoding: AudioEncoding = opt(
        "pcm16", "pcm16 | pcm24 | float (wav only)", panel=OUTPUT, metavar="ENC"
    )
    # cut leading and trailing silence below -40 dBFS, keeping 0.1 s beside the speech (off: as the model made
    # it)
    trim_silence: bool = opt(False, "cut silence at both ends (keeps 0.1 s)", panel=OUTPUT)
    # write the files without the provenance tag (by default every audio file states that it is synthetic
    # speech made by cosyclone with these model files: WAV INFO chunk, FLAC Vorbis comment, no time in it);
    # recorded (output.provenance_tag) and part of the fingerprint
    no_provenance_tag: bool = opt(False, "files without the synthetic-speech tag", panel=OUTPUT)
    # local: this process; ray: a pool of Ray actors (the ray extra: pip install -e '.[ray]')
    engine: Engine = opt("local", "local | ray (needs: pip install -e '.\\[ray]')", panel=SCALE_OUT,
                         metavar="E", commands=(SYNTH,))
    # the Ray cluster to join (None: the one `ray start` began here, else a local one)
    ray_address: str | None = opt(None, "Ray cluster to join (default: local)", panel=SCALE_OUT,
                                  metavar="ADDR", commands=(SYNTH,))
    # Ray actors in all (None: what the nodes hold at the measured footprint; GPUs: one each)
    ray_actors: int | None = opt(None, "Ray actors in all (default: sized)", panel=SCALE_OUT, low=1,
                                 metavar="N", commands=(SYNTH,))
    # torch threads per CPU actor (None: the sizing rule, docs/ray.md)
    actor_threads: int | None = opt(None, "torch threads per CPU actor", panel=SCALE_OUT, low=1, metavar="N",
                                    commands=(SYNTH,))
    # seconds the rows in flight get after SIGTERM or SIGINT before they are dropped (they run on the resume)
    grace: float = opt(25.0, "seconds to finish rows on SIGTERM (25)", panel=OUTPUT,
                       low=0.0, metavar="S", commands=(SYNTH,))
    # who holds the folder lock (written to the lock file)
    command: str = opt("", "", panel=OUTPUT, commands=())

    def __post_init__(self) -> None:
        check(self)


#: The option groups a run is built from, in --help order.
GROUPS: tuple[type, ...] = (ModelOptions, SamplingOptions, EngineOptions, FolderOptions)
#: ModelOptions fields: a loaded model's own (the API refuses them per call).
MODEL_FIELDS = tuple(f.name for f in fields(ModelOptions))


def flag_of(f: dataclasses.Field[Any]) -> str:
    """The command-line flag of a field (``--top-k``)."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


@functools.cache
def hints_of(owner: type) -> dict[str, Any]:
    """An option class's resolved annotations (once per class: every options object is checked)."""
    return typing.get_type_hints(owner)


def choices_of(f: dataclasses.Field[Any], owner: type) -> tuple[str, ...] | None:
    """The allowed values of a ``Literal`` field, or of an optional one (None for any other)."""
    hint = hints_of(owner)[f.name]
    if typing.get_origin(hint) is not Literal:  # ``Literal[...] | None``: its Literal part
        hint = next((a for a in typing.get_args(hint) if typing.get_origin(a) is Literal), hint)
    return tuple(typing.get_args(hint)) if typing.get_origin(hint) is Literal else None


def option_fields(*groups: type) -> list[tuple[type, dataclasses.Field[Any]]]:
    """(owner class, field) of every option of ``groups`` (a field appears once, in its own class)."""
    out: list[tuple[type, dataclasses.Field[Any]]] = []
    for group in groups:
        own = [f for f in fields(group) if f.name in group.__dict__.get("__annotations__", {})]
        out += [(group, f) for f in own]
    return out


def audio_fields() -> tuple[str, ...]:
    """The run options that change a row's samples: the fingerprint's ``options`` part."""
    return tuple(f.name for _, f in option_fields(ModelOptions, SamplingOptions) if f.metadata["audio"])


def audio_values(opts: RunOptions) -> dict[str, Any]:
    """The fingerprint's option values of a run (a field marked ``fingerprint_default=False`` only when it
    is away from its default: see :func:`opt`)."""
    out: dict[str, Any] = {}
    for _, f in option_fields(ModelOptions, SamplingOptions):
        if not f.metadata["audio"]:
            continue
        value = getattr(opts, f.name)
        if f.metadata.get("fingerprint_default", True) or value != f.default:
            out[f.name] = value
    return out


def check(*objs: Any) -> None:
    """Refuse option values no run can use, naming the flag (:class:`CosycloneError`).

    One check for every door (CLI, API, job, Ray): allowed values from the ``Literal`` types,
    numeric bounds from the metadata, and the combinations that cannot work.
    """
    for obj in objs:
        owners = [g for g in type(obj).__mro__ if "__dataclass_fields__" in g.__dict__]  # its option groups
        for owner, f in option_fields(*owners):
            value = getattr(obj, f.name)
            if value is None:
                continue
            allowed = choices_of(f, owner)
            if allowed is not None and value not in allowed:
                raise CosycloneError(f"{flag_of(f)} must be one of {', '.join(allowed)}, not {value!r}")
            low, high = f.metadata.get("low"), f.metadata.get("high")
            if low is not None and value < low:
                raise CosycloneError(f"{flag_of(f)} must be at least {low:g}, not {value}")
            if high is not None and value > high:
                raise CosycloneError(f"{flag_of(f)} must be at most {high:g}, not {value}")
    for obj in objs:
        if isinstance(obj, ModelOptions):
            check_llm(obj)
        if isinstance(obj, SamplingOptions) and obj.min_tokens is not None and obj.max_tokens is not None \
                and obj.min_tokens > obj.max_tokens:
            raise CosycloneError(f"--min-tokens {obj.min_tokens} is above --max-tokens {obj.max_tokens}")
        if isinstance(obj, FolderOptions):
            for flag, value in (("--ray-actors", obj.ray_actors), ("--actor-threads", obj.actor_threads)):
                if value is not None and obj.engine != "ray":
                    raise CosycloneError(f"{flag} sizes the Ray actor pool: give it with --engine ray")
            if obj.shard:
                from cosyclone.base.shard import Shard

                Shard.parse(obj.shard)
            if obj.float_wav and obj.audio_encoding != "pcm16":
                raise CosycloneError(f"--float-wav is --audio-encoding float: give one, not both "
                                     f"(--audio-encoding {obj.audio_encoding})")
            if obj.audio_format == "flac" and (obj.float_wav or obj.audio_encoding == "float"):
                raise CosycloneError("--audio-format flac stores integer samples only: give --audio-encoding "
                                     "pcm16 or pcm24 (float needs --audio-format wav)")


def check_llm(opts: ModelOptions) -> None:
    """``--llm`` names a file inside the model directory (its hash is then part of the model's identity),
    and only weights that are read can come from it."""
    from pathlib import PurePosixPath

    name = opts.llm
    if not name or PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts or "\\" in name:
        raise CosycloneError(f"--llm names a talker file inside the model folder (llm.pt, llm.rl.pt), "
                             f"not {name!r}")
    if opts.load_format == "dummy" and name != DEFAULT_LLM:
        raise CosycloneError(f"--llm {name} reads a talker file; --load-format dummy reads none: "
                             "give one of them")


def build(cls: type, values: dict[str, Any]) -> Any:
    """``cls(**values)`` with an unknown name or a bad value as a :class:`CosycloneError`."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise CosycloneError(f"unknown option{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}")
    return cls(**values)  # checked in __post_init__


def split(values: dict[str, Any]) -> tuple[RunOptions, FolderOptions]:
    """Keyword options (the API's, the CLI's) into the run's and the folder's option sets."""
    folder_names = {f.name for f in fields(FolderOptions)}
    folder = build(FolderOptions, {k: v for k, v in values.items() if k in folder_names})
    run = build(RunOptions, {k: v for k, v in values.items() if k not in folder_names})
    return run, folder


def as_record(opts: RunOptions) -> dict[str, Any]:
    """The resolved options as a run records them (summary.json ``last_run.options``)."""
    return dataclasses.asdict(opts)
