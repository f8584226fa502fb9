"""What made a run's audio, stated where the audio goes: the model's files, the talker, cosyclone's version.

Why: a dataset is filtered and trained on far from the machine that made it, and whoever holds it must be
able to say what made it (which checkpoints, which of the release's two talkers, which cosyclone, under
which licence) and that it is synthetic speech (rules on AI-generated content ask for a machine-readable
marking). So the run record holds a :class:`Provenance`, the exports' cards copy it, and every audio file
carries :meth:`Provenance.statement` (a WAV INFO chunk, a FLAC Vorbis comment: :mod:`.audio_out`).

The statement holds no time and no path: equal runs of one model write equal bytes wherever the model
folder lies. The files' SHA-256 come from the :class:`~cosyclone.folder.fingerprint.HashCache` (once per
path, size and mtime), so a 2 GB model folder is hashed once, not per run.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cosyclone.base.version import __version__
from cosyclone.folder.audio_out import SOFTWARE
from cosyclone.folder.fingerprint import HashCache
from cosyclone.model.config import ONNX_MODELS, YAML_NAME, ModelConfig
from cosyclone.options import DUMMY_TALKER, RunOptions

#: The model files a run reads besides the talker (the talker file is --llm's), in the order stated.
USED_FILES = (YAML_NAME, "flow.pt", "hift.pt", *ONNX_MODELS)
#: Licence files looked for at the model folder's top, in this order (the Hub's README.md front matter
#: ``license:`` is the fallback: the released folder states its licence there).
LICENCE_NAMES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "LICENCE", "LICENCE.txt", "LICENCE.md", "COPYING")
LICENCE_TEXT_MAX = 64 * 1024  # characters of a licence file kept in the record (the whole of any usual one)


@dataclass(frozen=True)
class ModelFile:
    """One model file a run read."""

    file: str  # its path inside the model folder
    bytes: int  # its size
    sha256: str  # its content's SHA-256 (hex)


@dataclass(frozen=True)
class Licence:
    """The model folder's licence, as the folder states it."""

    file: str  # the file stating it (LICENSE, ..., or README.md's front matter)
    sha256: str  # that file's SHA-256
    id: str | None  # the licence identifier where one is stated (README.md's ``license:``), else None
    text: str | None  # the licence file's text (None: stated by identifier only)


@dataclass(frozen=True)
class Provenance:
    """What made a run's audio: a run record's ``provenance``, copied into every export's card."""

    cosyclone: str  # cosyclone's version
    llm: str  # the talker file (--llm: llm.pt, llm.rl.pt); dummy: random weights (--load-format dummy)
    model_files: tuple[ModelFile, ...]  # the files read, with sizes and SHA-256 (empty: dummy weights)
    licence: Licence | None  # the model folder's licence file (None: the folder holds none)
    tagged: bool  # whether every audio file carries the statement (off: --no-provenance-tag)

    def statement(self) -> str:
        """The synthetic-speech statement each audio file carries: who made it, with which model files."""
        if not self.model_files:
            model = "random (dummy) weights at the released CosyVoice3 geometry"
        else:
            model = "the CosyVoice3 model files (sha256) " + ", ".join(
                f"{f.file} {f.sha256}" for f in self.model_files)
        talker = f"; talker {self.llm}" if self.model_files else ""
        return f"synthetic speech made by {SOFTWARE} with {model}{talker}"

    def tag(self) -> str | None:
        """The statement when files are tagged, else None (``--no-provenance-tag``)."""
        return self.statement() if self.tagged else None

    def as_record(self) -> dict[str, Any]:
        """The JSON object of the run record's ``provenance``."""
        out = asdict(self)
        out["model_files"] = [asdict(f) for f in self.model_files]
        out["statement"] = self.statement()
        return out


def _front_matter_licence(readme: Path) -> str | None:
    """The ``license:`` of a Hub README's YAML front matter (None: none stated)."""
    try:
        text = readme.read_text(encoding="utf-8", errors="replace")[:8192]
    except OSError:
        return None
    head = re.match(r"---\s*\n(.*?)\n---", text, re.S)
    found = re.search(r"^license:\s*['\"]?([\w.+-]+)", head.group(1), re.M) if head else None
    return found.group(1) if found else None


def find_licence(model_dir: Path, hashes: HashCache) -> Licence | None:
    """The model folder's licence: a licence file at its top, else its README.md's ``license:``."""
    for name in LICENCE_NAMES:
        path = model_dir / name
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")[:LICENCE_TEXT_MAX]
            return Licence(file=name, sha256=hashes.sha256(path), id=None, text=text)
    readme = model_dir / "README.md"
    ident = _front_matter_licence(readme) if readme.is_file() else None
    if ident is not None:
        return Licence(file="README.md", sha256=hashes.sha256(readme), id=ident, text=None)
    return None


def of_model(cfg: ModelConfig, opts: RunOptions, hashes: HashCache, *, tagged: bool = True) -> Provenance:
    """The provenance of audio made by ``cfg``'s model folder under ``opts`` (its ``--llm``); a dummy load
    reads no file and states so. Raises ``OSError`` when a file cannot be read."""
    if opts.load_format == "dummy" or cfg.model_dir is None:
        return Provenance(cosyclone=__version__, llm=DUMMY_TALKER, model_files=(), licence=None,
                          tagged=tagged)
    root = cfg.model_dir
    names = (USED_FILES[0], opts.llm, *USED_FILES[1:])
    files = tuple(ModelFile(file=n, bytes=(root / n).stat().st_size, sha256=hashes.sha256(root / n))
                  for n in names if (root / n).is_file())
    return Provenance(cosyclone=__version__, llm=opts.llm, model_files=files,
                      licence=find_licence(root, hashes), tagged=tagged)
