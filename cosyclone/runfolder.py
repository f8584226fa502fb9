"""The output folder as a dataset: row fingerprints, the journal, one record per row, the writer lock.

A run folder holds, besides ``wavs/``:

* ``diagnostics.jsonl``: exactly one record per row (its latest attempt) once no run is active;
* ``.cosyclone/journal-<shard>.jsonl``: appends of the run in progress (fsynced per row), merged
  into ``diagnostics.jsonl`` and removed when the run ends (:func:`compact`);
* ``.cosyclone/lock-<shard>.json``: the running writer (pid, host, start time, command);
* ``metadata.jsonl``: one line per ``ok`` row for ``datasets.load_dataset("audiofolder")``;
* ``summary.json`` (folder totals and the last invocation), ``runs.jsonl`` (invocation history),
  ``errors.jsonl`` (tracebacks of non-user errors).

A row is *done* when its record says ``ok``, its WAV holds the recorded number of samples and its
fingerprint equals the fingerprint the current inputs give (:func:`row_fingerprint`). Anything
else is redone, and what changed is counted by fingerprint part (``text``, ``seed``, ...).

Why records win by ``finished_at`` rather than by file position: shards write separate journals and
a folder may be compacted by any of them, so "last line" has no meaning across files.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CosycloneError

#: Changes whenever the same inputs would give other audio (a sampler, frontend or code2wav change).
#: Part of every fingerprint, so a new release redoes rows made by an older algorithm.
ALGORITHM_VERSION = "cosyclone-audio-2"

DIAG_NAME = "diagnostics.jsonl"
METADATA_NAME = "metadata.jsonl"
RUNS_NAME = "runs.jsonl"
ERRORS_NAME = "errors.jsonl"
STATE_DIR = ".cosyclone"  # journals and locks: the folder's working state
WAV_DIR = "wavs"
TOKEN_DIR = "tokens"  # under STATE_DIR: the stage-0 checkpoint (token_store.py)

#: Fingerprint parts in the order "what changed" is reported.
PARTS = ("text", "prompt_text", "mode", "instruct", "speed", "prompt_audio", "seed", "model", "dtype",
         "device", "options", "algorithm")


class OutputFolderError(CosycloneError):
    """The output folder cannot be used: not writable, or a write failed (disk full, permission)."""


class FolderBusy(CosycloneError):
    """Another live ``synth`` holds the folder (or this shard of it)."""


# ----------------------------------------------------------------------------- content hashes

def _sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def cache_dir() -> Path:
    """Where content hashes are cached (``COSYCLONE_CACHE_DIR``, else ``~/.cache/cosyclone``)."""
    env = os.environ.get("COSYCLONE_CACHE_DIR")
    return Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cosyclone"


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
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self._entries))
            os.replace(tmp, self.path)
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


# ----------------------------------------------------------------------------- fingerprints

@dataclass(frozen=True)
class RunContext:
    """Everything outside the row that changes its audio (the run-wide fingerprint parts)."""

    model: str  # model_content_hash
    dtype: str  # resolved run dtype (fp32 | bf16 | fp16)
    device: str  # device kind (cpu | cuda | rocm): kernels differ in rounding
    options: Mapping[str, Any]  # sampler / code2wav / non-finite / text-frontend options that change audio


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


_CONTEXT: tuple[Any, dict[str, str]] = (None, {})  # (the last RunContext, its run-wide parts), read and set whole


def _context_parts(ctx: RunContext) -> dict[str, str]:
    """The run-wide fingerprint parts of ``ctx``, made once per context (its options dict is hashed once)."""
    global _CONTEXT
    last = _CONTEXT
    if last[0] is not ctx:
        last = _CONTEXT = (ctx, {"model": ctx.model[:16], "dtype": _digest(ctx.dtype), "device": _digest(ctx.device),
                                 "options": _digest(dict(ctx.options)), "algorithm": _digest(ALGORITHM_VERSION)})
    return dict(last[1])


def row_fingerprint(row: Any, seed: int, ctx: RunContext, hashes: HashCache) -> tuple[str, dict[str, str]]:
    """(fingerprint, parts): a stable hash of everything that changes ``row``'s audio.

    ``parts`` maps each name of :data:`PARTS` to a short hash, so a changed row can say what changed.
    """
    parts = {
        "text": _digest(row.text), "prompt_text": _shared_digest(row.prompt_text), "mode": _shared_digest(row.mode),
        "instruct": _shared_digest(row.instruct), "speed": _shared_digest(float(row.speed)),
        "prompt_audio": _shared_prefix(hashes.sha256(Path(row.prompt_audio))), "seed": _digest(int(seed)),
        **_context_parts(ctx),
    }
    return _digest([parts[k] for k in PARTS]), parts


def _shared_prefix(digest: str) -> str:
    """``digest[:16]``, one string object for every row of the same prompt file."""
    key = (bytes, digest)
    found = _SHARED.get(key)
    if found is None:
        if len(_SHARED) >= _SHARED_MAX:
            _SHARED.clear()
        found = _SHARED[key] = digest[:16]
    return found


def changed_parts(old: Mapping[str, Any], new: Mapping[str, str]) -> list[str]:
    """The parts of ``new`` that differ from a stored record's ``fingerprint_parts`` (all when absent)."""
    stored = old.get("fingerprint_parts") or {}
    return [k for k in PARTS if stored.get(k) != new[k]] or ["fingerprint"]


# ----------------------------------------------------------------------------- records

def state_dir(out_dir: Path) -> Path:
    return Path(out_dir) / STATE_DIR


def shard_tag(shard: str | None) -> str:
    """``all`` or ``shard-I-of-N``: names this writer's journal and lock."""
    if not shard:
        return "all"
    i, n = shard.split("/")
    return f"shard-{int(i)}-of-{int(n)}"


def journal_path(out_dir: Path, tag: str) -> Path:
    return state_dir(out_dir) / f"journal-{tag}.jsonl"


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Objects of a JSONL file; a line that does not parse (torn by a kill) is skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    for raw in data.decode("utf-8", errors="replace").splitlines():
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            yield obj


def read_records(out_dir: Path) -> dict[str, dict[str, Any]]:
    """The current record per row id: ``diagnostics.jsonl`` and every journal, latest ``finished_at`` wins."""
    out_dir = Path(out_dir)
    sources = [out_dir / DIAG_NAME, *sorted(state_dir(out_dir).glob("journal-*.jsonl"))]
    found: dict[str, dict[str, Any]] = {}
    for path in sources:
        for obj in iter_jsonl(path):
            rid = obj.get("id")
            if not isinstance(rid, str):
                continue
            prev = found.get(rid)
            if prev is None or float(obj.get("finished_at", 0.0)) >= float(prev.get("finished_at", 0.0)):
                found[rid] = obj
    return found


def wav_path(out_dir: Path, row_id: str) -> Path:
    """Where a row's WAV lies in a run folder (``wavs/<id>.wav``)."""
    return Path(out_dir) / WAV_DIR / f"{row_id}.wav"


def wav_frames(path: Path) -> int | None:
    """Frames in a WAV's header, None when it is missing or unreadable."""
    try:
        import soundfile as sf

        return int(sf.info(str(path)).frames)
    except Exception:  # missing, torn or not a WAV: the row is not done
        return None


def is_complete(out_dir: Path, record: Mapping[str, Any]) -> bool:
    """An ``ok`` record whose WAV exists with the recorded number of samples."""
    if record.get("status") != "ok":
        return False
    frames = wav_frames(wav_path(out_dir, record["id"]))
    if frames is None:
        return False
    samples = record.get("samples")
    return samples is None or int(samples) == frames


@dataclass
class ResumePlan:
    """What a run must do with the manifest rows, against the folder's records."""

    todo: list[Any]  # rows to synthesize (new, changed, failed before, or incomplete)
    done: list[str]  # ids skipped: complete and fingerprint unchanged
    redone: dict[str, list[str]]  # id -> changed fingerprint parts (rows that were complete)
    retried: list[str]  # ids whose earlier attempt failed or whose WAV is missing/torn
    foreign: list[str]  # ids in the folder that this manifest does not have (kept)

    def redone_counts(self) -> dict[str, int]:
        """Changed part -> rows ("text 3, seed 9"); a row changed in two parts counts in both."""
        counts: dict[str, int] = {}
        for parts in self.redone.values():
            for p in parts:
                counts[p] = counts.get(p, 0) + 1
        return counts

    def describe(self) -> str:
        bits = []
        if self.redone:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(self.redone_counts().items(), key=lambda kv: -kv[1]))
            bits.append(f"{len(self.redone)} rows redone: {counts}")
        if self.retried:
            bits.append(f"{len(self.retried)} rows retried (failed or incomplete before)")
        if self.foreign:
            bits.append(f"{len(self.foreign)} rows in the folder are not in this manifest (kept)")
        return "; ".join(bits)


def plan_resume(out_dir: Path, rows: Iterable[Any], fingerprints: Mapping[str, tuple[str, dict[str, str]]],
                *, all_ids: Iterable[str], overwrite: bool = False) -> ResumePlan:
    """Decide per row: skip (complete, same fingerprint) or redo, and why."""
    records = read_records(out_dir)
    plan = ResumePlan(todo=[], done=[], redone={}, retried=[], foreign=sorted(set(records) - set(all_ids)))
    for row in rows:
        rec = records.get(row.id)
        fp, parts = fingerprints[row.id]
        if rec is None:
            plan.todo.append(row)
            continue
        complete = is_complete(out_dir, rec)
        if complete and not overwrite and rec.get("fingerprint") == fp:
            plan.done.append(row.id)
            continue
        plan.todo.append(row)
        if rec.get("fingerprint") != fp and rec.get("status") == "ok":
            plan.redone[row.id] = changed_parts(rec, parts)
        elif overwrite and complete:
            plan.redone[row.id] = ["overwrite"]
        else:
            plan.retried.append(row.id)
    return plan


# ----------------------------------------------------------------------------- durability

def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_name(path: Path) -> Path:
    """A temporary sibling of ``path`` naming this host and process (so a later run can clean it)."""
    return path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """``data`` to a temporary file, fsync, rename over ``path``, fsync the directory.

    On any error the temporary file is removed and :class:`OutputFolderError` names the file and the
    system's reason (``No space left on device``, ``File too large``, ...): nothing torn is left.
    """
    tmp = tmp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OutputFolderError(f"cannot write {path}: {exc.strerror or exc}") from exc


def remove_stale_temporaries(out_dir: Path) -> list[Path]:
    """Remove temporary files left by dead processes of this host (a killed run); returns them."""
    host = socket.gethostname()
    removed = []
    for folder in (Path(out_dir), Path(out_dir) / WAV_DIR, state_dir(out_dir), state_dir(out_dir) / TOKEN_DIR):
        if not folder.is_dir():
            continue
        for path in folder.glob(".*.tmp"):
            bits = path.name[:-4].rsplit(".", 2)
            if len(bits) != 3 or bits[1] != host or not bits[2].isdigit() or _alive(int(bits[2])):
                continue
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
    return removed


def check_writable(out_dir: Path) -> None:
    """Refuse an output folder that cannot be written, before any model loads."""
    out_dir = Path(out_dir)
    try:
        for d in (out_dir, out_dir / WAV_DIR, state_dir(out_dir)):
            d.mkdir(parents=True, exist_ok=True)
        probe = tmp_name(state_dir(out_dir) / "probe")
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise OutputFolderError(f"output folder {out_dir} is not writable: {exc.strerror or exc}") from exc


# ----------------------------------------------------------------------------- journal

class Journal:
    """This writer's append-only record log: each line whole, flushed and fsynced before returning."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        torn = path.is_file() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if torn:  # a killed run cut its last line: start on a fresh one (the torn line never parses)
            self._write(b"\n")

    def _write(self, data: bytes) -> None:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except OSError as exc:
            raise OutputFolderError(f"cannot write {self.path}: {exc.strerror or exc}") from exc

    def append(self, obj: Mapping[str, Any]) -> None:
        self._write((json.dumps(obj, ensure_ascii=False, sort_keys=True, default=str) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


def append_jsonl(path: Path, obj: Mapping[str, Any]) -> None:
    """One whole line appended to a shared log (runs, errors), fsynced."""
    j = Journal(path)
    try:
        j.append(obj)
    finally:
        j.close()


@contextlib.contextmanager
def _compaction_lock(out_dir: Path) -> Iterator[None]:
    """Serializes compaction between shard writers of one folder (same host or a POSIX-locking share)."""
    path = state_dir(out_dir) / "compact.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _order(records: Mapping[str, Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [records[k] for k in sorted(records, key=lambda rid: (int(records[rid].get("line") or 0), rid))]


def metadata_line(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The ``metadata.jsonl`` line of an ``ok`` row (the audiofolder loader's ``file_name`` convention)."""
    return {"file_name": f"{WAV_DIR}/{rec['id']}.wav", "id": rec["id"], "text": rec.get("text"),
            "prompt_audio": rec.get("prompt_audio"), "prompt_text": rec.get("prompt_text"),
            "mode": rec.get("mode"), "duration": rec.get("audio_seconds"), "seed": rec.get("seed")}


def compact(out_dir: Path, tag: str | None = None) -> dict[str, dict[str, Any]]:
    """Merge ``diagnostics.jsonl`` and every journal into one record per row; rewrite ``metadata.jsonl``.

    ``tag``'s own journal is removed afterwards (other shards' journals stay: their writers may
    still append, and the next compaction reads them again). Torn lines are dropped here.
    """
    out_dir = Path(out_dir)
    with _compaction_lock(out_dir):
        records = read_records(out_dir)
        ordered = _order(records)
        lines = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True, default=str) + "\n" for r in ordered)
        write_bytes_atomic(out_dir / DIAG_NAME, lines.encode())
        meta = "".join(json.dumps(metadata_line(r), ensure_ascii=False) + "\n" for r in ordered
                       if r.get("status") == "ok")
        write_bytes_atomic(out_dir / METADATA_NAME, meta.encode())
        if tag is not None:
            with contextlib.suppress(FileNotFoundError):
                journal_path(out_dir, tag).unlink()
                fsync_dir(state_dir(out_dir))
    return records


# ----------------------------------------------------------------------------- the lock

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks (Linux), to tell a reused pid from the holder."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _holder_alive(info: Mapping[str, Any]) -> bool:
    if info.get("host") != socket.gethostname():
        return True  # another host: cannot tell, so it holds
    pid = int(info.get("pid", -1))
    if pid <= 0 or not _alive(pid):
        return False
    ticks = info.get("start_ticks")
    return ticks is None or _start_ticks(pid) in (None, ticks)


class FolderLock:
    """One writer per folder and shard: ``.cosyclone/lock-<tag>.json`` created exclusively.

    A whole-manifest run (tag ``all``) and a shard run exclude each other (their rows overlap);
    two different shards share the folder. A lock whose holder is gone (same host, dead pid) is
    taken over; a holder on another host is respected (remove the file by hand if it is gone).
    """

    def __init__(self, out_dir: Path, tag: str, command: str) -> None:
        self.path = state_dir(out_dir) / f"lock-{tag}.json"
        self.tag, self.command, self._held = tag, command, False

    def _conflicts(self) -> Iterator[tuple[Path, dict[str, Any]]]:
        for path in sorted(self.path.parent.glob("lock-*.json")):
            other = path.name[len("lock-"):-len(".json")]
            if other != self.tag and "all" not in (other, self.tag):
                continue
            try:
                info = json.loads(path.read_text())
            except (OSError, ValueError):
                info = {}
            yield path, info

    def acquire(self) -> None:
        for path, info in self._conflicts():
            young = not info and time.time() - _mtime(path) < 10.0  # being written by a starter right now
            if young or (info and _holder_alive(info)):
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info.get("started", 0))))
                raise FolderBusy(f"{self.path.parent.parent} is being written by another cosyclone synth "
                                 f"(pid {info.get('pid')} on {info.get('host')}, started {when}, "
                                 f"{path.name}): wait for it, use another --out, or another --shard. If "
                                 f"that process is gone, remove {path}")
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # stale: its holder died on this host
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                "start_ticks": _start_ticks(os.getpid()), "command": self.command, "shard": self.tag}
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:  # lost a race to another starter
            raise FolderBusy(f"{self.path} was just taken by another cosyclone synth") from None
        with os.fdopen(fd, "w") as fh:
            json.dump(info, fh)
            fh.flush()
            os.fsync(fh.fileno())
        self._held = True

    def release(self) -> None:
        if self._held:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self._held = False

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
