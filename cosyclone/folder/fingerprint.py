"""Row fingerprints: a stable hash of what the user chose for a row, and the file-hash cache.

A row is redone exactly when its fingerprint changes, and what changed is counted by part (``text``, ``seed``,
``options``, ...). The fingerprint holds what the user chose (the row's inputs, the model, the dtype, the
options that change audio), never where the row ran: the device kind, the CPU thread count and the library
versions change a row's samples in their last bits at most, so a resume on another machine (other cores,
``--threads``) keeps every finished row; where each row ran is recorded beside it instead (the record's
``device`` and ``threads``, the run record's versions). Hashing a 2 GB model directory on every run is not
acceptable, so file contents are hashed once per (real path, size, mtime) in :class:`HashCache`, the one cache
the run folder and ``cosyclone eval`` share.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cosyclone.base.atomic import write_atomic
from cosyclone.base.user_cache import cache_dir

if TYPE_CHECKING:  # annotations only: reading a folder's records loads neither torch nor the frontend
    from cosyclone.base.device import DevicePolicy
    from cosyclone.manifest import ManifestRow

#: Changes whenever the same inputs would give other audio (a sampler, frontend or code2wav change).
#: Part of every fingerprint, so a new release redoes rows made by an older algorithm.
ALGORITHM_VERSION = "cosyclone-audio-5"  # 3: HiFT convs re-laid (fp32 rounding ~5e-8), bf16 flow on oneDNN;
#: 4: HiFT's long residual convs as FFT convs on CPU (fp32 rounding ~1e-6 of the conv outputs);
#: 5: those FFT convs with three-product bins, at block 32, also at 64 channels; CPU HiFT chunks of 200 frames

#: Fingerprint parts in the order "what changed" is reported.
PARTS = ("text", "prompt_text", "mode", "instruct", "speed", "prompt_audio", "seed", "model", "dtype",
         "options", "algorithm")


def _sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


class HashCache:
    """sha256 of files, remembered by (real path, size, mtime_ns) in a JSON file.

    Hashing a 2 GB model directory on every run is not acceptable; a file whose size and
    modification time are unchanged keeps its hash. The cache is advisory: unreadable means empty.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_dir() / "file-hashes.json"
        self._entries: dict[str, list[Any]] | None = None
        self._dirty = False
        #: path as given -> (its stat, its digest): a prompt shared by many rows costs one stat per row,
        #: not a realpath walk and a stat (the digest is the same: stat follows links as realpath does).
        self._seen: dict[str, tuple[tuple[int, ...], str]] = {}

    def _load(self) -> dict[str, list[Any]]:
        if self._entries is None:
            try:
                self._entries = json.loads(self.path.read_text())
                assert isinstance(self._entries, dict)
            except (OSError, ValueError, AssertionError):
                self._entries = {}
        return self._entries

    def sha256(self, path: Path) -> str:
        given = os.fspath(path)
        st = os.stat(given)
        sig = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        seen = self._seen.get(given)
        if seen is not None and seen[0] == sig:
            return seen[1]
        real = os.path.realpath(path)
        st = os.stat(real)
        entries = self._load()
        hit = entries.get(real)
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            digest = str(hit[2])
        else:
            digest = _sha256_file(Path(real))
            entries[real] = [st.st_size, st.st_mtime_ns, digest]
            self._dirty = True
        self._seen[given] = ((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), digest)
        return digest

    def save(self) -> None:
        if not self._dirty or self._entries is None:
            return
        with contextlib.suppress(OSError):  # a read-only home only costs re-hashing next time
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(self._entries).encode("utf-8"))
            self._dirty = False


def model_content_hash(model_dir: Path | None, cache: HashCache, *, dummy_tag: str = "") -> str:
    """One hash of every file under ``model_dir`` (relative path and content), via ``cache``.

    Without a directory (``--load-format dummy`` at the released geometry) the hash names the
    dummy weights instead, so a dummy row is never mistaken for a real-weights row.
    """
    h = hashlib.sha256()
    if model_dir is None:
        h.update(f"dummy:{dummy_tag}".encode())
        return h.hexdigest()
    root = Path(model_dir)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if any(part.startswith(".") or part == "__pycache__" for part in Path(rel).parts):
            continue
        h.update(rel.encode() + b"\0" + cache.sha256(path).encode() + b"\n")
    if dummy_tag:
        h.update(f"dummy:{dummy_tag}".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class RunContext:
    """What the user chose outside the row (the run-wide fingerprint parts), and where the rows run."""

    model: str  # model_content_hash
    dtype: str  # resolved run dtype (fp32 | bf16 | fp16)
    options: Mapping[str, Any]  # sampler / code2wav / non-finite / text-frontend options that change audio
    device: str = "cpu"  # the backend (cpu | cuda | rocm): recorded per row, not fingerprinted
    threads: str = "-"  # CPU intra-op threads ("-" on a GPU): recorded per row, not fingerprinted
    llm: str | None = None  # the talker file (--llm; "dummy": random weights): recorded per row,
    # fingerprinted through the options part


def _digest(value: Any) -> str:
    """A short stable hash of a JSON-able value; ``surrogatepass`` so that no string can make it raise
    (validation refuses lone surrogates, but a fingerprint must never be what ends a run)."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


#: Digests of the values many rows share (a prompt transcript, a mode, a speed, ...), by type and value:
#: a 200,000-row manifest of three prompts hashes each once and its rows share one string each.
_SHARED: dict[tuple[type, Any], str] = {}
_SHARED_MAX = 4096


def _shared_digest(value: str | float) -> str:
    key = (type(value), value)
    found = _SHARED.get(key)
    if found is None:
        found = _digest(value)
        if len(_SHARED) >= _SHARED_MAX:
            _SHARED.clear()
        _SHARED[key] = found
    return found


def _shared_prefix(digest: str) -> str:
    """``digest[:16]``, one string object for every row of the same prompt file."""
    key = (bytes, digest)
    found = _SHARED.get(key)
    if found is None:
        if len(_SHARED) >= _SHARED_MAX:
            _SHARED.clear()
        found = _SHARED[key] = digest[:16]
    return found


# (the last RunContext, its run-wide parts), read and set whole
_CONTEXT: tuple[RunContext | None, dict[str, str]] = (None, {})


def _context_parts(ctx: RunContext) -> dict[str, str]:
    """The run-wide fingerprint parts of ``ctx``, made once per context (its options dict is hashed once)."""
    global _CONTEXT
    last = _CONTEXT
    if last[0] is not ctx:
        last = _CONTEXT = (
            ctx,
            {
                "model": ctx.model[:16],
                "dtype": _digest(ctx.dtype),
                "options": _digest(dict(ctx.options)),
                "algorithm": _digest(ALGORITHM_VERSION),
            },
        )
    return dict(last[1])


def row_fingerprint(
    row: ManifestRow, seed: int, ctx: RunContext, hashes: HashCache
) -> tuple[str, dict[str, str]]:
    """(fingerprint, parts): a stable hash of everything that changes ``row``'s audio.

    ``parts`` maps each name of :data:`PARTS` to a short hash, so a changed row can say what changed.
    """
    parts = {
        "text": _digest(row.text),
        "prompt_text": _shared_digest(row.prompt_text),
        "mode": _shared_digest(row.mode),
        "instruct": _shared_digest(row.instruct),
        "speed": _shared_digest(float(row.speed)),
        "prompt_audio": _shared_prefix(hashes.sha256(Path(row.prompt_audio))),
        "seed": _digest(int(seed)),
        **_context_parts(ctx),
    }
    return _digest([parts[k] for k in PARTS]), parts


def cpu_threads(policy: DevicePolicy, actor_threads: int | None = None) -> str:
    """The thread count a row's CPU bytes depend on: ``actor_threads`` (a Ray actor's), else this
    process's torch intra-op threads; "-" on a GPU, whose kernels do not split sums by host thread."""
    if policy.device.type != "cpu":
        return "-"
    if actor_threads is not None:
        return str(int(actor_threads))
    import torch

    return str(torch.get_num_threads())


def token_key(parts: Mapping[str, str]) -> str:
    """The stage-0 checkpoint's key of a row: the digest of its parts (a rerun at another thread count or
    on another device kind reuses the tokens an earlier run kept, as its fingerprint is the same)."""
    return _digest(["tokens", *(parts[k] for k in PARTS)])


def same_inputs(stored: str | None, stored_parts: Mapping[str, str] | None, fp: str,
                parts: Mapping[str, str]) -> bool:
    """Whether a stored record was made from the inputs that give ``fp``: the same fingerprint, or every
    part of :data:`PARTS` equal (a record of a version that also fingerprinted where its row ran holds
    those parts too: they do not count)."""
    if stored == fp:
        return True
    return stored_parts is not None and all(stored_parts.get(k) == parts[k] for k in PARTS)


def changed_parts(stored: Mapping[str, str] | None, new: Mapping[str, str]) -> list[str]:
    """The parts of ``new`` that differ from a stored record's ``fingerprint_parts`` (all when absent)."""
    stored = stored or {}
    return [k for k in PARTS if stored.get(k) != new[k]] or ["fingerprint"]


