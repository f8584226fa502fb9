"""Stage handoff: a tiny, exact, self-checking serializer for nested dicts of tensors.

Why not ``torch.save``: pickle is neither safe to load from an untrusted spool nor byte-stable
across runs, and safetensors has no nesting or plain values. This format is:

    magic b"CCHANDOF" | u32 version | u64 header_len | u64 payload_len | sha256(header+payload)
    | header (UTF-8 JSON) | payload (raw tensor bytes, 64-byte aligned)

Nested dict keys are flattened with :data:`SEP` on the wire ("embed/speech_token") and the
reader rebuilds exactly the same nesting (``info["embed"]["speech_token"]``), never flat keys.
Tensors travel as their raw bytes through a ``uint8`` view with dtype name and shape recorded,
so every dtype (bfloat16 included) comes back bit-exact. Plain JSON values (int, float, str,
bool, None, lists/tuples of those) ride in the header. Decoding makes one copy of each tensor's
bytes (``torch.frombuffer`` on the payload slice, then one ``clone``).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from cosyclone.base.atomic import write_atomic
from cosyclone.errors import CosycloneError

MAGIC = b"CCHANDOF"
VERSION = 1
SEP = "/"
_ALIGN = 64
_PREFIX = struct.Struct("<8sIQQ32s")

_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
_NAMES: dict[torch.dtype, str] = {v: k for k, v in _DTYPES.items()}


class HandoffError(CosycloneError):
    """A handoff payload could not be written or read (bad value, corrupt/truncated bytes)."""


def _flatten(node: Mapping[str, Any], prefix: str, tensors: list[tuple[str, torch.Tensor]],
             values: dict[str, Any], dicts: list[str]) -> None:
    """Walk ``node`` depth first; record every dict path (so empty dicts survive too)."""
    dicts.append(prefix)
    for key, val in node.items():
        if not isinstance(key, str) or not key or SEP in key:
            raise HandoffError(f"handoff keys must be non-empty str without {SEP!r}; got {key!r}"
                               f" under {prefix or '<root>'!r}")
        path = f"{prefix}{SEP}{key}" if prefix else key
        if isinstance(val, torch.Tensor):
            tensors.append((path, val))
        elif isinstance(val, Mapping):
            _flatten(val, path, tensors, values, dicts)
        else:
            values[path] = _check_plain(val, path)


def _check_plain(val: Any, path: str) -> Any:
    """Plain values must be JSON-exact; tuples become lists (JSON has no tuple)."""
    if val is None or isinstance(val, (bool, int, str)):
        return val
    if isinstance(val, float):
        if val != val or val in (float("inf"), float("-inf")):
            raise HandoffError(f"{path!r}: non-finite float {val!r} cannot go in the JSON header")
        return val
    if isinstance(val, (list, tuple)):
        return [_check_plain(v, f"{path}[{i}]") for i, v in enumerate(val)]
    raise HandoffError(f"{path!r}: unsupported value type {type(val).__name__} "
                       "(tensors must sit directly in dicts; lists hold plain values only)")


def _uncarried(t: torch.Tensor) -> str | None:
    """Why the bytes-plus-dtype-plus-shape format cannot carry ``t`` exactly (None: it can)."""
    if t.is_nested:
        return "a nested tensor (ragged rows) has no single shape"
    if t.layout != torch.strided:
        return f"a {t.layout} tensor (sparse or otherwise not strided) is not its raw bytes"
    if t.is_quantized:
        return f"a quantized tensor ({t.dtype}) needs its scales and zero points, which are not carried"
    if t.is_meta or t.device.type == "meta":
        return "a meta tensor has no data"
    return None


def _tensor_bytes(t: torch.Tensor, path: str) -> tuple[str, bytes]:
    """Raw little-endian bytes of ``t`` (contiguous CPU copy) through a uint8 view."""
    why = _uncarried(t)
    if why:
        raise HandoffError(f"{path!r}: {why}; the handoff format carries dense strided tensors only "
                           "(convert it first, e.g. .to_dense(), .dequantize(), or a real device)")
    name = _NAMES.get(t.dtype)
    if name is None:
        raise HandoffError(f"{path!r}: dtype {t.dtype} is not supported by the handoff format "
                           f"(supported: {', '.join(_DTYPES)})")
    # conj/neg bits are lazy views: resolve them so the bytes are the values the tensor reads as
    flat = t.detach().to("cpu").resolve_conj().resolve_neg().contiguous().reshape(-1)
    if flat.numel() == 0:
        return name, b""
    return name, flat.view(torch.uint8).numpy().tobytes()


def dumps(nested: Mapping[str, Any]) -> bytes:
    """Serialize a nested dict of tensors / plain values; same input → same bytes, always."""
    if not isinstance(nested, Mapping):
        raise HandoffError(f"handoff root must be a dict, got {type(nested).__name__}")
    tensors: list[tuple[str, torch.Tensor]] = []
    values: dict[str, Any] = {}
    dicts: list[str] = []
    _flatten(nested, "", tensors, values, dicts)
    entries = []
    chunks: list[bytes] = []
    offset = 0
    for path, t in tensors:
        name, raw = _tensor_bytes(t, path)
        pad = (-offset) % _ALIGN
        if pad:
            chunks.append(b"\0" * pad)
            offset += pad
        entries.append({"key": path, "dtype": name, "shape": list(t.shape), "offset": offset,
                        "nbytes": len(raw)})
        chunks.append(raw)
        offset += len(raw)
    header = json.dumps({"sep": SEP, "dicts": dicts, "tensors": entries, "values": values},
                        separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("utf-8")
    payload = b"".join(chunks)
    digest = hashlib.sha256(header)
    digest.update(payload)
    prefix = _PREFIX.pack(MAGIC, VERSION, len(header), len(payload), digest.digest())
    return prefix + header + payload


def _insert(root: dict[str, Any], path: str, value: Any) -> None:
    """Put ``value`` at ``path`` (SEP-separated), creating the intermediate dicts."""
    parts = path.split(SEP)
    node = root
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise HandoffError(f"corrupt handoff header: {path!r} nests under a non-dict")
        node = nxt
    node[parts[-1]] = value


def loads(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Inverse of :func:`dumps`; raises :class:`HandoffError` on any damage to the bytes."""
    view = memoryview(data).cast("B")
    if len(view) < _PREFIX.size:
        raise HandoffError(f"handoff payload truncated: {len(view)} bytes, header needs {_PREFIX.size}")
    magic, version, hlen, plen, digest = _PREFIX.unpack(view[:_PREFIX.size])
    if magic != MAGIC:
        raise HandoffError("not a cosyclone handoff payload (bad magic bytes)")
    if version != VERSION:
        raise HandoffError(f"handoff format version {version} is not supported (this build reads {VERSION})")
    end = _PREFIX.size + hlen + plen
    if len(view) != end:
        raise HandoffError(f"handoff payload truncated or padded: {len(view)} bytes, expected {end}")
    header_mv = view[_PREFIX.size:_PREFIX.size + hlen]
    payload_mv = view[_PREFIX.size + hlen:end]
    check = hashlib.sha256(header_mv)
    check.update(payload_mv)
    if check.digest() != digest:
        raise HandoffError("handoff payload is corrupted (sha256 checksum mismatch)")
    try:
        header = json.loads(bytes(header_mv).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HandoffError(f"handoff header is not valid JSON: {exc}") from exc
    root: dict[str, Any] = {}
    for path in header["dicts"]:
        if path:
            _insert(root, path, {})
    for path, val in header["values"].items():
        _insert(root, path, val)
    for ent in header["tensors"]:
        _insert(root, ent["key"], _read_tensor(ent, payload_mv))
    return root


def _read_tensor(ent: dict[str, Any], payload: memoryview) -> torch.Tensor:
    """Rebuild one tensor: frombuffer on the slice (no copy) → one clone → dtype view → shape."""
    dtype = _DTYPES.get(ent["dtype"])
    if dtype is None:
        raise HandoffError(f"{ent['key']!r}: unknown dtype {ent['dtype']!r} in handoff payload")
    shape = [int(s) for s in ent["shape"]]
    numel = 1
    for s in shape:
        numel *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    off, nbytes = int(ent["offset"]), int(ent["nbytes"])
    if nbytes != numel * itemsize or off < 0 or off + nbytes > len(payload):
        raise HandoffError(f"{ent['key']!r}: byte range {off}+{nbytes} inconsistent with shape "
                           f"{shape} {ent['dtype']} or payload size {len(payload)}")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only buffer: we clone right away
        raw = torch.frombuffer(payload, dtype=torch.uint8, count=nbytes, offset=off)
    return raw.clone().view(dtype).reshape(shape)


def save(path: str | os.PathLike[str], nested: Mapping[str, Any]) -> Path:
    """Write atomically (:func:`cosyclone.base.atomic.write_atomic`, its temporary named for this host
    and process so a later run can recognise a killed one's leftover): readers never see halves. The
    directory is not fsynced: a checkpoint whose rename a crash loses only costs its rerun."""
    path = Path(path)
    data = dumps(nested)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data, sync_dir=False)
    return path


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a file written by :func:`save`; a damaged file raises :class:`HandoffError`."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise HandoffError(f"cannot read handoff file {path}: {exc}") from exc
    try:
        return loads(data)
    except HandoffError as exc:
        raise HandoffError(f"{path}: {exc}") from exc
